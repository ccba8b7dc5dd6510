#!/usr/bin/env bash
# cusnap launch --strict: the job (and every process it starts) gets EPERM
# from io_uring_setup, the filter survives a checkpoint and restore (CRIU
# restores seccomp filters), and the job checkpoints and restores with its
# device memory intact. Without --strict the call is not refused.
source "$(dirname "$0")/lib_checkpoint.sh"

# The job: a Python probe that calls io_uring_setup every round and prints
# the errno name, with a pattern job (device memory) as its child.
cat >"$T/probe.py" <<'PY'
import ctypes, errno, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
NR_IO_URING_SETUP = 425
def uring():
    params = ctypes.create_string_buffer(120)
    r = libc.syscall(NR_IO_URING_SETUP, 1, params)
    if r >= 0:
        os.close(r)
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), "E?")
child = subprocess.Popen([sys.argv[1], "--mib", "4", "--interval-ms", "20"])
n = 0
while True:
    n += 1
    # One write a line: under -u, print writes its pieces apart, and the
    # child's lines to the same file came in between them.
    sys.stdout.write("uring %s\nprobe count %d ok\n" % (uring(), n))
    time.sleep(0.05)
PY

seccomp_mode() { sed -n 's/^Seccomp:\s*//p' "/proc/$1/status"; }

"$CUSNAP" launch --strict --name strict -- python3 -u "$T/probe.py" "$PATTERN_JOB" >"$T/strict.out" 2>&1 &
SUPERVISORS+=($!)
SUP=$!
wait_count "$T/strict.out" 3 "probe "
wait_count "$T/strict.out" 3
PID=$(wait_job strict)
[ "$(seccomp_mode "$PID")" = 2 ] || fail "the --strict job is not under a seccomp filter"
grep '^uring ' "$T/strict.out" | sort -u | grep -vx 'uring EPERM' >/dev/null &&
  fail "io_uring_setup was not refused with EPERM under --strict: $(grep '^uring ' "$T/strict.out" | sort -u)"
pass "--strict: io_uring_setup fails with EPERM in the job"

"$CUSNAP" checkpoint strict -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint under --strict failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/strict.out" "probe ")
LASTP=$(last_count "$T/strict.out")
pass "a --strict job checkpoints (probe at $LAST, pattern at $LASTP)"

restore_bg "$T/ckpt" "$T/restored.out"
SUP=$LAST_SUPERVISOR
wait_count "$T/restored.out" $((LAST + 3)) "probe "
wait_count "$T/restored.out" $((LASTP + 3))
[ "$(first_count "$T/restored.out" "probe ")" = $((LAST + 1)) ] || fail "the probe did not continue at $((LAST + 1))"
grep -q "pattern mismatch" "$T/restored.out" && fail "the pattern was damaged"
[ "$(seccomp_mode "$PID")" = 2 ] || fail "the restored job lost its seccomp filter"
grep '^uring ' "$T/restored.out" | sort -u | grep -vx 'uring EPERM' >/dev/null &&
  fail "io_uring_setup is allowed after the restore: $(grep '^uring ' "$T/restored.out" | sort -u)"
pass "restored: it continues, the pattern is intact and io_uring_setup still fails with EPERM"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"

# Without --strict: no filter, the call is not refused by cusnap.
"$CUSNAP" launch --name loose -- python3 -u "$T/probe.py" "$PATTERN_JOB" >"$T/loose.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/loose.out" 2 "probe "
PID=$(wait_job loose)
[ "$(seccomp_mode "$PID")" = 0 ] || fail "a job launched without --strict is under seccomp"
if [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" = 2 ]; then
  echo "note: io_uring is disabled on this machine (kernel.io_uring_disabled=2); not checked"
else
  grep -q '^uring EPERM' "$T/loose.out" && fail "io_uring_setup refused without --strict"
  pass "without --strict io_uring_setup is allowed ($(grep '^uring ' "$T/loose.out" | sort -u | head -1))"
fi
echo "PASS"
