/*
** attention.cu — CUDA kernels of the attention family (kernels/attention.h): causal /
** positional masked attention with grouped-query heads, f32, never holding a score
** matrix.
**
** Forward: one warp per query row. The row's q and its output accumulator live in
** registers, spread over the lanes along Dh (lane l holds dims l, l + 32, ...). Keys are
** visited in order with the online softmax: a running max m and sum l, and the
** accumulator rescaled by exp(m_old - m_new) whenever the max grows. The row's
** lse = m + log(l) is saved for the backward.
** Backward (FlashAttention-2 algebra, recomputing P from lse): one launch gives each
** query row its D = rowsum(dO * O) and dQ; a second gives each key row of each KV head
** its dK and dV, summing over the query heads of its group. Each output row is written
** by exactly one warp: no atomics, deterministic.
**
** This is the correctness baseline on CUDA cores; a tensor-core (wgmma) tiled kernel or
** cuDNN's fused attention is what the GPU benchmark compares it with.
*/
#include "cuda/tt_cuda.h"
extern "C" {
#include "attention.h"
}

enum { MAX_DH = 256, CHUNKS = MAX_DH / 32, WARPS = 4 };

__device__ __forceinline__ int64_t position(const int64_t *pos, int64_t t) {
  return pos ? pos[t] : t;
}

/* Visible key range [0, jend) for query position qp when positions are the defaults
** (keys sorted): lets causal rows stop early. With explicit positions every key is
** tested. */
__device__ __forceinline__ int64_t key_end(const tt_attention_args &a, int64_t i) {
  if (!a.causal || a.k_pos || a.q_pos) return a.tk;
  return i + 1 < a.tk ? i + 1 : a.tk;
}

__device__ __forceinline__ bool visible(const tt_attention_args &a, int64_t i, int64_t j) {
  return !a.causal || position(a.k_pos, j) <= position(a.q_pos, i);
}

/* Loads row `p` (Dh floats) into this lane's chunks. */
__device__ __forceinline__ void load_row(float (&r)[CHUNKS], const float *p, int64_t dh,
                                         int lane) {
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) {
    int64_t d = c * 32 + lane;
    r[c] = d < dh ? p[d] : 0.0f;
  }
}

__device__ __forceinline__ float dot_row(const float (&r)[CHUNKS], const float *p, int64_t dh,
                                         int lane) {
  float s = 0;
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) {
    int64_t d = c * 32 + lane;
    if (d < dh) s += r[c] * p[d];
  }
  return tt_warp_sum(s);
}

/* grid (ceil(Tq / WARPS), Hq, B), block WARPS * 32 */
__global__ void attn_fwd(tt_attention_args a, const float *q, const float *k, const float *v,
                         float *out, float *lse) {
  int lane = threadIdx.x & 31;
  int64_t i = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= a.tq) return;
  int64_t hk = h / (a.hq / a.hkv);
  float qr[CHUNKS], acc[CHUNKS];
  load_row(qr, q + b * a.q_stride[0] + i * a.q_stride[1] + h * a.q_stride[2], a.dh, lane);
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) acc[c] = 0;
  float m = -INFINITY, l = 0;
  int64_t jend = key_end(a, i);
  for (int64_t j = 0; j < jend; j++) {
    if (!visible(a, i, j)) continue;
    const float *kr = k + b * a.k_stride[0] + j * a.k_stride[1] + hk * a.k_stride[2];
    const float *vr = v + b * a.v_stride[0] + j * a.v_stride[1] + hk * a.v_stride[2];
    float s = dot_row(qr, kr, a.dh, lane) * a.scale;
    float mn = fmaxf(m, s);
    float corr = __expf(m - mn), p = __expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      int64_t d = c * 32 + lane;
      acc[c] = acc[c] * corr + (d < a.dh ? p * vr[d] : 0.0f);
    }
    m = mn;
  }
  float *o = out + ((b * a.tq + i) * a.hq + h) * a.dh;
  float inv = l > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) {
    int64_t d = c * 32 + lane;
    if (d < a.dh) o[d] = acc[c] * inv;
  }
  if (lane == 0) lse[(b * a.hq + h) * a.tq + i] = l > 0 ? m + logf(l) : -INFINITY;
}

static int check_args(const char *op, const tt_attention_args *a) {
  TT_CHECK(a->dh >= 1 && a->dh <= MAX_DH, "%s: head dim %lld is not supported on cuda (1..%d)",
           op, (long long)a->dh, MAX_DH);
  TT_CHECK(a->hkv > 0 && a->hq % a->hkv == 0, "%s: %lld query heads are not a multiple of %lld "
           "kv heads", op, (long long)a->hq, (long long)a->hkv);
  TT_CHECK(a->hq <= 65535 && a->batch <= 65535, "%s: batch or heads above 65535", op);
  return 0;
}

static int64_t forward_workspace(const tt_attention_args *a) {
  (void)a;
  return 0;
}

static int forward(const tt_attention_args *a, const float *q, const float *k, const float *v,
                   float *out, float *lse, float *workspace) {
  (void)workspace;
  TT_TRY(check_args("attention", a));
  if (a->batch == 0 || a->tq == 0 || a->hq == 0) return 0;
  dim3 grid((unsigned)((a->tq + WARPS - 1) / WARPS), (unsigned)a->hq, (unsigned)a->batch);
  attn_fwd<<<grid, WARPS * 32, 0, tt_cuda_cur_stream()>>>(*a, q, k, v, out, lse);
  TT_CU_LAUNCHED("attn_fwd");
  return 0;
}

/* D and dQ per query row. dsum: (B, Hq, Tq) in the workspace. */
__global__ void attn_bwd_dq(tt_attention_args a, const float *q, const float *k,
                            const float *v, const float *out, const float *lse,
                            const float *dout, float *dq, float *dsum) {
  int lane = threadIdx.x & 31;
  int64_t i = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int64_t h = blockIdx.y, b = blockIdx.z;
  if (i >= a.tq) return;
  int64_t hk = h / (a.hq / a.hkv);
  int64_t row = (b * a.tq + i) * a.hq + h;
  float qr[CHUNKS], dor[CHUNKS], acc[CHUNKS];
  load_row(qr, q + b * a.q_stride[0] + i * a.q_stride[1] + h * a.q_stride[2], a.dh, lane);
  load_row(dor, dout + row * a.dh, a.dh, lane);
  float D = dot_row(dor, out + row * a.dh, a.dh, lane);
  float L = lse[(b * a.hq + h) * a.tq + i];
  if (lane == 0) dsum[(b * a.hq + h) * a.tq + i] = D;
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) acc[c] = 0;
  int64_t jend = L == -INFINITY ? 0 : key_end(a, i);
  for (int64_t j = 0; j < jend; j++) {
    if (!visible(a, i, j)) continue;
    const float *kr = k + b * a.k_stride[0] + j * a.k_stride[1] + hk * a.k_stride[2];
    const float *vr = v + b * a.v_stride[0] + j * a.v_stride[1] + hk * a.v_stride[2];
    float p = __expf(dot_row(qr, kr, a.dh, lane) * a.scale - L);
    float ds = p * (dot_row(dor, vr, a.dh, lane) - D);
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      int64_t d = c * 32 + lane;
      if (d < a.dh) acc[c] += ds * kr[d];
    }
  }
  float *o = dq + row * a.dh;
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) {
    int64_t d = c * 32 + lane;
    if (d < a.dh) o[d] = acc[c] * a.scale;
  }
}

/* dK and dV per key row of each KV head. grid (ceil(Tk / WARPS), Hkv, B) */
__global__ void attn_bwd_dkv(tt_attention_args a, const float *q, const float *k,
                             const float *v, const float *lse, const float *dout,
                             const float *dsum, float *dk, float *dv) {
  int lane = threadIdx.x & 31;
  int64_t j = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
  int64_t hk = blockIdx.y, b = blockIdx.z;
  if (j >= a.tk) return;
  int64_t group = a.hq / a.hkv;
  bool default_causal = a.causal && !a.q_pos && !a.k_pos;
  float kr[CHUNKS], vr[CHUNKS], dka[CHUNKS], dva[CHUNKS];
  load_row(kr, k + b * a.k_stride[0] + j * a.k_stride[1] + hk * a.k_stride[2], a.dh, lane);
  load_row(vr, v + b * a.v_stride[0] + j * a.v_stride[1] + hk * a.v_stride[2], a.dh, lane);
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) dka[c] = dva[c] = 0;
  for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
    for (int64_t i = default_causal ? j : 0; i < a.tq; i++) {
      if (!visible(a, i, j)) continue;
      float L = lse[(b * a.hq + h) * a.tq + i];
      if (L == -INFINITY) continue;
      const float *qr = q + b * a.q_stride[0] + i * a.q_stride[1] + h * a.q_stride[2];
      const float *dor = dout + ((b * a.tq + i) * a.hq + h) * a.dh;
      float p = __expf(dot_row(kr, qr, a.dh, lane) * a.scale - L);
      float ds = p * (dot_row(vr, dor, a.dh, lane) - dsum[(b * a.hq + h) * a.tq + i]);
#pragma unroll
      for (int c = 0; c < CHUNKS; c++) {
        int64_t d = c * 32 + lane;
        if (d < a.dh) {
          dva[c] += p * dor[d];
          dka[c] += ds * qr[d];
        }
      }
    }
  }
  int64_t row = (b * a.tk + j) * a.hkv + hk;
#pragma unroll
  for (int c = 0; c < CHUNKS; c++) {
    int64_t d = c * 32 + lane;
    if (d < a.dh) {
      dk[row * a.dh + d] = dka[c] * a.scale;
      dv[row * a.dh + d] = dva[c];
    }
  }
}

static int64_t backward_workspace(const tt_attention_args *a) {
  return a->batch * a->hq * a->tq;
}

static int backward(const tt_attention_args *a, const float *q, const float *k,
                    const float *v, const float *out, const float *lse, const float *dout,
                    float *dq, float *dk, float *dv, float *workspace) {
  TT_TRY(check_args("attention backward", a));
  if (a->batch == 0 || a->hq == 0) return 0;
  if (a->tq > 0) {
    dim3 grid((unsigned)((a->tq + WARPS - 1) / WARPS), (unsigned)a->hq, (unsigned)a->batch);
    attn_bwd_dq<<<grid, WARPS * 32, 0, tt_cuda_cur_stream()>>>(*a, q, k, v, out, lse, dout, dq,
                                                           workspace);
    TT_CU_LAUNCHED("attn_bwd_dq");
  }
  if (a->tk > 0) {
    dim3 grid((unsigned)((a->tk + WARPS - 1) / WARPS), (unsigned)a->hkv, (unsigned)a->batch);
    attn_bwd_dkv<<<grid, WARPS * 32, 0, tt_cuda_cur_stream()>>>(*a, q, k, v, lse, dout, workspace,
                                                            dk, dv);
    TT_CU_LAUNCHED("attn_bwd_dkv");
  }
  return 0;
}

extern "C" const tt_attention_kernels tt_attention_cuda = {
  forward_workspace, forward, backward_workspace, backward,
};

TT_CUDA_FAMILY(attention)
