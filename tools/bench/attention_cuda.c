/*
** attention_cuda.c — attention TFLOP/s on the GPU for tools/bench/attention_cuda.sh (and
** tools/gpu-check): cuDNN's fused flash attention (bf16 q, k, v through tt_attention)
** against the built-in f32 CUDA-core kernel that bf16 attention falls back to without
** cuDNN, at Llama-7B-like shapes: 32 heads of 128, causal, B in {1, 2, 4}, T in {2048,
** 4096}.
**
** FLOPs are counted as gpu_bench and PyTorch benchmarks do: causal forward
** 2 * B * H * T^2 * Dh (half of the 4 B H T^2 Dh of the full matrix), backward twice that.
** Each figure is the median of timed repeats after warm-ups, from CUDA events. The fallback
** kernel is slow (one warp per query row), so it is timed once per shape, at B = 1 only.
** The cuDNN figures are also printed as "RESULT <B> <T> <fwd TFLOP/s> <fwd+bwd TFLOP/s>" for
** the script's comparison with PyTorch. It fails (exit 1) when cuDNN did not run.
**
**   attention_cuda [MAX_T]      (default 4096)
** Exit 77 without a GPU.
*/
#include <stdio.h>
#include <stdlib.h>
#include "core/tt_internal.h"
#include "tetra_cuda.h"
#include "cuda/tt_cudnn.h"
#include "tt_cudnn_sdpa.h"

enum { H = 32, DH = 128 };

static void die(const char *what) {
  fprintf(stderr, "attention_cuda: %s: %s\n", what, tt_last_error());
  exit(1);
}

typedef struct bench {
  tt_tensor *q, *k, *v, *w;
  int backward;
} bench;

/* Random (B, T, H, DH) tensor of dtype on the GPU. */
static tt_tensor *device_randn(int64_t b, int64_t t, int dtype) {
  int64_t s[4] = {b, t, H, DH};
  tt_tensor *f = NULL, *c = NULL, *d = NULL;
  if (tt_tensor_randn(s, 4, 0.0, 1.0, &f) || tt_cast(f, dtype, &c) ||
      tt_to_device(c, tt_cuda_current_device(), &d))
    die("inputs");
  tt_tensor_release(f);
  tt_tensor_release(c);
  return d;
}

static int step(bench *x) {
  tt_tensor *o = NULL;
  if (tt_attention(x->q, x->k, x->v, 1, 0.0, &o)) return -1;
  int rc = x->backward ? tt_backward_with(o, x->w) : 0;
  tt_tensor_release(o);
  if (x->backward) {
    tt_zero_grad(x->q);
    tt_zero_grad(x->k);
    tt_zero_grad(x->v);
  }
  return rc;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static float time_ms(bench *x, int warmup, int repeats) {
  tt_cuda_event *a, *b;
  float ms[16];
  if (tt_cuda_event_create(1, &a) || tt_cuda_event_create(1, &b)) die("events");
  for (int i = 0; i < warmup; i++)
    if (step(x)) die("warm-up");
  if (tt_cuda_synchronize()) die("synchronize");
  for (int i = 0; i < repeats; i++) {
    if (tt_cuda_event_record(a, tt_cuda_get_stream()) || step(x) ||
        tt_cuda_event_record(b, tt_cuda_get_stream()) || tt_cuda_event_synchronize(b) ||
        tt_cuda_event_elapsed_ms(a, b, &ms[i]))
      die("timed run");
  }
  tt_cuda_event_destroy(a);
  tt_cuda_event_destroy(b);
  qsort(ms, (size_t)repeats, sizeof ms[0], cmp_float);
  return ms[repeats / 2];
}

/* Forward and forward + backward times of one shape in one dtype. */
static void measure(int64_t b, int64_t t, int dtype, int warmup, int repeats, float *fwd,
                    float *both) {
  bench x = {device_randn(b, t, dtype), device_randn(b, t, dtype), device_randn(b, t, dtype),
             device_randn(b, t, dtype), 0};
  *fwd = time_ms(&x, warmup, repeats);   /* nothing recorded: no input needs a gradient */
  tt_tensor *ins[3] = {x.q, x.k, x.v};
  for (int i = 0; i < 3; i++)
    if (tt_set_requires_grad(ins[i], 1)) die("requires_grad");
  x.backward = 1;
  *both = time_ms(&x, warmup, repeats);
  tt_tensor *all[4] = {x.q, x.k, x.v, x.w};
  for (int i = 0; i < 4; i++) tt_tensor_release(all[i]);
}

static double tflops(double flop, float ms) { return flop / (ms * 1e-3) / 1e12; }

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);   /* a run stopped at its time cap keeps its lines */
  int64_t max_t = argc > 1 ? atoll(argv[1]) : 4096;
  if (tt_cuda_init() != 0) {
    printf("SKIP: %s\n", tt_last_error());
    return 77;
  }
  char info[256];
  if (tt_cuda_device_info(tt_cuda_current_device(), info, sizeof info) == 0)
    printf("cuda:%d %s\n", tt_cuda_current_device(), info);
  if (!tt_cudnn_available()) {
    fprintf(stderr, "attention_cuda: no usable cuDNN (see the line above); set "
            "TETRA_CUDNN_PATH or TETRA_PYTHON_SITE\n");
    return 1;
  }
  printf("cuDNN %zu from %s\n", tt_cudnn_version(), tt_cudnn_path());
  static const int64_t batches[3] = {1, 2, 4}, lengths[2] = {2048, 4096};
  for (int ti = 0; ti < 2; ti++) {
    int64_t t = lengths[ti];
    if (t > max_t) continue;
    for (int bi = 0; bi < 3; bi++) {
      int64_t b = batches[bi];
      double flop_fwd = 2.0 * b * H * (double)t * t * DH;
      int64_t runs = tt_cudnn_sdpa_runs();
      float fwd, both;
      measure(b, t, TT_BF16, 2, 7, &fwd, &both);
      if (tt_cudnn_sdpa_runs() == runs) {
        fprintf(stderr, "attention_cuda: cuDNN did not run at B=%lld T=%lld: the fallback "
                "kernel answered\n", (long long)b, (long long)t);
        return 1;
      }
      printf("attention bf16 cuDNN    causal B=%lld T=%lld %dx%d: fwd %7.2f ms %6.1f TFLOP/s,"
             " fwd+bwd %7.2f ms %6.1f TFLOP/s\n", (long long)b, (long long)t, H, DH, fwd,
             tflops(flop_fwd, fwd), both, tflops(3 * flop_fwd, both));
      printf("RESULT %lld %lld %.2f %.2f\n", (long long)b, (long long)t, tflops(flop_fwd, fwd),
             tflops(3 * flop_fwd, both));
      if (b != 1) continue;
      float ffwd, fboth;
      measure(b, t, TT_F32, 0, 1, &ffwd, &fboth);
      printf("attention f32 fallback  causal B=%lld T=%lld %dx%d: fwd %7.2f ms %6.1f TFLOP/s,"
             " fwd+bwd %7.2f ms %6.1f TFLOP/s; cuDNN is %.1fx faster (fwd+bwd)\n",
             (long long)b, (long long)t, H, DH, ffwd, tflops(flop_fwd, ffwd), fboth,
             tflops(3 * flop_fwd, fboth), fboth / both);
    }
  }
  return 0;
}
