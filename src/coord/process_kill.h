// Signalling and ending processes through pidfds, which cannot hit a pid
// that was reused meanwhile: the engine's kills of a job's tree, of CRIU and
// of what CRIU forked.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

#include "proto/unique_fd.h"

namespace cusnap {

/// pidfd of a process, none when gone; signals through it cannot hit a reused pid.
UniqueFd open_pidfd(pid_t pid);
/// Sends sig through pidfd; nothing when it holds none.
void signal_pidfd(const UniqueFd& pidfd, int sig);
/// Waits until every process of pidfds (empty entries skipped) has exited,
/// at most `limit` in all; true if they all did.
bool wait_pidfds_exited(const std::vector<UniqueFd>& pidfds, std::chrono::milliseconds limit);

/// Whether kill_process_tree waits for the processes it killed and reaps
/// those that are the caller's children (a zombie would hold its pid), root
/// included, or leaves root's wait status to the caller.
enum class TreeReap { kAll, kNotRoot };

/// Ends root and every process it forked. Each process of the tree is
/// stopped first, the tree looked at again until a look finds none new (a
/// process that forks meanwhile cannot leave a child behind), then all are
/// killed, root last. With TreeReap::kAll it waits (10 s in all at most)
/// for each to exit and reaps the caller's children among them; root's
/// descendants are reaped either way where they are the caller's (it is
/// their subreaper). Returns how many processes it signalled.
size_t kill_process_tree(pid_t root, TreeReap reap);

}  // namespace cusnap
