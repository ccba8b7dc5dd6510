#!/usr/bin/env bash
# probe_restore_full.sh: the real driver's restore when the GPU's memory was
# taken while a job's GPU state was out of it (the job suspended, or held by
# a checkpoint), and what cusnap makes of it. Needs a GPU, root, CRIU,
# python3 with torch, and a build:
#
#   CUSNAP_BINARY_DIR=$PWD/build bash tests/gpu/probe_restore_full.sh
#
# A 4 GiB pattern job (cusnap-pattern-job) each time; the "hog" is a PyTorch
# process that takes all the free device memory but 1 GiB.
#  (a) cusnap suspend; the hog starts; cusnap resume: what the driver says
#      and the job's GPU state after; the hog ends; cusnap resume again.
#  (b) cusnap checkpoint whose CRIU dump fails (a CUSNAP_CRIU wrapper), after
#      starting the hog, once the driver checkpoint released the job's
#      memory: the roll back's driver restore fails each of its passes, so
#      the job is left suspended (exit 6); the hog ends; cusnap resume.
# Each step prints its exit status, its time and the first lines cusnap
# printed; the job must count on with every byte right in the end.
# Measured on an H200: docs/gpu-runs/restore-full-h200.log.
export CUSNAP_REAL_DRIVER=${CUSNAP_REAL_DRIVER:-1}
source "$(dirname "$0")/../e2e/lib_checkpoint.sh"
# Hogs of an earlier run (case b's is detached) would skew every figure.
pkill -9 -f 'cusnap-e2e\.[A-Za-z0-9]*/hog\.py' 2>/dev/null || true
trap 'rc=$?; pkill -9 -f "$T/hog.py" 2>/dev/null || true; (exit $rc); cleanup_checkpoint_test' EXIT

cat >"$T/hog.py" <<'PY'
import os, sys, time
try:
    import torch
    free, total = torch.cuda.mem_get_info()
    n = max(0, free - (int(os.environ.get("HOG_LEAVE_MIB", "1024")) << 20))
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    print(f"hog pid {os.getpid()}: holds {n >> 20} MiB; free was {free >> 20} of {total >> 20} MiB",
          flush=True)
except Exception as e:  # a dry run without a GPU: the flow only
    print(f"hog pid {os.getpid()}: holds nothing ({type(e).__name__}: {e})", flush=True)
open(sys.argv[1], "w").close()
time.sleep(3600)
PY
REAL_CRIU=$(PATH=$PATH:/usr/local/sbin:/usr/sbin command -v criu)
# The CRIU wrapper of case (b): its first dump starts the hog, waits until it
# holds the memory, and fails.
cat >"$T/criu-hog" <<SH
#!/bin/sh
if [ "\$1" = dump ] && [ ! -e "$T/hog-started" ]; then
  : >"$T/hog-started"
  rm -f "$T/hog-ready"
  setsid python3 "$T/hog.py" "$T/hog-ready" >"$T/hog-b.out" 2>&1 </dev/null &
  for i in \$(seq 1 600); do [ -e "$T/hog-ready" ] && break; sleep 0.1; done
  echo "injected dump failure (the hog holds the GPU's memory)" >&2
  exit 1
fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-hog"

# step LABEL CMD...: runs CMD, prints its exit status, seconds and output.
step() {
  local label=$1 t0 rc=0 ms
  shift
  t0=$(date +%s%N)
  "$@" >"$T/step.out" 2>&1 || rc=$?
  STEP_RC=$rc
  ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%s: exit %s in %d.%03d s\n' "$label" "$rc" $((ms / 1000)) $((ms % 1000))
  sed 's/^/    /' "$T/step.out" | head -12
}
gpu_state() {  # cusnap ps's state, then each CUDA process's GPU state
  echo "$(job_field "$1" state) $("$CUSNAP" inspect "$1" --json | python3 -c '
import json, sys
print(",".join(p.get("cuda_state", "") for p in json.load(sys.stdin)["processes"] if p.get("uses_cuda")))')"
}
hog_start() {  # hog_start OUT: the hog, until it holds the memory
  rm -f "$T/hog-ready"
  python3 "$T/hog.py" "$T/hog-ready" >"$1" 2>&1 &
  HOG=$!
  for _ in $(seq 1 600); do [ -e "$T/hog-ready" ] && break; sleep 0.1; done
  [ -e "$T/hog-ready" ] || fail "the hog did not start: $(cat "$1")"
  cat "$1"
}
hog_end() {  # hog_end PID
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null || true  # the hog of (b) is not this shell's child
  wait_gone "$1" 30
  echo "hog $1 ended"
}
smi() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null || true; }
apps() {  # the GPU's compute processes as NVML sees them (pid, memory)
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';' || true
}
# resume_until JOB: cusnap resume, tried again after 1, 2, 4 and 8 s while it
# fails; sets STEP_RC to the last try's status.
resume_until() {
  local pause
  for pause in 0 1 2 4 8; do
    sleep "$pause"
    step "resume (after $pause s more)" "$CUSNAP" resume "$1"
    echo "    after it: $(gpu_state "$1")"
    [ "$STEP_RC" = 0 ] && return 0
  done
  return 0
}

# came_back NAME: after the last step (STEP_RC), the job (PID, supervisor SUP,
# output $T/NAME.out) counts on with every byte right, or the probe says it
# did not come back; then it is stopped.
came_back() {
  if [ "$STEP_RC" = 0 ]; then
    expect_running "$1" "$PID" "$T/$1.out"
    echo "after it: $(gpu_state "$1"); count $(last_count "$T/$1.out"), every byte right"
  else
    echo "RESULT ($1): the job did not come back once the memory was free again"
  fi
  kill -TERM "$SUP"; wait_exit "$SUP"; kill -9 "$PID" 2>/dev/null || true; wait_gone "$PID" 30
}

echo "== (a) suspend, the GPU's memory taken, resume"
launch a "$T/a.out" "$PATTERN_JOB" --mib 4096 --interval-ms 50 --verify-mib 64
wait_count "$T/a.out" 3 "" 120
PID=$(wait_job a)
echo "compute processes (pid, memory) running: $(apps)"
step "suspend" "$CUSNAP" suspend a
echo "compute processes (pid, memory) suspended: $(apps)"
[ "$STEP_RC" = 0 ] || fail "the suspend failed"
echo "GPU memory (used, total): $(smi)"
hog_start "$T/hog-a.out"
echo "GPU memory (used, total): $(smi)"
step "resume with the memory taken" "$CUSNAP" resume a
echo "after it: $(gpu_state a)"
SUP=$LAST_SUPERVISOR
hog_end "$HOG"
echo "GPU memory (used, total): $(smi)"
[ "$STEP_RC" = 0 ] || resume_until a
came_back a

echo "== (b) a checkpoint whose dump fails after the GPU's memory was taken"
CUSNAP_CRIU=$T/criu-hog launch b "$T/b.out" "$PATTERN_JOB" --mib 4096 --interval-ms 50 --verify-mib 64
SUP=$LAST_SUPERVISOR
wait_count "$T/b.out" 3 "" 120
PID=$(wait_job b)
step "checkpoint" "$CUSNAP" checkpoint b -o "$T/b.ckpt"
cat "$T/hog-b.out"
HOG=$(sed -n 's/^hog pid \([0-9]*\):.*/\1/p' "$T/hog-b.out")
echo "after it: $(gpu_state b)"
CK_RC=$STEP_RC
if [ "$CK_RC" = 6 ]; then
  step "checkpoint again (refused while left suspended)" "$CUSNAP" checkpoint b -o "$T/b2.ckpt"
fi
[ -n "$HOG" ] && hog_end "$HOG"
STEP_RC=0
[ "$CK_RC" = 6 ] && resume_until b
came_back b

echo "== (c) suspend, a hog that leaves 6 GiB free (the job needs 4), resume"
launch c "$T/c.out" "$PATTERN_JOB" --mib 4096 --interval-ms 50 --verify-mib 64
SUP=$LAST_SUPERVISOR
wait_count "$T/c.out" 3 "" 120
PID=$(wait_job c)
step "suspend" "$CUSNAP" suspend c
HOG_LEAVE_MIB=6144 hog_start "$T/hog-c.out"
step "resume with 6 GiB free" "$CUSNAP" resume c
echo "after it: $(gpu_state c)"
hog_end "$HOG"
[ "$STEP_RC" = 0 ] || resume_until c
came_back c
echo PASS
