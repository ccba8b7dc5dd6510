// Values the shim computes on first use, without the guard variable C++
// gives a function-local static. A fork child inherits such a guard as it
// was: held by a thread of the parent's that was making the value, which does
// not exist in the child, so the child's first use would wait forever inside
// the application's call. These hold the value in an atomic instead: threads
// that race the first use each compute it (the same answer, or one object
// kept and the others discarded), and a fork child either sees it made or
// makes it itself. tests/shim/no_guards_test.sh checks that the shim has no
// guard variable left.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace cusnap::shim {

/// A number (or an enumerator, a flag) made once: `static OnceNumber n;`
/// (constant-initialised, so itself without a guard), then n.get(make).
class OnceNumber {
 public:
  constexpr OnceNumber() = default;

  /// The value; make() is called until a call has stored one, and racing
  /// callers all return the one stored first. make must not return
  /// UINT64_MAX (kept as "not made": it would be made again on each use).
  template <typename F>
  uint64_t get(F&& make) {
    uint64_t v = v_.load(std::memory_order_acquire);
    if (v != kUnset) return v;
    const uint64_t made = static_cast<uint64_t>(std::forward<F>(make)());
    if (v_.compare_exchange_strong(v, made, std::memory_order_acq_rel)) return made;
    return v;  // another thread's, stored first
  }

 private:
  static constexpr uint64_t kUnset = UINT64_MAX;
  std::atomic<uint64_t> v_{kUnset};
};

/// An object made once and never destroyed (it may be used after the
/// process's static destructors ran): make() returns it (nullptr: not made,
/// tried again on the next use); a racing thread's extra one is given to
/// discard().
template <typename T>
class OncePointer {
 public:
  constexpr OncePointer() = default;

  template <typename Make, typename Discard>
  T* get(Make&& make, Discard&& discard) {
    T* p = p_.load(std::memory_order_acquire);
    if (p) return p;
    T* made = std::forward<Make>(make)();
    if (!made) return nullptr;
    if (p_.compare_exchange_strong(p, made, std::memory_order_acq_rel)) return made;
    std::forward<Discard>(discard)(made);
    return p;
  }

 private:
  std::atomic<T*> p_{nullptr};
};

}  // namespace cusnap::shim
