// The cut across collective ranks (cut.h).
#include "shim/cut.h"
#include "shim/cut_control.h"

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>

#include "proto/env_settings.h"
#include "shim/entries.h"
#include "shim/gate.h"
#include "shim/once.h"
#include "shim/real_driver.h"
#include "shim/stderr_line.h"

#define REAL(name) reinterpret_cast<decltype(&::name)>(real_entry(index_of(Entry::name)))

namespace cusnap::shim::cut {

namespace {

// ---- which kernels are collective -------------------------------------------

// The verdicts, per handle: an open-addressed table whose slots each hold
// one word, written with one compare-exchange (so a slot is never seen half
// filled): the handle (below 2^48), the verdict (bit 48) and the generation
// it was made in (bits 49..63). A slot of another generation is free. When
// modules go (cuModuleUnload, cuLibraryUnload, a context's destruction) the
// generation moves on: the driver may give a handle of a kernel loaded later
// the address of one unloaded, whose verdict would otherwise stand (a plain
// kernel held at an armed cut, a collective let through it).
constexpr unsigned kSlots = 4096;  // power of two
constexpr uint8_t kNo = 1, kYes = 2;
constexpr uint64_t kKeyBits = 48;
constexpr uint64_t kKeyMask = (1ull << kKeyBits) - 1;
constexpr uint64_t kYesBit = 1ull << kKeyBits;
constexpr unsigned kGenShift = kKeyBits + 1;
constexpr uint64_t kGenMask = (1ull << (64 - kGenShift)) - 1;
std::atomic<uint64_t> g_slots[kSlots];
/// Counts the unloads; its low bits are the generation of the verdicts in force.
std::atomic<uint64_t> g_generation{0};

constexpr unsigned kMaxPrefixes = proto::kMaxCollectiveKernelPrefixes;
char g_prefix_buf[proto::kMaxCollectiveKernelsBytes + 1];
const char* g_prefixes[kMaxPrefixes];
unsigned g_nprefixes = 0;
pthread_once_t g_prefix_once = PTHREAD_ONCE_INIT;

void load_prefixes() {
  const char* e = std::getenv("CUSNAP_COLLECTIVE_KERNELS");
  if (!e || !*e) e = proto::kDefaultCollectiveKernels;
  std::snprintf(g_prefix_buf, sizeof g_prefix_buf, "%s", e);
  char* save = nullptr;
  for (char* t = strtok_r(g_prefix_buf, ",", &save); t && g_nprefixes < kMaxPrefixes;
       t = strtok_r(nullptr, ",", &save))
    if (*t) g_prefixes[g_nprefixes++] = t;
}

}  // namespace

bool name_is_collective(const char* name) noexcept {
  pthread_once(&g_prefix_once, load_prefixes);
  if (!name) return false;
  // The driver gives the mangled name ("_Z39ncclDevKernel_AllReduce_...",
  // "_ZN4ncclDevKernel..."): compare from the first identifier.
  if (name[0] == '_' && name[1] == 'Z') {
    name += 2;
    if (*name == 'N') ++name;
    while (*name >= '0' && *name <= '9') ++name;
  }
  for (unsigned i = 0; i < g_nprefixes; ++i)
    if (std::strncmp(name, g_prefixes[i], std::strlen(g_prefixes[i])) == 0) return true;
  return false;
}

namespace {

uint8_t classify(CUfunction f) {
  const char* name = nullptr;
  if (auto get = REAL(cuFuncGetName); !get || get(&name, f) != CUDA_SUCCESS) name = nullptr;
  // A library kernel handle passed where a function is expected.
  if (!name) {
    if (auto get = REAL(cuKernelGetName);
        !get || get(&name, reinterpret_cast<CUkernel>(f)) != CUDA_SUCCESS)
      name = nullptr;
  }
  const uint8_t v = name && name_is_collective(name) ? kYes : kNo;
  if (debug_enabled())
    say("kernel %s: %s", name ? name : "(no name)", v == kYes ? "collective" : "not collective");
  return v;
}

// ---- the cut state ------------------------------------------------------------

/// Counts are kept per device of the launching context: a process that
/// launches one collective on each of several GPUs per step (single-process
/// multi-GPU NCCL) is lined up device by device, so that the cut never falls
/// between its launches of one step. Slot kUnknown: a launch whose device the
/// driver did not name.
constexpr unsigned kDeviceSlots = 64;
constexpr unsigned kUnknown = kDeviceSlots;
/// A device slot behind the process's most on one GPU, on which no launch
/// holds and none was let through while the process let this many through on
/// its other GPUs, is one the process no longer launches collectives on (a
/// warm-up or barrier on another GPU, a communicator destroyed): left out of
/// the process's count, whose target it could never reach. Far more than one
/// step launches on one GPU (a graph of a decode step holds a few hundred).
constexpr uint64_t kStaleLaunches = 1ull << 16;

struct Cut {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv;
  bool armed = false;
  bool target_set = false;
  uint64_t target = 0;
  /// Launches let through, per device slot (under mu).
  uint64_t reserved[kDeviceSlots + 1] = {};
  /// Launches let through on every slot, and that total when each slot last
  /// let one through (under mu): how long a slot has been idle (kStaleLaunches).
  /// A launch that failed stays in it (taken back from reserved only): the
  /// total measures time, and never falls below a slot's last_at.
  uint64_t total = 0;
  uint64_t last_at[kDeviceSlots + 1] = {};
  /// Threads holding at a launch now, per device slot (under mu).
  uint32_t held_on[kDeviceSlots + 1] = {};
  /// How long a launch holds before the shim drops the cut: the coordinator's
  /// hold_ms from "arm" when longer than the shim's own limit.
  uint64_t hold_ms = 0;
  /// Launches that returned successfully, per device slot.
  std::atomic<uint64_t> launched[kDeviceSlots + 1] = {};
  /// Ordinals (below 64) of the devices whose contexts launched collectives.
  std::atomic<uint64_t> devices{0};
};
Cut g_cut;
pthread_once_t g_cut_once = PTHREAD_ONCE_INIT;

void init_cv() {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&g_cut.cv, &a);
  pthread_condattr_destroy(&a);
}

struct Locked {
  Locked() {
    pthread_once(&g_cut_once, init_cv);
    pthread_mutex_lock(&g_cut.mu);
  }
  ~Locked() { pthread_mutex_unlock(&g_cut.mu); }
};

bool may_pass(unsigned slot, uint64_t n) {
  return !g_cut.armed || (g_cut.target_set && g_cut.reserved[slot] + n <= g_cut.target);
}

/// The most launches let through on one device.
uint64_t most_reserved_locked() {
  uint64_t most = 0;
  for (uint64_t r : g_cut.reserved) most = r > most ? r : most;
  return most;
}

/// Lets n launches through on slot `slot` (under the lock).
void reserve_locked(unsigned slot, uint64_t n) {
  g_cut.reserved[slot] += n;
  g_cut.total += n;
  g_cut.last_at[slot] = g_cut.total;
}

/// The process's counts as one: reserved, the most let through on one device
/// (a target below it cannot be met); launched, the fewest returned on a
/// device in use (one with launches let through or holding, and not left
/// behind: kStaleLaunches): the process stands at the target only once every
/// device it launches collectives on does, a device that holds at its first
/// collective included.
proto::CutState state_locked() {
  proto::CutState st;
  st.ok = true;
  st.armed = g_cut.armed;
  st.reserved = most_reserved_locked();
  bool any = false;
  for (unsigned d = 0; d <= kDeviceSlots; ++d) {
    st.held += g_cut.held_on[d];
    if (g_cut.reserved[d] == 0 && g_cut.held_on[d] == 0) continue;
    if (g_cut.held_on[d] == 0 && g_cut.reserved[d] < st.reserved &&
        g_cut.total - g_cut.last_at[d] > kStaleLaunches)
      continue;
    const uint64_t l = g_cut.launched[d].load(std::memory_order_acquire);
    st.launched = !any || l < st.launched ? l : st.launched;
    any = true;
  }
  st.target = g_cut.target;
  return st;
}

/// Names the devices of the collective launches, for "status" (outside the
/// cut's lock: a driver call must not hold the application's launches).
void add_devices(proto::CutState* st) {
  const uint64_t devices = g_cut.devices.load(std::memory_order_acquire);
  auto get = REAL(cuDeviceGetUuid);
  for (int d = 0; d < 64 && get && st->devices.size() < proto::kMaxCutDevices; ++d) {
    if (!(devices & (1ull << d))) continue;
    CUuuid u{};
    if (get(&u, static_cast<CUdevice>(d)) == CUDA_SUCCESS)
      st->devices.push_back(
          proto::format_gpu_uuid(reinterpret_cast<const unsigned char*>(u.bytes)));
  }
}

proto::CutState handle_locked(const proto::CutRequest& req) {
  Locked l;
  if (req.op == "arm") {
    g_cut.armed = true;
    g_cut.target_set = false;
    g_cut.target = 0;
    g_cut.hold_ms = req.hold_ms < proto::kMaxCutHoldMs ? req.hold_ms : proto::kMaxCutHoldMs;
  } else if (req.op == "target") {
    if (!g_cut.armed) {
      proto::CutState st = state_locked();
      st.ok = false;
      st.error = "the cut is not armed";
      return st;
    }
    if (const uint64_t most = most_reserved_locked(); req.target < most) {
      proto::CutState st = state_locked();
      st.ok = false;
      st.error = "target " + std::to_string(req.target) + " is below the " + std::to_string(most) +
                 " collective launches already made on one GPU";
      return st;
    }
    g_cut.target = req.target;
    g_cut.target_set = true;
    pthread_cond_broadcast(&g_cut.cv);
  } else if (req.op == "release") {
    g_cut.armed = false;
    g_cut.target_set = false;
    pthread_cond_broadcast(&g_cut.cv);
  } else if (req.op != "status") {
    proto::CutState st = state_locked();
    st.ok = false;
    st.error = "unknown cut operation '" + req.op + "'";
    return st;
  }
  return state_locked();
}

/// Holds a launch of n collectives on device slot `slot` (outside the gate),
/// counted in held_on by the caller under the same lock as the
/// may_pass that failed, until it may pass, or for the hold at most, under
/// the cut's lock; the hold in ms when it ran out (the cut then dropped),
/// else 0.
uint64_t hold_locked(unsigned slot, uint64_t n) {
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const uint64_t ms = own_hold_ms() > g_cut.hold_ms ? own_hold_ms() : g_cut.hold_ms;
  deadline.tv_sec += static_cast<time_t>(ms / 1000);
  deadline.tv_nsec += static_cast<long>(ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  uint64_t dropped = 0;
  while (!may_pass(slot, n)) {
    if (pthread_cond_timedwait(&g_cut.cv, &g_cut.mu, &deadline) == ETIMEDOUT &&
        !may_pass(slot, n)) {
      // Nobody finished the cut: drop it rather than stall the application.
      g_cut.armed = false;
      pthread_cond_broadcast(&g_cut.cv);
      dropped = ms;
      break;
    }
  }
  --g_cut.held_on[slot];
  reserve_locked(slot, n);
  return dropped;
}

/// Holds a launch of n collectives (hold_locked), and says on stderr, with the
/// cut's lock dropped, when nobody finished the cut.
void hold(unsigned slot, uint64_t n) {
  uint64_t dropped_after_ms = 0;
  {
    Locked l;
    dropped_after_ms = hold_locked(slot, n);
  }
  if (dropped_after_ms)
    say("a collective launch held %llu ms at a checkpoint's cut; the cut is dropped and the "
        "application goes on",
        static_cast<unsigned long long>(dropped_after_ms));
}

}  // namespace

bool is_collective(CUfunction f) noexcept {
  const auto key = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(f));
  if (key == 0) return false;
  if (key > kKeyMask) return classify(f) == kYes;  // not kept
  // Read before the driver is asked: a verdict made while modules went is
  // kept under a generation that is over, which no lookup takes.
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  const uint64_t tag = (gen & kGenMask) << kGenShift;
  auto current = [tag](uint64_t w) { return w != 0 && (w & ~(kYesBit | kKeyMask)) == tag; };
  uint8_t v = 0;  // classified once, when first needed
  unsigned i = static_cast<unsigned>((key >> 4) * 0x9E3779B97F4A7C15ull >> 52) & (kSlots - 1);
  for (unsigned probe = 0; probe < 16; ++probe, i = (i + 1) & (kSlots - 1)) {
    uint64_t w = g_slots[i].load(std::memory_order_acquire);
    for (;;) {
      if (current(w)) {
        if ((w & kKeyMask) == key) return (w & kYesBit) != 0;
        break;  // another handle's: on along the chain
      }
      // Free (empty, or of a generation that is over): within a generation
      // slots only fill, so the handle is nowhere further along.
      if (!v) v = classify(f);
      // Modules went meanwhile: the verdict stands for this call only.
      if (g_generation.load(std::memory_order_acquire) != gen) return v == kYes;
      const uint64_t mine = tag | (v == kYes ? kYesBit : 0) | key;
      if (g_slots[i].compare_exchange_strong(w, mine, std::memory_order_acq_rel)) return v == kYes;
      // Another thread filled the slot (or freed it): look at it again.
    }
  }
  return (v ? v : classify(f)) == kYes;  // table crowded: ask the driver each time
}

void kernels_unloaded() noexcept {
  const uint64_t tag = ((g_generation.fetch_add(1, std::memory_order_acq_rel) + 1) & kGenMask)
                       << kGenShift;
  // Empty the slots of generations that are over: none outlives the next
  // unload, so none comes back when the generation's bits wrap.
  for (auto& slot : g_slots) {
    uint64_t w = slot.load(std::memory_order_acquire);
    while (w != 0 && (w & ~(kYesBit | kKeyMask)) != tag &&
           !slot.compare_exchange_weak(w, 0, std::memory_order_acq_rel)) {
    }
  }
}

unsigned before(uint64_t n) noexcept {
  // The device of the launching context (a launch runs in the current one):
  // counted apart, see Cut. A driver call, made before the cut's lock.
  CUdevice d = -1;
  unsigned slot = kUnknown;
  if (auto get = REAL(cuCtxGetDevice);
      get && get(&d) == CUDA_SUCCESS && d >= 0 && d < static_cast<CUdevice>(kDeviceSlots))
    slot = static_cast<unsigned>(d);
  {
    Locked l;
    if (may_pass(slot, n) || gate().nested()) {
      reserve_locked(slot, n);
      return slot;
    }
    // Counted as holding at once: a "status" in between must see this slot
    // in use (a GPU at its first collective) and the process holding.
    ++g_cut.held_on[slot];
  }
  // The wait below is a cancellation point: a pthread_cancel acted on there
  // would unwind with the cut's lock held, out of the gate and out of this
  // noexcept function (std::terminate). It stays pending until the launch
  // went through (gate.h, NoCancel).
  const NoCancel no_cancel;
  // Hold outside the gate, so that it can close while this launch waits.
  gate().leave();
  hold(slot, n);
  gate().enter();  // waits here if the gate closed meanwhile
  return slot;
}

void after(unsigned slot, bool launched, uint64_t n) noexcept {
  if (slot > kUnknown) slot = kUnknown;
  if (launched) {
    // Two ranks on one GPU cannot be restored (docs/design.md), which the
    // coordinator checks first from these devices.
    if (slot < kDeviceSlots) g_cut.devices.fetch_or(1ull << slot, std::memory_order_acq_rel);
    g_cut.launched[slot].fetch_add(n, std::memory_order_acq_rel);
    return;
  }
  Locked l;
  uint64_t& r = g_cut.reserved[slot];
  r -= r >= n ? n : r;
  pthread_cond_broadcast(&g_cut.cv);
}

proto::CutState handle(const proto::CutRequest& req) noexcept {
  try {
    proto::CutState st = handle_locked(req);
    if (req.op == "status") add_devices(&st);
    return st;
  } catch (...) {
    return proto::CutState{};
  }
}

uint64_t own_hold_ms() noexcept {
  static OnceNumber ms;
  return ms.get([] { return proto::env_number(proto::kCutHoldMs); });
}

void release() noexcept {
  Locked l;
  g_cut.armed = false;
  g_cut.target_set = false;
  pthread_cond_broadcast(&g_cut.cv);
}

void atfork_prepare() noexcept {
  pthread_once(&g_cut_once, init_cv);
  pthread_mutex_lock(&g_cut.mu);
}
void atfork_parent() noexcept {
  pthread_mutex_unlock(&g_cut.mu);
}
void atfork_child() noexcept {
  new (&g_cut.mu) pthread_mutex_t(PTHREAD_MUTEX_INITIALIZER);
  init_cv();
  g_cut.armed = g_cut.target_set = false;
  g_cut.target = 0;
  g_cut.total = 0;
  g_cut.hold_ms = 0;
  for (unsigned d = 0; d <= kDeviceSlots; ++d) {
    g_cut.reserved[d] = 0;
    g_cut.held_on[d] = 0;
    g_cut.last_at[d] = 0;
    g_cut.launched[d].store(0, std::memory_order_relaxed);
  }
  g_cut.devices.store(0, std::memory_order_relaxed);
}

}  // namespace cusnap::shim::cut
