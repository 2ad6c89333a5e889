/*
** cuda.cu — the CUDA runtime the kernels sit on: devices, the current stream, events,
** pinned host buffers, the cuBLASLt handle shared by the GEMM kernels with one workspace
** per stream, the launch check (TETRA_CUDA_SYNC), host waits and their count (a step
** should make one), the deferred input checks, and CUDA graph capture and replay.
**
** It knows nothing of tensors or the allocator: engine/cuda/backend.cu builds the
** allocator's device table on these functions, and tt_cuda_init (there) starts this
** runtime first. Memory is always plain cudaMalloc: managed memory can oversubscribe the
** card and hang it for everyone on the node.
*/
#include "runtime/tt_runtime.h"
extern "C" {
#include "tetra_cuda.h"
}
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <time.h>

/* -- Status messages ---------------------------------------------------------------- */

int tt_cu_fail(cudaError_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

int tt_cu_fail(cublasStatus_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s", file, line, call, cublasLtGetStatusString(e));
}

/* -- cuBLASLt, opened on first use (kernel_cuda.h) ----------------------------------- */

static tt_blaslt_api g_blaslt_api;
static pthread_once_t g_blaslt_once = PTHREAD_ONCE_INIT;
static char g_blaslt_why[4608];   /* (paths: up to PATH_MAX) */

/* What every entry point is when the library could not be opened. */
template <typename... A> static cublasStatus_t blaslt_missing(A...) {
  return CUBLAS_STATUS_NOT_INITIALIZED;
}
static const char *blaslt_missing_status(cublasStatus_t) { return g_blaslt_why; }
template <typename... A> static void set_missing(cublasStatus_t (*&f)(A...)) {
  f = blaslt_missing<A...>;
}
static void set_missing(const char *(*&f)(cublasStatus_t)) { f = blaslt_missing_status; }

/* The directory the loader found the process's libcudart at, and the one that name
** resolves to (different when it is a link, as /usr/local/lib's often are); "" if none. */
static void cudart_dirs(char *named, char *real, size_t n) {
  named[0] = real[0] = '\0';
  char soname[64];
  snprintf(soname, sizeof soname, "libcudart.so.%d", CUDART_VERSION / 1000);
  void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);   /* (a reference: closed below) */
  void *fn = h ? dlsym(h, "cudaRuntimeGetVersion") : NULL;
  Dl_info info;
  if (fn && dladdr(fn, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    snprintf(named, n, "%s", info.dli_fname);
    *strrchr(named, '/') = '\0';
    char *r = realpath(info.dli_fname, NULL);
    if (r && strrchr(r, '/')) {
      *strrchr(r, '/') = '\0';
      if (strcmp(r, named) != 0) snprintf(real, n, "%s", r);
    }
    free(r);
  }
  if (h) dlclose(h);
}

/* Appends ", TEXT" to `why` (of why_n bytes, `*at` used) while it fits. */
static void why_add(char *why, size_t why_n, int *at, const char *what, const char *path,
                    const char *detail) {
  if (*at < 0 || (size_t)*at >= why_n) return;
  *at += snprintf(why + *at, why_n - *at, detail ? ", %s %s (%s)" : ", %s %s", what, path,
                  detail);
}

/* cuBLASLt: first where the system loader looks (LD_LIBRARY_PATH, the binary's RUNPATH,
** ld.so.cache); then beside the libcudart this process runs with, and in the
** nvidia-cublas wheel beside an nvidia-cuda-runtime wheel's (DIR/../../cublas/lib, as pip
** installs PyTorch's CUDA), for cudart's directory as named and as resolved. Only a
** failure to open moves on: a library that opens but lacks an entry point is reported
** (blaslt_open), not mixed with another. The path opened goes to `opened`; on failure
** `why` lists every place tried. */
static void *blaslt_dlopen(const char *file, char *opened, size_t opened_n, char *why,
                           size_t why_n) {
  snprintf(opened, opened_n, "%s", file);
  void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  const char *e = dlerror();
  int at = snprintf(why, why_n, "cannot open %s (%s)", file, e ? e : "unknown error");
  static char dirs[2][2048];
  cudart_dirs(dirs[0], dirs[1], sizeof dirs[0]);
  for (int i = 0; i < 2; i++) {
    if (!dirs[i][0]) continue;
    for (int wheel = 0; wheel < 2; wheel++) {
      char dir[4200], path[4300];
      snprintf(dir, sizeof dir, "%s%s", dirs[i], wheel ? "/../../cublas/lib" : "");
      char *clean = realpath(dir, NULL);   /* names without "..", for the loader and us */
      snprintf(path, sizeof path, "%s/%s", clean ? clean : dir, file);
      free(clean);
      if (access(path, F_OK) != 0) {
        why_add(why, why_n, &at, "no", path, NULL);
        continue;
      }
      if ((lib = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        snprintf(opened, opened_n, "%s", path);
        return lib;
      }
      e = dlerror();
      why_add(why, why_n, &at, "cannot open", path, e ? e : "unknown error");
    }
  }
  return NULL;
}

static void blaslt_open(void) {
  /* The soname of the toolkit the engine was built with (libcublasLt.so.13 for CUDA 13). */
  char file[64], opened[4300], tried[sizeof g_blaslt_why - 200];
  snprintf(file, sizeof file, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
  void *lib = blaslt_dlopen(file, opened, sizeof opened, tried, sizeof tried);
  const char *missing = NULL;
  if (lib) {
#define TT_BLASLT_FIND(f)                                                          \
    g_blaslt_api.f = (decltype(g_blaslt_api.f))dlsym(lib, "cublasLt" #f);            \
    if (!g_blaslt_api.f && !missing) missing = "cublasLt" #f;
    TT_BLASLT_FUNCTIONS(TT_BLASLT_FIND)
#undef TT_BLASLT_FIND
    if (!missing) return;
    snprintf(g_blaslt_why, sizeof g_blaslt_why,
             "cuBLASLt: %s has no %s (the engine was built with CUDA %d's cuBLAS %d.%d)",
             opened, missing, CUDART_VERSION / 1000, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
  } else {
    snprintf(g_blaslt_why, sizeof g_blaslt_why,
             "cuBLASLt: %s; put the CUDA toolkit's lib64 (or the nvidia-cublas wheel's lib) "
             "on LD_LIBRARY_PATH", tried);
  }
#define TT_BLASLT_MISSING(f) set_missing(g_blaslt_api.f);
  TT_BLASLT_FUNCTIONS(TT_BLASLT_MISSING)
#undef TT_BLASLT_MISSING
}

const tt_blaslt_api *tt_blaslt(void) {
  pthread_once(&g_blaslt_once, blaslt_open);
  return &g_blaslt_api;
}

extern "C" int tt_blaslt_loaded(void) {
  tt_blaslt();
  if (g_blaslt_why[0]) return tt_set_error("%s", g_blaslt_why), 0;
  return 1;
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
struct tt_cuda_stream { cudaStream_t s; };
static tt_cuda_stream *g_stream_handle;  /* the handle g_stream came from (NULL: default) */
static int g_sync;                      /* TETRA_CUDA_SYNC=1 */
static cublasLtHandle_t g_blaslt[MAX_GPUS];
/* cuBLASLt wants 32 MiB on Hopper to reach its fastest kernels. Two GEMMs running at once
** on two streams must not share one, so each (device, stream) gets its own, freed when
** the stream is destroyed; a CUDA graph captured on the stream holds its workspace (its
** GEMM nodes name the address), which then outlives the stream until the last such graph
** is destroyed (`graphs`; `orphan`: the stream is gone, so no new GEMM gets it). */
static const size_t g_workspace_bytes = (size_t)32 << 20;
enum { MAX_WORKSPACES = 64 };
static struct {
  int device;
  cudaStream_t stream;
  void *ptr;
  int graphs, orphan;
} g_workspaces[MAX_WORKSPACES];
static int g_num_workspaces;
static void free_unheld_locked(void);   /* orphaned workspaces no graph holds, freed */
static int64_t g_host_syncs;            /* tt_cuda_host_sync_count; atomic adds */

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

/* -- Launch checks ------------------------------------------------------------------ */

/* Whether stream s is being captured. Asked of the legacy default stream while a blocking
** stream captures, CUDA answers cudaErrorStreamCaptureImplicit (cudaStreamIsCapturing's
** documentation): a capture too, and the error is cleared. Other errors come back. */
static cudaError_t is_capturing(cudaStream_t s, int *capturing) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(s, &cap);
  *capturing = e == cudaErrorStreamCaptureImplicit ||
               (e == cudaSuccess && cap != cudaStreamCaptureStatusNone);
  if (e == cudaErrorStreamCaptureImplicit) {
    cudaGetLastError();
    e = cudaSuccess;
  }
  return e;
}

/* TETRA_CUDA_SYNC=1 synchronises after every launch, except inside a capture: there a
** device synchronisation is not allowed and would end it. */
cudaError_t tt_cuda_launch_status(void) {
  cudaError_t e = cudaGetLastError();
  int capturing = 0;
  if (e == cudaSuccess && g_sync && (e = is_capturing(g_stream, &capturing)) == cudaSuccess &&
      !capturing)
    e = cudaDeviceSynchronize();
  return e;
}

extern "C" int tt_cuda_sync_launches(void) { return g_sync; }

extern "C" int tt_cuda_set_sync_launches(int on) {
  g_sync = on != 0;
  return 0;
}

/* -- Start-up ----------------------------------------------------------------------- */

static int init_locked(void) {
  const char *sync = getenv("TETRA_CUDA_SYNC");
  TT_CHECK(!sync || !*sync || strcmp(sync, "0") == 0 || strcmp(sync, "1") == 0,
           "TETRA_CUDA_SYNC=%s: set it to 1 (wait for the GPU and check after every kernel "
           "launch) or 0", sync);
  g_sync = sync && strcmp(sync, "1") == 0;
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
  g_initialised = 1;
  return 0;
}

int tt_cuda_runtime_init(void) {
  pthread_mutex_lock(&g_lock);
  int rc = g_initialised ? 0 : init_locked();
  pthread_mutex_unlock(&g_lock);
  return rc;
}

int tt_cuda_use_device(int device) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  return use_device(device);
}

extern "C" int tt_cuda_current_device(void) {
  int d = -1;
  if (!g_initialised || cudaGetDevice(&d) != cudaSuccess) return -1;
  return d;
}

extern "C" int tt_cuda_set_device(int device) { return tt_cuda_use_device(device); }

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
  __atomic_add_fetch(&g_host_syncs, 1, __ATOMIC_RELAXED);
  TT_CU(cudaDeviceSynchronize());
  return 0;
}

int tt_cuda_sm_count(void) {
  int d = tt_cuda_current_device();
  return d >= 0 && d < MAX_GPUS && g_sm_count[d] > 0 ? g_sm_count[d] : 132;
}

cudaStream_t tt_cuda_cur_stream(void) { return g_stream; }

extern "C" void *tt_cuda_stream_raw(void) { return (void *)g_stream; }

/* The workspace of (device, stream), made on first use. Lock held. */
static int workspace_locked(int device, cudaStream_t stream, void **out) {
  for (int i = 0; i < g_num_workspaces; i++)
    if (g_workspaces[i].device == device && g_workspaces[i].stream == stream &&
        !g_workspaces[i].orphan) {
      *out = g_workspaces[i].ptr;
      return 0;
    }
  TT_CHECK(g_num_workspaces < MAX_WORKSPACES,
           "cuBLASLt: GEMMs on more than %d streams at once; destroy streams no longer used",
           MAX_WORKSPACES);
  void *p = NULL;
  /* (a first GEMM on a stream inside a capture: cudaMalloc joins no stream, allowed with
  ** the thread's capture mode relaxed for the call, as the allocator's cuda_alloc does) */
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t e = cudaMalloc(&p, g_workspace_bytes);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) cudaGetLastError();
  TT_CU(e);
  g_workspaces[g_num_workspaces].device = device;
  g_workspaces[g_num_workspaces].stream = stream;
  g_workspaces[g_num_workspaces].ptr = p;
  g_workspaces[g_num_workspaces].graphs = 0;
  g_workspaces[g_num_workspaces].orphan = 0;
  g_num_workspaces++;
  *out = p;
  return 0;
}

int tt_cuda_blaslt(cublasLtHandle_t *handle, void **workspace, size_t *workspace_bytes) {
  int d = tt_cuda_current_device();
  TT_CHECK(d >= 0 && d < MAX_GPUS, "cuBLASLt: no current CUDA device (call tt_cuda_init)");
  /* Opened here the first time (about 0.1 s) unless train.device=cuda did it, and outside
  ** the lock every launch's workspace lookup takes; a library that cannot be opened says
  ** which file, why and the fix, not cublasLtCreate's bare status. */
  if (!tt_blaslt_loaded()) return -1;
  pthread_mutex_lock(&g_lock);
  int rc = 0;
  if (!g_blaslt[d]) {
    cublasStatus_t s = cublasLtCreate(&g_blaslt[d]);
    if (s != CUBLAS_STATUS_SUCCESS) {
      rc = tt_cu_fail(s, "cublasLtCreate", __FILE__, __LINE__);
      g_blaslt[d] = NULL;
    }
  }
  if (rc == 0) rc = workspace_locked(d, g_stream, workspace);
  pthread_mutex_unlock(&g_lock);
  TT_TRY(rc);
  *handle = g_blaslt[d];
  *workspace_bytes = g_workspace_bytes;
  return 0;
}

extern "C" int tt_cuda_gemm_workspace(tt_cuda_stream *s, void **out) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  int d = tt_cuda_current_device();
  pthread_mutex_lock(&g_lock);
  int rc = workspace_locked(d, s ? s->s : (cudaStream_t)0, out);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

/* -- Streams and events ------------------------------------------------------------- */

struct tt_cuda_event { cudaEvent_t e; };

static cudaStream_t raw(tt_cuda_stream *s) { return s ? s->s : (cudaStream_t)0; }

static void (*g_stream_retired)(int device, void *stream);
static void (*g_stream_born)(int device, void *stream);

void tt_cuda_set_stream_retired_hook(void (*hook)(int device, void *stream)) {
  g_stream_retired = hook;
}

void tt_cuda_set_stream_born_hook(void (*hook)(int device, void *stream)) {
  g_stream_born = hook;
}

/* A new stream's handle may be a destroyed one's again: the born hook tells the allocator
** that the key is live (it treats a retired key's storages as needing no ordering). */
extern "C" int tt_cuda_stream_create(tt_cuda_stream **out) {
  tt_cuda_stream *s = (tt_cuda_stream *)calloc(1, sizeof *s);
  TT_CHECK(s, "tt_cuda_stream_create: out of host memory");
  cudaError_t e = cudaStreamCreate(&s->s);
  if (e != cudaSuccess) {
    free(s);
    return tt_cu_fail(e, "cudaStreamCreate", __FILE__, __LINE__);
  }
  if (g_stream_born)
    for (int d = 0; d < g_num_devices; d++) g_stream_born(d, (void *)s->s);
  *out = s;
  return 0;
}

/* Destroying the current stream makes the default stream current again. Its GEMM
** workspaces (those a live graph holds excepted: tt_cuda_graph_destroy frees them) and the
** allocator's blocks last used on it are released once its queued work has finished. */
extern "C" void tt_cuda_stream_destroy(tt_cuda_stream *s) {
  if (!s) return;
  if (g_stream_handle == s || g_stream == s->s) {
    g_stream = 0;
    g_stream_handle = NULL;
  }
  if (cudaStreamSynchronize(s->s) != cudaSuccess) cudaGetLastError();   /* (reported later) */
  pthread_mutex_lock(&g_lock);
  /* its workspace orphaned (no new GEMM gets it), and freed now unless a live graph holds
  ** it (then with its last graph) */
  for (int i = 0; i < g_num_workspaces; i++)
    if (g_workspaces[i].stream == s->s) g_workspaces[i].orphan = 1;
  free_unheld_locked();
  pthread_mutex_unlock(&g_lock);
  if (g_stream_retired)
    for (int d = 0; d < g_num_devices; d++) g_stream_retired(d, (void *)s->s);
  cudaStreamDestroy(s->s);
  free(s);
}

extern "C" int tt_cuda_set_stream(tt_cuda_stream *s) {
  g_stream = raw(s);
  g_stream_handle = s;
  return 0;
}

extern "C" tt_cuda_stream *tt_cuda_get_stream(void) { return g_stream_handle; }

extern "C" int tt_cuda_stream_synchronize(tt_cuda_stream *s) {
  TT_CU(tt_cuda_host_wait(raw(s)));
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

static void (*g_wait_hook)(void);
static cudaError_t poll_until(cudaError_t (*query)(void *), void *what);

extern "C" int tt_cuda_event_synchronize(tt_cuda_event *e) {
  TT_CHECK(e, "tt_cuda_event_synchronize: event is NULL");
  TT_CU(tt_cuda_host_wait_event(e->e));
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

/* -- Host waits --------------------------------------------------------------------- */

/* Set by a host wait refused during a capture: tt_cuda_graph_end then fails even when
** the CUDA calls before the wait were capturable. */
static int g_capture_waited;

extern "C" void tt_cuda_set_host_wait_hook(void (*hook)(void)) { g_wait_hook = hook; }

/* Waits until query(what) is no longer cudaErrorNotReady: blocking without a hook,
** polling with one (spin a little, then sleep 20 us at a time, the hook every 50 polls),
** so that the hook sees a collective the device waits for that never ends. */
static cudaError_t poll_until(cudaError_t (*query)(void *), void *what) {
  void (*hook)(void) = g_wait_hook;
  for (int polls = 0;; polls++) {
    cudaError_t r = query(what);
    if (r != cudaErrorNotReady) return r;
    cudaGetLastError();   /* "not ready" is recorded as the thread's last error: clear it */
    if (hook && polls % 50 == 49) hook();
    if (polls < 64) {
      sched_yield();
    } else {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
}

cudaError_t tt_cuda_host_wait(cudaStream_t s) {
  int capturing = 0;
  cudaError_t e = is_capturing(s, &capturing);
  if (e != cudaSuccess) return e;
  if (capturing) {
    g_capture_waited = 1;
    return cudaErrorStreamCaptureUnsupported;
  }
  __atomic_add_fetch(&g_host_syncs, 1, __ATOMIC_RELAXED);
  if (!g_wait_hook) return cudaStreamSynchronize(s);
  return poll_until([](void *st) { return cudaStreamQuery((cudaStream_t)st); }, (void *)s);
}

cudaError_t tt_cuda_host_wait_event(cudaEvent_t e) {
  int capturing = 0;   /* (the event may have been recorded inside the capture) */
  cudaError_t ce = is_capturing(g_stream, &capturing);
  if (ce != cudaSuccess) return ce;
  if (capturing) {
    g_capture_waited = 1;
    return cudaErrorStreamCaptureUnsupported;
  }
  __atomic_add_fetch(&g_host_syncs, 1, __ATOMIC_RELAXED);
  if (!g_wait_hook) return cudaEventSynchronize(e);
  return poll_until([](void *ev) { return cudaEventQuery((cudaEvent_t)ev); }, (void *)e);
}

extern "C" int64_t tt_cuda_host_sync_count(void) {
  return __atomic_load_n(&g_host_syncs, __ATOMIC_RELAXED);
}

/* -- Deferred input checks ---------------------------------------------------------- */

/* One record per kind of check; pos ~0 while nothing failed. */
struct check_record {
  unsigned long long pos;
  long long value, limit;
};
static check_record *g_checks[MAX_GPUS];   /* TT_CHECK_KINDS records per device */
static int g_defer_checks;

static const char *const g_check_messages[TT_CHECK_KINDS] = {
  "embedding: id %lld at position %llu is outside the vocabulary [0, %lld)",
  "cross_entropy: target %lld at row %llu is outside [0, %lld)",
  "vocab_parallel_cross_entropy: target %lld at row %llu is outside the vocabulary of the "
  "group (no rank, or more than one, owns it; this rank's shard ends before %lld)",
};

extern "C" int tt_cuda_set_deferred_checks(int on) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  int d = tt_cuda_current_device();
  if (on && !g_checks[d]) {
    TT_CU(cudaMalloc((void **)&g_checks[d], sizeof(check_record) * TT_CHECK_KINDS));
    TT_CU(cudaMemset(g_checks[d], 0xff, sizeof(check_record) * TT_CHECK_KINDS));
  }
  g_defer_checks = on != 0;
  return 0;
}

int tt_cuda_checks_deferred(void) { return g_defer_checks; }

/* Keeps the first failure: a record already set stays. */
__global__ void check_record_kernel(check_record *rec, const unsigned long long *bad_pos,
                                    const void *values, int values_i64, int64_t limit) {
  unsigned long long pos = *bad_pos;
  if (pos == ~0ull || rec->pos != ~0ull) return;
  rec->pos = pos;
  rec->value = values_i64 ? ((const long long *)values)[pos]
                          : (long long)((const int *)values)[pos];
  rec->limit = limit;
}

int tt_cuda_check_defer(int kind, const unsigned long long *bad_pos, const void *values,
                        int values_i64, int64_t limit) {
  check_record *rec = g_checks[tt_cuda_current_device()];
  TT_CHECK(rec && kind >= 0 && kind < TT_CHECK_KINDS,
           "deferred checks: not on for this device (tt_cuda_set_deferred_checks)");
  check_record_kernel<<<1, 1, 0, g_stream>>>(rec + kind, bad_pos, values, values_i64, limit);
  TT_CU_LAUNCHED("check_record_kernel");
  return 0;
}

__global__ void checks_flag_kernel(const check_record *rec, float *dst) {
  for (int k = 0; k < TT_CHECK_KINDS; k++)
    if (rec[k].pos != ~0ull) *dst = 1.0f;
}

extern "C" int tt_cuda_checks_flag(void *dst) {
  check_record *rec = g_checks[tt_cuda_current_device()];
  if (!rec) return 0;   /* never deferred on this device: nothing recorded */
  checks_flag_kernel<<<1, 1, 0, g_stream>>>(rec, (float *)dst);
  TT_CU_LAUNCHED("checks_flag_kernel");
  return 0;
}

extern "C" int tt_cuda_checks_take(void) {
  check_record *rec = g_checks[tt_cuda_current_device()];
  if (!rec) return 0;
  check_record host[TT_CHECK_KINDS];
  TT_CU(cudaMemcpyAsync(host, rec, sizeof host, cudaMemcpyDeviceToHost, g_stream));
  TT_CU(tt_cuda_host_wait(g_stream));
  TT_CU(cudaMemsetAsync(rec, 0xff, sizeof host, g_stream));
  for (int k = 0; k < TT_CHECK_KINDS; k++)
    if (host[k].pos != ~0ull)
      return tt_set_error(g_check_messages[k], host[k].value, host[k].pos, host[k].limit);
  return 0;
}

/* -- CUDA graphs -------------------------------------------------------------------- */

struct tt_cuda_graph {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  void *workspace;   /* the capture stream's GEMM workspace, held (NULL: none) */
};

/* The graph takes (+1) or gives back (-1) the workspace of (device, stream), made
** before or during the capture; given back last by a graph whose stream is gone, it is
** freed (cudaFree waits for the device's work first, a replay still in flight included:
** the programming guide's implicit synchronisation). */
static void *hold_workspace(int device, cudaStream_t stream) {
  void *held = NULL;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_num_workspaces; i++)
    if (g_workspaces[i].device == device && g_workspaces[i].stream == stream &&
        !g_workspaces[i].orphan) {
      g_workspaces[i].graphs++;
      held = g_workspaces[i].ptr;
    }
  pthread_mutex_unlock(&g_lock);
  return held;
}

/* Frees the orphaned workspaces no graph holds any more (lock held). Not during a
** capture on this thread's stream: cudaFree synchronises the device, which would end it
** (a graph the Lua collector frees inside a captured step); the next release or stream
** destroy outside one frees them. */
static void free_unheld_locked(void) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (g_stream && cudaStreamIsCapturing(g_stream, &cap) == cudaSuccess &&
      cap != cudaStreamCaptureStatusNone)
    return;
  for (int i = 0; i < g_num_workspaces;) {
    if (g_workspaces[i].orphan && g_workspaces[i].graphs == 0) {
      cudaFree(g_workspaces[i].ptr);
      g_workspaces[i] = g_workspaces[--g_num_workspaces];
    } else {
      i++;
    }
  }
}

static void release_workspace(void *ptr) {
  if (!ptr) return;
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < g_num_workspaces; i++)
    if (g_workspaces[i].ptr == ptr) {
      g_workspaces[i].graphs--;
      break;
    }
  free_unheld_locked();
  pthread_mutex_unlock(&g_lock);
}

extern "C" int tt_cuda_graph_capturing(void) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  return g_stream && cudaStreamIsCapturing(g_stream, &cap) == cudaSuccess &&
         cap != cudaStreamCaptureStatusNone;
}

/* Thread-local mode: another thread's unrelated CUDA calls (the data loader's copies) do
** not break the capture; this thread's own unsafe calls are refused, except the caching
** allocator's cudaMalloc (cuda_alloc relaxes the mode for it). A warm-up step that grows
** the cache first still keeps cudaMalloc out of the step. */
extern "C" int tt_cuda_graph_begin(void) {
  TT_CHECK(g_initialised, "cuda: call tt_cuda_init first");
  TT_CHECK(g_stream, "cuda graph capture: the current stream is the legacy default stream, "
                     "which cannot be captured (tt_cuda_stream_create and tt_cuda_set_stream "
                     "first)");
  TT_CHECK(!tt_cuda_graph_capturing(), "cuda graph capture: already capturing this stream");
  TT_CU(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  g_capture_waited = 0;
  return 0;
}

extern "C" int tt_cuda_graph_end(tt_cuda_graph **out) {
  TT_CHECK(out, "tt_cuda_graph_end: out is NULL");
  TT_CHECK(tt_cuda_graph_capturing(), "cuda graph capture: tt_cuda_graph_end without "
                                      "tt_cuda_graph_begin on the current stream");
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(g_stream, &graph);
  if (e == cudaSuccess && g_capture_waited) {
    cudaGraphDestroy(graph);
    return tt_set_error("cuda graph capture failed: the captured work waited for the device "
                        "(a copy to the host or a synchronisation); nothing was kept");
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tt_set_error("cuda graph capture failed: %s (%s); a host wait, a cudaMalloc or "
                        "work from another stream during the capture invalidates it",
                        cudaGetErrorString(e), cudaGetErrorName(e));
  }
  tt_cuda_graph *g = (tt_cuda_graph *)calloc(1, sizeof *g);
  if (!g) {
    cudaGraphDestroy(graph);
    return tt_set_error("tt_cuda_graph_end: out of host memory");
  }
  g->graph = graph;
  e = cudaGraphInstantiate(&g->exec, graph, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    free(g);
    return tt_cu_fail(e, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  g->workspace = hold_workspace(tt_cuda_current_device(), g_stream);
  *out = g;
  return 0;
}

extern "C" int tt_cuda_graph_replay(tt_cuda_graph *g) {
  TT_CHECK(g, "tt_cuda_graph_replay: graph is NULL");
  TT_CU(cudaGraphLaunch(g->exec, g_stream));
  return 0;
}

extern "C" void tt_cuda_graph_destroy(tt_cuda_graph *g) {
  if (!g) return;
  cudaGraphExecDestroy(g->exec);
  cudaGraphDestroy(g->graph);
  release_workspace(g->workspace);
  free(g);
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

extern "C" int tt_cuda_copy_to_host_async(void *pinned_dst, const void *src, int device,
                                          size_t nbytes) {
  TT_TRY(use_device(device));
  TT_CU(cudaMemcpyAsync(pinned_dst, src, nbytes, cudaMemcpyDeviceToHost, g_stream));
  return 0;
}
