/*
** ops_attention.c — tt_attention, tt_attention_ex: validation, dispatch through the
** attention kernel table (kernels/attention.h) and the autograd node.
**
** q, k and v reach the kernel as they are whenever their last dim is contiguous (the
** kernel takes the other strides), so a view of a fused QKV projection costs no copy.
** The node saves those kernel-ready tensors, the positions and lse (B, Hq, Tq); the
** output itself is node->out. Nothing of size Tq x Tk is kept.
**
** bf16 and f16 inputs (all three alike; out and gradients in that dtype, lse f32) go to
** the kernel table's fused entries first (cuDNN on CUDA). What those do not take runs the
** f32 kernels on f32 copies and rounds the results to the input dtype: the CPU twin of the
** fused path, and the fallback on CUDA.
*/
#include "core/tt_internal.h"
#include "attention.h"
#include <math.h>
#include <pthread.h>

static const char *const attn_names[3] = {"q", "k", "v"};

/* A view the kernel reads directly: last dim contiguous, rows at least Dh apart. */
static int kernel_ready(const tt_tensor *t) {
  return t->stride[3] == 1 && (t->shape[1] <= 1 || t->stride[1] >= t->shape[3]);
}

/* t itself, or a contiguous copy. The copy is not recorded on the tape: the attention node
** adds its gradients straight into t. */
static int ready_input(tt_tensor *t, tt_tensor **out) {
  if (kernel_ready(t)) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, t->dtype, t->device, out));
  if (tt_copy_(*out, t) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

static int is_low_precision(int dtype) { return dtype == TT_BF16 || dtype == TT_F16; }

/* A contiguous copy of t in `dtype`, off the tape (NULL stays NULL). */
static int copy_as(const tt_tensor *t, int dtype, tt_tensor **out) {
  *out = NULL;
  if (!t) return 0;
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, dtype, t->device, out));
  if (tt_copy_(*out, t) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

/* Positions as a contiguous i64 tensor (or NULL when not given). */
static int ready_positions(const char *arg, tt_tensor *pos, int64_t len, int device,
                           tt_tensor **out) {
  *out = NULL;
  if (!pos) return 0;
  char buf[96];
  TT_TRY(tt_check_index("attention", arg, pos));
  TT_CHECK(pos->ndim == 1 && pos->shape[0] == len,
           "attention: %s has shape %s, expected [%lld]", arg,
           tt_shape_str(pos->shape, pos->ndim, buf, sizeof buf), (long long)len);
  TT_CHECK(pos->device == device, "attention: %s is on another device than q", arg);
  if (pos->dtype == TT_I64 && tt_tensor_is_contiguous(pos)) {
    tt_tensor_retain(pos);
    *out = pos;
    return 0;
  }
  TT_TRY(tt_tensor_empty(&len, 1, TT_I64, device, out));
  if (tt_copy_(*out, pos) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

/* -- Positions in host memory --------------------------------------------------------- */

/* The last few device positions read back, each with a reference to its tensor (so no
** other storage can take its address while it is here), keyed by storage, offset, length
** and the storage's version (a write moves it): context parallelism's are made once
** (tetra.parallel.context caches them), and every attention call, forward and backward,
** then plans its cuDNN block pairs without waiting for the device. */
enum { HOST_POSITIONS = 8 };
static struct {
  tt_tensor *t;
  const tt_storage *storage;
  int64_t offset, n, version;
  tt_tensor *host;
} g_host_pos[HOST_POSITIONS];
static int g_host_pos_next;
static pthread_mutex_t g_host_pos_lock = PTHREAD_MUTEX_INITIALIZER;

int tt_attention_host_positions(tt_tensor *pos, tt_tensor **out) {
  *out = NULL;
  if (!pos) return 0;
  if (pos->device == TT_CPU) {
    tt_tensor_retain(pos);
    *out = pos;
    return 0;
  }
  TT_CHECK(pos->dtype == TT_I64 && pos->ndim == 1 && tt_tensor_is_contiguous(pos),
           "attention: positions for the host must be contiguous (n) i64");
  int64_t n = pos->shape[0];
  pthread_mutex_lock(&g_host_pos_lock);
  for (int i = 0; i < HOST_POSITIONS; i++) {
    if (g_host_pos[i].t && g_host_pos[i].storage == pos->storage &&
        g_host_pos[i].offset == pos->offset && g_host_pos[i].n == n &&
        g_host_pos[i].version == pos->storage->version) {
      tt_tensor_retain(g_host_pos[i].host);
      *out = g_host_pos[i].host;
      pthread_mutex_unlock(&g_host_pos_lock);
      return 0;
    }
  }
  tt_tensor *host = NULL;
  int rc = tt_tensor_empty(&n, 1, TT_I64, TT_CPU, &host);
  if (rc == 0) rc = tt_copy_(host, pos);
  if (rc == 0) {
    int i = g_host_pos_next;
    g_host_pos_next = (i + 1) % HOST_POSITIONS;
    tt_tensor_release(g_host_pos[i].t);
    tt_tensor_release(g_host_pos[i].host);
    tt_tensor_retain(pos);
    g_host_pos[i].t = pos;
    g_host_pos[i].storage = pos->storage;
    g_host_pos[i].offset = pos->offset;
    g_host_pos[i].n = n;
    g_host_pos[i].version = pos->storage->version;
    g_host_pos[i].host = host;
    tt_tensor_retain(host);
    *out = host;
  } else {
    tt_tensor_release(host);
  }
  pthread_mutex_unlock(&g_host_pos_lock);
  return rc;
}

void tt_attention_forget_positions(void) {
  pthread_mutex_lock(&g_host_pos_lock);
  for (int i = 0; i < HOST_POSITIONS; i++) {
    tt_tensor_release(g_host_pos[i].t);
    tt_tensor_release(g_host_pos[i].host);
    g_host_pos[i].t = g_host_pos[i].host = NULL;
  }
  g_host_pos_next = 0;
  pthread_mutex_unlock(&g_host_pos_lock);
}

/* The element strides of kernel-ready q, k, v. */
static void fill_strides(tt_attention_args *a, const tt_tensor *q, const tt_tensor *k,
                         const tt_tensor *v) {
  const tt_tensor *t[3] = {q, k, v};
  int64_t *strides[3] = {a->q_stride, a->k_stride, a->v_stride};
  for (int i = 0; i < 3; i++) {
    strides[i][0] = t[i]->stride[0];
    /* the time stride of a single step is arbitrary; BLAS wants rows >= Dh apart */
    strides[i][1] = t[i]->shape[1] <= 1 ? a->dh : t[i]->stride[1];
    strides[i][2] = t[i]->stride[2];
  }
}

/* Kernel arguments for kernel-ready q, k, v. */
static void fill_args(tt_attention_args *a, const tt_tensor *q, const tt_tensor *k,
                      const tt_tensor *v, const tt_tensor *q_pos, const tt_tensor *k_pos,
                      int causal, double scale) {
  a->batch = q->shape[0];
  a->tq = q->shape[1];
  a->hq = q->shape[2];
  a->dh = q->shape[3];
  a->tk = k->shape[1];
  a->hkv = k->shape[2];
  fill_strides(a, q, k, v);
  a->q_pos = q_pos ? tt_tensor_data(q_pos) : NULL;
  a->k_pos = k_pos ? tt_tensor_data(k_pos) : NULL;
  a->q_pos_host = a->k_pos_host = NULL;
  a->causal = causal != 0;
  a->scale = (float)(scale != 0.0 ? scale : 1.0 / sqrt((double)a->dh));
}

/* a's positions in host memory too: host[0] and host[1] hold the references (released by
** the caller, also after a failure). */
static int host_positions(tt_attention_args *a, tt_tensor *q_pos, tt_tensor *k_pos,
                          tt_tensor *host[2]) {
  host[0] = host[1] = NULL;
  TT_TRY(tt_attention_host_positions(q_pos, &host[0]));
  TT_TRY(tt_attention_host_positions(k_pos, &host[1]));
  a->q_pos_host = host[0] ? tt_tensor_data(host[0]) : NULL;
  a->k_pos_host = host[1] ? tt_tensor_data(host[1]) : NULL;
  return 0;
}

/* -- Running the kernels ------------------------------------------------------------ */

/* The f32 forward kernel: o (f32), lse. */
static int f32_forward(const tt_attention_kernels *kern, const tt_attention_args *a,
                       tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor *o,
                       tt_tensor *lse) {
  int64_t nws = kern->forward_workspace(a);
  nws = nws > 0 ? nws : 1;
  tt_tensor *ws = NULL;
  TT_TRY(tt_tensor_empty(&nws, 1, TT_F32, q->device, &ws));
  int rc = kern->forward(a, tt_tensor_data(q), tt_tensor_data(k), tt_tensor_data(v),
                         tt_tensor_data(o), tt_tensor_data(lse), tt_tensor_data(ws));
  tt_tensor_release(ws);
  return rc;
}

/* The fused entries' scratch on q's device (*out NULL when they need none). */
static int fused_scratch(const tt_attention_kernels *kern, const tt_attention_args *a,
                         int backward, int device, tt_tensor **out) {
  *out = NULL;
  int64_t n = kern->fused_workspace(a, backward);
  return n > 0 ? tt_tensor_empty(&n, 1, TT_F32, device, out) : 0;
}

/* o (the inputs' dtype) and lse (f32) from kernel-ready q, k, v: the fused entry when it
** takes them, else the f32 kernel, on f32 copies for bf16 / f16 inputs. */
static int run_forward(const tt_attention_kernels *kern, const tt_attention_args *a,
                       tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor *o,
                       tt_tensor *lse) {
  if (q->dtype == TT_F32) return f32_forward(kern, a, q, k, v, o, lse);
  if (kern->fused_forward) {
    tt_tensor *ws;
    TT_TRY(fused_scratch(kern, a, 0, q->device, &ws));
    int rc = kern->fused_forward(a, q->dtype, tt_tensor_data(q), tt_tensor_data(k),
                                 tt_tensor_data(v), tt_tensor_data(o), tt_tensor_data(lse),
                                 ws ? tt_tensor_data(ws) : NULL);
    tt_tensor_release(ws);
    if (rc != 0) return rc < 0 ? -1 : 0;
  }
  tt_tensor *f[3] = {NULL, NULL, NULL}, *fo = NULL;
  int rc = -1;
  if (copy_as(q, TT_F32, &f[0]) != 0 || copy_as(k, TT_F32, &f[1]) != 0 ||
      copy_as(v, TT_F32, &f[2]) != 0 || tt_empty_like(f[0], &fo) != 0)
    goto done;
  tt_attention_args fa = *a;
  fill_strides(&fa, f[0], f[1], f[2]);
  if (f32_forward(kern, &fa, f[0], f[1], f[2], fo, lse) != 0) goto done;
  rc = tt_copy_(o, fo);   /* rounds to the output's dtype */
done:
  for (int i = 0; i < 3; i++) tt_tensor_release(f[i]);
  tt_tensor_release(fo);
  return rc;
}

/* The f32 backward kernel into f32 grads[3]. */
static int f32_backward(const tt_attention_kernels *kern, const tt_attention_args *a,
                        tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor *o,
                        tt_tensor *lse, tt_tensor *dout, tt_tensor **grads) {
  int64_t nws = kern->backward_workspace(a);
  nws = nws > 0 ? nws : 1;
  tt_tensor *ws = NULL;
  TT_TRY(tt_tensor_empty(&nws, 1, TT_F32, q->device, &ws));
  int rc = kern->backward(a, tt_tensor_data(q), tt_tensor_data(k), tt_tensor_data(v),
                          tt_tensor_data(o), tt_tensor_data(lse), tt_tensor_data(dout),
                          tt_tensor_data(grads[0]), tt_tensor_data(grads[1]),
                          tt_tensor_data(grads[2]), tt_tensor_data(ws));
  tt_tensor_release(ws);
  return rc;
}

/* grads[3] (contiguous, q's dtype) = dq, dk, dv: the fused entry when it takes the
** arguments, else the f32 kernel, on f32 copies for bf16 / f16. */
static int run_backward(const tt_attention_kernels *kern, const tt_attention_args *a,
                        tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor *o,
                        tt_tensor *lse, tt_tensor *dout, tt_tensor **grads) {
  if (q->dtype == TT_F32) return f32_backward(kern, a, q, k, v, o, lse, dout, grads);
  if (kern->fused_backward) {
    tt_tensor *ws;
    TT_TRY(fused_scratch(kern, a, 1, q->device, &ws));
    int rc = kern->fused_backward(a, q->dtype, tt_tensor_data(q), tt_tensor_data(k),
                                  tt_tensor_data(v), tt_tensor_data(o), tt_tensor_data(lse),
                                  tt_tensor_data(dout), tt_tensor_data(grads[0]),
                                  tt_tensor_data(grads[1]), tt_tensor_data(grads[2]),
                                  ws ? tt_tensor_data(ws) : NULL);
    tt_tensor_release(ws);
    if (rc != 0) return rc < 0 ? -1 : 0;
  }
  tt_tensor *f[5] = {NULL}, *fg[3] = {NULL, NULL, NULL};
  tt_tensor *src[5] = {q, k, v, o, dout};
  int rc = -1;
  for (int i = 0; i < 5; i++)
    if (copy_as(src[i], TT_F32, &f[i]) != 0) goto done;
  for (int i = 0; i < 3; i++)
    if (tt_empty_like(f[i], &fg[i]) != 0) goto done;
  tt_attention_args fa = *a;
  fill_strides(&fa, f[0], f[1], f[2]);
  if (f32_backward(kern, &fa, f[0], f[1], f[2], f[3], lse, f[4], fg) != 0) goto done;
  for (int i = 0; i < 3; i++)
    if (tt_copy_(grads[i], fg[i]) != 0) goto done;
  rc = 0;
done:
  for (int i = 0; i < 5; i++) tt_tensor_release(f[i]);
  for (int i = 0; i < 3; i++) tt_tensor_release(fg[i]);
  return rc;
}

static int validate(tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor **out) {
  TT_CHECK(q && k && v && out, "attention: q, k, v and out must not be NULL");
  tt_tensor *ins[3] = {q, k, v};
  char a[96], b[96];
  for (int i = 0; i < 3; i++) {
    TT_CHECK(ins[i]->dtype == TT_F32 || is_low_precision(ins[i]->dtype),
             "attention: %s is %s; attention takes f32, bf16 or f16", attn_names[i],
             tt_tensor_describe(ins[i], a, sizeof a));
    TT_CHECK(ins[i]->dtype == q->dtype, "attention: %s is %s but q is %s; give q, k and v "
             "one dtype", attn_names[i], tt_dtype_name(ins[i]->dtype), tt_dtype_name(q->dtype));
    TT_CHECK(ins[i]->ndim == 4, "attention: %s is %s, expected 4 dims (B, T, H, Dh)",
             attn_names[i], tt_tensor_describe(ins[i], a, sizeof a));
  }
  TT_TRY(tt_check_same_device("attention", ins, 3));
  const int64_t *qs = q->shape, *ks = k->shape, *vs = v->shape;
  TT_CHECK(qs[2] > 0 && qs[3] > 0 && ks[2] > 0,
           "attention: q %s and k %s need at least one head and Dh >= 1",
           tt_shape_str(qs, 4, a, sizeof a), tt_shape_str(ks, 4, b, sizeof b));
  TT_CHECK(ks[0] == qs[0] && ks[3] == qs[3] && qs[2] % ks[2] == 0,
           "attention: q %s and k %s do not match: expected k (%lld, Tk, Hkv, %lld) with "
           "Hkv dividing %lld", tt_shape_str(qs, 4, a, sizeof a),
           tt_shape_str(ks, 4, b, sizeof b), (long long)qs[0], (long long)qs[3],
           (long long)qs[2]);
  TT_CHECK(memcmp(vs, ks, 4 * sizeof(int64_t)) == 0,
           "attention: v %s must have the shape of k %s", tt_shape_str(vs, 4, a, sizeof a),
           tt_shape_str(ks, 4, b, sizeof b));
  return 0;
}

/* -- Backward ----------------------------------------------------------------------- */

/* saved: q, k, v (kernel-ready), lse, then q_pos and k_pos when given (i[1], i[2] hold
** their slots or -1); f[0] scale, i[0] causal. */
static int attention_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *q = node->saved[0], *k = node->saved[1], *v = node->saved[2];
  tt_tensor *lse = node->saved[3];
  tt_tensor *q_pos = node->i[1] >= 0 ? node->saved[node->i[1]] : NULL;
  tt_tensor *k_pos = node->i[2] >= 0 ? node->saved[node->i[2]] : NULL;
  int need[3];
  for (int i = 0; i < 3; i++) need[i] = tt_needs_grad(node->inputs[i]);
  if (!need[0] && !need[1] && !need[2]) return 0;
  const tt_attention_kernels *kern = TT_KERNELS(tt_attention, q->device);
  if (!kern || !kern->backward) return tt_no_kernel(node->name, q->device);

  tt_attention_args a;
  fill_args(&a, q, k, v, q_pos, k_pos, (int)node->i[0], node->f[0]);
  tt_tensor *dout = NULL, *grads[3] = {NULL, NULL, NULL}, *host[2];
  int rc = -1;
  if (host_positions(&a, q_pos, k_pos, host) != 0) goto done;
  if (tt_contiguous_nograd(grad_out, &dout) != 0) goto done;
  /* the kernels write q's dtype; a view of another dtype upstream is cast here */
  if (dout->dtype != q->dtype) {
    tt_tensor *c = NULL;
    if (copy_as(dout, q->dtype, &c) != 0) goto done;
    tt_tensor_release(dout);
    dout = c;
  }
  if (tt_empty_like(node->out, &grads[0]) != 0 || tt_empty_like(k, &grads[1]) != 0 ||
      tt_empty_like(v, &grads[2]) != 0)
    goto done;
  if (run_backward(kern, &a, q, k, v, node->out, lse, dout, grads) != 0) goto done;
  for (int i = 0; i < 3; i++)
    if (need[i] && tt_accumulate_grad(node->inputs[i], grads[i]) != 0) goto done;
  rc = 0;
done:
  tt_tensor_release(dout);
  for (int i = 0; i < 3; i++) tt_tensor_release(grads[i]);
  tt_tensor_release(host[0]);
  tt_tensor_release(host[1]);
  return rc;
}

/* -- Forward ------------------------------------------------------------------------ */

int tt_attention_ex(tt_tensor *q, tt_tensor *k, tt_tensor *v, tt_tensor *q_pos,
                    tt_tensor *k_pos, int causal, double scale, tt_tensor **out) {
  TT_TRY(validate(q, k, v, out));
  const tt_attention_kernels *kern = TT_KERNELS(tt_attention, q->device);
  if (!kern || !kern->forward) return tt_no_kernel("attention", q->device);

  tt_tensor *ins[3] = {q, k, v}, *ready[3] = {NULL, NULL, NULL};
  tt_tensor *qp = NULL, *kp = NULL, *o = NULL, *lse = NULL, *host[2] = {NULL, NULL};
  for (int i = 0; i < 3; i++)
    if (ready_input(ins[i], &ready[i]) != 0) goto fail;
  if (ready_positions("q_pos", q_pos, q->shape[1], q->device, &qp) != 0 ||
      ready_positions("k_pos", k_pos, k->shape[1], q->device, &kp) != 0)
    goto fail;

  tt_attention_args a;
  fill_args(&a, ready[0], ready[1], ready[2], qp, kp, causal, scale);
  if (host_positions(&a, qp, kp, host) != 0) goto fail;
  int64_t lse_shape[3] = {a.batch, a.hq, a.tq};
  if (tt_tensor_empty(q->shape, 4, q->dtype, q->device, &o) != 0 ||
      tt_tensor_empty(lse_shape, 3, TT_F32, q->device, &lse) != 0)
    goto fail;
  if (run_forward(kern, &a, ready[0], ready[1], ready[2], o, lse) != 0) goto fail;

  if (tt_should_record(ins, 3)) {
    tt_node *node = tt_record("attention", attention_backward, o, ins, 3);
    if (!node) goto fail;
    for (int i = 0; i < 3; i++) tt_node_save(node, ready[i]);
    tt_node_save(node, lse);
    node->f[0] = a.scale;
    node->i[0] = a.causal;
    node->i[1] = node->i[2] = -1;
    if (qp) {
      node->i[1] = node->n_saved;
      tt_node_save(node, qp);
    }
    if (kp) {
      node->i[2] = node->n_saved;
      tt_node_save(node, kp);
    }
  }
  for (int i = 0; i < 3; i++) tt_tensor_release(ready[i]);
  tt_tensor_release(qp);
  tt_tensor_release(kp);
  tt_tensor_release(host[0]);
  tt_tensor_release(host[1]);
  tt_tensor_release(lse);
  *out = o;
  return 0;
fail:
  for (int i = 0; i < 3; i++) tt_tensor_release(ready[i]);
  tt_tensor_release(qp);
  tt_tensor_release(kp);
  tt_tensor_release(host[0]);
  tt_tensor_release(host[1]);
  tt_tensor_release(o);
  tt_tensor_release(lse);
  return -1;
}

int tt_attention(tt_tensor *q, tt_tensor *k, tt_tensor *v, int causal, double scale,
                 tt_tensor **out) {
  return tt_attention_ex(q, k, v, NULL, NULL, causal, scale, out);
}
