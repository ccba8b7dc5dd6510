// Simulated driver: asynchronous handshake kernels ("ncclDevKernel_Handshake*"):
// two threads and two processes meet, stream and event queries report
// CUDA_ERROR_NOT_READY while a kernel waits, a fault is sticky on its stream,
// a forked child starts with no pending kernels, and the driver checkpoint
// of a process with a waiting kernel returns only once the peer arrives.
// Every case runs in forked children: the test process starts no kernel thread.
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "fakecuda_test_util.h"
#include "kernels_test_util.h"

using namespace fctest;

namespace {

constexpr const char* kHandshake = "ncclDevKernel_Handshake_Test";

CUfunction handshake() {
  return load_function(kHandshake);
}

CUresult launch(CUfunction f, CUstream s, CUdeviceptr mine, CUdeviceptr peer, uint64_t step) {
  void* params[] = {&mine, &peer, &step};
  return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr);
}

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

}  // namespace

TEST_CASE("fakecuda: cuFuncGetName and which functions launch asynchronously") {
  CHECK(run_child([] {
          FC_REQ(init_primary() == CUDA_SUCCESS);
          CUfunction hs = handshake(), plain = load_function("vector_add");
          FC_REQ(hs && plain);
          const char* name = nullptr;
          FC_REQ(cuFuncGetName(&name, hs) == CUDA_SUCCESS);
          FC_REQ(strcmp(name, "ncclDevKernel_Handshake_Test") == 0);
          FC_REQ(cuFuncGetName(&name, plain) == CUDA_SUCCESS && strcmp(name, "vector_add") == 0);
          FC_REQ(cuFuncGetName(nullptr, hs) == CUDA_ERROR_INVALID_VALUE);
          FC_REQ(cuFuncGetName(&name, nullptr) == CUDA_ERROR_INVALID_HANDLE);
          // Other kernels stay no-ops; a handshake kernel needs its parameters.
          FC_REQ(cuLaunchKernel(plain, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) ==
                 CUDA_SUCCESS);
          FC_REQ(cuLaunchKernel(hs, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) ==
                 CUDA_ERROR_INVALID_VALUE);
          // Parameters through `extra` and cuLaunchKernelEx.
          VmmBuffer b;
          FC_REQ(vmm_create(kGran, &b) == CUDA_SUCCESS);
          *word(b.ptr + 8) = 3;
          uint64_t buf[3] = {b.ptr, b.ptr + 8, 3};
          size_t size = sizeof buf;
          void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                           CU_LAUNCH_PARAM_END};
          FC_REQ(cuLaunchKernel(hs, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
          FC_REQ(*word(b.ptr) == 3);
          CUlaunchConfig cfg{};
          cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
          cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
          CUdeviceptr mine = b.ptr, peer = b.ptr + 8;
          uint64_t step = 2;
          void* params[] = {&mine, &peer, &step};
          FC_REQ(cuLaunchKernelEx(&cfg, hs, params, nullptr) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
          FC_REQ(*word(b.ptr) == 2);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: handshake kernels of two threads meet, step after step") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUcontext ctx = k.ctx;
          CUfunction f = k.f;
          CUdeviceptr a_flag = k.b.ptr, b_flag = k.b.ptr + 8;
          CUstream s1, s2;
          FC_REQ(create_streams({{&s1, 0}, {&s2, 0}}) == 0);

          // The first kernel returns at once and waits: NOT_READY, flag stored.
          FC_REQ(launch(f, s1, a_flag, b_flag, 1) == CUDA_SUCCESS);
          FC_REQ(within(2000, [&] { return *word(a_flag) == 1; }));
          usleep(50 * 1000);
          FC_REQ(cuStreamQuery(s1) == CUDA_ERROR_NOT_READY);
          FC_REQ(cuStreamQuery(s2) == CUDA_SUCCESS);

          std::atomic<int> peer_failed{0};
          std::thread peer([&] {
            cuCtxSetCurrent(ctx);
            for (uint64_t step = 1; step <= 200; ++step) {
              if (launch(f, s2, b_flag, a_flag, step) != CUDA_SUCCESS ||
                  cuStreamSynchronize(s2) != CUDA_SUCCESS || *word(a_flag) < step)
                peer_failed = 1;
            }
          });
          FC_REQ(cuStreamSynchronize(s1) == CUDA_SUCCESS);
          for (uint64_t step = 2; step <= 200; ++step) {
            FC_REQ(launch(f, s1, a_flag, b_flag, step) == CUDA_SUCCESS);
            FC_REQ(cuStreamSynchronize(s1) == CUDA_SUCCESS);
            FC_REQ(*word(b_flag) >= step);
          }
          peer.join();
          FC_REQ(peer_failed == 0);
          FC_REQ(cuStreamQuery(s1) == CUDA_SUCCESS && cuStreamQuery(s2) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: stream and event queries while a handshake kernel waits") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUfunction f = k.f;
          const VmmBuffer& b = k.b;
          CUdeviceptr mine = b.ptr, peer = b.ptr + 8;
          CUstream s, other, nonblocking;
          FC_REQ(create_streams({{&s, 0}, {&other, 0}, {&nonblocking, CU_STREAM_NON_BLOCKING}}) == 0);
          CUevent before, after;
          FC_REQ(cuEventCreate(&before, 0) == CUDA_SUCCESS);
          FC_REQ(cuEventCreate(&after, 0) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(before, s) == CUDA_SUCCESS);
          FC_REQ(launch(f, s, mine, peer, 5) == CUDA_SUCCESS);
          FC_REQ(cuEventRecord(after, s) == CUDA_SUCCESS);
          usleep(20 * 1000);
          FC_REQ(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
          FC_REQ(cuEventQuery(before) == CUDA_SUCCESS);
          FC_REQ(cuEventQuery(after) == CUDA_ERROR_NOT_READY);
          float ms = 0;
          FC_REQ(cuEventElapsedTime(&ms, before, after) == CUDA_ERROR_NOT_READY);
          // Another blocking stream is idle; the legacy NULL stream waits for
          // blocking streams; a non-blocking stream does not.
          FC_REQ(cuStreamQuery(other) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(nonblocking) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);
          FC_REQ(cuStreamQuery(CU_STREAM_LEGACY) == CUDA_ERROR_NOT_READY);
          // A second kernel on the stream queues behind the first: it has not
          // stored its flag yet.
          CUdeviceptr mine2 = b.ptr + 16;
          FC_REQ(launch(f, s, mine2, peer, 1) == CUDA_SUCCESS);
          usleep(20 * 1000);
          FC_REQ(*word(mine2) == 0);
          // The peer arrives (a host store into device memory).
          *word(peer) = 5;
          FC_REQ(cuEventSynchronize(after) == CUDA_SUCCESS);
          FC_REQ(cuEventQuery(after) == CUDA_SUCCESS);
          FC_REQ(cuEventElapsedTime(&ms, before, after) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS);
          FC_REQ(*word(mine) == 5 && *word(mine2) == 1);
          FC_REQ(cuStreamQuery(s) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(nullptr) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: a handshake kernel on unmapped memory faults its stream") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          CUfunction f = k.f;
          const VmmBuffer& b = k.b;
          CUstream s, other;
          FC_REQ(create_streams({{&s, 0}, {&other, 0}}) == 0);
          // The address is resolved when the kernel runs, not at launch.
          CUdeviceptr far = b.ptr + b.size + (64 << 20);
          FC_REQ(launch(f, s, b.ptr, far, 1) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
          FC_REQ(cuStreamQuery(s) == CUDA_ERROR_ILLEGAL_ADDRESS);  // sticky
          FC_REQ(launch(f, other, far, b.ptr, 1) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(other) == CUDA_ERROR_ILLEGAL_ADDRESS);
          // A misaligned flag.
          CUstream third;
          FC_REQ(cuStreamCreate(&third, 0) == CUDA_SUCCESS);
          FC_REQ(launch(f, third, b.ptr + 4, b.ptr + 8, 1) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(third) == CUDA_ERROR_MISALIGNED_ADDRESS);
          // Unmapped while waiting: the next poll faults.
          CUstream fourth;
          FC_REQ(cuStreamCreate(&fourth, 0) == CUDA_SUCCESS);
          VmmBuffer c;
          FC_REQ(vmm_create(kGran, &c) == CUDA_SUCCESS);
          FC_REQ(launch(f, fourth, c.ptr, c.ptr + 8, 1) == CUDA_SUCCESS);
          FC_REQ(within(2000, [&] { return *word(c.ptr) == 1; }));
          FC_REQ(cuMemUnmap(c.ptr, c.size) == CUDA_SUCCESS);
          FC_REQ(cuStreamSynchronize(fourth) == CUDA_ERROR_ILLEGAL_ADDRESS);
          return 0;
        }) == 0);
}

TEST_CASE("fakecuda: a forked child starts with no pending kernels and its own thread") {
  CHECK(run_child([] {
          HandshakeSetup k;
          FC_REQ(k.init(kHandshake) == 0);
          const VmmBuffer& b = k.b;
          FC_REQ(launch(k.f, nullptr, b.ptr, b.ptr + 8, 1) == CUDA_SUCCESS);
          FC_REQ(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);
          int child = run_child([] {
            FC_REQ(init_primary() == CUDA_SUCCESS);
            FC_REQ(cuStreamQuery(nullptr) == CUDA_SUCCESS);  // the parent's kernel is not ours
            CUfunction g = handshake();
            FC_REQ(g);
            VmmBuffer c;
            FC_REQ(vmm_create(kGran, &c) == CUDA_SUCCESS);
            *word(c.ptr + 8) = 1;
            FC_REQ(launch(g, nullptr, c.ptr, c.ptr + 8, 1) == CUDA_SUCCESS);
            FC_REQ(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
            FC_REQ(*word(c.ptr) == 1);
            return 0;
          });
          FC_REQ(child == 0);
          FC_REQ(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);
          *word(b.ptr + 8) = 1;
          FC_REQ(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
          return 0;
        }) == 0);
}

namespace {

/// One rank of the two-process handshake: its flag lives in its own
/// exported allocation, the peer's in the imported one.
int rank_main(int sock) {
  HandshakeSetup k;
  FC_REQ(k.init(kHandshake) == 0);
  CUfunction f = k.f;
  const VmmBuffer& own = k.b;
  CUdeviceptr peer;
  FC_REQ(exchange_with_peer(sock, own, &peer) == 0);
  CUstream s;
  FC_REQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  for (uint64_t step = 1; step <= 300; ++step) {
    FC_REQ(launch(f, s, own.ptr, peer, step) == CUDA_SUCCESS);
    FC_REQ(cuStreamSynchronize(s) == CUDA_SUCCESS);
    FC_REQ(*word(peer) >= step);
  }
  return 0;
}

}  // namespace

TEST_CASE("fakecuda: handshake kernels of two processes sharing memory meet") {
  const char* failed = run_rank_pair(rank_main, rank_main);
  CHECK_MESSAGE(failed == nullptr, (failed ? failed : ""));
}

namespace {

/// A target whose kernel waits for a peer flag that a thread stores (a host
/// store, no driver call: the process is locked) when told to; its main thread
/// waits for the kernel and reports the result: in cuStreamSynchronize
/// (sync), or polling cuStreamQuery with no driver call in between (as an
/// NCCL job's threads watch their collectives with event queries).
int waiting_target(int sock, bool sync) {
  HandshakeSetup k;
  FC_REQ(k.init(kHandshake) == 0);
  CUfunction f = k.f;
  const VmmBuffer& b = k.b;
  CUstream s;
  FC_REQ(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  FC_REQ(launch(f, s, b.ptr, b.ptr + 8, 1) == CUDA_SUCCESS);
  FC_REQ(within(2000, [&] { return *word(b.ptr) == 1; }));
  CUdeviceptr peer = b.ptr + 8;
  std::thread arrive([sock, peer] {
    uint64_t cmd = 0;
    if (recv_u64(sock, &cmd)) *word(peer) = 1;
  });
  arrive.detach();
  FC_REQ(send_u64(sock, 1));
  CUresult r;
  if (sync) {
    r = cuStreamSynchronize(s);
  } else {
    while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) usleep(2000);
  }
  FC_REQ(send_u64(sock, r));
  uint64_t bye;
  recv_u64(sock, &bye);
  return 0;
}

/// After the unlock: the target's wait for its kernel answered success, and
/// it ends well once told to.
void expect_waited_ok(Child& t) {
  REQUIRE(readable_within(t.sock, 5000));
  uint64_t wait_result = 99;
  CHECK(recv_u64(t.sock, &wait_result));
  CHECK(wait_result == CUDA_SUCCESS);
  send_u64(t.sock, 0);
  CHECK(t.join() == 0);
}

int polling_target(int sock) {
  return waiting_target(sock, false);
}
int synchronizing_target(int sock) {
  return waiting_target(sock, true);
}

}  // namespace

TEST_CASE(
    "fakecuda: a lock waits for a thread synchronizing on a kernel; NOT_READY at its timeout") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn(synchronizing_target);
  uint64_t ready = 0;
  REQUIRE(recv_u64(t.sock, &ready));
  usleep(20 * 1000);  // the target's main thread is in cuStreamSynchronize

  // Measured on the real driver (docs/design.md): the kernel runs on, the
  // lock fails NOT_READY once its timeout passes, the process left running.
  CUcheckpointLockArgs la{};
  la.timeoutMs = 300;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(cuCheckpointProcessLock(t.pid, &la) == CUDA_ERROR_NOT_READY);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
  CUprocessState st = CU_PROCESS_STATE_FAILED;
  CHECK(cuCheckpointProcessGetState(t.pid, &st) == CUDA_SUCCESS);
  CHECK(st == CU_PROCESS_STATE_RUNNING);
  CHECK_FALSE(readable_within(t.sock, 50));  // still synchronizing

  // With a longer timeout the lock waits for the kernel, then succeeds.
  std::atomic<int> locked{-1};
  std::thread lk([&] {
    CUcheckpointLockArgs longer{};
    longer.timeoutMs = 5000;
    locked = cuCheckpointProcessLock(t.pid, &longer);
  });
  usleep(200 * 1000);
  CHECK(locked.load() == -1);  // waiting for the kernel
  CHECK(send_u64(t.sock, 1));  // the peer arrives: the kernel ends
  lk.join();
  CHECK(locked.load() == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  expect_waited_ok(t);
}

TEST_CASE("fakecuda: checkpoint of a process with a waiting kernel returns once the peer arrives") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  Child t = spawn(polling_target);
  uint64_t ready = 0;
  REQUIRE(recv_u64(t.sock, &ready));
  usleep(20 * 1000);  // the target's main thread polls the stream

  // The lock succeeds: no thread is inside the driver (each query returns at
  // once); the device work goes on, and the checkpoint waits for it.
  CUcheckpointLockArgs la{};
  la.timeoutMs = 2000;
  REQUIRE(cuCheckpointProcessLock(t.pid, &la) == CUDA_SUCCESS);

  std::atomic<bool> done{false};
  std::atomic<int> result{-1};
  std::thread ck([&] {
    result = cuCheckpointProcessCheckpoint(t.pid, nullptr);
    done = true;
  });
  usleep(300 * 1000);
  CHECK_FALSE(done.load());  // blocked: the kernel has not completed
  CHECK(send_u64(t.sock, 1));  // the peer arrives
  bool returned = within(5000, [&] { return done.load(); });
  CHECK(returned);
  if (!returned) kill(t.pid, SIGKILL);  // ends the blocked call
  ck.join();
  if (!returned) {
    t.join();
    return;
  }
  CHECK(result == CUDA_SUCCESS);
  CUprocessState st = CU_PROCESS_STATE_FAILED;
  CHECK(cuCheckpointProcessGetState(t.pid, &st) == CUDA_SUCCESS);
  CHECK(st == CU_PROCESS_STATE_CHECKPOINTED);
  // The polling thread stays behind the gate until the unlock.
  CHECK_FALSE(readable_within(t.sock, 100));
  CHECK(cuCheckpointProcessRestore(t.pid, nullptr) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessUnlock(t.pid, nullptr) == CUDA_SUCCESS);
  expect_waited_ok(t);
}
