#!/usr/bin/env bash
# cusnap launch exits with the job's status: its exit code, or 128+N when a
# signal N killed it; 127 when the command cannot be run.
source "$(dirname "$0")/lib_launch.sh"

expect_eq "exit 0" 0 "$(run_status "$CUSNAP" launch -- true)"
expect_eq "exit 3" 3 "$(run_status "$CUSNAP" launch -- sh -c 'exit 3')"
expect_eq "killed by SIGKILL" 137 "$(run_status "$CUSNAP" launch -- sh -c 'kill -KILL $$')"
expect_eq "killed by SIGSEGV" 139 "$(run_status "$CUSNAP" launch -- sh -c 'kill -SEGV $$')"
rc=$(run_status "$CUSNAP" launch -- /nonexistent/cmd 2>"$SCRATCH/err")
expect_eq "missing command" 127 "$rc"
grep -q "cannot run '/nonexistent/cmd'" "$SCRATCH/err" || fail "no clear error: $(cat "$SCRATCH/err")"
expect_eq "no command" 2 "$(run_status "$CUSNAP" launch 2>/dev/null)"
expect_eq "bad name" 2 "$(run_status "$CUSNAP" launch --name ../x -- true 2>/dev/null)"
[ -z "$(ls -A "$CUSNAP_RUNTIME_BASE" | grep -v '^\.lock$' || true)" ] || fail "runtime dirs left: $(ls -A "$CUSNAP_RUNTIME_BASE")"
pass "no runtime directory left behind"
