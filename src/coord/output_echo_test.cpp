// The output echo (output_echo.cpp): order kept across descriptors, the
// capacity that holds its caller back while the reader does not read, the
// wake-up once there is room again, a reader that went away.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <string>

#include "coord/output_echo.h"
#include "proto/unique_fd.h"

using namespace cusnap;

namespace {

std::string read_some(int fd, size_t want) {
  std::string got;
  char buf[4096];
  while (got.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

}  // namespace

TEST_CASE("output echo: chunks for two descriptors arrive in order, all of them") {
  UniqueFd r, w;
  std::string err;
  REQUIRE(make_pipe(&r, &w, O_CLOEXEC, "test pipe", &err));
  OutputEcho echo(-1, 1 << 20);
  REQUIRE(echo.start(&err));
  // Both "descriptors" are the same pipe, as with 2>&1.
  const int dup_w = ::dup(w.get());
  REQUIRE(dup_w >= 0);
  UniqueFd dup_owner(dup_w);
  std::string want;
  for (int i = 0; i < 200; ++i) {
    const std::string line = (i % 2 ? "err " : "out ") + std::to_string(i) + "\n";
    echo.push(i % 2 ? dup_w : w.get(), line.data(), line.size());
    want += line;
  }
  CHECK(read_some(r.get(), want.size()) == want);
  echo.finish();
  CHECK_FALSE(echo.failed(w.get()));
}

TEST_CASE("output echo: full at its capacity while nothing is read, woken when there is room") {
  UniqueFd r, w;
  std::string err;
  REQUIRE(make_pipe(&r, &w, O_CLOEXEC, "test pipe", &err));
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  REQUIRE(wake);
  constexpr size_t kCap = 256 << 10;
  OutputEcho echo(wake.get(), kCap);
  REQUIRE(echo.start(&err));
  const std::string block(64 << 10, 'x');
  size_t pushed = 0;
  // The pipe takes 64 KiB; the echo holds kCap more before it says full.
  while (!echo.full() && pushed < (8u << 20)) {
    echo.push(w.get(), block.data(), block.size());
    pushed += block.size();
  }
  CHECK(echo.full());
  CHECK(pushed <= kCap + (128u << 10) + block.size());
  uint64_t v = 0;
  CHECK(::read(wake.get(), &v, sizeof v) < 0);  // not woken while full
  CHECK(read_some(r.get(), pushed).size() == pushed);
  pollfd p{wake.get(), POLLIN, 0};
  CHECK(::poll(&p, 1, 5000) == 1);
  CHECK_FALSE(echo.full());
  echo.finish();
}

TEST_CASE("output echo: a reader that went away ends the echo to it, not to the others") {
  ::signal(SIGPIPE, SIG_IGN);
  UniqueFd r1, w1, r2, w2;
  std::string err;
  REQUIRE(make_pipe(&r1, &w1, O_CLOEXEC, "test pipe", &err));
  REQUIRE(make_pipe(&r2, &w2, O_CLOEXEC, "test pipe", &err));
  r1.reset();  // the first reader is gone
  OutputEcho echo(-1, 1 << 20);
  REQUIRE(echo.start(&err));
  echo.push(w1.get(), "lost\n", 5);
  echo.push(w2.get(), "kept\n", 5);
  CHECK(read_some(r2.get(), 5) == "kept\n");
  echo.finish();
  CHECK(echo.failed(w1.get()));
  CHECK_FALSE(echo.failed(w2.get()));
  echo.push(w1.get(), "more\n", 5);  // dropped, no error
  echo.push(w2.get(), "late\n", 5);  // after finish: written in the caller's thread
  CHECK(read_some(r2.get(), 5) == "late\n");
  ::signal(SIGPIPE, SIG_DFL);
}
