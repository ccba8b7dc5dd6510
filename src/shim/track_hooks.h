// Hooks of the entry points that tracking records or translates (track.h).
// Included by hooks.h; each binds the real function into a call of track::.
#pragma once

#include "shim/hooks.h"
#include "shim/cut.h"
#include "shim/captures.h"
#include "shim/graphs.h"
#include "shim/track.h"

namespace cusnap::shim {

#define CUSNAP_TRACK_HOOK(entry, fn)                                       \
  template <>                                                              \
  struct Hook<Entry::entry> {                                              \
    static auto bind(decltype(&::entry) real) noexcept {                   \
      return [real](auto... a) noexcept { return track::fn(real, a...); }; \
    }                                                                      \
  };

CUSNAP_TRACK_HOOK(cuInit, init)
CUSNAP_TRACK_HOOK(cuMemCreate, mem_create)
CUSNAP_TRACK_HOOK(cuMemRelease, mem_release)
CUSNAP_TRACK_HOOK(cuMemExportToShareableHandle, mem_export)
CUSNAP_TRACK_HOOK(cuMemImportFromShareableHandle, mem_import)
CUSNAP_TRACK_HOOK(cuMemRetainAllocationHandle, mem_retain)
CUSNAP_TRACK_HOOK(cuMemMap, mem_map)
CUSNAP_TRACK_HOOK(cuMemUnmap, mem_unmap)
CUSNAP_TRACK_HOOK(cuMemSetAccess, mem_set_access)
CUSNAP_TRACK_HOOK(cuMemGetAccess, mem_get_access)
CUSNAP_TRACK_HOOK(cuMemGetAllocationPropertiesFromHandle, mem_get_props)
CUSNAP_TRACK_HOOK(cuMemAlloc_v2, mem_alloc)
CUSNAP_TRACK_HOOK(cuMemFree_v2, mem_free)
CUSNAP_TRACK_HOOK(cuPointerSetAttribute, pointer_set_attr)
CUSNAP_TRACK_HOOK(cuPointerGetAttribute, pointer_get_attr)
CUSNAP_TRACK_HOOK(cuPointerGetAttributes, pointer_get_attrs)
CUSNAP_TRACK_HOOK(cuMemGetAddressRange_v2, mem_get_range)
CUSNAP_TRACK_HOOK(cuCtxEnablePeerAccess, ctx_enable_peer)
CUSNAP_TRACK_HOOK(cuCtxDisablePeerAccess, ctx_disable_peer)
CUSNAP_TRACK_HOOK(cuIpcGetMemHandle, ipc_get)
CUSNAP_TRACK_HOOK(cuIpcOpenMemHandle, ipc_open)
CUSNAP_TRACK_HOOK(cuIpcOpenMemHandle_v2, ipc_open)
CUSNAP_TRACK_HOOK(cuIpcCloseMemHandle, ipc_close)
CUSNAP_TRACK_HOOK(cuMulticastCreate, mc_create)
CUSNAP_TRACK_HOOK(cuMulticastAddDevice, mc_add_device)
CUSNAP_TRACK_HOOK(cuMulticastUnbind, mc_unbind)
#undef CUSNAP_TRACK_HOOK
// Copies and memsets (the one-dimensional ones, to and from arrays too, and
// the 2D memsets; tests/shim/track_test_ranges.cpp calls each): refused
// INVALID_VALUE where they reach past the bytes asked of a block the shim
// serves, as the driver refuses them at its own block's end
// (track::past_block); the rest goes to the driver as it came. The 2D and
// 3D copies and the batched ones are not checked (docs/shim.md).
#define CUSNAP_RANGE_HOOK(entry, past)                                          \
  template <>                                                                   \
  struct Hook<Entry::entry> {                                                   \
    static auto bind(decltype(&::entry) real) noexcept {                        \
      return [real](auto... a) noexcept {                                       \
        if (past(a...)) return static_cast<CUresult>(CUDA_ERROR_INVALID_VALUE); \
        return real(a...);                                                      \
      };                                                                        \
    }                                                                           \
  };
namespace range_hooks {
/// The device bytes a copy or memset writes or reads, by its parameters.
inline bool to_dev(CUdeviceptr dst, const void*, size_t n, auto...) noexcept {
  return track::past_block(dst, n);
}
inline bool from_dev(void*, CUdeviceptr src, size_t n, auto...) noexcept {
  return track::past_block(src, n);
}
inline bool dev_dev(CUdeviceptr dst, CUdeviceptr src, size_t n, auto...) noexcept {
  return track::past_block(dst, n) || track::past_block(src, n);
}
inline bool peer(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t n,
                 auto...) noexcept {
  return track::past_block(dst, n) || track::past_block(src, n);
}
inline bool array_to_dev(CUdeviceptr dst, CUarray, size_t, size_t n) noexcept {
  return track::past_block(dst, n);
}
inline bool dev_to_array(CUarray, size_t, CUdeviceptr src, size_t n) noexcept {
  return track::past_block(src, n);
}
/// count elements of `size` bytes; a product past 64 bits is left to the
/// driver (which refuses it).
template <size_t size>
inline bool set(CUdeviceptr dst, auto, size_t count, auto...) noexcept {
  size_t n = 0;
  return !__builtin_mul_overflow(count, size, &n) && track::past_block(dst, n);
}
/// height rows of width elements, pitch bytes apart: the last row's end.
template <size_t size>
inline bool set_2d(CUdeviceptr dst, size_t pitch, auto, size_t width, size_t height,
                   auto...) noexcept {
  size_t rows = 0, row = 0, n = 0;
  if (width == 0 || height == 0) return false;
  if (__builtin_mul_overflow(pitch, height - 1, &rows) ||
      __builtin_mul_overflow(width, size, &row) || __builtin_add_overflow(rows, row, &n))
    return false;
  return track::past_block(dst, n);
}
}  // namespace range_hooks
CUSNAP_RANGE_HOOK(cuMemcpy, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpy_ptds, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyAsync, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyAsync_ptsz, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyHtoD_v2, range_hooks::to_dev)
CUSNAP_RANGE_HOOK(cuMemcpyHtoD_v2_ptds, range_hooks::to_dev)
CUSNAP_RANGE_HOOK(cuMemcpyHtoDAsync_v2, range_hooks::to_dev)
CUSNAP_RANGE_HOOK(cuMemcpyHtoDAsync_v2_ptsz, range_hooks::to_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoH_v2, range_hooks::from_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoH_v2_ptds, range_hooks::from_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoHAsync_v2, range_hooks::from_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoHAsync_v2_ptsz, range_hooks::from_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoD_v2, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoD_v2_ptds, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoDAsync_v2, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoDAsync_v2_ptsz, range_hooks::dev_dev)
CUSNAP_RANGE_HOOK(cuMemcpyPeer, range_hooks::peer)
CUSNAP_RANGE_HOOK(cuMemcpyPeer_ptds, range_hooks::peer)
CUSNAP_RANGE_HOOK(cuMemcpyPeerAsync, range_hooks::peer)
CUSNAP_RANGE_HOOK(cuMemcpyPeerAsync_ptsz, range_hooks::peer)
CUSNAP_RANGE_HOOK(cuMemcpyAtoD_v2, range_hooks::array_to_dev)
CUSNAP_RANGE_HOOK(cuMemcpyAtoD_v2_ptds, range_hooks::array_to_dev)
CUSNAP_RANGE_HOOK(cuMemcpyDtoA_v2, range_hooks::dev_to_array)
CUSNAP_RANGE_HOOK(cuMemcpyDtoA_v2_ptds, range_hooks::dev_to_array)
CUSNAP_RANGE_HOOK(cuMemsetD8_v2, range_hooks::set<1>)
CUSNAP_RANGE_HOOK(cuMemsetD8_v2_ptds, range_hooks::set<1>)
CUSNAP_RANGE_HOOK(cuMemsetD8Async, range_hooks::set<1>)
CUSNAP_RANGE_HOOK(cuMemsetD8Async_ptsz, range_hooks::set<1>)
CUSNAP_RANGE_HOOK(cuMemsetD16_v2, range_hooks::set<2>)
CUSNAP_RANGE_HOOK(cuMemsetD16_v2_ptds, range_hooks::set<2>)
CUSNAP_RANGE_HOOK(cuMemsetD16Async, range_hooks::set<2>)
CUSNAP_RANGE_HOOK(cuMemsetD16Async_ptsz, range_hooks::set<2>)
CUSNAP_RANGE_HOOK(cuMemsetD32_v2, range_hooks::set<4>)
CUSNAP_RANGE_HOOK(cuMemsetD32_v2_ptds, range_hooks::set<4>)
CUSNAP_RANGE_HOOK(cuMemsetD32Async, range_hooks::set<4>)
CUSNAP_RANGE_HOOK(cuMemsetD32Async_ptsz, range_hooks::set<4>)
CUSNAP_RANGE_HOOK(cuMemsetD2D8_v2, range_hooks::set_2d<1>)
CUSNAP_RANGE_HOOK(cuMemsetD2D8_v2_ptds, range_hooks::set_2d<1>)
CUSNAP_RANGE_HOOK(cuMemsetD2D8Async, range_hooks::set_2d<1>)
CUSNAP_RANGE_HOOK(cuMemsetD2D8Async_ptsz, range_hooks::set_2d<1>)
CUSNAP_RANGE_HOOK(cuMemsetD2D16_v2, range_hooks::set_2d<2>)
CUSNAP_RANGE_HOOK(cuMemsetD2D16_v2_ptds, range_hooks::set_2d<2>)
CUSNAP_RANGE_HOOK(cuMemsetD2D16Async, range_hooks::set_2d<2>)
CUSNAP_RANGE_HOOK(cuMemsetD2D16Async_ptsz, range_hooks::set_2d<2>)
CUSNAP_RANGE_HOOK(cuMemsetD2D32_v2, range_hooks::set_2d<4>)
CUSNAP_RANGE_HOOK(cuMemsetD2D32_v2_ptds, range_hooks::set_2d<4>)
CUSNAP_RANGE_HOOK(cuMemsetD2D32Async, range_hooks::set_2d<4>)
CUSNAP_RANGE_HOOK(cuMemsetD2D32Async_ptsz, range_hooks::set_2d<4>)
#undef CUSNAP_RANGE_HOOK
#define CUSNAP_FREE_ASYNC_HOOK(entry, ptsz)               \
  template <>                                             \
  struct Hook<Entry::entry> {                             \
    static auto bind(decltype(&::entry) real) noexcept {  \
      return [real](CUdeviceptr d, CUstream s) noexcept { \
        return track::mem_free_async(real, d, s, ptsz);   \
      };                                                  \
    }                                                     \
  };
CUSNAP_FREE_ASYNC_HOOK(cuMemFreeAsync, false)
CUSNAP_FREE_ASYNC_HOOK(cuMemFreeAsync_ptsz, true)
#undef CUSNAP_FREE_ASYNC_HOOK

// Contexts the application creates and destroys: drain synchronizes them too;
// a destroyed one's kernels are gone (cut::kernels_unloaded).
#define CUSNAP_CTX_CREATE_HOOK(entry)                                        \
  template <>                                                              \
  struct Hook<Entry::entry> {                                              \
    static auto bind(decltype(&::entry) real) noexcept {                   \
      return [real](CUcontext* pctx, auto... a) noexcept {                 \
        CUresult r = real(pctx, a...);                                     \
        if (r == CUDA_SUCCESS && pctx) track::note_context(*pctx, true);   \
        return r;                                                          \
      };                                                                   \
    }                                                                      \
  };
CUSNAP_CTX_CREATE_HOOK(cuCtxCreate)
CUSNAP_CTX_CREATE_HOOK(cuCtxCreate_v2)
CUSNAP_CTX_CREATE_HOOK(cuCtxCreate_v3)
CUSNAP_CTX_CREATE_HOOK(cuCtxCreate_v4)
#undef CUSNAP_CTX_CREATE_HOOK
#define CUSNAP_CTX_DESTROY_HOOK(entry)                    \
  template <>                                             \
  struct Hook<Entry::entry> {                             \
    static auto bind(decltype(&::entry) real) noexcept {  \
      return [real](CUcontext ctx) noexcept {             \
        track::note_context(ctx, false);                  \
        const track::ReapHold hold;                       \
        const auto goes = track::memory_of(ctx);          \
        const CUresult r = real(ctx);                     \
        cut::kernels_unloaded();                          \
        if (r == CUDA_SUCCESS) track::context_gone(goes); \
        return r;                                         \
      };                                                  \
    }                                                     \
  };
CUSNAP_CTX_DESTROY_HOOK(cuCtxDestroy)
CUSNAP_CTX_DESTROY_HOOK(cuCtxDestroy_v2)
#undef CUSNAP_CTX_DESTROY_HOOK

template <>
struct Hook<Entry::cuMulticastBindMem> {
  static auto bind(track::PfnBindMemV1 real) noexcept {
    return [real](auto mc, auto mco, auto mem, auto memo, auto size, auto flags) noexcept {
      return track::mc_bind_mem(real, nullptr, mc, -1, mco, mem, memo, size, flags);
    };
  }
};
template <>
struct Hook<Entry::cuMulticastBindMem_v2> {
  static auto bind(track::PfnBindMemV2 real) noexcept {
    return
        [real](auto mc, auto dev, auto mco, auto mem, auto memo, auto size, auto flags) noexcept {
          return track::mc_bind_mem(nullptr, real, mc, dev, mco, mem, memo, size, flags);
        };
  }
};
template <>
struct Hook<Entry::cuMulticastBindAddr> {
  static auto bind(track::PfnBindAddrV1 real) noexcept {
    return [real](auto mc, auto mco, auto ptr, auto size, auto flags) noexcept {
      return track::mc_bind_addr(real, nullptr, mc, -1, mco, ptr, size, flags);
    };
  }
};
template <>
struct Hook<Entry::cuMulticastBindAddr_v2> {
  static auto bind(track::PfnBindAddrV2 real) noexcept {
    return [real](auto mc, auto dev, auto mco, auto ptr, auto size, auto flags) noexcept {
      return track::mc_bind_addr(nullptr, real, mc, dev, mco, ptr, size, flags);
    };
  }
};

// Kernels going: the cut's cached verdicts on kernel handles are forgotten
// (cut.h), since a kernel loaded later may get the same handle. A primary
// context's release may be its last, which destroys it with its modules.
#define CUSNAP_UNLOAD_HOOK(entry)                        \
  template <>                                            \
  struct Hook<Entry::entry> {                            \
    static auto bind(decltype(&::entry) real) noexcept { \
      return [real](auto a) noexcept {                   \
        const CUresult r = real(a);                      \
        cut::kernels_unloaded();                         \
        return r;                                        \
      };                                                 \
    }                                                    \
  };
CUSNAP_UNLOAD_HOOK(cuModuleUnload)
CUSNAP_UNLOAD_HOOK(cuLibraryUnload)
#undef CUSNAP_UNLOAD_HOOK
// A primary context's reset, or its last release, destroys it: its kernels
// and, with the driver's, its cuMemAlloc blocks and IPC opens
// (track::context_gone).
#define CUSNAP_PRIMARY_GOES_HOOK(entry, reset)                          \
  template <>                                                           \
  struct Hook<Entry::entry> {                                           \
    static auto bind(decltype(&::entry) real) noexcept {                \
      return [real](CUdevice dev) noexcept {                            \
        const track::ReapHold hold;                                     \
        const auto goes = track::memory_of(track::active_primary(dev)); \
        const CUresult r = real(dev);                                   \
        cut::kernels_unloaded();                                        \
        if (r == CUDA_SUCCESS && !goes.empty() &&                       \
            (reset || track::active_primary(dev) == nullptr))           \
          track::context_gone(goes);                                    \
        return r;                                                       \
      };                                                                \
    }                                                                   \
  };
CUSNAP_PRIMARY_GOES_HOOK(cuDevicePrimaryCtxRelease, false)
CUSNAP_PRIMARY_GOES_HOOK(cuDevicePrimaryCtxRelease_v2, false)
CUSNAP_PRIMARY_GOES_HOOK(cuDevicePrimaryCtxReset, true)
CUSNAP_PRIMARY_GOES_HOOK(cuDevicePrimaryCtxReset_v2, true)
#undef CUSNAP_PRIMARY_GOES_HOOK

// Kernel launches: collective kernels go through the cut (cut.h), unless the
// stream captures them into a graph.
#define CUSNAP_LAUNCH_HOOK(entry, ptsz)                                                   \
  template <>                                                                           \
  struct Hook<Entry::entry> {                                                           \
    static auto bind(decltype(&::entry) real) noexcept {                                \
      return [real](CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,    \
                    unsigned by, unsigned bz, unsigned shmem, CUstream s, void** params, \
                    void** extra) noexcept {                                            \
        return cut::launch(f, s, ptsz, [&]() noexcept {                                 \
          return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);              \
        });                                                                             \
      };                                                                                \
    }                                                                                   \
  };
CUSNAP_LAUNCH_HOOK(cuLaunchKernel, false)
CUSNAP_LAUNCH_HOOK(cuLaunchKernel_ptsz, true)
#undef CUSNAP_LAUNCH_HOOK
#define CUSNAP_LAUNCH_EX_HOOK(entry, ptsz)                                               \
  template <>                                                                          \
  struct Hook<Entry::entry> {                                                          \
    static auto bind(decltype(&::entry) real) noexcept {                               \
      return [real](const CUlaunchConfig* c, CUfunction f, auto... a) noexcept {       \
        return cut::launch(f, c ? c->hStream : nullptr, ptsz,                          \
                           [&]() noexcept { return real(c, f, a...); });               \
      };                                                                               \
    }                                                                                  \
  };
CUSNAP_LAUNCH_EX_HOOK(cuLaunchKernelEx, false)
CUSNAP_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, true)
#undef CUSNAP_LAUNCH_EX_HOOK

// Graphs: an instance counts its graph's collective kernel nodes (graphs.h),
// and each launch of it goes through the cut with that many.
#define CUSNAP_INSTANTIATE_HOOK(entry)                                   \
  template <>                                                          \
  struct Hook<Entry::entry> {                                          \
    static auto bind(decltype(&::entry) real) noexcept {               \
      return [real](CUgraphExec* e, CUgraph g, auto... a) noexcept {   \
        const CUresult r = real(e, g, a...);                           \
        if (r == CUDA_SUCCESS && e) graphs::note_exec(*e, g);          \
        return r;                                                      \
      };                                                               \
    }                                                                  \
  };
CUSNAP_INSTANTIATE_HOOK(cuGraphInstantiate)
CUSNAP_INSTANTIATE_HOOK(cuGraphInstantiate_v2)
CUSNAP_INSTANTIATE_HOOK(cuGraphInstantiateWithFlags)
CUSNAP_INSTANTIATE_HOOK(cuGraphInstantiateWithParams)
CUSNAP_INSTANTIATE_HOOK(cuGraphInstantiateWithParams_ptsz)
#undef CUSNAP_INSTANTIATE_HOOK
#define CUSNAP_EXEC_UPDATE_HOOK(entry)                                   \
  template <>                                                          \
  struct Hook<Entry::entry> {                                          \
    static auto bind(decltype(&::entry) real) noexcept {               \
      return [real](CUgraphExec e, CUgraph g, auto... a) noexcept {    \
        const CUresult r = real(e, g, a...);                           \
        if (r == CUDA_SUCCESS) graphs::note_exec(e, g);                \
        return r;                                                      \
      };                                                               \
    }                                                                  \
  };
CUSNAP_EXEC_UPDATE_HOOK(cuGraphExecUpdate)
CUSNAP_EXEC_UPDATE_HOOK(cuGraphExecUpdate_v2)
#undef CUSNAP_EXEC_UPDATE_HOOK
template <>
struct Hook<Entry::cuGraphExecDestroy> {
  static auto bind(decltype(&::cuGraphExecDestroy) real) noexcept {
    return [real](CUgraphExec e) noexcept {
      // Forgotten first: once destroyed, its handle may name a new instance.
      graphs::forget_exec(e);
      return real(e);
    };
  }
};
#define CUSNAP_GRAPH_LAUNCH_HOOK(entry, ptsz)                            \
  template <>                                                            \
  struct Hook<Entry::entry> {                                            \
    static auto bind(decltype(&::entry) real) noexcept {                 \
      return [real](CUgraphExec e, CUstream s) noexcept {                \
        return cut::launch_graph(graphs::collectives_of(e), s, ptsz,     \
                                 [&]() noexcept { return real(e, s); }); \
      };                                                                 \
    }                                                                    \
  };
CUSNAP_GRAPH_LAUNCH_HOOK(cuGraphLaunch, false)
CUSNAP_GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz, true)
#undef CUSNAP_GRAPH_LAUNCH_HOOK

// Captures under way (captures.h): the shim makes no call a capture forbids.
#define CUSNAP_BEGIN_CAPTURE_HOOK(entry, ptsz)                          \
  template <>                                                           \
  struct Hook<Entry::entry> {                                           \
    static auto bind(decltype(&::entry) real) noexcept {                \
      return [real](CUstream s, auto... a) noexcept {                   \
        CUresult r = real(s, a...);                                     \
        if (r == CUDA_SUCCESS) captures::began(s, ptsz);                \
        return r;                                                       \
      };                                                                \
    }                                                                   \
  };
CUSNAP_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture, false)
CUSNAP_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture_ptsz, true)
CUSNAP_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture_v2, false)
CUSNAP_BEGIN_CAPTURE_HOOK(cuStreamBeginCapture_v2_ptsz, true)
CUSNAP_BEGIN_CAPTURE_HOOK(cuStreamBeginCaptureToGraph, false)
CUSNAP_BEGIN_CAPTURE_HOOK(cuStreamBeginCaptureToGraph_ptsz, true)
#undef CUSNAP_BEGIN_CAPTURE_HOOK
#define CUSNAP_END_CAPTURE_HOOK(entry, ptsz)                            \
  template <>                                                           \
  struct Hook<Entry::entry> {                                           \
    static auto bind(decltype(&::entry) real) noexcept {                \
      return [real](CUstream s, CUgraph* g) noexcept {                  \
        CUresult r = real(s, g);                                        \
        captures::ended(s, ptsz, r);                                    \
        return r;                                                       \
      };                                                                \
    }                                                                   \
  };
CUSNAP_END_CAPTURE_HOOK(cuStreamEndCapture, false)
CUSNAP_END_CAPTURE_HOOK(cuStreamEndCapture_ptsz, true)
#undef CUSNAP_END_CAPTURE_HOOK
#define CUSNAP_STREAM_DESTROY_HOOK(entry)                               \
  template <>                                                           \
  struct Hook<Entry::entry> {                                           \
    static auto bind(decltype(&::entry) real) noexcept {                \
      return [real](CUstream s) noexcept {                              \
        /* Forgotten first: once destroyed, its handle may name a new  \
           stream. */                                                   \
        captures::destroyed(s);                                         \
        return real(s);                                                 \
      };                                                                \
    }                                                                   \
  };
CUSNAP_STREAM_DESTROY_HOOK(cuStreamDestroy)
CUSNAP_STREAM_DESTROY_HOOK(cuStreamDestroy_v2)
#undef CUSNAP_STREAM_DESTROY_HOOK

}  // namespace cusnap::shim
