// Runs under LD_PRELOAD=libcusnap_shim.so against a driver (the simulated one,
// or the stand-in of this directory) and checks that every path to every
// wrapped entry point yields the shim's wrapper:
//   direct linking, dlsym on a dlopen'ed libcuda, RTLD_DEFAULT, RTLD_NEXT (from
//   the program, and from a library loaded after the shim), dlvsym,
//   cuGetProcAddress / _v2 / _v2_ptsz for every row of the resolver table with
//   the per-thread-stream flag rule, and the runtime's cudaGetDriverEntryPoint
//   family; the multicast bind ABI by version; fail-closed answers (names
//   outside the list, e.g. cudaGL.h's cuGLGetDevices); the gate (blocks while
//   closed, resumes when opened) and fork with the gate closed; the profiler
//   API of cudaProfiler.h (cuProfilerStart/Stop) by every resolver and called.
// Usage: shim_paths_test standin|fake     Exit 0 when every check passes.
#include <dlfcn.h>
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>

#include "shim/cusnap_shim.h"
#include "shim/entries.h"

using namespace cusnap::shim;

extern "C" void* probe_next(const char* name);
extern "C" void* probe_next_malloc();

namespace {

int g_failures = 0;
int g_checks = 0;

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    ++g_checks;                                                              \
    if (!(cond)) {                                                           \
      if (++g_failures <= 40) {                                              \
        std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
        std::fprintf(stderr, __VA_ARGS__);                                   \
        std::fputc('\n', stderr);                                            \
      }                                                                      \
    }                                                                        \
  } while (0)

void* const kDirect[] = {
#define CUSNAP_CU_PROC(...)
#define CUSNAP_CU_ENTRY(name, params, args) reinterpret_cast<void*>(&::name),
#include "cudaapi/entry_points.inc"
#undef CUSNAP_CU_ENTRY
};

template <class... A>
CUresult call_zero(CUresult (*f)(A...)) {
  return f(A{}...);
}
using ZeroCall = CUresult (*)(void*);
const ZeroCall kZeroCalls[] = {
#define CUSNAP_CU_ENTRY(name, params, args) \
  [](void* w) { return call_zero(reinterpret_cast<decltype(&::name)>(w)); },
#include "cudaapi/entry_points.inc"
#include "shim/extra_entries.inc"
#undef CUSNAP_CU_ENTRY
};
#undef CUSNAP_CU_PROC

using GpaV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GpaV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
using RtEntry = cudaError_t (*)(const char*, void**, unsigned long long,
                                cudaDriverEntryPointQueryResult*);
using RtByVersion = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                    cudaDriverEntryPointQueryResult*);

void* W[kEntryCount];

size_t idx(const char* name) {
  size_t i = 0;
  if (!find_entry(name, &i)) std::fprintf(stderr, "no entry %s\n", name);
  return i;
}

void* expected(const char* name, int version, bool per_thread) {
  ProcAnswer a;
  return lookup_proc(name, version, per_thread, &a) == ProcLookup::kFound ? W[a.index] : nullptr;
}

}  // namespace

// With no real driver (CUSNAP_REAL_LIBCUDA names a library that provides no
// driver entry point; a missing file would fall back to libcuda.so.1, which
// this program needs) every wrapper fails closed and name lookups find nothing.
int no_driver() {
  for (size_t i = 0; i < kGeneratedCount; ++i)
    CHECK(kZeroCalls[i](kDirect[i]) == CUDA_ERROR_NOT_SUPPORTED, "%s without a driver",
          entry_name(i));
  CHECK(dlsym(RTLD_DEFAULT, "cuInit") == nullptr, "RTLD_DEFAULT cuInit without a driver");
  CHECK(dlsym(RTLD_NEXT, "cuInit") == nullptr || dlsym(RTLD_NEXT, "cuInit") != kDirect[0],
        "RTLD_NEXT");
  std::printf("shim_paths_test (nodriver): %d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const bool standin = argc > 1 && std::strcmp(argv[1], "standin") == 0;
  if (argc > 1 && std::strcmp(argv[1], "nodriver") == 0) return no_driver();

  auto* info = static_cast<const cusnap_shim_info*>(dlsym(RTLD_DEFAULT, "cusnap_shim_build_info"));
  if (!info) {
    std::fprintf(stderr, "FAIL: the shim is not preloaded (no cusnap_shim_build_info)\n");
    return 1;
  }
  CHECK(info->abi == CUSNAP_SHIM_ABI, "abi %u", info->abi);
  CHECK(info->entry_points == kEntryCount, "%u entry points", info->entry_points);
  Dl_info di{};
  dladdr(info, &di);
  void* shim = dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(shim && cuda, "dlopen shim=%p cuda=%p", shim, cuda);
  if (!shim || !cuda) return 1;

  // The wrappers, as the shim exports them; each must live in the shim.
  for (size_t i = 0; i < kEntryCount; ++i) {
    W[i] = dlsym(shim, entry_name(i));
    Dl_info wi{};
    CHECK(W[i] && dladdr(W[i], &wi) && wi.dli_fbase == di.dli_fbase, "wrapper of %s",
          entry_name(i));
  }

  // Every symbol, by every name-based path.
  for (size_t i = 0; i < kEntryCount; ++i) {
    const char* n = entry_name(i);
    if (i < kGeneratedCount) CHECK(kDirect[i] == W[i], "direct link %s", n);
    CHECK(dlsym(cuda, n) == W[i], "dlsym(libcuda) %s", n);
    CHECK(dlsym(RTLD_DEFAULT, n) == W[i], "dlsym(RTLD_DEFAULT) %s", n);
    CHECK(dlsym(RTLD_NEXT, n) == W[i], "dlsym(RTLD_NEXT) from the program %s", n);
    CHECK(probe_next(n) == W[i], "dlsym(RTLD_NEXT) from a later library %s", n);
    // The driver's symbols carry no version: dlvsym finds them or not, and
    // whatever it finds is the wrapper.
    void* v = dlvsym(cuda, n, "libcuda.so.1");
    CHECK(v == nullptr || v == W[i], "dlvsym(libcuda) %s", n);
    if (standin) {
      auto last = reinterpret_cast<const char* (*)()>(dlsym(cuda, "standin_last_called"));
      kZeroCalls[i](W[i]);
      CHECK(last && std::strcmp(last(), n) == 0, "wrapper of %s reached %s", n,
            last ? last() : "?");
    }
  }
  CHECK(probe_next_malloc() != nullptr, "RTLD_NEXT malloc from a later library");
  CHECK(dlsym(RTLD_NEXT, "malloc") != nullptr, "RTLD_NEXT malloc from the program");
  CHECK(dlsym(RTLD_DEFAULT, "cuNoSuchEntryPoint") == nullptr, "unknown name");
  CHECK(dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34") != nullptr ||
            dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5") != nullptr,
        "dlvsym of a versioned C library symbol passes through");
  CHECK(dlvsym(RTLD_NEXT, "malloc", "GLIBC_2.2.5") != nullptr,
        "dlvsym(RTLD_NEXT) of a C library symbol");

  // The resolver, for every row of its table.
  auto gpa1 = reinterpret_cast<GpaV1>(W[idx("cuGetProcAddress")]);
  auto gpa2 = reinterpret_cast<GpaV2>(W[idx("cuGetProcAddress_v2")]);
  auto gpa2z = reinterpret_cast<GpaV2>(W[idx("cuGetProcAddress_v2_ptsz")]);
  void* rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  CHECK(rt != nullptr, "runtime %s", dlerror());
  auto rt_entry = reinterpret_cast<RtEntry>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPoint"));
  auto rt_entry_z = reinterpret_cast<RtEntry>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPoint_ptsz"));
  auto rt_ver =
      reinterpret_cast<RtByVersion>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion"));
  auto rt_ver_z =
      reinterpret_cast<RtByVersion>(dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion_ptsz"));
  Dl_info ri{};
  CHECK(rt_ver && dladdr(reinterpret_cast<void*>(rt_ver), &ri) && ri.dli_fbase == di.dli_fbase,
        "cudaGetDriverEntryPointByVersion is the shim's");
  size_t rows = proc_row_count();
  for (size_t r = 0; r < rows; ++r) {
    ProcRow row = proc_row(r);
    const bool pt = row.flavour != 0;
    void* want = expected(row.name, row.version, pt);
    CHECK(want != nullptr, "row %s %d", row.name, row.version);
    struct Way {
      const char* what;
      int api;  // 1 v1, 2 v2, 3 v2_ptsz
      cuuint64_t flags;
    };
    const Way ways[] = {
        {"v1", 1, pt ? 2ull : 0ull},      {"v1 legacy", 1, pt ? 2ull : 1ull},
        {"v2", 2, pt ? 2ull : 0ull},      {"v2 explicit", 2, pt ? 2ull : 1ull},
        {"v2_ptsz", 3, pt ? 0ull : 1ull}, {"v2_ptsz explicit", 3, pt ? 2ull : 1ull},
    };
    for (const Way& w : ways) {
      void* p = nullptr;
      CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      CUresult rc = w.api == 1
                        ? gpa1(row.name, &p, row.version, w.flags)
                        : (w.api == 2 ? gpa2 : gpa2z)(row.name, &p, row.version, w.flags, &st);
      CHECK(rc == CUDA_SUCCESS && p == want && (w.api == 1 || st == CU_GET_PROC_ADDRESS_SUCCESS),
            "cuGetProcAddress %s %s@%d flags %llu: rc %d", w.what, row.name, row.version,
            static_cast<unsigned long long>(w.flags), rc);
    }
    if (rt_ver && rt_ver_z) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult st{};
      cudaError_t e = rt_ver(row.name, &p, row.version,
                             pt ? cudaEnablePerThreadDefaultStream : cudaEnableLegacyStream, &st);
      CHECK(e == cudaSuccess && p == want, "cudaGetDriverEntryPointByVersion %s@%d: %d", row.name,
            row.version, e);
      p = nullptr;
      e = rt_ver_z(row.name, &p, row.version, pt ? cudaEnableDefault : cudaEnableLegacyStream, &st);
      CHECK(e == cudaSuccess && p == want, "cudaGetDriverEntryPointByVersion_ptsz %s@%d: %d",
            row.name, row.version, e);
    }
    if (rt_entry && rt_entry_z && row.version <= CUDA_VERSION) {
      void* want_now = expected(row.name, CUDA_VERSION, pt);
      void* p = nullptr;
      cudaDriverEntryPointQueryResult st{};
      cudaError_t e =
          rt_entry(row.name, &p, pt ? cudaEnablePerThreadDefaultStream : cudaEnableDefault, &st);
      CHECK(e == cudaSuccess && p == want_now, "cudaGetDriverEntryPoint %s: %d", row.name, e);
      p = nullptr;
      e = rt_entry_z(row.name, &p, pt ? cudaEnableDefault : cudaEnableLegacyStream, &st);
      CHECK(e == cudaSuccess && p == want_now, "cudaGetDriverEntryPoint_ptsz %s: %d", row.name, e);
    }
  }

  // The per-thread-stream flag rule on one name, spelled out.
  {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st{};
    gpa2("cuMemcpyAsync", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    CHECK(p == W[idx("cuMemcpyAsync")], "v2 default flags: legacy");
    gpa2z("cuMemcpyAsync", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    CHECK(p == W[idx("cuMemcpyAsync_ptsz")], "v2_ptsz default flags: per-thread");
    gpa2z("cuMemcpyAsync", &p, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);
    CHECK(p == W[idx("cuMemcpyAsync")], "v2_ptsz legacy flag: legacy");
    gpa2("cuMemcpyAsync", &p, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
    CHECK(p == W[idx("cuMemcpyAsync_ptsz")], "v2 per-thread flag: per-thread");
    gpa2("cuMemAlloc", &p, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
    CHECK(p == W[idx("cuMemAlloc_v2")], "per-thread flag on a name without per-thread forms");
  }

  // Multicast bind ABI by requested version, through every resolver.
  for (const char* base : {"cuMulticastBindMem", "cuMulticastBindAddr"}) {
    const std::string v1 = base, v2 = std::string(base) + "_v2";
    for (int ver : {12010, 13000, 13010, 13020}) {
      void* want = W[idx((ver >= 13010 ? v2 : v1).c_str())];
      void* p = nullptr;
      CUdriverProcAddressQueryResult st{};
      CHECK(gpa2(base, &p, ver, 0, &st) == CUDA_SUCCESS && p == want,
            "%s@%d via cuGetProcAddress_v2", base, ver);
      CHECK(gpa1(base, &p, ver, 0) == CUDA_SUCCESS && p == want, "%s@%d via cuGetProcAddress", base,
            ver);
      if (rt_ver) {
        cudaDriverEntryPointQueryResult rst{};
        CHECK(rt_ver(base, &p, ver, cudaEnableDefault, &rst) == cudaSuccess && p == want,
              "%s@%d via cudaGetDriverEntryPointByVersion", base, ver);
      }
    }
  }

  // Unknown and unresolvable names: no pointer, an error.
  {
    void* p = &p;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK(gpa2("cuNoSuchEntryPoint", &p, 13000, 0, &st) != CUDA_SUCCESS && p == nullptr &&
              st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
          "unknown name");
    p = &p;
    CHECK(gpa2("cuMemAlloc", &p, 1000, 0, &st) != CUDA_SUCCESS && p == nullptr, "version too low");
    // cudaGL.h is not in the list (scripts/gen-entry-points.py): no wrapper, and
    // no resolver hands a pointer out. The stand-in driver resolves the name, as
    // the real one does, so the shim itself must refuse it; the simulated driver
    // does not know it.
    {
      size_t i = 0;
      CHECK(!find_entry("cuGLGetDevices", &i), "cuGLGetDevices is in no list");
      CHECK(dlsym(shim, "cuGLGetDevices") == nullptr, "the shim exports no cuGLGetDevices");
      const CUresult want_rc = standin ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_FOUND;
      p = &p;
      st = CU_GET_PROC_ADDRESS_SUCCESS;
      CUresult rc = gpa2("cuGLGetDevices", &p, 13000, 0, &st);
      CHECK(rc == want_rc && p == nullptr && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            "cuGLGetDevices via cuGetProcAddress_v2 fails closed: rc %d", rc);
      p = &p;
      rc = gpa1("cuGLGetDevices", &p, 13000, 0);
      CHECK(rc == want_rc && p == nullptr, "cuGLGetDevices via cuGetProcAddress: rc %d", rc);
      p = &p;
      rc = gpa2z("cuGLGetDevices", &p, 13000, 0, &st);
      CHECK(rc == want_rc && p == nullptr, "cuGLGetDevices via cuGetProcAddress_v2_ptsz: rc %d",
            rc);
      if (rt_entry && rt_ver) {
        cudaDriverEntryPointQueryResult rst = cudaDriverEntryPointSuccess;
        p = &p;
        cudaError_t e = rt_entry("cuGLGetDevices", &p, cudaEnableDefault, &rst);
        CHECK(e != cudaSuccess && p == nullptr && rst == cudaDriverEntryPointSymbolNotFound,
              "cuGLGetDevices via cudaGetDriverEntryPoint: %d", e);
        if (standin) CHECK(e == cudaErrorNotSupported, "cudaGetDriverEntryPoint: %d", e);
        p = &p;
        e = rt_ver("cuGLGetDevices", &p, 13000, cudaEnableDefault, &rst);
        CHECK(e != cudaSuccess && p == nullptr, "cuGLGetDevices via ...ByVersion: %d", e);
      }
    }
    if (standin) {
      p = &p;
      CHECK(gpa2("cusnapStandinUnknown", &p, 13000, 0, &st) == CUDA_ERROR_NOT_SUPPORTED &&
                p == nullptr && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            "a driver function outside the table fails closed");
      p = &p;
      CHECK(gpa1("cusnapStandinUnknown", &p, 13000, 0) == CUDA_ERROR_NOT_SUPPORTED && p == nullptr,
            "fails closed through v1");
    }
  }

  // The gate: closed, a call waits; opened, it continues. Fork while closed.
  {
    const auto* ctl = info->control;
    auto get_current = reinterpret_cast<CUresult (*)(CUcontext*)>(W[idx("cuCtxGetCurrent")]);
    CHECK(ctl && ctl->size == sizeof(cusnap_shim_control), "control table");
    CHECK(ctl->gate_close(1000) == 0, "close");
    std::atomic<bool> done{false};
    std::thread t([&] {
      CUcontext c = nullptr;
      get_current(&c);
      done = true;
    });
    uint64_t waiting = 0;
    for (int k = 0; k < 200 && waiting == 0; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ctl->gate_state(nullptr, nullptr, &waiting);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(waiting == 1 && !done, "a call waits at the closed gate (waiting %llu)",
          static_cast<unsigned long long>(waiting));
    pid_t pid = fork();
    if (pid == 0) {
      alarm(5);
      CUcontext c = nullptr;
      get_current(&c);  // the child's gate is open
      _exit(0);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "child of a closed gate calls the driver (%d)", status);
    CHECK(ctl->gate_open() == 0, "open");
    t.join();
    CHECK(done, "the waiting call continued");
    int closed = 1;
    uint64_t in_flight = 1;
    ctl->gate_state(&closed, &in_flight, &waiting);
    CHECK(closed == 0 && in_flight == 0 && waiting == 0, "gate idle after");
  }

  // The profiler API (cudaProfiler.h, not cuda.h): cuProfilerStart/Stop resolve
  // to the shim's wrappers by every resolver, and calling them reaches the
  // driver (the simulated one: CUDA_ERROR_INVALID_CONTEXT without a current
  // context, CUDA_SUCCESS with one).
  {
    struct link_map* lm = nullptr;
    CHECK(dlinfo(cuda, RTLD_DI_LINKMAP, &lm) == 0 && lm, "libcuda's link map");
    const char* cuda_file = lm ? lm->l_name : "";
    using Toggle = CUresult (*)();
    Toggle start = nullptr, stop = nullptr;
    for (const char* n : {"cuProfilerStart", "cuProfilerStop"}) {
      size_t i = 0;
      CHECK(find_entry(n, &i), "%s is in the entry list", n);
      void* want = W[i];
      CHECK(want != nullptr, "%s wrapper", n);
      auto in_shim = [&](void* q) {
        Dl_info qi{};
        return q && dladdr(q, &qi) && qi.dli_fbase == di.dli_fbase &&
               std::strcmp(qi.dli_fname, cuda_file) != 0;
      };
      CHECK(in_shim(want), "%s: the wrapper lives in the shim, not in libcuda", n);
      void* p = nullptr;
      CUdriverProcAddressQueryResult st{};
      CHECK(gpa1(n, &p, 13000, 0) == CUDA_SUCCESS && p == want && in_shim(p),
            "%s via cuGetProcAddress", n);
      p = nullptr;
      CHECK(gpa2(n, &p, 13000, 0, &st) == CUDA_SUCCESS && p == want &&
                st == CU_GET_PROC_ADDRESS_SUCCESS,
            "%s via cuGetProcAddress_v2", n);
      p = nullptr;
      CHECK(gpa2z(n, &p, 13000, 0, &st) == CUDA_SUCCESS && p == want,
            "%s via cuGetProcAddress_v2_ptsz", n);
      p = nullptr;
      CHECK(gpa2(n, &p, 4000, 0, &st) == CUDA_SUCCESS && p == want,
            "%s via cuGetProcAddress_v2 at 4000", n);
      if (rt_entry && rt_entry_z && rt_ver && rt_ver_z) {
        cudaDriverEntryPointQueryResult rst{};
        p = nullptr;
        CHECK(rt_entry(n, &p, cudaEnableDefault, &rst) == cudaSuccess && p == want && in_shim(p),
              "%s via cudaGetDriverEntryPoint", n);
        p = nullptr;
        CHECK(rt_entry_z(n, &p, cudaEnableDefault, &rst) == cudaSuccess && p == want,
              "%s via cudaGetDriverEntryPoint_ptsz", n);
        p = nullptr;
        CHECK(rt_ver(n, &p, 13000, cudaEnableDefault, &rst) == cudaSuccess && p == want,
              "%s via cudaGetDriverEntryPointByVersion", n);
        p = nullptr;
        CHECK(rt_ver_z(n, &p, 13000, cudaEnableDefault, &rst) == cudaSuccess && p == want,
              "%s via cudaGetDriverEntryPointByVersion_ptsz", n);
      }
      p = nullptr;
      gpa2(n, &p, 13000, 0, &st);
      (std::strcmp(n, "cuProfilerStart") == 0 ? start : stop) = reinterpret_cast<Toggle>(p);
    }
    if (start && stop) {
      if (standin) {
        auto last = reinterpret_cast<const char* (*)()>(dlsym(cuda, "standin_last_called"));
        CHECK(start() == CUDA_SUCCESS && last && std::strcmp(last(), "cuProfilerStart") == 0,
              "cuProfilerStart reached the driver");
        CHECK(stop() == CUDA_SUCCESS && last && std::strcmp(last(), "cuProfilerStop") == 0,
              "cuProfilerStop reached the driver");
      } else {
        CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
        CUresult rc = start();
        CHECK(rc == CUDA_ERROR_INVALID_CONTEXT, "cuProfilerStart without a context: %d", rc);
        rc = stop();
        CHECK(rc == CUDA_ERROR_INVALID_CONTEXT, "cuProfilerStop without a context: %d", rc);
        CUcontext ctx = nullptr;
        CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
                  cuCtxSetCurrent(ctx) == CUDA_SUCCESS,
              "primary context current");
        rc = start();
        CHECK(rc == CUDA_SUCCESS, "cuProfilerStart with a context: %d", rc);
        rc = stop();
        CHECK(rc == CUDA_SUCCESS, "cuProfilerStop with a context: %d", rc);
        CHECK(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS &&
                  cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS,
              "primary context released");
      }
    }
  }

  std::printf("shim_paths_test (%s): %d checks, %d failures, %zu entry points, %zu resolver rows\n",
              standin ? "standin" : "fake", g_checks, g_failures, kEntryCount, rows);
  return g_failures == 0 ? 0 : 1;
}
