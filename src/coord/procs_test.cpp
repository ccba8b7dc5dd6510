#include "coord/procs.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

using namespace cusnap;
namespace fs = std::filesystem;

TEST_CASE("procs: libcuda detection looks at file names") {
  CHECK(maps_use_cuda(
      "7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libcuda.so.580.1\n"));
  CHECK(maps_use_cuda("7f00-7f01 r-xp 00000000 08:01 12 /work/build/fakecuda/libcuda.so.1\n"));
  CHECK_FALSE(maps_use_cuda("7f00-7f01 r-xp 00000000 08:01 12 /opt/libcuda.so.d/libfoo.so\n"));
  CHECK_FALSE(maps_use_cuda("7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/libcudart.so.13\n"));
}

TEST_CASE("procs: simulated driver allocations parsed from maps") {
  std::string maps =
      "7f00-7f10 rw-s 00000000 00:01 5 /memfd:fakecuda:1234:7 (deleted)\n"
      "7f10-7f20 rw-s 00000000 00:01 5 /memfd:fakecuda:1234:7 (deleted)\n"
      "7f20-7f30 rw-s 00000000 00:01 6 /memfd:fakecuda:99:2 (deleted)\n"
      "7f30-7f40 rw-s 00000000 00:01 7 /memfd:fakecuda:99:3:dev1 (deleted)\n"
      "7f30-7f40 rw-s 00000000 00:01 6 /memfd:other (deleted)\n";
  auto a = parse_device_allocations(maps);
  REQUIRE(a.size() == 3);
  CHECK(a[0] == DeviceAllocation{99, 2});
  CHECK(a[1] == DeviceAllocation{99, 3});
  CHECK(a[2] == DeviceAllocation{1234, 7});
}

TEST_CASE("procs: sharing between processes is found") {
  std::string what;
  CHECK_FALSE(find_shared_device_memory({{10, {{10, 1}, {10, 2}}}, {11, {{11, 1}}}}, &what));
  CHECK(find_shared_device_memory({{10, {{10, 1}}}, {11, {{10, 1}}}}, &what));
  CHECK(what.find("process 11 maps device allocation 1 of process 10") != std::string::npos);
  CHECK(find_shared_device_memory({{10, {{12, 1}}}, {11, {{12, 1}}}}, &what));
}

TEST_CASE("procs: a directory's names, and whether it could be listed") {
  char t[] = "/tmp/cusnap-procs-test-XXXXXX";
  REQUIRE(mkdtemp(t) != nullptr);
  const std::string dir = t;
  int e = -1;
  CHECK(list_dir(dir, &e).empty());
  CHECK(e == 0);  // empty, and listed
  std::ofstream(dir + "/a") << "x";
  fs::create_directory(dir + "/b");
  std::vector<std::string> names = list_dir(dir, &e);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"a", "b"});
  CHECK(e == 0);
  CHECK(list_dir(dir) == list_dir(dir, &e));
  // What cannot be listed says why; the form without it lists nothing.
  CHECK(list_dir(dir + "/a", &e).empty());
  CHECK(e == ENOTDIR);
  CHECK(list_dir(dir + "/gone", &e).empty());
  CHECK(e == ENOENT);
  CHECK(list_dir(dir + "/gone").empty());
  fs::remove_all(dir);
}

TEST_CASE("procs: the tree of a real process, root first") {
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(pipefd[0]);
    pid_t grandchild = fork();
    if (grandchild == 0) {
      close(pipefd[1]);
      pause();
      _exit(0);
    }
    (void)!write(pipefd[1], "x", 1);
    pause();
    _exit(0);
  }
  close(pipefd[1]);
  char c;
  REQUIRE(read(pipefd[0], &c, 1) == 1);
  close(pipefd[0]);
  auto tree = process_tree(child);
  REQUIRE(tree.size() == 2);
  CHECK(tree[0] == child);
  ProcessInfo info;
  CHECK(read_process(child, &info));
  // The child maps libcuda exactly when this test process has loaded it.
  std::string self_maps;
  REQUIRE(read_text_file("/proc/self/maps", &self_maps));
  CHECK(info.uses_cuda == maps_use_cuda(self_maps));
  CHECK(!info.exe.empty());
  kill(tree[1], SIGKILL);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  CHECK(process_tree(child).empty());
}

TEST_CASE("procs: a process's state letter as it runs, stops, ends and is reaped") {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  // Sleeping in pause() once it got there; R only until then.
  char s = process_state(child);
  CHECK((s == 'S' || s == 'R'));
  CHECK(process_runs(child));
  REQUIRE(kill(child, SIGSTOP) == 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, WUNTRACED) == child);  // reported once stopped
  CHECK(process_state(child) == 'T');
  CHECK(process_runs(child));
  REQUIRE(kill(child, SIGKILL) == 0);
  siginfo_t info{};
  REQUIRE(waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT) == 0);  // a zombie, not reaped
  CHECK(process_state(child) == 'Z');
  CHECK_FALSE(process_runs(child));
  REQUIRE(waitpid(child, nullptr, 0) == child);
  CHECK(process_state(child) == 0);
  CHECK(read_ppid(child) == 0);
}

TEST_CASE("procs: NCCL segments in maps") {
  std::string maps =
      "7f00-7f10 rw-s 00000000 00:1a 5 /dev/shm/nccl-AbCd12\n"
      "7f10-7f20 rw-s 00000000 00:1a 6 /dev/shm/nccl-AbCd12\n"
      "7f20-7f30 rw-s 00000000 00:1a 7 /dev/shm/torch_123_456\n";
  auto segs = parse_nccl_segments(maps);
  REQUIRE(segs.size() == 1);
  CHECK(segs[0] == "/dev/shm/nccl-AbCd12");
  CHECK(parse_nccl_segments("7f00-7f10 r-xp 0 08:01 1 /usr/lib/libnccl.so.2\n").empty());
}

namespace {

// A line of /proc/net/tcp or tcp6 with the given local and remote address,
// state and inode.
std::string tcp_line(const char* local, const char* remote, const char* st, const char* inode) {
  return std::string("   0: ") + local + " " + remote + " " + st +
         " 00000000:00000000 00:00000000 00000000     0        0 " + inode +
         " 1 0000000000000000 100 0 0 10 0\n";
}

}  // namespace

TEST_CASE("procs: /proc/net/tcp and tcp6 tables parsed") {
  const std::string header =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n";
  const std::string tcp = header + tcp_line("0100007F:6D7C", "00000000:0000", "0A", "4242") +
                          tcp_line("00000000:0050", "00000000:0000", "0A", "4243") +
                          tcp_line("0100007F:6D7C", "0100007F:A000", "06", "0") + "   3: garbage\n";
  CHECK(parse_tcp_table(tcp, 4) ==
        std::vector<TcpTableEntry>{{4, "127.0.0.1", 28028, kTcpListen, "4242", "0.0.0.0", 0},
                                   {4, "0.0.0.0", 80, kTcpListen, "4243", "0.0.0.0", 0},
                                   {4, "127.0.0.1", 28028, kTcpTimeWait, "0", "127.0.0.1", 40960}});
  const std::string zero6(32, '0');
  const std::string tcp6 =
      header + tcp_line((zero6 + ":1F90").c_str(), (zero6 + ":0000").c_str(), "0A", "777") +
      tcp_line("00000000000000000000000001000000:1F91", "00000000000000000000000001000000:C000",
               "01", "778") +
      tcp_line("0000000000000000FFFF00000100007F:1F92", (zero6 + ":0000").c_str(), "0A", "779");
  CHECK(parse_tcp_table(tcp6, 6) ==
        std::vector<TcpTableEntry>{{6, "::", 8080, kTcpListen, "777", "::", 0},
                                   {6, "::1", 8081, kTcpEstablished, "778", "::1", 49152},
                                   {6, "::ffff:127.0.0.1", 8082, kTcpListen, "779", "::", 0}});
  // A line whose peer cannot be read is skipped like any other.
  CHECK(parse_tcp_table(header + tcp_line("0100007F:6D7C", "0100007F", "01", "5"), 4).empty());
  // A table of the other family's width is not misread.
  CHECK(parse_tcp_table(tcp6, 4).empty());
  CHECK(parse_tcp_table(tcp, 6).empty());
}
