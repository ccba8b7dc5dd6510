#!/usr/bin/env bash
# Legacy IPC (cusnap-ipc-pair): the creator's cuMemAlloc block, opened by the
# child through cuIpcOpenMemHandle (twice, one closed). Checkpointed and
# stopped, then restored: both continue where they stopped and see each
# other's writes in the shared block again.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("creator " "importer ")
LAUNCH_OUT=$T/launch.out
start_job ipc "$LAUNCH_OUT" "$IPC_PAIR" --mib 2 --interval-ms 20
checkpoint_restore_cycle ipc
echo "PASS"
