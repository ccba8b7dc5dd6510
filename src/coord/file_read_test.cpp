#include "coord/file_read.h"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

using namespace cusnap;

TEST_CASE("file read: whole files, bounded, regular only") {
  char dir[] = "/tmp/cusnap-fileread.XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string d = dir, file = d + "/f", link = d + "/l", fifo = d + "/p";
  {
    FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f);
    std::fputs("0123456789", f);
    std::fclose(f);
  }
  std::string out, err;
  int e = -1;
  CHECK(read_file_bounded(file, {}, &out, &err, &e));
  CHECK(out == "0123456789");
  CHECK(e == 0);
  // Over the limit, refused before reading, saying what the file is.
  CHECK_FALSE(read_file_bounded(file, {.max_bytes = 9, .kind = "a test file"}, &out, &err, &e));
  CHECK(err == file + " is 10 bytes, more than a test file can be (9 bytes)");
  CHECK(e == 0);
  CHECK(read_file_bounded(file, {.max_bytes = 10}, &out));
  // Or only its head.
  CHECK(read_file_bounded(file, {.max_bytes = 4, .prefix = true}, &out));
  CHECK(out == "0123");
  // Missing: the errno says so.
  CHECK_FALSE(read_file_bounded(d + "/none", {}, &out, &err, &e));
  CHECK(e == ENOENT);
  CHECK(err.find("No such file or directory") != std::string::npos);
  // A link: followed unless no_follow.
  REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
  CHECK(read_file_bounded(link, {}, &out));
  CHECK_FALSE(read_file_bounded(link, {.no_follow = true}, &out, &err, &e));
  CHECK(e == ELOOP);
  // A FIFO with no writer and a device that never ends: refused at once.
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_FALSE(read_file_bounded(fifo, {}, &out, &err));
  CHECK(err == fifo + " is not a regular file");
  CHECK_FALSE(read_file_bounded("/dev/zero", {}, &out, &err));
  CHECK(err == "/dev/zero is not a regular file");
  // A /proc file reports no size: limited as it is read.
  CHECK(read_file_bounded("/proc/self/status", {}, &out));
  CHECK(out.find("Pid:") != std::string::npos);
  CHECK_FALSE(read_file_bounded("/proc/self/status", {.max_bytes = 16}, &out, &err));
  CHECK(err.find("grows past what such a file can be (16 bytes)") != std::string::npos);
  ::unlink(fifo.c_str());
  ::unlink(link.c_str());
  ::unlink(file.c_str());
  ::rmdir(dir);
}
