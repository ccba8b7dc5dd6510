// A pthread mutex held for a scope. The shim's fixed tables use pthread
// mutexes (no allocation, reinitialized in a fork child).
#pragma once

#include <pthread.h>

namespace cusnap::shim {

class PthreadLock {
 public:
  explicit PthreadLock(pthread_mutex_t* m) noexcept : m_(m) { pthread_mutex_lock(m_); }
  ~PthreadLock() { pthread_mutex_unlock(m_); }
  PthreadLock(const PthreadLock&) = delete;
  PthreadLock& operator=(const PthreadLock&) = delete;

 private:
  pthread_mutex_t* m_;
};

}  // namespace cusnap::shim
