/*
** cuda_emu.cc — the scheduler behind cuda_emu.h, the part of the CUDA runtime the kernels
** call, and the engine's CUDA runtime functions that kernels/kernel_cuda.h declares
** (engine/runtime/cuda.cu defines them on a GPU).
**
** Memory: a "device" allocation is a mapping of its own: guard bytes, the buffer, then a
** page no access may touch, all but that page filled with all-ones bits (NaN as floats,
** as test_kernels.c poisons the GPU's cache) so an element a kernel forgets to write
** shows. After each launch the guards of the buffers it touched are checked: a write
** outside a buffer fails the launch, naming it. cudaMalloc's buffers are closed to host
** code outside device work (Block, below).
** Streams and events: work issued on a stream runs when the host waits for it (Deferred
** work, below); a capture records it instead.
*/
#include "cuda_emu.h"

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>

#include <algorithm>
#include <deque>
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

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

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

/* Switching stacks. A Ctx is where a stack left off; ctx_make readies a fresh stack to
** enter `entry`, and ctx_swap(from, to) leaves the running stack in `from` and carries on
** in `to`. On x86-64 a switch is tt_emu_swap: the registers a call must preserve (System V
** ABI: rbx, rbp, r12 to r15) pushed on the stack left, the stack pointer swapped, and
** theirs popped from the stack entered; no CUDA thread changes the floating-point control
** words, so those are not kept. Elsewhere _setjmp / _longjmp, a stack's first entry
** through makecontext and setcontext. (glibc's _longjmp unwinds cancellation handlers and
** demangles pointers on every jump: with _setjmp it was a fifth of an emulated training
** step's time, measured with perf on recipes/tiny.lua; swapcontext costs a system call
** each, for the signal mask.) */
#if defined(__x86_64__)
extern "C" void tt_emu_swap(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl tt_emu_swap\n"
    ".type tt_emu_swap, @function\n"
    "tt_emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size tt_emu_swap, .-tt_emu_swap\n");

struct Ctx {
  void *sp;
};

/* The fresh stack as tt_emu_swap leaves one: six saved registers (zero), then the address
** its ret goes to, entry, whose frame then starts as a call's would (the stack pointer 8
** below a 16-byte boundary, under a return address entry never uses). */
void ctx_make(Ctx &c, char *stack, size_t size, void (*entry)(void)) {
  void **sp = (void **)((uintptr_t)(stack + size) & ~(uintptr_t)15);
  *--sp = nullptr;
  *--sp = (void *)entry;
  for (int i = 0; i < 6; i++) *--sp = nullptr;
  c.sp = sp;
}

void ctx_swap(Ctx &from, Ctx &to) { tt_emu_swap(&from.sp, to.sp); }
#else
struct Ctx {
  jmp_buf jb;
  ucontext_t fresh;
  bool is_fresh;
};

void ctx_make(Ctx &c, char *stack, size_t size, void (*entry)(void)) {
  getcontext(&c.fresh);
  c.fresh.uc_stack.ss_sp = stack;
  c.fresh.uc_stack.ss_size = size;
  c.fresh.uc_link = nullptr;   /* entry never returns */
  makecontext(&c.fresh, entry, 0);
  c.is_fresh = true;
}

void ctx_swap(Ctx &from, Ctx &to) {
  if (_setjmp(from.jb)) return;
  if (to.is_fresh) {
    to.is_fresh = false;
    setcontext(&to.fresh);
  }
  _longjmp(to.jb, 1);
}
#endif

/* A CUDA thread: a stack of its own, entered once (start_fiber) and parked at the top of
** fiber_entry's loop; between threads it parks there again and runs the kernel anew for
** the next thread it is given. */
struct Fiber {
  Ctx ctx;
  bool started;
  State state;
  uint3 idx;
  unsigned mask;      /* AT_WARP: the lanes named */
  uint64_t offer;     /* AT_WARP: the bits offered */
  int src;            /* AT_WARP: the lane read */
  uint64_t got;       /* after the meeting */
  int any, all;
  unsigned ballot;
  void *asan_fake;    /* AddressSanitizer's record of the stack while switched away */
};

constexpr size_t kStack = 64 * 1024;

struct Launch {
  std::vector<Fiber> fibers;
  /* never destroyed, so that work deferred to an exit handler still has its stacks (and a
  ** leak check at exit sees them reachable) */
  std::vector<char *> &stacks = *new std::vector<char *>;
  Ctx sched;
  Fiber *cur = nullptr;
  void (*body)(void *) = nullptr;
  void *ctx = nullptr;
  std::string error;
  bool in_fiber = false;   /* a CUDA thread runs (a fault there is the kernel's) */
  bool faulted = false;    /* a CUDA thread touched a buffer's guard page: `fault` says */
  char fault[400];
};
Launch g_launch;
cudaError_t g_last = cudaSuccess;
std::string g_last_why;

/* Every switch between the scheduler's stack and a fiber's is announced to
** AddressSanitizer when it is built in (the fiber interface of its
** common_interface_defs.h): start before the jump, finish on arrival. Otherwise it takes
** a fiber's frames for the scheduler's and reports what it cannot follow. */
#if defined(__SANITIZE_ADDRESS__)
const void *g_sched_bottom;
size_t g_sched_size;
void *g_sched_fake;
void to_fiber(const char *stack) { __sanitizer_start_switch_fiber(&g_sched_fake, stack, kStack); }
void on_fiber(Fiber &f) { __sanitizer_finish_switch_fiber(f.asan_fake, &g_sched_bottom, &g_sched_size); }
/* abandoned: a fiber that never resumes (its thread faulted) keeps no record */
void to_scheduler(Fiber *f) {
  __sanitizer_start_switch_fiber(f ? &f->asan_fake : nullptr, g_sched_bottom, g_sched_size);
}
void on_scheduler(void) { __sanitizer_finish_switch_fiber(g_sched_fake, nullptr, nullptr); }
#else
void to_fiber(const char *) {}
void on_fiber(Fiber &) {}
void to_scheduler(Fiber *) {}
void on_scheduler(void) {}
#endif

void fiber_entry(void) {
  Launch &L = g_launch;
  Fiber *f = L.cur;
  on_fiber(*f);
  for (;;) {
    to_scheduler(f);   /* parked */
    ctx_swap(f->ctx, L.sched);
    on_fiber(*f);
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
  L.in_fiber = true;
  to_fiber(L.stacks[&f - L.fibers.data()]);
  ctx_swap(L.sched, f.ctx);
  on_scheduler();
  L.in_fiber = false;
}

/* Makes fiber t's stack and parks it, once. */
void start_fiber(int t) {
  Launch &L = g_launch;
  Fiber &f = L.fibers[t];
  if (f.started) return;
  ctx_make(f.ctx, L.stacks[t], kStack, fiber_entry);
  L.cur = &f;
  f.asan_fake = nullptr;
  to_fiber(L.stacks[t]);
  ctx_swap(L.sched, f.ctx);
  on_scheduler();
  f.started = true;
}

void yield_to_scheduler(void) {
  Launch &L = g_launch;
  Fiber *f = L.cur;
  to_scheduler(f);
  ctx_swap(f->ctx, L.sched);
  on_fiber(*f);
  set_builtins(*f);
}

/* Failures so far, and the last one's error: a host wait returns the error of work that
** failed while it waited (as a GPU reports a fault at the next synchronisation). */
uint64_t g_failures;
cudaError_t g_failure_last = cudaSuccess;

void fail_launch(cudaError_t e, const std::string &why) {
  g_failures++;
  g_failure_last = e;
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
          if (L.faulted) {
            L.error = L.fault;
            return false;
          }
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

bool launch_config_ok(dim3 grid, dim3 block, size_t smem) {
  const uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !nthreads || nthreads > 1024 || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535 || smem > 48 * 1024) {
    char why[200];
    snprintf(why, sizeof why, "launch of grid (%u, %u, %u) blocks of (%u, %u, %u) threads, "
             "%zu bytes of dynamic shared memory", grid.x, grid.y, grid.z, block.x, block.y,
             block.z, smem);
    fail_launch(cudaErrorInvalidConfiguration, why);
    return false;
  }
  return true;
}

void run(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *),
         void *ctx) {
  (void)stream, (void)smem;   /* (its configuration was checked when issued) */
  const uint64_t nthreads = (uint64_t)block.x * block.y * block.z;
  char why[200];
  Launch &L = g_launch;
  L.body = body;
  L.ctx = ctx;
  L.error.clear();
  L.faulted = false;
  DeviceWork device;   /* the kernel may touch any device buffer */
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
      fail_launch(L.faulted ? cudaErrorIllegalAddress : cudaErrorLaunchFailure, why + L.error);
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
/* A device buffer is a mapping of its own: a front guard zone (at least kGuard bytes),
** the buffer (its size rounded up to 256 bytes, so it starts 256-byte aligned as
** cudaMalloc's do; the rounding's slack is guard bytes too), then one page that is never
** readable, so a kernel that reads or writes past the rounded end faults at the access.
** cudaMalloc's buffers are also closed to host code: unreadable while no device work
** runs, opened one by one as device work (a kernel, a copy, cuBLASLt) first touches them,
** and closed again when it ends. Host code that reads or writes one faults, as it would
** on a GPU's memory. tt_emu::alloc's (the kernels' test reads its buffers) stay open. */
struct Block {
  size_t bytes;        /* as asked */
  size_t body;         /* bytes rounded up to 256 */
  char *map;           /* the mapping: front guard, body, guard page */
  size_t map_bytes;    /* all of it, the guard page included */
  bool closed_to_host;
  bool open = true;    /* readable now */
};
std::map<void *, Block> g_blocks;
size_t g_page;

/* Device work on this OS thread (DeviceWork), and the closed buffers it has opened. */
thread_local int t_device_depth;
/* Closed buffers open now (device work opened them, or they were made during it): closed
** again when the outermost device work ends. */
std::vector<void *> g_open;

bool guard_ok(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)p[i] != kGuardByte) return false;
  return true;
}

char *user_of(const Block &b) { return b.map + b.map_bytes - g_page - b.body; }

/* The buffer whose mapping holds address a, or nullptr. */
Block *block_at(const char *a) {
  auto it = g_blocks.upper_bound((void *)a);
  for (int k = 0; k < 2; k++) {   /* the one starting after a (its front guard), then before */
    if (it != g_blocks.end() && a >= it->second.map &&
        a < it->second.map + it->second.map_bytes)
      return &it->second;
    if (it == g_blocks.begin()) break;
    --it;
  }
  return nullptr;
}

void say(const char *text) {
  if (write(2, text, strlen(text)) < 0) return;
}

struct sigaction g_old_segv;   /* the handler before ours: faults not the emulator's go on */

/* SIGSEGV: a kernel's fault (its launch fails, naming the thread), device work reaching a
** closed buffer (opened), host code touching one (a line, then the fault goes on), or not
** the emulator's. The faults are synchronous (an access of the faulting thread itself),
** so the lookups here do not interrupt a change to the buffers' map. */
void on_fault(int sig, siginfo_t *si, void *uc) {
  (void)sig, (void)uc;
  const char *a = (const char *)si->si_addr;
  Block *b = block_at(a);
  Launch &L = g_launch;
  char text[300];
  if (b && !b->open && t_device_depth > 0 && a < b->map + b->map_bytes - g_page) {
    /* device work touches a closed buffer: open it until the work ends */
    if (mprotect(b->map, b->map_bytes - g_page, PROT_READ | PROT_WRITE) == 0) {
      b->open = true;
      g_open.push_back(user_of(*b));
      return;
    }
    say("cuda_emu: mprotect failed while opening a device buffer (vm.max_map_count?)\n");
  }
  if (b && a >= b->map + b->map_bytes - g_page)
    snprintf(text, sizeof text, "an access %zu bytes past the end of the %zu-byte device "
             "buffer at %p", (size_t)(a - user_of(*b)) - b->bytes, b->bytes,
             (void *)user_of(*b));
  else if (b && !b->open)
    snprintf(text, sizeof text, "host code touched device memory at %p (in the %zu-byte "
             "buffer at %p): a GPU's memory is not the host's; copy it with cudaMemcpy",
             (const void *)a, b->bytes, (void *)user_of(*b));
  else
    snprintf(text, sizeof text, "an access at %p, outside every live device buffer",
             (const void *)a);
  if (L.in_fiber) {   /* the kernel's: its launch fails, the thread is abandoned */
    snprintf(L.fault, sizeof L.fault, "thread (%u, %u, %u): %s", threadIdx.x, threadIdx.y,
             threadIdx.z, text);
    L.faulted = true;
    L.cur->state = DONE;      /* never resumed: its stack is abandoned here */
    L.cur->started = false;   /* and made afresh for its next thread */
    to_scheduler(nullptr);
    ctx_swap(L.cur->ctx, L.sched);   /* (out of the handler for good: SA_NODEFER) */
  }
  if (b) {
    say("cuda_emu: ");
    say(text);
    say("\n");
  }
  sigaction(SIGSEGV, &g_old_segv, nullptr);   /* the access runs again: the old handler's */
}

void install_fault_handler(void) {
  static bool done;
  if (done) return;
  done = true;
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  g_open.reserve(4096);   /* (the handler adds to it: seldom a reallocation there) */
  /* the handler's own stack: a fault in a kernel runs on a fiber's small one otherwise */
  static char alt[64 * 1024];
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, nullptr);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  /* SA_NODEFER: a kernel's fault jumps out of the handler, the signal left unblocked */
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
}

void close_block(Block &b) {
  if (!b.closed_to_host || !b.open) return;
  if (mprotect(b.map, b.map_bytes - g_page, PROT_NONE) == 0)
    b.open = false;
  else
    say("cuda_emu: mprotect failed while closing a device buffer (vm.max_map_count?)\n");
}

void *map_buffer(size_t bytes, bool closed_to_host) {
  install_fault_handler();
  const size_t body = ((bytes ? bytes : 1) + 255) / 256 * 256;
  const size_t map_bytes = (kGuard + body + g_page - 1) / g_page * g_page + g_page;
  char *map = (char *)mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return nullptr;
  memset(map, 0xff, map_bytes - g_page);   /* guards and the buffer: all-ones bits */
  if (mprotect(map + map_bytes - g_page, g_page, PROT_NONE) != 0) {
    munmap(map, map_bytes);
    return nullptr;
  }
  Block b{bytes, body, map, map_bytes, closed_to_host};
  void *user = user_of(b);
  if (t_device_depth == 0)
    close_block(b);
  else if (closed_to_host)
    g_open.push_back(user);
  g_blocks[user] = b;
  return user;
}
}  // namespace

DeviceWork::DeviceWork() { t_device_depth++; }
DeviceWork::~DeviceWork() {
  if (--t_device_depth > 0) return;
  for (void *p : g_open) {
    auto it = g_blocks.find(p);
    if (it != g_blocks.end()) close_block(it->second);
  }
  g_open.clear();
}

void *alloc(size_t bytes) { return map_buffer(bytes, false); }
void *alloc_device(size_t bytes) { return map_buffer(bytes, true); }

bool is_buffer(const void *p) { return g_blocks.count((void *)p) > 0; }

bool release(void *p) {
  auto it = g_blocks.find(p);
  if (it == g_blocks.end()) return false;
  munmap(it->second.map, it->second.map_bytes);
  g_blocks.erase(it);
  return true;
}

/* Only buffers readable now: device work opened the closed ones it touched, and one it
** never touched cannot have been written. */
std::string check_guards(void) {
  for (auto &kv : g_blocks) {
    Block &b = kv.second;
    if (!b.open) continue;
    char *user = (char *)kv.first;
    const bool before = guard_ok(user - kGuard, kGuard),
               after = guard_ok(user + b.bytes, b.body - b.bytes);
    if (!before || !after) {
      char why[160];
      snprintf(why, sizeof why, "a kernel wrote %s the %zu-byte buffer at %p",
               before ? "past the end of" : "before the start of", b.bytes, kv.first);
      memset(user - kGuard, kGuardByte, kGuard);
      memset(user + b.bytes, kGuardByte, b.body - b.bytes);
      return why;
    }
  }
  return "";
}

/* Pinned host memory (cudaHostAlloc): start and size. */
std::map<const void *, size_t> g_pinned;

namespace {
/* The live range of `m` (start -> size) that holds [p, p + bytes], end included. */
template <typename M>
bool inside(const M &m, const void *p, size_t bytes, size_t (*size_of)(const typename M::mapped_type &)) {
  auto it = m.upper_bound((typename M::key_type)p);
  if (it == m.begin()) return false;
  --it;
  const uintptr_t start = (uintptr_t)it->first, at = (uintptr_t)p;
  return at >= start && at - start <= size_of(it->second) &&
         bytes <= size_of(it->second) - (at - start);
}
size_t block_size(const Block &b) { return b.bytes; }
size_t pinned_size(const size_t &n) { return n; }
}  // namespace

bool on_device(const void *p, size_t bytes) { return inside(g_blocks, p, bytes, block_size); }
bool pinned(const void *p, size_t bytes) { return inside(g_pinned, p, bytes, pinned_size); }

bool device_readable(const void *p) { return on_device(p, 0) || pinned(p, 0); }

void refuse_argument(int position, const void *p) {
  char why[240];
  snprintf(why, sizeof why, "kernel argument %d (%p) is neither a live device buffer nor "
           "pinned host memory: a GPU faults reading it", position, p);
  fail_launch(cudaErrorIllegalAddress, why);
}

/* "" when a copy of `bytes` (rows of `width` bytes `pitch` apart: pass width = bytes,
** rows 1 for a flat copy) between dst and src fits the direction `k` asks: the device
** side inside one live device buffer, the host side outside every one (CUDA calls a
** direction that does not match the pointers undefined). cudaMemcpyDefault asks only
** that a device pointer's rows fit its buffer. */
std::string copy_fault(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows, cudaMemcpyKind k) {
  if (!rows || !width) return "";
  const size_t dspan = (rows - 1) * dpitch + width, sspan = (rows - 1) * spitch + width;
  const bool dst_dev = on_device(dst, 0), src_dev = on_device(src, 0);
  const bool want_dst_dev = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
  const bool want_src_dev = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
  static const char *names[] = {"HostToHost", "HostToDevice", "DeviceToHost",
                                "DeviceToDevice", "Default"};
  if ((int)k < 0 || (int)k > 4) return "a copy of an unknown kind";
  char why[240];
  if (k != cudaMemcpyDefault && (dst_dev != want_dst_dev || src_dev != want_src_dev)) {
    snprintf(why, sizeof why, "cudaMemcpy%s from %s memory (%p) to %s memory (%p)",
             names[(int)k], src_dev ? "device" : "host", src, dst_dev ? "device" : "host",
             dst);
    return why;
  }
  if ((dst_dev && !on_device(dst, dspan)) || (src_dev && !on_device(src, sspan))) {
    snprintf(why, sizeof why, "a copy of %zu bytes runs past the end of the device buffer "
             "at %p", dst_dev && !on_device(dst, dspan) ? dspan : sspan,
             dst_dev && !on_device(dst, dspan) ? dst : src);
    return why;
  }
  return "";
}

/* The same for a memset of rows of `width` bytes `pitch` apart: inside one device buffer
** (or pinned memory, which the device writes too). */
std::string set_fault(void *p, size_t pitch, size_t width, size_t rows) {
  if (!rows || !width) return "";
  const size_t span = (rows - 1) * pitch + width;
  if (on_device(p, span) || pinned(p, span)) return "";
  char why[200];
  snprintf(why, sizeof why, "a memset of %zu bytes at %p: %s", span, p,
           on_device(p, 0) ? "past the end of its device buffer"
                           : "not device memory");
  return why;
}

size_t live_bytes(void) {
  size_t n = 0;
  for (auto &kv : g_blocks) n += kv.second.bytes;
  return n;
}

}  // namespace tt_emu

/* -- Streams, events and graphs ----------------------------------------------------- */
/* Work on a stream runs when the host waits for it (submit, below), except on a stream
** being captured, where it is recorded into the capture's graph and issued again at each
** launch of that graph. */

/* Joins: CUDA ends a capture only when every stream that joined it has been joined back
** into the stream that began it (cudaErrorStreamCaptureUnjoined otherwise), so that the
** graph has one end. Each stream counts the operations it has added to the capture
** (`ops`); `seen` says, per stream, how many of those this stream waits for, through the
** events it has waited on (an event keeps what its stream had seen when recorded). */
typedef std::map<const CUstream_st *, uint64_t> Seen;
/* An operation issued on a stream: `run`, once `open` (when set) says it may. A gate
** stands for what the device waits for outside this stream: another stream's event, or
** the emulated NCCL's peers (Deferred work, below). */
struct EmuWork {
  std::function<void()> run;
  std::function<bool()> open;
};
struct CUstream_st {
  std::deque<EmuWork> queue;   /* issued, not run yet (cuda_emu.cc: Deferred) */
  bool waiting = false;        /* a host wait blocks on its first operation's gate */
  bool opening = false;        /* that gate is being asked */
  uint64_t issued = 0, ran = 0;              /* operations issued and run, in all */
  bool blocking = true;                      /* synchronises with the legacy stream */
  CUgraph_st *capture = nullptr;   /* the graph being captured, or none */
  bool relaxed = false;            /* that capture's mode is cudaStreamCaptureModeRelaxed */
  uint64_t ops = 0;                /* operations added to the capture */
  Seen seen;
};
struct CUevent_st {
  double t = 0;                        /* seconds, when last recorded */
  cudaStream_t stream = nullptr;       /* where it was last recorded (outside a capture) */
  uint64_t position = 0;               /* that stream's operations up to the record */
  CUgraph_st *captured_in = nullptr;   /* recorded into this capture, or none */
  Seen seen;                           /* its stream's, and that stream's own ops, then */
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
  bool invalid = false;   /* a refused call invalidated the capture */
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

/* A call's error, as the last error too (the runtime records every call's). */
cudaError_t refuse_call(cudaError_t e, const std::string &why) {
  fail_launch(e, why);
  return e;
}

/* Deferred work: what is issued on a stream runs when the host waits for it (a stream,
** event or device synchronisation or query, a synchronous copy to or from host memory, a
** free), not
** when it is issued, as a GPU runs it later. Host code that reads what a copy or kernel
** makes (in pinned memory) without waiting reads what was there before; host code that
** writes a copy's pinned source before the copy ran changes what is copied. A stream
** waiting on an event runs the event's stream up to its record first. The legacy stream
** (0) is deferred too, with its implicit synchronisation: its work runs after what the
** blocking streams issued before it, and theirs after what it issued before.
** TT_EMU_SYNC=eager runs everything when issued. */
static const bool eager = [] {
  const char *v = getenv("TT_EMU_SYNC");
  return v && !strcmp(v, "eager");
}();
bool legacy_at_once = false;
CUstream_st legacy;               /* stream 0 */
std::set<cudaStream_t> streams{&legacy};   /* live streams (the legacy one too) */

cudaStream_t stream_of(cudaStream_t s) { return s ? s : &legacy; }

/* Gates: a host wait (a synchronisation) that reaches a closed gate blocks until it
** opens, and meanwhile runs the other streams' work as far as their own gates let it, as
** a GPU runs its streams side by side (an NCCL transfer there may wait for a peer that
** first waits for a transfer of this process on another stream). A query (`asking`: a
** stream or event query, or that side progress) stops at a closed gate instead. */
int asking;

void progress_besides(cudaStream_t s);

/* Whether s's first operation w may run; s runs nothing meanwhile (a gate that reached
** back into its own stream would otherwise ask itself again). */
bool gate_open(cudaStream_t s, EmuWork &w) {
  if (!w.open) return true;
  s->opening = true;
  const bool open = w.open();
  s->opening = false;
  return open;
}

/* Runs s's first operation; false when it may not run yet (asked: a closed gate). */
bool run_next(cudaStream_t s) {
  if (s->waiting || s->opening) return false;   /* (its gate is being asked further out) */
  EmuWork &w = s->queue.front();
  if (!gate_open(s, w)) {
    if (asking > 0) return false;
    s->waiting = true;
    while (!gate_open(s, w)) progress_besides(s);
    s->waiting = false;
  }
  EmuWork op = std::move(s->queue.front());
  s->queue.pop_front();
  s->ran++;   /* (before it runs: what it waits for never runs it again) */
  op.run();
  return true;
}

/* Runs s's work until `count` of its operations have run (all when count is its issued),
** or, when asked, up to a closed gate. */
void run_until(cudaStream_t s, uint64_t count) {
  while (s->ran < count && !s->queue.empty() && run_next(s)) {
  }
}

void progress_besides(cudaStream_t s) {
  asking++;
  for (cudaStream_t x : streams)
    if (x != s) run_until(x, x->issued);
  asking--;
  sched_yield();
}

void flush(cudaStream_t s) { run_until(s, s->issued); }

void flush_all(void) {
  for (bool ran = true; ran;) {   /* (work run may issue more: run until none is left) */
    ran = false;
    for (cudaStream_t s : streams)
      if (!s->queue.empty()) {
        const uint64_t before = s->ran;
        flush(s);
        ran = ran || s->ran != before;
      }
  }
}

/* Whether e's last record (outside a capture) has run. */
bool reached(cudaEvent_t e) { return !e->stream || e->stream->ran >= e->position; }

/* Captures going on in blocking streams: work on the legacy stream then would depend on
** them implicitly, which CUDA refuses (cudaErrorStreamCaptureImplicit) and which ends
** those captures (cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated). */
int blocking_captures;

cudaError_t refuse_implicit(void) {
  for (CUgraph_st *g : capturing) g->invalid = true;
  return refuse_call(cudaErrorStreamCaptureImplicit,
                     "work on the legacy stream while a blocking stream captures a graph");
}

pthread_t g_owner;   /* owner_thread, below */
bool g_owner_set;

bool submit(cudaStream_t s, std::function<void()> op, std::function<bool()> open) {
  if (!g_owner_set) {
    g_owner = pthread_self();
    g_owner_set = true;
  }
  if (!s && blocking_captures > 0) {   /* refused: not run */
    refuse_implicit();
    return true;
  }
  if (s && s->capture) {
    if (open)
      op = [open, op] {
        while (!open()) progress_besides(nullptr);
        op();
      };
    s->capture->ops.push_back(std::move(op));
    s->ops++;
    return true;
  }
  if (eager || (!s && legacy_at_once)) {
    flush_all();
    if (open)
      while (!open()) progress_besides(nullptr);
    op();
    return false;
  }
  cudaStream_t q = stream_of(s);
  /* Streams it runs after: the blocking ones' work issued before, for the legacy stream;
  ** the legacy stream's, for a blocking one. */
  std::vector<std::pair<cudaStream_t, uint64_t>> before;
  if (q == &legacy) {
    for (cudaStream_t x : streams)
      if (x != &legacy && x->blocking && x->issued > x->ran) before.emplace_back(x, x->issued);
  } else if (q->blocking && legacy.issued > legacy.ran) {
    before.emplace_back(&legacy, legacy.issued);
  }
  if (!before.empty())
    open = [before, open] {
      bool reached_all = true;
      for (auto &b : before) {
        run_until(b.first, b.second);
        reached_all = reached_all && b.first->ran >= b.second;
      }
      return reached_all && (!open || open());
    };
  q->queue.push_back(EmuWork{std::move(op), std::move(open)});
  q->issued++;
  return false;
}

bool submit(cudaStream_t s, std::function<void()> op) { return submit(s, std::move(op), nullptr); }

cudaError_t not_ready(void) {
  if (g_last == cudaSuccess) g_last = cudaErrorNotReady;
  return cudaErrorNotReady;
}

/* A host wait: runs what it waits for (`run`), then returns the error of any work that
** failed meanwhile. */
template <typename F>
cudaError_t host_wait(F run) {
  const uint64_t before = g_failures;
  run();
  return g_failures != before ? g_failure_last : cudaSuccess;
}

/* The thread that runs device work: the first to issue any (the engine's training
** thread). Another thread (the engine's watchdog) may ask whether an event was reached,
** and is answered without running work or touching the last error, which are that
** thread's. */
bool owner_thread(void) {
  if (!g_owner_set) return true;
  return pthread_equal(pthread_self(), g_owner) != 0;
}

/* Devices: TT_EMU_DEVICES of them (8 unless set, a node's), each process its own; the
** current one per thread, as CUDA keeps it. Every rank of a multi-GPU job on one host
** takes the device of its rank on the host (tetra's train.device=cuda). Read at the first
** ask: a test's constructor may ask before this file's statics are made. */
int device_count(void) {
  static const int n = [] {
    const char *v = getenv("TT_EMU_DEVICES");
    const int k = v && *v ? atoi(v) : 8;
    return k > 0 ? k : 1;
  }();
  return n;
}
thread_local int t_device = 0;
bool valid_device(int d) { return d >= 0 && d < device_count(); }

}  // namespace tt_emu

extern "C" {

/* A C entry for the emulated cuBLASLt (libcublasLt_emu): runs fn(ctx) now, or records it
** when s is being captured (then free_ctx(ctx) when the graph goes; now: after the run). */
int tt_emu_submit(cudaStream_t s, void (*fn)(void *), void *ctx, void (*free_ctx)(void *)) {
  std::shared_ptr<void> keep(ctx, free_ctx);
  tt_emu::submit(s, [fn, keep] {
    tt_emu::DeviceWork device;
    fn(keep.get());
  });
  return 0;
}

/* For the emulated cuBLASLt: whether [p, p + bytes] lies in one live device buffer, and
** a fault in the work running now. */
int tt_emu_on_device(const void *p, size_t bytes) { return tt_emu::on_device(p, bytes); }
void tt_emu_fault(const char *why) { tt_emu::fail_launch(cudaErrorIllegalAddress, why); }

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

/* The names of the errors this runtime returns, as CUDA's own cudaGetErrorName gives
** them (an engine message names the error: the tests read what a GPU would print). */
const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define TT_EMU_NAME(name) \
  case name: return #name;
    TT_EMU_NAME(cudaSuccess)
    TT_EMU_NAME(cudaErrorIllegalAddress)
    TT_EMU_NAME(cudaErrorIllegalState)
    TT_EMU_NAME(cudaErrorInvalidConfiguration)
    TT_EMU_NAME(cudaErrorInvalidDevice)
    TT_EMU_NAME(cudaErrorInvalidPitchValue)
    TT_EMU_NAME(cudaErrorInvalidValue)
    TT_EMU_NAME(cudaErrorLaunchFailure)
    TT_EMU_NAME(cudaErrorMemoryAllocation)
    TT_EMU_NAME(cudaErrorNotReady)
    TT_EMU_NAME(cudaErrorStreamCaptureImplicit)
    TT_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    TT_EMU_NAME(cudaErrorStreamCaptureUnjoined)
    TT_EMU_NAME(cudaErrorStreamCaptureUnsupported)
#undef TT_EMU_NAME
    default: return "cudaErrorUnknown";
  }
}

cudaError_t cudaGetDeviceCount(int *n) {
  *n = tt_emu::device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  *d = tt_emu::t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  if (!tt_emu::valid_device(d)) return cudaErrorInvalidDevice;
  tt_emu::t_device = d;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
  if (!tt_emu::valid_device(d)) return cudaErrorInvalidDevice;
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
  if (!tt_emu::valid_device(d)) return cudaErrorInvalidDevice;
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
  if (cudaError_t e = tt_emu::unsafe("cudaDeviceSynchronize")) return e;
  return tt_emu::host_wait(tt_emu::flush_all);
}

/* Every stream and event made, held to the end (below): a leak check sees them kept. */
namespace tt_emu {
static std::vector<void *> &kept = *new std::vector<void *>;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = new CUstream_st;
  tt_emu::kept.push_back(*s);
  tt_emu::streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  cudaError_t e = cudaStreamCreate(s);
  if (e == cudaSuccess) (*s)->blocking = !(flags & cudaStreamNonBlocking);
  return e;
}

/* Streams and events are never freed: work queued or captured may still name them (CUDA
** lets a program destroy an event it has just recorded or waited on, and its work goes
** on), and no new one takes a destroyed one's address. A few bytes each. */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  tt_emu::flush(s);   /* its work still runs */
  tt_emu::streams.erase(s);
  auto &j = tt_emu::joined;
  j.erase(std::remove(j.begin(), j.end(), s), j.end());
  s->seen.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s && s->capture) return cudaErrorStreamCaptureUnsupported;
  return tt_emu::host_wait([s] { tt_emu::flush(tt_emu::stream_of(s)); });
}

/* A query of work still pending runs it and answers "not ready" (recorded as the last
** error too, as CUDA's runtime records it: a caller that polls must clear it), so a poll
** loop ends at its second ask; the work's own failure comes first. */
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (s && s->capture) return cudaErrorStreamCaptureUnsupported;
  cudaStream_t q = tt_emu::stream_of(s);
  const bool pending = q->ran < q->issued;
  cudaError_t e = tt_emu::host_wait([q] {
    tt_emu::asking++;
    tt_emu::flush(q);
    tt_emu::asking--;
  });
  return e == cudaSuccess && pending ? tt_emu::not_ready() : e;
}

/* A stream that waits for an event recorded inside a capture joins that capture, as CUDA
** has it: what it does next is the graph's too, until the capture ends. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  (void)flags;
  if (e->captured_in && s && !s->capture && tt_emu::capturing.count(e->captured_in)) {
    s->capture = e->captured_in;
    s->ops = 0;
    s->seen.clear();
    tt_emu::joined.push_back(s);
  }
  if (e->captured_in && s && s->capture == e->captured_in)
    for (auto &kv : e->seen) s->seen[kv.first] = std::max(s->seen[kv.first], kv.second);
  if (!e->captured_in && !tt_emu::reached(e)) {   /* s runs that record's stream up to it */
    cudaStream_t x = e->stream;
    const uint64_t position = e->position;   /* (a later record does not move the wait) */
    tt_emu::submit(s, [] {}, [x, position] {
      tt_emu::run_until(x, position);
      return x->ran >= position;
    });
  }
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
  *e = new CUevent_st;
  tt_emu::kept.push_back(*e);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  (void)flags;
  return cudaEventCreate(e);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  e->seen.clear();
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  e->captured_in = s ? s->capture : nullptr;
  if (e->captured_in) {
    e->seen = s->seen;
    e->seen[s] = s->ops;
    /* a record adds no node to CUDA's graph: not one of the stream's operations */
    s->capture->ops.push_back([e] { e->t = tt_emu::now_s(); });
  } else {
    tt_emu::submit(s, [e] { e->t = tt_emu::now_s(); });
    e->stream = tt_emu::stream_of(s);
    e->position = e->stream->issued;
  }
  return cudaSuccess;
}

/* A query runs the work up to the event, as cudaStreamQuery (another thread only asks). */
cudaError_t cudaEventQuery(cudaEvent_t e) {
  const bool pending = !tt_emu::reached(e);
  if (!tt_emu::owner_thread()) return pending ? cudaErrorNotReady : cudaSuccess;
  cudaError_t r = tt_emu::host_wait([e] {
    tt_emu::asking++;
    if (e->stream) tt_emu::run_until(e->stream, e->position);
    tt_emu::asking--;
  });
  return r == cudaSuccess && pending ? tt_emu::not_ready() : r;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e->stream) return cudaSuccess;
  return tt_emu::host_wait([e] { tt_emu::run_until(e->stream, e->position); });
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = (float)((b->t - a->t) * 1e3);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  if (!s) return cudaErrorStreamCaptureUnsupported;   /* the legacy stream cannot capture */
  if (s->capture) return cudaErrorIllegalState;
  s->capture = new CUgraph_st;
  s->ops = 0;
  s->seen.clear();
  tt_emu::capturing.insert(s->capture);
  if (s->blocking) tt_emu::blocking_captures++;
  if (mode != cudaStreamCaptureModeRelaxed) tt_emu::capturing_here++;
  s->relaxed = mode == cudaStreamCaptureModeRelaxed;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
  if (!s || !s->capture) return cudaErrorIllegalState;
  CUgraph_st *graph = s->capture;
  s->capture = nullptr;
  tt_emu::capturing.erase(graph);
  if (s->blocking) tt_emu::blocking_captures--;
  if (!s->relaxed) tt_emu::capturing_here--;
  auto &j = tt_emu::joined;   /* the streams that joined it leave it */
  uint64_t unjoined = 0;
  for (size_t i = 0; i < j.size();)
    if (j[i]->capture == graph) {
      const auto back = s->seen.find(j[i]);
      if (j[i]->ops > (back == s->seen.end() ? 0 : back->second))
        unjoined += j[i]->ops - (back == s->seen.end() ? 0 : back->second);
      j[i]->capture = nullptr;
      j[i] = j.back();
      j.pop_back();
    } else {
      i++;
    }
  if (graph->invalid) {
    delete graph;
    *g = nullptr;
    return tt_emu::refuse_call(cudaErrorStreamCaptureInvalidated,
                               "the capture was invalidated by a call refused during it");
  }
  if (unjoined) {   /* the capture is invalid: no graph */
    delete graph;
    *g = nullptr;
    return tt_emu::refuse_call(cudaErrorStreamCaptureUnjoined,
                               std::to_string(unjoined) + " operation(s) of a stream that "
                               "joined the capture were never joined back into the stream "
                               "that began it");
  }
  *g = graph;
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
  *p = tt_emu::alloc_device(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  (void)s;
  *p = tt_emu::alloc_device(bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

/* cudaFree waits for the device's work first (CUDA's too); cudaFreeAsync frees when the
** stream reaches it. */
cudaError_t cudaFree(void *p) {
  if (cudaError_t e = tt_emu::unsafe("cudaFree")) return e;
  if (!p) return cudaSuccess;
  const cudaError_t e = tt_emu::host_wait(tt_emu::flush_all);
  if (!tt_emu::release(p)) return cudaErrorInvalidValue;
  return e;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (s && s->capture) return cudaSuccess;
  if (!p) return cudaSuccess;
  if (!tt_emu::is_buffer(p)) return cudaErrorInvalidValue;   /* its start, and live */
  tt_emu::submit(s, [p] {
    if (!tt_emu::release(p))
      tt_emu::fail_launch(cudaErrorInvalidValue, "cudaFreeAsync of a buffer already freed");
  });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
  (void)flags;
  *p = malloc(bytes ? bytes : 1);
  if (!*p) return cudaErrorMemoryAllocation;
  tt_emu::g_pinned[*p] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  const cudaError_t e = tt_emu::host_wait(tt_emu::flush_all);   /* (as CUDA's, it waits) */
  if (!tt_emu::g_pinned.erase(p)) return cudaErrorInvalidValue;
  free(p);
  return e;
}

}  // extern "C"

namespace tt_emu {
/* A copy or set whose pointers do not fit (copy_fault, set_fault) is refused when it is
** issued, as CUDA refuses pointers it can check then; on a stream it is checked again
** when it runs, which for a captured one is each replay (a buffer may be gone by then). */

cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height, cudaMemcpyKind k, cudaStream_t s, bool on_stream) {
  const std::string why = copy_fault(dst, dpitch, src, spitch, width, height, k);
  if (!why.empty()) return refuse_call(cudaErrorInvalidValue, why);
  auto op = [=] {
    DeviceWork device;
    const std::string late = copy_fault(dst, dpitch, src, spitch, width, height, k);
    if (!late.empty()) {
      fail_launch(cudaErrorIllegalAddress, late);
      return;
    }
    for (size_t r = 0; r < height; r++)
      memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  };
  /* CUDA's synchronisation rules for copies: cudaMemcpy is issued on the legacy stream
  ** and, unless both sides are device memory, returns when it is done; cudaMemcpyAsync
  ** to or from pageable host memory is done before it returns too (after the stream's
  ** earlier work); the others are done when the stream gets there. */
  const bool dst_dev = on_device(dst, 0), src_dev = on_device(src, 0);
  const bool host_side = !dst_dev || !src_dev;
  const bool pageable = (!dst_dev && !pinned(dst, 0)) || (!src_dev && !pinned(src, 0));
  if (!on_stream) s = nullptr;
  /* not run: captured (s), or refused on the legacy stream during a capture */
  if (submit(s, op)) return s ? cudaSuccess : cudaErrorStreamCaptureImplicit;
  if (on_stream ? pageable : host_side) {
    cudaStream_t q = stream_of(s);
    return host_wait([q] { flush(q); });
  }
  return cudaSuccess;
}

cudaError_t set_2d(void *p, size_t pitch, int v, size_t width, size_t height, cudaStream_t s,
                   bool on_stream) {
  const std::string why = set_fault(p, pitch, width, height);
  if (!why.empty()) return refuse_call(cudaErrorInvalidValue, why);
  auto op = [=] {
    DeviceWork device;
    const std::string late = set_fault(p, pitch, width, height);
    if (!late.empty()) {
      fail_launch(cudaErrorIllegalAddress, late);
      return;
    }
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, v, width);
  };
  /* cudaMemset is issued on the legacy stream and returns at once for device memory,
  ** when done for pinned host memory (CUDA's synchronisation rules). */
  if (!on_stream) s = nullptr;
  if (submit(s, op)) return s ? cudaSuccess : cudaErrorStreamCaptureImplicit;
  if (!on_stream && !on_device(p, 0)) return host_wait([] { flush(stream_of(nullptr)); });
  return cudaSuccess;
}
}  // namespace tt_emu

extern "C" {

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k) {
  if (cudaError_t e = tt_emu::unsafe("cudaMemcpy")) return e;
  return tt_emu::copy_2d(dst, bytes, src, bytes, bytes, 1, k, nullptr, false);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s) {
  return tt_emu::copy_2d(dst, bytes, src, bytes, bytes, 1, k, s, true);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t bytes,
                                cudaStream_t s) {
  if (dd != 0 || sd != 0) return cudaErrorInvalidDevice;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind k, cudaStream_t s) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  return tt_emu::copy_2d(dst, dpitch, src, spitch, width, height, k, s, true);
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) {
  if (cudaError_t e = tt_emu::unsafe("cudaMemset")) return e;
  return tt_emu::set_2d(p, bytes, v, bytes, 1, nullptr, false);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
  return tt_emu::set_2d(p, bytes, v, bytes, 1, s, true);
}

cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t width, size_t height,
                              cudaStream_t s) {
  if (width > pitch) return cudaErrorInvalidPitchValue;
  return tt_emu::set_2d(p, pitch, v, width, height, s, true);
}

}  // extern "C"
