#!/usr/bin/env bash
# A single-process job that keeps verifying a pattern in device memory is
# checkpointed (and so stopped), restored from the checkpoint, and continues
# counting where it stopped with its pattern intact; the same checkpoint then
# restores a second time, after the first restored job is gone.
source "$(dirname "$0")/lib_checkpoint.sh"

launch pj "$T/launch.out" "$PATTERN_JOB" --mib 16 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job pj)

# Into an empty directory that others may read: what the checkpoint writes
# there (the job's memory) is private all the same.
mkdir -m 0755 "$T/ckpt"
"$CUSNAP" checkpoint pj -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
[ -f "$T/ckpt/manifest.json" ] || fail "no manifest after the checkpoint"
OPEN=$(find "$T/ckpt" -mindepth 1 -maxdepth 1 -perm /044)
[ -z "$OPEN" ] || fail "others may read what the checkpoint wrote: $(ls -ld $OPEN)"
# When the stopping checkpoint returns, the job is gone from the list, so a
# restore started right away finds its name and directory free.
grep -q '^pj ' <<<"$("$CUSNAP" ps)" && fail "cusnap ps still lists pj after the stopping checkpoint returned"
wait_exit "$SUP"
[ "$EXIT_RC" = 0 ] || fail "the supervisor of the checkpointed job exited $EXIT_RC, expected 0"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
pass "checkpointed at count $LAST and stopped"

"$CUSNAP" inspect "$T/ckpt" --json >"$T/inspect.json" || fail "inspect failed"
python3 - "$T/inspect.json" "$PID" <<'PY' || fail "inspect --json does not describe the checkpoint"
import json, sys
d = json.load(open(sys.argv[1]))
text = json.dumps(d)
assert sys.argv[2] in text and "pj" in text, text
assert d["ok"] is True and d["valid"] is True and d["kind"] == "checkpoint", d
assert d["files_intact"] is True, d
PY

# Where no CUDA driver can be loaded (a storage machine), inspect still
# checks every file: intact, but not restorable here (exit 3).
rc=0
CUSNAP_LIBCUDA=$T/no-such-libcuda.so.1 "$CUSNAP" inspect "$T/ckpt" --json >"$T/nodriver.json" 2>/dev/null || rc=$?
[ "$rc" = 3 ] || fail "inspect without a driver exited $rc, expected 3: $(cat "$T/nodriver.json")"
python3 - "$T/nodriver.json" <<'PY' || fail "inspect --json without a driver: $(cat "$T/nodriver.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is False and d["valid"] is False and d["files_intact"] is True, d
assert d["exit_code"] == 3 and "no-such-libcuda" in d["error"], d
PY
rc=0
CUSNAP_LIBCUDA=$T/no-such-libcuda.so.1 "$CUSNAP" inspect "$T/ckpt" >"$T/nodriver.txt" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "inspect without a driver exited $rc, expected 3: $(cat "$T/nodriver.txt")"
grep -q "verdict:  files intact (every file's size and SHA-256 checked), NOT restorable here: " \
  "$T/nodriver.txt" || fail "inspect without a driver: $(grep verdict "$T/nodriver.txt")"
pass "inspect without a driver: files intact, not restorable here (exit 3)"

for round in 1 2; do
  restore_continues "$T/ckpt" "$T/restore$round.out" pj "$PID" "$LAST"
  pass "restore $round continued at count $FIRST with the pattern intact"
  # Stop it through its supervisor (which forwards SIGTERM) and wait until
  # the pid is free again.
  kill -TERM "$SUP"
  wait_exit "$SUP"
  wait_gone "$PID"
done
echo "PASS"
