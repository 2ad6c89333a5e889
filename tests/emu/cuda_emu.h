/*
** cuda_emu.h — runs the CUDA kernels of kernels/cuda/ on the CPU, so that their index
** math, grid-stride loops, block and warp reductions and launch shapes execute on a
** machine without a GPU (tests/emu/README.md says what it can and cannot show).
**
** Force-included (g++ -include) before a source of kernels/cuda that tests/emu/translate
** has rewritten: each `kernel<<<grid, block, smem, stream>>>(args)` becomes
** `tt_emu::launcher(grid, block, smem, stream, [](auto... a) { kernel(a...); })(args)`.
** The CUDA toolkit's headers give the host types (dim3, __nv_bfloat16, __half, fp8, the
** runtime's declarations); this file gives what only nvcc's device side has:
**  - threadIdx, blockIdx, blockDim, gridDim, one set per OS thread, set by the scheduler
**    before it resumes a CUDA thread;
**  - __shared__ as `static` (one copy, shared by the block's threads, which run in turn on
**    one OS thread), all-ones bits at each block's start;
**  - __syncthreads and the warp collectives (__shfl_xor_sync, __any_sync, __all_sync,
**    __ballot_sync): every CUDA thread of a block is a fiber (a stack of its own) that
**    runs until it reaches one; the scheduler releases a barrier when every thread it
**    names has arrived and reports a deadlock (a barrier some thread never reaches) as
**    the launch's error;
**  - atomics as plain read-modify-writes (a block's threads never run at the same time);
**  - the fast-math intrinsics as their exact C library functions.
** A lane that a warp collective reads but that is not taking part (it has exited, or the
** block's last warp is short) gives all-ones bits (a NaN for floats), as the hardware's
** value there is undefined.
*/
#ifndef TT_CUDA_EMU_H
#define TT_CUDA_EMU_H
/* glibc's checked longjmp (_FORTIFY_SOURCE, on by default in some distributions' gcc)
** refuses a jump from one stack to another, which is what a fiber switch is; this header
** comes first in every file of the emulator. */
#undef _FORTIFY_SOURCE
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

/* nvcc's host pass makes these empty annotations; on the device __shared__ is one copy
** per block: here one copy, in a section of its own that the scheduler fills with all-ones
** bits before each block (a read before any write shows as NaN). */
#undef __shared__
#define __shared__ static __attribute__((section("tt_emu_shared")))
#undef __launch_bounds__
#define __launch_bounds__(...)

extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
enum { warpSize = 32 };

namespace tt_emu {

/* Runs body on every thread of every block of the grid (fibers, tests/emu/cuda_emu.cc),
** a configuration launch_config_ok took when the launch was issued. A fault or a
** deadlock is left for cudaGetLastError. */
void run(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void (*body)(void *),
         void *ctx);

/* Device work (a kernel, a copy, a library call) runs while one of these lives on the OS
** thread: the device buffers it touches are open to it, and closed to host code again
** when the outermost one ends (cuda_emu.cc's Block). */
struct DeviceWork {
  DeviceWork();
  ~DeviceWork();
  DeviceWork(const DeviceWork &) = delete;
  DeviceWork &operator=(const DeviceWork &) = delete;
};

/* Whether CUDA takes this launch configuration; the launch fails (cudaGetLastError) when
** not, as CUDA refuses it when issued. */
bool launch_config_ok(dim3 grid, dim3 block, size_t smem);

/* Issues op on stream s (0: the legacy stream): it runs when the host waits for it (at
** once with tt_emu::legacy_at_once, for the legacy stream), or is recorded when s is
** being captured; true when it was recorded or refused (not run). */
bool submit(cudaStream_t s, std::function<void()> op);
/* The same, op run only once `open` answers true (asked again until it does): what the
** device waits for outside the stream (the emulated NCCL's peers, nccl_emu.cc). */
bool submit(cudaStream_t s, std::function<void()> op, std::function<bool()> open);

/* Whether a kernel may read p: inside a live cudaMalloc'd buffer (its end included) or
** pinned host memory (cudaHostAlloc: mapped into the device's address space on a 64-bit
** system). Anything else, ordinary host memory or a buffer already freed, faults on a GPU. */
bool device_readable(const void *p);
/* Fails the launch (cudaErrorIllegalAddress for cudaGetLastError) naming the argument. */
void refuse_argument(int position, const void *p);

/* The kernel's pointer arguments, each checked as the launch runs (a graph's replay too,
** when a buffer it was captured with may have been freed since). Pointers held inside a
** struct argument are not seen. */
template <typename... A>
bool arguments_readable(const A &...args) {
  int position = 0;
  bool ok = true;
  auto one = [&](const auto &a) {
    position++;
    if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>)
      if (ok && a && !device_readable((const void *)a)) {
        refuse_argument(position, (const void *)a);
        ok = false;
      }
  };
  (one(args), ...);
  return ok;
}

/* The part of a launch the translation keeps: `launcher(cfg..., fn)(args...)`. */
template <typename Fn>
struct Launcher {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Fn fn;
  template <typename... A>
  void operator()(A... args) {
    struct Call {
      Fn *fn;
      std::tuple<A...> *args;
      static void go(void *p) {
        Call *c = (Call *)p;
        std::apply(*c->fn, *c->args);
      }
    };
    if (!launch_config_ok(grid, block, smem)) return;
    /* the arguments kept by value, as a launch copies them: a captured launch replays */
    submit(stream, [f = fn, t = std::tuple<A...>(args...), g = grid, b = block, sm = smem,
                    st = stream]() mutable {
      if (!std::apply([](const auto &...a) { return arguments_readable(a...); }, t)) return;
      Call c{&f, &t};
      run(g, b, sm, st, Call::go, &c);
    });
  }
};
template <typename Fn>
Launcher<Fn> launcher(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Fn fn) {
  return Launcher<Fn>{grid, block, smem, stream, fn};
}
template <typename Fn>
Launcher<Fn> launcher(dim3 grid, dim3 block, size_t smem, Fn fn) {
  return Launcher<Fn>{grid, block, smem, 0, fn};
}
template <typename Fn>
Launcher<Fn> launcher(dim3 grid, dim3 block, Fn fn) {
  return Launcher<Fn>{grid, block, 0, 0, fn};
}

/* The warp collectives' meeting point: this thread offers `bits` (up to 8 bytes) with
** `mask`; returns the bits of lane `src` (all ones when that lane is not taking part),
** and in *any / *all / *ballot the predicate's (bit 0 of bits) reduction over the lanes
** taking part. */
uint64_t warp_meet(unsigned mask, uint64_t bits, int src, int *any, int *all,
                   unsigned *ballot);
void sync_block(void);

template <typename T>
T shfl(unsigned mask, T v, int src) {
  static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  int any, all;
  unsigned ballot;
  uint64_t got = warp_meet(mask, bits, src, &any, &all, &ballot);
  T r;
  memcpy(&r, &got, sizeof r);
  return r;
}

/* The calling thread's lane in its warp, not checked by UBSan: GCC 12 with
** -fsanitize=null (tools/test --sanitize) miscompiles the check of these thread_local
** reads on x86-64 where a shuffle inlines it (the branch tests flags that an earlier
** compare left, not the address) and reports a null pointer for a valid one. */
__attribute__((no_sanitize_undefined)) static inline int lane(void) {
  return (int)(threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) &
         31;
}

}  // namespace tt_emu

static inline void __syncthreads(void) { tt_emu::sync_block(); }

/* The source lane of each shuffle within segments of `width` lanes. */
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = tt_emu::lane();
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;   /* outside the segment: its own value */
  return tt_emu::shfl(mask, v, src);
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  const int lane = tt_emu::lane();
  return tt_emu::shfl(mask, v, lane / width * width + src_lane % width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = tt_emu::lane();
  int src = lane + (int)delta;
  if (src / width != lane / width) src = lane;
  return tt_emu::shfl(mask, v, src);
}
static inline int __any_sync(unsigned mask, int pred) {
  int any, all;
  unsigned ballot;
  tt_emu::warp_meet(mask, pred != 0, 0, &any, &all, &ballot);
  return any;
}
static inline int __all_sync(unsigned mask, int pred) {
  int any, all;
  unsigned ballot;
  tt_emu::warp_meet(mask, pred != 0, 0, &any, &all, &ballot);
  return all;
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  int any, all;
  unsigned ballot;
  tt_emu::warp_meet(mask, pred != 0, 0, &any, &all, &ballot);
  return ballot;
}

/* Atomics: a block's threads take turns on one OS thread, and blocks run one after
** another, so a read-modify-write is atomic. Each returns the old value. */
template <typename T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> static inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> static inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }
template <typename T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) {
  T o = *p;
  if (o == cmp) *p = v;
  return o;
}

/* Intrinsics: the fast ones as the exact functions (the GPU's differ in the last bits,
** which the comparisons' tolerances allow for). */
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* The device's min and max take mixed integer types, as the usual conversions make them. */
template <typename A, typename B>
static inline auto min(A a, B b) -> decltype(a + b) { return b < a ? b : a; }
template <typename A, typename B>
static inline auto max(A a, B b) -> decltype(a + b) { return a < b ? b : a; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
static inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
static inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
template <typename T> static inline T __ldg(const T *p) { return *p; }

#endif
