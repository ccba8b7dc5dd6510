#include "coord/guardian.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include "coord/runtime_dir.h"
#include "coord/supervisor_loop.h"

using namespace cusnap;

TEST_CASE("guardian: the operation's line carries every field, whatever the path") {
  GuardedOperation op;
  op.op = "checkpoint";
  op.state_dir = "/ckpt/with\nnewline and \"quotes\"";
  op.remove_partial = true;
  op.dir_made = true;
  op.timeout = std::chrono::milliseconds(2500);
  op.margin = "8M";
  op.dump_log = "/tmp/cusnap-dump-7-abcdef/dump.log";
  op.network_lock = "iptables";
  const std::string line = guardian_begin_line(op);
  CHECK(line.find('\n') == std::string::npos);  // one line on the pipe
  GuardedOperation back;
  REQUIRE(parse_guardian_begin(line, &back));
  CHECK(back.op == "checkpoint");
  CHECK(back.state_dir == op.state_dir);
  CHECK(back.remove_partial);
  CHECK(back.dir_made);
  CHECK(back.timeout == std::chrono::milliseconds(2500));
  REQUIRE(back.margin);
  CHECK(*back.margin == "8M");
  CHECK(back.dump_log == op.dump_log);
  CHECK(back.network_lock == "iptables");

  SUBCASE("no margin set, no dump begun: none read back") {
    op.margin.reset();
    op.dump_log.clear();
    op.network_lock.clear();
    REQUIRE(parse_guardian_begin(guardian_begin_line(op), &back));
    CHECK_FALSE(back.margin);
    CHECK(back.dump_log.empty());
    CHECK(back.network_lock.empty());
  }
  SUBCASE("a path and a setting that are not UTF-8 cross whole") {
    op.state_dir = std::string("/ckpt/\xff\xfe/x");
    op.margin = std::string("\xc3");
    REQUIRE(parse_guardian_begin(guardian_begin_line(op), &back));
    CHECK(back.state_dir == op.state_dir);
    REQUIRE(back.margin);
    CHECK(*back.margin == "\xc3");
  }
}

TEST_CASE("guardian: what is not an operation's line is refused, the last one kept") {
  GuardedOperation kept;
  kept.op = "suspend";
  kept.state_dir = "/run/j/suspended";
  // "726573756d65" is "resume" in hex.
  for (const char* bad : {"",
                          "dismiss",
                          "end",
                          "begin",
                          "begin ",
                          "begin checkpoint 1 /ckpt",  // the old form
                          "begin {",
                          "begin []",
                          "begin {}",
                          "begin {\"op\": \"\"}",
                          "begin {\"op\": 7}",
                          "begin {\"op\": \"resume\"}",  // not hex
                          "begin {\"op\": \"726573756d6\"}",
                          "begin {\"op\": \"726573756d65\", \"state_dir\": 1}",
                          "begin {\"op\": \"726573756d65\", \"state_dir\": \"2F\"}",  // upper case
                          "begin {\"op\": \"726573756d65\", \"remove_partial\": \"yes\"}",
                          "begin {\"op\": \"726573756d65\", \"timeout_ms\": -1}",
                          "begin {\"op\": \"726573756d65\", \"timeout_ms\": 1.5}",
                          "begin {\"op\": \"726573756d65\", \"timeout_ms\": \"60\"}",
                          "begin {\"op\": \"726573756d65\", \"margin\": null}",
                          "begin {\"op\": \"726573756d65\", \"margin\": \"8M\"}",
                          "begin {\"op\": \"726573756d65\", \"dump_log\": 1}",
                          "begin {\"op\": \"726573756d65\", \"network_lock\": \"nftables\"}",
                          "x begin {\"op\": \"726573756d65\"}"}) {
    CAPTURE(bad);
    GuardedOperation op = kept;
    CHECK_FALSE(parse_guardian_begin(bad, &op));
    CHECK(op.op == "suspend");
    CHECK(op.state_dir == "/run/j/suspended");
  }
}

TEST_CASE("guardian: a timeout of zero or beyond a week (a request's limit) leaves the default") {
  GuardedOperation op;
  REQUIRE(parse_guardian_begin("begin {\"op\": \"726573756d65\", \"timeout_ms\": 0}", &op));
  CHECK(op.timeout == std::chrono::seconds(60));
  REQUIRE(parse_guardian_begin("begin {\"op\": \"726573756d65\", \"timeout_ms\": 604800001}", &op));
  CHECK(op.timeout == std::chrono::seconds(60));
  // Two days, as a client may ask: kept.
  REQUIRE(parse_guardian_begin("begin {\"op\": \"726573756d65\", \"timeout_ms\": 172800000}", &op));
  CHECK(op.timeout == std::chrono::hours(48));
  REQUIRE(parse_guardian_begin("begin {\"op\": \"726573756d65\", \"timeout_ms\": 604800000}", &op));
  CHECK(op.timeout == std::chrono::hours(24 * 7));
  CHECK(op.op == "resume");
  CHECK(op.state_dir.empty());
  CHECK_FALSE(op.remove_partial);
  CHECK_FALSE(op.dir_made);
  CHECK_FALSE(op.margin);
}

TEST_CASE("guardian: an adoption that fails keeps the runtime directory's lock") {
  char t[] = "/tmp/cusnap-guardian-XXXXXX";
  REQUIRE(mkdtemp(t));
  const std::string base = t;
  setenv("CUSNAP_RUNTIME_BASE", (base + "/base").c_str(), 1);
  std::string err;
  std::unique_ptr<RuntimeDir> rd;
  REQUIRE(RuntimeDir::reserve("adopted", "", &rd, &err));
  const std::string dir = rd->path();
  // The guardian's own descriptor of the lock (guardian.start dups it).
  const int lock_fd = ::fcntl(rd->lock_fd(), F_DUPFD_CLOEXEC, 3);
  REQUIRE(lock_fd >= 0);
  rd.reset();  // the dead supervisor's
  REQUIRE(runtime_dir_live(dir));
  // A directory where the control socket goes: binding it fails.
  REQUIRE(::mkdir((dir + "/control.sock").c_str(), 0700) == 0);
  SupervisorConfig cfg;
  cfg.name = "adopted";
  cfg.runtime_dir = dir;
  std::unique_ptr<SupervisorLoop> loop;
  SuperviseOutcome fail;
  CHECK_FALSE(SupervisorLoop::adopt(cfg, dir, lock_fd, &loop, &fail));
  CHECK_FALSE(fail.error.empty());
  CHECK(::fcntl(lock_fd, F_GETFD) >= 0);  // still open
  CHECK(runtime_dir_live(dir));           // still held: ps leaves it alone
  ::close(lock_fd);
  CHECK_FALSE(runtime_dir_live(dir));
  unsetenv("CUSNAP_RUNTIME_BASE");
  (void)!system(("rm -rf " + base).c_str());
}
