#!/usr/bin/env bash
# A CUDA process that forked a child which initialises CUDA on its own
# (cusnap-fork-child). Checkpointed and stopped, then restored: both continue
# where they stopped with their patterns intact. First with a child that
# re-executes itself before its cuInit, then with a plain fork (the child's
# cuInit follows the fork directly; the real driver refuses that, and the
# simulated one likewise, and the workload then re-executes the child).
source "$(dirname "$0")/lib_shared.sh"

PREFIXES=("parent " "child ")
LAUNCH_OUT=$T/launch-exec.out
start_job forkexec "$LAUNCH_OUT" "$FORK_CHILD" --mib 2 --interval-ms 20 --exec-child
checkpoint_restore_cycle forkexec
stop_job "$LAUNCH_OUT"

LAUNCH_OUT=$T/launch.out
start_job fork "$LAUNCH_OUT" "$FORK_CHILD" --mib 2 --interval-ms 20
checkpoint_restore_cycle fork
echo "PASS"
