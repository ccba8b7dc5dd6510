#!/usr/bin/env bash
# A launched job's stdout and stderr reach cusnap's own, separately, and are
# kept in output.log in the job's runtime directory while it runs.
source "$(dirname "$0")/lib_launch.sh"

launch_bg out1 sh -c 'echo to-stdout; echo to-stderr >&2; touch '"$SCRATCH"'/printed; sleep 30'
wait_for 10 test -e "$SCRATCH/printed" || fail "job did not run"
log="$CUSNAP_RUNTIME_BASE/out1/output.log"
wait_for 10 grep -q to-stderr "$log" || fail "log lacks stderr: $(cat "$log")"
grep -q to-stdout "$log" || fail "log lacks stdout"
pass "output.log holds both streams"
wait_for 10 grep -q to-stdout "$SCRATCH/out1.out" || fail "stdout not streamed"
wait_for 10 grep -q to-stderr "$SCRATCH/out1.err" || fail "stderr not streamed"
grep -q to-stderr "$SCRATCH/out1.out" && fail "stderr leaked into stdout"
pass "stdout and stderr streamed separately"

# stdin is /dev/null, not ours.
rc=0; "$CUSNAP" launch --name in1 -- sh -c 'cat; echo "eof at once"' >"$SCRATCH/in.out" 2>&1 <<<"secret" || rc=$?
expect_eq "exit status of a job reading stdin" 0 "$rc"
grep -q secret "$SCRATCH/in.out" && fail "the job read cusnap's stdin"
grep -q "eof at once" "$SCRATCH/in.out" || fail "job output missing"
pass "the job's stdin is /dev/null"

kill -TERM "$LAUNCH_PID"
wait_job "$LAUNCH_PID"
  expect_eq "status after SIGTERM" 143 "$RC"
[ ! -e "$CUSNAP_RUNTIME_BASE/out1" ] || fail "runtime directory left behind"
pass "runtime directory removed at exit"

# A large burst arrives whole, in order.
"$CUSNAP" launch --name big -- sh -c 'seq 1 200000' >"$SCRATCH/big.out"
expect_eq "last line of a large output" 200000 "$(tail -n1 "$SCRATCH/big.out")"
expect_eq "line count of a large output" 200000 "$(wc -l <"$SCRATCH/big.out")"

# The job gets descriptors 0, 1 and 2 only, whatever cusnap inherited. The
# job execs ls, so the listing is of one process with no pipeline around it;
# 3 is the directory ls itself opens to read /proc/self/fd.
exec 7</dev/null
fds=$("$CUSNAP" launch -- ls /proc/self/fd | sort -n | tr "\n" " ")
exec 7<&-
expect_eq "the job's descriptors" "0 1 2 3 " "$fds"
