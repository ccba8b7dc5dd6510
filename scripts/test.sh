#!/usr/bin/env bash
# Builds cusnap and runs every test through CTest: the unit tests (one doctest
# binary), the end-to-end tests (real CRIU, simulated driver) and the shim
# suite again under AddressSanitizer and UndefinedBehaviorSanitizer.
# Installs what it needs first (scripts/install-deps.sh; needs root).
#   scripts/test.sh            everything
#   CUSNAP_SKIP_SANITIZE=1     skip the sanitizer build
#   CUSNAP_JOBS=N              build parallelism (default: nproc)
#   CUSNAP_CUDA_INCLUDE=DIR    the CUDA headers' directory, for install-deps.sh
#                              and the builds (default /usr/local/cuda/include)
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "test: must run as root (CRIU needs it, and it installs what it needs); try: sudo bash $0" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
cuda_include=(${CUSNAP_CUDA_INCLUDE:+"-DCUSNAP_CUDA_INCLUDE=$CUSNAP_CUDA_INCLUDE"})
jobs="${CUSNAP_JOBS:-$(nproc)}"

bash scripts/install-deps.sh

echo "== build (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUSNAP_WERROR=ON "${cuda_include[@]}" >/dev/null
cmake --build build -j"$jobs"

echo "== tests (build/)"
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs" --timeout 600)

if [ "${CUSNAP_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== shim suite under ASan + UBSan (build-asan/)"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCUSNAP_SANITIZE=ON "${cuda_include[@]}" >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && ctest --output-on-failure --no-tests=error -L shim -j"$jobs" --timeout 600)
fi
