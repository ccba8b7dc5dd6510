// A job whose roll back failed is left suspended, not given up: its
// processes wait at the driver's or the shims' gates with their GPU state
// kept by the driver, and the shared memory the operation saved stays where
// it was written. A marker in the job's runtime directory says where, so that
// cusnap resume brings the job back (recover_job) and checkpoint and suspend
// refuse until then.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "coord/engine_internal.h"
#include "coord/manifest.h"
#include "coord/shared_memory.h"
#include "proto/json_text.h"
#include "proto/unique_fd.h"

namespace cusnap::engine_detail {
namespace fs = std::filesystem;

namespace {

/// Bytes of the failure kept in the marker.
constexpr size_t kMaxReason = 4096;

std::string marker_path(const JobInfo& job) {
  return job.runtime_dir + "/" + kLeftSuspendedFile;
}

/// The marker's fields; state_dir only where shared memory was saved there.
nlohmann::json marker_json(const LeftSuspended& left) {
  return {{"operation", left.operation},
          {"since", left.since},
          {"reason", left.reason},
          {"restore_refused", left.restore_refused},
          {"state_dir", left.saved ? left.state_dir : ""},
          {"saved", left.saved},
          {"remove_dir", left.remove_dir}};
}

/// Markers this process could not write (a full disk, say), by path: the
/// supervisor that left the job suspended keeps them, so that its cusnap
/// resume still finds where the saved shared memory is. Other processes (ps,
/// inspect, a guardian) see only the file.
std::mutex g_unwritten_mu;
std::map<std::string, LeftSuspended> g_unwritten;

/// Writes the marker atomically and durably; "" or what went wrong (the
/// temporary file then removed).
std::string write_marker(const JobInfo& job, const LeftSuspended& left) {
  if (job.runtime_dir.empty()) return "the job has no runtime directory";
  const std::string text = json_text(marker_json(left)) + "\n", path = marker_path(job),
                    tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  bool ok = bool(fd);
  if (ok) {
    ok = write_all(fd.get(), text.data(), text.size());
  }
  ok = ok && ::fsync(fd.get()) == 0 && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    const int e = errno;
    if (fd) ::unlink(tmp.c_str());
    return "writing " + path + ": " + std::strerror(e);
  }
  if (UniqueFd dir{::open(job.runtime_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)})
    ::fsync(dir.get());
  return "";
}

/// Writes the marker, or keeps it in this process where that fails; "" or
/// what went wrong with the file.
std::string note_marker(const JobInfo& job, const LeftSuspended& left) {
  std::string problem = write_marker(job, left);
  std::lock_guard lk(g_unwritten_mu);
  if (problem.empty())
    g_unwritten.erase(marker_path(job));
  else
    g_unwritten[marker_path(job)] = left;
  return problem;
}

}  // namespace

std::string suspend_state_dir(const JobInfo& job) {
  return job.runtime_dir + "/suspended";
}

std::string cannot_come_back(const JobInfo& job) {
  return ": stop it (SIGTERM to its supervisor, process " + std::to_string(::getpid()) +
         ") and restore an earlier checkpoint of " + job.name;
}

std::string leave_suspended(const JobInfo& job, const std::string& state_dir, bool remove_dir,
                            const char* operation, const std::string& why, bool restore_refused) {
  const bool saved = !state_dir.empty() && !saved_shim_processes(state_dir).empty();
  const size_t from = why.find_first_not_of(" \n"), to = why.find_last_not_of(" \n");
  LeftSuspended left;
  left.operation = operation;
  left.since = utc_now();
  left.reason = from == std::string::npos ? "" : why.substr(from, to - from + 1);
  if (left.reason.size() > kMaxReason) left.reason = left.reason.substr(0, kMaxReason) + "...";
  left.restore_refused = restore_refused;
  left.state_dir = state_dir;
  left.saved = saved;
  left.remove_dir = saved && remove_dir;
  const std::string problem = note_marker(job, left);
  std::string msg =
      "\nthe job is left suspended: its processes wait at the driver's and cusnap's "
      "gates with their GPU state kept";
  if (saved) msg += ", its shared memory saved in " + state_dir;
  if (restore_refused)
    return msg + "; but the driver will not restore its GPU state" + cannot_come_back(job);
  if (problem.empty()) return msg + "; run cusnap resume " + job.name + " to bring it back";
  return msg + "; run cusnap resume " + job.name +
         " to bring it back. cusnap could not note it on disk (" + problem +
         "): only this supervisor knows it is left so (cusnap ps and inspect do not show it)";
}

bool read_left_suspended(const JobInfo& job, LeftSuspended* out) {
  if (job.runtime_dir.empty()) return false;
  {
    // What this process could not write is newer than any file there (a
    // restore refused after the marker was written, say).
    std::lock_guard lk(g_unwritten_mu);
    auto kept = g_unwritten.find(marker_path(job));
    if (kept != g_unwritten.end()) {
      *out = kept->second;
      return true;
    }
  }
  UniqueFd fd(::open(marker_path(job).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return false;
  std::string text;
  char buf[4096];
  for (ssize_t r; (r = ::read(fd.get(), buf, sizeof buf)) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || text.size() > 65536) return false;
    text.append(buf, size_t(r));
  }
  // An unreadable marker still says the job is left suspended: its state
  // directory is then the suspend's own.
  *out = LeftSuspended{};
  out->state_dir = suspend_state_dir(job);
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    out->operation = j.value("operation", "");
    out->since = j.value("since", "");
    out->reason = j.value("reason", "");
    out->restore_refused = j.value("restore_refused", false);
    const std::string dir = j.value("state_dir", "");
    if (!dir.empty()) out->state_dir = dir;
    out->remove_dir = j.value("remove_dir", false);
    out->saved = j.value("saved", false);
  } catch (const std::exception&) {
  }
  return true;
}

void note_restore_refused(const JobInfo& job) {
  LeftSuspended left;
  if (!read_left_suspended(job, &left) || left.restore_refused) return;
  left.restore_refused = true;
  note_marker(job, left);  // best effort: the resume's error says it too
}

void clear_left_suspended(const JobInfo& job, const LeftSuspended& left) {
  {
    std::lock_guard lk(g_unwritten_mu);
    g_unwritten.erase(marker_path(job));
  }
  std::error_code ec;
  // A completed checkpoint (--leave-running) holds its shared memory too.
  if (fs::exists(left.state_dir + "/" + kManifestName, ec)) {
    ::unlink(marker_path(job).c_str());
    return;
  }
  fs::remove_all(left.state_dir + "/shim", ec);
  fs::remove_all(left.state_dir + "/shared", ec);
  if (left.remove_dir) fs::remove(left.state_dir, ec);  // only when empty
  ::unlink(marker_path(job).c_str());
}

bool refuse_when_left_suspended(const JobInfo& job, const char* operation, std::string* err) {
  LeftSuspended left;
  if (!read_left_suspended(job, &left)) return true;
  if (left.restore_refused) {
    *err = "job " + job.name + " cannot be " +
           (std::string(operation) == "suspend" ? "suspended" : "checkpointed") +
           ": the driver refused to restore its GPU state" +
           (left.operation.empty() ? "" : " after a failed " + left.operation) +
           ", and will not restore it again" + cannot_come_back(job);
    return false;
  }
  *err = "job " + job.name + " was left suspended by a failed roll back" +
         (left.operation.empty() ? "" : " of a " + left.operation) + ", so it cannot be " +
         (std::string(operation) == "suspend" ? "suspended" : "checkpointed") +
         " now: run cusnap resume " + job.name + " first";
  return false;
}

}  // namespace cusnap::engine_detail

namespace cusnap {

std::string left_suspended_details(const JobInfo& job) {
  engine_detail::LeftSuspended left;
  if (!engine_detail::read_left_suspended(job, &left)) return "";
  nlohmann::json j = engine_detail::marker_json(left);
  j.erase("remove_dir");  // the marker's own bookkeeping
  return json_text(j);
}

LeftSuspendedState left_suspended_state(const JobInfo& job) {
  engine_detail::LeftSuspended left;
  if (!engine_detail::read_left_suspended(job, &left)) return LeftSuspendedState::kNo;
  return left.restore_refused ? LeftSuspendedState::kRestoreRefused
                              : LeftSuspendedState::kResumable;
}

}  // namespace cusnap
