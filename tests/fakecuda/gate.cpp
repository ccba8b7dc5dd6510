// The checkpoint gate and environment-driven fault injection.
#include "gate.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

namespace fc {

Gate& gate() {
  static Gate* g = new Gate;  // never destroyed: entry points may run at exit
  return *g;
}

namespace {

thread_local int t_depth = 0;

struct Faults {
  std::mutex mu;
  bool parsed = false;
  bool log = false;
  std::string fail_file;                            // FAKECUDA_FAIL_FILE, "%p" not yet replaced
  std::map<std::string, std::map<long, int>> fail;  // base -> nth -> error
  std::map<std::string, long> delay_ms;
  std::map<std::string, long> calls;
};

Faults& faults() {
  static Faults* f = new Faults;
  return *f;
}

// Splits "a:b:c,d:e" into items of fields.
std::vector<std::vector<std::string>> split_spec(const char* spec) {
  std::vector<std::vector<std::string>> items;
  if (!spec) return items;
  std::string s(spec);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    std::vector<std::string> fields;
    size_t fp = 0;
    while (fp <= item.size()) {
      size_t colon = item.find(':', fp);
      fields.push_back(
          item.substr(fp, colon == std::string::npos ? std::string::npos : colon - fp));
      if (colon == std::string::npos) break;
      fp = colon + 1;
    }
    if (!item.empty()) items.push_back(fields);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return items;
}

void parse_locked(Faults& f) {
  if (f.parsed) return;
  f.parsed = true;
  const char* log = getenv("FAKECUDA_LOG");
  f.log = log && strcmp(log, "0") != 0 && *log;
  const char* fail_file = getenv("FAKECUDA_FAIL_FILE");
  f.fail_file = fail_file ? fail_file : "";
  for (auto& it : split_spec(getenv("FAKECUDA_FAIL"))) {
    if (it.size() != 3) continue;
    f.fail[it[0]][strtol(it[1].c_str(), nullptr, 10)] =
        static_cast<int>(strtol(it[2].c_str(), nullptr, 10));
  }
  for (auto& it : split_spec(getenv("FAKECUDA_DELAY"))) {
    if (it.size() != 2) continue;
    f.delay_ms[it[0]] = strtol(it[1].c_str(), nullptr, 10);
  }
}

}  // namespace

void faults_before_fork() {
  faults().mu.lock();
}
void faults_after_fork() {
  faults().mu.unlock();
}

void faults_reload() {
  Faults& f = faults();
  std::lock_guard<std::mutex> l(f.mu);
  f.parsed = false;
  f.fail_file.clear();
  f.fail.clear();
  f.delay_ms.clear();
  f.calls.clear();
}

/// FAKECUDA_FAIL_FILE ("%p" stands for the pid): when that file holds a
/// line, its "name:N:code,...\n" arms faults counted from now (the Nth call
/// of name from here on), and the file is removed. Lets a test fail a call at
/// a moment of its choosing in a running process. The file is taken only
/// once its line has ended: a writer creates it before it writes (a shell's
/// `echo SPEC >FILE`), and a call that read it in between would remove it
/// with no fault armed. Precondition: f.mu held.
void arm_from_file(Faults& f) {
  if (f.fail_file.empty()) return;
  std::string path = f.fail_file;
  size_t p = path.find("%p");
  if (p != std::string::npos) path.replace(p, 2, std::to_string(getpid()));
  FILE* in = fopen(path.c_str(), "re");
  if (!in) return;
  constexpr size_t kMaxSpec = 1 << 16;
  std::string spec;
  char buf[4096];
  for (size_t n; spec.size() < kMaxSpec && (n = fread(buf, 1, sizeof buf, in)) > 0;)
    spec.append(buf, n);
  fclose(in);
  const size_t end = spec.find('\n');
  if (end == std::string::npos) return;  // not written whole yet
  unlink(path.c_str());
  spec.resize(end);
  for (auto& it : split_spec(spec.c_str())) {
    if (it.size() != 3) continue;
    long nth = strtol(it[1].c_str(), nullptr, 10);
    f.fail[it[0]][f.calls[it[0]] + nth] = static_cast<int>(strtol(it[2].c_str(), nullptr, 10));
  }
}

CUresult fault_for(const char* base, bool logged) {
  Faults& f = faults();
  long delay = 0;
  int err = 0;
  bool log = false;
  long n = 0;
  {
    std::lock_guard<std::mutex> l(f.mu);
    parse_locked(f);
    arm_from_file(f);
    log = f.log && logged;
    if (!f.fail.empty() || !f.delay_ms.empty()) {
      n = ++f.calls[base];
      auto fi = f.fail.find(base);
      if (fi != f.fail.end()) {
        auto e = fi->second.find(n);
        if (e != fi->second.end()) err = e->second;
      }
      auto di = f.delay_ms.find(base);
      if (di != f.delay_ms.end()) delay = di->second;
    }
  }
  if (log)
    fprintf(stderr, "fakecuda[%d]: %s%s\n", static_cast<int>(getpid()), base,
            err ? " (injected failure)" : "");
  if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  return static_cast<CUresult>(err);
}

GateGuard::GateGuard(bool gated) {
  if (!gated) return;
  entered_ = true;
  if (t_depth++ > 0) return;
  Gate& g = gate();
  std::unique_lock<std::mutex> l(g.mu);
  g.cv.wait(l, [&] { return !g.locking && g.state == CU_PROCESS_STATE_RUNNING; });
  ++g.inflight;
  counted_ = true;
}

GateGuard::~GateGuard() {
  if (!entered_) return;
  --t_depth;
  if (!counted_) return;
  Gate& g = gate();
  std::lock_guard<std::mutex> l(g.mu);
  --g.inflight;
  g.cv.notify_all();
}

}  // namespace fc
