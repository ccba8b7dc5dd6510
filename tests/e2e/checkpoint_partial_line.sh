#!/usr/bin/env bash
# A checkpoint that stops a job whose last output ended mid-line: the job's
# bytes reach the launch's output as written, and cusnap's closing line
# ("checkpointed to ... and stopped") starts a line of its own; the restored
# job writes the rest of the line. With stdout and stderr apart, stdout gets
# no byte the job did not write.
source "$(dirname "$0")/lib_checkpoint.sh"

job='printf "before "; sleep 0.2; printf "half"; exec sleep 300'
launch partial "$T/launch.out" sh -c "$job"
SUP=$LAST_SUPERVISOR
for _ in $(seq 100); do grep -q "half" "$T/launch.out" && break; sleep 0.05; done
PID=$(wait_job partial)
"$CUSNAP" checkpoint partial -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
grep -qx "before half" "$T/launch.out" ||
  fail "the job's partial line is not whole on a line of its own: $(od -c "$T/launch.out" | head)"
grep -q "^cusnap: job partial checkpointed to $T/ckpt and stopped$" "$T/launch.out" ||
  fail "cusnap's closing line does not start a line: $(cat "$T/launch.out")"
pass "stdout and stderr on one file: the job's half line, then cusnap's line on its own"

# Stdout apart from stderr: stdout holds exactly what the job wrote.
"$CUSNAP" launch --name apart -- sh -c "$job" >"$T/apart.out" 2>"$T/apart.err" &
SUPERVISORS+=($!)
SUP=$!
for _ in $(seq 100); do grep -q "half" "$T/apart.out" && break; sleep 0.05; done
PID=$(wait_job apart)
"$CUSNAP" checkpoint apart -o "$T/ckpt2" >"$T/ckpt2.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt2.out")"
wait_exit "$SUP"
wait_gone "$PID"
[ "$(cat "$T/apart.out")" = "before half" ] && [ "$(tail -c 1 "$T/apart.out" | od -An -c | tr -d ' ')" = f ] ||
  fail "stdout is not exactly the job's bytes: $(od -c "$T/apart.out" | head)"
grep -q "^cusnap: job apart checkpointed to $T/ckpt2 and stopped$" "$T/apart.err" ||
  fail "stderr: $(cat "$T/apart.err")"
pass "stdout apart: exactly the job's bytes; cusnap's line on stderr"
echo "PASS"
