/*
** cuda_emu.cc — the scheduler behind cuda_emu.h, the part of the CUDA runtime the kernels
** call, and the engine's CUDA runtime functions that kernels/kernel_cuda.h declares
** (engine/runtime/cuda.cu defines them on a GPU).
**
** Memory: a "device" allocation is host memory between two guard zones of known bytes,
** filled with all-ones bits (NaN as floats, as test_kernels.c poisons the GPU's cache) so
** an element a kernel forgets to write shows. After each launch every live allocation's
** guards are checked: a write outside a buffer fails the launch, naming it.
** Streams and events: there is one order; every call completes before it returns.
*/
#include "cuda_emu.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "kernel.h"
}
#include "kernel_cuda.h"
#include "tt_emu.h"

/* Where the linker put every __shared__ variable (cuda_emu.h's section). */
extern "C" char __start_tt_emu_shared[] __attribute__((weak));
extern "C" char __stop_tt_emu_shared[] __attribute__((weak));

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace tt_emu {
int sm_count = 2;
/* TT_EMU_ORDER=reverse: the blocks of a grid, and the threads of a block between two
** barriers, run last to first. A kernel whose result depends on the order (a missing
** barrier or atomic) can pass in one order and fail in the other; ctest runs both. */
static const bool reversed = [] {
  const char *o = getenv("TT_EMU_ORDER");
  return o && !strcmp(o, "reverse");
}();

namespace {

enum State { RUNNING, AT_BLOCK, AT_WARP, DONE };

/* A CUDA thread: a stack of its own, entered once through makecontext, then switched to
** and from with _setjmp / _longjmp (no signal-mask system call per switch, as swapcontext
** makes). Between threads it parks at the top of fiber_entry's loop and runs the kernel
** again for the next thread it is given. */
struct Fiber {
  jmp_buf ctx;
  ucontext_t entry;
  bool started;
  State state;
  uint3 idx;
  unsigned mask;      /* AT_WARP: the lanes named */
  uint64_t offer;     /* AT_WARP: the bits offered */
  int src;            /* AT_WARP: the lane read */
  uint64_t got;       /* after the meeting */
  int any, all;
  unsigned ballot;
};

constexpr size_t kStack = 64 * 1024;

struct Launch {
  std::vector<Fiber> fibers;
  std::vector<char *> stacks;
  jmp_buf sched;
  Fiber *cur = nullptr;
  void (*body)(void *) = nullptr;
  void *ctx = nullptr;
  std::string error;
};
Launch g_launch;
cudaError_t g_last = cudaSuccess;
std::string g_last_why;

void fiber_entry(void) {
  Launch &L = g_launch;
  Fiber *f = L.cur;
  for (;;) {
    if (!_setjmp(f->ctx)) _longjmp(L.sched, 1);   /* parked */
    L.body(L.ctx);
    f->state = DONE;
  }
}

void set_builtins(const Fiber &f) { threadIdx = f.idx; }

/* Runs fiber f until it parks, waits at a barrier or ends. */
void resume(Fiber &f) {
  Launch &L = g_launch;
  L.cur = &f;
  set_builtins(f);
  if (!_setjmp(L.sched)) _longjmp(f.ctx, 1);
}

/* Makes fiber t's stack and parks it, once. */
void start_fiber(int t) {
  Launch &L = g_launch;
  Fiber &f = L.fibers[t];
  if (f.started) return;
  ucontext_t here;
  getcontext(&f.entry);
  f.entry.uc_stack.ss_sp = L.stacks[t];
  f.entry.uc_stack.ss_size = kStack;
  f.entry.uc_link = nullptr;   /* fiber_entry never returns */
  makecontext(&f.entry, fiber_entry, 0);
  L.cur = &f;
  if (!_setjmp(L.sched)) swapcontext(&here, &f.entry);
  f.started = true;
}

void yield_to_scheduler(void) {
  Launch &L = g_launch;
  Fiber *f = L.cur;
  if (!_setjmp(f->ctx)) _longjmp(L.sched, 1);
  set_builtins(*f);
}

void fail_launch(cudaError_t e, const std::string &why) {
  if (g_last == cudaSuccess) {
    g_last = e;
    g_last_why = why;
  }
}

/* Releases warp w0 / 32's meeting (lanes w0 to w0 + n - 1) when every named lane still
** running has reached it. Returns the lanes released; a named lane waiting at
** __syncthreads is a deadlock (-1, the error set). */
int release_warp(int w0, int n) {
  Launch &L = g_launch;
  int released = 0;
  {
    Fiber *lane[32];
    unsigned waiting = 0, alive = 0, mask = 0;
    for (int l = 0; l < n; l++) {
      lane[l] = &L.fibers[w0 + l];
      if (lane[l]->state != DONE) alive |= 1u << l;
      if (lane[l]->state == AT_WARP) {
        waiting |= 1u << l;
        mask = lane[l]->mask;
      }
    }
    if (!waiting) return 0;
    for (int l = 0; l < n; l++)
      if ((waiting >> l & 1) && lane[l]->mask != mask) {
        L.error = "warp " + std::to_string(w0 / 32) + ": lanes meet with different masks";
        return -1;
      }
    const unsigned need = mask & alive;
    if ((waiting & need) != need) {
      for (int l = 0; l < n; l++)
        if ((need >> l & 1) && lane[l]->state == AT_BLOCK) {
          L.error = "warp " + std::to_string(w0 / 32) + ": lane " + std::to_string(l) +
                    " waits at __syncthreads while lanes of its warp wait in a warp "
                    "collective that names it";
          return -1;
        }
      return 0;   /* some named lanes are still running */
    }
    int any = 0, all = 1;
    unsigned ballot = 0;
    for (int l = 0; l < n; l++)
      if (waiting >> l & 1) {
        const int p = (int)(lane[l]->offer & 1);
        any |= p;
        all &= p;
        ballot |= (unsigned)p << l;
      }
    for (int l = 0; l < n; l++) {
      if (!(waiting >> l & 1)) continue;
      const int s = lane[l]->src;
      lane[l]->got = s >= 0 && s < n && (waiting >> s & 1) ? lane[s]->offer : ~0ull;
      lane[l]->any = any;
      lane[l]->all = all;
      lane[l]->ballot = ballot;
      lane[l]->state = RUNNING;
      released++;
    }
  }
  return released;
}

/* Runs one block to the end; false with L.error set on a deadlock. Warp by warp: each
** warp runs as far as it can (through its own shuffles and votes) before the next one
** starts, and the block's barrier opens when every warp has reached it. That is an order
** a GPU may take (warps are independent between barriers), and the one in which a
** warp that writes shared memory early overwrites what a later warp has not read yet. */
bool run_block(int nthreads) {
  Launch &L = g_launch;
  for (int t = 0; t < nthreads; t++) {
    start_fiber(t);
    L.fibers[t].state = RUNNING;
  }
  const int nwarps = (nthreads + 31) / 32;
  for (;;) {
    for (int k = 0; k < nwarps; k++) {
      const int w0 = (reversed ? nwarps - 1 - k : k) * 32;
      const int n = nthreads - w0 < 32 ? nthreads - w0 : 32;
      for (;;) {
        for (int j = 0; j < n; j++) {
          Fiber &f = L.fibers[w0 + (reversed ? n - 1 - j : j)];
          if (f.state == RUNNING) resume(f);
        }
        const int released = release_warp(w0, n);
        if (released < 0) return false;
        if (released == 0) break;
      }
    }
    int done = 0, at_block = 0;
    for (int t = 0; t < nthreads; t++) {
      done += L.fibers[t].state == DONE;
      at_block += L.fibers[t].state == AT_BLOCK;
    }
    if (done == nthreads) return true;
    if (at_block > 0 && at_block + done == nthreads) {
      /* Every thread still running is at the barrier (threads that returned early do not
      ** hold it up on sm_70 and later). */
      for (int t = 0; t < nthreads; t++)
        if (L.fibers[t].state == AT_BLOCK) L.fibers[t].state = RUNNING;
      continue;
    }
    L.error = "deadlock: " + std::to_string(at_block) + " of " + std::to_string(nthreads) +
              " threads wait at __syncthreads, the others in warp collectives";
    return false;
  }
}

}  // namespace

void sync_block(void) {
  g_launch.cur->state = AT_BLOCK;
  yield_to_scheduler();
}

uint64_t warp_meet(unsigned mask, uint64_t bits, int src, int *any, int *all,
                   unsigned *ballot) {
  Fiber *f = g_launch.cur;
  f->state = AT_WARP;
  f->mask = mask;
  f->offer = bits;
  f->src = src;
  yield_to_scheduler();
  *any = f->any;
  *all = f->all;
  *ballot = f->ballot;
  return f->got;
}

void run(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *),
         void *ctx) {
  (void)stream;
  const uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
  char why[200];
  if (!grid.x || !grid.y || !grid.z || !nthreads || nthreads > 1024 || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535 || smem > 48 * 1024) {
    snprintf(why, sizeof why, "launch of grid (%u, %u, %u) blocks of (%u, %u, %u) threads, "
             "%zu bytes of dynamic shared memory", grid.x, grid.y, grid.z, block.x, block.y,
             block.z, smem);
    fail_launch(cudaErrorInvalidConfiguration, why);
    return;
  }
  Launch &L = g_launch;
  L.body = body;
  L.ctx = ctx;
  L.error.clear();
  if (L.fibers.empty()) L.fibers.resize(1024);   /* never moved: fiber_entry keeps its own */
  while (L.stacks.size() < nthreads) L.stacks.push_back((char *)malloc(kStack));
  gridDim = grid;
  blockDim = block;
  const size_t shared_bytes = __start_tt_emu_shared
                                  ? (size_t)((uintptr_t)__stop_tt_emu_shared -
                                             (uintptr_t)__start_tt_emu_shared)
                                  : 0;
  const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
  for (uint64_t k = 0; k < blocks; k++) {
    /* shared memory starts as all-ones bits in every block, as device memory does */
    if (shared_bytes) memset(__start_tt_emu_shared, 0xff, shared_bytes);
    const uint64_t b = reversed ? blocks - 1 - k : k;
    const unsigned x = (unsigned)(b % grid.x), y = (unsigned)(b / grid.x % grid.y),
                   z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
    blockIdx = make_uint3(x, y, z);
    for (unsigned t = 0; t < nthreads; t++)
      L.fibers[t].idx = make_uint3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
    if (!run_block((int)nthreads)) {
      /* threads left at a barrier are abandoned: their stacks start afresh next time */
      for (unsigned t = 0; t < nthreads; t++)
        if (L.fibers[t].state != DONE) L.fibers[t].started = false;
      snprintf(why, sizeof why, "block (%u, %u, %u): ", x, y, z);
      fail_launch(cudaErrorLaunchFailure, why + L.error);
      return;
    }
  }
  std::string bad = check_guards();
  if (!bad.empty()) fail_launch(cudaErrorIllegalAddress, bad);
}

/* -- Memory ------------------------------------------------------------------------- */

namespace {
constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xff;   /* read as a float: NaN, as an integer: -1 */
struct Block {
  size_t bytes;
  char *base;   /* guard, bytes, guard */
};
std::map<void *, Block> g_blocks;

bool guard_ok(const char *p) {
  for (size_t i = 0; i < kGuard; i++)
    if ((unsigned char)p[i] != kGuardByte) return false;
  return true;
}
}  // namespace

void *alloc(size_t bytes) {
  char *base = (char *)malloc(bytes + 2 * kGuard);
  if (!base) return nullptr;
  memset(base, kGuardByte, kGuard);
  memset(base + kGuard, 0xff, bytes);
  memset(base + kGuard + bytes, kGuardByte, kGuard);
  g_blocks[base + kGuard] = Block{bytes, base};
  return base + kGuard;
}

bool release(void *p) {
  auto it = g_blocks.find(p);
  if (it == g_blocks.end()) return false;
  free(it->second.base);
  g_blocks.erase(it);
  return true;
}

std::string check_guards(void) {
  for (auto &kv : g_blocks) {
    const Block &b = kv.second;
    const bool before = guard_ok(b.base), after = guard_ok(b.base + kGuard + b.bytes);
    if (!before || !after) {
      char why[160];
      snprintf(why, sizeof why, "a kernel wrote %s the %zu-byte buffer at %p",
               before ? "past the end of" : "before the start of", b.bytes, kv.first);
      for (size_t i = 0; i < kGuard; i++) b.base[i] = (char)kGuardByte;
      memset(b.base + kGuard + b.bytes, kGuardByte, kGuard);
      return why;
    }
  }
  return "";
}

size_t live_bytes(void) {
  size_t n = 0;
  for (auto &kv : g_blocks) n += kv.second.bytes;
  return n;
}

}  // namespace tt_emu

/* -- Streams, events and graphs ----------------------------------------------------- */
/* One order: work on any stream runs when it is issued, except on a stream being captured,
** where it is recorded into the capture's graph and runs at each launch of that graph. */

struct CUstream_st {
  CUgraph_st *capture = nullptr;   /* the graph being captured, or none */
  bool relaxed = false;            /* that capture's mode is cudaStreamCaptureModeRelaxed */
};
struct CUevent_st {
  double t = 0;                        /* seconds, when last recorded */
  CUgraph_st *captured_in = nullptr;   /* recorded into this capture, or none */
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

namespace tt_emu {

static double now_s(void) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

std::vector<cudaStream_t> joined;   /* streams that joined a capture by an event */
std::set<CUgraph_st *> capturing;   /* the captures going on */
/* Captures begun on this thread: the calls CUDA calls unsafe during one (a synchronous
** copy, set or free, a device-wide wait) fail here, as they do there, instead of running
** on data the captured work has not made yet. */
thread_local int capturing_here = 0;
/* The thread's own mode (cudaThreadExchangeStreamCaptureMode): Relaxed allows them. */
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

cudaError_t unsafe(const char *call) {
  if (!capturing_here || thread_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  fail_launch(cudaErrorStreamCaptureUnsupported,
              std::string(call) + " while this thread captures a graph");
  return cudaErrorStreamCaptureUnsupported;
}

bool submit(cudaStream_t s, std::function<void()> op) {
  if (s && s->capture) {
    s->capture->ops.push_back(std::move(op));
    return true;
  }
  op();
  return false;
}

}  // namespace tt_emu

extern "C" {

/* A C entry for the emulated cuBLASLt (libcublasLt_emu): runs fn(ctx) now, or records it
** when s is being captured (then free_ctx(ctx) when the graph goes; now: after the run). */
int tt_emu_submit(cudaStream_t s, void (*fn)(void *), void *ctx, void (*free_ctx)(void *)) {
  std::shared_ptr<void> keep(ctx, free_ctx);
  tt_emu::submit(s, [fn, keep] { fn(keep.get()); });
  return 0;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tt_emu::g_last;
  tt_emu::g_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tt_emu::g_last; }

const char *cudaGetErrorString(cudaError_t e) {
  static thread_local char text[400];
  snprintf(text, sizeof text, "emulated CUDA error %d%s%s", (int)e,
           tt_emu::g_last_why.empty() ? "" : ": ", tt_emu::g_last_why.c_str());
  return text;
}

const char *cudaGetErrorName(cudaError_t e) {
  (void)e;
  return "cudaErrorEmulated";
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
  if (d != 0) return cudaErrorInvalidDevice;
  switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = tt_emu::sm_count; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
    default: *v = 0; return cudaSuccess;
  }
}

/* An H100's numbers where the engine reads them (name, memory, compute capability). */
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  if (d != 0) return cudaErrorInvalidDevice;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "emulated (tests/emu)");
  p->totalGlobalMem = (size_t)80 << 30;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = tt_emu::sm_count;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = 48 * 1024;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  *total = (size_t)80 << 30;
  *free_bytes = *total - tt_emu::live_bytes();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  return tt_emu::unsafe("cudaDeviceSynchronize");
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = new CUstream_st;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  (void)flags;
  return cudaStreamCreate(s);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto &j = tt_emu::joined;
  j.erase(std::remove(j.begin(), j.end(), s), j.end());
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return s && s->capture ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

/* A stream that waits for an event recorded inside a capture joins that capture, as CUDA
** has it: what it does next is the graph's too, until the capture ends. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)flags;
  if (e->captured_in && s && !s->capture && tt_emu::capturing.count(e->captured_in)) {
    s->capture = e->captured_in;
    tt_emu::joined.push_back(s);
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  *e = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  (void)flags;
  return cudaEventCreate(e);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  e->captured_in = s ? s->capture : nullptr;
  tt_emu::submit(s, [e] { e->t = tt_emu::now_s(); });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = (float)((b->t - a->t) * 1e3);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!s) return cudaErrorStreamCaptureUnsupported;   /* the legacy stream cannot capture */
  if (s->capture) return cudaErrorIllegalState;
  s->capture = new CUgraph_st;
  tt_emu::capturing.insert(s->capture);
  if (mode != cudaStreamCaptureModeRelaxed) tt_emu::capturing_here++;
  s->relaxed = mode == cudaStreamCaptureModeRelaxed;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  if (!s || !s->capture) return cudaErrorIllegalState;
  *g = s->capture;
  s->capture = nullptr;
  tt_emu::capturing.erase(*g);
  if (!s->relaxed) tt_emu::capturing_here--;
  auto &j = tt_emu::joined;   /* the streams that joined it leave it */
  for (size_t i = 0; i < j.size();)
    if (j[i]->capture == *g) {
      j[i]->capture = nullptr;
      j[i] = j.back();
      j.pop_back();
    } else {
      i++;
    }
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
  *status = s && s->capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
  std::swap(*mode, tt_emu::thread_mode);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g,
                                 unsigned long long flags) {
  (void)flags;
  *exec = new CUgraphExec_st;
  (*exec)->ops = g->ops;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  for (auto &op : exec->ops) tt_emu::submit(s, op);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}

/* -- Memory and copies --------------------------------------------------------------- */
/* An allocation made while a stream captures is the graph's for good (a graph's memory
** stays at one address); a free then is dropped. */

cudaError_t cudaMalloc(void **p, size_t bytes) {
  if (cudaError_t e = tt_emu::unsafe("cudaMalloc")) return e;
  *p = tt_emu::alloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  (void)s;
  *p = tt_emu::alloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p) {
  if (cudaError_t e = tt_emu::unsafe("cudaFree")) return e;
  if (!p) return cudaSuccess;
  return tt_emu::release(p) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (s && s->capture) return cudaSuccess;
  if (!p) return cudaSuccess;
  return tt_emu::release(p) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  *p = malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k) {
  if (cudaError_t e = tt_emu::unsafe("cudaMemcpy")) return e;
  (void)k;
  memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s) {
  (void)k;
  tt_emu::submit(s, [=] { memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t bytes,
                                cudaStream_t s) {
  if (dd != 0 || sd != 0) return cudaErrorInvalidDevice;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind k, cudaStream_t s) {
  (void)k;
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  tt_emu::submit(s, [=] {
    for (size_t r = 0; r < height; r++)
      memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  if (cudaError_t e = tt_emu::unsafe("cudaMemset")) return e;
  memset(p, v, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  tt_emu::submit(s, [=] { memset(p, v, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t width, size_t height,
                              cudaStream_t s) {
  if (width > pitch) return cudaErrorInvalidPitchValue;
  tt_emu::submit(s, [=] {
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, v, width);
  });
  return cudaSuccess;
}

}  // extern "C"
