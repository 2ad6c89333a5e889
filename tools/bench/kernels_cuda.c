/*
** kernels_cuda.c — GB/s of the memory-bound kernels of the bf16 path (kernels/fused.h)
** against the device-to-device copy, for tools/gpu-check; with them the strided copy kernel
** (a head swap, and casts between f32 and bf16) and the embedding's backward (bytes: each
** row read, its table row read and written, as if every id were distinct).
**
** A memory-bound kernel is as fast as the bytes it must move allow: the figure that
** matters is its bandwidth over the bandwidth of a plain copy on the same card (cudaMemcpy
** device to device through the engine's tt_copy_), printed as the last column. Bytes are
** the kernel's minimum traffic (each input read once, each output written once; the
** per-row statistics and the weight are left out), so a kernel that reads a buffer twice
** shows it as a lower ratio. Rows are a Llama-7B layer's activations: 8 sequences of 1024
** tokens (N = 8192) by D = 4096, SwiGLU on N x 11008. The unfused f32 RMSNorm and SwiGLU
** of the norm and activation families are printed beside them for comparison. Each figure
** is the median of 20 timed runs after 3 warm-ups, from CUDA events.
**
**   kernels_cuda [N]     exit 77 without a GPU
*/
#include <stdio.h>
#include <stdlib.h>
#include "core/tt_internal.h"
#include "tetra_cuda.h"
#include "activation.h"
#include "embedding.h"
#include "fused.h"
#include "norm.h"

enum { D = 4096, FF = 11008, VOCAB = 16384, WARMUP = 3, REPEATS = 20 };

static void die(const char *what) {
  fprintf(stderr, "kernels_cuda: %s: %s\n", what, tt_last_error());
  exit(1);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* A device tensor of n values of dtype, random (N(0, 1) rounded to dtype). */
static tt_tensor *rand_dev(int64_t n, int dtype) {
  tt_tensor *h = NULL, *c = NULL, *d = NULL;
  if (tt_tensor_randn(&n, 1, 0.0, 1.0, &h) || tt_cast(h, dtype, &c) || tt_to_device(c, 0, &d))
    die("random input");
  tt_tensor_release(h);
  tt_tensor_release(c);
  return d;
}

static void *ptr(tt_tensor *t) { return tt_tensor_data(t); }

/* The buffers every case draws from: N x FF values of each dtype, several times. */
typedef struct bufs {
  int64_t N;
  tt_tensor *f[5], *b[5];   /* f32 and bf16 */
  tt_tensor *w, *bias, *stats, *mean, *parts, *dw, *db;
  tt_tensor *ids;           /* N token ids in [0, VOCAB), i32 */
  tt_tensor *padded;        /* the same with every other id 0 (a batch half padding) */
} bufs;

typedef int (*bench_fn)(bufs *B, int dtype);

static float time_ms(bench_fn fn, bufs *B, int dtype) {
  tt_cuda_event *a, *b;
  float ms[REPEATS];
  if (tt_cuda_event_create(1, &a) || tt_cuda_event_create(1, &b)) die("events");
  for (int i = 0; i < WARMUP; i++)
    if (fn(B, dtype)) die("warm-up");
  if (tt_cuda_synchronize()) die("synchronize");
  for (int i = 0; i < REPEATS; i++) {
    if (tt_cuda_event_record(a, tt_cuda_get_stream())) die("event");
    if (fn(B, dtype)) die("timed run");
    if (tt_cuda_event_record(b, tt_cuda_get_stream()) || tt_cuda_event_synchronize(b) ||
        tt_cuda_event_elapsed_ms(a, b, &ms[i]))
      die("event");
  }
  tt_cuda_event_destroy(a);
  tt_cuda_event_destroy(b);
  qsort(ms, REPEATS, sizeof ms[0], cmp_float);
  return ms[REPEATS / 2];
}

static tt_tensor *buf(bufs *B, int dtype, int i) { return dtype == TT_BF16 ? B->b[i] : B->f[i]; }

/* -- The cases (each returns 0 or -1) ------------------------------------------------------ */

/* A copy of N x D values: the reference. */
static int run_copy(bufs *B, int dtype) {
  tt_tensor *src = NULL, *dst = NULL;
  const int64_t n = B->N * D;
  int rc = tt_narrow(buf(B, dtype, 0), 0, 0, n, &src) ||
           tt_narrow(buf(B, dtype, 1), 0, 0, n, &dst) || tt_copy_(dst, src);
  tt_tensor_release(src);
  tt_tensor_release(dst);
  return rc ? -1 : 0;
}

/* The strided copy kernel (engine/cuda/copy.cu): attention's head swap, (B, H, T, Dh) ->
** (B, T, H, Dh) with B = N / 1024, T = 1024, H = D / 128, Dh = 128. */
static int run_head_swap(bufs *B, int dtype) {
  tt_tensor *src = NULL, *dst = NULL, *s4 = NULL, *d4 = NULL, *st = NULL;
  const int64_t n = B->N * D, heads[4] = {B->N / 1024, D / 128, 1024, 128},
                out[4] = {B->N / 1024, 1024, D / 128, 128};
  int rc = tt_narrow(buf(B, dtype, 0), 0, 0, n, &src) ||
           tt_narrow(buf(B, dtype, 1), 0, 0, n, &dst) || tt_view(src, heads, 4, &s4) ||
           tt_view(dst, out, 4, &d4) || tt_transpose(s4, 1, 2, &st) || tt_copy_(d4, st);
  tt_tensor *all[] = {src, dst, s4, d4, st};
  for (int i = 0; i < 5; i++) tt_tensor_release(all[i]);
  return rc ? -1 : 0;
}

/* A contiguous cast through the copy kernel: f32 -> bf16 (dtype f32) or back (bf16). */
static int run_cast(bufs *B, int dtype) {
  tt_tensor *src = NULL, *dst = NULL;
  const int64_t n = B->N * D;
  const int to = dtype == TT_F32 ? TT_BF16 : TT_F32;
  int rc = tt_narrow(buf(B, dtype, 0), 0, 0, n, &src) ||
           tt_narrow(buf(B, to, 1), 0, 0, n, &dst) || tt_copy_(dst, src);
  tt_tensor_release(src);
  tt_tensor_release(dst);
  return rc ? -1 : 0;
}

/* The embedding's backward (tokens sorted by id, kernels/cuda/embedding.cu): N rows of D
** added into a (VOCAB, D) f32 table held in f[4]. */
static int run_embedding_bwd(bufs *B, int dtype) {
  return tt_embedding_cuda.backward(ptr(B->f[4]), ptr(buf(B, dtype, 0)), ptr(B->ids), 0, B->N,
                                    VOCAB, D, dtype, 0);
}

/* The same with half the tokens one id: a run of N / 2 rows, which one block summed. */
static int run_embedding_bwd_padded(bufs *B, int dtype) {
  return tt_embedding_cuda.backward(ptr(B->f[4]), ptr(buf(B, dtype, 0)), ptr(B->padded), 0,
                                    B->N, VOCAB, D, dtype, 0);
}

static int run_add_rms(bufs *B, int dtype) {
  return tt_fused_cuda.add_norm_forward(ptr(buf(B, dtype, 2)), ptr(buf(B, dtype, 3)), NULL,
                                        ptr(B->stats), ptr(buf(B, dtype, 0)),
                                        ptr(buf(B, dtype, 1)), ptr(B->w), NULL, B->N, D, 1e-5f,
                                        dtype, dtype);
}

/* f32 residual stream in, bf16 out: the norm feeding a bf16 GEMM. */
static int run_add_rms_cast(bufs *B, int dtype) {
  (void)dtype;
  return tt_fused_cuda.add_norm_forward(ptr(B->f[2]), ptr(B->b[3]), NULL, ptr(B->stats),
                                        ptr(B->f[0]), ptr(B->f[1]), ptr(B->w), NULL, B->N, D,
                                        1e-5f, TT_F32, TT_BF16);
}

static int run_rms_bwd(bufs *B, int dtype) {
  return tt_fused_cuda.norm_backward(ptr(buf(B, dtype, 2)), ptr(B->dw), NULL, ptr(B->parts),
                                     ptr(buf(B, dtype, 0)), ptr(buf(B, dtype, 2)),
                                     ptr(buf(B, dtype, 1)), ptr(B->w), NULL, ptr(B->stats), B->N,
                                     D, dtype, dtype);
}

static int run_rms_unfused(bufs *B, int dtype) {
  (void)dtype;
  return tt_norm_cuda.rmsnorm_forward(ptr(B->f[3]), ptr(B->stats), ptr(B->f[0]), ptr(B->w),
                                      B->N, D, 1e-5f);
}

static int run_add_ln(bufs *B, int dtype) {
  return tt_fused_cuda.add_norm_forward(ptr(buf(B, dtype, 2)), ptr(buf(B, dtype, 3)),
                                        ptr(B->mean), ptr(B->stats), ptr(buf(B, dtype, 0)),
                                        ptr(buf(B, dtype, 1)), ptr(B->w), ptr(B->bias), B->N, D,
                                        1e-5f, dtype, dtype);
}

static int run_ln_bwd(bufs *B, int dtype) {
  return tt_fused_cuda.norm_backward(ptr(buf(B, dtype, 2)), ptr(B->dw), ptr(B->db),
                                     ptr(B->parts), ptr(buf(B, dtype, 0)), ptr(buf(B, dtype, 2)),
                                     ptr(buf(B, dtype, 1)), ptr(B->w), ptr(B->mean),
                                     ptr(B->stats), B->N, D, dtype, dtype);
}

static int run_ln_unfused(bufs *B, int dtype) {
  (void)dtype;
  return tt_norm_cuda.layernorm_forward(ptr(B->f[3]), ptr(B->mean), ptr(B->stats), ptr(B->f[0]),
                                        ptr(B->w), ptr(B->bias), B->N, D, 1e-5f);
}

static int run_swiglu(bufs *B, int dtype) {
  return tt_fused_cuda.swiglu_forward(ptr(buf(B, dtype, 2)), ptr(buf(B, dtype, 0)),
                                      ptr(buf(B, dtype, 1)), B->N * FF, dtype);
}

static int run_swiglu_bwd(bufs *B, int dtype) {
  return tt_fused_cuda.swiglu_backward(ptr(buf(B, dtype, 3)), ptr(buf(B, dtype, 4)),
                                       ptr(buf(B, dtype, 2)), ptr(buf(B, dtype, 0)),
                                       ptr(buf(B, dtype, 1)), B->N * FF, dtype);
}

static int run_gelu(bufs *B, int dtype) {
  return tt_fused_cuda.gelu_forward(ptr(buf(B, dtype, 2)), ptr(buf(B, dtype, 0)), B->N * FF,
                                    dtype);
}

static int run_swiglu_unfused(bufs *B, int dtype) {
  (void)dtype;
  return tt_activation_cuda.swiglu_forward(ptr(B->f[2]), ptr(B->f[0]), ptr(B->f[1]), B->N * FF);
}

typedef struct bench_case {
  const char *name;
  bench_fn fn;
  int dtype;
  double bytes_per_row_elem;   /* bytes moved per element of the (N, D) or (N, FF) rows */
  int ffn;                     /* rows of FF instead of D */
} bench_case;

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);   /* a run stopped at its time cap keeps its lines */
  const int64_t N = argc > 1 ? atoll(argv[1]) : 8192;
  if (N < 1) {
    fprintf(stderr, "kernels_cuda: N must be a positive row count (got '%s')\n", argv[1]);
    return 2;
  }
  if (tt_cuda_init()) {
    printf("SKIP: %s\n", tt_last_error());
    return 77;
  }
  if (!&tt_fused_cuda || !&tt_norm_cuda || !&tt_activation_cuda || !&tt_embedding_cuda) {
    fprintf(stderr, "kernels_cuda: the CUDA kernel tables are not linked in\n");
    return 1;
  }
  char info[256];
  if (tt_cuda_device_info(tt_cuda_current_device(), info, sizeof info)) die("device info");
  printf("device: %s; rows N = %lld, D = %d, FF = %d\n\n", info, (long long)N, D, FF);
  bufs B = {.N = N};
  for (int i = 0; i < 5; i++) {
    B.f[i] = rand_dev(N * FF, TT_F32);
    B.b[i] = rand_dev(N * FF, TT_BF16);
  }
  {
    const int64_t n = N;
    tt_tensor *h = NULL;
    if (tt_tensor_randint(&n, 1, 0, VOCAB, TT_I32, &h) || tt_to_device(h, 0, &B.ids))
      die("token ids");
    for (int64_t i = 0; i < n; i += 2) ((int32_t *)tt_tensor_data(h))[i] = 0;
    if (tt_to_device(h, 0, &B.padded)) die("padded token ids");
    tt_tensor_release(h);
  }
  B.w = rand_dev(D, TT_F32);
  B.bias = rand_dev(D, TT_F32);
  B.stats = rand_dev(N, TT_F32);
  B.mean = rand_dev(N, TT_F32);
  B.dw = rand_dev(D, TT_F32);
  B.db = rand_dev(D, TT_F32);
  B.parts = rand_dev(2 * ((N + TT_FUSED_ROWS_PER_PART - 1) / TT_FUSED_ROWS_PER_PART) * D, TT_F32);
  /* Bytes per element: f32 4, bf16 2; e.g. add + RMSNorm reads x, res and writes h, y. */
  const bench_case cases[] = {
    {"copy (cudaMemcpy d2d)", run_copy, TT_F32, 2 * 4, 0},
    {"copy (cudaMemcpy d2d)", run_copy, TT_BF16, 2 * 2, 0},
    {"head swap (strided copy)", run_head_swap, TT_F32, 2 * 4, 0},
    {"head swap (strided copy)", run_head_swap, TT_BF16, 2 * 2, 0},
    {"cast to bf16 (copy kernel)", run_cast, TT_F32, 4 + 2, 0},
    {"cast to f32 (copy kernel)", run_cast, TT_BF16, 2 + 4, 0},
    {"embedding bwd (sorted ids)", run_embedding_bwd, TT_F32, 4 + 2 * 4, 0},
    {"embedding bwd (sorted ids)", run_embedding_bwd, TT_BF16, 2 + 2 * 4, 0},
    {"embedding bwd, half padding", run_embedding_bwd_padded, TT_BF16, 2 + 2 * 4, 0},
    {"rmsnorm fwd (unfused)", run_rms_unfused, TT_F32, 2 * 4, 0},
    {"add+rmsnorm fwd", run_add_rms, TT_F32, 4 * 4, 0},
    {"add+rmsnorm fwd", run_add_rms, TT_BF16, 4 * 2, 0},
    {"add+rmsnorm fwd f32->bf16", run_add_rms_cast, TT_F32, 3 * 4 + 2, 0},
    {"rmsnorm bwd (+dh, dw)", run_rms_bwd, TT_F32, 4 * 4, 0},
    {"rmsnorm bwd (+dh, dw)", run_rms_bwd, TT_BF16, 4 * 2, 0},
    {"layernorm fwd (unfused)", run_ln_unfused, TT_F32, 2 * 4, 0},
    {"add+layernorm fwd", run_add_ln, TT_F32, 4 * 4, 0},
    {"add+layernorm fwd", run_add_ln, TT_BF16, 4 * 2, 0},
    {"layernorm bwd (+dh,dw,db)", run_ln_bwd, TT_F32, 4 * 4, 0},
    {"layernorm bwd (+dh,dw,db)", run_ln_bwd, TT_BF16, 4 * 2, 0},
    {"swiglu fwd (unfused)", run_swiglu_unfused, TT_F32, 3 * 4, 1},
    {"swiglu fwd", run_swiglu, TT_F32, 3 * 4, 1},
    {"swiglu fwd", run_swiglu, TT_BF16, 3 * 2, 1},
    {"swiglu bwd", run_swiglu_bwd, TT_F32, 5 * 4, 1},
    {"swiglu bwd", run_swiglu_bwd, TT_BF16, 5 * 2, 1},
    {"gelu fwd", run_gelu, TT_F32, 2 * 4, 1},
    {"gelu fwd", run_gelu, TT_BF16, 2 * 2, 1},
  };
  printf("| %-26s | %-5s | %9s | %8s | %8s | %7s |\n", "kernel", "dtype", "MB moved", "ms",
         "GB/s", "x copy");
  printf("|----------------------------|-------|-----------|----------|----------|---------|\n");
  double copy_gbs = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const bench_case *c = &cases[i];
    const double bytes = c->bytes_per_row_elem * (double)N * (c->ffn ? FF : D);
    const float ms = time_ms(c->fn, &B, c->dtype);
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    if (c->fn == run_copy && c->dtype == TT_F32) copy_gbs = gbs;
    printf("| %-26s | %-5s | %9.1f | %8.3f | %8.1f | %7.2f |\n", c->name,
           tt_dtype_name(c->dtype), bytes / 1e6, ms, gbs, gbs / copy_gbs);
  }
  printf("\nx copy: GB/s over the f32 device-to-device copy's; 1.0 is the card's copy rate.\n");
  for (int i = 0; i < 5; i++) {
    tt_tensor_release(B.f[i]);
    tt_tensor_release(B.b[i]);
  }
  tt_tensor_release(B.w);
  tt_tensor_release(B.bias);
  tt_tensor_release(B.stats);
  tt_tensor_release(B.mean);
  tt_tensor_release(B.dw);
  tt_tensor_release(B.db);
  tt_tensor_release(B.parts);
  tt_tensor_release(B.ids);
  tt_tensor_release(B.padded);
  return 0;
}
