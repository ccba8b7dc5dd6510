// Loaded after the shim (a NEEDED library of the test program): its
// dlsym(RTLD_NEXT, ...) looks past itself, so the shim must emulate the
// search from this library's position and still hand out its wrappers.
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) void* probe_next(const char* name) {
  return dlsym(RTLD_NEXT, name);
}
extern "C" __attribute__((visibility("default"))) void* probe_next_malloc() {
  return dlsym(RTLD_NEXT, "malloc");
}
