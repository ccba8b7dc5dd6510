#!/usr/bin/env bash
# Symbolic links planted in the runtime directory are not followed: a link
# in place of output.log, job.json or job.json.tmp of a running job, or in
# place of a job's directory in the runtime base, leaves its target
# unchanged through the job's life, state changes, ps and a new launch.
source "$(dirname "$0")/lib_checkpoint.sh"

VICTIM=$T/victim
mkdir -p "$VICTIM"
for f in file job.json output.log lock control.sock; do echo "victim $f" >"$VICTIM/$f"; done
chmod 0755 "$VICTIM"
victim_sum() { (find "$VICTIM" -printf '%p %s %m %y %T@\n' | sort; cat "$VICTIM"/*) | sha256sum; }
SUM0=$(victim_sum)
check_victim() { [ "$(victim_sum)" = "$SUM0" ] || fail "$1: the link's target changed"; pass "$1"; }

launch ln "$T/ln.out" "$PATTERN_JOB" --mib 4 --interval-ms 20
SUP=$LAST_SUPERVISOR
wait_count "$T/ln.out" 3
PID=$(wait_job ln)
DIR=$CUSNAP_RUNTIME_BASE/ln

ln -sf "$VICTIM/file" "$DIR/output.log.new" && mv -T "$DIR/output.log.new" "$DIR/output.log"
ln -s "$VICTIM/file" "$DIR/job.json.tmp"
"$CUSNAP" suspend ln >/dev/null || fail "suspend"
"$CUSNAP" resume ln >/dev/null || fail "resume"
expect_running ln "$PID" "$T/ln.out"
check_victim "links in place of output.log and job.json.tmp: state changes do not write through"
rm "$DIR/job.json.tmp"

cp "$DIR/job.json" "$T/job.json.saved"
ln -sf "$VICTIM/job.json" "$DIR/job.json.new" && mv -T "$DIR/job.json.new" "$DIR/job.json"
[ -z "$(job_field ln pid)" ] || fail "cusnap ps read job.json through a link"
"$CUSNAP" inspect ln >/dev/null 2>&1 && fail "cusnap inspect found the job through a linked job.json"
check_victim "a link in place of job.json is not read (the job is not found through it)"
cp "$T/job.json.saved" "$DIR/job.json.new" && mv -T "$DIR/job.json.new" "$DIR/job.json"
[ "$(job_field ln pid)" = "$PID" ] || fail "the job is not found again with its job.json back"

kill -TERM "$SUP"; wait_exit "$SUP"; wait_gone "$PID"
# The job's directory is gone, or at most left empty: the link that stood for
# output.log is removed, never followed.
if [ -e "$DIR" ] || [ -L "$DIR" ]; then
  LEFT=$(ls -A "$DIR" 2>&1 | tr '\n' ' ')
  [ -z "$LEFT" ] || fail "the job's end left in $DIR: $LEFT"
fi
check_victim "the job's end removes links, not their targets"

# A link in place of a job's directory in the base.
ln -s "$VICTIM" "$CUSNAP_RUNTIME_BASE/planted"
"$CUSNAP" ps >/dev/null 2>&1 || true
check_victim "cusnap ps does not clean through a planted directory link"
rc=0; "$CUSNAP" launch --name planted -- true >"$T/planted.out" 2>&1 || rc=$?
check_victim "cusnap launch --name of a planted link does not use its target (exit $rc)"
echo "PASS"
