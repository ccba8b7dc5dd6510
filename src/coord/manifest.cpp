#include "coord/manifest.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "coord/criu_leftovers.h"
#include "coord/file_read.h"
#include "coord/procs.h"
#include "coord/runtime_dir.h"  // kMaxJobJsonBytes
#include "coord/sha256.h"
#include "proto/json_text.h"
#include "proto/shim_messages.h"  // kMaxParts
#include "proto/unique_fd.h"      // write_all

#ifndef CUSNAP_VERSION
#define CUSNAP_VERSION "0.0.0"
#endif

namespace cusnap {
namespace fs = std::filesystem;
using nlohmann::json;

std::string cusnap_version() {
  return CUSNAP_VERSION;
}

static_assert(kMaxJobRecordBytes + (size_t(128) << 10) <= kMaxJobJsonBytes,
              "a job's record leaves job.json room for its name and directories");

bool job_record_fits(const std::vector<std::string>& argv, const std::string& cwd,
                     std::string* err) {
  // As job.json lays them out (json_text, indent 2): "  \"cwd\": ...,\n",
  // "  \"argv\": [\n", each argument on a line of its own ("    ...,\n"), "  ],\n".
  size_t n = 12 + json_text(json(cwd)).size() + 16;
  for (const std::string& a : argv) n += 6 + json_text(json(a)).size();
  if (n <= kMaxJobRecordBytes) return true;
  *err = "job.argv and job.cwd take " + std::to_string(n) +
         " bytes as the job's record (job.json) holds them, more than " +
         std::to_string(kMaxJobRecordBytes) + ": cusnap ps could not list the job";
  return false;
}

std::vector<std::string> used_gpus(const Manifest& m) {
  std::vector<std::string> used;
  for (const ManifestProcess& p : m.processes)
    if (p.uses_cuda)
      for (const std::string& u : p.gpus)
        if (std::find(used.begin(), used.end(), u) == used.end()) used.push_back(u);
  return used;
}

std::string shim_records_file(pid_t pid) {
  return "shim/" + std::to_string(pid) + ".records";
}

std::string shared_memory_file(pid_t pid, uint64_t id, uint32_t k) {
  return "shared/" + std::to_string(pid) + "-" + std::to_string(id) + "." + std::to_string(k) +
         ".bin";
}

namespace {

/// The text of a manifest's JSON as cusnap writes it: keys sorted (nlohmann's
/// object), indented by 2, a newline at the end.
std::string manifest_text(const json& j) {
  return json_text(j, 2) + "\n";
}

/// The SHA-256 of a manifest's JSON without its own (manifest_sha256), as
/// hex. (Sha256, not sha256_hex: the fuzzer of the parser links a stand-in
/// of it, and never writes or reads a manifest file.)
std::string content_sha256(json j) {
  j.erase(kManifestSha256Field);
  const std::string text = manifest_text(j);
  Sha256 h;
  h.update(text.data(), text.size());
  return h.hex_digest();
}

json manifest_json(const Manifest& m) {
  json j;
  j["format"] = "cusnap-checkpoint";
  j["version"] = m.version;
  j["created"] = m.created;
  j["cusnap_version"] = m.cusnap_version;
  j["job"] = {{"name", m.job.name},
              {"argv", m.job.argv},
              {"cwd", m.job.cwd},
              {"owner_uid", m.job.owner_uid},
              {"root_pid", m.job.root_pid},
              {"stdout_pipe", m.job.stdout_pipe_id},
              {"stderr_pipe", m.job.stderr_pipe_id},
              {"shim_dir", m.job.shim_dir}};
  j["processes"] = json::array();
  for (const ManifestProcess& p : m.processes) {
    json jp = {{"pid", p.pid},         {"ppid", p.ppid},           {"exe", p.exe},
               {"cmdline", p.cmdline}, {"uses_cuda", p.uses_cuda}, {"gpus", p.gpus}};
    if (!p.gpu_memory.empty()) jp["gpu_memory"] = p.gpu_memory;
    j["processes"].push_back(jp);
  }
  j["driver"] = {{"version", m.driver_version}, {"path", m.driver_path}};
  j["gpus"] = json::array();
  for (const GpuDevice& g : m.gpus)
    j["gpus"].push_back(
        {{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}, {"total_mem", g.total_mem}});
  j["criu"] = {{"version", m.criu_version}, {"path", m.criu_path}};
  if (!m.criu_run_id.empty()) j["criu"]["run_id"] = m.criu_run_id;
  if (!m.criu_network_lock.empty()) j["criu"]["network_lock"] = m.criu_network_lock;
  j["files"] = json::array();
  for (const ManifestFile& f : m.files)
    j["files"].push_back({{"path", f.path},
                          {"size", f.size},
                          {"chunk_size", f.chunk_size},
                          {"sha256", f.sha256},
                          {"chunks", f.chunks}});
  j["phases"] = json::array();
  for (const auto& [name, secs] : m.phases)
    j["phases"].push_back({{"name", name}, {"seconds", secs}});
  j["leave_running"] = m.leave_running;
  if (m.tcp_established) j["tcp_established"] = true;
  if (!m.gpu_free.empty()) j["gpu_free"] = m.gpu_free;
  if (!m.tcp_listeners.empty()) {
    json& ls = j["tcp_listeners"] = json::array();
    for (const TcpListener& l : m.tcp_listeners) {
      json e = {{"family", l.family},
                {"addr", l.addr},
                {"port", l.port},
                {"reuseport", l.reuseport},
                {"reuseaddr", l.reuseaddr}};
      if (l.family == 6) e["v6only"] = l.v6only;
      ls.push_back(std::move(e));
    }
  }
  j["shim_processes"] = m.shim_processes;
  return j;
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  return manifest_text(manifest_json(m));
}

std::string manifest_content_sha256(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  return j.is_discarded() || !j.is_object() ? "" : content_sha256(j);
}

namespace {

/// A bound on a string's bytes, and what it is for the message: "F is N
/// bytes long, more than WHAT (MAX bytes)" (WHAT null: "more than MAX bytes").
struct Bound {
  size_t max;
  const char* what;
};
constexpr Bound kText{kMaxManifestTextBytes, nullptr};
constexpr Bound kPath{kMaxManifestPathBytes, "a path can be"};
constexpr Bound kArgument{kMaxArgumentBytes, "an argument can be"};
constexpr Bound kCommandLine{kMaxCommandLineBytes, "a command line can be"};

std::string too_long(const std::string& field, size_t n, const Bound& b) {
  return field + " is " + std::to_string(n) + " bytes long, more than " +
         (b.what ? std::string(b.what) + " (" + std::to_string(b.max) + " bytes)"
                 : std::to_string(b.max) + " bytes");
}

// Strict field access: each getter fails with the field's path when the key
// is missing or has another type, or a string is longer than its bound.
struct Reader {
  std::string* err;
  bool ok = true;

  const json* field(const json& obj, const std::string& where, const char* key) {
    if (!ok) return nullptr;
    if (!obj.is_object() || !obj.contains(key)) {
      fail(where + "." + key + " is missing");
      return nullptr;
    }
    return &obj.at(key);
  }
  void fail(const std::string& what) {
    if (ok) *err = "manifest field " + what;
    ok = false;
  }
  void str(const json& obj, const std::string& where, const char* key, std::string* out,
           const Bound& bound = kText) {
    const json* v = field(obj, where, key);
    if (!v) return;
    if (!v->is_string()) return fail(where + "." + key + " is not a string");
    const std::string& text = v->get_ref<const std::string&>();
    if (text.size() > bound.max) return fail(too_long(dotted(where, key), text.size(), bound));
    *out = text;
  }
  template <typename T>
  void num(const json& obj, const std::string& where, const char* key, T* out) {
    const json* v = field(obj, where, key);
    if (!v) return;
    if (!v->is_number_integer()) return fail(where + "." + key + " is not an integer");
    if (v->is_number_unsigned()) {
      *out = T(v->get<uint64_t>());
      if (uint64_t(*out) != v->get<uint64_t>()) fail(where + "." + key + " is out of range");
    } else {
      *out = T(v->get<int64_t>());
      if (int64_t(*out) != v->get<int64_t>()) fail(where + "." + key + " is out of range");
    }
  }
  void boolean(const json& obj, const std::string& where, const char* key, bool* out) {
    const json* v = field(obj, where, key);
    if (!v) return;
    if (!v->is_boolean()) return fail(where + "." + key + " is not true or false");
    *out = v->get<bool>();
  }
  /// Each element within `each`; with `total`, all of them with a NUL after
  /// each (as a command line) within it.
  void strings(const json& obj, const std::string& where, const char* key,
               std::vector<std::string>* out, const Bound& each = kText,
               const Bound* total = nullptr) {
    const json* v = field(obj, where, key);
    if (!v) return;
    if (!v->is_array()) return fail(where + "." + key + " is not an array");
    out->clear();
    size_t sum = 0;
    for (const json& e : *v) {
      if (!e.is_string()) return fail(where + "." + key + " has an element that is not a string");
      const std::string& text = e.get_ref<const std::string&>();
      if (text.size() > each.max)
        return fail(too_long(dotted(where, key) + "[" + std::to_string(out->size()) + "]",
                             text.size(), each));
      sum += text.size() + 1;
      out->push_back(text);
    }
    if (total && sum > total->max) fail(too_long(dotted(where, key), sum, *total));
  }
  static std::string dotted(const std::string& where, const char* key) {
    return where.empty() ? key : where + "." + key;
  }
  const json* array(const json& obj, const std::string& where, const char* key) {
    const json* v = field(obj, where, key);
    if (v && !v->is_array()) {
      fail(where + "." + key + " is not an array");
      return nullptr;
    }
    return v;
  }
};

bool safe_relative_path(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  for (const auto& part : fs::path(p))
    if (part == ".." || part == ".") return false;
  return true;
}

bool is_hex_digest(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

/// An object of GPU UUIDs and byte counts at `where` (a process's
/// gpu_memory, gpu_free), each at most kMaxGpuMemoryBytes.
void read_gpu_bytes(Reader& r, const json& g, const std::string& where, GpuUse* out) {
  if (!g.is_object()) return r.fail(where + " is not an object");
  for (auto it = g.begin(); r.ok && it != g.end(); ++it) {
    const std::string& uuid = it.key();
    if (uuid.size() > kMaxManifestTextBytes)
      r.fail(where + " has a key of " + std::to_string(uuid.size()) + " bytes, more than " +
             std::to_string(kMaxManifestTextBytes) + " bytes");
    else if (!uuid.starts_with("GPU-") || !it.value().is_number_unsigned())
      r.fail(where + "." + uuid + " is not a GPU UUID with a byte count");
    else if (it.value().get<uint64_t>() > kMaxGpuMemoryBytes)
      r.fail(where + "." + uuid + " is " + std::to_string(it.value().get<uint64_t>()) +
             " bytes, more device memory than a GPU has (at most " +
             std::to_string(kMaxGpuMemoryBytes) + ")");
    else
      (*out)[uuid] = it.value().get<uint64_t>();
  }
}

/// A decimal number written as std::to_string writes it (no sign, no
/// leading zero) at the front of text; its end in *end.
template <typename T>
bool leading_number(std::string_view text, T* out, size_t* end) {
  size_t n = 0;
  uint64_t v = 0;
  for (; n < text.size() && text[n] >= '0' && text[n] <= '9'; ++n) {
    const uint64_t digit = uint64_t(text[n] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - digit) / 10) return false;
    v = v * 10 + digit;
  }
  if (n == 0 || (n > 1 && text[0] == '0') || v > uint64_t(std::numeric_limits<T>::max()))
    return false;
  *out = T(v);
  *end = n;
  return true;
}

/// What the restore reads by name from the manifest is among its files, and
/// the files under shim/ and shared/ are those it reads: a shim process's
/// records, and the parts of its shared allocations' bytes, from 0 on.
void check_references(Reader& r, const Manifest& m) {
  std::set<std::string> listed;
  for (const ManifestFile& f : m.files) listed.insert(f.path);
  std::set<pid_t> cuda, shims;
  for (const ManifestProcess& p : m.processes)
    if (p.uses_cuda) cuda.insert(p.pid);
  for (size_t i = 0; r.ok && i < m.shim_processes.size(); ++i) {
    const pid_t pid = m.shim_processes[i];
    const std::string w = "shim_processes[" + std::to_string(i) + "]: ",
                      process = "process " + std::to_string(pid);
    if (!shims.insert(pid).second)
      r.fail(w + process + " is listed twice");
    else if (!cuda.count(pid))
      r.fail(w + process + " is none of the processes that use CUDA");
    else if (!listed.count(shim_records_file(pid)))
      r.fail(w + "the records of " + process + ", " + shim_records_file(pid) +
             ", are not among the checkpoint's files");
  }
  for (size_t i = 0; r.ok && i < m.files.size(); ++i) {
    const std::string& path = m.files[i].path;
    const std::string w = "files[" + std::to_string(i) + "].path " + path;
    const bool records = path.starts_with("shim/"), bytes = path.starts_with("shared/");
    if (!records && !bytes) continue;
    std::string_view rest = std::string_view(path).substr(records ? 5 : 7);
    pid_t pid = 0;
    uint64_t id = 0;
    uint32_t k = 0;
    size_t n = 0;
    bool named = leading_number(rest, &pid, &n) && pid > 0;
    if (named && records) {
      named = rest.substr(n) == ".records";
    } else if (named) {
      rest.remove_prefix(n);
      named = rest.starts_with("-") && leading_number(rest.substr(1), &id, &n);
      if (named) rest.remove_prefix(1 + n);
      named = named && rest.starts_with(".") && leading_number(rest.substr(1), &k, &n) &&
              k < proto::kMaxParts && rest.substr(1 + n) == ".bin";
    }
    if (!named)
      r.fail(w + " is not a file cusnap writes there");
    else if (!shims.count(pid))
      r.fail(w + " is the " + (records ? "records" : "memory") + " of process " +
             std::to_string(pid) + ", which is not among shim_processes");
    else if (bytes && k > 0 && !listed.count(shared_memory_file(pid, id, k - 1)))
      r.fail(w + ": the part before it, " + shared_memory_file(pid, id, k - 1) +
             ", is not among the checkpoint's files");
  }
}

// "tcp_listeners" (optional): each one's family, an address of that family
// and a port a socket can listen on.
void read_tcp_listeners(Reader& r, const json& j, std::vector<TcpListener>* out) {
  const json* ls = r.array(j, "", "tcp_listeners");
  if (!ls) return;
  out->clear();
  if (ls->size() > kMaxTcpListeners)
    return r.fail("tcp_listeners has " + std::to_string(ls->size()) + " elements, more than " +
                  std::to_string(kMaxTcpListeners));
  for (size_t i = 0; r.ok && i < ls->size(); ++i) {
    const json& e = (*ls)[i];
    const std::string w = "tcp_listeners[" + std::to_string(i) + "]";
    TcpListener l;
    int port = 0;
    r.num(e, w, "family", &l.family);
    r.str(e, w, "addr", &l.addr);
    r.num(e, w, "port", &port);
    r.boolean(e, w, "reuseport", &l.reuseport);
    r.boolean(e, w, "reuseaddr", &l.reuseaddr);
    if (r.ok && e.contains("v6only")) r.boolean(e, w, "v6only", &l.v6only);
    if (!r.ok) return;
    unsigned char buf[sizeof(in6_addr)];
    if (l.family != 4 && l.family != 6)
      r.fail(w + ".family " + std::to_string(l.family) + " is not 4 or 6");
    else if (inet_pton(l.family == 6 ? AF_INET6 : AF_INET, l.addr.c_str(), buf) != 1)
      r.fail(w + ".addr \"" + l.addr + "\" is not an IPv" + std::to_string(l.family) + " address");
    else if (port < 1 || port > 65535)
      r.fail(w + ".port " + std::to_string(port) + " is not a port (1 to 65535)");
    else if (l.family == 4 && e.contains("v6only"))
      r.fail(w + ".v6only is for family 6 only");
    l.port = static_cast<uint16_t>(port);
    out->push_back(l);
  }
}

}  // namespace

namespace {

constexpr const char* kNotJson = "manifest is not valid JSON (truncated or corrupted)";

/// A manifest's own SHA-256 (manifest_sha256), checked before anything of
/// its content is read: that of the text manifest_to_json writes for what
/// was parsed, without the field. Absent, a manifest of this version is
/// incomplete; one of an earlier version (2, 3) was written without it and
/// is read as before; any other the parser refuses by its version.
bool check_own_sha256(const json& j, std::string* err) {
  if (!j.is_object()) return true;  // the parser says what it is
  // A version this cusnap does not read (a later one may hold its digest
  // otherwise) is refused by the parser for its version, not as altered.
  const auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer() || *v < 2 || *v > kManifestVersion) return true;
  const auto it = j.find(kManifestSha256Field);
  if (it == j.end()) {
    if (*v != kManifestVersion) return true;  // written before it had one
    *err = std::string("manifest field ") + kManifestSha256Field + " is missing: a version " +
           std::to_string(kManifestVersion) +
           " manifest holds its own SHA-256, so this one is incomplete or was altered";
    return false;
  }
  if (!it->is_string() || !is_hex_digest(it->get_ref<const std::string&>())) {
    *err = std::string("manifest field ") + kManifestSha256Field +
           " is not 64 lowercase hex digits: the manifest was altered or corrupted";
    return false;
  }
  if (content_sha256(j) != it->get_ref<const std::string&>()) {
    *err = std::string(
               "the manifest was altered or corrupted after cusnap wrote it: its content does "
               "not match its own SHA-256 (") +
           kManifestSha256Field + "); restore from an intact copy";
    return false;
  }
  return true;
}

/// manifest_from_json of what was parsed.
bool manifest_from_parsed(const json& j, Manifest* m, std::string* err);

}  // namespace

bool manifest_from_json(const std::string& text, Manifest* m, std::string* err) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    *err = kNotJson;
    return false;
  }
  return manifest_from_parsed(j, m, err);
}

namespace {

bool manifest_from_parsed(const json& j, Manifest* m, std::string* err) {
  if (!j.is_object() || !j.contains("format") || j["format"] != "cusnap-checkpoint") {
    *err = "manifest is not a cusnap checkpoint manifest (no \"format\": \"cusnap-checkpoint\")";
    return false;
  }
  Reader r{err};
  r.num(j, "", "version", &m->version);
  if (r.ok && (m->version < 2 || m->version > kManifestVersion)) {
    std::string writer;
    if (j.contains("cusnap_version") && j["cusnap_version"].is_string() &&
        j["cusnap_version"].get_ref<const std::string&>().size() <= 64)
      writer = " (written by cusnap " + j["cusnap_version"].get<std::string>() + ")";
    *err = "manifest version " + std::to_string(m->version) + writer +
           " is not supported: this cusnap " + cusnap_version() + " reads versions 2 to " +
           std::to_string(kManifestVersion) + "; restore it with the cusnap that wrote it";
    return false;
  }
  r.str(j, "", "created", &m->created);
  r.str(j, "", "cusnap_version", &m->cusnap_version);
  if (const json* job = r.field(j, "", "job")) {
    r.str(*job, "job", "name", &m->job.name);
    r.strings(*job, "job", "argv", &m->job.argv, kArgument);
    r.str(*job, "job", "cwd", &m->job.cwd, kPath);
    r.num(*job, "job", "owner_uid", &m->job.owner_uid);
    r.num(*job, "job", "root_pid", &m->job.root_pid);
    r.str(*job, "job", "stdout_pipe", &m->job.stdout_pipe_id);
    r.str(*job, "job", "stderr_pipe", &m->job.stderr_pipe_id);
    // Optional in version 2, whose first manifests were written without it:
    // empty, the shims' sockets are in the restored job's runtime directory.
    m->job.shim_dir.clear();
    if (m->version >= 3 || job->contains("shim_dir"))
      r.str(*job, "job", "shim_dir", &m->job.shim_dir, kPath);
    // The restored job's record: one ps could not read would hide the job.
    if (std::string why; r.ok && !job_record_fits(m->job.argv, m->job.cwd, &why)) r.fail(why);
  }
  if (const json* procs = r.array(j, "", "processes")) {
    m->processes.clear();
    std::set<pid_t> pids;
    GpuUse per_gpu;  // the processes' use added up, per GPU
    for (size_t i = 0; r.ok && i < procs->size(); ++i) {
      std::string w = "processes[" + std::to_string(i) + "]";
      ManifestProcess p;
      r.num((*procs)[i], w, "pid", &p.pid);
      r.num((*procs)[i], w, "ppid", &p.ppid);
      r.str((*procs)[i], w, "exe", &p.exe, kPath);
      r.strings((*procs)[i], w, "cmdline", &p.cmdline, kCommandLine, &kCommandLine);
      r.boolean((*procs)[i], w, "uses_cuda", &p.uses_cuda);
      r.strings((*procs)[i], w, "gpus", &p.gpus);
      if (r.ok && (*procs)[i].contains("gpu_memory"))
        read_gpu_bytes(r, (*procs)[i]["gpu_memory"], w + ".gpu_memory", &p.gpu_memory);
      for (auto it = p.gpu_memory.begin(); r.ok && it != p.gpu_memory.end(); ++it)
        if ((per_gpu[it->first] += it->second) > kMaxGpuMemoryBytes)
          r.fail(w + ".gpu_memory." + it->first + ": the processes' use of " + it->first +
                 " adds up to more device memory than a GPU has (at most " +
                 std::to_string(kMaxGpuMemoryBytes) + ")");
      if (r.ok && p.pid <= 0) r.fail(w + ".pid is not a process id");
      if (r.ok && !pids.insert(p.pid).second)
        r.fail(w + ".pid " + std::to_string(p.pid) + " is listed twice");
      m->processes.push_back(p);
    }
    if (r.ok && m->processes.empty()) r.fail("processes is empty");
    if (r.ok && m->processes[0].pid != m->job.root_pid)
      r.fail("processes[0].pid is not job.root_pid");
  }
  if (const json* d = r.field(j, "", "driver")) {
    r.num(*d, "driver", "version", &m->driver_version);
    r.str(*d, "driver", "path", &m->driver_path, kPath);
  }
  if (const json* gpus = r.array(j, "", "gpus")) {
    m->gpus.clear();
    for (size_t i = 0; r.ok && i < gpus->size(); ++i) {
      std::string w = "gpus[" + std::to_string(i) + "]";
      GpuDevice g;
      r.num((*gpus)[i], w, "index", &g.index);
      r.str((*gpus)[i], w, "name", &g.name);
      r.str((*gpus)[i], w, "uuid", &g.uuid);
      r.num((*gpus)[i], w, "total_mem", &g.total_mem);
      if (r.ok && g.total_mem > kMaxGpuMemoryBytes)
        r.fail(w + ".total_mem is " + std::to_string(g.total_mem) +
               " bytes, more device memory than a GPU has (at most " +
               std::to_string(kMaxGpuMemoryBytes) + ")");
      m->gpus.push_back(g);
    }
  }
  if (const json* c = r.field(j, "", "criu")) {
    r.str(*c, "criu", "version", &m->criu_version);
    r.str(*c, "criu", "path", &m->criu_path, kPath);
    if (r.ok && c->contains("run_id")) r.str(*c, "criu", "run_id", &m->criu_run_id);
    // inspect puts it in an nft command line to paste: nothing else taken.
    if (r.ok && !m->criu_run_id.empty() && !is_criu_run_id(m->criu_run_id))
      r.fail("criu.run_id is not a CRIU run id (a UUID, 8-4-4-4-12 hexadecimal digits)");
    if (r.ok && c->contains("network_lock"))
      r.str(*c, "criu", "network_lock", &m->criu_network_lock);
  }
  if (const json* files = r.array(j, "", "files")) {
    m->files.clear();
    std::set<std::string> seen;
    for (size_t i = 0; r.ok && i < files->size(); ++i) {
      std::string w = "files[" + std::to_string(i) + "]";
      ManifestFile f;
      r.str((*files)[i], w, "path", &f.path, kPath);
      r.num((*files)[i], w, "size", &f.size);
      r.num((*files)[i], w, "chunk_size", &f.chunk_size);
      r.str((*files)[i], w, "sha256", &f.sha256);
      r.strings((*files)[i], w, "chunks", &f.chunks);
      if (!r.ok) break;
      if (!safe_relative_path(f.path) || f.path == kManifestName)
        r.fail(w + ".path \"" + f.path + "\" is not a relative path inside the checkpoint");
      else if (!seen.insert(f.path).second)
        r.fail(w + ".path \"" + f.path + "\" is listed twice");
      else if (!is_hex_digest(f.sha256))
        r.fail(w + ".sha256 is not 64 lowercase hex digits");
      else if (!valid_chunk_size(f.chunk_size))
        r.fail(w + ".chunk_size " + std::to_string(f.chunk_size) + " is not a power of two from " +
               std::to_string(kMinHashChunkSize) + " to " + std::to_string(kMaxHashChunkSize));
      else if (f.chunks.size() != chunk_count(f.size, f.chunk_size))
        r.fail(w + ".chunks has " + std::to_string(f.chunks.size()) + " digests; size " +
               std::to_string(f.size) + " in chunks of " + std::to_string(f.chunk_size) +
               " needs " + std::to_string(chunk_count(f.size, f.chunk_size)));
      else if (!std::all_of(f.chunks.begin(), f.chunks.end(), is_hex_digest))
        r.fail(w + ".chunks has an element that is not 64 lowercase hex digits");
      m->files.push_back(f);
    }
  }
  if (const json* ph = r.array(j, "", "phases")) {
    m->phases.clear();
    for (size_t i = 0; r.ok && i < ph->size(); ++i) {
      std::string w = "phases[" + std::to_string(i) + "]";
      std::string name;
      r.str((*ph)[i], w, "name", &name);
      const json* s = r.field((*ph)[i], w, "seconds");
      if (s && !s->is_number()) r.fail(w + ".seconds is not a number");
      if (r.ok) m->phases.emplace_back(name, s->get<double>());
    }
  }
  r.boolean(j, "", "leave_running", &m->leave_running);
  if (j.contains("tcp_established")) r.boolean(j, "", "tcp_established", &m->tcp_established);
  m->gpu_free.clear();
  if (r.ok && j.contains("gpu_free")) read_gpu_bytes(r, j["gpu_free"], "gpu_free", &m->gpu_free);
  if (j.contains("tcp_listeners")) read_tcp_listeners(r, j, &m->tcp_listeners);
  // Version 3: the processes whose shims hold released shared memory.
  m->shim_processes.clear();
  if (m->version >= 3) {
    if (const json* sp = r.array(j, "", "shim_processes")) {
      for (size_t i = 0; r.ok && i < sp->size(); ++i) {
        if (!(*sp)[i].is_number_integer() || (*sp)[i].get<int64_t>() <= 0 ||
            (*sp)[i].get<int64_t>() > 4194304)
          r.fail("shim_processes[" + std::to_string(i) + "] is not a process id");
        else
          m->shim_processes.push_back(static_cast<pid_t>((*sp)[i].get<int64_t>()));
      }
    } else if (r.ok) {
      r.fail("shim_processes is missing");
    }
  }
  if (r.ok) check_references(r, *m);
  return r.ok;
}

}  // namespace

bool write_manifest(const std::string& dir, const Manifest& m, std::string* err) {
  std::string final_path = dir + "/" + kManifestName;
  std::string tmp = final_path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    *err = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  // With its own SHA-256, over the text without it: the reader serializes
  // what it parsed without it the same way (check_own_sha256).
  json j = manifest_json(m);
  j[kManifestSha256Field] = content_sha256(j);
  const std::string text = manifest_text(j);
  bool ok = write_all(fd, text.data(), text.size()) && fsync(fd) == 0;
  int saved = errno;
  if (close(fd) != 0 && ok) {  // the first failure is the one told
    ok = false;
    saved = errno;
  }
  if (!ok) {
    *err = "cannot write " + tmp + ": " + std::strerror(saved);
    unlink(tmp.c_str());
    return false;
  }
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    *err = "cannot rename " + tmp + " to " + final_path + ": " + std::strerror(errno);
    unlink(tmp.c_str());
    return false;
  }
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || fsync(dfd) != 0) {
    *err = "cannot fsync the directory " + dir + ": " + std::strerror(errno);
    if (dfd >= 0) close(dfd);
    return false;
  }
  close(dfd);
  return true;
}

namespace {

/// The largest manifest read: its file list and chunk digests take some
/// kilobytes per gigabyte checkpointed.
constexpr off_t kMaxManifestBytes = off_t(256) << 20;

/// Reads a manifest: a regular file (a FIFO or a device would stall or never
/// end) of at most kMaxManifestBytes. false with *err naming the problem,
/// and *missing set when there is no such file.
bool read_manifest_file(const std::string& path, std::string* text, int* error_number,
                        std::string* err) {
  return read_file_bounded(path, {.max_bytes = size_t(kMaxManifestBytes), .kind = "a manifest"},
                           text, err, error_number);
}

/// Whether errno e, of a failed stat, open or read of a checkpoint's
/// directory or manifest, is this reader's failure (it may not read it, the
/// file system failed) rather than the checkpoint's (nothing there, or not
/// a file).
bool reader_failure(int e) {
  return e != 0 && e != ENOENT && e != ENOTDIR && e != ELOOP && e != ENXIO && e != ENODEV;
}

}  // namespace

bool read_manifest_coded(const std::string& dir, Manifest* m, ExitCode* code, std::string* err,
                         int* error_number) {
  *code = kExitBadCheckpoint;
  int ignored = 0;
  int& e = error_number ? *error_number : ignored;
  e = 0;
  struct stat dst;
  if (::stat(dir.c_str(), &dst) != 0) {
    e = errno;
    if (reader_failure(e)) *code = kExitFailure;
    *err = e == ENOENT ? dir + " is not a checkpoint directory: it does not exist"
                       : "cannot reach " + dir + ": " + std::strerror(e);
    return false;
  }
  if (!S_ISDIR(dst.st_mode)) {
    *err = dir + " is not a checkpoint directory: it is not a directory";
    return false;
  }
  std::string path = dir + "/" + kManifestName;
  std::string text;
  if (!read_manifest_file(path, &text, &e, err)) {
    if (e == ENOENT)
      *err = dir + " has no " + kManifestName +
             ": it is not a checkpoint or the checkpoint did not finish";
    if (reader_failure(e)) *code = kExitFailure;
    return false;
  }
  // Its own SHA-256 first: nothing of a manifest changed after it was
  // written (a digit of a pid, of a GPU's free memory) is trusted.
  const json j = json::parse(text, nullptr, false);
  std::string why = kNotJson;
  if (j.is_discarded() || !check_own_sha256(j, &why) || !manifest_from_parsed(j, m, &why)) {
    *err = path + ": " + why;
    return false;
  }
  *code = kExitOk;
  return true;
}

bool read_manifest(const std::string& dir, Manifest* m, std::string* err) {
  ExitCode code;
  return read_manifest_coded(dir, m, &code, err);
}

}  // namespace cusnap
