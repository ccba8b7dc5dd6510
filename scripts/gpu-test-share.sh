#!/bin/bash
# gpu-test-share.sh: two real processes share device memory through the shim
# (run by hand on the GPU machine): a POSIX-fd VMM allocation exported as a
# ticket, and a cuMemAlloc block through legacy IPC (repeated opens must give
# the same address); each reads the other's writes. Runs the program without
# the shim (baseline: the driver's own sharing) and with it under a runtime
# directory (tracking on: the exported descriptor must be a ticket, and the
# shim's peer and control sockets must exist).
#
# The shim: $CUSNAP_SHIM, else .gpu-bundle/build/lib/libcusnap_shim.so
# (scripts/gpu-bundle.sh), else build-gpu/lib/libcusnap_shim.so. The GPU
# machine has no msgpack headers: build the shim on the CPU machine.
# Exit 0: shared both ways; 1: a failure; 77: no GPU here.
# NEVER any multicast: NVLS and multicast are off for everything it starts.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# shellcheck source=scripts/lib-gpu-script.sh
source "$(dirname "$0")/lib-gpu-script.sh"
gpu_script_start gpu-test-share
if [[ -z "$shim" ]]; then
  echo "gpu-test-share: no libcusnap_shim.so: set CUSNAP_SHIM or run scripts/gpu-bundle.sh first"
  exit 1
fi
echo "shim: $shim"

say "building tests/shim/gpu/share_program.cpp"
g++ -std=c++20 -O2 -g -isystem "$cuda/include" "$root/tests/shim/gpu/share_program.cpp" \
  -L"$cuda/lib64/stubs" -lcuda -o "$work/share_program" || { echo "cannot build"; exit 1; }

say "without the shim (the driver's own sharing)"
"$work/share_program" || bad "the program fails without the shim"

say "with the shim, tracking on"
rundir=$(mktemp -d "$work/rundir.XXXXXX")
chmod 700 "$rundir"
out=$work/shim.out
CUSNAP_SHIM_DEBUG=1 CUSNAP_RUNTIME_DIR=$rundir LD_PRELOAD="$shim" "$work/share_program" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] || bad "the program fails with the shim (exit $rc)"
grep -q 'parent: exported descriptor is a cusnap ticket' "$out" || bad "the export was not a ticket"
grep -q 'child: received descriptor is a cusnap ticket' "$out" || bad "the child did not get a ticket"
grep -q 'repeated IPC opens return the same address' "$out" || bad "repeated IPC opens differ"
grep -q '^share: ok' "$out" || bad "no 'share: ok'"
ls -l "$rundir"

if [[ $fail -eq 0 ]]; then echo "gpu-test-share: PASS"; else echo "gpu-test-share: FAIL"; fi
exit $fail
