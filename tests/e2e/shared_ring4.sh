#!/usr/bin/env bash
# A ring of four processes (cusnap-share-ring --procs 4): each creates a
# POSIX-fd VMM allocation, passes it to the next and imports the previous
# one's. Checkpointed and stopped, then restored: all four continue where
# they stopped, and every process sees both neighbours' writes again.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("ring 0 " "ring 1 " "ring 2 " "ring 3 ")
LAUNCH_OUT=$T/launch.out
start_job ring4 "$LAUNCH_OUT" "$SHARE_RING" --procs 4 --mib 2 --interval-ms 40
checkpoint_restore_cycle ring4
echo "PASS"
