// alloc_sizes.cpp: what the driver reports of a cuMemAlloc block's size and
// alignment, for sizes from one byte to a few MiB: cuMemGetAddressRange of
// the block's base and of its last requested byte, the RANGE_SIZE pointer
// attribute, and the base's alignment; then whether an address one past the
// requested size (inside a rounded range) is known. Run on the driver alone
// and under `cusnap launch` (where the shim serves the block from a VMM
// allocation), and by scripts/gpu-test-shim.sh with and without the shim (the
// output must be the same). Addresses are not printed: they differ from run
// to run.
// Build: g++ -O1 -o alloc_sizes alloc_sizes.cpp -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#include <cuda.h>

#include <cstdio>

#include "probe_util.h"

/// The largest power of two, up to 2 MiB, that divides p.
static unsigned long long alignment(CUdeviceptr p) {
  unsigned long long a = 1;
  while (a < (2ull << 20) && p % (a * 2) == 0) a *= 2;
  return a;
}

static void range(const char* what, CUdeviceptr p, CUdeviceptr block) {
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult r = cuMemGetAddressRange(&base, &size, p);
  if (r == CUDA_SUCCESS)
    std::printf(" %s: base%s size %zu", what, base == block ? "" : " elsewhere", size);
  else
    std::printf(" %s: %s", what, name(r));
}

int main() {
  if (!init_primary()) return 1;
  const size_t sizes[] = {1,
                          100,
                          512,
                          513,
                          4096,
                          65537,
                          (1u << 20) + 1,
                          size_t(2) << 20,
                          (size_t(2) << 20) + 1,
                          size_t(3) << 20};
  for (size_t n : sizes) {
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc(&p, n);
    std::printf("cuMemAlloc(%zu): %s", n, name(r));
    if (r != CUDA_SUCCESS) {
      std::printf("\n");
      continue;
    }
    unsigned long long attr_size = 0;
    const CUresult a = cuPointerGetAttribute(&attr_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
    std::printf(", aligned to %llu", alignment(p));
    range("range", p, p);
    range("last byte", p + n - 1, p);
    range("one past", p + n, p);
    if (a == CUDA_SUCCESS)
      std::printf(", RANGE_SIZE %llu", attr_size);
    else
      std::printf(", RANGE_SIZE %s", name(a));
    std::printf(", free %s\n", name(cuMemFree(p)));
  }
  return 0;
}
