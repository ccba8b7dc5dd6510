# shellcheck shell=bash
# The common start of the GPU machine's hand-run checks (sourced by
# scripts/gpu-test-shim.sh and scripts/gpu-test-share.sh).
#
# gpu_script_start NAME: sets root (the tree), work ($CUSNAP_GPU_WORK, else a
# new /tmp/cusnap-NAME.XXXXXX), cuda ($CUDA_HOME or /usr/local/cuda), fail=0
# and shim (the prebuilt shim: $CUSNAP_SHIM, else
# .gpu-bundle/build/lib/libcusnap_shim.so as scripts/gpu-bundle.sh leaves it,
# else build-gpu/lib/libcusnap_shim.so; empty when none is there); lists the
# GPUs, or exits 77 when there is none.
# shellcheck disable=SC2034  # root, work, cuda, fail and shim are the callers'
gpu_script_start() {
  local name=$1 c
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  work=${CUSNAP_GPU_WORK:-$(mktemp -d "/tmp/cusnap-$name.XXXXXX")}
  mkdir -p "$work"
  cuda=${CUDA_HOME:-/usr/local/cuda}
  fail=0
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! grep -q '^GPU' <<<"$(nvidia-smi -L 2>/dev/null)"; then
    echo "$name: no GPU here (nvidia-smi lists none); skipping"
    exit 77
  fi
  nvidia-smi -L | head -8
  shim=${CUSNAP_SHIM:-}
  for c in "$root/.gpu-bundle/build/lib/libcusnap_shim.so" "$root/build-gpu/lib/libcusnap_shim.so"; do
    [[ -z "$shim" && -r "$c" ]] && shim=$c
  done
  return 0
}

say() { printf '== %s\n' "$*"; }
bad() {
  printf 'FAIL: %s\n' "$*"
  # shellcheck disable=SC2034  # read by the caller
  fail=1
}
