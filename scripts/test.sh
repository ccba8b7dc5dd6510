#!/usr/bin/env bash
# Builds cusnap and runs every test through CTest: the unit tests (one doctest
# binary), the end-to-end tests (real CRIU, simulated driver) and the shim
# suite again under AddressSanitizer and UndefinedBehaviorSanitizer.
# Installs what it needs first (scripts/install-deps.sh; needs root). A
# failed run ends with what each failed test said (its FAIL lines).
#   scripts/test.sh            everything
#   CUSNAP_SKIP_SANITIZE=1     skip the sanitizer build
#   CUSNAP_JOBS=N              build parallelism (default: nproc)
#   CUSNAP_ALLOW_SKIPS=1       a skipped test does not fail the run
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

# failed_lines DIR: what each failed test of DIR's last run said on failing
# (its last FAIL lines, each with the next two lines unless they are blank or
# another's, else its ERROR and error lines; the last 8), printed again at the end
# where a long log is not cut, since --output-on-failure puts them mid-log.
failed_lines() {
  python3 - "$1/Testing/Temporary/LastTest.log" <<'PY' || true
import re, sys
text = open(sys.argv[1], errors="replace").read()
print("== what the failed tests said")
for block in re.split(r"\n(?=\d+/\d+ Testing: )", text):
    m = re.match(r"\d+/\d+ Testing: (\S+)", block)
    if not m or "Test Passed." in block:
        continue
    lines = block.splitlines()
    # A FAIL message may go on over a line or two (a path, a listing).
    groups = []  # each FAIL line with the lines it goes on over
    for i, l in enumerate(lines):
        if l.startswith("FAIL"):
            groups.append([l])
            for n in lines[i + 1:i + 3]:
                if not n.strip() or re.match(r"FAIL|==|\d+/\d+ Test|<end of output>", n):
                    break
                groups[-1].append("  " + n)
    # The last groups that fit in 8 lines (the last one whole however long).
    said = []
    for g in reversed(groups):
        if said and len(said) + len(g) > 8:
            break
        said = g + said
    said = said or [l for l in lines if re.search(r"FAIL|ERROR|error:|Timeout", l)][-8:]
    print("-- " + m.group(1))
    for l in said:
        print("   " + l[:400])
PY
}

# no_skips DIR: fails when a test of DIR's last run was skipped. This script
# installs everything the tests need and runs as root on the simulated
# driver, so a skip here is a check that did not run (a missing tool, a
# broken set-up), not one that passed. CUSNAP_ALLOW_SKIPS=1 lets it be.
no_skips() {
  local skipped
  skipped=$(grep -oE 'Test +#[0-9]+: [^ ]+ [.]*[*]+Skipped' "$1" | awk '{print $3}' || true)
  [ -z "$skipped" ] && return 0
  echo "== skipped tests (each needs something this machine should have; CUSNAP_ALLOW_SKIPS=1 allows them):"
  echo "$skipped" | sed 's/^/   /'
  [ "${CUSNAP_ALLOW_SKIPS:-0}" = 1 ]
}

echo "== tests (build/)"
rc=0
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs" --timeout 600) 2>&1 |
  tee build/ctest-output.log || rc=$?
if [ "$rc" != 0 ]; then
  failed_lines build
  exit "$rc"
fi
no_skips build/ctest-output.log

if [ "${CUSNAP_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== shim suite under ASan + UBSan (build-asan/)"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCUSNAP_SANITIZE=ON "${cuda_include[@]}" >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && ctest --output-on-failure --no-tests=error -L shim -j"$jobs" --timeout 600) 2>&1 |
    tee build-asan/ctest-output.log || rc=$?
  if [ "$rc" != 0 ]; then
    failed_lines build-asan
    exit "$rc"
  fi
  no_skips build-asan/ctest-output.log
fi
