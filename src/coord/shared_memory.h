// The coordinator's phases for device memory shared between the job's
// processes (DESIGN.md §4; docs/design.md "Shared memory"): through each
// process's shim it closes the gates and drains device work, saves the bytes
// of every shared allocation once (on its creator), releases shared memory
// (importers first, then creators), and after the driver's restore creates
// it again (creators load their bytes, importers import them), maps it at the
// recorded addresses, checks that every shim's records equal the captured
// ones, and only then opens the gates.
//
// Files in the state directory (the checkpoint directory, or the job's
// runtime directory while suspended): shim/<pid>.records (ShimRecords,
// MessagePack) and shared/<pid>-<allocation>.<k>.bin, the bytes in parts
// (part k holds bytes [k * per, (k + 1) * per), per being the size divided by
// the number of parts rounded up to 2 MiB; one part per 256 MiB, at most
// $CUSNAP_SAVE_PARTS, default 8), so that they are written in parallel.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coord/engine.h"
#include "coord/shim_client.h"
#include "proto/shim_messages.h"

namespace cusnap {

/// Timeouts of the shared-memory phases.
struct SharedTimeouts {
  std::chrono::milliseconds control{10000};  ///< one control exchange
  std::chrono::milliseconds phase{60000};    ///< gate close and drain, release, reimport
};

class SharedMemory {
 public:
  /// Connects to the shims of the given CUDA processes (those with a control
  /// socket under shim_dir) and inspects them. Refuses (false, *err says
  /// why and which process) while a foreign import is alive or an import
  /// names an allocation no shim of the job created. Changes nothing.
  bool inspect(const std::string& shim_dir, const std::vector<pid_t>& cuda, SharedTimeouts t,
               std::string* err);
  /// Whether memory is shared between processes through the shims: when
  /// false the other phases have nothing to do.
  bool active() const { return active_; }
  /// Processes with a shim that take part (after inspect or load_records).
  std::vector<pid_t> processes() const;
  /// Bytes of the allocations to save.
  uint64_t shared_bytes() const;

  /// The cut across collective ranks (docs/design.md "Cut across collective
  /// ranks"): when a process has launched collective kernels, holds every
  /// process's next collective launch at one common count (the largest) and
  /// waits until each reached it exactly, so that no collective is half
  /// issued when the gates close; a process past the target (its shim let
  /// its launches go) fails the cut. Such a job takes part in the later
  /// phases even when it shares no memory (active() becomes true). On failure
  /// lets every launch go again: nothing changed. A process at count 0 takes
  /// part once it holds at a collective launch (a rank that had not reached
  /// its first one); one that never does is left out of the count. The arm
  /// asks every shim to hold for cut_hold_ms() at least.
  bool cut(std::string* err);
  /// The GPUs each process launched its collectives on (from its shim, without
  /// arming the cut; processes with none are left out). Changes nothing.
  bool collective_devices(std::map<pid_t, std::vector<std::string>>* out, std::string* err);
  /// Collective launches per process at the cut (empty when there was none).
  const std::map<pid_t, uint64_t>& cut_counts() const { return cut_counts_; }
  /// Lets held collective launches go in every live process (the gates'
  /// opening does it too), connecting again to a shim whose connection an
  /// exchange that timed out dropped; tried kReopenAttempts times. false when
  /// a shim could not be told: *err (when given) gets a note naming it (its
  /// launches stay held until the shim drops the cut by itself).
  bool cut_release(std::string* err = nullptr);
  /// Whether a cut armed is not let go everywhere yet (after a failed cut:
  /// a process that could not be told still holds its collective launches).
  bool cut_left_armed() const { return cut_armed_; }

  /// Closes every gate and drains device work, then reads every shim's
  /// records again (what it tracks changed while the job ran on since
  /// inspect) and checks them as inspect does. On failure opens the gates
  /// again (kReopenAttempts tries) and lets the cut go in every process,
  /// whether its gate was closed or not (cut_release): nothing changed. When a gate still does
  /// not open (its shim does not answer, e.g. still busy with a drain that
  /// timed out), *err says which processes' gates may still be closed and
  /// gates_left_closed() names them: the job did not run on unchanged. A
  /// failure that counted a capture retry (a drain refused because a
  /// process's stream capture was under way, which may end once the gates
  /// are open) keeps a cut armed (its held launches stay held), so quiesce
  /// may be called again; cut_release() lets them go when giving up.
  bool quiesce(std::string* err);
  /// The live processes whose gate this object closed and could not open
  /// again (after a failed quiesce, or open_gates); empty when every gate
  /// it closed is open.
  std::vector<pid_t> gates_left_closed() const;
  /// How many quiesces a stream capture under way made fail so far.
  int capture_retries() const { return capture_retries_; }
  /// Writes the records and every shared allocation's bytes into dir (made
  /// private). On failure removes what it wrote; the gates stay closed.
  bool save(const std::string& dir, const ProgressSink& progress, std::string* err);
  /// Releases shared memory: importers first, then creators.
  bool release(std::string* err);
  /// Ends the connections (before the driver checkpoint and CRIU dump).
  void disconnect();
  /// For a job that shared nothing at inspect, once the driver has locked
  /// its processes: asks every shim again and is true when none began a
  /// sharing call since (ShimRecords::sharing_calls) nor holds shared
  /// memory; else false, *err naming the process. Disconnects after.
  bool unshared_since_inspect(std::string* err);

  /// For a restore: reads the records saved in dir for the given processes.
  bool load_records(const std::string& dir, const std::vector<pid_t>& pids, std::string* err);
  /// Connects again to every shim that takes part.
  bool reconnect(const std::string& shim_dir, SharedTimeouts t, std::string* err);
  /// Creators load their bytes from dir, importers import again; then every
  /// shim's records must equal the captured ones.
  bool rebuild(const std::string& dir, const ProgressSink& progress, std::string* err);
  /// Opens every gate. Goes on past failures; *err lists them.
  bool open_gates(std::string* err, bool keep_cut = false);

 private:
  struct Proc {
    pid_t pid = 0;
    proto::ShimRecords records;
    ShimClient client;
    bool gate_closed = false;
  };
  /// How often a failed quiesce tries to open the gates again.
  static constexpr int kReopenAttempts = 3;
  std::chrono::milliseconds bulk_timeout(uint64_t bytes) const;
  /// open_gates, tried kReopenAttempts times; when gates stay closed, appends
  /// to *err which processes' gates may still be closed and returns false.
  bool reopen_gates(bool keep_cut, std::string* err);
  /// Connects again to p's shim when an exchange that failed dropped the
  /// connection.
  bool connect_again(Proc& p, std::string* why);
  /// How long the cut may still be needed once armed (proto::CutRequest
  /// hold_ms): the cut's wait and the quiesce's tries, each up to the phase
  /// timeout, the last try's gate close and drain of each process, one after
  /// another (each up to the phase), and the control exchanges around them.
  uint64_t cut_hold_ms() const;
  /// inspect's checks of every process's records; sets active_ when memory
  /// is shared.
  bool check_records(std::string* err);
  /// For a refusal of foreign imports: which processes handed out IPC
  /// handles of cuMemAlloc blocks their shims left to the driver (the
  /// likely source), and why; empty when none did.
  std::string driver_blocks_note() const;

  std::vector<std::unique_ptr<Proc>> procs_;
  int capture_retries_ = 0;
  SharedTimeouts t_;
  std::string shim_dir_;
  bool active_ = false;
  std::map<pid_t, uint64_t> cut_counts_;
  /// A cut was armed and not let go everywhere yet.
  bool cut_armed_ = false;
};

/// The processes whose records were saved in dir (shim/<pid>.records).
std::vector<pid_t> saved_shim_processes(const std::string& dir);

/// Reads the records a checkpoint or suspend saved in dir for process pid
/// (shim/<pid>.records) into *out, and checks them: a msgpack shim record of
/// this format, for this process, valid (proto::records_valid). False with
/// *err naming the file and what is wrong with it otherwise.
bool read_shim_records(const std::string& dir, pid_t pid, proto::ShimRecords* out,
                       std::string* err);

/// Whether a saved allocation needs saving and releasing on its creator:
/// created there and exported (through a ticket or a legacy IPC handle).
bool is_shared_creation(const proto::AllocationRecord& a);
/// Whether one process's records show device memory shared with others:
/// a shared creation, an import (through a shim or foreign) or multicast.
bool records_share(const proto::ShimRecords& r);

}  // namespace cusnap
