#!/usr/bin/env bash
# Fault injection at every driver call a shim makes in a checkpoint of a job
# sharing device memory (cusnap-share-job: creator and importer), and in the
# rebuild that follows (--leave-running rebuilds in place, as a restore
# does). A clean run (FAKECUDA_LOG=1 in the job) lists the calls each shim
# makes between the start and the end of the checkpoint that the
# application itself never makes; then each of them, in each process, fails
# once in turn (FAKECUDA_FAIL_FILE arms the fault in that process just
# before the checkpoint). Every run must end in one of:
#   completed    exit 0, a manifest, the job counting on with its bytes right
#   rolled back  exit 1, no manifest, the error names the process and phase,
#                the job counting on with its bytes right
# anything else fails the test. With CUSNAP_RELIABILITY_REPORT=FILE a
# Markdown table of every run is written there.
source "$(dirname "$0")/lib_shared.sh"
fake_only "fault injection (FAKECUDA_FAIL_FILE)" || exit 77

PREFIXES=("" "importer ")
REPORT=${CUSNAP_RELIABILITY_REPORT:-}
[ -n "$REPORT" ] && printf '| process | failing call | outcome | exit | error (first line) |\n| --- | --- | --- | --- | --- |\n' >"$REPORT"
export FAKECUDA_FAIL_FILE=$T/fault.%p
LAUNCH_OUT=$T/launch.out
start_job faults "$LAUNCH_OUT" env FAKECUDA_LOG=1 "$SHARE_JOB" --mib 4 --interval-ms 20
CREATOR=$(sed -n 's/^ready pid \([0-9]*\).*/\1/p' "$LAUNCH_OUT")
IMPORTER=$(sed -n 's/^importer ready pid \([0-9]*\).*/\1/p' "$LAUNCH_OUT")

# calls PID FROM TO: the driver calls of PID logged in lines FROM..TO.
calls() { sed -n "$2,$3p" "$LAUNCH_OUT" | sed -n "s/^fakecuda\[$1\]: \([A-Za-z0-9_]*\).*/\1/p"; }

# The clean run. The application's own calls are those of its loop (after
# its fifth count, before the checkpoint); the output reaches the log a little
# after the calls, hence the pauses.
sleep 0.5
BEFORE=$(wc -l <"$LAUNCH_OUT")
"$CUSNAP" checkpoint faults -o "$T/clean" --leave-running >"$T/clean.out" 2>&1 ||
  fail "the clean checkpoint failed: $(cat "$T/clean.out")"
sleep 0.5
AFTER=$(wc -l <"$LAUNCH_OUT")
rm -rf "$T/clean"
TRIALS=()
for pid in "$CREATOR" "$IMPORTER"; do
  prefix=$([ "$pid" = "$CREATOR" ] && echo "" || echo "importer ")
  loop=$(grep -n -m1 "^${prefix}count 5 ok" "$LAUNCH_OUT" | cut -d: -f1)
  app=$(calls "$pid" "$loop" "$BEFORE" | sort -u)
  window=$(calls "$pid" "$BEFORE" "$AFTER")
  for name in $(echo "$window" | sort -u); do
    grep -qx "$name" <<<"$app" && continue
    n=$(grep -cx "$name" <<<"$window")
    [ "$n" -gt 3 ] && n=3
    for k in $(seq 1 "$n"); do TRIALS+=("$pid $name $k"); done
  done
done
[ "${#TRIALS[@]}" -ge 10 ] || fail "only ${#TRIALS[@]} shim calls found in the checkpoint: ${TRIALS[*]}"
echo "   ${#TRIALS[@]} trials: every shim-only call of the creator ($CREATOR) and importer ($IMPORTER), up to its third"

declare -A TALLY
BAD=()
i=0
for t in "${TRIALS[@]}"; do
  read -r pid name k <<<"$t"
  i=$((i + 1))
  who=$([ "$pid" = "$CREATOR" ] && echo creator || echo importer)
  echo "$name:$k:999" >"$T/fault.$pid"
  RC=0
  "$CUSNAP" checkpoint faults -o "$T/ck$i" --leave-running >"$T/ck$i.out" 2>&1 || RC=$?
  rm -f "$T/fault.$pid"  # not consumed: the call did not happen this time
  MSG=$(grep -m1 '^cusnap: ' "$T/ck$i.out" | sed 's/^cusnap: //' || true)
  if [ "$RC" = 0 ] && [ -f "$T/ck$i/manifest.json" ]; then OUTCOME=completed
  elif [ "$RC" = 1 ] && [ ! -e "$T/ck$i/manifest.json" ] && grep -q "the job runs on unchanged" "$T/ck$i.out"; then
    OUTCOME="rolled back"
  else OUTCOME="exit $RC"; fi
  # Whatever the outcome, the job must count on with its bytes right and
  # each side must see the other's writes.
  for p in "${PREFIXES[@]}"; do
    n=$(last_count "$LAUNCH_OUT" "$p")
    wait_count "$LAUNCH_OUT" $((n + 2)) "$p" 20
  done
  for p in "${PREFIXES[@]}"; do wait_seen "$LAUNCH_OUT" "$p" "$(last_seen "$LAUNCH_OUT" "$p")"; done
  no_errors "$LAUNCH_OUT"
  TALLY[$OUTCOME]=$(( ${TALLY[$OUTCOME]:-0} + 1 ))
  printf '  %-8s %-32s %-12s exit %s %s\n' "$who" "$name #$k" "$OUTCOME" "$RC" "${MSG:0:100}"
  [ -n "$REPORT" ] && printf '| %s | %s #%s | %s | %s | %s |\n' "$who" "$name" "$k" "$OUTCOME" "$RC" "$(echo "${MSG:0:150}" | tr '|' '/')" >>"$REPORT"
  case $OUTCOME in completed | "rolled back") ;; *) BAD+=("$who $name #$k: $OUTCOME: $MSG") ;; esac
  rm -rf "$T/ck$i"
done
echo "   outcomes: $(for o in "${!TALLY[@]}"; do printf '%s %s; ' "$o" "${TALLY[$o]}"; done)"
[ "${#BAD[@]}" = 0 ] || fail "$(printf '%s\n' "${BAD[@]}")"
pass "${#TRIALS[@]} injected shim faults: every run completed or rolled back, the job intact"
stop_job "$LAUNCH_OUT"
echo "PASS"
