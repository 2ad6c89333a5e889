/*
** test_cudnn_graph.c — the operations of cuDNN's attention graphs (engine/cuda/cudnn_sdpa.cu)
** built on the CPU: every tensor, pointwise, reduction, matmul and reshape descriptor of
** the forward and backward graphs must finalize in the cuDNN 9 of this machine, for each
** mask kind, GQA and MHA, bf16 and f16, Dh 64 and 128, strided inputs and a block pair of
** a longer sequence. cuDNN checks each operation's attributes, types and shapes at
** finalize, so a wrong attribute type, dim order or shape fails here, without a GPU; the
** operation graph, engine choice and numbers need one (tests/cuda/test_cudnn_sdpa.c).
** Built only with CUDA; skipped (exit 77, ctest: "Not Run") in a build without cuDNN
** headers or on a machine without cuDNN 9.
*/
#include <criterion/criterion.h>
#include <stdio.h>
#include "tetra.h"
#include "cuda/tt_cudnn.h"
#include "tt_skip_main.h"
#ifdef TETRA_HAVE_CUDNN_HEADERS
#include "tt_cudnn_sdpa.h"

/* (B, T, H, Dh) strides of a contiguous tensor. */
static void contiguous(int64_t t, int64_t h, int64_t dh, int64_t *st) {
  st[0] = t * h * dh;
  st[1] = h * dh;
  st[2] = dh;
}

static tt_sdpa_shape shape(int dtype, int64_t hq, int64_t hkv, int64_t tq, int64_t tk,
                           int64_t dh, int masked, int64_t offset) {
  tt_sdpa_shape s = {0};
  s.b = 2;
  s.hq = hq;
  s.hkv = hkv;
  s.tq = tq;
  s.tk = tk;
  s.dh = dh;
  contiguous(tq, hq, dh, s.q_stride);
  contiguous(tq, hq, dh, s.o_stride);
  contiguous(tk, hkv, dh, s.k_stride);
  contiguous(tk, hkv, dh, s.v_stride);
  contiguous(tk, hkv, dh, s.kv_grad_stride);
  s.lse_stride[0] = hq * tq;
  s.lse_stride[1] = tq;
  s.dtype = dtype;
  s.masked = masked;
  s.offset = offset;
  s.scale = 0.125f;
  return s;
}

/* Both graphs of s build; they have `fwd` and `bwd` operations. */
static void builds(const char *name, const tt_sdpa_shape *s, int fwd, int bwd) {
  char why[512];
  if (!tt_cudnn_available()) cr_skip_test("no cuDNN 9 on this machine");
  int n = tt_cudnn_sdpa_check_ops(s, 0, why, sizeof why);
  cr_assert_eq(n, fwd, "%s forward: %d operations (%s)", name, n, why);
  n = tt_cudnn_sdpa_check_ops(s, 1, why, sizeof why);
  cr_assert_eq(n, bwd, "%s backward: %d operations (%s)", name, n, why);
}

/* Forward: QK^T, scale, max, sub, exp, sum, log, add (stats), div, PV = 10 operations;
** the causal mask adds 2 index generators, a compare and a select, plus an add for a
** shifted diagonal. Backward: 18 for MHA, 2 reductions more for GQA, the same mask ops. */
Test(cudnn_graph, unmasked_mha_bf16) {
  tt_sdpa_shape s = shape(TT_BF16, 8, 8, 77, 77, 128, 0, 0);
  builds("unmasked mha", &s, 10, 18);
}

Test(cudnn_graph, causal_gqa_f16_dh64) {
  tt_sdpa_shape s = shape(TT_F16, 8, 2, 33, 95, 64, 1, 0);
  builds("causal gqa", &s, 14, 24);
}

Test(cudnn_graph, shifted_diagonal_block_pair) {
  /* a context-parallel pair: 64 queries of a 128-row sequence against 128 of 256 keys */
  tt_sdpa_shape s = shape(TT_BF16, 4, 4, 64, 128, 128, 1, 64);
  contiguous(128, 4, 128, s.q_stride);
  contiguous(128, 4, 128, s.o_stride);
  contiguous(256, 4, 128, s.k_stride);
  contiguous(256, 4, 128, s.v_stride);
  contiguous(256, 4, 128, s.kv_grad_stride);
  s.lse_stride[0] = 4 * 128;
  s.lse_stride[1] = 128;
  builds("shifted diagonal", &s, 15, 23);
}

Test(cudnn_graph, strided_fused_qkv) {
  tt_sdpa_shape s = shape(TT_BF16, 4, 2, 61, 61, 128, 1, 0);
  const int64_t fused[3] = {61 * 8 * 128, 8 * 128, 128};
  for (int i = 0; i < 3; i++) s.q_stride[i] = s.k_stride[i] = s.v_stride[i] = fused[i];
  builds("strided qkv", &s, 14, 24);
}

Test(cudnn_graph, supported_shapes) {
  if (!tt_cudnn_available()) cr_skip_test("no cuDNN 9 on this machine");
  tt_sdpa_shape s = shape(TT_BF16, 8, 2, 77, 77, 128, 1, 0);
  cr_assert(tt_cudnn_sdpa_supported(&s));
  tt_sdpa_shape f32 = s, dh40 = s, odd = s, neg = s;
  f32.dtype = TT_F32;
  dh40.dh = 40;
  odd.q_stride[1] = 8 * 128 + 4;   /* rows not 16-byte aligned */
  neg.offset = -1;
  cr_assert(!tt_cudnn_sdpa_supported(&f32));
  cr_assert(!tt_cudnn_sdpa_supported(&dh40));
  cr_assert(!tt_cudnn_sdpa_supported(&odd));
  cr_assert(!tt_cudnn_sdpa_supported(&neg));
}
#else
Test(cudnn_graph, needs_cudnn_headers) {
  cr_skip_test("this build found no cuDNN headers: it has no cuDNN graphs");
}
#endif
