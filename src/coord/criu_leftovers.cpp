#include "coord/criu_leftovers.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstring>

#include "coord/procs.h"
#include "proto/unique_fd.h"

namespace cusnap {

namespace {

// A UUID as CRIU prints it (uuid_unparse): 8-4-4-4-12 hexadecimal digits.
bool is_uuid(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

// libnftables' entry points (nftables/libnftables.h, API 1: libnftables.so.1).
struct Nft {
  void* lib = nullptr;
  void* (*ctx_new)(uint32_t) = nullptr;
  void (*ctx_free)(void*) = nullptr;
  int (*buffer_output)(void*) = nullptr;
  int (*buffer_error)(void*) = nullptr;
  const char* (*error_buffer)(void*) = nullptr;
  int (*run)(void*, const char*) = nullptr;

  bool load(const std::string& criu_path, std::string* err) {
    // The system's, else one beside the CRIU that made the table (a CRIU
    // installed with its libraries: BIN/../lib, as scripts/gpu-bundle.sh
    // lays it out).
    std::string tried = "libnftables.so.1";
    lib = ::dlopen("libnftables.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !criu_path.empty()) {
      const size_t slash = criu_path.rfind('/');
      const std::string dir = slash == std::string::npos ? "." : criu_path.substr(0, slash);
      const std::string beside = dir + "/../lib/libnftables.so.1";
      if (::access(beside.c_str(), F_OK) == 0) {
        lib = ::dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
        tried += " or " + beside;
      }
    }
    if (!lib) {
      const char* e = ::dlerror();
      *err = "cannot load " + tried + ": " + (e ? e : "unknown error");
      return false;
    }
    ctx_new = reinterpret_cast<decltype(ctx_new)>(::dlsym(lib, "nft_ctx_new"));
    ctx_free = reinterpret_cast<decltype(ctx_free)>(::dlsym(lib, "nft_ctx_free"));
    buffer_output =
        reinterpret_cast<decltype(buffer_output)>(::dlsym(lib, "nft_ctx_buffer_output"));
    buffer_error = reinterpret_cast<decltype(buffer_error)>(::dlsym(lib, "nft_ctx_buffer_error"));
    error_buffer =
        reinterpret_cast<decltype(error_buffer)>(::dlsym(lib, "nft_ctx_get_error_buffer"));
    run = reinterpret_cast<decltype(run)>(::dlsym(lib, "nft_run_cmd_from_buffer"));
    if (!ctx_new || !ctx_free || !buffer_output || !buffer_error || !error_buffer || !run) {
      *err = "libnftables.so.1 lacks the functions of its API 1";
      return false;
    }
    return true;
  }
  ~Nft() {
    if (lib) ::dlclose(lib);
  }
};

}  // namespace

std::string criu_run_id_from_log(std::string_view text) {
  constexpr std::string_view kKey = "CRIU run id = ";
  for (size_t at = text.find(kKey); at != std::string_view::npos; at = text.find(kKey, at + 1)) {
    // "Dump CRIU run id = " (a restore naming the dump's id) is not this run's.
    if (at >= 5 && text.substr(at - 5, 5) == "Dump ") continue;
    const std::string_view id = text.substr(at + kKey.size(), 36);
    if (is_uuid(id)) return std::string(id);
  }
  return {};
}

std::string criu_run_id(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) return {};
  std::string text(1 << 20, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  text.resize(got);
  return criu_run_id_from_log(text);
}

std::vector<std::string> criu_nft_tables(const std::string& run_id) {
  // CRIU (4.1) writes the name into a 32-byte buffer ("inet CRIU-%s"), which
  // keeps 21 of the id's 36 characters; a CRIU with a larger buffer would
  // use all of them.
  const std::string full = "CRIU-" + run_id;
  return {full.substr(0, 31 - 5), full};
}

bool remove_criu_nft_table(const std::string& run_id, const std::string& criu_path,
                           std::string* removed, std::string* err) {
  removed->clear();
  if (!is_uuid(run_id)) {
    // (Appended piece by piece: GCC 12 at -O3 warns, wrongly, of an overlap
    // in "\"" + run_id.substr(...) + ...)
    err->assign(1, '"').append(run_id, 0, 64).append("\" is not a CRIU run id");
    return false;
  }
  Nft nft;
  if (!nft.load(criu_path, err)) return false;
  void* ctx = nft.ctx_new(0);
  if (!ctx) {
    *err = "libnftables could not make a context";
    return false;
  }
  nft.buffer_output(ctx);  // quiet: its messages are read, not printed
  nft.buffer_error(ctx);
  bool ok = true;
  for (const std::string& name : criu_nft_tables(run_id)) {
    const std::string cmd = "delete table inet " + name;
    if (nft.run(ctx, cmd.c_str()) == 0) {
      *removed = "inet " + name;
      break;
    }
    const char* text = nft.error_buffer(ctx);  // (which also empties it)
    std::string msg = text ? text : "";
    if (msg.find("No such file or directory") != std::string::npos) continue;  // not this one
    if (size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    *err = "nft " + cmd + ": " + (msg.empty() ? "failed" : msg);
    ok = false;
    break;
  }
  nft.ctx_free(ctx);
  return ok;
}

size_t tcp_repair_off(const std::vector<pid_t>& pids) {
  size_t n = 0;
  for (pid_t pid : pids)
    for_each_tcp_socket(pid, [&](const std::string&, int fd) {
      tcp_repair_window w{};
      socklen_t len = sizeof w;
      if (::getsockopt(fd, IPPROTO_TCP, TCP_REPAIR_WINDOW, &w, &len) != 0) return;  // not in repair
      const int off = 0;  // TCP_REPAIR_OFF: and a window probe to the peer
      if (::setsockopt(fd, IPPROTO_TCP, TCP_REPAIR, &off, sizeof off) == 0) ++n;
    });
  return n;
}

std::string lift_criu_network_lock(const std::vector<pid_t>& pids, const std::string& method,
                                   const std::string& log_path, const std::string& criu_path) {
  std::string out;
  auto line = [&](const std::string& s) { out += (out.empty() ? "" : "\n") + s; };
  // The table first, so that the window probes of the sockets get through.
  if (method == "nftables") {
    const std::string id = criu_run_id(log_path);
    std::string why;
    std::string removed;
    if (id.empty() && ::access(log_path.c_str(), F_OK) != 0)
      ;  // CRIU did not start: it locked nothing
    else if (id.empty())
      line("warning: CRIU's log " + log_path +
           " names no run id, so its nftables table \"inet CRIU-<run id>\", which drops the "
           "job's TCP connections, may be left: list it with `nft list tables` and remove it "
           "with `nft delete table inet CRIU-...`");
    else if (!remove_criu_nft_table(id, criu_path, &removed, &why))
      line("warning: CRIU's nftables table that drops the job's TCP connections is left: " + why +
           "; remove it with `nft delete table inet " + criu_nft_tables(id).front() + "`");
    else if (!removed.empty())
      line("CRIU's network lock (nftables table " + removed + ") removed");
  } else if (method == "iptables") {
    line(
        "warning: CRIU's iptables rules that drop the job's TCP connections (mark 0xC114) may be "
        "left: see `iptables -S` and `ip6tables -S`");
  }
  if (const size_t n = tcp_repair_off(pids); n > 0)
    line(std::to_string(n) + " TCP socket(s) of the job taken out of repair mode");
  return out;
}

}  // namespace cusnap
