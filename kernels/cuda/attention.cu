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
** This is the correctness baseline on CUDA cores (f32). bf16 / f16 attention goes to
** cuDNN's fused flash attention on tensor cores (engine/cuda/cudnn_sdpa.cu, handed here
** by tt_cuda_init through tt_cuda_use_fused_sdpa) through the fused entries at the end of
** this file; what cuDNN does not take, or a program without it, falls back to this
** kernel on f32 copies (engine/ops/attention.c).
**
** Explicit positions (context parallelism) reach cuDNN as block pairs: the queries and
** the keys are each cut into runs of consecutive positions (a CP rank's two chunks, the
** gathered keys' 2 cp chunks), and each (query run, key run) pair is either hidden
** (skipped), fully visible (no mask) or causal along a diagonal shifted by the runs'
** first positions. Partial results are merged with their lse (log-sum-exp weights) in
** f32; the backward runs each visible pair with the merged out and lse, which is exactly
** the FlashAttention-2 gradient restricted to that pair, and sums the pairs' gradients.
** Positions that do not cut into such runs (unsorted, or a key run that starts after
** its query run but overlaps it) fall back. The runs are found on the op layer's host copy
** of the positions, made once per positions tensor (engine/ops/attention.c), so a call
** waits for nothing.
*/
#include "kernel_cuda.h"
#include "tt_cudnn_sdpa.h"
#include <vector>
extern "C" {
#include "attention.h"
}

enum { MAX_DH = 256, CHUNKS = MAX_DH / 32, WARPS = 4 };

static const tt_cuda_fused_sdpa *g_fused;

void tt_cuda_use_fused_sdpa(const tt_cuda_fused_sdpa *f) { g_fused = f; }

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

/* -- Fused bf16 / f16 attention through cuDNN ----------------------------------------- */

/* A run of consecutive positions: rows [start, start + len) at positions pos0 ... */
struct pos_run {
  int64_t start, len, pos0;
};

/* Context parallelism over cp ranks makes 2 cp key runs (each rank's two chunks), so this
** takes cp up to 512; past it (or positions that are no chunked layout) the fallback
** kernel runs, and the process says so once. (It was 64, which sent cp past 32 to the
** fallback without a word.) */
enum { MAX_RUNS = 1024 };

/* The runs of consecutive positions of `pos` (device, n), or one run for NULL (0..n-1).
** 0 when there are more than MAX_RUNS (not a chunked layout), -1 on a CUDA error. `host`:
** the same positions in host memory (the op layer's copy, made once per positions tensor:
** engine/ops/attention.c), or NULL: then reading them back is a host wait (four per layer
** and micro-batch under context parallelism), through tt_cuda_host_wait: counted, and
** polling the wait hook, so that the NCCL watchdog still sees the k/v gather just before
** it if a peer is gone. */
static int position_runs(const int64_t *pos, const int64_t *host, int64_t n,
                         std::vector<pos_run> &runs) {
  runs.clear();
  if (!pos) {
    runs.push_back({0, n, 0});
    return 1;
  }
  std::vector<int64_t> back;
  const int64_t *h = host;
  if (!h) {
    back.resize((size_t)n);
    TT_CU(cudaMemcpyAsync(back.data(), pos, (size_t)n * sizeof(int64_t),
                          cudaMemcpyDeviceToHost, tt_cuda_cur_stream()));
    TT_CU(tt_cuda_host_wait(tt_cuda_cur_stream()));
    h = back.data();
  }
  for (int64_t i = 0; i < n; i++) {
    if (i > 0 && h[i] == h[i - 1] + 1) {
      runs.back().len++;
      continue;
    }
    if ((int)runs.size() == MAX_RUNS) {
      static bool said;
      if (!said)
        fprintf(stderr, "tetra: attention: positions in more than %d runs of consecutive "
                "positions (context parallelism past %d ranks, or unsorted positions): the "
                "f32 fallback kernel runs instead of cuDNN\n", MAX_RUNS, MAX_RUNS / 2);
      said = true;
      return 0;
    }
    runs.push_back({i, 1, h[i]});
  }
  return 1;
}

enum { PAIR_HIDDEN, PAIR_VISIBLE, PAIR_DIAGONAL, PAIR_UNSUPPORTED };

/* How the queries of run qr see the keys of run kr; *offset for PAIR_DIAGONAL. */
static int classify_pair(int causal, const pos_run &qr, const pos_run &kr, int64_t *offset) {
  if (!causal) return PAIR_VISIBLE;
  int64_t q_last = qr.pos0 + qr.len - 1, k_last = kr.pos0 + kr.len - 1;
  if (kr.pos0 > q_last) return PAIR_HIDDEN;
  if (k_last <= qr.pos0) return PAIR_VISIBLE;
  *offset = qr.pos0 - kr.pos0;
  return *offset >= 0 ? PAIR_DIAGONAL : PAIR_UNSUPPORTED;
}

struct block_pair {
  pos_run q, k;
  int masked;
  int64_t offset;
};

/* Every visible block pair, or 0 when one pair has no cuDNN form (fall back). */
static int block_pairs(const tt_attention_args *a, std::vector<block_pair> &pairs) {
  std::vector<pos_run> qr, kr;
  int rc = position_runs(a->q_pos, a->q_pos_host, a->tq, qr);
  if (rc <= 0) return rc;
  rc = position_runs(a->k_pos, a->k_pos_host, a->tk, kr);
  if (rc <= 0) return rc;
  pairs.clear();
  for (const pos_run &q : qr)
    for (const pos_run &k : kr) {
      int64_t offset = 0;
      int kind = classify_pair(a->causal, q, k, &offset);
      if (kind == PAIR_UNSUPPORTED) return 0;
      if (kind != PAIR_HIDDEN) pairs.push_back({q, k, kind == PAIR_DIAGONAL, offset});
    }
  return 1;
}

/* The cuDNN shape of one block pair; outputs laid out like the whole (B, T, H, Dh). */
static tt_sdpa_shape pair_shape(const tt_attention_args *a, int dtype, const block_pair &p) {
  tt_sdpa_shape s;
  s.b = a->batch;
  s.hq = a->hq;
  s.hkv = a->hkv;
  s.tq = p.q.len;
  s.tk = p.k.len;
  s.dh = a->dh;
  for (int i = 0; i < 3; i++) {
    s.q_stride[i] = a->q_stride[i];
    s.k_stride[i] = a->k_stride[i];
    s.v_stride[i] = a->v_stride[i];
  }
  const int64_t o[3] = {a->tq * a->hq * a->dh, a->hq * a->dh, a->dh};
  const int64_t kv[3] = {a->tk * a->hkv * a->dh, a->hkv * a->dh, a->dh};
  for (int i = 0; i < 3; i++) {
    s.o_stride[i] = o[i];
    s.kv_grad_stride[i] = kv[i];
  }
  /* The pair's stats (lse) packed, (B, H, len): cuDNN's stats tensor is a packed
  ** (b, h, s_q, 1) one in cudnn-frontend's SDPA (its strides {h s_q, s_q, 1, 1}); a pair
  ** of several (CP's block pairs) goes through a packed scratch (pack_lse / unpack_lse). */
  s.lse_stride[0] = a->hq * p.q.len;
  s.lse_stride[1] = p.q.len;
  s.dtype = dtype;
  s.masked = p.masked;
  s.offset = p.offset;
  s.scale = a->scale;
  return s;
}

typedef unsigned short half_bits;   /* bf16 and f16 are both 2 bytes */

/* Pointer to row t of a (B, T, H, Dh)-strided 2-byte tensor (batch and head 0). */
static const half_bits *row_ptr(const void *p, int64_t t, int64_t t_stride) {
  return (const half_bits *)p + t * t_stride;
}

__global__ void fill_f32(float *x, int64_t n, float v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = v;
}

/* Merges one block pair's (out, lse) rows [t0, t0 + len) into the f32 accumulators (all
** (B, Tq, Hq, Dh) and (B, Hq, Tq)). One block per (b, h, row); threads along Dh. */
template <typename T>
__global__ void merge_rows(int64_t tq, int64_t hq, int64_t dh, int64_t t0, int64_t len,
                           const T *part, const float *part_lse, float *acc,
                           float *acc_lse) {
  int64_t r = blockIdx.x;
  int64_t i = t0 + r % len, h = (r / len) % hq, b = r / (len * hq);
  int64_t l_at = (b * hq + h) * tq + i;
  float l1 = acc_lse[l_at], l2 = part_lse[l_at];
  float m = fmaxf(l1, l2);
  __syncthreads();
  if (m == -INFINITY) return;
  float w1 = __expf(l1 - m), w2 = __expf(l2 - m), tot = w1 + w2;
  int64_t o_at = ((b * tq + i) * hq + h) * dh;
  for (int64_t d = threadIdx.x; d < dh; d += blockDim.x)
    acc[o_at + d] = (acc[o_at + d] * w1 + tt_ld(part, o_at + d) * w2) / tot;
  if (threadIdx.x == 0) acc_lse[l_at] = m + logf(tot);
}

/* acc (B, T, H, Dh) rows [t0, t0 + len) += part's. */
template <typename T>
__global__ void add_rows(int64_t t, int64_t h, int64_t dh, int64_t t0, int64_t len,
                         int64_t batch, const T *part, float *acc) {
  int64_t n = batch * len * h * dh;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t inner = e % (h * dh), row = e / (h * dh);
    int64_t at = ((row / len) * t + t0 + row % len) * h * dh + inner;
    acc[at] += tt_ld(part, at);
  }
}

template <typename T>
__global__ void round_to(const float *x, T *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    tt_st(y, i, x[i]);
}

/* Scratch of the fused path carved from the caller's workspace: pieces start 256 bytes
** apart, the alignment cuDNN wants of its pointers. */
enum { PIECE_ALIGN = 64 };   /* f32 elements */

static int64_t piece_size(int64_t n) {
  n = n > 0 ? n : 1;
  return (n + PIECE_ALIGN - 1) / PIECE_ALIGN * PIECE_ALIGN;
}

struct scratch {
  float *next;
  float *get(int64_t n) {
    float *p = next;
    next += piece_size(n);
    return p;
  }
};

/* The f32 elements forward_pairs / backward_pairs carve from the workspace. */
static int64_t forward_pairs_workspace(const tt_attention_args *a) {
  const int64_t no = a->batch * a->tq * a->hq * a->dh, nl = a->batch * a->hq * a->tq;
  return piece_size(no) + 3 * piece_size(nl) + piece_size((no + 1) / 2);
}

static int64_t backward_pairs_workspace(const tt_attention_args *a) {
  const int64_t nq = a->batch * a->tq * a->hq * a->dh, nk = a->batch * a->tk * a->hkv * a->dh;
  const int64_t nl = a->batch * a->hq * a->tq;
  return piece_size(nq) + 2 * piece_size(nk) + piece_size((nq + 1) / 2) +
         2 * piece_size((nk + 1) / 2) + piece_size(nl);
}

/* Rows [t0, t0 + len) of every (batch, head) of a (B, H, T) lse, to a packed (B, H, len)
** one and back: one strided copy each. */
static int pack_lse(const tt_attention_args *a, const float *whole, int64_t t0, int64_t len,
                    float *packed) {
  TT_CU(cudaMemcpy2DAsync(packed, (size_t)len * sizeof(float), whole + t0,
                          (size_t)a->tq * sizeof(float), (size_t)len * sizeof(float),
                          (size_t)(a->batch * a->hq), cudaMemcpyDeviceToDevice,
                          tt_cuda_cur_stream()));
  return 0;
}

static int unpack_lse(const tt_attention_args *a, const float *packed, int64_t t0, int64_t len,
                      float *whole) {
  TT_CU(cudaMemcpy2DAsync(whole + t0, (size_t)a->tq * sizeof(float), packed,
                          (size_t)len * sizeof(float), (size_t)len * sizeof(float),
                          (size_t)(a->batch * a->hq), cudaMemcpyDeviceToDevice,
                          tt_cuda_cur_stream()));
  return 0;
}

static int fill(float *x, int64_t n, float v) {
  fill_f32<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(x, n, v);
  TT_CU_LAUNCHED("fill_f32");
  return 0;
}

template <typename T>
static int round_into(const float *x, void *y, int64_t n) {
  round_to<T><<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(x, (T *)y, n);
  TT_CU_LAUNCHED("round_to");
  return 0;
}

/* Several block pairs: each into a scratch (out, lse), merged in f32, then rounded. */
template <typename T>
static int forward_pairs(const tt_attention_args *a, int dtype,
                         const std::vector<block_pair> &pairs, const void *q, const void *k,
                         const void *v, void *out, float *lse, float *workspace) {
  const int64_t no = a->batch * a->tq * a->hq * a->dh, nl = a->batch * a->hq * a->tq;
  scratch sc = {workspace};
  float *acc = sc.get(no), *acc_lse = sc.get(nl);
  void *part = sc.get((no + 1) / 2);
  float *part_lse = sc.get(nl), *pair_lse = sc.get(nl);
  TT_TRY(fill(acc, no, 0.0f));
  TT_TRY(fill(acc_lse, nl, -INFINITY));
  for (const block_pair &p : pairs) {
    tt_sdpa_shape s = pair_shape(a, dtype, p);
    int rc = g_fused->forward(
        &s, row_ptr(q, p.q.start, a->q_stride[1]), row_ptr(k, p.k.start, a->k_stride[1]),
        row_ptr(v, p.k.start, a->v_stride[1]),
        (half_bits *)part + p.q.start * s.o_stride[1], pair_lse);
    if (rc <= 0) return rc;
    TT_TRY(unpack_lse(a, pair_lse, p.q.start, p.q.len, part_lse));
    merge_rows<T><<<(unsigned)(a->batch * a->hq * p.q.len), 128, 0, tt_cuda_cur_stream()>>>(
        a->tq, a->hq, a->dh, p.q.start, p.q.len, (const T *)part, part_lse, acc, acc_lse);
    TT_CU_LAUNCHED("merge_rows");
  }
  TT_TRY(round_into<T>(acc, out, no));
  TT_CU(cudaMemcpyAsync(lse, acc_lse, (size_t)nl * sizeof(float), cudaMemcpyDeviceToDevice,
                        tt_cuda_cur_stream()));
  return 1;
}

/* The block pairs cuDNN runs for this call: 1 with `pairs` filled, 0 when it cannot take
** the call (the fallback kernel runs), -1 on error. What cuDNN cannot take at all is known
** before the positions are read back. */
static int fused_pairs(const tt_attention_args *a, int dtype, std::vector<block_pair> &pairs) {
  const block_pair whole = {{0, a->tq, 0}, {0, a->tk, 0}, 0, 0};
  tt_sdpa_shape s0 = pair_shape(a, dtype, whole);
  if (!g_fused || !g_fused->supported(&s0)) return 0;
  int rc = block_pairs(a, pairs);
  if (rc <= 0 || pairs.empty()) return rc < 0 ? -1 : 0;
  return 1;
}

/* Without positions the queries and keys are one block pair, which needs no scratch;
** with them, room for as many pairs as the positions make. */
static int64_t fused_workspace(const tt_attention_args *a, int backward) {
  if (!a->q_pos && !a->k_pos) return 0;
  return backward ? backward_pairs_workspace(a) : forward_pairs_workspace(a);
}

static int fused_forward(const tt_attention_args *a, int dtype, const void *q, const void *k,
                         const void *v, void *out, float *lse, float *workspace) {
  std::vector<block_pair> pairs;
  int rc = fused_pairs(a, dtype, pairs);
  if (rc <= 0) return rc;
  tt_sdpa_shape s0 = pair_shape(a, dtype, pairs[0]);
  if (pairs.size() == 1 && pairs[0].q.len == a->tq)
    return g_fused->forward(&s0, q, row_ptr(k, pairs[0].k.start, a->k_stride[1]),
                            row_ptr(v, pairs[0].k.start, a->v_stride[1]), out, lse);
  TT_CHECK(workspace, "attention: %zu block pairs need the fused_workspace scratch",
           pairs.size());
  return dtype == TT_ELEM_BF16
             ? forward_pairs<__nv_bfloat16>(a, dtype, pairs, q, k, v, out, lse, workspace)
             : forward_pairs<__half>(a, dtype, pairs, q, k, v, out, lse, workspace);
}

/* Several block pairs: each pair's gradients into scratch, summed in f32, then rounded. */
template <typename T>
static int backward_pairs(const tt_attention_args *a, int dtype,
                          const std::vector<block_pair> &pairs, const void *q, const void *k,
                          const void *v, const void *out, const float *lse,
                          const void *dout, void *dq, void *dk, void *dv, float *workspace) {
  const int64_t nq = a->batch * a->tq * a->hq * a->dh, nk = a->batch * a->tk * a->hkv * a->dh;
  scratch sc = {workspace};
  float *dq_acc = sc.get(nq), *dk_acc = sc.get(nk), *dv_acc = sc.get(nk);
  void *dq_part = sc.get((nq + 1) / 2), *dk_part = sc.get((nk + 1) / 2);
  void *dv_part = sc.get((nk + 1) / 2);
  float *pair_lse = sc.get(a->batch * a->hq * a->tq);
  TT_TRY(fill(dq_acc, nq, 0.0f));
  TT_TRY(fill(dk_acc, nk, 0.0f));
  TT_TRY(fill(dv_acc, nk, 0.0f));
  cudaStream_t st = tt_cuda_cur_stream();
  for (const block_pair &p : pairs) {
    tt_sdpa_shape s = pair_shape(a, dtype, p);
    int64_t oq = p.q.start * s.o_stride[1], ok = p.k.start * s.kv_grad_stride[1];
    TT_TRY(pack_lse(a, lse, p.q.start, p.q.len, pair_lse));
    int rc = g_fused->backward(
        &s, row_ptr(q, p.q.start, a->q_stride[1]), row_ptr(k, p.k.start, a->k_stride[1]),
        row_ptr(v, p.k.start, a->v_stride[1]), (const half_bits *)out + oq, pair_lse,
        (const half_bits *)dout + oq, (half_bits *)dq_part + oq, (half_bits *)dk_part + ok,
        (half_bits *)dv_part + ok);
    if (rc <= 0) return rc;
    int64_t n = a->batch * p.q.len * a->hq * a->dh, m = a->batch * p.k.len * a->hkv * a->dh;
    add_rows<T><<<tt_cuda_blocks(n, 256), 256, 0, st>>>(a->tq, a->hq, a->dh, p.q.start,
                                                        p.q.len, a->batch, (const T *)dq_part,
                                                        dq_acc);
    add_rows<T><<<tt_cuda_blocks(m, 256), 256, 0, st>>>(a->tk, a->hkv, a->dh, p.k.start,
                                                        p.k.len, a->batch, (const T *)dk_part,
                                                        dk_acc);
    add_rows<T><<<tt_cuda_blocks(m, 256), 256, 0, st>>>(a->tk, a->hkv, a->dh, p.k.start,
                                                        p.k.len, a->batch, (const T *)dv_part,
                                                        dv_acc);
    TT_CU_LAUNCHED("add_rows");
  }
  TT_TRY(round_into<T>(dq_acc, dq, nq));
  TT_TRY(round_into<T>(dk_acc, dk, nk));
  TT_TRY(round_into<T>(dv_acc, dv, nk));
  return 1;
}

static int fused_backward(const tt_attention_args *a, int dtype, const void *q, const void *k,
                          const void *v, const void *out, const float *lse, const void *dout,
                          void *dq, void *dk, void *dv, float *workspace) {
  std::vector<block_pair> pairs;
  int rc = fused_pairs(a, dtype, pairs);
  if (rc <= 0) return rc;
  tt_sdpa_shape s0 = pair_shape(a, dtype, pairs[0]);
  /* One pair covering every query and key: straight into the gradients. */
  if (pairs.size() == 1 && pairs[0].q.len == a->tq && pairs[0].k.len == a->tk)
    return g_fused->backward(&s0, q, k, v, out, lse, dout, dq, dk, dv);
  TT_CHECK(workspace, "attention: %zu block pairs need the fused_workspace scratch",
           pairs.size());
  return dtype == TT_ELEM_BF16
             ? backward_pairs<__nv_bfloat16>(a, dtype, pairs, q, k, v, out, lse, dout, dq, dk,
                                             dv, workspace)
             : backward_pairs<__half>(a, dtype, pairs, q, k, v, out, lse, dout, dq, dk, dv,
                                      workspace);
}

extern "C" const tt_attention_kernels tt_attention_cuda = {
  forward_workspace, forward, backward_workspace, backward, fused_workspace, fused_forward,
  fused_backward,
};

TT_CUDA_FAMILY(attention)
