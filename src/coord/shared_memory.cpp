// SharedMemory (shared_memory.h): finding the processes that share device
// memory, the cut, the quiesce, the release and the gates. What is saved to
// disk and rebuilt from it is in shared_memory_files.cpp.
#include "coord/shared_memory.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>

#include "coord/driver.h"
#include "coord/procs.h"
#include "proto/control.h"

namespace cusnap {
namespace {

/// Whether process pid has the shim loaded with tracking on (it started
/// under cusnap and CUSNAP_SHIM_TRACK is not 0 in its environment).
bool tracking_shim_loaded(pid_t pid) {
  std::string maps, env;
  const std::string proc = "/proc/" + std::to_string(pid);
  if (!read_text_file(proc + "/maps", &maps) || maps.find("libcusnap_shim") == std::string::npos)
    return false;
  if (!read_text_file(proc + "/environ", &env)) return false;
  bool runtime = false;
  for (size_t p = 0; p < env.size();) {
    size_t e = env.find('\0', p);
    if (e == std::string::npos) e = env.size();
    std::string_view kv(env.data() + p, e - p);
    if (kv.rfind("CUSNAP_RUNTIME_DIR=", 0) == 0 && kv.size() > 19) runtime = true;
    if (kv == "CUSNAP_SHIM_TRACK=0") return false;
    p = e + 1;
  }
  return runtime;
}

}  // namespace

bool is_shared_creation(const proto::AllocationRecord& a) {
  return a.origin == "created" && a.exported;
}

bool records_share(const proto::ShimRecords& r) {
  return !r.multicast.empty() || r.foreign_imports_alive > 0 ||
         std::any_of(r.allocations.begin(), r.allocations.end(),
                     [](const proto::AllocationRecord& a) {
                       return is_shared_creation(a) || a.origin != "created";
                     });
}

std::vector<pid_t> SharedMemory::processes() const {
  std::vector<pid_t> out;
  for (auto& p : procs_) out.push_back(p->pid);
  return out;
}

uint64_t SharedMemory::shared_bytes() const {
  uint64_t n = 0;
  for (auto& p : procs_)
    for (auto& a : p->records.allocations)
      if (is_shared_creation(a)) n = a.size > UINT64_MAX - n ? UINT64_MAX : n + a.size;
  return n;
}

std::chrono::milliseconds SharedMemory::bulk_timeout(uint64_t bytes) const {
  // The phase bound plus the bytes at 0.5 GB/s, so a large copy is never cut
  // short while a stuck one still ends; kMaxRecordBytes (the most a record
  // may name) takes some 6.5 days, which keeps deadlines far from overflow.
  const uint64_t capped = bytes < proto::kMaxRecordBytes ? bytes : proto::kMaxRecordBytes;
  return t_.phase + std::chrono::milliseconds(capped / 500000);
}

bool SharedMemory::inspect(const std::string& shim_dir, const std::vector<pid_t>& cuda,
                           SharedTimeouts t, std::string* err) {
  t_ = t;
  shim_dir_ = shim_dir;
  procs_.clear();
  active_ = false;
  for (pid_t pid : cuda) {
    std::string path = proto::shim_control_socket(shim_dir, pid);
    struct stat st {};
    if (shim_dir.empty() || ::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      // No tracking shim here, or one whose socket is gone: the latter may
      // share memory nobody can see, so the job is not checkpointable.
      if (tracking_shim_loaded(pid)) {
        *err = "process " + std::to_string(pid) +
               " runs the cusnap shim with tracking on, but its control socket " + path +
               " is gone (the job's runtime directory was changed or removed?): its shared "
               "memory cannot be saved or checked, so the job is not checkpointable";
        return false;
      }
      continue;
    }
    auto p = std::make_unique<Proc>();
    p->pid = pid;
    if (!p->client.connect(path, pid, t.control, err)) return false;
    if (!p->client.inspect(&p->records, err)) return false;
    procs_.push_back(std::move(p));
  }
  return check_records(err);
}

std::string SharedMemory::driver_blocks_note() const {
  std::string out;
  for (auto& p : procs_) {
    const auto& r = p->records;
    if (r.driver_ipc_exports == 0) continue;
    out += (out.empty() ? "" : "; ") + std::string("process ") + std::to_string(p->pid) +
           " handed out " + std::to_string(r.driver_ipc_exports) +
           " IPC handle(s) of cuMemAlloc blocks its shim left to the driver" +
           (r.driver_block_why.empty() ? std::string() : " (" + r.driver_block_why + ")");
  }
  if (out.empty()) return out;
  return ". Likely where they came from: " + out +
         ". The shim serves cuMemAlloc with shareable memory, rounded up to the GPU's "
         "granularity (2 MiB on current GPUs), and leaves a block to the driver when that "
         "fails: error 2 (CUDA_ERROR_OUT_OF_MEMORY) is a GPU nearly full, where more free GPU "
         "memory helps; 801 (CUDA_ERROR_NOT_SUPPORTED) a GPU or driver without POSIX "
         "descriptor handles (CUSNAP_SHIM_DEBUG=1 logs each block left to the driver)";
}

bool SharedMemory::check_records(std::string* err) {
  // Creations by (pid, start, id), and the checks that refuse.
  std::set<std::tuple<int64_t, uint64_t, uint64_t>> created;
  for (auto& p : procs_)
    for (auto& a : p->records.allocations)
      if (is_shared_creation(a)) created.emplace(p->records.pid, p->records.start_time, a.id);
  for (auto& p : procs_) {
    const auto& r = p->records;
    const std::string who = "process " + std::to_string(p->pid);
    if (r.foreign_imports_alive > 0) {
      *err = who + " holds " + std::to_string(r.foreign_imports_alive) +
             " imported allocation(s) or IPC mapping(s) that did not come from a cusnap shim "
             "(a descriptor or IPC handle from outside the job, or from a process running "
             "without the shim); their memory cannot be saved or rebuilt, so the checkpoint is "
             "refused while they are alive" +
             driver_blocks_note();
      return false;
    }
    // Multicast objects are torn down with the created memory and rebuilt
    // after it (an object imported from another process came as a foreign
    // descriptor and was refused above).
    if (records_share(r)) active_ = true;
    for (auto& a : r.allocations) {
      if (a.origin != "imported") continue;
      if (!created.count({a.creator_pid, a.creator_start, a.creator_id})) {
        *err = who + " imported allocation " + std::to_string(a.creator_id) + " of process " +
               std::to_string(a.creator_pid) +
               ", which is not a process of this job with a cusnap shim (or no longer exports "
               "it); the shared memory cannot be rebuilt, so the checkpoint is refused";
        return false;
      }
    }
  }
  return true;
}

bool SharedMemory::collective_devices(std::map<pid_t, std::vector<std::string>>* out,
                                      std::string* err) {
  out->clear();
  for (auto& p : procs_) {
    proto::CutState st;
    std::string why;
    if (!p->client.cut("status", 0, &st, &why)) {
      *err = "cut phase: " + why;
      return false;
    }
    if (st.launched == 0 && st.reserved == 0) continue;
    CUuuid u;
    for (const std::string& d : st.devices)
      if (!parse_gpu_uuid(d, &u) || st.devices.size() > proto::kMaxCutDevices) {
        *err = "cut phase: the shim of process " + std::to_string(p->pid) +
               " named an invalid GPU '" + d.substr(0, 64) + "': the shim and cusnap differ";
        return false;
      }
    (*out)[p->pid] = st.devices;
  }
  return true;
}

uint64_t SharedMemory::cut_hold_ms() const {
  // The cut's own wait, the quiesce's tries while a capture goes on (each
  // bounded by the operation's timeout), the gate closes and drains of the
  // last try, one process after another (each up to a phase), and the
  // exchanges around them.
  const uint64_t n = procs_.size();
  return static_cast<uint64_t>(t_.phase.count()) * (2 + 2 * n) +
         static_cast<uint64_t>(t_.control.count()) * (4 + 2 * n);
}

bool SharedMemory::cut(std::string* err) {
  cut_counts_.clear();
  std::map<pid_t, uint64_t> counts;
  uint64_t target = 0;
  auto fail = [&](const std::string& why) {
    *err = "cut phase: " + why;
    cut_release(err);  // a process it could not tell is named: its launches stay held
    return false;
  };
  cut_armed_ = true;  // from the first arm on: every failure lets the cut go everywhere
  for (auto& p : procs_) {
    proto::CutState st;
    std::string why;
    if (!p->client.cut("arm", 0, &st, &why, cut_hold_ms())) return fail(why);
    // A process holding at a collective launch is a rank, even at count 0.
    if (st.reserved > 0 || st.held > 0) counts[p->pid] = st.reserved;
    target = std::max(target, st.reserved);
  }
  if (target == 0) {  // no collective launched: nothing to line up
    cut_release();
    return true;
  }
  for (auto& p : procs_) {
    if (!counts.count(p->pid)) continue;
    proto::CutState st;
    std::string why;
    if (!p->client.cut("target", target, &st, &why)) return fail(why);
  }
  const auto deadline = std::chrono::steady_clock::now() + t_.phase;
  for (;;) {
    bool all = true;
    std::string behind;
    for (auto& p : procs_) {
      proto::CutState st;
      std::string why;
      if (!p->client.cut("status", 0, &st, &why)) return fail(why);
      if (!counts.count(p->pid)) {
        // A process that launched no collective at the arm and now holds at
        // its first one is a rank that had not reached it yet: its peers'
        // collectives wait for it, so it must reach the target too.
        if (st.reserved == 0 && st.held == 0) continue;
        if (!p->client.cut("target", target, &st, &why)) return fail(why);
      }
      counts[p->pid] = st.launched;
      // Every count must end at the target exactly: a process past it (its
      // shim dropped the cut, or was armed by someone else since) has
      // launched a collective its peers have not, which would be left half
      // issued.
      if (st.reserved > target || st.launched > target)
        return fail("process " + std::to_string(p->pid) + " made " +
                    std::to_string(std::max(st.reserved, st.launched)) +
                    " collective launches, past the cut at " + std::to_string(target) +
                    " (its shim let its held launches go); nothing was changed, try again");
      if (st.launched < target) {
        all = false;
        behind += (behind.empty() ? "" : ", ") + std::string("process ") + std::to_string(p->pid) +
                  " at " + std::to_string(st.launched);
      }
    }
    if (all) break;
    if (std::chrono::steady_clock::now() >= deadline)
      return fail("the job's processes did not reach a common count of collective launches (" +
                  std::to_string(target) + ") within " + std::to_string(t_.phase.count()) +
                  " ms: " + behind +
                  " (a rank waits on something outside the driver, or the ranks do not launch "
                  "the same sequence of collectives); nothing was changed, try again or raise "
                  "--timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cut_counts_ = counts;
  active_ = true;
  return true;
}

bool SharedMemory::connect_again(Proc& p, std::string* why) {
  return p.client.connected() ||
         p.client.connect(proto::shim_control_socket(shim_dir_, p.pid), p.pid, t_.control, why);
}

bool SharedMemory::cut_release(std::string* err) {
  // Every live process, connected again where an exchange that timed out
  // dropped the connection; tried kReopenAttempts times, as a shim still busy
  // with the request that failed takes the next connection once it is done.
  std::set<pid_t> left;
  for (auto& p : procs_) left.insert(p->pid);
  std::string why;
  for (int attempt = 0; attempt < kReopenAttempts && !left.empty(); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100) * attempt);
    why.clear();
    for (auto& p : procs_) {
      if (!left.count(p->pid)) continue;
      proto::CutState st;
      std::string w;
      if (!process_runs(p->pid) ||
          (connect_again(*p, &w) && p->client.cut("release", 0, &st, &w))) {
        left.erase(p->pid);
        continue;
      }
      why += (why.empty() ? "" : "; ") + w;
    }
  }
  if (left.empty()) {
    cut_armed_ = false;
    return true;
  }
  if (err) {
    std::string who;
    for (pid_t pid : left) who += (who.empty() ? "" : ", ") + std::to_string(pid);
    *err += "; then letting the cut go failed (" + why +
            "), so the collective launches of process" + (left.size() == 1 ? " " : "es ") + who +
            " stay held until its shim drops the cut by itself: after the longer of "
            "$CUSNAP_CUT_HOLD_MS and the hold this operation asked for (" +
            std::to_string(std::min<uint64_t>(cut_hold_ms(), proto::kMaxCutHoldMs) / 1000) + " s)";
  }
  return false;
}

bool SharedMemory::reopen_gates(bool keep_cut, std::string* err) {
  std::string why;
  for (int attempt = 0;; ++attempt) {
    why.clear();
    if (open_gates(&why, keep_cut)) return true;
    if (attempt + 1 >= kReopenAttempts) break;
    // A shim busy with the request that failed (its control listener serves
    // one connection at a time) takes the next one once it is done.
    std::this_thread::sleep_for(std::chrono::milliseconds(100) * (attempt + 1));
  }
  const std::vector<pid_t> closed = gates_left_closed();
  if (closed.empty()) return true;  // the processes still closed have exited meanwhile
  std::string who;
  for (pid_t pid : closed) who += (who.empty() ? "" : ", ") + std::to_string(pid);
  *err += "; then opening the gates again failed " + std::to_string(kReopenAttempts) + " times (" +
          why + "), so the gate of process" + (closed.size() == 1 ? " " : "es ") + who +
          " may still be closed (its CUDA calls wait until it opens): the job does not run on "
          "unchanged";
  return false;
}

std::vector<pid_t> SharedMemory::gates_left_closed() const {
  std::vector<pid_t> out;
  for (auto& p : procs_)
    if (p->gate_closed && process_runs(p->pid)) out.push_back(p->pid);
  return out;
}

bool SharedMemory::quiesce(std::string* err) {
  // On failure the gates open again; keep_cut: the cut's held launches stay.
  // A gate that does not open is said in *err (gates_left_closed()).
  // Without keep_cut the cut is let go in every process, also in those whose
  // gate this quiesce never closed (a gate that failed to close leaves the
  // processes after it open but held at the cut).
  auto reopen = [&](bool keep_cut) {
    reopen_gates(keep_cut, err);
    if (!keep_cut && cut_armed_) cut_release(err);
    return false;
  };
  const uint64_t wait_ms = static_cast<uint64_t>(t_.phase.count());
  for (auto& p : procs_) {
    if (!p->client.gate_close(wait_ms, err)) {
      if (!cut_counts_.empty()) {
        *err += " (after the collective cut at";
        for (auto [pid, n] : cut_counts_)
          *err += " process " + std::to_string(pid) + ": " + std::to_string(n);
        *err += ")";
      }
      return reopen(false);
    }
    p->gate_closed = true;
  }
  // The ranks must still stand at the cut: a collective launched past it
  // would be left half issued (and its drain would wait for ever).
  for (auto& p : procs_) {
    auto at = cut_counts_.find(p->pid);
    if (at == cut_counts_.end()) continue;
    proto::CutState st;
    std::string why;
    bool ok = p->client.cut("status", 0, &st, &why);
    // Counts are per GPU: reserved is the most on one GPU, launched the
    // fewest on a GPU in use. Past the cut on one GPU, or a first collective
    // on a GPU that had none (a target above it lets it through, and its
    // peers hold): either way not at the cut.
    if (ok && (st.reserved != at->second || st.launched != at->second)) {
      ok = false;
      why = "process " + std::to_string(p->pid) + " is not at the cut's " +
            std::to_string(at->second) + " collective launches (the most on one of its GPUs " +
            std::to_string(st.reserved) + ", the fewest " + std::to_string(st.launched) +
            ": its shim let a held launch go, or it launched its first collective on a GPU, or "
            "its first there in a long while, after the cut); nothing was changed, try again";
    }
    if (!ok) {
      *err = "quiesce phase: " + why;
      return reopen(false);
    }
  }
  for (auto& p : procs_) {
    bool capturing = false;
    if (!p->client.drain(t_.phase, err, &capturing)) {
      *err = "quiesce phase: " + *err;
      if (!capturing && !cut_counts_.empty()) {
        std::string none;
        for (auto& q : procs_)
          if (!cut_counts_.count(q->pid))
            none += (none.empty() ? "" : ", ") + std::to_string(q->pid);
        if (!none.empty())
          *err += " (process " + none +
                  " had launched no collective at the cut and was left out of it: a rank that "
                  "has not reached its first collective yet keeps its peers' collectives "
                  "waiting; try again once every rank launched one)";
        else
          *err +=
              " (if a process drives several GPUs, one of them may not have launched its "
              "first collective at the cut, which keeps the others' collectives waiting: "
              "try again once the job has made a step)";
      }
      // A capture must be let go on, but the ranks stay lined up at the cut:
      // once the capture has ended, the thread holds at its next collective.
      if (capturing) ++capture_retries_;
      return reopen(capturing && !cut_counts_.empty());
    }
  }
  // What the shims track stands still only now: the job ran on between
  // inspect and the gates' closing (and between tries while a capture went
  // on), allocating, mapping and freeing. What is saved, released and
  // verified after the rebuild must be what stands at the cut.
  for (auto& p : procs_) {
    if (!p->client.inspect(&p->records, err)) {
      *err = "quiesce phase: " + *err;
      return reopen(false);
    }
  }
  if (!check_records(err)) return reopen(false);
  return true;
}

bool SharedMemory::release(std::string* err) {
  for (const char* origin : {"imported", "created"})
    for (auto& p : procs_)
      if (!p->client.release(origin, t_.phase, err)) {
        if (!process_runs(p->pid))
          *err = "process " + std::to_string(p->pid) + " died during the checkpoint (" + *err + ")";
        *err = std::string("release phase (") + origin + " memory): " + *err;
        return false;
      }
  return true;
}

void SharedMemory::disconnect() {
  for (auto& p : procs_) p->client.disconnect();
}

bool SharedMemory::unshared_since_inspect(std::string* err) {
  bool ok = true;
  for (auto& p : procs_) {
    if (!process_runs(p->pid)) continue;  // an exit fails the driver phase, not this check
    proto::ShimRecords now;
    std::string why;
    if ((!p->client.connected() &&
         !p->client.connect(proto::shim_control_socket(shim_dir_, p->pid), p->pid, t_.control,
                            &why)) ||
        !p->client.inspect(&now, &why)) {
      ok = false;
      why = "its shim did not answer a second look, so it may share device memory: " + why;
    } else if (now.sharing_calls != p->records.sharing_calls || records_share(now)) {
      ok = false;
      why = "it began to share device memory (" +
            std::to_string(now.sharing_calls - p->records.sharing_calls) +
            " export or import call(s)) after the job was inspected with none shared";
    }
    if (!ok) {
      *err = "process " + std::to_string(p->pid) + ": " + why;
      break;
    }
  }
  disconnect();
  return ok;
}

bool SharedMemory::reconnect(const std::string& shim_dir, SharedTimeouts t, std::string* err) {
  t_ = t;
  shim_dir_ = shim_dir;
  for (auto& p : procs_) {
    if (p->client.connected() || !process_runs(p->pid)) continue;  // the dead are left out
    if (!p->client.connect(proto::shim_control_socket(shim_dir, p->pid), p->pid, t.control, err))
      return false;
  }
  return true;
}

bool SharedMemory::open_gates(std::string* err, bool keep_cut) {
  bool ok = true;
  for (auto& p : procs_) {
    if (!p->gate_closed || !process_runs(p->pid)) continue;
    std::string why;
    if (connect_again(*p, &why) && p->client.gate_open(&why, keep_cut)) {
      p->gate_closed = false;
      continue;
    }
    ok = false;
    if (why.empty()) why = "process " + std::to_string(p->pid) + ": not connected";
    *err += (err->empty() ? "" : "; ") + why;
  }
  return ok;
}

}  // namespace cusnap
