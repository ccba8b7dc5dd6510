#!/usr/bin/env bash
# The shim is prepended to the job's LD_PRELOAD, unless --no-shim; a
# CUSNAP_SHIM that cannot be preloaded is refused.
source "$(dirname "$0")/lib_launch.sh"
command -v cc >/dev/null || { echo "SKIP: no C compiler for a stand-in shim"; exit 77; }

echo 'void cusnap_test_stand_in(void) {}' >"$SCRATCH/s.c"
cc -shared -fPIC -o "$SCRATCH/shim.so" "$SCRATCH/s.c"
out=$(CUSNAP_SHIM="$SCRATCH/shim.so" LD_PRELOAD='' "$CUSNAP" launch -- sh -c 'echo "$LD_PRELOAD"')
expect_eq "shim preloaded" "$SCRATCH/shim.so" "$out"
echo 'void cusnap_other(void) {}' >"$SCRATCH/o.c"
cc -shared -fPIC -o "$SCRATCH/other.so" "$SCRATCH/o.c"
out=$(CUSNAP_SHIM="$SCRATCH/shim.so" LD_PRELOAD="$SCRATCH/other.so" "$CUSNAP" launch -- sh -c 'echo "$LD_PRELOAD"')
expect_eq "shim first, then the existing preload" "$SCRATCH/shim.so:$SCRATCH/other.so" "$out"
out=$(CUSNAP_SHIM="$SCRATCH/shim.so" LD_PRELOAD='' "$CUSNAP" launch --no-shim -- sh -c 'echo "[$LD_PRELOAD]"')
expect_eq "--no-shim" "[]" "$out"
# A CUSNAP_SHIM that cannot be preloaded is refused (exit 2, naming it)
# before the job runs; --no-shim runs it without.
echo 'not a library' >"$SCRATCH/text.so"
for bad in "$SCRATCH/missing.so" "$SCRATCH/text.so" "$SCRATCH"; do
  rc=0
  CUSNAP_SHIM=$bad "$CUSNAP" launch -- sh -c "echo ran >'$SCRATCH/ran'" 2>"$SCRATCH/bad.err" || rc=$?
  [ "$rc" = 2 ] && grep -qF "CUSNAP_SHIM=\"$bad\"" "$SCRATCH/bad.err" && [ ! -e "$SCRATCH/ran" ] ||
    fail "CUSNAP_SHIM=$bad: exit $rc, ran: $(cat "$SCRATCH/ran" 2>&1): $(cat "$SCRATCH/bad.err")"
done
pass "a CUSNAP_SHIM that is missing, not a library or a directory is refused"
out=$(CUSNAP_SHIM="$SCRATCH/missing.so" LD_PRELOAD='' "$CUSNAP" launch --no-shim -- sh -c 'echo "[$LD_PRELOAD]"')
expect_eq "--no-shim with a missing CUSNAP_SHIM" "[]" "$out"
