#!/usr/bin/env bash
# The shim is prepended to the job's LD_PRELOAD when it exists, unless
# --no-shim; a missing shim changes nothing.
source "$(dirname "$0")/lib_launch.sh"
command -v cc >/dev/null || { echo "SKIP: no C compiler for a stand-in shim"; exit 77; }

echo 'void cusnap_test_stand_in(void) {}' >"$SCRATCH/s.c"
cc -shared -fPIC -o "$SCRATCH/shim.so" "$SCRATCH/s.c"
out=$(CUSNAP_SHIM="$SCRATCH/shim.so" LD_PRELOAD= "$CUSNAP" launch -- sh -c 'echo "$LD_PRELOAD"')
expect_eq "shim preloaded" "$SCRATCH/shim.so" "$out"
echo 'void cusnap_other(void) {}' >"$SCRATCH/o.c"
cc -shared -fPIC -o "$SCRATCH/other.so" "$SCRATCH/o.c"
out=$(CUSNAP_SHIM="$SCRATCH/shim.so" LD_PRELOAD="$SCRATCH/other.so" "$CUSNAP" launch -- sh -c 'echo "$LD_PRELOAD"')
expect_eq "shim first, then the existing preload" "$SCRATCH/shim.so:$SCRATCH/other.so" "$out"
out=$(CUSNAP_SHIM="$SCRATCH/shim.so" LD_PRELOAD= "$CUSNAP" launch --no-shim -- sh -c 'echo "[$LD_PRELOAD]"')
expect_eq "--no-shim" "[]" "$out"
out=$(CUSNAP_SHIM="$SCRATCH/missing.so" LD_PRELOAD= "$CUSNAP" launch -- sh -c 'echo "[$LD_PRELOAD]"')
expect_eq "missing shim" "[]" "$out"
