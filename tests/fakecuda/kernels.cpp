// Asynchronous kernels: the handshake kernels of NCCL-like jobs (state.h).
//
// A function whose name starts with "ncclDevKernel_Handshake" takes
// (CUdeviceptr my_flag, CUdeviceptr peer_flag, uint64_t step): it stores step
// into the 8-byte *my_flag, then waits until the 8-byte *peer_flag >= step.
// step == 0 means "the next step": when the kernel starts (on the kernel
// thread, once the work it is ordered after has completed), step becomes
// *my_flag + 1, then it runs as above. This is how a graph (graphs.cpp)
// replays a collective: its arguments are fixed at capture, and NCCL keeps
// its step counters in device memory.
// Two processes that map one allocation therefore wait for each other like two
// ranks of a collective. The launch returns at once; the kernel runs on this
// process's kernel thread, which polls every runnable kernel in turn (so
// kernels of different streams run concurrently, as on a GPU) and resolves the
// flag addresses under Driver::mu at every poll: an address that is not mapped
// device memory (or mapped without the access needed) ends the kernel with
// CUDA_ERROR_ILLEGAL_ADDRESS, sticky on its stream.
//
// Ordering: a kernel waits for the pending work of its stream; legacy-stream
// work and blocking-stream work of one context wait for each other (the legacy
// NULL stream's implicit synchronization). Waiting entry points leave the
// checkpoint gate while they wait: a thread in cuStreamSynchronize does not
// keep cuCheckpointProcessLock from succeeding, and passes the gate again
// before it returns.
//
// After a restore (measured on the H200, docs/design.md "Ranks that share a
// GPU"): a restored context is no longer time-sliced with other processes'
// contexts on its GPU, so a collective that waits for a peer on the same GPU
// never sees it; the driver kills the kernel (Xid 109). Here: once this
// process was restored, a handshake kernel that has to wait for a peer flag in
// another process's allocation on its own flag's device fails with
// CUDA_ERROR_LAUNCH_FAILED (sticky on its stream) after
// $FAKECUDA_CTXSW_TIMEOUT_MS (default 300), even if the peer arrives meanwhile.
//
// Threads: one kernel thread per process, started by the first handshake
// launch. Fork: the child gets a fresh, empty queue and starts its own thread
// at its first launch (the parent's kernels are not the child's). CRIU: the
// thread is an ordinary thread of the process and is dumped and restored with
// it; the driver checkpoint waits until no kernel is pending, so none is in
// flight in a dump.
#include "gate.h"
#include "memory.h"
#include "state.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

namespace fc {

namespace {

struct Job {
  StreamKey key;
  HandshakeArgs args;
  std::vector<uint64_t> deps;  ///< jobs that must complete first
  bool stored = false;         ///< my_flag written
  bool starved = false;        ///< waits for a peer on its GPU after a restore
  std::chrono::steady_clock::time_point starved_at;
};

struct Queue {
  std::mutex mu;
  std::condition_variable work_cv;  ///< the kernel thread waits for jobs
  std::condition_variable done_cv;  ///< waiters wait for completions
  std::map<uint64_t, Job> pending;  ///< by sequence number
  std::map<StreamKeyId, CUresult> errors;
  std::map<const void*, std::vector<uint64_t>> event_deps;
  uint64_t next_seq = 1;
  bool started = false;
};

// Replaced (never freed) in a forked child: the parent's lock state and jobs
// are not the child's.
Queue* g_queue = new Queue;

Queue& queue() {
  return *g_queue;
}

bool same_key(const StreamKey& a, const StreamKey& b) {
  return a.ctx == b.ctx && a.kind == b.kind && a.id == b.id;
}

/// Whether work on `later` must wait for pending work on `earlier`.
bool orders_after(const StreamKey& later, const StreamKey& earlier) {
  if (same_key(later, earlier)) return true;
  if (later.ctx != earlier.ctx) return false;
  if (later.kind == StreamKind::kLegacy) return earlier.blocking;
  if (earlier.kind == StreamKind::kLegacy) return later.blocking;
  return false;
}

/// Pending jobs an operation on key waits for. Precondition: q.mu held.
std::vector<uint64_t> deps_for(Queue& q, const StreamKey& key) {
  std::vector<uint64_t> deps;
  for (auto& [seq, j] : q.pending)
    if (orders_after(key, j.key)) deps.push_back(seq);
  return deps;
}

bool any_pending(Queue& q, const std::vector<uint64_t>& seqs) {
  for (uint64_t s : seqs)
    if (q.pending.count(s)) return true;
  return false;
}

enum class Outcome { kWaiting, kStored, kDone };

/// The device of the allocation mapped at p, and whether another process
/// created it; false when p is not mapped. Precondition: Driver::mu held.
bool allocation_at(uintptr_t p, CUdevice* dev, bool* imported) {
  uintptr_t base = 0;
  const Mapping* m = find_mapping(p, &base);
  const Allocation* a = m ? find_alloc(m->alloc) : nullptr;
  if (!a) return false;
  *dev = a->dev;
  *imported = a->imported;
  return true;
}

/// Whether the kernel waits for a peer on its own GPU in a restored process
/// (see the top of this file). Precondition: Driver::mu held.
bool starved_by_restore(const HandshakeArgs& a) {
  if (!driver().restored) return false;
  CUdevice mine = -1, peer = -1;
  bool mine_imported = false, peer_imported = false;
  return allocation_at(a.my_flag, &mine, &mine_imported) &&
         allocation_at(a.peer_flag, &peer, &peer_imported) && peer_imported && mine == peer;
}

unsigned ctxsw_timeout_ms() {
  static const unsigned ms = [] {
    const char* e = std::getenv("FAKECUDA_CTXSW_TIMEOUT_MS");
    const long v = e && *e ? std::atol(e) : 0;
    return v > 0 ? static_cast<unsigned>(v) : 300u;
  }();
  return ms;
}

/// One poll of a job. Precondition: Driver::mu held, q.mu not held.
/// *starved: the job waits for a peer it cannot see (starved_by_restore).
/// The first poll (!j.stored) resolves step 0 ("the next step") in j.args.
Outcome poll_job(Job& j, CUresult* err, bool* starved) {
  *err = CUDA_SUCCESS;
  *starved = j.starved;
  HandshakeArgs& a = j.args;
  const bool stored = j.stored;
  if ((a.my_flag | a.peer_flag) % 8) {
    *err = CUDA_ERROR_MISALIGNED_ADDRESS;
    return Outcome::kDone;
  }
  if (!stored) {
    if (check_range(a.my_flag, 8, true) != CUDA_SUCCESS) {
      *err = CUDA_ERROR_ILLEGAL_ADDRESS;
      return Outcome::kDone;
    }
    auto* mine = reinterpret_cast<uint64_t*>(a.my_flag);
    if (a.step == 0) a.step = __atomic_load_n(mine, __ATOMIC_SEQ_CST) + 1;
    __atomic_store_n(mine, a.step, __ATOMIC_SEQ_CST);
  }
  if (check_range(a.peer_flag, 8, false) != CUDA_SUCCESS) {
    *err = CUDA_ERROR_ILLEGAL_ADDRESS;
    return Outcome::kDone;
  }
  uint64_t peer = __atomic_load_n(reinterpret_cast<const uint64_t*>(a.peer_flag), __ATOMIC_SEQ_CST);
  if (j.starved) return Outcome::kWaiting;
  if (peer >= a.step) return Outcome::kDone;
  if (starved_by_restore(a)) *starved = true;
  return stored ? Outcome::kWaiting : Outcome::kStored;
}

void kernel_thread(Queue* qp, std::promise<void>* started) {
  Queue& q = *qp;
  started->set_value();
  unsigned idle = 0;
  for (;;) {
    std::vector<std::pair<uint64_t, Job>> runnable;
    {
      std::unique_lock<std::mutex> l(q.mu);
      q.work_cv.wait(l, [&] { return !q.pending.empty(); });
      for (auto& [seq, j] : q.pending)
        if (!any_pending(q, j.deps)) runnable.emplace_back(seq, j);
    }
    std::vector<std::tuple<uint64_t, Outcome, CUresult, bool, uint64_t>> results;
    {
      std::lock_guard<std::mutex> l(driver().mu);
      for (auto& [seq, j] : runnable) {
        CUresult err;
        bool starved = false;
        Outcome o = poll_job(j, &err, &starved);
        results.emplace_back(seq, o, err, starved, j.args.step);
      }
    }
    bool progress = false;
    {
      std::lock_guard<std::mutex> l(q.mu);
      const auto now = std::chrono::steady_clock::now();
      for (auto& [seq, o, err, starved, step] : results) {
        auto it = q.pending.find(seq);
        if (it == q.pending.end()) continue;
        if (starved && !it->second.starved) {
          it->second.starved = true;
          it->second.starved_at = now;
        }
        if (it->second.starved &&
            now - it->second.starved_at >= std::chrono::milliseconds(ctxsw_timeout_ms())) {
          q.errors.emplace(stream_key_id(it->second.key), CUDA_ERROR_LAUNCH_FAILED);
          q.pending.erase(it);
          progress = true;
          continue;
        }
        if (o == Outcome::kWaiting) continue;
        progress = true;
        if (o == Outcome::kStored) {
          it->second.stored = true;
          it->second.args.step = step;  // step 0 resolved at the store
          continue;
        }
        if (err != CUDA_SUCCESS) q.errors.emplace(stream_key_id(it->second.key), err);
        q.pending.erase(it);
      }
      if (progress) q.done_cv.notify_all();
    }
    if (progress) {
      idle = 0;
    } else if (++idle < 64) {
      sched_yield();
    } else {
      // The peer is another process (or thread): poll, a little slower once
      // it has kept us waiting for a while.
      usleep(idle < 2000 ? 50 : 500);
    }
  }
}

/// Starts this process's kernel thread (all signals blocked in it: the
/// application's handlers run on its own threads). Returns once it runs.
void start_thread(Queue* q) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  auto started = std::make_shared<std::promise<void>>();
  std::future<void> running = started->get_future();
  std::thread([q, started] { kernel_thread(q, started.get()); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  running.wait();
}

/// Waits until none of `seqs` is pending, still counted in flight (by
/// FC_ENTER): as on the real driver, a lock waits for a thread that
/// synchronizes on running device work, and fails NOT_READY when its timeout
/// passes first, the process left running (docs/design.md, measured with a
/// 4 s kernel). Device work no thread waits on does not hold the lock; the
/// driver checkpoint waits for it instead.
void wait_for(const std::vector<uint64_t>& seqs) {
  Queue& q = queue();
  std::unique_lock<std::mutex> l(q.mu);
  q.done_cv.wait(l, [&] { return !any_pending(q, seqs); });
}

/// Jobs to wait for when synchronizing key: the stream's own jobs (each
/// already ordered after what it waits for); for the legacy stream also the
/// blocking streams' jobs.
std::vector<uint64_t> sync_set(Queue& q, const StreamKey& key) {
  if (key.kind == StreamKind::kLegacy) return deps_for(q, key);
  std::vector<uint64_t> seqs;
  for (auto& [seq, j] : q.pending)
    if (same_key(j.key, key)) seqs.push_back(seq);
  return seqs;
}

void before_fork() {
  queue().mu.lock();
}
void after_fork_parent() {
  queue().mu.unlock();
}
void after_fork_child() {
  g_queue = new Queue;  // the old one stays locked and unused
}

__attribute__((constructor)) void register_kernel_fork_handlers() {
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

}  // namespace

bool resolve_stream(CUstream s, bool ptsz, StreamKey* out) {
  StreamKey k;
  if (s != nullptr && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) {
    auto* st = reinterpret_cast<Stream*>(s);
    k.ctx = reinterpret_cast<Context*>(st->ctx);
    k.kind = StreamKind::kUser;
    k.id = reinterpret_cast<uintptr_t>(st);
    k.blocking = !(st->flags & CU_STREAM_NON_BLOCKING);
    *out = k;
    return true;
  }
  k.ctx = current_ctx();
  if (!valid_ctx(reinterpret_cast<CUcontext>(k.ctx))) return false;
  if (s == CU_STREAM_PER_THREAD || (s == nullptr && ptsz)) {
    k.kind = StreamKind::kPerThread;
    k.id = static_cast<uintptr_t>(syscall(SYS_gettid));
  }
  *out = k;
  return true;
}

void kernel_enqueue(const StreamKey& key, const HandshakeArgs& args) {
  Queue* q = &queue();
  bool start = false;
  {
    std::lock_guard<std::mutex> l(q->mu);
    Job j;
    j.key = key;
    j.args = args;
    j.deps = deps_for(*q, key);
    q->pending.emplace(q->next_seq++, std::move(j));
    start = !q->started;
    q->started = true;
  }
  if (start) start_thread(q);
  q->work_cv.notify_all();
}

bool stream_busy(const StreamKey& key) {
  Queue& q = queue();
  std::lock_guard<std::mutex> l(q.mu);
  return !sync_set(q, key).empty();
}

CUresult stream_error(const StreamKey& key) {
  Queue& q = queue();
  std::lock_guard<std::mutex> l(q.mu);
  auto it = q.errors.find(stream_key_id(key));
  return it == q.errors.end() ? CUDA_SUCCESS : it->second;
}

CUresult stream_wait(const StreamKey& key) {
  std::vector<uint64_t> seqs;
  {
    Queue& q = queue();
    std::lock_guard<std::mutex> l(q.mu);
    seqs = sync_set(q, key);
  }
  wait_for(seqs);
  return stream_error(key);
}

CUresult ctx_wait(Context* ctx) {
  std::vector<uint64_t> seqs;
  Queue& q = queue();
  {
    std::lock_guard<std::mutex> l(q.mu);
    for (auto& [seq, j] : q.pending)
      if (j.key.ctx == ctx) seqs.push_back(seq);
  }
  wait_for(seqs);
  std::lock_guard<std::mutex> l(q.mu);
  for (auto& [k, err] : q.errors)
    if (std::get<0>(k) == ctx) return err;
  return CUDA_SUCCESS;
}

CUresult stream_order(CUstream s, bool ptsz) {
  StreamKey key;
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (!valid_stream(s) || !resolve_stream(s, ptsz, &key)) return CUDA_SUCCESS;
    if (CUresult r = capture_refuse(key)) return r;
  }
  std::vector<uint64_t> seqs;
  {
    Queue& q = queue();
    std::lock_guard<std::mutex> l(q.mu);
    seqs = deps_for(q, key);
  }
  wait_for(seqs);
  return CUDA_SUCCESS;
}

CUresult ctx_synchronize(CUcontext ctx) {
  {
    std::lock_guard<std::mutex> l(driver().mu);
    if (!ctx) ctx = reinterpret_cast<CUcontext>(current_ctx());
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (CUresult r = capture_ctx_sync(reinterpret_cast<Context*>(ctx))) return r;
  }
  return ctx_wait(reinterpret_cast<Context*>(ctx));
}

void event_set_deps(const void* event, const StreamKey* key) {
  Queue& q = queue();
  std::lock_guard<std::mutex> l(q.mu);
  if (!key) {
    q.event_deps.erase(event);
    return;
  }
  std::vector<uint64_t> deps = deps_for(q, *key);
  if (deps.empty())
    q.event_deps.erase(event);
  else
    q.event_deps[event] = std::move(deps);
}

bool event_busy(const void* event) {
  Queue& q = queue();
  std::lock_guard<std::mutex> l(q.mu);
  auto it = q.event_deps.find(event);
  return it != q.event_deps.end() && any_pending(q, it->second);
}

void event_wait(const void* event) {
  std::vector<uint64_t> seqs;
  {
    Queue& q = queue();
    std::lock_guard<std::mutex> l(q.mu);
    auto it = q.event_deps.find(event);
    if (it == q.event_deps.end()) return;
    seqs = it->second;
  }
  wait_for(seqs);
}

void kernels_wait_idle() {
  Queue& q = queue();
  std::unique_lock<std::mutex> l(q.mu);
  q.done_cv.wait(l, [&] { return q.pending.empty(); });
}

size_t kernels_pending() {
  Queue& q = queue();
  std::lock_guard<std::mutex> l(q.mu);
  return q.pending.size();
}

}  // namespace fc
