#!/usr/bin/env bash
# An interrupt (SIGINT, as Ctrl-C sends; SIGTERM; SIGHUP) to `cusnap restore`
# before CRIU starts stops the restore: nothing was started, so the command
# says "was interrupted (SIGINT) before CRIU started: nothing was restored;
# the checkpoint is unchanged" and exits 128 plus the signal's number (--json:
# one failure object with that exit code); no job is listed, no process of
# the checkpoint runs, its files are byte for byte what they were, and it
# restores afterwards, counting on. (Before, the signal waited for the job to
# be back and was then passed on to it.) The window is held open by a CRIU
# whose `criu --version`, which the restore runs first, takes 3 s.
source "$(dirname "$0")/lib_checkpoint.sh"
REAL_CRIU=${CUSNAP_CRIU:-$(PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin command -v criu)}

checkpointed_job ri "$T/job.out" "$T/ck"
sums() { (cd "$T/ck" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
sums >"$T/sums.before"

cat >"$T/criu-slow" <<SH
#!/bin/sh
if [ "\$1" = --version ]; then
  touch "$T/version.asked"
  sleep 3
fi
exec "$REAL_CRIU" "\$@"
SH
chmod 755 "$T/criu-slow"

# interrupted SIG RC ARGS...: restore with that CRIU, SIG sent once it asked
# CRIU's version; the command must exit RC, having restored nothing.
interrupted() {
  local sig=$1 rc_want=$2 rc=0 w
  shift 2
  rm -f "$T/version.asked"
  CUSNAP_CRIU="$T/criu-slow" "$CUSNAP" restore "$T/ck" "$@" >"$T/$sig.out" 2>"$T/$sig.err" &
  w=$!
  SUPERVISORS+=("$w")
  for _ in $(seq 1 400); do [ -e "$T/version.asked" ] && break; sleep 0.02; done
  [ -e "$T/version.asked" ] || fail "$sig: the restore never asked CRIU's version: $(cat "$T/$sig.err")"
  kill -"$sig" "$w"
  wait "$w" || rc=$?
  [ "$rc" = "$rc_want" ] || fail "$sig: restore exited $rc, expected $rc_want: $(cat "$T/$sig.err")"
  grep -qF "was interrupted (SIG$sig) before CRIU started: nothing was restored; the checkpoint is unchanged" \
    "$T/$sig.err" "$T/$sig.out" || fail "$sig: the restore did not say so: $(cat "$T/$sig.err" "$T/$sig.out")"
  [ -e "/proc/$PID" ] && fail "$sig: process $PID of the checkpoint runs"
  [ -z "$(job_field ri pid)" ] || fail "$sig: cusnap ps lists job ri"
  sums | cmp -s - "$T/sums.before" || fail "$sig: the checkpoint's files changed"
  return 0
}

interrupted INT 130
pass "SIGINT before CRIU: exit 130, nothing restored, the checkpoint unchanged"
interrupted TERM 143
pass "SIGTERM before CRIU: exit 143"
interrupted HUP 129 --json
python3 - "$T/HUP.out" <<'PY' || fail "--json: not one failure object with exit_code 129: $(cat "$T/HUP.out")"
import json, sys
text = open(sys.argv[1]).read()
obj = json.loads(text)
assert obj["ok"] is False and obj["exit_code"] == 129, obj
assert "interrupted (SIGHUP)" in obj["error"], obj
PY
pass "SIGHUP before CRIU with --json: one failure object, exit 129"

restore_continues "$T/ck" "$T/back.out" ri "$PID" "$LAST"
pass "the checkpoint restores afterwards and counts on from $FIRST"
term_job
