#!/usr/bin/env bash
# A CUDA process that forked a child which initialised CUDA on its own after
# the fork (cusnap-fork-child; the child still maps the parent's memory it
# inherited). Checkpointed and stopped, then restored: both continue where
# they stopped with their patterns intact.
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("parent " "child ")
LAUNCH_OUT=$T/launch.out
start_job fork "$LAUNCH_OUT" "$FORK_CHILD" --mib 2 --interval-ms 20
checkpoint_restore_cycle fork
echo "PASS"
