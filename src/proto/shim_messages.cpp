#include "proto/shim_messages.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace cusnap::proto {

std::string format_gpu_uuid(const unsigned char b[16]) {
  char s[64];
  std::snprintf(s, sizeof s,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return s;
}

std::string shim_peer_socket(const std::string& runtime_dir, int64_t pid) {
  return runtime_dir + "/shim-peer." + std::to_string(pid) + ".sock";
}

std::string shim_control_socket(const std::string& runtime_dir, int64_t pid) {
  return runtime_dir + "/shim-ctl." + std::to_string(pid) + ".sock";
}

namespace {

/// A range [start, start + size) of at most kMaxRecordBytes that does not wrap.
bool range_fits(uint64_t start, uint64_t size) {
  return size <= kMaxRecordBytes && start <= UINT64_MAX - size;
}

}  // namespace

bool records_valid(const ShimRecords& r, std::string* why) {
  for (const AllocationRecord& a : r.allocations) {
    const std::string who = "allocation " + std::to_string(a.id);
    if (a.origin != "created" && a.origin != "imported" && a.origin != "foreign") {
      *why = who + " has the unknown origin '" + a.origin.substr(0, 32) + "'";
      return false;
    }
    if (a.size > kMaxRecordBytes) {
      *why = who + " has the size " + std::to_string(a.size) + ", past " +
             std::to_string(kMaxRecordBytes);
      return false;
    }
  }
  for (const MappingRecord& m : r.mappings)
    if (!range_fits(m.address, m.size) || !range_fits(m.offset, m.size)) {
      *why = "the mapping at " + std::to_string(m.address) + " of " + std::to_string(m.size) +
             " bytes (offset " + std::to_string(m.offset) + ") wraps around or is too large";
      return false;
    }
  for (const IpcRecord& m : r.ipc)
    if (!range_fits(m.address, m.size)) {
      *why = "the IPC mapping at " + std::to_string(m.address) + " of " + std::to_string(m.size) +
             " bytes wraps around or is too large";
      return false;
    }
  // A line of the shim's words, said again by cusnap: short, printable ASCII.
  if (r.driver_block_why.size() > kMaxDriverBlockWhy ||
      !std::all_of(r.driver_block_why.begin(), r.driver_block_why.end(),
                   [](char c) { return c >= 0x20 && c < 0x7f; })) {
    *why = "the reason a block was left to the driver is not a short printable line";
    return false;
  }
  for (const MulticastRecord& m : r.multicast) {
    if (m.size > kMaxRecordBytes) {
      *why = "multicast object " + std::to_string(m.handle) + " has the size " +
             std::to_string(m.size) + ", past " + std::to_string(kMaxRecordBytes);
      return false;
    }
    for (const McBindingRecord& b : m.bindings)
      if (!range_fits(b.mc_offset, b.size) || !range_fits(b.mem_offset, b.size) ||
          !range_fits(b.address, b.size)) {
        *why = "a binding of multicast object " + std::to_string(m.handle) +
               " wraps around or is too large";
        return false;
      }
  }
  return true;
}

bool ticket_valid(const void* data, size_t n, Ticket* out, std::string* err) {
  if (n != sizeof(Ticket)) {
    *err = "ticket has " + std::to_string(n) + " bytes, expected " + std::to_string(sizeof(Ticket));
    return false;
  }
  std::memcpy(out, data, sizeof(Ticket));
  if (std::memcmp(out->magic, kTicketMagic, sizeof(kTicketMagic)) != 0) {
    *err = "ticket has a bad magic";
    return false;
  }
  if (out->version != kTicketVersion || out->size != sizeof(Ticket)) {
    *err = "ticket version " + std::to_string(out->version) + " is not supported";
    return false;
  }
  if (out->creator_pid <= 0 || out->allocation == 0) {
    *err = "ticket names no creator";
    return false;
  }
  if (std::memchr(out->socket, 0, sizeof(out->socket)) == nullptr || out->socket[0] != '/') {
    *err = "ticket's socket path is malformed";
    return false;
  }
  return true;
}

}  // namespace cusnap::proto
