/*
** backend.cu — the CUDA device backend: raw device memory for the engine's caching
** allocator (engine/alloc.c keeps freed blocks per size class, so cudaMalloc and its
** implicit synchronisation happen only while the working set grows), copies between host
** and device, the current stream, events, pinned host buffers, and the cuBLASLt handle
** shared by the GEMM kernels.
**
** Memory is always plain cudaMalloc: managed memory can oversubscribe the card and hang
** it for everyone on the node.
*/
#include "cuda/tt_cuda.h"
extern "C" {
#include "tetra_cuda.h"
}
#include <pthread.h>

/* -- Status messages ---------------------------------------------------------------- */

int tt_cu_fail(cudaError_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

int tt_cu_fail(cublasStatus_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s", file, line, call, cublasGetStatusString(e));
}

#ifdef TETRA_HAVE_NCCL
int tt_cu_fail(ncclResult_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s", file, line, call, ncclGetErrorString(e));
}
#endif

/* -- Devices ------------------------------------------------------------------------ */

enum { MAX_GPUS = 16 };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialised;
static int g_num_devices;
static int g_sm_count[MAX_GPUS];
static cudaStream_t g_stream;           /* current stream; 0 = legacy default */
static cublasLtHandle_t g_blaslt[MAX_GPUS];
static void *g_workspace[MAX_GPUS];
/* cuBLASLt wants 32 MiB on Hopper to reach its fastest kernels. */
static const size_t g_workspace_bytes = (size_t)32 << 20;

extern "C" int tt_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();   /* clear the sticky "no driver" error */
    return 0;
  }
  return n;
}

/* Makes `device` current for this thread when it is not already. */
static int use_device(int device) {
  TT_CHECK(device >= 0 && device < g_num_devices, "cuda:%d does not exist (%d GPUs visible)",
           device, g_num_devices);
  int cur = -1;
  TT_CU(cudaGetDevice(&cur));
  if (cur != device) TT_CU(cudaSetDevice(device));
  return 0;
}

static int local_rank(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID",
                        "MPI_LOCALRANKID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return 0;
}

/* -- Backend table ------------------------------------------------------------------ */

static void *cuda_alloc(size_t nbytes, int device) {
  void *p = NULL;
  if (use_device(device) != 0) return NULL;
  cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 256);
  if (e != cudaSuccess) {
    cudaGetLastError();
    tt_cu_fail(e, "cudaMalloc", __FILE__, __LINE__);
    return NULL;
  }
  return p;
}

static void cuda_free(void *p, int device) {
  if (use_device(device) == 0) cudaFree(p);
}

static int cuda_memcpy(void *dst, int dst_device, const void *src, int src_device,
                       size_t nbytes) {
  if (nbytes == 0) return 0;
  if (dst_device < 0 && src_device < 0) {
    memcpy(dst, src, nbytes);
    return 0;
  }
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
    TT_CU(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, g_stream));
    return 0;
  }
  TT_TRY(use_device(dst_device >= 0 ? dst_device : src_device));
  TT_CU(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, g_stream));
  /* A copy touching host memory completes before returning: the caller may read the
  ** host buffer, or free it, right away. Device-to-device copies stay in stream order. */
  if (dst_device < 0 || src_device < 0) TT_CU(cudaStreamSynchronize(g_stream));
  return 0;
}

static int cuda_memset0(void *p, int device, size_t nbytes) {
  TT_TRY(use_device(device));
  TT_CU(cudaMemsetAsync(p, 0, nbytes, g_stream));
  return 0;
}

static const tt_device_backend g_backend = {
  "cuda", cuda_alloc, cuda_free, cuda_memcpy, cuda_memset0,
};

/* -- Start-up ----------------------------------------------------------------------- */

static int init_locked(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tt_set_error("no CUDA device: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (n == 0) return tt_set_error("no CUDA device: the driver reports 0 GPUs");
  g_num_devices = n < MAX_GPUS ? n : MAX_GPUS;
  for (int d = 0; d < g_num_devices; d++)
    TT_CU(cudaDeviceGetAttribute(&g_sm_count[d], cudaDevAttrMultiProcessorCount, d));
  TT_CU(cudaSetDevice(local_rank() % g_num_devices));
  /* Touch the context now so the first op does not pay for its creation. */
  TT_CU(cudaFree(0));
  TT_TRY(tt_cuda_kernels_linked());
  tt_register_cuda_backend(&g_backend);
  g_initialised = 1;
  return 0;
}

extern "C" int tt_cuda_init(void) {
  pthread_mutex_lock(&g_lock);
  int rc = g_initialised ? 0 : init_locked();
  pthread_mutex_unlock(&g_lock);
  return rc;
}

extern "C" int tt_cuda_current_device(void) {
  int d = -1;
  if (!g_initialised || cudaGetDevice(&d) != cudaSuccess) return -1;
  return d;
}

extern "C" int tt_cuda_set_device(int device) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  return use_device(device);
}

extern "C" int tt_cuda_device_info(int device, char *buf, size_t n) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  TT_CHECK(device >= 0 && device < g_num_devices, "cuda:%d does not exist", device);
  cudaDeviceProp p;
  TT_CU(cudaGetDeviceProperties(&p, device));
  snprintf(buf, n, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
           p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30));
  return 0;
}

extern "C" int tt_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  TT_TRY(use_device(device));
  TT_CU(cudaMemGetInfo(free_bytes, total_bytes));
  return 0;
}

extern "C" int tt_cuda_synchronize(void) {
  TT_CU(cudaDeviceSynchronize());
  return 0;
}

int tt_cuda_sm_count(void) {
  int d = tt_cuda_current_device();
  return d >= 0 && d < MAX_GPUS && g_sm_count[d] > 0 ? g_sm_count[d] : 132;
}

cudaStream_t tt_cuda_cur_stream(void) { return g_stream; }

int tt_cuda_blaslt(cublasLtHandle_t *handle, void **workspace, size_t *workspace_bytes) {
  int d = tt_cuda_current_device();
  TT_CHECK(d >= 0 && d < MAX_GPUS, "cuBLASLt: no current CUDA device (call tt_cuda_init)");
  pthread_mutex_lock(&g_lock);
  int rc = 0;
  if (!g_blaslt[d]) {
    cublasStatus_t s = cublasLtCreate(&g_blaslt[d]);
    cudaError_t e = cudaSuccess;
    if (s != CUBLAS_STATUS_SUCCESS) rc = tt_cu_fail(s, "cublasLtCreate", __FILE__, __LINE__);
    else if ((e = cudaMalloc(&g_workspace[d], g_workspace_bytes)) != cudaSuccess)
      rc = tt_cu_fail(e, "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__);
    if (rc) {
      if (g_blaslt[d]) cublasLtDestroy(g_blaslt[d]);
      g_blaslt[d] = NULL;
      g_workspace[d] = NULL;
    }
  }
  pthread_mutex_unlock(&g_lock);
  TT_TRY(rc);
  *handle = g_blaslt[d];
  *workspace = g_workspace[d];
  *workspace_bytes = g_workspace_bytes;
  return 0;
}

/* -- Streams and events ------------------------------------------------------------- */

struct tt_cuda_stream { cudaStream_t s; };
struct tt_cuda_event { cudaEvent_t e; };

static cudaStream_t raw(tt_cuda_stream *s) { return s ? s->s : (cudaStream_t)0; }

extern "C" int tt_cuda_stream_create(tt_cuda_stream **out) {
  tt_cuda_stream *s = (tt_cuda_stream *)calloc(1, sizeof *s);
  TT_CHECK(s, "tt_cuda_stream_create: out of host memory");
  cudaError_t e = cudaStreamCreate(&s->s);
  if (e != cudaSuccess) {
    free(s);
    return tt_cu_fail(e, "cudaStreamCreate", __FILE__, __LINE__);
  }
  *out = s;
  return 0;
}

extern "C" void tt_cuda_stream_destroy(tt_cuda_stream *s) {
  if (!s) return;
  if (g_stream == s->s) g_stream = 0;
  cudaStreamDestroy(s->s);
  free(s);
}

static tt_cuda_stream *g_stream_handle;

extern "C" int tt_cuda_set_stream(tt_cuda_stream *s) {
  g_stream = raw(s);
  g_stream_handle = s;
  return 0;
}

extern "C" tt_cuda_stream *tt_cuda_get_stream(void) { return g_stream_handle; }

extern "C" int tt_cuda_stream_synchronize(tt_cuda_stream *s) {
  TT_CU(cudaStreamSynchronize(raw(s)));
  return 0;
}

extern "C" int tt_cuda_stream_wait_event(tt_cuda_stream *s, tt_cuda_event *e) {
  TT_CHECK(e, "tt_cuda_stream_wait_event: event is NULL");
  TT_CU(cudaStreamWaitEvent(raw(s), e->e, 0));
  return 0;
}

extern "C" int tt_cuda_event_create(int timing, tt_cuda_event **out) {
  tt_cuda_event *ev = (tt_cuda_event *)calloc(1, sizeof *ev);
  TT_CHECK(ev, "tt_cuda_event_create: out of host memory");
  cudaError_t e = cudaEventCreateWithFlags(&ev->e, timing ? cudaEventDefault
                                                          : cudaEventDisableTiming);
  if (e != cudaSuccess) {
    free(ev);
    return tt_cu_fail(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  *out = ev;
  return 0;
}

extern "C" void tt_cuda_event_destroy(tt_cuda_event *e) {
  if (!e) return;
  cudaEventDestroy(e->e);
  free(e);
}

extern "C" int tt_cuda_event_record(tt_cuda_event *e, tt_cuda_stream *s) {
  TT_CHECK(e, "tt_cuda_event_record: event is NULL");
  TT_CU(cudaEventRecord(e->e, raw(s)));
  return 0;
}

extern "C" int tt_cuda_event_synchronize(tt_cuda_event *e) {
  TT_CHECK(e, "tt_cuda_event_synchronize: event is NULL");
  TT_CU(cudaEventSynchronize(e->e));
  return 0;
}

extern "C" int tt_cuda_event_query(tt_cuda_event *e) {
  TT_CHECK(e, "tt_cuda_event_query: event is NULL");
  cudaError_t r = cudaEventQuery(e->e);
  if (r == cudaErrorNotReady) {
    cudaGetLastError();
    return 0;
  }
  TT_CU(r);
  return 1;
}

extern "C" int tt_cuda_event_elapsed_ms(tt_cuda_event *start, tt_cuda_event *end,
                                        float *out_ms) {
  TT_CHECK(start && end, "tt_cuda_event_elapsed_ms: event is NULL");
  TT_CU(cudaEventElapsedTime(out_ms, start->e, end->e));
  return 0;
}

/* -- Pinned host memory ------------------------------------------------------------- */

extern "C" int tt_cuda_host_alloc(size_t nbytes, void **out) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  TT_CU(cudaHostAlloc(out, nbytes ? nbytes : 64, cudaHostAllocPortable));
  return 0;
}

extern "C" void tt_cuda_host_free(void *p) {
  if (p) cudaFreeHost(p);
}

extern "C" int tt_cuda_copy_to_device_async(void *dst, int device, const void *pinned_src,
                                            size_t nbytes) {
  TT_TRY(use_device(device));
  TT_CU(cudaMemcpyAsync(dst, pinned_src, nbytes, cudaMemcpyHostToDevice, g_stream));
  return 0;
}
