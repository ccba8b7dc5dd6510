#!/usr/bin/env bash
# A job whose shims have sockets in its runtime directory is checkpointed;
# the original runtime base is then removed and the checkpoint is restored
# under another name and another runtime base. CRIU must find the directory
# the shims' sockets were bound in: the restoring supervisor links it to the
# new runtime directory while it supervises the job, and removes the link at
# the end. The restored job is checkpointed again and restored under a third
# name, which needs the same original path again; restoring that checkpoint
# once more while it runs is refused, naming the running job; a link that
# no restore made is refused and kept; a stale link (its supervisor gone) is
# replaced.
source "$(dirname "$0")/lib_checkpoint.sh"

BASE1=$CUSNAP_RUNTIME_BASE
launch orig "$T/launch.out" "$PATTERN_JOB" --mib 8 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/launch.out" 5
PID=$(wait_job orig)
ls "$BASE1/orig"/shim-peer.*.sock >/dev/null 2>&1 || fail "the job's shim has no peer socket in $BASE1/orig"

"$CUSNAP" checkpoint orig -o "$T/ckpt" >"$T/ckpt.out" 2>&1 || fail "checkpoint failed: $(cat "$T/ckpt.out")"
wait_exit "$SUP"
wait_gone "$PID"
LAST=$(last_count "$T/launch.out")
rm -rf "$BASE1"
pass "checkpointed at count $LAST; runtime base $BASE1 removed"

export CUSNAP_RUNTIME_BASE=$T/base2
restore_bg "$T/ckpt" "$T/restore1.out" --name moved
SUP=$LAST_SUPERVISOR
wait_count "$T/restore1.out" $((LAST + 3))
[ "$(first_count "$T/restore1.out")" = $((LAST + 1)) ] || fail "restore under a new name began at $(first_count "$T/restore1.out")"
[ -L "$BASE1/orig" ] || fail "$BASE1/orig is not a link to the new runtime directory while the job runs"
[ "$(readlink "$BASE1/orig")" = "$CUSNAP_RUNTIME_BASE/moved" ] || fail "$BASE1/orig points to $(readlink "$BASE1/orig")"
pass "restored as 'moved' under a new runtime base, continuing at count $((LAST + 1))"

"$CUSNAP" checkpoint moved -o "$T/ckpt2" >"$T/ckpt2.out" 2>&1 || fail "second checkpoint failed: $(cat "$T/ckpt2.out")"
wait_exit "$SUP"
wait_gone "$PID"
[ -e "$BASE1" ] && fail "$BASE1 (made for the shims' sockets) is left behind after the job ended"
LAST=$(last_count "$T/restore1.out")
pass "checkpointed again at count $LAST; the link and the directories made for it are gone"

restore_bg "$T/ckpt2" "$T/restore2.out" --name third
SUP=$LAST_SUPERVISOR
wait_count "$T/restore2.out" $((LAST + 3))
[ "$(first_count "$T/restore2.out")" = $((LAST + 1)) ] || fail "second restore began at $(first_count "$T/restore2.out")"
names=$("$CUSNAP" ps --json | python3 -c 'import json,sys; print(" ".join(sorted(j["name"] for j in json.load(sys.stdin))))')
[ "$names" = "third" ] || fail "cusnap ps lists '$names', expected only 'third'"
pass "restored again as 'third' from the second checkpoint"

# The same checkpoint again while 'third' runs: its processes hold the ids
# the restore needs (checked after the checkpoint is verified, before the
# shims' path, which links to third's runtime directory); the restore says
# so and leaves the link alone.
rc=0
"$CUSNAP" restore "$T/ckpt2" --name fourth >"$T/restore3.out" 2>&1 || rc=$?
[ "$rc" = 3 ] || fail "a second restore of a running checkpoint: exit $rc: $(cat "$T/restore3.out")"
grep -Eq "process id $PID that the checkpoint restores is in use, by process $PID .*another restore of this checkpoint" "$T/restore3.out" ||
  fail "the refusal does not name the running job: $(cat "$T/restore3.out")"
[ "$(readlink "$BASE1/orig")" = "$CUSNAP_RUNTIME_BASE/third" ] || fail "the refused restore changed the running job's link"
kill -0 "$PID" || fail "the running job is gone"
pass "restoring it again while it runs is refused, naming the running job (exit $rc); its link kept"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"

# A link there that no restore made (to a directory that is not a runtime
# directory) is left alone: the restore is refused, saying so.
mkdir -p "$BASE1" "$T/users" && chmod 700 "$BASE1"
ln -s "$T/users" "$BASE1/orig"
expect_refused 3 "not to a cusnap runtime directory" "$CUSNAP" restore "$T/ckpt2" --name fourth
[ "$(readlink "$BASE1/orig")" = "$T/users" ] || fail "the refused restore changed the link: $(readlink "$BASE1/orig")"
[ -d "$T/users" ] || fail "the link's target is gone"
rm "$BASE1/orig"
pass "a link in the shims' path that no restore made is refused and kept (exit 3)"

# A link to the runtime directory of a running job (another's, while the
# checkpoint's pids are free): refused, naming it; the link is kept.
launch holder "$T/holder.out" sleep 600
HOLDER=$LAST_SUPERVISOR
wait_job holder >/dev/null
mkdir -p "$BASE1" && chmod 700 "$BASE1"
ln -s "$CUSNAP_RUNTIME_BASE/holder" "$BASE1/orig"
expect_refused 3 "links to the runtime directory of a running job \($CUSNAP_RUNTIME_BASE/holder\)" \
  "$CUSNAP" restore "$T/ckpt2" --name fourth
[ "$(readlink "$BASE1/orig")" = "$CUSNAP_RUNTIME_BASE/holder" ] || fail "the refused restore changed the link"
rm "$BASE1/orig"
kill -TERM "$HOLDER"
wait_exit "$HOLDER"
pass "a link in the shims' path to a running job's runtime directory is refused and kept (exit 3)"

# A link left by a supervisor that died (pointing nowhere) is replaced.
mkdir -p "$BASE1" && chmod 700 "$BASE1"
ln -s "$T/gone" "$BASE1/orig"
restore_bg "$T/ckpt2" "$T/restore4.out" --name fifth
SUP=$LAST_SUPERVISOR
wait_count "$T/restore4.out" $((LAST + 3))
[ "$(readlink "$BASE1/orig")" = "$CUSNAP_RUNTIME_BASE/fifth" ] || fail "the stale link was not replaced: $(readlink "$BASE1/orig")"
PID=$(wait_job fifth)
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"
pass "a stale link in the shims' path is replaced by the restore"
echo "PASS"
