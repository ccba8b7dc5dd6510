#!/usr/bin/env bash
# The demo README.md gives (scripts/demo.sh) runs as a user runs it, on this
# build: a job checkpointed, killed and restored continues where it stopped,
# and so does a job of two processes sharing device memory.
source "$(dirname "$0")/lib_launch.sh"

src=${CUSNAP_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
rc=0
CUSNAP_DEMO_SKIP_BUILD=1 TMPDIR=$SCRATCH bash "$src/scripts/demo.sh" >"$SCRATCH/demo.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "scripts/demo.sh exited $rc: $(tail -30 "$SCRATCH/demo.out")"
for line in "the job continued exactly where it was checkpointed" \
  "both processes went on where they stopped, each still seeing the other's writes" \
  "== demo passed: both jobs continued exactly where they were checkpointed"; do
  grep -qF -- "$line" "$SCRATCH/demo.out" || fail "the demo did not say '$line': $(tail -30 "$SCRATCH/demo.out")"
done
pass "scripts/demo.sh: both jobs continued where they were checkpointed"
if compgen -G "$SCRATCH/cusnap-demo.*" >/dev/null; then fail "the demo left its work directory: $(echo "$SCRATCH"/cusnap-demo.*)"; fi
pass "the demo cleaned up after itself"
