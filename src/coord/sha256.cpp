#include "coord/sha256.h"

#include "coord/hex.h"
#include "proto/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cusnap {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

std::atomic<bool> g_force_portable{false};

inline uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

void blocks_portable(uint32_t* h, const uint8_t* p, size_t n) {
  for (; n > 0; --n, p += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
             uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
#pragma GCC unroll 64
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 =
          hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
}

#if defined(__x86_64__)
// The SHA-NI round structure (Intel's published reference sequence): state
// held as ABEF/CDGH, four rounds per sha256rnds2 pair, message schedule by
// sha256msg1/msg2.
__attribute__((target("sha,sse4.1"))) void blocks_shani(uint32_t* h, const uint8_t* p, size_t n) {
  const __m128i kMask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[0]));
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&h[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);                // CDAB
  state1 = _mm_shuffle_epi32(state1, 0x1B);          // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);       // CDGH

  for (; n > 0; --n, p += 64) {
    const __m128i abef_save = state0, cdgh_save = state1;
    __m128i msg[4];
    for (int i = 0; i < 4; ++i)
      msg[i] =
          _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), kMask);
      // Fully unrolled so that msg[] lives in registers.
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      __m128i& cur = msg[r & 3];
      __m128i m = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kK[4 * r])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, m);
      m = _mm_shuffle_epi32(m, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, m);
      if (r < 12) {
        // Schedule words for round group r+4 into msg[r&3] from the four
        // previous groups: W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16].
        __m128i& next = msg[r & 3];
        __m128i w_m3 = msg[(r + 3) & 3];  // group r+3
        __m128i w_m2 = msg[(r + 2) & 3];  // group r+2
        __m128i w_m1 = msg[(r + 1) & 3];  // group r+1
        __m128i t = _mm_sha256msg1_epu32(next, w_m1);
        t = _mm_add_epi32(t, _mm_alignr_epi8(w_m3, w_m2, 4));
        next = _mm_sha256msg2_epu32(t, w_m3);
      }
    }
    state0 = _mm_add_epi32(state0, abef_save);
    state1 = _mm_add_epi32(state1, cdgh_save);
  }
  tmp = _mm_shuffle_epi32(state0, 0x1B);        // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);     // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);  // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);     // ABEF -> HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[0]), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&h[4]), state1);
}

bool cpu_has_sha() {
  static const bool has = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

}  // namespace

Sha256::Sha256() {
  static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(h_, kInit, sizeof h_);
}

void Sha256::force_portable(bool on) {
  g_force_portable = on;
}

bool Sha256::hardware_accelerated() {
#if defined(__x86_64__)
  return cpu_has_sha() && !g_force_portable;
#else
  return false;
#endif
}

void Sha256::blocks(const uint8_t* p, size_t nblocks) {
#if defined(__x86_64__)
  if (hardware_accelerated()) return blocks_shani(h_, p, nblocks);
#endif
  blocks_portable(h_, p, nblocks);
}

void Sha256::update(const void* data, size_t len) {
  auto* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (buf_len_ > 0) {
    size_t take = std::min(len, 64 - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    len -= take;
    if (buf_len_ < 64) return;
    blocks(buf_, 1);
    buf_len_ = 0;
  }
  if (len >= 64) {
    blocks(p, len / 64);
    p += len / 64 * 64;
    len %= 64;
  }
  std::memcpy(buf_, p, len);
  buf_len_ = len;
}

Sha256Digest Sha256::digest() {
  uint64_t bits = total_ * 8;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (buf_len_ < 56) ? 56 - buf_len_ : 120 - buf_len_;
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = uint8_t(bits >> (56 - 8 * i));
  update(pad, pad_len + 8);
  Sha256Digest out;
  for (int i = 0; i < 8; ++i)
    for (int b = 0; b < 4; ++b) out[4 * i + b] = uint8_t(h_[i] >> (24 - 8 * b));
  return out;
}

std::string Sha256::hex_digest() {
  return to_hex(digest());
}

std::string to_hex(const Sha256Digest& d) {
  return hex_encode(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

bool from_hex(std::string_view hex, Sha256Digest* d) {
  std::string bytes;
  if (hex.size() != 2 * d->size() || !hex_decode(hex, &bytes)) return false;
  std::copy(bytes.begin(), bytes.end(), d->begin());
  return true;
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data.data(), data.size());
  return h.hex_digest();
}

bool sha256_file(const std::string& path, std::string* hex, uint64_t* size, std::string* err) {
  const UniqueFd file(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file) {
    *err = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  constexpr size_t kChunk = 1 << 20;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunk]);
  Sha256 h;
  uint64_t total = 0;
  for (;;) {
    ssize_t n = read(file.get(), buf.get(), kChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = path + ": read failed: " + std::strerror(errno);
      return false;
    }
    if (n == 0) break;
    h.update(buf.get(), size_t(n));
    total += uint64_t(n);
  }
  *hex = h.hex_digest();
  if (size) *size = total;
  return true;
}

}  // namespace cusnap
