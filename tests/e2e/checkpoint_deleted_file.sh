#!/usr/bin/env bash
# A job that holds a deleted file bigger than CRIU's own ghost limit (1 MiB):
# as NCCL does with its host buffers in /dev/shm when its ranks talk over
# sockets, a file created in /dev/shm, mapped shared, and unlinked; the job
# writes its step count into the mapping and checks the whole 16 MiB every
# step. The checkpoint saves the file whole; after kill and restore the job
# continues at the next step with the mapping's contents intact (it checks
# them) and the file still deleted. CUSNAP_CRIU_GHOST_LIMIT caps the size:
# a limit below the file's fails the checkpoint with a message that names the
# variable, and the job runs on unchanged; a value that is not a size is
# refused (exit 2) before anything happens. The supervisor's environment or,
# first, that of `cusnap checkpoint` sets it.
source "$(dirname "$0")/lib_checkpoint.sh"

cat >"$T/ghost.py" <<'PY'
import mmap, os, struct, time
MIB = 16
path = f"/dev/shm/cusnap-e2e-ghost-{os.getpid()}"
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, MIB << 20)
m = mmap.mmap(fd, MIB << 20, mmap.MAP_SHARED)
os.unlink(path)
os.close(fd)
# Every 4 KiB page holds its index; the first 8 bytes, the last step done.
for p in range(1, (MIB << 20) // 4096):
    m[p * 4096:p * 4096 + 8] = struct.pack("<Q", p * 7919)
m[0:8] = struct.pack("<Q", 0)
print(f"file {path}", flush=True)
while True:
    last = struct.unpack("<Q", m[0:8])[0]
    bad = [p for p in range(1, (MIB << 20) // 4096)
           if struct.unpack("<Q", m[p * 4096:p * 4096 + 8])[0] != p * 7919]
    if bad:
        print(f"MISMATCH in page {bad[0]}", flush=True)
        raise SystemExit(3)
    m[0:8] = struct.pack("<Q", last + 1)
    os.write(1, f"count {last + 1} ok\n".encode())  # one write: see tcp_pair.py
    time.sleep(0.05)
PY

# ghost_job OUT: launches the job (name ghost) with the environment given;
# sets SUP, PID, FILE.
ghost_job() {
  launch ghost "$1" python3 "$T/ghost.py"
  SUP=$LAST_SUPERVISOR
  wait_count "$1" 3
  PID=$(wait_job ghost)
  job_said FILE "$1" "file "
  grep -q "$FILE (deleted)" "/proc/$PID/maps" || fail "the job does not map $FILE deleted"
}
stop_ghost() {
  kill -TERM "$SUP"
  wait_exit "$SUP"
  wait_gone "$PID"
}

# The supervisor reads the limit when it checkpoints (unless the client's
# environment has one, below). Not a size: launch refuses it before the job
# starts (exit 2), and a checkpoint given it refuses it before it sends it
# (exit 2 too).
expect_refused 2 'CUSNAP_CRIU_GHOST_LIMIT="12X" is not a size' \
  timeout 30 env CUSNAP_CRIU_GHOST_LIMIT=12X "$CUSNAP" launch --name ghost -- python3 "$T/ghost.py"
[ -z "$(job_pids_all)" ] || fail "launch started a job with CUSNAP_CRIU_GHOST_LIMIT=12X"
ghost_job "$T/bad.out"
expect_refused 2 'CUSNAP_CRIU_GHOST_LIMIT="12X" is not a size' \
  env CUSNAP_CRIU_GHOST_LIMIT=12X "$CUSNAP" checkpoint ghost -o "$T/bad"
[ ! -e "$T/bad" ] || fail "a refused checkpoint left $T/bad"
expect_running ghost "$PID" "$T/bad.out"
stop_ghost
pass "a limit that is not a size: refused by launch and by checkpoint (exit 2), the job ran on"

# A limit below the file's size: the dump fails, the message names the limit,
# nothing is left, the job runs on.
CUSNAP_CRIU_GHOST_LIMIT=4M ghost_job "$T/small-job.out"
rc=0
"$CUSNAP" checkpoint ghost -o "$T/small" >"$T/small.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "checkpoint with a 4M ghost limit exited $rc, expected 1: $(cat "$T/small.out")"
grep -q "Can't dump ghost file $FILE" "$T/small.out" || fail "the failure does not quote CRIU's error: $(cat "$T/small.out")"
# The limit is the supervisor's, as the job was launched: the message says so.
grep -qF "deleted file bigger than CUSNAP_CRIU_GHOST_LIMIT=4M (CUSNAP_CRIU_GHOST_LIMIT=\"4M\" is from the environment of the job's supervisor, as the job was launched or restored: set CUSNAP_CRIU_GHOST_LIMIT for this command to override it): raise the limit or unset it" "$T/small.out" ||
  fail "the failure does not name the limit and where it came from: $(cat "$T/small.out")"
grep -q "the job runs on unchanged" "$T/small.out" || fail "the failure does not say the job runs on: $(cat "$T/small.out")"
[ ! -e "$T/small" ] || fail "the failed checkpoint left $T/small"
expect_running ghost "$PID" "$T/small-job.out"
grep -q MISMATCH "$T/small-job.out" && fail "after the failed checkpoint: $(grep MISMATCH "$T/small-job.out")"
stop_ghost
pass "a 4M limit fails the checkpoint, naming the file, the limit and where it came from; the job ran on"

# The same limit in the environment of `cusnap checkpoint` (the supervisor has
# none): it counts, as do the other CRIU settings, checked there too.
ghost_job "$T/client-job.out"
rc=0
CUSNAP_CRIU_GHOST_LIMIT=4M "$CUSNAP" checkpoint ghost -o "$T/client" >"$T/client.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "checkpoint with CUSNAP_CRIU_GHOST_LIMIT=4M in its environment exited $rc, expected 1: $(cat "$T/client.out")"
grep -q "deleted file bigger than CUSNAP_CRIU_GHOST_LIMIT=4M: raise the limit" "$T/client.out" ||
  fail "the client's limit did not count: $(cat "$T/client.out")"
expect_refused 2 'CUSNAP_CRIU_NETWORK_LOCK="bogus" is not nftables, iptables or skip' \
  env CUSNAP_CRIU_NETWORK_LOCK=bogus "$CUSNAP" checkpoint ghost -o "$T/client2"
expect_refused 2 'CUSNAP_HASH_THREADS="1{32}\.\.\." is not a number of threads from 1 to 256 \(unset it to use every core\)' \
  env CUSNAP_HASH_THREADS="$(printf '1%.0s' $(seq 1 70))" "$CUSNAP" checkpoint ghost -o "$T/client3"
[ ! -e "$T/client" ] && [ ! -e "$T/client2" ] && [ ! -e "$T/client3" ] || fail "a failed checkpoint left its directory"
expect_running ghost "$PID" "$T/client-job.out"
stop_ghost
pass "the limit and the CRIU settings in the client's environment count (and are checked); the job ran on"

# cycle CKPT FROM OUT WHAT: checkpoints the job to CKPT (stopping it; its
# output so far in FROM), restores it with its output in OUT, and checks it
# continued at the next step with the mapping intact and the file deleted.
cycle() {
  "$CUSNAP" checkpoint ghost -o "$1" >"$1.out" 2>&1 || fail "$4: checkpoint failed: $(cat "$1.out")"
  wait_exit "$SUP"
  wait_gone "$PID"
  LAST=$(last_count "$2")
  ls "$1"/criu/ghost-file-*.img >/dev/null 2>&1 || fail "$4: the checkpoint holds no ghost file image"
  restore_bg "$1" "$3"
  SUP=$LAST_SUPERVISOR
  wait_count "$3" $((LAST + 3)) "" 30
  FIRST=$(first_count "$3")
  [ "$FIRST" = $((LAST + 1)) ] || fail "$4: continued at $FIRST, expected $((LAST + 1))"
  if grep -q MISMATCH "$3"; then fail "$4: the restored mapping's contents differ: $(grep MISMATCH "$3")"; fi
  PID=$(wait_job ghost)
  grep -q "$FILE (deleted)" "/proc/$PID/maps" || fail "$4: the restored job does not map $FILE deleted"
  [ ! -e "$FILE" ] || fail "$4: the restore left $FILE behind"
  if grep -q "cusnap-e2e-ghost-$PID" <<<"$(ls /dev/shm)"; then fail "$4: the restore left a ghost in /dev/shm: $(ls /dev/shm)"; fi
  pass "$4: checkpointed at count $LAST with the deleted file saved whole; restored, counts on from $FIRST with its 16 MiB intact, the file still deleted"
}

# A limit at least as big: saved whole.
CUSNAP_CRIU_GHOST_LIMIT=20M ghost_job "$T/launch.out"
cycle "$T/ckpt" "$T/launch.out" "$T/restore.out" "a 20M limit"
# A second cycle, the restoring supervisor with no limit set.
cycle "$T/ckpt2" "$T/restore.out" "$T/restore2.out" "no limit set"
kill -TERM "$SUP"
wait_exit "$SUP"
echo "PASS"
