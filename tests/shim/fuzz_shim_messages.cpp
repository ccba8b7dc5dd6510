// libFuzzer harness for what the shim reads from other processes: ticket
// contents (proto::ticket_valid) and every message a shim's sockets accept or
// an importer receives (decode_body, then conversion to each shim message).
// Built with clang (tests/shim/CMakeLists.txt, label fuzz); run for a bounded
// time by CTest.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proto/control.h"
#include "proto/shim_messages.h"
#include "proto/wire.h"

using namespace cusnap::proto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Ticket t;
  std::string err;
  if (ticket_valid(data, size, &t, &err)) {
    // A valid ticket names a creator and a NUL-terminated absolute path.
    if (t.creator_pid <= 0 || t.socket[0] != '/') __builtin_trap();
  }
  Message m;
  if (!decode_body(std::string_view(reinterpret_cast<const char*>(data), size), &m, &err))
    return 0;
  FetchRequest f;
  FetchReply r;
  GateRequest g;
  GateOpen go;
  Done d;
  ShimRecords s;
  Empty e;
  (void)m.get(&f, &err);
  (void)m.get(&r, &err);
  (void)m.get(&g, &err);
  (void)m.get(&go, &err);
  (void)m.get(&d, &err);
  (void)m.get(&e, &err);
  if (m.get(&s, &err)) {
    // What decodes re-encodes and decodes to the same records.
    Message again;
    if (!decode_body(encode_body(kMsgShimRecords, s), &again, &err)) __builtin_trap();
    ShimRecords s2;
    if (!again.get(&s2, &err) || s2.allocations.size() != s.allocations.size() ||
        s2.mappings.size() != s.mappings.size())
      __builtin_trap();
  }
  return 0;
}
