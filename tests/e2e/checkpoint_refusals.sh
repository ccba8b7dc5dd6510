#!/usr/bin/env bash
# Every refusal of checkpoint happens before anything changes: the command
# exits 3 (refused) with a message that says why, writes no checkpoint, and
# the job runs on as the same process with its GPU state running and its
# pattern intact. The engine runs in the job's supervisor, so the settings
# under test (CUSNAP_CRIU, CUSNAP_LIBCUDA) are given to `cusnap launch`.
source "$(dirname "$0")/lib_checkpoint.sh"

# refusal NAME TEXT [ENV=VALUE...] -- checkpoint arguments after -o DIR
# Launches a pattern job with the environment, expects the checkpoint refused.
check_refusal() {
  local name=$1 text=$2
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  env "${envs[@]}" "$CUSNAP" launch --name "$name" -- "$PATTERN_JOB" --mib 4 --interval-ms 20 \
    >"$T/$name.out" 2>&1 &
  SUPERVISORS+=($!)
  wait_count "$T/$name.out" 3
  local pid
  pid=$(wait_job "$name")
  expect_refused 3 "$text" "$CUSNAP" checkpoint "$name" -o "${DIR:-$T/$name.ckpt}" "$@"
  [ ! -e "${DIR:-$T/$name.ckpt}/manifest.json" ] || fail "$name: a refused checkpoint wrote a manifest"
  expect_running "$name" "$pid" "$T/$name.out"
  pass "$name: refused, job unchanged"
}

# CRIU missing, or older than 4.1.
check_refusal nocriu "CRIU" CUSNAP_CRIU=/nonexistent/criu
mkdir -p "$T/oldcriu"
printf '#!/bin/sh\necho "Version: 3.17"\n' >"$T/oldcriu/criu"
chmod +x "$T/oldcriu/criu"
check_refusal oldcriu "3\.17.*4\.1|4\.1.*3\.17" CUSNAP_CRIU="$T/oldcriu/criu"

# A driver without the process checkpoint API.
NOCKPT=$CUSNAP_BINARY_DIR/lib/libcusnap_no_checkpoint_driver.so
[ -f "$NOCKPT" ] || fail "$NOCKPT is not built"
# Its supervisor cannot ask that driver for the job's GPU state: inspect shows none.
DRIVER_STATE_UNKNOWN=1 check_refusal olddriver "no process checkpoint API" CUSNAP_LIBCUDA="$NOCKPT"

# The output directory is not empty.
mkdir -p "$T/full"
echo keep >"$T/full/something"
DIR=$T/full check_refusal fulldir "not empty"
[ "$(ls "$T/full")" = something ] || fail "the refused checkpoint changed $T/full"

# An empty directory another user owns, or one others may write to: they
# could plant links that the checkpoint's files are written through, or
# change the files before a restore.
mkdir -p "$T/theirs" "$T/open"
chown 65534 "$T/theirs"
chmod 0777 "$T/open"
DIR=$T/theirs check_refusal theirs "theirs: it is owned by uid 65534, not by uid 0"
DIR=$T/open check_refusal opendir "other users may write to it \(mode 0777\).*a path that does not exist yet"
[ -z "$(find "$T/theirs" "$T/open" -mindepth 1)" ] ||
  fail "a refused checkpoint wrote into $T/theirs or $T/open: $(find "$T/theirs" "$T/open" -mindepth 1)"

# Below a directory another user may change (its own, or group-writable):
# a restore would refuse it (that user could put another checkpoint in its
# place), so the checkpoint refuses it first, new or empty, through a link too.
mkdir -p "$T/home-of-other/empty" "$T/groupw"
chown 65534 "$T/home-of-other"
chmod 0775 "$T/groupw"
DIR=$T/home-of-other/ck check_refusal otherhome "$T/home-of-other, a directory above it, is owned by uid 65534.*give -o a path under such a directory"
DIR=$T/home-of-other/empty check_refusal otherhome2 "$T/home-of-other, a directory above it, is owned by uid 65534"
ln -s "$T/groupw" "$T/groupw-link"
DIR=$T/groupw-link/ck check_refusal groupw "$T/groupw, a directory above it, may be written by other users \(mode 0775\)"
[ -z "$(find "$T/home-of-other" "$T/groupw" -mindepth 1 ! -name empty)" ] ||
  fail "a refused checkpoint wrote below another user's directory: $(find "$T/home-of-other" "$T/groupw" -mindepth 1)"

# The output directory's parent is a file: said so, not "does not exist".
echo x >"$T/afile"
DIR=$T/afile/sub check_refusal parentfile "afile\) is not a directory"

# A symbolic link, even to an empty directory: named as one, with its target.
mkdir -p "$T/linked"
ln -s "$T/linked" "$T/alink"
DIR=$T/alink check_refusal symlinkdir "alink is a symbolic link \(to $T/linked\)"

# Inside another checkpoint, finished or being written (which would then hold
# files its manifest does not list, and could no longer be restored; a roll
# back of it would remove this one), or inside a runtime directory (removed
# with its job).
mkdir -p -m 0700 "$T/otherck/criu"  # private, as a checkpoint makes it
echo '{}' >"$T/otherck/manifest.json"
DIR=$T/otherck/criu/x check_refusal nested "inside the checkpoint $T/otherck, .*choose a -o DIR outside it"
mkdir -p "$T/otherck/empty"
DIR=$T/otherck/empty check_refusal nested2 "inside the checkpoint $T/otherck,"
[ "$(cd "$T/otherck" && find . | sort | tr '\n' ' ')" = ". ./criu ./empty ./manifest.json " ] ||
  fail "a refused checkpoint wrote into the checkpoint $T/otherck: $(find "$T/otherck")"
mkdir -p -m 0700 "$T/writing/criu"  # a checkpoint whose CRIU dump has not begun
DIR=$T/writing/ck check_refusal nested3 "inside the checkpoint $T/writing,"
echo x >"$T/writing/criu/pstree.img"  # ... and one CRIU is writing
DIR=$T/writing/ck check_refusal nested4 "inside the checkpoint $T/writing,"
DIR=$CUSNAP_RUNTIME_BASE/inrun/ck check_refusal inrun "inside the job's runtime directory $CUSNAP_RUNTIME_BASE/inrun,"
DIR=$CUSNAP_RUNTIME_BASE/nested/ck check_refusal inother "inside the runtime directory $CUSNAP_RUNTIME_BASE/nested,"
[ ! -e "$CUSNAP_RUNTIME_BASE/inrun/ck" ] && [ ! -e "$CUSNAP_RUNTIME_BASE/nested/ck" ] ||
  fail "a refused checkpoint made a directory in a runtime directory"
# Not a checkpoint: a project with a manifest.json of its own and a criu/
# that is a source tree or a user's own CRIU dump (not private), and the
# runtime base itself (only its runtime directories are cleaned): the
# checkpoint is taken there.
mkdir -p -m 0755 "$T/proj/criu/images"
echo '{"name": "web"}' >"$T/proj/manifest.json"
echo 'all:' >"$T/proj/criu/Makefile"
echo x >"$T/proj/criu/core-1.img"
chmod 0755 "$T/proj/criu"
"$CUSNAP" launch --name proj -- "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/proj.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/proj.out" 3
wait_job proj >/dev/null
for d in "$T/proj/ck" "$CUSNAP_RUNTIME_BASE/proj-ck"; do
  "$CUSNAP" checkpoint proj -o "$d" --leave-running >"$T/proj.ck" 2>&1 ||
    fail "a checkpoint into $d was refused: $(cat "$T/proj.ck")"
  [ -f "$d/manifest.json" ] || fail "the checkpoint into $d wrote no manifest"
done
pass "a checkpoint below a project's manifest.json and criu/, and in the runtime base, is taken"

# A read-only file system: said before the job is touched, naming the
# directory given, not a subdirectory CRIU would have made.
RO=$T/ro
mkdir -p "$RO"
if mount -t tmpfs -o ro,size=1m tmpfs "$RO" 2>/dev/null; then
  DIR=$RO/ck check_refusal readonly "cannot write the checkpoint into $RO: Read-only file system"
  umount -l "$RO"
else
  echo "note: cannot mount a tmpfs here; the read-only case was not run"
fi

# A second checkpoint while one is running (the first is slowed down in the
# simulated driver; it then completes with --leave-running).
if fake_only "a second checkpoint while one runs (needs FAKECUDA_DELAY)"; then
FAKECUDA_DELAY=cuCheckpointProcessLock:2000 "$CUSNAP" launch --name busy -- \
  "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/busy.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/busy.out" 3
BUSY_PID=$(wait_job busy)
"$CUSNAP" checkpoint busy -o "$T/busy1" --leave-running >"$T/busy1.out" 2>&1 &
FIRST=$!
# The first has reached the supervisor (it then spends 2 s in the lock).
for _ in $(seq 1 200); do
  [ "$(job_field busy state)" = checkpointing ] && break
  kill -0 "$FIRST" 2>/dev/null || break
  sleep 0.05
done
[ "$(job_field busy state)" = checkpointing ] ||
  fail "the first checkpoint never showed in ps: $(cat "$T/busy1.out")"
expect_refused 3 "a checkpoint of job busy is already running" "$CUSNAP" checkpoint busy -o "$T/busy2"
wait "$FIRST" || fail "the first checkpoint failed: $(cat "$T/busy1.out")"
[ -f "$T/busy1/manifest.json" ] || fail "the first checkpoint wrote no manifest"
[ ! -e "$T/busy2/manifest.json" ] || fail "the refused second checkpoint wrote a manifest"
expect_running busy "$BUSY_PID" "$T/busy.out"
pass "busy: a second checkpoint refused while the first ran"

# Two jobs checkpointed into one new directory at once: raceb's checkpoint
# is slowed between its check of the directory (absent) and its first write,
# and racea's takes the directory meanwhile. raceb's is refused; racea's
# checkpoint is whole and its own (before the claim, both wrote their images
# into it and one's roll back removed the other's). raceb's supervisor traces
# its driver calls (FAKECUDA_LOG=1, not the job's): racea's checkpoint starts
# once raceb's has begun the slowed call, past its check.
"$CUSNAP" launch --name racea -- "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/racea.out" 2>&1 &
SUPERVISORS+=($!)
FAKECUDA_LOG=1 FAKECUDA_DELAY=cuCheckpointProcessGetState:3000 "$CUSNAP" launch --name raceb -- \
  env -u FAKECUDA_LOG "$PATTERN_JOB" --mib 4 --interval-ms 20 >"$T/raceb.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/racea.out" 3
wait_count "$T/raceb.out" 3
RACEA_PID=$(wait_job racea)
RACEB_PID=$(wait_job raceb)
before=$(calls_begun "$T/raceb.out" cuCheckpointProcessGetState)
"$CUSNAP" checkpoint raceb -o "$T/race" --leave-running >"$T/raceb.ck" 2>&1 &
SECOND=$!
wait_driver_call "$T/raceb.out" cuCheckpointProcessGetState "$before" "$SECOND" ||
  fail "raceb's checkpoint never asked the driver for the job's state: $(cat "$T/raceb.ck")"
"$CUSNAP" checkpoint racea -o "$T/race" --leave-running --json >"$T/racea.ck" 2>&1 ||
  fail "racea's checkpoint failed: $(cat "$T/racea.ck")"
rc=0
wait "$SECOND" || rc=$?
[ "$rc" = 3 ] && grep -q "another checkpoint" "$T/raceb.ck" ||
  fail "raceb's checkpoint into racea's directory: exit $rc: $(cat "$T/raceb.ck")"
"$CUSNAP" inspect "$T/race" --json >"$T/race.json" || fail "racea's checkpoint does not verify"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["valid"] and d["name"] == "racea", d["name"]' \
  "$T/race.json" || fail "the directory holds: $(cat "$T/race.json")"
[ ! -e "$T/race/.cusnap-claim" ] || fail "the claim was left in the checkpoint"
expect_running racea "$RACEA_PID" "$T/racea.out"
expect_running raceb "$RACEB_PID" "$T/raceb.out"
pass "race: of two checkpoints into one directory, the second is refused, the first whole"
fi

# Two processes sharing device memory without the shim's tracking: refused,
# naming the shim; suspend too. (Found through the simulated driver's
# allocation names; the real driver shows no such names. With tracking on,
# the shared_*.sh tests checkpoint such jobs.)
if fake_only "shared device memory refusal (detected through the simulated driver)"; then
"$CUSNAP" launch --name share -- env CUSNAP_SHIM_TRACK=0 "$SHARE_JOB" --interval-ms 20 >"$T/share.out" 2>&1 &
SUPERVISORS+=($!)
wait_count "$T/share.out" 3
wait_count "$T/share.out" 3 "importer "
SHARE_PID=$(wait_job share)
expect_refused 3 "shares device memory between processes.*shim" \
  "$CUSNAP" checkpoint share -o "$T/share.ckpt"
expect_refused 3 "shares device memory" "$CUSNAP" suspend share
[ ! -e "$T/share.ckpt/manifest.json" ] || fail "share: a refused checkpoint wrote a manifest"
expect_running share "$SHARE_PID" "$T/share.out"
expect_running share "$SHARE_PID" "$T/share.out" "importer "
pass "share: refused, both processes unchanged"
fi

# Not root: a job supervised by an unprivileged user.
if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  NOBODY_UID=$(id -u nobody)
  NOBODY_GID=$(id -g nobody)
  mkdir -p "$T/nobody"
  chown "$NOBODY_UID:$NOBODY_GID" "$T/nobody"
  as_nobody() {
    setpriv --reuid="$NOBODY_UID" --regid="$NOBODY_GID" --clear-groups \
      env CUSNAP_RUNTIME_BASE="$T/nobody/run" HOME="$T/nobody" "$@"
  }
  if as_nobody "$PATTERN_JOB" --mib 1 --max-count 1 --interval-ms 0 >"$T/nobody-probe.out" 2>&1; then
    as_nobody "$CUSNAP" launch --name unpriv -- "$PATTERN_JOB" --mib 4 --interval-ms 20 \
      >"$T/unpriv.out" 2>&1 &
    SUPERVISORS+=($!)
    wait_count "$T/unpriv.out" 3
    UNPRIV_PID=
    for _ in $(seq 1 50); do
      UNPRIV_PID=$(as_nobody "$CUSNAP" ps --json | python3 -c '
import json, sys
for j in json.load(sys.stdin): print(j["pid"])' || true)
      [ -n "$UNPRIV_PID" ] && break
      sleep 0.1
    done
    [ -n "$UNPRIV_PID" ] || fail "the unprivileged job did not appear"
    echo "$UNPRIV_PID" >>"$T/job-pids"
    expect_refused 3 "root" as_nobody "$CUSNAP" checkpoint unpriv -o "$T/nobody/ckpt"
    [ ! -e "$T/nobody/ckpt/manifest.json" ] || fail "unpriv: a refused checkpoint wrote a manifest"
    N=$(last_count "$T/unpriv.out")
    wait_count "$T/unpriv.out" $((N + 2))
    kill -0 "$UNPRIV_PID" || fail "unpriv: the job is gone"
    pass "unpriv: refused for not being root, job unchanged"
    kill -9 "$UNPRIV_PID" 2>/dev/null || true
  else
    echo "note: the unprivileged case was not run: user nobody cannot run the job here:"
    cat "$T/nobody-probe.out"
  fi
else
  echo "note: the unprivileged case was not run: no setpriv or no user nobody"
fi
echo "PASS"
