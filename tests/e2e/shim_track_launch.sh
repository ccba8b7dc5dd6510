#!/usr/bin/env bash
# Through `cusnap launch`: the job learns the runtime directory
# (CUSNAP_RUNTIME_DIR), the shim tracks shared memory there (its peer and
# control sockets appear, mode 0600), and a creator/importer pair exchanges
# tickets through them (bench/shim_track_soak, a short run).
source "$(dirname "$0")/lib_launch.sh"
B=${CUSNAP_FAKECUDA_DIR:?}
SHIM=$CUSNAP_BINARY_DIR/lib/libcusnap_shim.so
SOAK=$CUSNAP_BINARY_DIR/bin/shim_track_soak
[ -f "$SHIM" ] && [ -x "$SOAK" ] || { echo "SKIP: shim or shim_track_soak not built"; exit 77; }
grep -q libasan <<<"$(ldd "$SHIM")" && { echo "SKIP: a sanitized shim is not launched through cusnap"; exit 77; }
export LD_LIBRARY_PATH="$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

out=$("$CUSNAP" launch --name trk -- sh -c 'echo "$CUSNAP_RUNTIME_DIR"')
expect_eq "runtime dir in the job's environment" "$CUSNAP_RUNTIME_BASE/trk" "$out"

# A functional run: it checks that tickets go through and that memory stays
# flat, not the time of 100-cycle intervals, which other tests running on the
# same cores disturb (bench.shim_track_soak.fakecuda measures the time).
"$CUSNAP" launch --name soak -- "$SOAK" --cycles 400 --intervals 4 --max-slowdown 1000 >"$SCRATCH/soak.out" 2>&1 ||
  { cat "$SCRATCH/soak.out"; echo "FAIL: soak under cusnap launch"; exit 1; }
grep -q '^flat' "$SCRATCH/soak.out" || { cat "$SCRATCH/soak.out"; echo "FAIL: no 'flat'"; exit 1; }

# The sockets exist while a tracked process runs, with mode 0600.
"$CUSNAP" launch --name sock -- "$SOAK" --cycles 100000 --intervals 1 >"$SCRATCH/sock.out" 2>&1 &
BG_PIDS+=($!)
dir=$CUSNAP_RUNTIME_BASE/sock
for _ in $(seq 100); do ls "$dir"/shim-ctl.*.sock >/dev/null 2>&1 && break; sleep 0.1; done
ls "$dir"/shim-ctl.*.sock >/dev/null 2>&1 || { ls -la "$dir"; echo "FAIL: no control socket"; exit 1; }
for s in "$dir"/shim-*.sock; do
  mode=$(stat -c %a "$s")
  expect_eq "mode of $(basename "$s")" 600 "$mode"
done
n=$(ls "$dir"/shim-peer.*.sock | wc -l)
expect_eq "peer sockets (creator and importer)" 2 "$n"
echo "PASS"
