#include "proto/shim_messages.h"

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
