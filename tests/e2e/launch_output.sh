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

# output.log is capped (CUSNAP_OUTPUT_LOG_MIB, here 1): past the cap it
# becomes output.log.1 and a new one starts, so the runtime base (a tmpfs)
# holds at most twice the cap; what the terminal gets is whole.
CUSNAP_OUTPUT_LOG_MIB=1 launch_bg chatty sh -c 'seq 1 600000; touch '"$SCRATCH"'/said; sleep 30'
wait_for 20 test -e "$SCRATCH/said" || fail "the chatty job did not finish writing"
log="$CUSNAP_RUNTIME_BASE/chatty/output.log"
wait_for 10 sh -c "tail -n1 '$log' | grep -qx 600000" || fail "output.log does not end with the last line: $(tail -c 100 "$log")"
size=$(stat -c %s "$log") old=$(stat -c %s "$log.1" 2>/dev/null || echo 0)
[ "$size" -le $((1024 * 1024 + 65536)) ] && [ "$old" -ge $((1024 * 1024)) ] && [ "$old" -le $((1024 * 1024 + 65536)) ] ||
  fail "output.log is $size bytes, output.log.1 $old, with a cap of 1 MiB"
# The two files hold the newest lines, in order, without a gap (the first
# line of output.log.1 may be the end of one cut at the cap before).
cat "$log.1" "$log" | awk 'NR > 2 && $1 != prev + 1 {print "gap after " prev; exit 1} {prev = $1}' ||
  fail "output.log.1 and output.log are not consecutive"
wait_for 10 sh -c "tail -n1 '$SCRATCH/chatty.out' | grep -qx 600000" || fail "the terminal's copy is short"
expect_eq "lines the terminal got past the cap" 600000 "$(wc -l <"$SCRATCH/chatty.out")"
kill -TERM "$LAUNCH_PID"
wait_job "$LAUNCH_PID"
[ ! -e "$CUSNAP_RUNTIME_BASE/chatty" ] || fail "runtime directory left behind: $(ls "$CUSNAP_RUNTIME_BASE/chatty")"
pass "output.log capped at 1 MiB ($size bytes, output.log.1 $old), the terminal's copy whole, both removed at exit"
rc=0
CUSNAP_OUTPUT_LOG_MIB=lots "$CUSNAP" launch -- true 2>"$SCRATCH/cap.err" || rc=$?
expect_eq "exit status of a bad CUSNAP_OUTPUT_LOG_MIB" 2 "$rc"
grep -q 'CUSNAP_OUTPUT_LOG_MIB="lots" is not a whole number of MiB' "$SCRATCH/cap.err" || fail "unclear: $(cat "$SCRATCH/cap.err")"

# The job gets descriptors 0, 1 and 2 only, whatever cusnap inherited. The
# job execs ls, so the listing is of one process with no pipeline around it;
# 3 is the directory ls itself opens to read /proc/self/fd.
exec 7</dev/null
fds=$("$CUSNAP" launch -- ls /proc/self/fd | sort -n | tr "\n" " ")
exec 7<&-
expect_eq "the job's descriptors" "0 1 2 3 " "$fds"
