// Chunked SHA-256 of checkpoint files, hashed on every core.
//
// A file of S bytes is cut into chunks of C bytes, the last one shorter; an
// empty file has no chunks. Its digest is
//
//   SHA-256( SHA-256(chunk 0) || SHA-256(chunk 1) || ... )
//
// over the 32-byte binary chunk digests. The manifest records S, C, the chunk
// digests and this digest. With S and C fixed the chunk count is fixed and
// the concatenation parses one way only, so two different files with the same
// S and C and the same digest would need a SHA-256 collision: as strong as one
// SHA-256 over the whole file, and every byte is covered. Chunks hash in
// parallel, and the result does not depend on the number of threads.
//
// Recomputed with standard tools (C = 67108864):
//   split -b C --filter='sha256sum | head -c 64 | xxd -r -p' FILE | sha256sum
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coord/sha256.h"

namespace cusnap {

/// Chunk size of the files cusnap writes.
inline constexpr uint64_t kHashChunkSize = uint64_t(64) << 20;
/// Chunk sizes a manifest may give: powers of two in this range.
inline constexpr uint64_t kMinHashChunkSize = 4096;
inline constexpr uint64_t kMaxHashChunkSize = uint64_t(1) << 30;
/// Upper bound of the default thread count (CUSNAP_HASH_THREADS may go up to
/// kMaxHashThreadsEnv).
inline constexpr unsigned kMaxHashThreads = 32;
inline constexpr unsigned kMaxHashThreadsEnv = 256;

/// True for a chunk size a manifest may give.
constexpr bool valid_chunk_size(uint64_t chunk_size) {
  return chunk_size >= kMinHashChunkSize && chunk_size <= kMaxHashChunkSize &&
         (chunk_size & (chunk_size - 1)) == 0;
}
/// Chunks of a file of size bytes: ceil(size / chunk_size); chunk_size > 0.
constexpr uint64_t chunk_count(uint64_t size, uint64_t chunk_size) {
  return size / chunk_size + (size % chunk_size != 0);
}
/// The file digest from its chunk digests, in order.
Sha256Digest chunked_root(const std::vector<Sha256Digest>& chunks);

/// Threads to hash with: `value` (of CUSNAP_HASH_THREADS) when neither
/// nullptr nor empty (1 to kMaxHashThreadsEnv), else the hardware's threads
/// up to kMaxHashThreads. False, with a message naming the variable, for
/// anything else.
bool hash_thread_count(const char* value, unsigned* n, std::string* err);
/// The same with this process's CUSNAP_HASH_THREADS.
bool hash_thread_count(unsigned* n, std::string* err);

/// One file to hash: its first size bytes in chunks of chunk_size.
struct HashTarget {
  std::string path;
  uint64_t size = 0;
  uint64_t chunk_size = kHashChunkSize;  ///< a valid_chunk_size()
};

/// The chunked digest of one file.
struct ChunkedDigest {
  std::vector<Sha256Digest> chunks;
  Sha256Digest root{};
};

struct HashOptions {
  /// 0: hash_thread_count(). Never more threads than chunks.
  unsigned threads = 0;
  /// Bytes hashed so far, called from the calling thread about every 200 ms
  /// and once at the end; may be empty.
  std::function<void(uint64_t bytes_done)> progress;
  /// Asked from the calling thread about every 200 ms: true ends the hashing
  /// (the call fails with *err "cancelled"; each thread stops after its
  /// current read). May be empty.
  std::function<bool()> cancelled;
};

/// Hashes every target, all chunks of all files on one pool of threads
/// (largest chunks first), each reading its chunk with pread into a buffer
/// of its own. A file shorter than its size, or one that cannot be opened
/// (symbolic links are not followed) or read, fails the whole call: the first
/// error is returned, naming the path, and the remaining chunks are skipped.
/// out gets one entry per target, in order.
bool sha256_chunked_files(const std::vector<HashTarget>& targets, const HashOptions& opts,
                          std::vector<ChunkedDigest>* out, std::string* err);

}  // namespace cusnap
