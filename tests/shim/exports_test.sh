#!/bin/bash
# exports_test.sh SHIM SOURCE_DIR: the shim's dynamic symbol table defines
# exactly the driver entry points of the entry list (plus the shim's extras),
# dlsym, dlvsym, the runtime's cudaGetDriverEntryPoint family and
# cusnap_shim_build_info; nothing else.
set -euo pipefail
shim=$1 src=$2
want=$(mktemp) got=$(mktemp)
trap 'rm -f "$want" "$got"' EXIT
{
  sed -n 's/^CUSNAP_CU_ENTRY(\([A-Za-z0-9_]*\),.*/\1/p' "$src/src/cudaapi/entry_points.inc" "$src/src/shim/extra_entries.inc"
  printf '%s\n' dlsym dlvsym cusnap_shim_build_info cudaGetDriverEntryPoint cudaGetDriverEntryPoint_ptsz \
    cudaGetDriverEntryPointByVersion cudaGetDriverEntryPointByVersion_ptsz
} | sort -u > "$want"
nm -D --defined-only "$shim" | awk '{print $3}' | sed 's/@.*//' | sort -u > "$got"
if ! diff -u "$want" "$got"; then
  echo "FAIL: exported symbols differ from the entry list (- missing, + unexpected)"
  exit 1
fi
echo "exports: $(wc -l < "$got") symbols, as listed"
