// Threads the shim starts inside the application (its listeners, a drain):
// detached, and with every signal blocked, so that the application's signals
// go to the application's own threads.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace cusnap::shim {

/// Starts fn(arg) on a detached thread with every signal blocked; 0 or the
/// error pthread_create gave (arg is then still the caller's).
inline int start_detached(void* (*fn)(void*), void* arg) noexcept {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  const int rc = pthread_create(&t, nullptr, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc == 0) pthread_detach(t);
  return rc;
}

}  // namespace cusnap::shim
