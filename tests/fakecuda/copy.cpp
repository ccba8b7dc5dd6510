// memcpy and memset families. Copies are synchronous, so Async forms complete
// before returning; _ptds/_ptsz forms behave like their plain forms. A copy
// first waits for the asynchronous kernels it is ordered after (kernels.cpp:
// those of its stream; for the NULL stream, those of every blocking stream).
// Copies and memsets are not captured: on a stream that captures into a graph
// (graphs.cpp) they fail CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate
// the capture.
#include "gate.h"
#include "memory.h"

#include <cstring>

using namespace fc;

namespace {

enum class Side { kHost, kDevice, kAny };

CUresult check_side(uintptr_t p, size_t n, Side side, bool write) {
  if (side == Side::kHost) return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (side == Side::kAny && !is_device_address(p))
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  return check_range(p, n, write);
}

CUresult copy(uintptr_t dst, Side ds, uintptr_t src, Side ss, size_t n, CUstream s) {
  FC_REQUIRE_INIT();
  if (CUresult r = stream_order(s, false)) return r;
  std::lock_guard<std::mutex> l(driver().mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = check_side(dst, n, ds, true)) return r;
  if (CUresult r = check_side(src, n, ss, false)) return r;
  memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}

template <typename T>
CUresult fill2d(uintptr_t dst, size_t pitch, T value, size_t width, size_t height, CUstream s) {
  FC_REQUIRE_INIT();
  if (CUresult r = stream_order(s, false)) return r;
  std::lock_guard<std::mutex> l(driver().mu);
  if (!valid_ctx(reinterpret_cast<CUcontext>(current_ctx()))) return CUDA_ERROR_INVALID_CONTEXT;
  if (!valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (dst % sizeof(T) || (height > 1 && (pitch % sizeof(T) || pitch < width * sizeof(T))))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t row = 0; row < height; ++row) {
    uintptr_t p = dst + row * pitch;
    if (CUresult r = check_range(p, width * sizeof(T), true)) return r;
    T* t = reinterpret_cast<T*>(p);
    if (sizeof(T) == 1) {
      memset(t, static_cast<int>(value), width);
    } else {
      for (size_t i = 0; i < width; ++i) t[i] = value;
    }
  }
  return CUDA_SUCCESS;
}

constexpr CUstream kSync = nullptr;

}  // namespace

#define FC_H(p) reinterpret_cast<uintptr_t>(p)

// Host to device.
FC_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) {
  FC_ENTER("cuMemcpyHtoD");
  return copy(d, Side::kDevice, FC_H(h), Side::kHost, n, kSync);
}
FC_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void* h, size_t n) {
  FC_ENTER("cuMemcpyHtoD");
  return copy(d, Side::kDevice, FC_H(h), Side::kHost, n, kSync);
}
FC_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr_v1 d, const void* h, unsigned int n) {
  FC_ENTER("cuMemcpyHtoD");
  return copy(d, Side::kDevice, FC_H(h), Side::kHost, n, kSync);
}
FC_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyHtoDAsync");
  return copy(d, Side::kDevice, FC_H(h), Side::kHost, n, s);
}
FC_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyHtoDAsync");
  return copy(d, Side::kDevice, FC_H(h), Side::kHost, n, s);
}
FC_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 d, const void* h, unsigned int n, CUstream s) {
  FC_ENTER("cuMemcpyHtoDAsync");
  return copy(d, Side::kDevice, FC_H(h), Side::kHost, n, s);
}

// Device to host.
FC_EXPORT CUresult cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) {
  FC_ENTER("cuMemcpyDtoH");
  return copy(FC_H(h), Side::kHost, d, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void* h, CUdeviceptr d, size_t n) {
  FC_ENTER("cuMemcpyDtoH");
  return copy(FC_H(h), Side::kHost, d, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyDtoH(void* h, CUdeviceptr_v1 d, unsigned int n) {
  FC_ENTER("cuMemcpyDtoH");
  return copy(FC_H(h), Side::kHost, d, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyDtoHAsync");
  return copy(FC_H(h), Side::kHost, d, Side::kDevice, n, s);
}
FC_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void* h, CUdeviceptr d, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyDtoHAsync");
  return copy(FC_H(h), Side::kHost, d, Side::kDevice, n, s);
}
FC_EXPORT CUresult cuMemcpyDtoHAsync(void* h, CUdeviceptr_v1 d, unsigned int n, CUstream s) {
  FC_ENTER("cuMemcpyDtoHAsync");
  return copy(FC_H(h), Side::kHost, d, Side::kDevice, n, s);
}

// Device to device.
FC_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s_, size_t n) {
  FC_ENTER("cuMemcpyDtoD");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s_, size_t n) {
  FC_ENTER("cuMemcpyDtoD");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyDtoD(CUdeviceptr_v1 d, CUdeviceptr_v1 s_, unsigned int n) {
  FC_ENTER("cuMemcpyDtoD");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyDtoDAsync");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, s);
}
FC_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyDtoDAsync");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, s);
}
FC_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr_v1 d, CUdeviceptr_v1 s_, unsigned int n,
                                     CUstream s) {
  FC_ENTER("cuMemcpyDtoDAsync");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, s);
}

// Unified addressing: either side may be host or device.
FC_EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s_, size_t n) {
  FC_ENTER("cuMemcpy");
  return copy(d, Side::kAny, s_, Side::kAny, n, kSync);
}
FC_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s_, size_t n) {
  FC_ENTER("cuMemcpy");
  return copy(d, Side::kAny, s_, Side::kAny, n, kSync);
}
FC_EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyAsync");
  return copy(d, Side::kAny, s_, Side::kAny, n, s);
}
FC_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s) {
  FC_ENTER("cuMemcpyAsync");
  return copy(d, Side::kAny, s_, Side::kAny, n, s);
}
FC_EXPORT CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext, CUdeviceptr s_, CUcontext, size_t n) {
  FC_ENTER("cuMemcpyPeer");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr d, CUcontext, CUdeviceptr s_, CUcontext,
                                     size_t n) {
  FC_ENTER("cuMemcpyPeer");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, kSync);
}
FC_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext, CUdeviceptr s_, CUcontext, size_t n,
                                     CUstream s) {
  FC_ENTER("cuMemcpyPeerAsync");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, s);
}
FC_EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr d, CUcontext, CUdeviceptr s_, CUcontext,
                                          size_t n, CUstream s) {
  FC_ENTER("cuMemcpyPeerAsync");
  return copy(d, Side::kDevice, s_, Side::kDevice, n, s);
}

// Memset: 1-D forms are the 2-D ones with one row.
FC_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  FC_ENTER("cuMemsetD8");
  return fill2d<uint8_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) {
  FC_ENTER("cuMemsetD8");
  return fill2d<uint8_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD8(CUdeviceptr_v1 d, unsigned char v, unsigned int n) {
  FC_ENTER("cuMemsetD8");
  return fill2d<uint8_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  FC_ENTER("cuMemsetD8Async");
  return fill2d<uint8_t>(d, 0, v, n, 1, s);
}
FC_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  FC_ENTER("cuMemsetD8Async");
  return fill2d<uint8_t>(d, 0, v, n, 1, s);
}
FC_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
  FC_ENTER("cuMemsetD16");
  return fill2d<uint16_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) {
  FC_ENTER("cuMemsetD16");
  return fill2d<uint16_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD16(CUdeviceptr_v1 d, unsigned short v, unsigned int n) {
  FC_ENTER("cuMemsetD16");
  return fill2d<uint16_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  FC_ENTER("cuMemsetD16Async");
  return fill2d<uint16_t>(d, 0, v, n, 1, s);
}
FC_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  FC_ENTER("cuMemsetD16Async");
  return fill2d<uint16_t>(d, 0, v, n, 1, s);
}
FC_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) {
  FC_ENTER("cuMemsetD32");
  return fill2d<uint32_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) {
  FC_ENTER("cuMemsetD32");
  return fill2d<uint32_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD32(CUdeviceptr_v1 d, unsigned int v, unsigned int n) {
  FC_ENTER("cuMemsetD32");
  return fill2d<uint32_t>(d, 0, v, n, 1, kSync);
}
FC_EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  FC_ENTER("cuMemsetD32Async");
  return fill2d<uint32_t>(d, 0, v, n, 1, s);
}
FC_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  FC_ENTER("cuMemsetD32Async");
  return fill2d<uint32_t>(d, 0, v, n, 1, s);
}
FC_EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) {
  FC_ENTER("cuMemsetD2D8");
  return fill2d<uint8_t>(d, p, v, w, h, kSync);
}
FC_EXPORT CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t p, unsigned char v, size_t w,
                                        size_t h) {
  FC_ENTER("cuMemsetD2D8");
  return fill2d<uint8_t>(d, p, v, w, h, kSync);
}
FC_EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h,
                                     CUstream s) {
  FC_ENTER("cuMemsetD2D8Async");
  return fill2d<uint8_t>(d, p, v, w, h, s);
}
FC_EXPORT CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t p, unsigned char v, size_t w,
                                          size_t h, CUstream s) {
  FC_ENTER("cuMemsetD2D8Async");
  return fill2d<uint8_t>(d, p, v, w, h, s);
}
FC_EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) {
  FC_ENTER("cuMemsetD2D16");
  return fill2d<uint16_t>(d, p, v, w, h, kSync);
}
FC_EXPORT CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t p, unsigned short v, size_t w,
                                         size_t h) {
  FC_ENTER("cuMemsetD2D16");
  return fill2d<uint16_t>(d, p, v, w, h, kSync);
}
FC_EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h,
                                      CUstream s) {
  FC_ENTER("cuMemsetD2D16Async");
  return fill2d<uint16_t>(d, p, v, w, h, s);
}
FC_EXPORT CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t p, unsigned short v, size_t w,
                                           size_t h, CUstream s) {
  FC_ENTER("cuMemsetD2D16Async");
  return fill2d<uint16_t>(d, p, v, w, h, s);
}
FC_EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) {
  FC_ENTER("cuMemsetD2D32");
  return fill2d<uint32_t>(d, p, v, w, h, kSync);
}
FC_EXPORT CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t p, unsigned int v, size_t w,
                                         size_t h) {
  FC_ENTER("cuMemsetD2D32");
  return fill2d<uint32_t>(d, p, v, w, h, kSync);
}
FC_EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h,
                                      CUstream s) {
  FC_ENTER("cuMemsetD2D32Async");
  return fill2d<uint32_t>(d, p, v, w, h, s);
}
FC_EXPORT CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t p, unsigned int v, size_t w,
                                           size_t h, CUstream s) {
  FC_ENTER("cuMemsetD2D32Async");
  return fill2d<uint32_t>(d, p, v, w, h, s);
}
