// capture_joins.cpp: measures the real driver's rules for streams joining a capture
// through events, which tests/fakecuda/capture.cpp mirrors. On a GPU machine:
//   g++ -I/usr/local/cuda/include capture_joins.cpp -lcuda -o probe
//   for c in $(seq 1 19); do ./probe $c MODE; done   # MODE: 0 global, 2 relaxed
// Output of 2026-12-01 on an H200 (driver 580.159.04):
// docs/gpu-runs/capture-joins-h200.log.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>

static const char* nm(CUresult r) { const char* s = "?"; cuGetErrorName(r, &s); return s; }
#define R(x) do { CUresult _r = (x); printf("  %-60s -> %d %s\n", #x, (int)_r, nm(_r)); } while (0)
static const char* st(CUstreamCaptureStatus s) {
  return s == CU_STREAM_CAPTURE_STATUS_NONE ? "NONE" : s == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "ACTIVE" : "INVALIDATED";
}
static void cap(const char* n, CUstream s) {
  CUstreamCaptureStatus cs; cuuint64_t id = 0; CUgraph g = nullptr; const CUgraphNode* deps = nullptr; size_t nd = 0;
  CUresult r = cuStreamGetCaptureInfo(s, &cs, &id, &g, &deps, nullptr, &nd);
  CUstreamCaptureStatus c2; CUresult r2 = cuStreamIsCapturing(s, &c2);
  printf("  [%s] info=%s status=%s id=%llu graph=%p ndeps=%zu | isCapturing=%s %s\n", n, nm(r), st(cs),
         (unsigned long long)id, (void*)g, nd, nm(r2), st(c2));
}
static void nodes(CUgraph g) {
  if (!g) { printf("  graph NULL\n"); return; }
  size_t n = 0; cuGraphGetNodes(g, nullptr, &n);
  CUgraphNode ns[64]; size_t m = 64; cuGraphGetNodes(g, ns, &m);
  printf("  graph %p nodes=%zu types:", (void*)g, n);
  for (size_t i = 0; i < m; ++i) { CUgraphNodeType t; cuGraphNodeGetType(ns[i], &t); size_t nd = 0; cuGraphNodeGetDependencies(ns[i], nullptr, nullptr, &nd); printf(" %d(deps %zu)", (int)t, nd); }
  printf("\n");
}
static const char* ptx =
    ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k() { ret; }\n";
static CUfunction k;
#define L(s) R(cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr))
static CUstream mk() { CUstream s; cuStreamCreate(&s, CU_STREAM_NON_BLOCKING); return s; }
static CUevent ev() { CUevent e; cuEventCreate(&e, CU_EVENT_DISABLE_TIMING); return e; }

int main(int argc, char** argv) {
  int sel = argc > 1 ? atoi(argv[1]) : 0; int only_mode = argc > 2 ? atoi(argv[2]) : -1;
  CUdevice d; CUcontext c; CUmodule m;
  R(cuInit(0)); R(cuDeviceGet(&d, 0)); R(cuDevicePrimaryCtxRetain(&c, d)); R(cuCtxSetCurrent(c));
  int v; cuDriverGetVersion(&v); printf("driver %d\n", v);
  R(cuModuleLoadData(&m, ptx)); R(cuModuleGetFunction(&k, m, "k"));
  CUgraph g;
  CUstreamCaptureMode modes[2] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED};
  for (int mi = 0; mi < 2; ++mi) {
  CUstreamCaptureMode mode = modes[mi];
  if (only_mode >= 0 && (int)mode != only_mode) continue;
  printf("======== mode %d\n", (int)mode);
  if (sel == 1) {
    puts("1 join, kernels on A and B, rejoin, end A");
    CUstream A = mk(), B = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); cap("A", A); cap("B before", B);
    R(cuStreamWaitEvent(B, e1, 0)); cap("B after wait", B);
    L(B); L(A); cap("B after launch", B);
    R(cuEventQuery(e1)); R(cuEventSynchronize(e1));
    R(cuEventRecord(e2, B)); R(cuStreamWaitEvent(A, e2, 0)); cap("A after rejoin", A); cap("B after rejoin", B);
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g); cap("A", A); cap("B", B);
    L(B); R(cuStreamSynchronize(B));
    R(cuEventQuery(e1)); R(cuEventQuery(e2)); R(cuStreamWaitEvent(B, e2, 0)); cap("B wait on ended-capture event", B);
    R(cuStreamSynchronize(B));
  }
  if (sel == 2) {
    puts("2 unjoined: kernel on B, no rejoin, end A");
    CUstream A = mk(), B = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
    L(B); L(A); g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g);
    g = (CUgraph)0x1; R(cuStreamEndCapture(B, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
    R(cuStreamSynchronize(A)); R(cuStreamSynchronize(B));
  }
  if (sel == 3) {
    puts("3 B joined, no work, not rejoined, end A");
    CUstream A = mk(), B = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); cap("B", B);
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g); cap("A", A); cap("B", B);
  }
  if (sel == 4) {
    puts("4 end on joined stream B");
    CUstream A = mk(), B = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    g = (CUgraph)0x1; R(cuStreamEndCapture(B, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
    L(B); R(cuEventRecord(e2, B)); R(cuStreamWaitEvent(A, e2, 0));
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
  }
  if (sel == 5) {
    puts("5 isolation: B captures separately, waits on event of A's capture");
    CUstream A = mk(), B = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); R(cuStreamBeginCapture(B, mode)); L(A); L(B);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); cap("A", A); cap("B", B);
    L(B); L(A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(B, &g)); printf("  graph out %p\n", (void*)g);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
  }
  if (sel == 6) {
    puts("6 capturing A waits on event recorded outside capture");
    CUstream A = mk(), C = mk(); CUevent e1 = ev(), e0 = ev();
    L(C); R(cuEventRecord(e1, C)); R(cuStreamSynchronize(C));
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuStreamWaitEvent(A, e1, 0)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g);
    puts("6b with CU_EVENT_WAIT_EXTERNAL");
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuStreamWaitEvent(A, e1, CU_EVENT_WAIT_EXTERNAL)); cap("A", A); L(A);
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g);
    puts("6c never-recorded event");
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuStreamWaitEvent(A, e0, 0)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g);
    puts("6d EXTERNAL outside capture");
    R(cuStreamWaitEvent(C, e1, CU_EVENT_WAIT_EXTERNAL));
    R(cuEventRecordWithFlags(e1, C, CU_EVENT_RECORD_EXTERNAL));
  }
  if (sel == 7) {
    puts("7 joined stream: begin capture on it, record external, rejoin after more work");
    CUstream A = mk(), B = mk();
    CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0));
    R(cuStreamBeginCapture(B, mode)); cap("A", A); cap("B", B);
  }
  if (sel == 8) {
    puts("8 rejoin then more work on B, end A");
    CUstream A = mk(), B = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    R(cuEventRecord(e2, B)); R(cuStreamWaitEvent(A, e2, 0)); L(B);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
  }
  if (sel == 9) {
    puts("9 three streams chained: A->B->C, C rejoins B, B rejoins A");
    CUstream A = mk(), B = mk(), C = mk(); CUevent e1 = ev(), e2 = ev(), e3 = ev(), e4 = ev();
    R(cuStreamBeginCapture(A, mode));
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    R(cuEventRecord(e2, B)); R(cuStreamWaitEvent(C, e2, 0)); L(C); cap("C", C);
    R(cuEventRecord(e3, C)); R(cuStreamWaitEvent(B, e3, 0));
    R(cuEventRecord(e4, B)); R(cuStreamWaitEvent(A, e4, 0));
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g); cap("C", C);
  }
  if (sel == 10) {
    puts("10 non-capturing stream waits on event recorded in capture after the capture ended");
    CUstream A = mk(), C = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A); R(cuEventRecord(e1, A));
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g);
    R(cuStreamWaitEvent(C, e1, 0)); cap("C", C); R(cuEventQuery(e1)); R(cuEventSynchronize(e1));
    R(cuEventRecord(e1, C)); R(cuEventQuery(e1));
  }
  if (sel == 11) {
    puts("11 destroy joined stream with unjoined work, then end A");
    CUstream A = mk(), B = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    R(cuStreamDestroy(B)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); nodes(g == (CUgraph)0x1 ? nullptr : g);
  }
  if (sel == 12) {
    puts("12 invalidate via sync on joined B");
    CUstream A = mk(), B = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    R(cuStreamSynchronize(B)); cap("A", A); cap("B", B);
    R(cuEventRecord(e2, B)); R(cuStreamWaitEvent(A, e2, 0));
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("A", A); cap("B", B);
  }
  if (sel == 13) {
    puts("13 legacy stream wait / per-thread join");
    CUstream A = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(CU_STREAM_PER_THREAD, e1, 0)); cap("PT", CU_STREAM_PER_THREAD);
    L(CU_STREAM_PER_THREAD); R(cuEventRecord(e2, CU_STREAM_PER_THREAD)); R(cuStreamWaitEvent(A, e2, 0));
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g);
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(CU_STREAM_LEGACY, e1, 0)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g);
  }
  if (sel == 14) {
    puts("14 clean join");
    CUstream A = mk(), B = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B); L(A);
    R(cuEventRecord(e2, B)); cap("B after record", B); R(cuStreamWaitEvent(A, e2, 0)); cap("A after rejoin", A); cap("B after rejoin", B);
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g); cap("A", A); cap("B", B);
    L(B); R(cuStreamSynchronize(B));
  }
  if (sel == 15) {
    puts("15 event query on captured event");
    CUstream A = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A); R(cuEventRecord(e1, A));
    R(cuEventQuery(e1)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g);
  }
  if (sel == 16) {
    puts("16 event sync on captured event");
    CUstream A = mk(); CUevent e1 = ev();
    R(cuStreamBeginCapture(A, mode)); L(A); R(cuEventRecord(e1, A));
    R(cuEventSynchronize(e1)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g);
  }
  if (sel == 17) {
    puts("17 joined B waits on non-captured event; bad flags; null event");
    CUstream A = mk(), B = mk(), C = mk(); CUevent e1 = ev(), e0 = ev();
    L(C); R(cuEventRecord(e0, C)); R(cuStreamSynchronize(C));
    R(cuStreamWaitEvent(C, e0, 2)); R(cuStreamWaitEvent(C, nullptr, 0));
    R(cuStreamBeginCapture(A, mode)); L(A);
    R(cuStreamWaitEvent(A, e0, 2)); cap("A after bad flags", A);
    R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); L(B);
    R(cuStreamWaitEvent(B, e0, 0)); cap("A", A); cap("B", B);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("B", B);
  }
  if (sel == 18) {
    puts("18 event recorded outside, re-recorded in capture; stream query on joined B");
    CUstream A = mk(), B = mk(), C = mk(); CUevent e1 = ev();
    L(C); R(cuEventRecord(e1, C));
    R(cuStreamBeginCapture(A, mode)); L(A); R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(B, e1, 0)); cap("B", B);
    R(cuStreamQuery(B)); cap("A", A);
    g = (CUgraph)0x1; R(cuStreamEndCapture(A, &g)); printf("  graph out %p\n", (void*)g); cap("B", B);
  }
  if (sel == 19) {
    puts("19 capture with only waits (A waits own event), fork w/o kernels, B record, A wait");
    CUstream A = mk(), B = mk(); CUevent e1 = ev(), e2 = ev();
    R(cuStreamBeginCapture(A, mode)); R(cuEventRecord(e1, A)); R(cuStreamWaitEvent(A, e1, 0));
    R(cuStreamWaitEvent(B, e1, 0)); L(B); L(B); R(cuEventRecord(e2, B)); R(cuStreamWaitEvent(A, e2, 0)); L(A);
    g = nullptr; R(cuStreamEndCapture(A, &g)); nodes(g);
  }
  }
  R(cuCtxSynchronize());
  puts("done");
  return 0;
}
