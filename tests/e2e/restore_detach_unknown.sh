#!/usr/bin/env bash
# restore --detach whose background supervisor ends before it sends the
# restore's result (killed here, while CRIU runs): the waiting command cannot
# know whether the job was restored, and says so rather than that the restore
# failed: exit status 1 (man cusnap: an outcome not known), the job's name
# (from the manifest, or --name) and cusnap ps / cusnap inspect NAME as the way
# to find out; with --json exactly one object on stdout.
source "$(dirname "$0")/lib_checkpoint.sh"
REAL_CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)}

checkpointed_job rdu "$T/job.out" "$T/ck"

# A CRIU that restores the job, then waits before it ends.
cat >"$T/criu-hold" <<SH
#!/bin/sh
if [ "\$1" = restore ]; then
  "$REAL_CRIU" "\$@" || exit \$?
  echo \$\$ >"$T/hold.pid"
  exec sleep 120
fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-hold"

# killed_detached CASE NAME ARGS...: restore --detach ARGS with that CRIU,
# its background supervisor killed once CRIU restored the job; sets RC, and
# $T/CASE.out and $T/CASE.err hold the command's stdout and stderr. The
# message must name job NAME and say the outcome is not known.
killed_detached() {
  local case=$1 name=$2 hold bg
  shift 2
  rm -f "$T/hold.pid"
  CUSNAP_CRIU="$T/criu-hold" "$CUSNAP" restore "$T/ck" --detach "$@" >"$T/$case.out" 2>"$T/$case.err" &
  local w=$!
  SUPERVISORS+=("$w")
  # -s: the CRIU's shell creates hold.pid before it writes the pid in.
  for _ in $(seq 1 600); do [ -s "$T/hold.pid" ] && [ -e "/proc/$PID" ] && break; sleep 0.05; done
  [ -s "$T/hold.pid" ] || fail "$case: the restore never got to CRIU: $(cat "$T/$case.err")"
  hold=$(cat "$T/hold.pid")
  bg=$(ps -o ppid= -p "$hold" | tr -d ' ')
  [ -n "$bg" ] && [ "$bg" != "$w" ] && [ "$bg" != 1 ] || fail "$case: no background supervisor above CRIU ($bg)"
  kill -KILL "$bg"
  RC=0
  wait "$w" || RC=$?
  wait_gone "$PID" 10
  wait_gone "$hold" 10
  [ "$RC" = 1 ] || fail "$case: the waiting command exited $RC, expected 1 (outcome not known)"
  for word in "the background restore ended without a result" \
    "whether job $name was restored from $T/ck is not known" "cusnap ps" "cusnap inspect $name"; do
    grep -qF -- "$word" "$T/$case.err" || fail "$case: the command did not say '$word': $(cat "$T/$case.err")"
  done
}

killed_detached text rdu2 --name rdu2
[ ! -s "$T/text.out" ] || fail "text: stdout is not empty: $(cat "$T/text.out")"
pass "restore --detach --name rdu2, its supervisor killed: outcome not known, job rdu2, cusnap ps / inspect"

killed_detached json rdu --json
python3 - "$T/json.out" "$T/ck" <<'PY' || fail "json: not exactly one failure object on stdout: $(cat "$T/json.out")"
import json, sys
text = open(sys.argv[1]).read()
d, end = json.JSONDecoder().raw_decode(text)
assert text[end:].strip() == "", "more than one object"
assert d["ok"] is False and d["exit_code"] == 1, d
assert "whether job rdu was restored from %s is not known" % sys.argv[2] in d["error"], d
PY
pass "restore --detach --json, its supervisor killed: one object, the job named from the manifest"

[ -z "$(job_pids_all)" ] || fail "a job is left: $("$CUSNAP" ps)"
restore_continues "$T/ck" "$T/r.out" rdu "$PID" "$LAST"
pass "the checkpoint restores afterwards, counting on from $FIRST"
kill -TERM "$SUP"
wait_exit "$SUP"
wait_gone "$PID"
echo PASS
