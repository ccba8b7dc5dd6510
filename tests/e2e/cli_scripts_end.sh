#!/usr/bin/env bash
# Each end-to-end script that prints PASS prints it last: a PASS with checks
# after it is printed by a script that may then fail, and is read as the end
# of a run that was cut short.
set -euo pipefail
dir=$(dirname "$0")
bad=0
for f in "$dir"/*.sh; do
  n=$(grep -n '^echo "\?PASS"\?$' "$f" | tail -1 | cut -d: -f1) || true
  [ -n "$n" ] || continue
  # What follows it, bar blank lines and comments.
  after=$(tail -n +"$((n + 1))" "$f" | grep -cvE '^[[:space:]]*(#.*)?$') || true
  if [ "$after" != 0 ]; then
    echo "FAIL: $(basename "$f") goes on for $after lines after its PASS (line $n)"
    bad=1
  fi
done
[ "$bad" = 0 ] || exit 1
echo "ok: every script that prints PASS prints it last"
