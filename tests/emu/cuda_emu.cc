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
#include <ucontext.h>

#include <map>
#include <string>
#include <vector>

extern "C" {
#include "kernel.h"
}
#include "kernel_cuda.h"
#include "tt_emu.h"

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace tt_emu {
int launches = 0;
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
  const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
  for (uint64_t k = 0; k < blocks; k++) {
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
  launches++;
}

/* -- Memory ------------------------------------------------------------------------- */

namespace {
constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xa5;
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

size_t live_blocks(void) { return g_blocks.size(); }

}  // namespace tt_emu

/* -- The CUDA runtime calls the kernels make ----------------------------------------- */

extern "C" {

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

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = tt_emu::alloc(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  (void)s;
  return cudaMalloc(p, bytes);
}

cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  return tt_emu::release(p) ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return cudaFree(p);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k) {
  (void)k;
  memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s) {
  (void)s;
  return cudaMemcpy(dst, src, bytes, k);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind k, cudaStream_t s) {
  (void)k, (void)s;
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  for (size_t r = 0; r < height; r++)
    memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  memset(p, v, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  (void)s;
  return cudaMemset(p, v, bytes);
}

cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

}  // extern "C"

/* -- The engine's CUDA runtime, as kernel_cuda.h declares it ------------------------- */

int tt_cu_fail(cudaError_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s", file, line, call, cudaGetErrorString(e));
}

int tt_cu_fail(cublasStatus_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: cuBLAS status %d (no cuBLAS under the emulator)", file,
                      line, call, (int)e);
}

cudaError_t tt_cuda_launch_status(void) { return cudaGetLastError(); }

cudaStream_t tt_cuda_cur_stream(void) { return 0; }

int tt_cuda_sm_count(void) { return tt_emu::sm_count; }

cudaError_t tt_cuda_host_wait(cudaStream_t s) { return cudaStreamSynchronize(s); }

cudaError_t tt_cuda_host_wait_event(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}

int tt_cuda_checks_deferred(void) { return 0; }

int tt_cuda_check_defer(int kind, const unsigned long long *bad_pos, const void *values,
                        int values_i64, int64_t limit) {
  (void)kind, (void)bad_pos, (void)values, (void)values_i64, (void)limit;
  return tt_set_error("tt_cuda_check_defer: deferred checks are off under the emulator");
}

int tt_cuda_blaslt(cublasLtHandle_t *handle, void **workspace, size_t *workspace_bytes) {
  (void)handle, (void)workspace, (void)workspace_bytes;
  return tt_set_error("cuBLASLt: not under the emulator (kernels/cuda/matmul.cu is not "
                      "emulated)");
}
