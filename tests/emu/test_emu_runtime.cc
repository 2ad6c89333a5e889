/*
** test_emu_runtime.cc — the emulator's runtime checks (tests/emu/cuda_emu.cc) and the
** emulated cuBLASLt's rules (tests/emu/cublaslt_emu.cc), each shown refusing what a GPU
** or NVIDIA's library would refuse or fault on, and passing the same call made right:
**  - a kernel given a pointer that is not device memory (host memory, a freed buffer, a
**    graph replayed after its buffer went);
**  - copies and sets whose direction does not match their pointers, or that run past a
**    device buffer;
**  - a capture ended while a stream that joined it has work not joined back;
**  - FP8 GEMMs outside Hopper's rules (TN only, not e5m2 x e5m2, 16-byte leading
**    dimensions), an operand less aligned than its algorithm was chosen for, and operands
**    outside device memory.
** The engine's CUDA tests run under the same checks on the emulated device (build-emu).
** Launches on the legacy stream run when issued here (test_emu_kernels.cc sets
** tt_emu::legacy_at_once for the whole program) unless a test says otherwise.
*/
#include <criterion/criterion.h>
#include <cublasLt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda_emu.h"
#include "tt_emu.h"

namespace {

void fill(float *p, int n, float v) {
  const int i = (int)threadIdx.x;
  if (i < n) p[i] = v;
}

void launch_fill(float *p, int n, float v, cudaStream_t s = 0) {
  tt_emu::launcher(1, 64, 0, s, [](auto... a) { fill(a...); })(p, n, v);
}

/* One value of a device buffer, copied back (host code cannot read device memory). */
float at(const float *d, int i) {
  float v = 0.0f;
  cr_assert_eq(cudaMemcpy(&v, d + i, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

float *dev_floats(int n) {
  void *p = nullptr;
  cr_assert_eq(cudaMalloc(&p, (size_t)n * sizeof(float)), cudaSuccess);
  return (float *)p;
}

}  // namespace

Test(emu_runtime, kernel_pointer_arguments) {
  (void)cudaGetLastError();
  float *d = dev_floats(32);
  launch_fill(d, 32, 1.0f);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "a device buffer");
  launch_fill(d + 8, 24, 2.0f);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "a pointer inside a device buffer");
  cr_expect(at(d, 7) == 1.0f && at(d, 8) == 2.0f);

  float *pin = nullptr;
  cr_assert_eq(cudaHostAlloc((void **)&pin, 32 * sizeof(float), 0), cudaSuccess);
  launch_fill(pin, 32, 3.0f);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "pinned host memory is the device's too");
  cr_expect_eq(pin[31], 3.0f);

  std::vector<float> host(32, 0.0f);
  launch_fill(host.data(), 32, 4.0f);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "ordinary host memory");
  cr_expect_eq(host[0], 0.0f, "a refused launch does not run");

  cr_assert_eq(cudaFreeHost(pin), cudaSuccess);
  launch_fill(pin, 32, 5.0f);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "freed pinned memory");
  cr_assert_eq(cudaFree(d), cudaSuccess);
  launch_fill(d, 32, 5.0f);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "a freed device buffer");
}

/* Host code cannot touch a GPU's memory: the emulator's device buffers are closed to it
** outside device work, and the access ends the process (a SIGSEGV, as on a GPU machine). */
Test(emu_runtime, host_read_of_device_memory_faults, .signal = SIGSEGV) {
  float *d = dev_floats(16);
  launch_fill(d, 16, 1.0f);
  cr_expect_eq(at(d, 3), 1.0f, "copied back, it reads");
  volatile float v = d[3];   /* read directly: faults */
  (void)v;
}

namespace {
void read_ahead(const float *p, float *out, int n, int ahead) {
  const int i = (int)threadIdx.x;
  if (i < n) out[i] = p[i] + p[i + ahead];
}
}  // namespace

/* A read past the end of a buffer: within its rounding to 256 bytes it reads guard bytes
** (NaN); past that it touches the page after the buffer, and the launch fails naming the
** thread. The emulator goes on after it. */
Test(emu_runtime, kernel_read_past_the_end) {
  (void)cudaGetLastError();
  float *p = dev_floats(64), *out = dev_floats(64);   /* 256 bytes: no slack */
  launch_fill(p, 64, 1.0f);
  tt_emu::launcher(1, 64, 0, 0, [](auto... a) { read_ahead(a...); })(p, out, 64, 0);
  cr_expect_eq(cudaGetLastError(), cudaSuccess);
  cr_expect_eq(at(out, 63), 2.0f);
  tt_emu::launcher(1, 64, 0, 0, [](auto... a) { read_ahead(a...); })(p, out, 64, 1);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress, "p[64] is past the end");
  float *q = dev_floats(60);   /* 240 bytes: 16 bytes of slack */
  launch_fill(q, 60, 1.0f);
  tt_emu::launcher(1, 60, 0, 0, [](auto... a) { read_ahead(a...); })(q, out, 60, 4);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "within the slack: no fault");
  cr_expect(isnan(at(out, 59)), "but the slack reads as NaN");
  launch_fill(p, 64, 3.0f);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "launches go on after a fault");
  cr_expect_eq(at(p, 63), 3.0f);
  cudaFree(p), cudaFree(q), cudaFree(out);
}

/* Work issued on a stream runs when the host waits for it, as a GPU runs it later: host
** code that reads a copy's pinned destination without waiting sees the old bytes. */
Test(emu_runtime, streams_run_when_waited_for) {
  (void)cudaGetLastError();
  cudaStream_t s1, s2;
  cudaEvent_t e;
  cudaStreamCreate(&s1), cudaStreamCreate(&s2), cudaEventCreate(&e);
  float *d = dev_floats(64), *h = nullptr, *h2 = nullptr;
  cr_assert_eq(cudaHostAlloc((void **)&h, 64 * sizeof(float), 0), cudaSuccess);
  cr_assert_eq(cudaHostAlloc((void **)&h2, 64 * sizeof(float), 0), cudaSuccess);
  h[0] = h2[0] = 0.0f;

  launch_fill(d, 64, 7.0f, s1);
  cr_expect_eq(cudaMemcpyAsync(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, s1),
               cudaSuccess);
  cr_expect_eq(h[0], 0.0f, "not run before the host waits");
  cr_expect_eq(cudaStreamQuery(s1), cudaErrorNotReady, "work pending: not ready");
  cr_expect_eq(cudaGetLastError(), cudaErrorNotReady, "recorded as the last error too");
  cr_expect_eq(cudaStreamQuery(s1), cudaSuccess, "asked again: done");
  cr_expect_eq(cudaStreamSynchronize(s1), cudaSuccess);
  cr_expect_eq(h[0], 7.0f, "run at the wait");

  /* s2 waits for an event of s1: s1 runs up to the record, not past it */
  launch_fill(d, 64, 1.0f, s1);
  cudaEventRecord(e, s1);
  cudaMemcpyAsync(h2, d, 4, cudaMemcpyDeviceToHost, s1);   /* after the record */
  cudaStreamWaitEvent(s2, e, 0);
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, s2);
  cr_expect_eq(cudaStreamSynchronize(s2), cudaSuccess);
  cr_expect_eq(h[0], 1.0f, "s1's fill ran first");
  cr_expect_eq(h2[0], 0.0f, "s1's work after the record has not run");
  cr_expect_eq(cudaEventSynchronize(e), cudaSuccess);
  cr_expect_eq(h2[0], 0.0f, "nor at a wait for the event");
  cr_expect_eq(cudaStreamSynchronize(s1), cudaSuccess);
  cr_expect_eq(h2[0], 1.0f);

  /* a pinned source written after the copy was issued, before it ran: the copy reads the
  ** new bytes (a race the host must close with a wait) */
  h[0] = 5.0f;
  cudaMemcpyAsync(d, h, 4, cudaMemcpyHostToDevice, s1);
  h[0] = 6.0f;
  cr_expect_eq(at(d, 0), 6.0f, "the copy ran at the synchronous read, after the write");

  /* pageable memory is copied before the call returns */
  std::vector<float> v(1, 0.0f);
  launch_fill(d, 64, 9.0f, s1);
  cudaMemcpyAsync(v.data(), d, 4, cudaMemcpyDeviceToHost, s1);
  cr_expect_eq(v[0], 9.0f, "a pageable destination is written at once");

  /* a fault shows at the host wait, not at the launch */
  std::vector<float> host(64);
  launch_fill(host.data(), 64, 1.0f, s1);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "the launch itself is accepted");
  cr_expect_eq(cudaStreamSynchronize(s1), cudaErrorIllegalAddress);
  (void)cudaGetLastError();
  cudaFreeHost(h), cudaFreeHost(h2), cudaFree(d);
  cudaStreamDestroy(s1), cudaStreamDestroy(s2), cudaEventDestroy(e);
}

/* An event may be destroyed as soon as it is recorded and waited on (the engine's
** cuda_order_after does so), and recording it again later does not move a wait already
** made: the wait is for the record it saw. */
Test(emu_runtime, event_waits_keep_their_record) {
  tt_emu::legacy_at_once = false;
  cudaStream_t s1, s2, s3;
  cudaEvent_t e, f;
  cudaStreamCreate(&s1), cudaStreamCreate(&s2), cudaStreamCreate(&s3);
  cudaEventCreate(&e), cudaEventCreate(&f);
  float *d = dev_floats(64), *other = dev_floats(64), *h = nullptr;
  cr_assert_eq(cudaHostAlloc((void **)&h, 64 * sizeof(float), 0), cudaSuccess);
  h[0] = 0.0f;
  launch_fill(d, 64, 5.0f, s1);
  cudaEventRecord(e, s1);
  cudaStreamWaitEvent(s2, e, 0);
  launch_fill(other, 64, 1.0f, s3);
  cudaEventRecord(e, s3);   /* recorded again, elsewhere: s2's wait is for s1's record */
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, s2);
  cr_expect_eq(cudaStreamSynchronize(s2), cudaSuccess);
  cr_expect_eq(h[0], 5.0f, "s1's fill ran before s2's copy: %g", h[0]);

  launch_fill(d, 64, 6.0f, s1);   /* record, wait, destroy at once */
  cudaEventRecord(f, s1);
  cudaStreamWaitEvent(s2, f, 0);
  cudaEventDestroy(f);
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, s2);
  cr_expect_eq(cudaStreamSynchronize(s2), cudaSuccess);
  cr_expect_eq(h[0], 6.0f, "the wait outlives its event");
  cr_expect_eq(cudaDeviceSynchronize(), cudaSuccess);
  cudaFreeHost(h), cudaFree(d), cudaFree(other);
}

/* A fault in deferred work is returned by whichever host wait runs it: here a synchronous
** copy that waits for a blocking stream's earlier work. */
Test(emu_runtime, synchronous_copy_returns_the_fault) {
  tt_emu::legacy_at_once = false;
  (void)cudaGetLastError();
  cudaStream_t s1;
  cudaStreamCreate(&s1);
  float *d = dev_floats(64), v = 0.0f;
  std::vector<float> host(64);
  launch_fill(host.data(), 64, 1.0f, s1);   /* faults when it runs */
  cr_expect_eq(cudaMemcpy(&v, d, 4, cudaMemcpyDeviceToHost), cudaErrorIllegalAddress);
  (void)cudaGetLastError();
  cudaFree(d);
}

/* Work on the legacy stream while a blocking stream captures depends on the capture
** implicitly: CUDA refuses it and invalidates the capture. */
Test(emu_runtime, legacy_work_during_a_capture) {
  (void)cudaGetLastError();
  cudaStream_t s;
  cudaStreamCreate(&s);
  float *d = dev_floats(64);
  cudaGraph_t g = (cudaGraph_t)1;
  cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  launch_fill(d, 64, 1.0f, s);
  launch_fill(d, 64, 2.0f);   /* the legacy stream */
  cr_expect_eq(cudaGetLastError(), cudaErrorStreamCaptureImplicit);
  cr_expect_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  cr_expect_null(g);
  (void)cudaGetLastError();
  cr_expect_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  launch_fill(d, 64, 1.0f, s);
  cr_expect_eq(cudaStreamEndCapture(s, &g), cudaSuccess, "the same capture without it");
  cudaGraphDestroy(g);
  cudaFree(d);
}

namespace {
void read_at(float *out, long long address) { out[threadIdx.x] = *(const float *)address; }
}  // namespace

/* A kernel reading an address no buffer holds (not a pointer argument: a computed one)
** fails its launch, naming the thread, where a GPU reports an illegal address. */
Test(emu_runtime, kernel_fault_outside_buffers) {
  (void)cudaGetLastError();
  float *out = dev_floats(32);
  tt_emu::launcher(1, 32, 0, 0, [](auto... a) { read_at(a...); })(out, 16LL);
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress);
  launch_fill(out, 32, 1.0f);
  cr_expect_eq(cudaGetLastError(), cudaSuccess, "and launches go on");
  cudaFree(out);
}

/* The legacy stream is deferred too (the emulated device's, not the kernels' test's), and
** synchronises with blocking streams: their work waits for what it issued before. */
Test(emu_runtime, legacy_stream_deferred) {
  tt_emu::legacy_at_once = false;
  cudaStream_t s1, quiet;
  cudaStreamCreate(&s1);
  cudaStreamCreateWithFlags(&quiet, cudaStreamNonBlocking);
  float *d = dev_floats(64), *h = nullptr;
  cr_assert_eq(cudaHostAlloc((void **)&h, 64 * sizeof(float), 0), cudaSuccess);
  h[0] = 0.0f;
  launch_fill(d, 64, 2.0f);   /* the legacy stream */
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, 0);
  cr_expect_eq(h[0], 0.0f, "not run when issued");
  cr_expect_eq(cudaStreamSynchronize(0), cudaSuccess);
  cr_expect_eq(h[0], 2.0f);
  launch_fill(d, 64, 3.0f);   /* legacy, then a blocking stream's copy: it waits */
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, s1);
  cr_expect_eq(cudaStreamSynchronize(s1), cudaSuccess);
  cr_expect_eq(h[0], 3.0f, "the blocking stream's copy ran after the legacy fill");
  launch_fill(d, 64, 4.0f, s1);   /* a blocking stream's fill, then a legacy copy */
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, 0);
  cr_expect_eq(cudaStreamSynchronize(0), cudaSuccess);
  cr_expect_eq(h[0], 4.0f, "the legacy copy ran after the blocking stream's fill");
  launch_fill(d, 64, 5.0f);   /* a non-blocking stream does not wait for the legacy one */
  cudaMemcpyAsync(h, d, 4, cudaMemcpyDeviceToHost, quiet);
  cr_expect_eq(cudaStreamSynchronize(quiet), cudaSuccess);
  cr_expect_eq(h[0], 4.0f, "the non-blocking stream's copy did not wait");
  cr_expect_eq(cudaDeviceSynchronize(), cudaSuccess);
  cudaFreeHost(h), cudaFree(d);
  cudaStreamDestroy(s1), cudaStreamDestroy(quiet);
}

/* A graph keeps the pointers it was captured with: replayed after one of its buffers was
** freed, its launch faults (the replay is where the check runs). */
Test(emu_runtime, graph_replay_after_free) {
  (void)cudaGetLastError();
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
  float *d = dev_floats(32);
  cudaGraph_t g;
  cudaGraphExec_t x;
  cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  launch_fill(d, 32, 6.0f, s);
  cr_assert_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
  cr_assert_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
  cr_expect_eq(cudaGraphLaunch(x, s), cudaSuccess);
  cr_expect_eq(cudaGetLastError(), cudaSuccess);
  cr_expect_eq(at(d, 5), 6.0f);
  cr_assert_eq(cudaFree(d), cudaSuccess);
  cudaGraphLaunch(x, s);
  cr_expect_eq(cudaStreamSynchronize(s), cudaErrorIllegalAddress,
               "the replay's buffer was freed: the fault shows at the host wait");
  cr_expect_eq(cudaGetLastError(), cudaErrorIllegalAddress);
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

Test(emu_runtime, copies_and_sets) {
  (void)cudaGetLastError();
  float *d = dev_floats(16), *e = dev_floats(16);
  std::vector<float> h(16, 7.0f), back(16, 0.0f);
  cr_expect_eq(cudaMemcpy(d, h.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
  cr_expect_eq(cudaMemcpy(e, d, 64, cudaMemcpyDeviceToDevice), cudaSuccess);
  cr_expect_eq(cudaMemcpyAsync(back.data(), e, 64, cudaMemcpyDeviceToHost, 0), cudaSuccess);
  cr_expect_eq(back[15], 7.0f);
  cr_expect_eq(cudaMemcpyAsync(back.data(), e, 64, cudaMemcpyDefault, 0), cudaSuccess);
  cr_expect_eq(cudaGetLastError(), cudaSuccess);

  /* the direction must match the pointers */
  cr_expect_eq(cudaMemcpy(d, e, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue,
               "HostToDevice from device memory");
  cr_expect_eq(cudaMemcpyAsync(h.data(), back.data(), 64, cudaMemcpyDeviceToHost, 0),
               cudaErrorInvalidValue, "DeviceToHost from host memory");
  cr_expect_eq(cudaMemcpyAsync(d, h.data(), 64, cudaMemcpyDeviceToDevice, 0),
               cudaErrorInvalidValue, "DeviceToDevice from host memory");
  cr_expect_eq(cudaMemcpy(h.data(), e, 64, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue,
               "DeviceToDevice to host memory");
  /* and stay inside the device buffer */
  cr_expect_eq(cudaMemcpyAsync(d + 1, e, 64, cudaMemcpyDeviceToDevice, 0),
               cudaErrorInvalidValue, "a copy past the destination's end");
  cr_expect_eq(cudaMemcpyAsync(back.data(), e + 8, 64, cudaMemcpyDefault, 0),
               cudaErrorInvalidValue, "a copy past the source's end");
  cr_expect_eq(cudaMemcpy2DAsync(d, 32, e, 32, 32, 3, cudaMemcpyDeviceToDevice, 0),
               cudaErrorInvalidValue, "a 2D copy whose last row runs past the end");
  cr_expect_eq(cudaMemcpy2DAsync(d, 32, e, 32, 32, 2, cudaMemcpyDeviceToDevice, 0),
               cudaSuccess, "a 2D copy that fits");
  cr_expect_eq(cudaMemsetAsync(d + 4, 0, 64, 0), cudaErrorInvalidValue, "a set past the end");
  cr_expect_eq(cudaMemset(h.data(), 0, 64), cudaErrorInvalidValue, "a set of host memory");
  cr_expect_eq(h[0], 7.0f, "a refused set does not run");
  cr_expect_eq(cudaMemsetAsync(d + 4, 0, 48, 0), cudaSuccess);
  cr_expect_eq(cudaGetLastError(), cudaErrorInvalidValue, "a refused call is the last error");
  cudaFree(d);
  cudaFree(e);
}

/* CUDA ends a capture only when every stream that joined it (by waiting on an event
** recorded in it) has been joined back into the stream that began it. */
Test(emu_runtime, capture_joins) {
  (void)cudaGetLastError();
  cudaStream_t a, b, c;
  cudaEvent_t fork, back, via;
  cudaStreamCreate(&a), cudaStreamCreate(&b), cudaStreamCreate(&c);
  cudaEventCreate(&fork), cudaEventCreate(&back), cudaEventCreate(&via);
  float *d = dev_floats(32);
  cudaGraph_t g;

  /* b joins, works, and is never waited for */
  cr_assert_eq(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaEventRecord(fork, a);
  cudaStreamWaitEvent(b, fork, 0);
  launch_fill(d, 32, 1.0f, b);
  g = (cudaGraph_t)1;
  cr_expect_eq(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureUnjoined);
  cr_expect_null(g, "an unjoined capture gives no graph");
  cudaStreamCaptureStatus st;
  cudaStreamIsCapturing(b, &st);
  cr_expect_eq(st, cudaStreamCaptureStatusNone, "the stream that joined has left the capture");
  (void)cudaGetLastError();

  /* b joins back, but a waited before b's last launch */
  cr_assert_eq(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaEventRecord(fork, a);
  cudaStreamWaitEvent(b, fork, 0);
  launch_fill(d, 32, 1.0f, b);
  cudaEventRecord(back, b);
  launch_fill(d, 32, 2.0f, b);
  cudaStreamWaitEvent(a, back, 0);
  cr_expect_eq(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureUnjoined);
  (void)cudaGetLastError();

  /* b joins back through c: a waits for c, which waited for b */
  cr_assert_eq(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaEventRecord(fork, a);
  cudaStreamWaitEvent(b, fork, 0);
  cudaStreamWaitEvent(c, fork, 0);
  launch_fill(d, 32, 3.0f, b);
  cudaEventRecord(back, b);
  cudaStreamWaitEvent(c, back, 0);
  launch_fill(d, 16, 4.0f, c);
  cudaEventRecord(via, c);
  cudaStreamWaitEvent(a, via, 0);
  cr_expect_eq(cudaStreamEndCapture(a, &g), cudaSuccess);
  cr_expect_eq(cudaGetLastError(), cudaSuccess);
  cudaGraphExec_t x;
  cr_assert_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
  cr_expect(!(at(d, 0) == 4.0f), "captured work has not run yet");
  cudaGraphLaunch(x, a);
  cr_expect(at(d, 0) == 4.0f && at(d, 20) == 3.0f, "the replay ran both streams' work: %g %g",
            at(d, 0), at(d, 20));
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaFree(d);
}

/* -- The emulated cuBLASLt --------------------------------------------------------------- */

namespace {

struct Lt {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;

  /* D (m, n) = A^T B, A stored (k, m), B (k, n), column-major, as the engine's TN FP8
  ** products are; ta / tb as given. */
  Lt(cudaDataType_t ta_type, cudaDataType_t tb_type, cublasOperation_t ta, cublasOperation_t tb,
     int64_t m, int64_t n, int64_t k, int64_t lda, uint32_t align) {
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatrixLayoutCreate(&la, ta_type, ta == CUBLAS_OP_T ? k : m,
                               ta == CUBLAS_OP_T ? m : k, lda);
    cublasLtMatrixLayoutCreate(&lb, tb_type, tb == CUBLAS_OP_N ? k : n,
                               tb == CUBLAS_OP_N ? n : k, tb == CUBLAS_OP_N ? k : n);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, a, &align, sizeof align);
  }
  cublasStatus_t heuristic(void) {
    return cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &heur, &found);
  }
  cublasStatus_t run(const void *A, const void *B, void *D, void *ws = nullptr,
                     size_t ws_bytes = 0, cudaStream_t s = 0) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(h, desc, &one, A, la, B, lb, &zero, D, ld, D, ld, &heur.algo, ws,
                          ws_bytes, s);
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }
};

/* A device buffer of `bytes` after an address aligned to 256 bytes plus `offset`. */
void *dev_at(size_t bytes, size_t offset, void **base) {
  cr_assert_eq(cudaMalloc(base, bytes + 512), cudaSuccess);
  const uintptr_t p = ((uintptr_t)*base + 255) & ~(uintptr_t)255;
  return (void *)(p + offset);
}

__nv_fp8_storage_t e4m3(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }

}  // namespace

Test(emu_runtime, cublaslt_fp8_rules) {
  const int64_t m = 16, n = 32, k = 48;
  void *ba, *bb, *bd;
  uint8_t *A = (uint8_t *)dev_at(k * m, 0, &ba), *B = (uint8_t *)dev_at(k * n, 0, &bb);
  __nv_bfloat16 *D = (__nv_bfloat16 *)dev_at(m * n * 2, 0, &bd);
  /* small integers: exact in e4m3 and in the bf16 sums */
  std::vector<uint8_t> ha(k * m), hb(k * n);
  for (int64_t i = 0; i < k * m; i++) ha[i] = e4m3((float)(i % 5) - 2.0f);
  for (int64_t i = 0; i < k * n; i++) hb[i] = e4m3((float)(i % 3) - 1.0f);
  cudaMemcpy(A, ha.data(), ha.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(B, hb.data(), hb.size(), cudaMemcpyHostToDevice);
  {
    Lt tn(CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, 256);
    cr_assert_eq(tn.heuristic(), CUBLAS_STATUS_SUCCESS, "TN e4m3 x e4m3");
    cr_assert_eq(tn.found, 1);
    cr_assert_eq(tn.run(A, B, D), CUBLAS_STATUS_SUCCESS);
    std::vector<__nv_bfloat16> hd(m * n);
    cudaMemcpy(hd.data(), D, hd.size() * 2, cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < m; i++) {
        float want = 0.0f;
        for (int64_t l = 0; l < k; l++)
          want += ((float)((l + i * k) % 5) - 2.0f) * ((float)((l + j * k) % 3) - 1.0f);
        wrong += __bfloat162float(hd[i + j * m]) != want;
      }
    cr_expect_eq(wrong, 0, "the TN product: %d of %lld entries wrong", wrong, (long long)(m * n));

    /* an operand less aligned than the algorithm was chosen for (256 bytes) */
    cr_expect_eq(tn.run(A, (uint8_t *)dev_at(k * n, 16, &bb), D), CUBLAS_STATUS_INVALID_VALUE,
                 "B 16 bytes past a 256-byte boundary");
    cudaFree(bb);
    B = (uint8_t *)dev_at(k * n, 0, &bb);
    cudaMemcpy(B, hb.data(), hb.size(), cudaMemcpyHostToDevice);
    /* operands outside device memory */
    std::vector<uint8_t> host_b(k * n + 256);
    uint8_t *hbp = (uint8_t *)(((uintptr_t)host_b.data() + 255) & ~(uintptr_t)255);
    cr_expect_eq(tn.run(A, hbp, D), CUBLAS_STATUS_INVALID_VALUE, "B in host memory");
    cr_expect_eq(tn.run(A + 768, B, D), CUBLAS_STATUS_INVALID_VALUE,
                 "A's extent past its buffer");
    std::vector<char> host_ws(1024);
    cr_expect_eq(tn.run(A, B, D, host_ws.data(), host_ws.size()), CUBLAS_STATUS_INVALID_VALUE,
                 "a workspace in host memory");
    cr_expect_eq(tn.run(A, B, D), CUBLAS_STATUS_SUCCESS, "the same call made right");

    /* a captured product replayed after its operand's buffer was freed faults */
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *bx;
    uint8_t *Bx = (uint8_t *)dev_at(k * n, 0, &bx);
    cudaGraph_t g;
    cudaGraphExec_t x;
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    cr_expect_eq(tn.run(A, Bx, D, nullptr, 0, s), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
    cr_assert_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    (void)cudaGetLastError();
    cudaGraphLaunch(x, s);
    cr_expect_eq(cudaStreamSynchronize(s), cudaSuccess, "replayed while its buffers live");
    cudaFree(bx);
    cudaGraphLaunch(x, s);
    cr_expect_eq(cudaStreamSynchronize(s), cudaErrorIllegalAddress, "replayed after B was freed");
    (void)cudaGetLastError();
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  }
  {
    Lt tn16(CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, 16);
    cr_assert_eq(tn16.heuristic(), CUBLAS_STATUS_SUCCESS);
    void *b2;
    uint8_t *B16 = (uint8_t *)dev_at(k * n, 16, &b2);
    cudaMemcpy(B16, B, (size_t)(k * n), cudaMemcpyDeviceToDevice);
    cr_expect_eq(tn16.run(A, B16, D), CUBLAS_STATUS_SUCCESS,
                 "an algorithm chosen for 16-byte alignment takes it");
    cudaFree(b2);
  }
  Lt nn(CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, 256);
  cr_expect_eq(nn.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED, "FP8 NN has no algorithm");
  cr_expect_eq(nn.found, 0);
  Lt e5(CUDA_R_8F_E5M2, CUDA_R_8F_E5M2, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, 256);
  cr_expect_eq(e5.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED, "e5m2 x e5m2 has none");
  Lt mixed(CUDA_R_8F_E5M2, CUDA_R_8F_E4M3, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, 256);
  cr_expect_eq(mixed.heuristic(), CUBLAS_STATUS_SUCCESS, "e5m2 x e4m3 has one (backward)");
  Lt odd(CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLAS_OP_T, CUBLAS_OP_N, m, n, 40, 40, 256);
  cr_expect_eq(odd.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED,
               "a 40-byte leading dimension has none");
  Lt loose(CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, 8);
  cr_expect_eq(loose.heuristic(), CUBLAS_STATUS_NOT_SUPPORTED,
               "FP8 operands aligned to 8 bytes have none");
  Lt bf(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 40, m, 256);
  cr_expect_eq(bf.heuristic(), CUBLAS_STATUS_SUCCESS, "bf16 takes any layout");
  cudaFree(ba), cudaFree(bb), cudaFree(bd);
}
