/*
** backend.cu — the CUDA device backend of the engine's caching allocator: raw device
** memory (engine/core/alloc.c keeps freed blocks per size class, so cudaMalloc and its
** implicit synchronisation happen only while the working set grows), copies between host
** and device, which stream is current and how to order one stream after another; and
** tt_cuda_init, which starts the runtime (engine/runtime/cuda.cu), checks that every
** kernel family is linked in and hands the allocator this table and the fused attention
** to the attention kernels.
*/
#include "cuda/tt_cuda.h"
#include "runtime/tt_runtime.h"
#include "tt_cudnn_sdpa.h"
extern "C" {
#include "optim.h"
#include "tetra_cuda.h"
}
#include <pthread.h>

/* -- Backend table ------------------------------------------------------------------ */

/* During a capture (tt_cuda_graph_begin, thread-local mode) cudaMalloc is refused as
** potentially unsafe; it joins no stream, so a block the capture's pool needs beyond the
** warmed cache is allocated with the thread's mode relaxed for that one call. */
static void *cuda_alloc(size_t nbytes, int device) {
  void *p = NULL;
  if (tt_cuda_use_device(device) != 0) return NULL;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 256);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) {
    cudaGetLastError();
    tt_cu_fail(e, "cudaMalloc", __FILE__, __LINE__);
    /* cudaMalloc also returns errors of earlier asynchronous launches: only this one is a
    ** lack of memory, which emptying the cache may cure. */
    if (e != cudaErrorMemoryAllocation) tt_alloc_failed_not_oom();
    return NULL;
  }
  return p;
}

/* A failure here (a sticky fault of an earlier kernel) is not this call's to report: it
** is cleared, so that the next launch check does not blame its kernel for it; the fault
** itself is reported again by the next synchronising call. */
static void cuda_free(void *p, int device) {
  if (tt_cuda_use_device(device) == 0 && cudaFree(p) != cudaSuccess) cudaGetLastError();
}

static int cuda_memcpy(void *dst, int dst_device, const void *src, int src_device,
                       size_t nbytes) {
  if (nbytes == 0) return 0;
  if (dst_device < 0 && src_device < 0) {
    memcpy(dst, src, nbytes);
    return 0;
  }
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
    TT_CU(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, tt_cuda_cur_stream()));
    return 0;
  }
  TT_TRY(tt_cuda_use_device(dst_device >= 0 ? dst_device : src_device));
  cudaStream_t s = tt_cuda_cur_stream();
  TT_CU(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s));
  /* A copy touching host memory completes before returning: the caller may read the
  ** host buffer, or free it, right away. Device-to-device copies stay in stream order. */
  if (dst_device < 0 || src_device < 0) TT_CU(tt_cuda_host_wait(s));
  return 0;
}

static int cuda_memset0(void *p, int device, size_t nbytes) {
  TT_TRY(tt_cuda_use_device(device));
  TT_CU(cudaMemsetAsync(p, 0, nbytes, tt_cuda_cur_stream()));
  return 0;
}

static void *cuda_current_stream(void) { return (void *)tt_cuda_cur_stream(); }

static int cuda_order_after(int device, void *key) {
  cudaStream_t from = (cudaStream_t)key, cur = tt_cuda_cur_stream();
  if (from == cur) return 0;
  TT_TRY(tt_cuda_use_device(device));
  cudaEvent_t ev;
  TT_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(ev, from);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(cur, ev, 0);
  cudaEventDestroy(ev);
  if (e != cudaSuccess) cudaGetLastError();   /* (the caller handles it: no later launch's) */
  TT_CU(e);
  return 0;
}

static int cuda_fill_f32(float *p, int device, int64_t n, float value) {
  TT_TRY(tt_cuda_use_device(device));
  return tt_optim_cuda.fill(p, n, value);
}

/* The op profile's marks: timing events on the current stream. Reading an interval waits
** for its later event (a host wait, counted: a profile is not a training step; polling
** with the wait hook, so that the NCCL watchdog still sees a profiled step's collective
** that never ends). */
static int cuda_mark_record(int device, void **mark) {
  TT_TRY(tt_cuda_use_device(device));
  if (!*mark) {
    cudaEvent_t ev;
    TT_CU(cudaEventCreate(&ev));
    *mark = (void *)ev;
  }
  TT_CU(cudaEventRecord((cudaEvent_t)*mark, tt_cuda_cur_stream()));
  return 0;
}

static int cuda_mark_seconds(int device, void *from, void *to, double *out) {
  TT_TRY(tt_cuda_use_device(device));
  TT_CU(tt_cuda_host_wait_event((cudaEvent_t)to));
  float ms = 0.0f;
  TT_CU(cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to));
  *out = 1e-3 * (double)ms;
  return 0;
}

static void cuda_mark_free(int device, void *mark) {
  if (tt_cuda_use_device(device) == 0) cudaEventDestroy((cudaEvent_t)mark);
}

static const tt_device_backend g_backend = {
  "cuda", cuda_alloc, cuda_free, cuda_memcpy, cuda_memset0, cuda_current_stream,
  cuda_order_after, cuda_fill_f32, cuda_mark_record, cuda_mark_seconds, cuda_mark_free,
};

/* -- Start-up ----------------------------------------------------------------------- */

static void stream_retired(int device, void *stream) { tt_alloc_stream_retired(device, stream); }
static void stream_born(int device, void *stream) { tt_alloc_stream_born(device, stream); }

static const tt_cuda_fused_sdpa g_cudnn_sdpa = {
  tt_cudnn_sdpa_supported, tt_cudnn_sdpa_forward, tt_cudnn_sdpa_backward,
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialised;

extern "C" int tt_cuda_init(void) {
  pthread_mutex_lock(&g_lock);
  int rc = g_initialised ? 0 : tt_cuda_runtime_init();
  if (rc == 0 && !g_initialised) rc = tt_cuda_kernels_linked();
  if (rc == 0 && !g_initialised) {
    tt_cuda_set_stream_retired_hook(stream_retired);
    tt_cuda_set_stream_born_hook(stream_born);
    tt_cuda_use_fused_sdpa(&g_cudnn_sdpa);
    tt_register_cuda_backend(&g_backend);
    g_initialised = 1;
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}
