#!/bin/bash
# run_preloaded.sh SHIM PROGRAM [ARGS...]: runs PROGRAM with SHIM preloaded.
# When the shim was built with AddressSanitizer, the sanitizer runtime must
# come first in LD_PRELOAD, so it is put there.
set -euo pipefail
shim=$1; shift
preload=$shim
asan=$(ldd "$shim" 2>/dev/null | awk '/libasan\.so/ {print $3; exit}')
if [[ -n "$asan" ]]; then
  preload="$asan:$shim"
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
fi
LD_PRELOAD="$preload" exec "$@"
