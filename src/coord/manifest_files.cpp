// The files of a checkpoint against its manifest: listing, chunked SHA-256
// at checkpoint (hash_directory) and before restore (verify_manifest_files),
// with the shared memory the shims' records name.
// Apart from manifest.cpp so that the parser builds without the hashing.
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "coord/manifest.h"
#include "coord/sha256_chunked.h"
#include "coord/shared_memory.h"
#include "proto/shim_messages.h"
#include "proto/unique_fd.h"

namespace cusnap {
namespace fs = std::filesystem;

namespace {

bool list_files(const std::string& dir, std::vector<std::string>* out, std::string* err) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    // Named as found, never through a link (fs::relative would follow one
    // and name its target).
    const std::string shown = it->path().string();
    if (it->is_symlink(ec)) {
      *err = shown + " is a symbolic link; a checkpoint holds only regular files";
      return false;
    }
    if (it->is_directory(ec)) continue;
    if (!it->is_regular_file(ec)) {
      *err = shown + " is not a regular file";
      return false;
    }
    const std::string rel = it->path().lexically_relative(dir).string();
    if (rel != kManifestName) out->push_back(rel);
  }
  if (ec) {
    *err = "cannot list " + dir + ": " + ec.message() + descriptor_remedy(ec.value());
    return false;
  }
  std::sort(out->begin(), out->end());
  return true;
}

// Size of the regular file at path (not followed); false when there is none.
bool regular_size(const std::string& path, uint64_t* size) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  *size = uint64_t(st.st_size);
  return true;
}

// After hashing: every target still has the size that was hashed.
bool sizes_unchanged(const std::vector<HashTarget>& targets, std::string* err) {
  for (const HashTarget& t : targets) {
    uint64_t now = 0;
    if (!regular_size(t.path, &now) || now != t.size) {
      *err = t.path + " changed while it was being hashed (" + std::to_string(t.size) +
             " bytes before, " + std::to_string(now) + " after)";
      return false;
    }
  }
  return true;
}

bool hash_targets(const std::vector<HashTarget>& targets, const ProgressSink& progress,
                  const char* phase, std::vector<ChunkedDigest>* out, std::string* err,
                  const std::function<bool()>& cancelled = {}, unsigned threads = 0) {
  uint64_t total = 0;
  for (const HashTarget& t : targets) total += t.size;
  HashOptions opts;
  opts.cancelled = cancelled;
  opts.threads = threads;
  if (progress) opts.progress = [&](uint64_t done) { progress(Progress{phase, done, total}); };
  return sha256_chunked_files(targets, opts, out, err) && sizes_unchanged(targets, err);
}

/// The shared memory that each shim process's records say it created and
/// exported, whose bytes the restore's rebuild reads by name
/// (shared_memory_files.cpp): saved in parts from 0 on (manifest_from_json
/// checked their names), holding its size. The files were verified first.
bool shared_memory_saved(const std::string& dir, const Manifest& m, std::string* err) {
  std::map<std::string, uint64_t> sizes;
  for (const ManifestFile& f : m.files) sizes[f.path] = f.size;
  for (const pid_t pid : m.shim_processes) {
    proto::ShimRecords r;
    if (!read_shim_records(dir, pid, &r, err)) return false;
    const std::string path = dir + "/" + shim_records_file(pid);
    for (const proto::AllocationRecord& a : r.allocations) {
      if (!is_shared_creation(a)) continue;
      uint64_t held = 0;
      for (uint32_t k = 0; k < proto::kMaxParts; ++k) {
        const auto part = sizes.find(shared_memory_file(pid, a.id, k));
        if (part == sizes.end()) break;
        held = part->second > ~held ? ~uint64_t(0) : held + part->second;
      }
      if (held != a.size) {
        *err = path + ": allocation " + std::to_string(a.id) + " of process " +
               std::to_string(pid) + " is " + std::to_string(a.size) +
               " bytes, its saved parts (shared/" + std::to_string(pid) + "-" +
               std::to_string(a.id) + ".*.bin) hold " + std::to_string(held) +
               ": the checkpoint is incomplete";
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool hash_directory(const std::string& dir, std::vector<ManifestFile>* out,
                    const ProgressSink& progress, std::string* err, uint64_t chunk_size,
                    const std::function<bool()>& cancelled, unsigned threads) {
  std::vector<std::string> names;
  if (!list_files(dir, &names, err)) return false;
  std::vector<HashTarget> targets;
  for (const std::string& n : names) {
    HashTarget t{dir + "/" + n, 0, chunk_size};
    if (!regular_size(t.path, &t.size)) {
      *err = t.path + " disappeared or changed type while the checkpoint was being listed";
      return false;
    }
    targets.push_back(t);
  }
  std::vector<ChunkedDigest> digests;
  if (!hash_targets(targets, progress, "checksum", &digests, err, cancelled, threads)) return false;
  out->clear();
  for (size_t i = 0; i < names.size(); ++i) {
    ManifestFile f;
    f.path = names[i];
    f.size = targets[i].size;
    f.chunk_size = chunk_size;
    f.sha256 = to_hex(digests[i].root);
    for (const Sha256Digest& d : digests[i].chunks) f.chunks.push_back(to_hex(d));
    out->push_back(std::move(f));
  }
  return true;
}

bool flush_to_disk(const std::string& dir, const std::vector<ManifestFile>& files,
                   std::string* err) {
  auto failed = [&](const std::string& what) {
    *err = what + ": " + std::strerror(errno);
    return false;
  };
  {
    const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dfd) return failed("cannot open " + dir);
    if (::syncfs(dfd.get()) != 0) return failed("cannot write " + dir + " to disk (syncfs)");
  }
  // Each file and each directory holding one, so that a write-back error
  // names its file (one not seen yet is reported to a new descriptor's fsync).
  std::set<std::string> dirs{dir};
  for (const ManifestFile& f : files) {
    const std::string path = dir + "/" + f.path;
    const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return failed("cannot open " + path);
    if (::fsync(fd.get()) != 0) return failed("cannot write " + path + " to disk");
    for (size_t slash = f.path.find('/'); slash != std::string::npos;
         slash = f.path.find('/', slash + 1))
      dirs.insert(dir + "/" + f.path.substr(0, slash));
  }
  for (const std::string& d : dirs) {
    const UniqueFd fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return failed("cannot open " + d);
    if (::fsync(fd.get()) != 0) return failed("cannot write the directory " + d + " to disk");
  }
  return true;
}

std::string not_private(const std::string& path, uid_t owner) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0)
    return "cannot stat it: " + std::string(std::strerror(errno));
  if (st.st_uid != owner)
    return "it is owned by uid " + std::to_string(st.st_uid) + ", not by uid " +
           std::to_string(owner) + (owner == 0 ? " (root)" : " (this command's user)");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !S_ISLNK(st.st_mode)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    return std::string("other users may write to it (mode ") + mode + ")";
  }
  return "";
}

std::string path_not_held(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') return dir + ": not an absolute path";
  // From the parent of dir up to /: each is root's, and no one else may
  // rename what it holds (no group or other write bit, or the sticky bit,
  // under which only root renames the root-owned entry below it).
  for (std::string d = dir; d.size() > 1;) {
    const size_t slash = d.rfind('/');
    d = slash == 0 ? "/" : d.substr(0, slash);
    struct stat st;
    if (::lstat(d.c_str(), &st) != 0) return d + ": cannot stat it: " + std::strerror(errno);
    if (st.st_uid != 0 || ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !(st.st_mode & S_ISVTX))) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
      return d + ", a directory above it, " +
             (st.st_uid != 0 ? "is owned by uid " + std::to_string(st.st_uid)
                             : std::string("may be written by other users (mode ") + mode + ")") +
             ": whoever may change it could put another checkpoint in this one's place "
             "between the verification and CRIU's reading";
    }
  }
  return "";
}

std::string not_held_refusal(const std::string& dir, const std::string& why, bool writing) {
  return dir + ": " + why +
         ". A checkpoint's files decide which processes a restore runs, as which user, so "
         "cusnap restores (as root) only a checkpoint that no one but root can change or "
         "replace" +
         (writing ? std::string(", and writes one only below directories only root may change: "
                                "give -o a path under such a directory (such as /var/lib/cusnap, "
                                "or a directory of root's under /tmp)")
                  : std::string(": copy it as root into a directory whose parents only root may "
                                "change (such as /var/lib or a directory of root's under /tmp), "
                                "then restore it from there"));
}

bool checkpoint_dir_private(const std::string& given, std::string* err) {
  // The directory itself, not a link to it, and the path to it (a restore
  // reads its files by path).
  char real[PATH_MAX];
  if (::realpath(given.c_str(), real) == nullptr) {
    *err = "cannot resolve " + given + ": " + std::strerror(errno);
    return false;
  }
  const std::string dir = real;
  auto refuse = [&](const std::string& path, const std::string& why) {
    *err = path + ": " + why +
           ". A checkpoint's files decide which processes a restore runs, as which user, so "
           "cusnap restores (as root) only a checkpoint owned by root and writable by no one "
           "else; if you trust this one, chown -R 0 " +
           dir + " and chmod -R go-w " + dir + " (or copy it as root), then restore again";
    return false;
  };
  if (std::string why = path_not_held(dir); !why.empty()) {
    *err = not_held_refusal(dir, why, false);
    return false;
  }
  if (std::string why = not_private(dir, 0); !why.empty()) return refuse(dir, why);
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const std::string path = it->path().string();
    if (std::string why = not_private(path, 0); !why.empty()) return refuse(path, why);
  }
  if (ec) {
    *err = "cannot list " + dir + ": " + ec.message() + descriptor_remedy(ec.value());
    return false;
  }
  return true;
}

bool verify_manifest_files(const std::string& dir, const Manifest& m, const ProgressSink& progress,
                           std::string* err, const std::function<bool()>& cancelled) {
  std::vector<std::string> present;
  if (!list_files(dir, &present, err)) return false;
  std::set<std::string> listed;
  for (const ManifestFile& f : m.files) listed.insert(f.path);
  for (const std::string& p : present)
    if (!listed.count(p) && p != kCriuRestoreStats) {
      *err = dir + "/" + p + " is not listed in the manifest: the checkpoint was altered";
      return false;
    }
  std::vector<HashTarget> targets;
  for (const ManifestFile& f : m.files) {
    HashTarget t{dir + "/" + f.path, 0, f.chunk_size};
    if (!regular_size(t.path, &t.size)) {
      *err = t.path + " is missing: the checkpoint is incomplete";
      return false;
    }
    if (t.size != f.size) {
      *err = t.path + " has " + std::to_string(t.size) + " bytes, the manifest says " +
             std::to_string(f.size) + ": the checkpoint is truncated or corrupted";
      return false;
    }
    targets.push_back(t);
  }
  std::vector<ChunkedDigest> actual;
  // Asked once before the hashing too (which asks only every 200 ms).
  if (cancelled && cancelled()) {
    *err = "cancelled";
    return false;
  }
  if (!hash_targets(targets, progress, "verify", &actual, err, cancelled)) return false;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    if (f.chunks.size() != actual[i].chunks.size()) {
      *err = targets[i].path + ": the manifest lists " + std::to_string(f.chunks.size()) +
             " chunk digests for " + std::to_string(actual[i].chunks.size()) +
             " chunks: the manifest was altered";
      return false;
    }
    size_t bad = 0, first = 0;
    for (size_t c = 0; c < actual[i].chunks.size(); ++c)
      if (to_hex(actual[i].chunks[c]) != f.chunks[c] && bad++ == 0) first = c;
    if (bad > 0) {
      uint64_t from = first * f.chunk_size;
      uint64_t to = std::min(from + f.chunk_size, f.size) - 1;
      *err = targets[i].path + ": bytes " + std::to_string(from) + " to " + std::to_string(to) +
             " (chunk " + std::to_string(first + 1) + " of " +
             std::to_string(actual[i].chunks.size()) + ")" +
             (bad > 1 ? " and " + std::to_string(bad - 1) + " more chunks" : std::string()) +
             " do not match their SHA-256 in the manifest: the checkpoint is corrupted";
      return false;
    }
    if (to_hex(actual[i].root) != f.sha256) {
      *err = targets[i].path +
             " does not match its SHA-256 in the manifest, whose chunk digests it matches: the "
             "manifest was altered";
      return false;
    }
  }
  return shared_memory_saved(dir, m, err);
}

}  // namespace cusnap
