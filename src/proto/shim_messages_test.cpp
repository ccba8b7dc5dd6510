#include "proto/shim_messages.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "proto/wire.h"

using namespace cusnap::proto;

namespace {
/// CutRequest as it was before hold_ms.
struct OldCutRequest {
  std::string op;
  uint64_t target = 0;
  MSGPACK_DEFINE_MAP(op, target);
};
/// ShimRecords as they were before the blocks left to the driver.
struct EarlierRecords {
  uint32_t format = kShimRecordsFormat;
  int64_t pid = 4;
  uint64_t start_time = 5;
  std::vector<AllocationRecord> allocations;
  std::vector<MappingRecord> mappings;
  std::vector<IpcRecord> ipc;
  std::vector<MulticastRecord> multicast;
  uint64_t foreign_imports_alive = 1, foreign_imports_total = 2, sharing_calls = 3;
  MSGPACK_DEFINE_MAP(format, pid, start_time, allocations, mappings, ipc, multicast,
                     foreign_imports_alive, foreign_imports_total, sharing_calls);
};
}  // namespace

TEST_SUITE("proto.shim_messages") {
  TEST_CASE("tickets: exact size, magic, version, creator, socket path") {
    Ticket t{};
    memcpy(t.magic, kTicketMagic, sizeof(t.magic));
    t.version = kTicketVersion;
    t.size = sizeof(t);
    t.creator_pid = 42;
    t.creator_start = 7;
    t.allocation = 3;
    snprintf(t.socket, sizeof(t.socket), "/run/x/shim-peer.42.sock");
    Ticket out;
    std::string err;
    CHECK(ticket_valid(&t, sizeof(t), &out, &err));
    CHECK(out.allocation == 3);
    CHECK_FALSE(ticket_valid(&t, sizeof(t) - 1, &out, &err));
    unsigned char big[sizeof(Ticket) + 1] = {};
    memcpy(big, &t, sizeof(t));
    CHECK_FALSE(ticket_valid(big, sizeof(big), &out, &err));
    Ticket b = t;
    b.magic[0] = 'X';
    CHECK_FALSE(ticket_valid(&b, sizeof(b), &out, &err));
    b = t;
    b.version = 2;
    CHECK_FALSE(ticket_valid(&b, sizeof(b), &out, &err));
    b = t;
    b.allocation = 0;
    CHECK_FALSE(ticket_valid(&b, sizeof(b), &out, &err));
    b = t;
    memset(b.socket, 'a', sizeof(b.socket));  // no NUL
    CHECK_FALSE(ticket_valid(&b, sizeof(b), &out, &err));
    b = t;
    snprintf(b.socket, sizeof(b.socket), "relative.sock");
    CHECK_FALSE(ticket_valid(&b, sizeof(b), &out, &err));
  }

  TEST_CASE("records round-trip through the wire format") {
    ShimRecords r;
    r.pid = 9;
    r.start_time = 100;
    r.allocations.push_back({1, "created", 9, 100, 1, 2 << 20, 0, 1, true, false});
    r.mappings.push_back({0x7000, 2 << 20, 0, 1, 0, {{1, 0, 3}}});
    r.ipc.push_back({0x9000, 2 << 20, 1, 2});
    MulticastRecord m;
    m.handle = 5;
    m.devices = {0, 1, 2};
    m.bindings.push_back({1, 2, 0, 1, 0, 0, 2 << 20});
    r.multicast.push_back(m);
    r.foreign_imports_alive = 1;
    Message msg;
    std::string err;
    REQUIRE(decode_body(encode_body(kMsgShimRecords, r), &msg, &err));
    ShimRecords back;
    REQUIRE(msg.get(&back, &err));
    CHECK(back.format == kShimRecordsFormat);
    CHECK(back.allocations.size() == 1);
    CHECK(back.allocations[0].origin == "created");
    CHECK(back.mappings[0].access[0] == AccessRecord{1, 0, 3});
    CHECK(back.multicast[0].devices == std::vector<int32_t>{0, 1, 2});
    CHECK(back.multicast[0].bindings[0].abi == 2);
    CHECK(back.foreign_imports_alive == 1);
  }

  TEST_CASE("records are checked beyond their types: origins, sizes, wrapping ranges") {
    ShimRecords r;
    r.pid = 9;
    r.allocations.push_back({1, "created", 9, 100, 1, 2 << 20, 0, 1, true, false});
    r.allocations.push_back({2, "imported", 8, 50, 4, 2 << 20, 0, 1, false, false});
    r.allocations.push_back({3, "foreign", 0, 0, 0, 4096, 0, 1, false, false});
    r.mappings.push_back({0x7000, 2 << 20, 0, 1, 0, {}});
    r.ipc.push_back({0x9000, 2 << 20, 1, 2});
    MulticastRecord m;
    m.handle = 5;
    m.size = 2 << 20;
    m.bindings.push_back({1, 2, 0, 1, 0, 0, 2 << 20});
    r.multicast.push_back(m);
    std::string why;
    REQUIRE(records_valid(r, &why));

    ShimRecords bad = r;
    bad.allocations[1].origin = "borrowed";
    CHECK_FALSE(records_valid(bad, &why));
    CHECK(why == "allocation 2 has the unknown origin 'borrowed'");
    bad = r;
    bad.allocations[0].size = kMaxRecordBytes + 1;  // summed into a copy's deadline
    CHECK_FALSE(records_valid(bad, &why));
    CHECK(why.find("allocation 1 has the size 281474976710657") == 0);
    bad = r;
    bad.mappings[0].address = UINT64_MAX - 4096;
    CHECK_FALSE(records_valid(bad, &why));
    CHECK(why.find("wraps around") != std::string::npos);
    bad = r;
    bad.mappings[0].offset = UINT64_MAX;
    CHECK_FALSE(records_valid(bad, &why));
    bad = r;
    bad.ipc[0].size = UINT64_MAX;
    CHECK_FALSE(records_valid(bad, &why));
    CHECK(why.find("the IPC mapping") == 0);
    bad = r;
    bad.multicast[0].bindings[0].mc_offset = UINT64_MAX - 1;
    CHECK_FALSE(records_valid(bad, &why));
    CHECK(why == "a binding of multicast object 5 wraps around or is too large");
    bad = r;
    bad.multicast[0].size = UINT64_MAX;
    CHECK_FALSE(records_valid(bad, &why));
    // The reason a block was left to the driver, said again by cusnap.
    bad = r;
    bad.driver_block_why = "cuMemCreate gave 2";
    CHECK(records_valid(bad, &why));
    bad.driver_block_why = "cuMemCreate\n\x1b[2J";
    CHECK_FALSE(records_valid(bad, &why));
    CHECK(why.find("not a short printable line") != std::string::npos);
    bad.driver_block_why = std::string(kMaxDriverBlockWhy + 1, 'x');
    CHECK_FALSE(records_valid(bad, &why));
  }

  TEST_CASE("records of an earlier shim, without the blocks left to the driver, are read") {
    // The fields the earlier records had, as a map: the later ones keep their defaults.
    Message msg;
    std::string err;
    REQUIRE(decode_body(encode_body(kMsgShimRecords, EarlierRecords{}), &msg, &err));
    ShimRecords back;
    REQUIRE(msg.get(&back, &err));
    CHECK(back.pid == 4);
    CHECK(back.sharing_calls == 3);
    CHECK(back.driver_blocks == 0);
    CHECK(back.driver_ipc_exports == 0);
    CHECK(back.driver_block_why.empty());
    CHECK(back.tailed_blocks == 0);
  }

  TEST_CASE("cut requests: hold_ms is optional both ways (protocol version 1)") {
    // A request of an older client (no hold_ms) is read as hold_ms 0.
    Message msg;
    std::string err;
    REQUIRE(decode_body(encode_body(kMsgShimCut, OldCutRequest{"arm", 7}), &msg, &err));
    CutRequest now;  // default-made, as the shim reads a request
    REQUIRE(msg.get(&now, &err));
    CHECK(now.op == "arm");
    CHECK(now.target == 7);
    CHECK(now.hold_ms == 0);
    // An older shim reads a request that carries it, ignoring the field.
    CutRequest req;
    req.op = "arm";
    req.hold_ms = 45000;
    REQUIRE(decode_body(encode_body(kMsgShimCut, req), &msg, &err));
    OldCutRequest old;
    REQUIRE(msg.get(&old, &err));
    CHECK(old.op == "arm");
    CutRequest back;
    REQUIRE(msg.get(&back, &err));
    CHECK(back.hold_ms == 45000);
  }

  TEST_CASE("socket names") {
    CHECK(shim_peer_socket("/r", 5) == "/r/shim-peer.5.sock");
    CHECK(shim_control_socket("/r", 5) == "/r/shim-ctl.5.sock");
  }
}
