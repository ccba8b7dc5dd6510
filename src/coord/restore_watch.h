// The watch of a restore: a small process the restoring process forks before
// CRIU starts, outside the job's tree and the terminal's session. When the
// restoring process dies before the restore ends (SIGKILL, the OOM killer;
// SIGINT, SIGTERM and SIGHUP wait for the supervisor loop, which forwards them
// to the job), CRIU dies with it (CriuRun::die_with_caller) and the watch
// ends what was restored of the job: each of the checkpoint's processes
// alive under its id and started after the watch began, stopped first, and
// with it what it started since CRIU let it run on (while the driver restore
// and the shared rebuild went on; not in the checkpoint). Nothing is left
// half-restored, holding its GPU memory, its process ids and its ports; the
// checkpoint is unchanged and restores again. Before it ends a process, the
// watch puts its TCP sockets into repair mode, as CRIU's dump leaves them:
// past CRIU's network unlock they are out of it, and closed the ordinary way
// the job's connections would hold their ports in TIME-WAIT for a minute, in
// which the next restore is refused. (CRIU's restore takes no network lock
// of its own: killed before its unlock, it leaves the checkpoint's lock in
// place, for the next restore to remove.) The watch writes what it did to
// the restore's stderr (with --detach, the waiting command's). Then it removes
// the restore's temporary directories (CRIU's work directory and its empty
// plugin directory, which the restoring process's destructors no longer
// will): each only while it is still the very directory given (same device
// and inode, not a symbolic link, ours, named PREFIX PID "-" XXXXXX with the
// restoring process's pid), without following a link inside; one it cannot
// remove is named in its message and left to the sweep of a later restore
// (sweep_stale_temp_dirs). One the restore has kept (keep_temp_dir: CRIU's
// files of a failed run, which its error message names) stays, and the
// watch's message names it.
//
// Once the restore fails, the watch is dismissed and exits without acting (a
// failed restore ends its own processes); once it succeeds, the watch stays
// until the job's guardian runs (RestoreResult::watch), then is dismissed. The child does only
// async-signal-safe calls (the restoring process may have driver threads):
// no exec, no allocation.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "proto/unique_fd.h"

namespace cusnap {

class RestoreWatch {
 public:
  RestoreWatch() = default;
  RestoreWatch(const RestoreWatch&) = delete;
  RestoreWatch& operator=(const RestoreWatch&) = delete;
  ~RestoreWatch() { dismiss(); }

  /// Forks the watch over the processes pids (the checkpoint's) of the
  /// checkpoint dir, to write what it did to report_fd and to remove
  /// temp_dirs (the restore's TempDirs, cusnap-restore- and
  /// cusnap-noplugins-) should the restoring process die; false + *err when
  /// it cannot. A path of temp_dirs that is not such a directory now is
  /// never removed.
  bool start(const std::vector<pid_t>& pids, const std::string& dir, int report_fd,
             std::string* err, const std::vector<std::string>& temp_dirs = {});
  /// The temporary directory path (one given to start) is to stay, as the
  /// restore keeps CRIU's files of a failed run: should the restoring
  /// process die now, the watch names it instead of removing it.
  void keep_temp_dir(const std::string& path);
  /// The restore ended: the watch exits without acting, and is reaped.
  void dismiss();
  pid_t pid() const { return pid_; }

 private:
  UniqueFd tell_;  ///< our end of the socket pair the watch waits on
  pid_t pid_ = -1;
  std::vector<std::string> temp_paths_;  ///< those start accepted, in the watch's order
};

}  // namespace cusnap
