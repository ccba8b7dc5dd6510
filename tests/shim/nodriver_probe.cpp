// A program that has no CUDA driver in it asks whether one is loaded, as
// libraries do (dlsym(RTLD_DEFAULT, "cuInit")): under the preloaded shim the
// answer is NULL and no driver gets loaded, as without it (before: the shim
// answered with its wrapper and loaded the driver). ctest shim.nodriver_probe.
#include <dlfcn.h>

#include <cstdio>

int main() {
  void* p = dlsym(RTLD_DEFAULT, "cuInit");
  void* loaded = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  std::printf("dlsym(RTLD_DEFAULT, cuInit): %s; libcuda.so.1 %s\n", p ? "found" : "NULL",
              loaded ? "loaded" : "not loaded");
  return p == nullptr && loaded == nullptr ? 0 : 1;
}
