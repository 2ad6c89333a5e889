/*
** attention.c — blocked (flash-style) attention on the CPU; see kernels/attention.h.
**
** The sequence is cut into query blocks of bq rows and key blocks of BLOCK_K columns. For
** one (batch, query head, query block) the forward walks the key blocks with an online
** softmax: S = scale Q K^T (one sgemm), the running row max m and row sum l are updated,
** the output rows are rescaled by exp(m_old - m_new) and O += P V (a second sgemm). Only
** the output and lse = m + log(l) are written; the largest temporary is one bq x BLOCK_K
** score block per thread. Key blocks that the causal mask hides entirely are skipped, and
** blocks that it shows entirely skip the per-element mask.
**
** K (and V for the backward) are first copied into the workspace as transposed key blocks,
** (B, Hkv, key block, Dh, BLOCK_K), so that Q K^T and dO V^T are NN products: OpenBLAS
** serves NN and TN products of this size from its small-matrix kernels without packing,
** but packs NT ones, about 1.5 times slower. Keeping each block's rows BLOCK_K floats
** apart (not Tk) matters for the same reason: unpacked rows 4 KiB apart share L1 sets.
**
** The backward recomputes P block by block from lse (FlashAttention-2). Each (batch,
** kv head) task owns dK and dV of its head and dQ of the query heads in its group, so the
** threads never write the same row. When there are too few such tasks to keep every thread
** busy (batch * Hkv not a multiple of the threads and small), it runs two passes instead:
** dK, dV over (batch, kv head, key block) tasks, then dQ over (batch, query head, query
** block) tasks. That recomputes S and dP once more but keeps all threads working.
*/
#include "attention.h"
#include "kernel.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

enum { BLOCK_K = 64 };

/* Rows per query block. OpenBLAS runs a GEMM with m * n * k <= 2^18 on the calling
** thread; keeping every block GEMM under that bound keeps our OpenMP threads from
** contending for OpenBLAS's own thread pool. That is 64 rows up to Dh = 64. */
static int64_t block_q(int64_t dh) {
  int64_t bq = ((int64_t)1 << 18) / (BLOCK_K * dh);
  return bq > 64 ? 64 : bq < 8 ? 8 : bq;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t pos_at(const int64_t *pos, int64_t i) { return pos ? pos[i] : i; }

/* -- Masking ------------------------------------------------------------------------ */

/* Smallest and largest position among [start, start + n), n >= 1. */
static void pos_range(const int64_t *pos, int64_t start, int64_t n, int64_t *lo,
                      int64_t *hi) {
  if (!pos) {
    *lo = start;
    *hi = start + n - 1;
    return;
  }
  int64_t a = pos[start], b = pos[start];
  for (int64_t i = start + 1; i < start + n; i++) {
    a = pos[i] < a ? pos[i] : a;
    b = pos[i] > b ? pos[i] : b;
  }
  *lo = a;
  *hi = b;
}

enum { BLOCK_HIDDEN, BLOCK_PARTIAL, BLOCK_VISIBLE };

/* How queries with positions in [q_lo, q_hi] see the keys [k0, k0 + nk). */
static int block_visibility(const tt_attention_args *a, int64_t q_lo, int64_t q_hi,
                            int64_t k0, int64_t nk) {
  if (!a->causal) return BLOCK_VISIBLE;
  int64_t k_lo, k_hi;
  pos_range(a->k_pos, k0, nk, &k_lo, &k_hi);
  if (k_lo > q_hi) return BLOCK_HIDDEN;
  if (k_hi <= q_lo) return BLOCK_VISIBLE;
  return BLOCK_PARTIAL;
}

/* s: (bq, bk) scores of queries i0.. against keys j0..; hidden ones become -inf. */
static void mask_block(const tt_attention_args *a, float *s, int64_t bq, int64_t bk,
                       int64_t i0, int64_t j0) {
  for (int64_t r = 0; r < bq; r++) {
    float *row = s + r * bk;
    int64_t qp = pos_at(a->q_pos, i0 + r);
    if (!a->k_pos) {
      /* keys at 0..T-1: the hidden ones are a suffix of the row */
      int64_t first = qp - j0 + 1;
      for (int64_t c = first < 0 ? 0 : first; c < bk; c++) row[c] = -INFINITY;
    } else {
      for (int64_t c = 0; c < bk; c++)
        if (a->k_pos[j0 + c] > qp) row[c] = -INFINITY;
    }
  }
}

/* -- Row helpers (AVX2 where the build has it; plain loops otherwise) --------------- */

static float row_max(const float *x, int64_t n) {
  int64_t i = 0;
  float m = -INFINITY;
#ifdef __AVX2__
  __m256 acc = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  m = _mm_cvtss_f32(h);
#endif
  for (; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

#ifdef __AVX2__
/* exp on 8 lanes, Cephes' expf scheme: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a
** polynomial, 2^n built in the exponent bits. About 2 ulp. Inputs are clamped to
** [-87, 88.7] so that 2^n stays a normal float; NaN stays NaN (min/max return their second
** operand when either is NaN). */
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.7f), x);
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  /* ln2 split in a short high part (exact product with n) and a correction */
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* x = exp(x - shift), with hidden (-inf) entries exactly 0; returns sum(x). */
static float row_exp(float *x, int64_t n, float shift) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef __AVX2__
  const __m256 vshift = _mm256_set1_ps(shift), ninf = _mm256_set1_ps(-INFINITY);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 e = exp8(_mm256_sub_ps(v, vshift));
    e = _mm256_andnot_ps(_mm256_cmp_ps(v, ninf, _CMP_EQ_OQ), e);
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  sum = _mm_cvtss_f32(h);
#endif
  for (; i < n; i++) {
    x[i] = x[i] == -INFINITY ? 0.0f : expf(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

static void row_scale(float *x, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* -- Transposed key blocks ---------------------------------------------------------- */

/* Floats of one transposed copy of k or v: (B, Hkv, key blocks, Dh, BLOCK_K); the columns
** past Tk in the last block are never read. */
static int64_t blocked_size(const tt_attention_args *a) {
  return a->batch * a->hkv * cdiv(a->tk, BLOCK_K) * a->dh * BLOCK_K;
}

/* The transposed key block (Dh, BLOCK_K) of head hk in batch b that starts at key j0. */
static const float *key_block(const tt_attention_args *a, const float *xt, int64_t b,
                              int64_t hk, int64_t j0) {
  return xt + ((b * a->hkv + hk) * cdiv(a->tk, BLOCK_K) + j0 / BLOCK_K) * a->dh * BLOCK_K;
}

/* xt (B, Hkv, key blocks, Dh, BLOCK_K) = x (B, Tk, Hkv, Dh) (strides: B, T, H) blocked and
** transposed. */
static void transpose_blocks(const tt_attention_args *a, const float *x,
                             const int64_t *stride, float *xt, int parallel) {
  const int64_t nkb = cdiv(a->tk, BLOCK_K), dh = a->dh;
#pragma omp parallel for if (parallel)
  for (int64_t t = 0; t < a->batch * a->hkv * nkb; t++) {
    const int64_t bh = t / nkb, j0 = (t % nkb) * BLOCK_K, nj = min64(BLOCK_K, a->tk - j0);
    const float *src = x + (bh / a->hkv) * stride[0] + (bh % a->hkv) * stride[2];
    float *dst = xt + t * dh * BLOCK_K;
    /* 8 keys at a time: their rows stay in cache while each d writes 8 floats */
    for (int64_t c0 = 0; c0 < nj; c0 += 8)
      for (int64_t d = 0; d < dh; d++)
        for (int64_t c = c0; c < min64(c0 + 8, nj); c++)
          dst[d * BLOCK_K + c] = src[(j0 + c) * stride[1] + d];
  }
}

/* -- Forward ------------------------------------------------------------------------ */

/* Per-thread scratch of the forward: s (bq, BLOCK_K), m (bq), l (bq). */
static int64_t forward_scratch(int64_t bq) { return bq * BLOCK_K + 2 * bq; }

/* Workspace of the forward: the transposed key blocks of k, then the per-thread scratch. */
static int64_t attention_forward_workspace(const tt_attention_args *a) {
  return blocked_size(a) + (int64_t)omp_get_max_threads() * forward_scratch(block_q(a->dh));
}

/* Output rows i0 .. i0 + bq - 1 of query head h in batch b. kt: k's transposed blocks. */
static void forward_rows(const tt_attention_args *a, const float *q, const float *kt,
                         const float *v, float *out, float *lse, float *s, int64_t b,
                         int64_t h, int64_t i0, int64_t bq) {
  const int64_t dh = a->dh, hk = h / (a->hq / a->hkv), ldo = a->hq * dh;
  const int64_t ldq = a->q_stride[1], ldv = a->v_stride[1];
  const float *qb = q + b * a->q_stride[0] + i0 * ldq + h * a->q_stride[2];
  const float *vh = v + b * a->v_stride[0] + hk * a->v_stride[2];
  float *ob = out + ((b * a->tq + i0) * a->hq + h) * dh;
  float *m = s + bq * BLOCK_K, *l = m + bq;

  for (int64_t r = 0; r < bq; r++) {
    memset(ob + r * ldo, 0, (size_t)dh * sizeof(float));
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  int64_t q_lo, q_hi;
  pos_range(a->q_pos, i0, bq, &q_lo, &q_hi);
  for (int64_t j0 = 0; j0 < a->tk; j0 += BLOCK_K) {
    const int64_t bk = min64(BLOCK_K, a->tk - j0);
    const int vis = block_visibility(a, q_lo, q_hi, j0, bk);
    if (vis == BLOCK_HIDDEN) continue;
    /* s (bq, bk) = scale * q (bq, dh) @ k^T (dh, bk) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bq, (int)bk, (int)dh,
                a->scale, qb, (int)ldq, key_block(a, kt, b, hk, j0), BLOCK_K, 0.0f, s,
                (int)bk);
    if (vis == BLOCK_PARTIAL) mask_block(a, s, bq, bk, i0, j0);
    for (int64_t r = 0; r < bq; r++) {
      float *row = s + r * bk;
      float mx = row_max(row, bk);
      mx = m[r] > mx ? m[r] : mx;
      if (mx == -INFINITY) {   /* nothing visible to this row yet */
        memset(row, 0, (size_t)bk * sizeof(float));
        continue;
      }
      float sum = row_exp(row, bk, mx);
      float alpha = expf(m[r] - mx);   /* 0 on the first visible block */
      if (alpha != 1.0f) row_scale(ob + r * ldo, dh, alpha);
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
    }
    /* o (bq, dh) += p (bq, bk) @ v (bk, dh) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bq, (int)dh, (int)bk, 1.0f,
                s, (int)bk, vh + j0 * ldv, (int)ldv, 1.0f, ob, (int)ldo);
  }
  float *lrow = lse + (b * a->hq + h) * a->tq + i0;
  for (int64_t r = 0; r < bq; r++) {
    if (l[r] > 0.0f) {
      row_scale(ob + r * ldo, dh, 1.0f / l[r]);
      lrow[r] = m[r] + logf(l[r]);
    } else {
      lrow[r] = -INFINITY;   /* no visible key: the output row stays 0 */
    }
  }
}

static int attention_forward(const tt_attention_args *a, const float *q, const float *k,
                             const float *v, float *out, float *lse, float *workspace) {
  const int64_t bq = block_q(a->dh), nqb = cdiv(a->tq, bq), nbh = a->batch * a->hq;
  const int64_t ntasks = nbh * nqb, scratch = forward_scratch(bq);
  const int nthr = omp_get_max_threads();
  const int parallel = nthr > 1 && ntasks > 1 &&
                       (double)nbh * a->tq * a->tk * a->dh > TT_PARALLEL_GRAIN;
  float *kt = workspace, *scratch0 = kt + blocked_size(a);
  transpose_blocks(a, k, a->k_stride, kt, parallel);
#pragma omp parallel num_threads(nthr) if (parallel)
  {
    float *s = scratch0 + omp_get_thread_num() * scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < ntasks; t++) {
      /* Under a causal mask the last query blocks see the most keys: hand them out first. */
      int64_t qb = nqb - 1 - t / nbh, bh = t % nbh;
      int64_t i0 = qb * bq;
      forward_rows(a, q, kt, v, out, lse, s, bh / a->hq, bh % a->hq, i0,
                   min64(bq, a->tq - i0));
    }
  }
  return 0;
}

/* -- Backward ----------------------------------------------------------------------- */

typedef struct grad_bufs {
  const float *q, *k, *kt, *vt, *dout, *lse, *delta;   /* kt, vt: transposed key blocks */
  float *dq, *dk, *dv;
} grad_bufs;

/* Per-thread scratch of the backward: p and ds, both (bq, BLOCK_K). */
static int64_t backward_scratch(int64_t bq) { return 2 * bq * BLOCK_K; }

/* Workspace of the backward: delta (B, Hq, Tq), the transposed key blocks of k and v, then
** the per-thread scratch. */
static int64_t attention_backward_workspace(const tt_attention_args *a) {
  return a->batch * a->hq * a->tq + 2 * blocked_size(a) +
         (int64_t)omp_get_max_threads() * backward_scratch(block_q(a->dh));
}

/* Gradient contributions of one (query block, key block) pair of query head h in batch b:
** queries i0 .. i0 + bq - 1, keys j0 .. j0 + bk - 1. */
static void grad_block(const tt_attention_args *a, const grad_bufs *g, float *p, int64_t b,
                       int64_t h, int64_t i0, int64_t bq, int64_t j0, int64_t bk, int vis,
                       int want_dq, int want_dkv) {
  const int64_t dh = a->dh, hk = h / (a->hq / a->hkv);
  const int64_t ldq = a->q_stride[1], ldk = a->k_stride[1];
  const int64_t ldo = a->hq * dh, ldkv = a->hkv * dh;
  const float *qb = g->q + b * a->q_stride[0] + i0 * ldq + h * a->q_stride[2];
  const float *kb = g->k + b * a->k_stride[0] + j0 * ldk + hk * a->k_stride[2];
  const float *ktb = key_block(a, g->kt, b, hk, j0), *vtb = key_block(a, g->vt, b, hk, j0);
  const int64_t orow = (b * a->tq + i0) * a->hq + h, kvrow = (b * a->tk + j0) * a->hkv + hk;
  const float *dob = g->dout + orow * dh;
  const float *lrow = g->lse + (b * a->hq + h) * a->tq + i0;
  const float *drow = g->delta + (b * a->hq + h) * a->tq + i0;
  float *ds = p + bq * BLOCK_K;

  /* p (bq, bk) = exp(scale * q k^T - lse) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bq, (int)bk, (int)dh,
              a->scale, qb, (int)ldq, ktb, BLOCK_K, 0.0f, p, (int)bk);
  if (vis == BLOCK_PARTIAL) mask_block(a, p, bq, bk, i0, j0);
  for (int64_t r = 0; r < bq; r++) row_exp(p + r * bk, bk, lrow[r]);
  /* dv (bk, dh) += p^T (bk, bq) @ dout (bq, dh) */
  if (want_dkv)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)bk, (int)dh, (int)bq, 1.0f, p,
                (int)bk, dob, (int)ldo, 1.0f, g->dv + kvrow * dh, (int)ldkv);
  /* dp (bq, bk) = dout (bq, dh) @ v^T (dh, bk); ds = p * (dp - D) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bq, (int)bk, (int)dh, 1.0f,
              dob, (int)ldo, vtb, BLOCK_K, 0.0f, ds, (int)bk);
  for (int64_t r = 0; r < bq; r++) {
    const float *pr = p + r * bk;
    float *dr = ds + r * bk, d = drow[r];
    for (int64_t c = 0; c < bk; c++) dr[c] = pr[c] * (dr[c] - d);
  }
  /* dq (bq, dh) += scale * ds (bq, bk) @ k (bk, dh) */
  if (want_dq)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bq, (int)dh, (int)bk,
                a->scale, ds, (int)bk, kb, (int)ldk, 1.0f, g->dq + orow * dh, (int)ldo);
  /* dk (bk, dh) += scale * ds^T (bk, bq) @ q (bq, dh) */
  if (want_dkv)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)bk, (int)dh, (int)bq, a->scale,
                ds, (int)bk, qb, (int)ldq, 1.0f, g->dk + kvrow * dh, (int)ldkv);
}

/* Every query block of head h against the key block j0 (bk keys). */
static void grad_key_block(const tt_attention_args *a, const grad_bufs *g, float *p,
                           int64_t b, int64_t h, int64_t j0, int64_t bk, int want_dq) {
  const int64_t bq = block_q(a->dh);
  for (int64_t i0 = 0; i0 < a->tq; i0 += bq) {
    int64_t nq = min64(bq, a->tq - i0), q_lo, q_hi;
    pos_range(a->q_pos, i0, nq, &q_lo, &q_hi);
    int vis = block_visibility(a, q_lo, q_hi, j0, bk);
    if (vis != BLOCK_HIDDEN) grad_block(a, g, p, b, h, i0, nq, j0, bk, vis, want_dq, 1);
  }
}

/* dq of the query block i0 (nq rows) of head h against every key block. */
static void grad_query_block(const tt_attention_args *a, const grad_bufs *g, float *p,
                             int64_t b, int64_t h, int64_t i0, int64_t nq) {
  int64_t q_lo, q_hi;
  pos_range(a->q_pos, i0, nq, &q_lo, &q_hi);
  for (int64_t j0 = 0; j0 < a->tk; j0 += BLOCK_K) {
    int64_t bk = min64(BLOCK_K, a->tk - j0);
    int vis = block_visibility(a, q_lo, q_hi, j0, bk);
    if (vis != BLOCK_HIDDEN) grad_block(a, g, p, b, h, i0, nq, j0, bk, vis, 1, 0);
  }
}

static int attention_backward(const tt_attention_args *a, const float *q, const float *k,
                              const float *v, const float *out, const float *lse,
                              const float *dout, float *dq, float *dk, float *dv,
                              float *workspace) {
  const int64_t dh = a->dh, hq = a->hq, tq = a->tq, group = a->hq / a->hkv;
  const int64_t bq = block_q(dh), scratch = backward_scratch(bq);
  const int64_t rows = a->batch * tq * hq, nkv = a->batch * a->hkv;
  const int64_t kv_size = blocked_size(a);
  float *delta = workspace, *kt = delta + a->batch * hq * tq, *vt = kt + kv_size;
  float *scratch0 = vt + kv_size;
  const int nthr = omp_get_max_threads();
  const int parallel = nthr > 1 && (double)rows * a->tk * dh > TT_PARALLEL_GRAIN;
  grad_bufs g = {q, k, kt, vt, dout, lse, delta, dq, dk, dv};

  /* delta (B, Hq, Tq) = rowsum(dout * out); out and dout rows are (b, t, h) */
#pragma omp parallel for if (parallel)
  for (int64_t r = 0; r < rows; r++) {
    const float *o = out + r * dh, *go = dout + r * dh;
    float acc = 0.0f;
    for (int64_t d = 0; d < dh; d++) acc += o[d] * go[d];
    int64_t b = r / (tq * hq), t = (r / hq) % tq, h = r % hq;
    delta[(b * hq + h) * tq + t] = acc;
  }
  transpose_blocks(a, k, a->k_stride, kt, parallel);
  transpose_blocks(a, v, a->v_stride, vt, parallel);
  if (rows > 0) memset(dq, 0, (size_t)(rows * dh) * sizeof(float));
  if (nkv * a->tk > 0) {
    memset(dk, 0, (size_t)(nkv * a->tk * dh) * sizeof(float));
    memset(dv, 0, (size_t)(nkv * a->tk * dh) * sizeof(float));
  }

  if (nthr == 1 || nkv % nthr == 0 || nkv >= 4 * nthr) {
    /* One task per (batch, kv head): it owns every gradient row it writes. */
#pragma omp parallel num_threads(nthr) if (parallel)
    {
      float *p = scratch0 + omp_get_thread_num() * scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < nkv; t++) {
        int64_t b = t / a->hkv, hk = t % a->hkv;
        for (int64_t j0 = 0; j0 < a->tk; j0 += BLOCK_K)
          for (int64_t h = hk * group; h < (hk + 1) * group; h++)
            grad_key_block(a, &g, p, b, h, j0, min64(BLOCK_K, a->tk - j0), 1);
      }
    }
    return 0;
  }

  const int64_t nkb = cdiv(a->tk, BLOCK_K), nqb = cdiv(tq, bq), nbh = a->batch * hq;
#pragma omp parallel num_threads(nthr) if (parallel)
  {
    float *p = scratch0 + omp_get_thread_num() * scratch;
    /* dk, dv: (batch, kv head, key block) tasks, the first key blocks (most work) first;
    ** the dq pass below is independent of it, so threads move on without waiting */
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t t = 0; t < nkv * nkb; t++) {
      int64_t j0 = (t / nkv) * BLOCK_K, b = (t % nkv) / a->hkv, hk = (t % nkv) % a->hkv;
      for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        grad_key_block(a, &g, p, b, h, j0, min64(BLOCK_K, a->tk - j0), 0);
    }
    /* dq: (batch, query head, query block) tasks, the last query blocks first */
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nbh * nqb; t++) {
      int64_t i0 = (nqb - 1 - t / nbh) * bq, bh = t % nbh;
      grad_query_block(a, &g, p, bh / hq, bh % hq, i0, min64(bq, tq - i0));
    }
  }
  return 0;
}

const tt_attention_kernels tt_attention_cpu = {
    .forward_workspace = attention_forward_workspace,
    .forward = attention_forward,
    .backward_workspace = attention_backward_workspace,
    .backward = attention_backward,
};
