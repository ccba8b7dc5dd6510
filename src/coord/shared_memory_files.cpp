// SharedMemory's side on disk (shared_memory.h): the records and the
// bytes a checkpoint or suspend saves, loaded and rebuilt from on restore or
// resume. DIR/shim/PID.records: a process's shim records (msgpack);
// DIR/shared/PID-ID.K.bin: part K of allocation ID's bytes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include "coord/file_read.h"
#include "coord/manifest.h"
#include "coord/procs.h"
#include "coord/shared_memory.h"
#include "proto/control.h"
#include "proto/env_settings.h"
#include "proto/unique_fd.h"

namespace cusnap {
namespace fs = std::filesystem;

namespace {

std::string records_path(const std::string& dir, pid_t pid) {
  return dir + "/" + shim_records_file(pid);
}
/// Part k of an allocation's saved bytes.
std::string bytes_path(const std::string& dir, pid_t pid, uint64_t id, size_t k) {
  return dir + "/" + shared_memory_file(pid, id, uint32_t(k));
}

/// How many files an allocation's bytes are written to: one per 256 MiB up
/// to $CUSNAP_SAVE_PARTS (default 8, 1..64; launch and restore refuse
/// another value), so that the shim's workers
/// write in parallel (a file system serializes the writes to one file).
size_t save_parts(uint64_t size) {
  static_assert(proto::kSaveParts.hi <= proto::kMaxParts);
  static const size_t most = size_t(proto::env_number(proto::kSaveParts));
  size_t n = static_cast<size_t>((size + (256ull << 20) - 1) / (256ull << 20));
  return n < 1 ? 1 : n > most ? most : n;
}

std::string pack(const proto::ShimRecords& r) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, r);
  return std::string(buf.data(), buf.size());
}

bool write_file(const std::string& path, const std::string& data, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    *err = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = ::write(fd.get(), data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *err = "cannot write " + path + ": " + std::strerror(errno);
      return false;
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd.get()) != 0) {
    *err = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

std::vector<pid_t> saved_shim_processes(const std::string& dir) {
  std::vector<pid_t> out;
  for (const std::string& name : list_dir(dir + "/shim")) {
    if (name.size() > 8 && name.compare(name.size() - 8, 8, ".records") == 0)
      out.push_back(pid_t(std::atoi(name.c_str())));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool read_shim_records(const std::string& dir, pid_t pid, proto::ShimRecords* out,
                       std::string* err) {
  const std::string path = records_path(dir, pid);
  std::string data;
  if (!read_file_bounded(
          path, {.max_bytes = proto::kMaxMessageBytes, .no_follow = true, .kind = "shim records"},
          &data, err))
    return false;
  try {
    msgpack::object_handle oh = msgpack::unpack(data.data(), data.size());
    oh.get().convert(*out);
  } catch (const std::exception& e) {
    *err = path + " is not a shim record (" + e.what() + "): the checkpoint is corrupted";
    return false;
  }
  if (out->format != proto::kShimRecordsFormat || out->pid != pid) {
    *err = path + " holds records of format " + std::to_string(out->format) + " for process " +
           std::to_string(out->pid) + ", expected format " +
           std::to_string(proto::kShimRecordsFormat) + " for process " + std::to_string(pid) +
           ": the checkpoint is corrupted";
    return false;
  }
  if (std::string why; !proto::records_valid(*out, &why)) {
    *err = path + ": " + why + ": the checkpoint is corrupted";
    return false;
  }
  return true;
}

bool SharedMemory::save(const std::string& dir, const ProgressSink& progress, std::string* err) {
  std::error_code ec;
  for (const char* sub : {"/shim", "/shared"}) {
    // Only what this save writes: records left by an earlier operation (a
    // suspend's directory is reused) would name processes to the rebuild.
    fs::remove_all(dir + sub, ec);
    fs::create_directories(dir + sub, ec);
    if (!ec) fs::permissions(dir + sub, fs::perms::owner_all, ec);
    if (ec) {
      *err = "save phase: cannot create " + dir + sub + ": " + ec.message();
      return false;
    }
  }
  auto undo = [&] {
    fs::remove_all(dir + "/shim", ec);
    fs::remove_all(dir + "/shared", ec);
  };
  const uint64_t total = shared_bytes();
  uint64_t done = 0;
  if (progress) progress(Progress{"save", 0, total});
  for (auto& p : procs_) {
    try {
      if (!write_file(records_path(dir, p->pid), pack(p->records), err)) {
        *err = "save phase: " + *err;
        undo();
        return false;
      }
    } catch (const std::exception& e) {
      *err = std::string("save phase: ") + e.what();
      undo();
      return false;
    }
    for (auto& a : p->records.allocations) {
      if (!is_shared_creation(a)) continue;
      std::vector<UniqueFd> files;
      std::vector<int> fds;
      for (size_t k = 0; k < save_parts(a.size); ++k) {
        std::string path = bytes_path(dir, p->pid, a.id, k);
        // Read-write: the shim may map the file to copy into it directly.
        files.emplace_back(
            ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
        if (!files.back()) {
          *err = "save phase: cannot create " + path + ": " + std::strerror(errno);
          undo();
          return false;
        }
        fds.push_back(files.back().get());
      }
      uint64_t bytes = 0;
      if (!p->client.save(a.id, fds, bulk_timeout(a.size), &bytes, err)) {
        *err = "save phase: " + *err;
        undo();
        return false;
      }
      if (bytes != a.size) {
        *err = "save phase: process " + std::to_string(p->pid) + " saved " + std::to_string(bytes) +
               " bytes of allocation " + std::to_string(a.id) + ", not " + std::to_string(a.size);
        undo();
        return false;
      }
      done += bytes;
      if (progress) progress(Progress{"save", done, total});
    }
  }
  return true;
}

bool SharedMemory::load_records(const std::string& dir, const std::vector<pid_t>& pids,
                                std::string* err) {
  procs_.clear();
  for (pid_t pid : pids) {
    auto p = std::make_unique<Proc>();
    p->pid = pid;
    if (!read_shim_records(dir, pid, &p->records, err)) return false;
    // The restored shims' gates are closed as they were dumped.
    p->gate_closed = true;
    procs_.push_back(std::move(p));
  }
  active_ = !procs_.empty();
  return true;
}

bool SharedMemory::rebuild(const std::string& dir, const ProgressSink& progress, std::string* err) {
  const uint64_t total = shared_bytes();
  uint64_t done = 0;
  if (progress) progress(Progress{"rebuild", 0, total});
  for (auto& p : procs_)
    for (auto& a : p->records.allocations) {
      if (!is_shared_creation(a) || !p->client.connected()) continue;
      // The parts as saved (their count may differ from what save_parts says now).
      std::vector<UniqueFd> files;
      std::vector<int> fds;
      for (size_t k = 0; k < proto::kMaxParts; ++k) {
        std::string path = bytes_path(dir, p->pid, a.id, k);
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
        if (!fd && errno == ENOENT && k > 0) break;
        if (!fd) {
          *err = "rebuild phase: cannot open " + path + ": " + std::strerror(errno);
          return false;
        }
        fds.push_back(fd.get());
        files.push_back(std::move(fd));
      }
      if (!p->client.load(a.id, fds, bulk_timeout(a.size), err)) {
        *err = "rebuild phase (creators): " + *err;
        return false;
      }
      done += a.size;
      if (progress) progress(Progress{"rebuild", done, total});
    }
  // Importers import again; multicast groups are rebuilt in the same request.
  for (auto& p : procs_)
    if (p->client.connected() && !p->client.reimport(t_.phase, err)) {
      *err = "rebuild phase (importers, multicast): " + *err;
      return false;
    }
  // Verify: every shim's records equal those captured (but for the
  // generations, which the rebuild moves on), and every importer holds the
  // incarnation its creator made: the memory is shared again, not merely
  // mapped where it was.
  std::map<std::tuple<int64_t, uint64_t, uint64_t>, uint64_t> made;
  std::vector<std::pair<pid_t, proto::ShimRecords>> after;
  for (auto& p : procs_) {
    proto::ShimRecords now;
    if (!p->client.connected()) {  // a process that died meanwhile: nothing to verify
      after.emplace_back(p->pid, p->records);
      continue;
    }
    if (!p->client.inspect(&now, err)) {
      *err = "verify phase: " + *err;
      return false;
    }
    for (auto& a : now.allocations)
      if (a.origin == "created") made[{now.pid, now.start_time, a.id}] = a.generation;
    after.emplace_back(p->pid, now);
  }
  for (auto& [pid, now] : after)
    for (auto& a : now.allocations) {
      if (a.origin != "imported") continue;
      auto m = made.find({a.creator_pid, a.creator_start, a.creator_id});
      if (m != made.end() && m->second != a.generation) {
        *err = "verify phase: process " + std::to_string(pid) + " holds incarnation " +
               std::to_string(a.generation) + " of allocation " + std::to_string(a.creator_id) +
               " of process " + std::to_string(a.creator_pid) +
               ", whose creator made incarnation " + std::to_string(m->second) +
               ": the memory is not shared again";
        return false;
      }
    }
  for (size_t k = 0; k < procs_.size(); ++k) {
    auto& p = procs_[k];
    proto::ShimRecords now = after[k].second;
    proto::ShimRecords was = p->records;
    for (auto* r : {&now, &was})
      for (auto& a : r->allocations) a.generation = 0;
    if (pack(now) != pack(was)) {
      std::string what = "its records differ";
      if (now.allocations.size() != p->records.allocations.size())
        what = std::to_string(now.allocations.size()) + " allocations, captured " +
               std::to_string(p->records.allocations.size());
      else if (now.mappings.size() != p->records.mappings.size())
        what = std::to_string(now.mappings.size()) + " mappings, captured " +
               std::to_string(p->records.mappings.size());
      else
        for (size_t i = 0; i < now.mappings.size(); ++i)
          if (now.mappings[i].address != p->records.mappings[i].address) {
            what = "a mapping at " + hex(now.mappings[i].address) + ", captured at " +
                   hex(p->records.mappings[i].address);
            break;
          }
      *err = "verify phase: process " + std::to_string(p->pid) +
             ": after the rebuild the shim reports " + what;
      return false;
    }
  }
  return true;
}

}  // namespace cusnap
