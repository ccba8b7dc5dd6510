// A read-write lock that lets a waiting writer in before readers that come
// after it. The default pthread (and std::shared_mutex) lock prefers
// readers: threads that read without pause, each taking it while another
// holds it, can keep it held, and a writer waiting, without end. The copy
// check's table (track_state.h) is read by every copy and memset on every
// thread and written by cuMemAlloc and cuMemFree, which must not wait on
// the workload's copies.
#pragma once

#include <pthread.h>

namespace cusnap::shim {

class WriterFirstLock {
 public:
  WriterFirstLock() noexcept { init(); }
  ~WriterFirstLock() { pthread_rwlock_destroy(&l_); }
  WriterFirstLock(const WriterFirstLock&) = delete;
  WriterFirstLock& operator=(const WriterFirstLock&) = delete;

  // std::unique_lock and std::shared_lock take these. A thread never takes
  // it twice (a reader that did would wait behind a waiting writer).
  void lock() noexcept { pthread_rwlock_wrlock(&l_); }
  void unlock() noexcept { pthread_rwlock_unlock(&l_); }
  void lock_shared() noexcept { pthread_rwlock_rdlock(&l_); }
  void unlock_shared() noexcept { pthread_rwlock_unlock(&l_); }

  /// A fork child's: free, whatever threads the child lacks held of it.
  void renew() noexcept { init(); }

 private:
  void init() noexcept {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&l_, &a);
    pthread_rwlockattr_destroy(&a);
  }
  pthread_rwlock_t l_;
};

}  // namespace cusnap::shim
