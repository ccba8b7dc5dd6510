#include "coord/runtime_dir.h"
#include "coord/abs_path.h"
#include "coord/file_read.h"
#include "coord/write_probe.h"
#include "proto/json_text.h"
#include "proto/proc_stat.h"
#include "proto/utf8.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

namespace cusnap {
namespace {

/// A directory stream over a duplicate of fd (close-on-exec, closed by
/// closedir, or here when fdopendir fails); nullptr when neither works.
DIR* dir_stream_of(int fd) {
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return nullptr;
  DIR* ds = ::fdopendir(copy);
  if (!ds) ::close(copy);
  return ds;
}

/// The files a supervisor leaves in its directory; "lock" is removed last
/// (remove_job_dir), since only a directory holding it is cleaned again.
const char* const kKnownFiles[] = {
    "control.sock",   "job.json",           "job.json.tmp", "output.log",       "output.log.1",
    "left-suspended", "left-suspended.tmp", "gpu-use.json", "gpu-use.json.tmp", "lock"};

/// Where a suspended job's shared memory is saved (suspend_state_dir).
constexpr const char* kSuspendedDir = "suspended";

/// The shims' peer and control sockets (src/proto/shim_messages.h).
bool shim_socket_name(std::string_view n) {
  return (n.starts_with("shim-peer.") || n.starts_with("shim-ctl.")) && n.ends_with(".sock");
}

/// True for the names a supervisor leaves in its directory (remove_job_dir
/// removes exactly these).
bool known_entry(std::string_view n) {
  for (const char* f : kKnownFiles)
    if (n == f) return true;
  return n == kSuspendedDir || shim_socket_name(n);
}

std::string errno_text(const std::string& what) {
  return errno_message(what, errno);
}

/// job.json and the like: small, never a link.
bool read_file(const std::string& path, std::string* out) {
  return read_file_bounded(path, {.max_bytes = kMaxJobJsonBytes, .no_follow = true}, out);
}

/// Takes an exclusive flock, waiting.
bool lock_exclusive(int fd) {
  for (;;) {
    if (::flock(fd, LOCK_EX) == 0) return true;
    if (errno != EINTR) return false;
  }
}

/// Removes what a supervisor leaves in its directory, then the directory.
/// Files we do not know are left alone (and so is the directory).
void remove_job_dir(const std::string& dir) {
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!d) return;
  struct stat st;
  if (::fstat(d.get(), &st) != 0 || st.st_uid != ::geteuid()) return;
  for (const char* f : kKnownFiles)
    if (std::strcmp(f, "lock") != 0) ::unlinkat(d.get(), f, 0);
  // The shared memory a suspend saved (engine_suspend.cpp): worth nothing
  // once the job is gone, and it may hold gigabytes on a tmpfs. Only a real
  // directory of ours; the runtime directory (0700) admits no one else.
  struct stat sst;
  if (::fstatat(d.get(), kSuspendedDir, &sst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sst.st_mode) &&
      sst.st_uid == ::geteuid()) {
    std::error_code ec;
    std::filesystem::remove_all(dir + "/" + kSuspendedDir, ec);
  }
  // The shims' peer and control sockets (src/proto/shim_messages.h), which a
  // killed process leaves behind.
  if (DIR* ds = dir_stream_of(d.get())) {
    while (const dirent* e = ::readdir(ds)) {
      const std::string_view n = e->d_name;
      struct stat fst;
      if (shim_socket_name(n) && ::fstatat(d.get(), e->d_name, &fst, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISSOCK(fst.st_mode))
        ::unlinkat(d.get(), e->d_name, 0);
    }
    ::closedir(ds);
  }
  // Last: a removal cut short (a killed supervisor, a failed remove_all)
  // leaves a directory that the next launch or ps still cleans.
  ::unlinkat(d.get(), "lock", 0);
  ::rmdir(dir.c_str());
}

/// An explicit --runtime-dir: made when absent (its parent must exist, as for
/// checkpoint -o), else taken when empty or when it is a runtime directory a
/// supervisor left (its lock, and only names cusnap writes there): anything
/// else in it is the user's, which the job's end would remove or expose.
bool prepare_explicit_dir(const std::string& dir, std::string* err, bool* refused,
                          const char* remedy = "give a new or empty directory to --runtime-dir") {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) {  // ENOTDIR: a parent is a file, said below
      *err = errno_text("runtime directory " + dir);
      return false;
    }
    const size_t slash = dir.rfind('/');
    const std::string parent =
        slash == std::string::npos ? "." : dir.substr(0, std::max<size_t>(slash, 1));
    struct stat pst;
    const bool there = ::stat(parent.c_str(), &pst) == 0;
    if (!there || !S_ISDIR(pst.st_mode)) {
      *err = "the parent of the runtime directory " + dir + " (" + parent + ") " +
             (there ? "is not a directory" : "does not exist") +
             ": create it or choose another --runtime-dir";
      *refused = true;
      return false;
    }
    return ensure_private_dir(dir, true, err, refused);
  }
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  std::string foreign, first;
  bool has_lock = false;
  if (DIR* ds = d ? dir_stream_of(d.get()) : nullptr) {
    while (const dirent* e = ::readdir(ds)) {
      const std::string_view n = e->d_name;
      if (n == "." || n == "..") continue;
      if (first.empty()) first = n;
      has_lock = has_lock || n == "lock";
      if (!known_entry(n) && foreign.empty()) foreign = n;
    }
    ::closedir(ds);
  }
  // Type, owner and links are refused by ensure_private_dir, which says why.
  if (!first.empty() && (!foreign.empty() || !has_lock)) {
    *err = "refusing runtime directory " + dir + ": it holds '" +
           (foreign.empty() ? first : foreign) + "' and is not one cusnap left; " + remedy;
    *refused = true;
    return false;
  }
  return ensure_private_dir(dir, true, err, refused);
}

}  // namespace

/// Live jobs under base; the caller holds the base's lock when clean_stale.
/// unsupervised: as list_jobs'.
std::vector<JobEntry> list_jobs_in(const std::string& base, bool clean_stale,
                                   std::vector<JobEntry>* unsupervised = nullptr);

namespace {

/// The base's own lock, serialising reservations and cleaning.
UniqueFd lock_base(const std::string& base) {
  UniqueFd fd(::open((base + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd) lock_exclusive(fd.get());
  return fd;
}

}  // namespace

bool valid_job_name(const std::string& name, std::string* err) {
  bool ok = !name.empty() && name.size() <= 64 && name[0] != '.' && name[0] != '-' &&
            std::all_of(name.begin(), name.end(), [](char c) {
              return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '.' || c == '_' || c == '-';
            });
  if (!ok)
    *err = "invalid job name '" + name +
           "': use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'";
  return ok;
}

std::string default_job_name(const std::vector<std::string>& argv) {
  std::string base = argv.empty() ? "job" : argv[0];
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  std::string clean;
  for (char c : base) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    clean += ok ? c : '_';
  }
  while (!clean.empty() && (clean[0] == '.' || clean[0] == '-')) clean.erase(0, 1);
  if (clean.empty()) clean = "job";
  if (clean.size() > 40) clean.resize(40);
  unsigned char rnd[3] = {0, 0, 0};
  if (::getrandom(rnd, sizeof rnd, 0) != sizeof rnd) {
    unsigned v = static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(::time(nullptr));
    std::memcpy(rnd, &v, sizeof rnd);
  }
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, "%02x%02x", rnd[0], rnd[1]);
  return clean + "-" + suffix;
}

std::string runtime_base() {
  std::string base;
  if (const char* b = std::getenv("CUSNAP_RUNTIME_BASE"); b && *b)
    base = b;
  else if (::geteuid() == 0)
    base = "/run/cusnap";
  else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x)
    base = std::string(x) + "/cusnap";
  else
    base = "/tmp/cusnap-" + std::to_string(::geteuid());
  // A relative base is taken from the current directory: every path made
  // from it is recorded (job.json) and given to the job (CUSNAP_RUNTIME_DIR),
  // which may change directory.
  if (std::string abs; base[0] != '/') {
    std::error_code ec;
    if (absolute_path(base, &abs, &ec)) base = abs;
  }
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base;
}

std::string runtime_base_lookup_remedy() {
  const std::string base = runtime_base();
  const char* chosen = std::getenv("CUSNAP_RUNTIME_BASE");
  struct stat st;
  const bool open_dir = ::lstat(base.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
                        st.st_uid == ::geteuid() && (st.st_mode & 07777) != 0700;
  const std::string first = open_dir ? "make it private (chmod 700) if it is cusnap's, or "
                            : chosen && *chosen
                                ? ""
                                : "move it away (it is cusnap's default runtime base), or ";
  return first + "set CUSNAP_RUNTIME_BASE to the runtime base the jobs were launched with";
}

bool ensure_private_dir(const std::string& path, bool create, std::string* err, bool* refused,
                        const char* what) {
  const std::string w = what;
  const auto refuse = [&](std::string why) {
    *err = std::move(why);
    if (refused) *refused = true;
    return false;
  };
  if (path.empty()) {
    *err = "empty " + w + " path";
    return false;
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || !create) {
      *err = errno_text(w + " " + path);
      return false;
    }
    // Missing parents are made 0700 too (e.g. $XDG_RUNTIME_DIR/cusnap).
    if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
      std::string parent = path.substr(0, slash);
      struct stat pst;
      if (::stat(parent.c_str(), &pst) != 0 && errno == ENOENT &&
          !ensure_private_dir(parent, true, err, refused, what))
        return false;
    }
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      *err = errno_text("creating " + w + " " + path);
      return false;
    }
    if (::lstat(path.c_str(), &st) != 0) {
      *err = errno_text(w + " " + path);
      return false;
    }
  }
  if (S_ISLNK(st.st_mode)) return refuse("refusing " + w + " " + path + ": it is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("refusing " + w + " " + path + ": it is not a directory");
  if (st.st_uid != ::geteuid())
    return refuse("refusing " + w + " " + path + ": it is owned by uid " +
                  std::to_string(st.st_uid) + ", not by uid " + std::to_string(::geteuid()));
  if ((st.st_mode & 07777) != 0700) {
    // Only a directory cusnap makes is tightened; a lookup changes nothing.
    if (!create) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
      return refuse("refusing " + w + " " + path + ": its mode is " + mode +
                    ", and cusnap's runtime directories are private (0700)");
    }
    UniqueFd d(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!d || ::fchmod(d.get(), 0700) != 0) {
      *err = errno_text("making " + w + " " + path + " private");
      return false;
    }
  }
  return true;
}

std::string job_status_to_json(const proto::JobStatus& s) {
  nlohmann::json j = {{"name", s.name},
                      {"root_pid", s.root_pid},
                      {"supervisor_pid", s.supervisor_pid},
                      {"argv", s.argv},
                      {"cwd", s.cwd},
                      {"owner_uid", s.owner_uid},
                      {"started", s.started},
                      {"state", s.state},
                      {"runtime_dir", s.runtime_dir},
                      {"restored_from", s.restored_from}};
  return json_text(j, 2) + "\n";
}

bool job_status_from_json(const std::string& text, proto::JobStatus* out, std::string* err) {
  try {
    auto j = nlohmann::json::parse(text);
    out->name = j.at("name").get<std::string>();
    out->root_pid = j.at("root_pid").get<int64_t>();
    out->supervisor_pid = j.at("supervisor_pid").get<int64_t>();
    out->argv = j.at("argv").get<std::vector<std::string>>();
    out->cwd = j.value("cwd", "");
    out->owner_uid = j.at("owner_uid").get<int64_t>();
    out->started = j.value("started", int64_t{0});
    out->state = j.value("state", "");
    out->runtime_dir = j.value("runtime_dir", "");
    out->restored_from = j.value("restored_from", "");
    return true;
  } catch (const std::exception& e) {
    *err = std::string("job.json is malformed: ") + e.what();
    return false;
  }
}

bool RuntimeDir::reserve(const std::string& name, const std::string& explicit_dir,
                         std::unique_ptr<RuntimeDir>* out, std::string* err, bool* refused) {
  bool refusal = false;
  if (refused) *refused = false;
  const auto taken = [&] {
    if (refused) *refused = true;
    return false;
  };
  if (!valid_job_name(name, err)) return false;
  const std::string base = runtime_base();
  const std::string dir = explicit_dir.empty() ? base + "/" + name : explicit_dir;
  // Kept in job.json and read back by ps, inspect and the guardian: a path
  // JSON cannot carry whole would name another directory. Refused before
  // anything is made (the base too).
  if (!valid_utf8(dir)) {
    *err = "the runtime directory " + dir +
           " is not valid UTF-8, which cusnap cannot record: choose another with --runtime-dir "
           "or CUSNAP_RUNTIME_BASE";
    return taken();
  }
  // A base cusnap makes is private; one that is there is taken as it is,
  // never tightened: it may be a directory of the user's (for example
  // CUSNAP_RUNTIME_BASE=.), whose mode is theirs to set.
  struct stat bst;
  const bool base_there = ::lstat(base.c_str(), &bst) == 0;
  if (!ensure_private_dir(base, !base_there, err, &refusal, "runtime base")) {
    // A directory of this user's is refused for its mode alone.
    if (base_there)
      *err += S_ISDIR(bst.st_mode) && bst.st_uid == ::geteuid()
                  ? "; point CUSNAP_RUNTIME_BASE at a directory that cusnap alone uses (a new one "
                    "is made private), or make this one private (chmod 700)"
                  : "; point CUSNAP_RUNTIME_BASE at a directory that cusnap alone uses";
    return refusal ? taken() : false;
  }
  UniqueFd base_lock = lock_base(base);
  if (!base_lock) {
    *err = errno_text("locking " + base + "/.lock");
    return false;
  }
  // A name is unique among the live jobs under the base, wherever their
  // directories are, and those running on without a supervisor.
  std::vector<JobEntry> unsupervised;
  for (const JobEntry& e : list_jobs_in(base, true, &unsupervised)) {
    if (e.status.name == name) {
      *err = "a job named '" + name + "' is already running (supervisor pid " +
             std::to_string(e.status.supervisor_pid) + "); choose another --name";
      return taken();
    }
  }
  for (const JobEntry& e : unsupervised) {
    if (e.status.name == name) {
      *err = "a job named '" + name + "' runs on without a supervisor (its process " +
             std::to_string(e.status.root_pid) + "; cusnap ps says more); choose another --name";
      return taken();
    }
  }
  // BASE/NAME may be the link through which a job restored under another
  // name reaches its shims' sockets (job_restore.cpp): the name is taken.
  if (struct stat lst; ::lstat((base + "/" + name).c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    char target[4096];
    const ssize_t n = ::readlink((base + "/" + name).c_str(), target, sizeof target - 1);
    const std::string to = n > 0 ? std::string(target, size_t(n)) : "";
    std::string text, why;
    proto::JobStatus other;
    if (!to.empty() && runtime_dir_live(to) && read_file(to + "/job.json", &text) &&
        job_status_from_json(text, &other, &why) && other.name != name) {
      *err = "the name '" + name + "' is taken: job '" + other.name +
             "', restored from a checkpoint of job " + name +
             ", is already running (supervisor pid " + std::to_string(other.supervisor_pid) +
             ") and reaches its shims through " + base + "/" + name + "; choose another --name";
      return taken();
    }
  }
  // A directory elsewhere is found through the link BASE/NAME, which only
  // replaces a link: anything else there (the stale directories of dead
  // supervisors are gone by now) is refused before anything is made.
  const std::string link = base + "/" + name;
  const auto same_file = [](const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  };
  struct stat lst, dst;
  if (!explicit_dir.empty() && ::lstat(link.c_str(), &lst) == 0 && !S_ISLNK(lst.st_mode) &&
      !(::stat(dir.c_str(), &dst) == 0 && same_file(lst, dst))) {
    *err = "cannot link " + link + " to the runtime directory " + dir + ": " + link +
           " is there and is not a link cusnap made; remove it, or choose another --name";
    return taken();
  }
  const bool existed = ::lstat(dir.c_str(), &dst) == 0;
  // BASE/NAME, too, is taken only when new, empty or a runtime directory a
  // supervisor left: a directory of the user's there keeps its mode and files.
  if (!(explicit_dir.empty()
            ? prepare_explicit_dir(dir, err, &refusal,
                                   "choose another --name, or move it out of the base")
            : prepare_explicit_dir(dir, err, &refusal)))
    return refusal ? taken() : false;
  if (runtime_dir_live(dir)) {
    *err = "a job is already running in runtime directory " + dir;
    return taken();
  }
  // BASE/NAME given as --runtime-dir (by any spelling) is no link's target.
  const bool linked =
      !explicit_dir.empty() && !(::lstat(link.c_str(), &lst) == 0 && S_ISDIR(lst.st_mode) &&
                                 ::stat(dir.c_str(), &dst) == 0 && same_file(lst, dst));
  const bool lock_existed = ::lstat((dir + "/lock").c_str(), &dst) == 0;
  // A reservation that fails leaves nothing it made: the directory, or the
  // lock in a directory that was there.
  const auto undo = [&] {
    if (!existed) {
      remove_job_dir(dir);
      ::rmdir(dir.c_str());  // still empty: remove_job_dir had no descriptor to open it
    } else if (!lock_existed)
      ::unlink((dir + "/lock").c_str());
  };
  UniqueFd lock(::open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock) {
    *err = errno_text("locking " + dir + "/lock");
    undo();
    return false;
  }
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    // Another supervisor's now (it took the directory since the look
    // above): left as it is.
    if (errno == EWOULDBLOCK) {
      *err = "a job is already running in runtime directory " + dir +
             " (its supervisor took it a moment ago); choose another --name or --runtime-dir";
      return taken();
    }
    *err = errno_text("locking " + dir + "/lock");
    return false;
  }
  // What a dead supervisor left behind (its lock is ours now).
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (d)
    for (const char* f : kKnownFiles)
      if (std::strcmp(f, "lock") != 0) ::unlinkat(d.get(), f, 0);
  if (linked) {
    ::unlink(link.c_str());  // a link, as checked above
    if (::symlink(dir.c_str(), link.c_str()) != 0) {
      *err = errno_text("linking " + link + " to " + dir);
      undo();
      return false;
    }
  }
  out->reset(new RuntimeDir(dir, std::move(lock)));
  if (linked) (*out)->link_ = link;
  return true;
}

RuntimeDir::~RuntimeDir() = default;

bool RuntimeDir::write_status(const proto::JobStatus& s, std::string* err) {
  const std::string tmp = path_ + "/job.json.tmp", dst = job_json_path();
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    *err = errno_text("writing " + tmp);
    return false;
  }
  const std::string text = job_status_to_json(s);
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd.get(), text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      *err = errno_text("writing " + tmp);
      return false;
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd.get()) != 0 || ::rename(tmp.c_str(), dst.c_str()) != 0) {
    *err = errno_text("writing " + dst);
    return false;
  }
  return true;
}

bool RuntimeDir::can_write(std::string* err, int* error_number) {
  return probe_write(path_ + "/job.json.tmp", "the runtime directory " + path_, err, error_number);
}

void RuntimeDir::remove() {
  if (removed_) return;
  removed_ = true;
  if (!link_.empty()) {
    // Drop the base's link to an explicit directory if it still points here.
    char target[4096];
    ssize_t n = ::readlink(link_.c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<size_t>(n)) == path_) ::unlink(link_.c_str());
  }
  remove_job_dir(path_);
  lock_.reset();
}

std::unique_ptr<RuntimeDir> RuntimeDir::adopt(const std::string& path, UniqueFd lock) {
  return std::unique_ptr<RuntimeDir>(new RuntimeDir(path, std::move(lock)));
}

bool runtime_dir_live(const std::string& dir) {
  UniqueFd fd(::open((dir + "/lock").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return false;
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return false;
  return errno == EWOULDBLOCK;
}

bool holds_lock_file(const std::string& dir) {
  struct stat st;
  return ::lstat((dir + "/lock").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool runs_unsupervised(const std::string& dir, JobEntry* out) {
  std::string text, err;
  JobEntry je;
  if (!read_file(dir + "/job.json", &text) || !job_status_from_json(text, &je.status, &err) ||
      je.status.root_pid <= 0 || je.status.root_pid > INT32_MAX)
    return false;
  uint64_t ticks = 0;
  if (!proto::proc_start_time(pid_t(je.status.root_pid), &ticks, true)) return false;
  // Its start in Unix time: boot time (/proc/stat's btime) plus the ticks.
  long long btime = -1;
  if (FILE* f = std::fopen("/proc/stat", "re")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "btime %lld", &btime) == 1) break;
    std::fclose(f);
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (btime < 0 || hz <= 0) return false;
  // The supervisor records the job's start once its first process exists
  // (a second of rounding, a second of slack): a process that began later
  // took the pid since.
  if (btime + static_cast<long long>(ticks / uint64_t(hz)) > je.status.started + 2) return false;
  je.dir = dir;
  *out = std::move(je);
  return true;
}

std::vector<JobEntry> list_jobs(bool clean_stale, std::string* err,
                                std::vector<JobEntry>* unsupervised) {
  const std::string base = runtime_base();
  std::string why;
  if (err) err->clear();
  if (!ensure_private_dir(base, false, &why, nullptr, "runtime base")) {
    struct stat st;
    if (err && (::lstat(base.c_str(), &st) == 0 || errno != ENOENT)) *err = why;
    return {};
  }
  UniqueFd base_lock;
  if (clean_stale) {
    base_lock = lock_base(base);
    if (!base_lock) clean_stale = false;
  }
  return list_jobs_in(base, clean_stale, unsupervised);
}

std::vector<JobEntry> list_jobs_in(const std::string& base, bool clean_stale,
                                   std::vector<JobEntry>* unsupervised) {
  std::vector<JobEntry> jobs;
  std::string err;
  std::vector<std::string> names;
  // The directories listed: a job's directory may be an entry of the base
  // under another name (launch --runtime-dir BASE/OTHER) as well as the
  // target of its link BASE/NAME; it is listed once.
  std::set<std::pair<dev_t, ino_t>> listed;
  if (DIR* d = ::opendir(base.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    std::string entry = base + "/" + n, dir = entry;
    struct stat st;
    if (::lstat(entry.c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    bool is_link = S_ISLNK(st.st_mode);
    if (is_link) {
      char target[4096];
      ssize_t len = ::readlink(entry.c_str(), target, sizeof target - 1);
      if (len <= 0) continue;
      dir.assign(target, static_cast<size_t>(len));
      // Checked, never changed: a link's target is only ever a directory
      // that `launch --runtime-dir` made private, and nothing here may act on
      // a directory some other link names.
      struct stat tst;
      if (::lstat(dir.c_str(), &tst) != 0) {
        if (clean_stale && errno == ENOENT) ::unlink(entry.c_str());
        continue;
      }
      if (!S_ISDIR(tst.st_mode) || tst.st_uid != ::geteuid() || (tst.st_mode & 077) != 0) continue;
    } else if (!S_ISDIR(st.st_mode)) {
      continue;
    }
    JobEntry je;
    std::string text;
    bool live = runtime_dir_live(dir) && read_file(dir + "/job.json", &text) &&
                job_status_from_json(text, &je.status, &err);
    // A link named for another job: the way a job restored under a new name
    // reaches its shims (job_restore.cpp); that job is listed by its own entry.
    if (live && is_link && je.status.name != n) continue;
    if (!live) {
      // A job whose first process outlived its supervisor and guardian: its
      // directory stays (the record of it), and the link BASE/NAME to one
      // elsewhere (launch --runtime-dir); it is said, once.
      if (JobEntry gone; holds_lock_file(dir) && !runtime_dir_live(dir) &&
                         runs_unsupervised(dir, &gone) && (!is_link || gone.status.name == n)) {
        if (struct stat dst; unsupervised && ::stat(dir.c_str(), &dst) == 0 &&
                             listed.emplace(dst.st_dev, dst.st_ino).second)
          unsupervised->push_back(std::move(gone));
        continue;
      }
      // Only a runtime directory (one holding its lock file) is cleaned: any
      // other directory in the base is someone's, which remove_job_dir would
      // empty of the names a supervisor uses (output.log, job.json, ...). A
      // link without a live job goes (only the link).
      if (clean_stale && (is_link || holds_lock_file(dir)) && !runtime_dir_live(dir)) {
        // Through a link only the link goes: its target is cleaned by the
        // next launch that reserves it.
        if (is_link)
          ::unlink(entry.c_str());
        else
          remove_job_dir(dir);
      }
      continue;
    }
    if (struct stat dst;
        ::stat(dir.c_str(), &dst) != 0 || !listed.emplace(dst.st_dev, dst.st_ino).second)
      continue;
    je.dir = dir;
    jobs.push_back(std::move(je));
  }
  return jobs;
}

bool find_job(const std::string& spec, JobEntry* out, std::string* err, JobMiss* miss) {
  if (miss) *miss = JobMiss::kNone;
  if (spec.find('/') != std::string::npos) {
    std::string text;
    // A directory without a lock is no runtime directory, whatever its mode
    // (nothing in it is opened); one with a lock must be private to be read.
    // What cannot be looked at, or is not cusnap's to use, is no missing
    // job: said as an error (exit 1), with what to do.
    auto unusable = [&](const std::string& why, const char* todo) {
      if (miss) *miss = JobMiss::kUnusableDir;
      *err = why + ": " + todo;
      return false;
    };
    // errno from a look that failed for another reason than absence.
    auto cannot_look = [&] {
      return unusable(errno_text("cannot look for a job in " + spec),
                      "run cusnap as the job's owner");
    };
    struct stat st;
    if (::lstat(spec.c_str(), &st) != 0) {
      if (errno != ENOENT && errno != ENOTDIR) return cannot_look();
      *err = errno_text("no job is running in " + spec);
      return false;
    }
    // A directory of another user's (0700) hides its lock.
    if (struct stat ls; ::lstat((spec + "/lock").c_str(), &ls) != 0 && errno == EACCES)
      return cannot_look();
    if (!holds_lock_file(spec)) {
      *err = "no job is running in " + spec +
             ": it is not a job's runtime directory (cusnap ps lists the running jobs)";
      return false;
    }
    if (std::string why; !ensure_private_dir(spec, false, &why))
      return unusable(why,
                      "run cusnap as the job's owner, and keep its runtime directory private "
                      "(chmod 700)");
    if (!runtime_dir_live(spec) || !read_file(spec + "/job.json", &text)) {
      *err = "no job is running in " + spec +
             ": its supervisor has ended (cusnap ps lists the running jobs)";
      return false;
    }
    out->dir = spec;
    if (std::string why; !job_status_from_json(text, &out->status, &why))
      return unusable(spec + "/" + why,
                      "written by another cusnap version, or damaged: use the cusnap that "
                      "launched the job");
    return true;
  }
  // A name first: an all-digit name may be another job's pid. Else a number
  // is a supervisor's pid or the job's root process's (both in ps), which
  // must be one job's.
  bool numeric = !spec.empty() && std::all_of(spec.begin(), spec.end(), ::isdigit);
  std::string why;
  std::vector<JobEntry> jobs = list_jobs(false, &why);
  for (JobEntry& e : jobs) {
    if (e.status.name == spec) {
      *out = std::move(e);
      return true;
    }
  }
  std::vector<JobEntry*> by_pid;
  if (numeric)
    for (JobEntry& e : jobs)
      if (std::to_string(e.status.supervisor_pid) == spec ||
          std::to_string(e.status.root_pid) == spec)
        by_pid.push_back(&e);
  if (by_pid.size() == 1) {
    *out = std::move(*by_pid[0]);
    return true;
  }
  if (by_pid.size() > 1) {
    *err = "pid " + spec + " belongs to more than one job (";
    for (size_t i = 0; i < by_pid.size(); ++i) *err += (i ? ", " : "") + by_pid[i]->status.name;
    *err += "): give the job's name instead";
    if (miss) *miss = JobMiss::kAmbiguous;
    return false;
  }
  *err = why.empty() ? "no job named '" + spec + "' is running (see cusnap ps)"
                     : "cannot look for job '" + spec + "': " + why;
  if (miss && !why.empty()) *miss = JobMiss::kUnusableBase;
  return false;
}

}  // namespace cusnap
