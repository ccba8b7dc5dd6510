#!/usr/bin/env bash
# Fault injection at every driver call the coordinator makes: for each of
# checkpoint, checkpoint --leave-running, suspend, resume and restore, a
# clean run (FAKECUDA_LOG=1) lists the calls the operating cusnap process
# makes; then each call in turn fails once (FAKECUDA_FAIL=NAME:N:999 in that
# process only, never in the job). Every run must end in one of:
#   completed    the operation succeeded and its result is right
#   rolled back  it failed (exit 1 or 3), the job is where it started,
#                running with its pattern intact (or, for restore, nothing
#                was started and the checkpoint still restores), and the
#                error names the failing call
# anything else (exit 6, a lost job, a wrong byte, an unnamed call) fails
# the test. With CUSNAP_RELIABILITY_REPORT=FILE a Markdown table of every
# run is written there (docs/reliability.md quotes it).
source "$(dirname "$0")/lib_checkpoint.sh"
source "$(dirname "$0")/lib_reliability.sh"
fake_only "fault injection (FAKECUDA_FAIL)" || exit 77

JOB_ARGS=(--mib 4 --interval-ms 20)
REPORT=${CUSNAP_RELIABILITY_REPORT:-}
declare -A TALLY
RUNS=0
BAD=()
[ -n "$REPORT" ] && printf '| operation | failing call | outcome | exit | error (first line) |\n| --- | --- | --- | --- | --- |\n' >"$REPORT"

note() {  # note OP CALL OUTCOME RC MSG
  RUNS=$((RUNS + 1))
  TALLY["$1 $3"]=$(( ${TALLY["$1 $3"]:-0} + 1 ))
  printf '  %-18s %-36s %-12s exit %-2s %s\n' "$1" "$2" "$3" "$4" "${5:0:110}"
  [ -n "$REPORT" ] && printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$(echo "${5:0:160}" | tr '|' '/')" >>"$REPORT"
  case $3 in completed | "rolled back") ;; *) BAD+=("$1 $2: $3 (exit $4) $5") ;; esac
}

# first_error FILE: the first line cusnap printed as an error.
first_error() { grep -m1 -E '^cusnap: ' "$1" | sed 's/^cusnap: //' || true; }

# alive_counting NAME PID OUT: the job runs as PID, counts on and is intact.
alive_counting() {
  [ "$(job_field "$1" pid)" = "$2" ] && kill -0 "$2" 2>/dev/null || return 1
  local n; n=$(last_count "$3")
  for _ in $(seq 1 100); do [ "$(last_count "$3")" -ge $((n + 2)) ] && break; sleep 0.05; done
  [ "$(last_count "$3")" -ge $((n + 2)) ] || return 1
  ! grep -q "pattern mismatch" "$3"
}

stop_job() {  # stop_job SUPERVISOR PID
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  [ -z "$2" ] || wait_gone "$2" 20
}

# ---- one trial of each operation; SPEC is the supervisor's FAKECUDA_* setting
# (FAKECUDA_LOG=1 for the clean run). Sets TRIAL_OUT (the job's output),
# TRIAL_SUP (its supervisor), RC, MSG, OUTCOME.
trial_checkpoint() {  # trial_checkpoint SPEC LEAVE_RUNNING(0/1)
  local spec=$1 lr=$2 name=ck$RANDOM pid
  TRIAL_OUT=$T/$name.out
  launch_env "$name" "$TRIAL_OUT" "$spec" -- "${JOB_ARGS[@]}"
  TRIAL_SUP=$LAST_SUPERVISOR
  wait_count "$TRIAL_OUT" 3
  pid=$(wait_job "$name")
  BEFORE=$(grep -c "^fakecuda\[$TRIAL_SUP\]" "$TRIAL_OUT" || true)
  RC=0
  "$CUSNAP" checkpoint "$name" -o "$T/$name.ckpt" $([ "$lr" = 1 ] && echo --leave-running) \
    >"$T/cmd.out" 2>&1 || RC=$?
  AFTER=$(grep -c "^fakecuda\[$TRIAL_SUP\]" "$TRIAL_OUT" || true)
  MSG=$(first_error "$T/cmd.out")
  if [ "$RC" = 0 ] && [ -f "$T/$name.ckpt/manifest.json" ]; then
    if [ "$lr" = 1 ]; then
      alive_counting "$name" "$pid" "$TRIAL_OUT" && OUTCOME=completed || OUTCOME="job damaged"
      stop_job "$TRIAL_SUP" "$pid"
    else
      wait_exit "$TRIAL_SUP"; wait_gone "$pid" 20
      [ "$EXIT_RC" = 0 ] && OUTCOME=completed || OUTCOME="supervisor exit $EXIT_RC"
    fi
  elif [ "$RC" = 1 ] || [ "$RC" = 3 ]; then
    if [ -f "$T/$name.ckpt/manifest.json" ]; then OUTCOME="manifest left"
    elif alive_counting "$name" "$pid" "$TRIAL_OUT" && [ "$(cuda_states "$name")" = running ]; then
      OUTCOME="rolled back"
    else OUTCOME="job not running"; fi
    stop_job "$TRIAL_SUP" "$pid"
  else
    OUTCOME=lost
    stop_job "$TRIAL_SUP" "$pid"
  fi
  rm -rf "$T/$name.ckpt"
}

trial_suspend() {  # trial_suspend SPEC RESUME(0: test suspend, 1: suspend cleanly, test resume)
  local spec=$1 res=$2 name=sr$RANDOM pid
  TRIAL_OUT=$T/$name.out
  launch_env "$name" "$TRIAL_OUT" "$spec" -- "${JOB_ARGS[@]}"
  TRIAL_SUP=$LAST_SUPERVISOR
  wait_count "$TRIAL_OUT" 3
  pid=$(wait_job "$name")
  if [ "$res" = 1 ]; then
    "$CUSNAP" suspend "$name" >"$T/pre.out" 2>&1 || true
  fi
  BEFORE=$(grep -c "^fakecuda\[$TRIAL_SUP\]" "$TRIAL_OUT" || true)
  RC=0
  "$CUSNAP" $([ "$res" = 1 ] && echo resume || echo suspend) "$name" >"$T/cmd.out" 2>&1 || RC=$?
  AFTER=$(grep -c "^fakecuda\[$TRIAL_SUP\]" "$TRIAL_OUT" || true)
  MSG=$(first_error "$T/cmd.out")
  local st; st=$(cuda_states "$name")
  if [ "$res" = 0 ]; then
    if [ "$RC" = 0 ] && [ "$st" = checkpointed ]; then
      "$CUSNAP" resume "$name" >/dev/null 2>&1 && alive_counting "$name" "$pid" "$TRIAL_OUT" &&
        OUTCOME=completed || OUTCOME="no resume after"
    elif { [ "$RC" = 1 ] || [ "$RC" = 3 ]; } && [ "$st" = running ]; then
      alive_counting "$name" "$pid" "$TRIAL_OUT" && OUTCOME="rolled back" || OUTCOME="job damaged"
    else OUTCOME="state $st"; fi
  else
    if [ "$RC" = 0 ] && [ "$st" = running ]; then
      alive_counting "$name" "$pid" "$TRIAL_OUT" && OUTCOME=completed || OUTCOME="job damaged"
    elif { [ "$RC" = 1 ] || [ "$RC" = 3 ]; } && [ -n "$st" ]; then
      # Where it started (suspended) or part way; a second resume must finish it.
      "$CUSNAP" resume "$name" >/dev/null 2>&1 || true
      [ "$(cuda_states "$name")" = running ] && alive_counting "$name" "$pid" "$TRIAL_OUT" &&
        OUTCOME="rolled back" || OUTCOME="stuck $(cuda_states "$name")"
    else OUTCOME="state $st"; fi
  fi
  stop_job "$TRIAL_SUP" "$pid"
}

trial_restore() {  # trial_restore SPEC
  local spec=$1
  TRIAL_OUT=$T/restore$RANDOM.out
  env "$spec" "$CUSNAP" restore "$CKPT" >"$TRIAL_OUT" 2>&1 &
  SUPERVISORS+=($!)
  TRIAL_SUP=$!
  BEFORE=0
  RC=
  for _ in $(seq 1 400); do
    if ! kill -0 "$TRIAL_SUP" 2>/dev/null; then wait_exit "$TRIAL_SUP"; RC=$EXIT_RC; break; fi
    [ "$(last_count "$TRIAL_OUT")" -ge $((CKPT_LAST + 3)) ] && { RC=0; break; }
    sleep 0.05
  done
  MSG=$(first_error "$TRIAL_OUT")
  AFTER=$(grep -c "^fakecuda\[$TRIAL_SUP\]" "$TRIAL_OUT" || true)
  if [ "$RC" = 0 ]; then
    [ "$(first_count "$TRIAL_OUT")" = $((CKPT_LAST + 1)) ] && ! grep -q "pattern mismatch" "$TRIAL_OUT" &&
      OUTCOME=completed || OUTCOME="wrong continuation"
    stop_job "$TRIAL_SUP" "$CKPT_PID"
  elif [ -n "$RC" ] && [ "$RC" != 6 ]; then
    sleep 0.2
    [ -e "/proc/$CKPT_PID" ] && OUTCOME="half-restored process left" || OUTCOME="rolled back"
  else
    OUTCOME="lost (exit ${RC:-none})"
    stop_job "$TRIAL_SUP" "$CKPT_PID"
  fi
}

# run_all OP MIN "CALL..." TRIAL-ARGS...: the clean run, then one run per call
# it made. The clean run's trace must show at least MIN calls of the
# operating process, each CALL among them: a trace that shows none (or only
# the driver's set-up) would leave nothing to inject and pass on zero runs.
run_all() {
  local op=$1 min=$2 need=$3; shift 3
  "$@" FAKECUDA_LOG=1
  [ "$OUTCOME" = completed ] || fail "$op: the clean run did not complete: $OUTCOME $MSG"
  mapfile -t CALLS < <(driver_calls "$TRIAL_SUP" "$TRIAL_OUT")
  local first=$BEFORE last=$AFTER i call k
  echo "$op: $((last - first)) driver calls in the operation"
  [ $((last - first)) -ge "$min" ] ||
    fail "$op: the trace shows $((last - first)) driver calls in the operation, expected at least $min: ${CALLS[*]:$first:$((last - first))}"
  for call in $need; do
    printf '%s\n' "${CALLS[@]:$first:$((last - first))}" | grep -qx "$call" ||
      fail "$op: $call is not among the operation's driver calls: ${CALLS[*]:$first:$((last - first))}"
  done
  for ((i = first; i < last; i++)); do
    call=${CALLS[$i]}
    k=$(nth_of "$call" "$i" "${CALLS[@]}")
    "$@" "FAKECUDA_FAIL=$call:$k:999"
    if [ "$OUTCOME" = "rolled back" ] && ! grep -q "$call" <<<"$MSG"; then
      OUTCOME="unnamed error"
    fi
    note "$op" "$call#$k" "$OUTCOME" "$RC" "$MSG"
  done
}

trial_ckpt_stop() { trial_checkpoint "$1" 0; }
trial_ckpt_lr() { trial_checkpoint "$1" 1; }
trial_susp() { trial_suspend "$1" 0; }
trial_res() { trial_suspend "$1" 1; }

# The checkpoint that the restore runs start from.
launch base "$T/base.out" "$PATTERN_JOB" "${JOB_ARGS[@]}"
wait_count "$T/base.out" 3
CKPT_PID=$(wait_job base)
CKPT=$T/base.ckpt
"$CUSNAP" checkpoint base -o "$CKPT" >"$T/base-ckpt.out" 2>&1 || fail "checkpoint: $(cat "$T/base-ckpt.out")"
wait_exit "$LAST_SUPERVISOR"
wait_gone "$CKPT_PID"
CKPT_LAST=$(last_count "$T/base.out")

# The driver's set-up (cuInit, the version and device queries) makes about
# six calls; at least eight, with the operation's own calls among them.
LOCKS="cuCheckpointProcessLock cuCheckpointProcessCheckpoint"
BRINGS_BACK="cuCheckpointProcessRestore cuCheckpointProcessUnlock"
run_all checkpoint 8 "$LOCKS" trial_ckpt_stop
run_all "checkpoint --leave-running" 8 "$LOCKS $BRINGS_BACK" trial_ckpt_lr
run_all suspend 8 "$LOCKS" trial_susp
run_all resume 8 "$BRINGS_BACK" trial_res
run_all restore 8 "$BRINGS_BACK" trial_restore

echo "summary: $RUNS runs with one injected driver failure each"
for k in "${!TALLY[@]}"; do echo "  $k: ${TALLY[$k]}"; done | sort
if [ -n "$REPORT" ]; then
  { echo; echo "Totals: $RUNS runs."; for k in "${!TALLY[@]}"; do echo "- $k: ${TALLY[$k]}"; done | sort; } >>"$REPORT"
fi
if [ ${#BAD[@]} -gt 0 ]; then
  printf 'BAD: %s\n' "${BAD[@]}"
  fail "${#BAD[@]} of $RUNS runs did not end completed or rolled back"
fi
echo "PASS"
