// A job's private runtime directory and the directory of all jobs.
//
// Layout: BASE/NAME/ holds control.sock (0600), job.json (written
// atomically), output.log and lock. BASE is $CUSNAP_RUNTIME_BASE, else
// /run/cusnap for root and $XDG_RUNTIME_DIR/cusnap (or /tmp/cusnap-UID)
// for others; `launch --runtime-dir D` puts one job's directory elsewhere.
// Every directory is 0700 and owned by the user; one that is a symlink or
// owned by someone else is refused.
//
// Liveness: the supervisor holds an exclusive flock on NAME/lock for its
// whole life, so a directory whose lock is free belongs to a dead supervisor
// (stale) whatever its job.json says. Reserving and cleaning happen under a
// flock on BASE/.lock so two launches of one name cannot both win.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "proto/control.h"
#include "proto/unique_fd.h"

namespace cusnap {

/// Names: 1 to 64 of [A-Za-z0-9._-], not starting with '.' or '-'.
bool valid_job_name(const std::string& name, std::string* err);
/// A name from the command's basename plus a short random suffix.
std::string default_job_name(const std::vector<std::string>& argv);

/// The directory that holds every job's runtime directory.
std::string runtime_base();
/// What to do about a runtime base that list_jobs refused, for a command
/// that looks for jobs: make it private again where only its mode is wrong,
/// move the default base away, or name the base the jobs were launched with.
std::string runtime_base_lookup_remedy();

/// Makes sure path is a directory owned by the effective user, not a symlink,
/// mode 0700 (creating it, and its missing parents, when create is set;
/// tightening the mode of one we own). *refused (when given) is set when it
/// is refused for what is there (a link, not a directory, another owner, a
/// mode not tightened), not for a system call's failure.
/// what: the directory's kind in the messages ("runtime base" for the base).
bool ensure_private_dir(const std::string& path, bool create, std::string* err,
                        bool* refused = nullptr, const char* what = "runtime directory");

/// The most of a job.json that ps, inspect, a name's reservation and a
/// guardian's takeover read: a longer one is taken for damaged.
inline constexpr size_t kMaxJobJsonBytes = size_t(1) << 20;

/// job.json as JSON text and back.
std::string job_status_to_json(const proto::JobStatus& s);
bool job_status_from_json(const std::string& text, proto::JobStatus* out, std::string* err);

/// A reserved runtime directory, held for the supervisor's life.
class RuntimeDir {
 public:
  /// Reserves the directory of job name (explicit_dir when not empty):
  /// creates it, takes its lock, cleans what a dead supervisor left there.
  /// Refuses when a live job holds the name or the directory, or when what
  /// is there may not be taken (a base or directory that is not private, a
  /// link, a directory of the user's with files in it, a missing parent, a
  /// path that is not UTF-8): *refused (when given) then true, the caller's
  /// refusal before anything changed (exit 3); false for a system call that
  /// failed (exit 1).
  static bool reserve(const std::string& name, const std::string& explicit_dir,
                      std::unique_ptr<RuntimeDir>* out, std::string* err, bool* refused = nullptr);
  /// Takes over the directory at path whose lock the caller already holds
  /// (a guardian adopting a job whose supervisor died).
  static std::unique_ptr<RuntimeDir> adopt(const std::string& path, UniqueFd lock);
  ~RuntimeDir();

  const std::string& path() const { return path_; }
  std::string socket_path() const { return path_ + "/control.sock"; }
  std::string log_path() const { return path_ + "/output.log"; }
  std::string job_json_path() const { return path_ + "/job.json"; }
  /// The lock descriptor; a forked supervisor keeps it to stay live.
  int lock_fd() const { return lock_.get(); }

  /// Writes job.json atomically (temp file, fsync, rename).
  bool write_status(const proto::JobStatus& s, std::string* err);
  /// Whether a page can be written to the directory now (through
  /// job.json.tmp, removed again): the job is found through job.json, so a
  /// directory that cannot take it is refused before the job starts.
  bool can_write(std::string* err, int* error_number = nullptr);
  /// Removes everything in the directory and the directory (at exit).
  void remove();

 private:
  RuntimeDir(std::string path, UniqueFd lock) : path_(std::move(path)), lock_(std::move(lock)) {}
  std::string path_;
  std::string link_;  ///< BASE/NAME when the directory lives elsewhere
  UniqueFd lock_;
  bool removed_ = false;
};

/// A job found under the base.
struct JobEntry {
  std::string dir;
  proto::JobStatus status;
};

/// Whether the supervisor of the runtime directory dir is alive (holds its lock).
bool runtime_dir_live(const std::string& dir);
/// Whether dir is a runtime directory, live or left by a dead supervisor: it
/// holds a regular lock file (a link there is not followed).
bool holds_lock_file(const std::string& dir);
/// Every live job under the base, by name; directories of dead supervisors
/// are removed on the way when clean_stale is set. *err (when given): why the runtime base was
/// refused (a link, not a directory, another owner, unreadable); empty when it is fine or does not
/// exist yet (no jobs). A job whose supervisor is dead (killed with its
/// guardian) while its first process runs on keeps its directory, and is
/// put in *unsupervised (when given), as its job.json says it.
std::vector<JobEntry> list_jobs(bool clean_stale, std::string* err = nullptr,
                                std::vector<JobEntry>* unsupervised = nullptr);
/// Whether the runtime directory dir, whose supervisor is dead, names in its
/// job.json a first process that runs on: the same process (started no later
/// than the job, not a later one given its pid). *out gets the job.
bool runs_unsupervised(const std::string& dir, JobEntry* out);
/// Why find_job found no job.
enum class JobMiss {
  kNone,          ///< no job is known by that name, pid or path
  kUnusableBase,  ///< the runtime base could not be searched at all
  kAmbiguous,     ///< the pid is more than one job's (a name is needed)
  /// a runtime directory given as a path that cannot be used: not to be
  /// looked at by this user, not private, or its job.json malformed (*err
  /// says what to do)
  kUnusableDir,
};
/// Finds a live job by name, supervisor or root pid, or runtime directory path.
/// false + *err ("no job named X") when there is none, and *miss (when given)
/// says why.
bool find_job(const std::string& spec, JobEntry* out, std::string* err, JobMiss* miss = nullptr);

}  // namespace cusnap
