#!/usr/bin/env bash
# Fault injection at every driver call a shim makes while `cusnap restore DIR`
# rebuilds the shared device memory of a checkpoint (load the creators'
# bytes, reimport and map in the importers, rebuild multicast objects), for
# two jobs: cusnap-share-job (a creator and its importer) and
# cusnap-multicast-job (a three-member multicast group over two processes).
#
# How the fault reaches the restored processes: the job runs with
# FAKECUDA_FAIL_FILE=$T/fault.%p in its own environment. The simulated driver
# keeps that pattern in the process's memory and looks for the file at every
# call, so after CRIU's restore (same memory, same pids) the restored process
# still looks for $T/fault.PID. The test writes the file before it starts
# the restore; the application's threads wait at the shim's closed gate until
# the rebuild has finished, so the first driver call of a restored process is
# the rebuild's, and "NAME:K:999" makes the K-th NAME from then on fail.
#
# A clean restore (FAKECUDA_LOG=1 in the job) lists, per process, the calls
# it logs that the application's own loop never makes (they are the
# rebuild's: the application's threads wait at the gate until it is done); then each of them fails once, in turn (up to its
# CUSNAP_RESTORE_FAULTS_MAX-th occurrence, default 2: "once"; the rebuild
# makes a second attempt, which absorbs most single faults), and then fails
# at every occurrence from the first on ("every": the second attempt fails
# too). Every run must end in one of:
#   completed  cusnap reports the job restored, the driver's log shows the
#              injected failure happened, and every process continues at
#              exactly the count after the checkpoint, its bytes right, each
#              seeing its peers' writes
#   failed     exit 1, the job never reported restored, the error names the
#              process, the phase and a call (the injected one, or the
#              one its failure made fail); no process of the job and no
#              criu is left; the checkpoint's files are unchanged; and a
#              second, un-faulted restore of the same directory completes as
#              above
# anything else fails the test. With CUSNAP_RELIABILITY_REPORT=FILE a
# Markdown table of every run is written there.
source "$(dirname "$0")/lib_shared.sh"
fake_only "fault injection (FAKECUDA_FAIL_FILE)" || exit 77

MAX_K=${CUSNAP_RESTORE_FAULTS_MAX:-2}
REPORT=${CUSNAP_RELIABILITY_REPORT:-}
[ -n "$REPORT" ] &&
  printf '| job | process | failing call | fails | outcome | exit | error (first line) |\n| --- | --- | --- | --- | --- | --- | --- |\n' >"$REPORT"
declare -A TALLY
BAD=()
TOTAL=0

# ck_sum DIR: a checksum line per file of DIR (names and contents).
ck_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

# restore_run DIR OUT: cusnap restore DIR in the background (output in OUT);
# waits until it reports the job restored or exits. Sets RS (its pid) and
# RRC (its exit status; empty while it runs on as the job's supervisor).
restore_run() {
  restore_bg "$1" "$2"
  RS=$LAST_SUPERVISOR
  RRC=""
  for _ in $(seq 1 1200); do
    grep -q "^cusnap: restored job" "$2" && return 0
    if ! kill -0 "$RS" 2>/dev/null; then
      RRC=0
      wait "$RS" || RRC=$?
      return 0
    fi
    sleep 0.05
  done
  fail "cusnap restore $1 neither reported the job restored nor ended in 60 s"
}

# criu_left: criu processes working on this test's files.
criu_left() { pgrep -f "criu.* $T/" 2>/dev/null || true; }

# restored_ok OUT: the job restored into OUT continues exactly after the
# checkpoint (expect_continued), then is stopped so its pids are free again.
restored_ok() {
  SUP=$RS
  expect_continued "$1" 1 >/dev/null
  stop_job "$LAUNCH_OUT"
}

# calls PID FILE FROM TO: the driver calls of PID logged in lines FROM..TO of FILE.
calls() { sed -n "$3,$4p" "$2" | sed -n "s/^fakecuda\[$1\]: \([A-Za-z0-9_]*\).*/\1/p"; }

# run_job TAG CMD...: launches CMD (PREFIXES set), checkpoints it, restores
# it cleanly once, then once per shim call of the restore with that call
# failing.
run_job() {
  local tag=$1 ck=$T/$1.ckpt before p pid first loop app window name n k i=0
  shift
  LAUNCH_OUT=$T/$tag.launch.out
  start_job "$tag" "$LAUNCH_OUT" env FAKECUDA_LOG=1 "FAKECUDA_FAIL_FILE=$T/fault.%p" "$@"
  sleep 0.3
  before=$(wc -l <"$LAUNCH_OUT")
  checkpoint_stop "$tag" "$ck" "$LAUNCH_OUT"
  ck_sum "$ck" >"$T/$tag.sum"

  # The clean restore.
  restore_run "$ck" "$T/$tag.clean.out"
  [ -z "$RRC" ] || fail "$tag: the clean restore failed (exit $RRC): $(grep cusnap: "$T/$tag.clean.out")"
  restored_ok "$T/$tag.clean.out"
  # The job's stderr (the driver's log) and stdout reach the output through
  # separate pipes, in no dependable order: the whole output, less the calls
  # of the application's loop, is the rebuild's.
  first=$(wc -l <"$T/$tag.clean.out")
  local trials=()
  for p in "${PREFIXES[@]}"; do
    pid=$(sed -n "s/^${p}ready pid \([0-9]*\).*/\1/p" "$LAUNCH_OUT")
    loop=$(grep -n -m1 "^${p}count 5 ok" "$LAUNCH_OUT" | cut -d: -f1)
    app=$(calls "$pid" "$LAUNCH_OUT" "$loop" "$before" | sort -u)
    window=$(calls "$pid" "$T/$tag.clean.out" 1 "$first")
    for name in $(echo "$window" | sort -u); do
      grep -qx "$name" <<<"$app" && continue
      n=$(grep -cx "$name" <<<"$window")
      [ "$n" -gt "$MAX_K" ] && n=$MAX_K
      for k in $(seq 1 "$n"); do trials+=("${p:-creator }$pid $name $k once"); done
      trials+=("${p:-creator }$pid $name 1 every")
    done
  done
  [ "${#trials[@]}" -ge 5 ] || fail "$tag: only ${#trials[@]} shim calls found in the restore: ${trials[*]}"
  echo "   $tag: ${#trials[@]} trials: every shim-only call of the restore's rebuild, up to its occurrence $MAX_K"

  local who outcome msg t rc
  for t in "${trials[@]}"; do
    read -r who pid name k mode <<<"$t"
    i=$((i + 1))
    TOTAL=$((TOTAL + 1))
    local out=$T/$tag.r$i.out spec="$name:$k:999" j
    # every: that call fails each time from then on (40 calls), so the
    # rebuild's second attempt fails too.
    [ "$mode" = every ] && for j in $(seq 2 40); do spec+=",$name:$j:999"; done
    echo "$spec" >"$T/fault.$pid"
    restore_run "$ck" "$out"
    msg=$(grep -m1 '^cusnap: ' "$out" | sed 's/^cusnap: //' || true)
    rc=${RRC:--}
    if [ -z "$RRC" ]; then
      outcome=completed
      [ ! -e "$T/fault.$pid" ] || BAD+=("$tag $who $name #$k: the fault was never armed (no driver call of process $pid)")
      echo "  $tag $who $name #$k ($mode): reported restored; verifying"
      restored_ok "$out"
      grep -qE "^fakecuda\[$pid\]: $name[A-Za-z0-9_]* \(injected failure\)" "$out" ||
        BAD+=("$tag $who $name #$k ($mode): the restore completed but the call never failed")
      msg=""
    else
      outcome="exit $RRC"
      local err
      err=$(grep -A3 '^cusnap: ' "$out" || true)
      if [ "$RRC" = 1 ] && ! grep -q "^cusnap: restored job" "$out" &&
        grep -qE "process [0-9]+" <<<"$err" && grep -q "phase" <<<"$err" &&
        grep -qE "cu[A-Za-z0-9_]+ failed" <<<"$err"; then
        # It names a call: the injected one, or the call its failure made
        # fail (a context call failing shows as the copy's INVALID_CONTEXT).
        outcome=failed
      fi
      for p in $(ready_pids "$LAUNCH_OUT"); do
        for _ in $(seq 1 200); do [ -e "/proc/$p" ] || break; sleep 0.05; done
        [ ! -e "/proc/$p" ] || { outcome="left process $p"; kill -KILL "$p" 2>/dev/null || true; }
      done
      [ -z "$(criu_left)" ] && [ -z "$(job_pids_all)" ] || outcome="left criu or a job"
      ck_sum "$ck" | cmp -s - "$T/$tag.sum" || outcome="checkpoint changed"
      rm -f "$T/fault.$pid"
      # The checkpoint restores afterwards.
      restore_run "$ck" "$out.retry"
      [ -z "$RRC" ] || fail "$tag $who $name #$k: the restore after a failed one failed (exit $RRC): $(grep -A3 cusnap: "$out.retry")"
      restored_ok "$out.retry"
    fi
    TALLY["$mode $outcome"]=$(( ${TALLY["$mode $outcome"]:-0} + 1 ))
    printf '  %-5s %-9s %-34s %-6s %-10s exit %-3s %s\n' "$tag" "$who" "$name #$k" "$mode" "$outcome" "$rc" "${msg:0:110}"
    [ -n "$REPORT" ] && printf '| %s | %s | %s #%s | %s | %s | %s | %s |\n' "$tag" "$who" "$name" "$k" "$mode" "$outcome" \
      "$rc" "$(echo "${msg:0:170}" | tr '|' '/')" >>"$REPORT"
    case $outcome in completed | failed) ;; *) BAD+=("$tag $who $name #$k ($mode): $outcome: $msg") ;; esac
  done
}

PREFIXES=("" "importer ")
run_job pair "$SHARE_JOB" --mib 4 --interval-ms 20
pass "pair: every injected fault in the restore completed or failed cleanly, and the checkpoint restored afterwards"

export FAKECUDA_DEVICES=3 FAKECUDA_MULTICAST=1
PREFIXES=("group " "member ")
run_job mc "$BIN/cusnap-multicast-job" --interval-ms 20
pass "mc: every injected fault in the restore completed or failed cleanly, and the checkpoint restored afterwards"

echo "   outcomes: $(for o in "${!TALLY[@]}"; do printf '%s %s; ' "$o" "${TALLY[$o]}"; done)"
[ "${#BAD[@]}" = 0 ] || fail "$(printf '%s\n' "${BAD[@]}")"
pass "$TOTAL injected shim faults in restores: every run completed or failed cleanly and restored on a retry"
echo "PASS"
