/*
** autograd.c — the define-by-run tape.
**
** Every differentiable op that sees an input requiring grad appends a node (its backward
** function, retained inputs, output and saved tensors) to one global tape. Creation order
** is a topological order, so backward walks the tape from the end: a node runs once its
** output's gradient is complete, adds into its inputs' gradients, and is freed at once,
** which releases its saved activations as early as possible. Only the nodes reachable
** from the root run (and leave the tape): other graphs recorded on the same tape, such as
** pipeline micro-batches waiting for their own backward, stay until their turn or until
** tt_tape_clear. Leaves keep .grad across calls (gradient accumulation) until zeroed;
** intermediate gradients are dropped as soon as their node has run. Gradients toward
** chosen leaves can be deferred to a second pass (tt_set_deferred_grads): a node then
** runs in two parts (first toward its other inputs), the way zero-bubble pipelines split
** input and weight gradients.
**
** Activation recompute (tt_checkpoint) records a block run with recording off as one
** node; its backward re-runs the block through a hook with recording on and calls
** tt_backward_with again, nested: the nested backward sees only the nodes recorded since
** the hook was called (the tape from tt_tape_base on), so the outer walk's positions and
** use counts stay as they were.
*/
#include "core/tt_internal.h"

static tt_node **tt_tape;
static int64_t tt_tape_len, tt_tape_cap;
static int tt_grad_enabled = 1;
static tt_grad_ready_fn tt_grad_hook;
static void *tt_grad_hook_ud;
/* The first tape position the running backward owns: 0, or inside a checkpoint's
** recompute the tape's length when the re-run began (nested backward). */
static int64_t tt_tape_base;
static int tt_backward_depth;   /* backwards running (nested: a checkpoint's re-run) */
static tt_recompute_fn tt_recompute_hook;
static void *tt_recompute_hook_ud;

void tt_set_grad_enabled(int enabled) { tt_grad_enabled = enabled != 0; }
int tt_is_grad_enabled(void) { return tt_grad_enabled; }
int64_t tt_tape_size(void) { return tt_tape_len; }
const char *tt_tape_node_name(int64_t i) {
  return i >= 0 && i < tt_tape_len ? tt_tape[i]->name : NULL;
}

int tt_tape_node_dtype(int64_t i) {
  return i >= 0 && i < tt_tape_len ? tt_tape[i]->out->dtype : -1;
}

static tt_backward_tick_fn tt_tick_hook;
static void *tt_tick_hook_ud;

static tt_backward_tick_fn tt_record_hook;
static void *tt_record_hook_ud;

void tt_set_record_tick_hook(tt_backward_tick_fn fn, void *userdata) {
  tt_record_hook = fn;
  tt_record_hook_ud = userdata;
}

void tt_set_backward_tick_hook(tt_backward_tick_fn fn, void *userdata) {
  tt_tick_hook = fn;
  tt_tick_hook_ud = userdata;
}

void tt_set_grad_ready_hook(tt_grad_ready_fn fn, void *userdata) {
  tt_grad_hook = fn;
  tt_grad_hook_ud = userdata;
}

int tt_needs_grad(const tt_tensor *t) { return t && t->requires_grad; }

int tt_set_requires_grad(tt_tensor *t, int requires_grad) {
  TT_CHECK(t->is_leaf, "requires_grad: only leaf tensors (not results of ops) can change "
           "requires_grad; use detach() first");
  TT_CHECK(!requires_grad || tt_dtype_is_float(t->dtype),
           "requires_grad: only float tensors can require grad, got %s", tt_dtype_name(t->dtype));
  t->requires_grad = requires_grad != 0;
  return 0;
}

int tt_zero_grad(tt_tensor *t) {
  tt_tensor_release(t->grad);
  t->grad = NULL;
  return 0;
}

int tt_should_record(tt_tensor *const *inputs, int n) {
  if (!tt_grad_enabled) return 0;
  for (int i = 0; i < n; i++)
    if (inputs[i] && inputs[i]->requires_grad) return 1;
  return 0;
}

static void node_free(tt_node *node) {
  if (node->free_ctx) node->free_ctx(node->ctx);
  for (int i = 0; i < node->n_inputs; i++) tt_tensor_release(node->inputs[i]);
  for (int i = 0; i < node->n_saved; i++) tt_tensor_release(node->saved[i]);
  tt_tensor_release(node->out);
  free(node);
}

tt_node *tt_record(const char *name, tt_backward_fn backward, tt_tensor *out,
                   tt_tensor *const *inputs, int n_inputs) {
  if (n_inputs > TT_NODE_MAX_INPUTS) {
    tt_set_error("%s: %d inputs recorded, at most %d", name, n_inputs, TT_NODE_MAX_INPUTS);
    return NULL;
  }
  if (tt_tape_len == tt_tape_cap) {
    int64_t cap = tt_tape_cap ? tt_tape_cap * 2 : 256;
    tt_node **grown = realloc(tt_tape, (size_t)cap * sizeof *grown);
    if (!grown) {
      tt_set_error("%s: out of host memory growing the tape", name);
      return NULL;
    }
    tt_tape = grown;
    tt_tape_cap = cap;
  }
  tt_node *node = calloc(1, sizeof *node);
  if (!node) {
    tt_set_error("%s: out of host memory (tape node)", name);
    return NULL;
  }
  node->name = name;
  node->backward = backward;
  node->out = out;
  tt_tensor_retain(out);
  node->n_inputs = n_inputs;
  for (int i = 0; i < n_inputs; i++) {
    node->inputs[i] = inputs[i];
    tt_tensor_retain(inputs[i]);
  }
  out->requires_grad = 1;
  out->is_leaf = 0;
  tt_tape[tt_tape_len++] = node;
  if (tt_op_profile_running())
    tt_op_profile_mark(name, tt_backward_depth ? TT_OP_RECOMPUTE : TT_OP_FORWARD);
  if (tt_record_hook) tt_record_hook(tt_record_hook_ud);
  return node;
}

void tt_node_save(tt_node *node, tt_tensor *t) {
  if (node->n_saved >= TT_NODE_MAX_SAVED) return;   /* a programming error caught by tests */
  tt_tensor_retain(t);
  node->saved[node->n_saved++] = t;
}

/* Frees the nodes from tape position `from` on. */
static void tape_truncate(int64_t from) {
  for (int64_t i = tt_tape_len - 1; i >= from; i--) node_free(tt_tape[i]);
  tt_tape_len = from;
}

void tt_tape_clear(void) { tape_truncate(tt_tape_base); }

int tt_grad_accumulates_in_place(const tt_tensor *t) {
  const tt_tensor *g = t ? t->grad : NULL;
  return g && g->dtype == t->dtype && g->device == t->device && g->ndim == t->ndim &&
         memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) == 0 &&
         tt_tensor_is_contiguous(g) && !g->requires_grad;
}

int tt_accumulate_grad(tt_tensor *t, tt_tensor *g) {
  char a[160], b[160];
  if (!tt_needs_grad(t)) return 0;
  TT_CHECK(t->ndim == g->ndim &&
               memcmp(t->shape, g->shape, sizeof(int64_t) * (size_t)t->ndim) == 0,
           "autograd: gradient of shape %s for a tensor of shape %s",
           tt_shape_str(g->shape, g->ndim, a, sizeof a), tt_shape_str(t->shape, t->ndim, b, sizeof b));
  if (t->grad) return tt_axpy_(t->grad, 1.0, g);
  /* First contribution: take g itself when nobody else can see its memory, else copy. */
  if (g->dtype == t->dtype && g->refcount == 1 && g->storage->refcount == 1 &&
      g->offset == 0 && tt_tensor_is_contiguous(g) && g->device == t->device && !g->requires_grad) {
    tt_tensor_retain(g);
    t->grad = g;
    return 0;
  }
  tt_tensor *c = NULL;
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, t->dtype, t->device, &c));
  if (tt_copy_(c, g) != 0) {
    tt_tensor_release(c);
    return -1;
  }
  t->grad = c;
  return 0;
}

/* Marks the nodes reachable from root (reach[i] = 1) and counts, in every tensor that
** requires grad, its uses by reachable nodes (tape_uses). Reverse creation order is
** topological: when node i is visited, every reachable consumer of its output has been
** counted already, so the node is reachable iff its output is root or has uses. Other
** graphs on the tape (micro-batches still waiting for their backward) are left alone. */
static void mark_reachable(const tt_tensor *root, unsigned char *reach) {
  for (int64_t i = tt_tape_len - 1; i >= tt_tape_base; i--) {
    tt_node *node = tt_tape[i];
    reach[i] = node->out == root || node->out->tape_uses > 0;
    if (!reach[i]) continue;
    for (int k = 0; k < node->n_inputs; k++) {
      tt_tensor *in = node->inputs[k];
      if (in && in->requires_grad) in->tape_uses++;
    }
  }
}

/* Deferred gradients (tt_set_deferred_grads). Each reachable node gets a kind: */
enum { NODE_SKIP, NODE_NOW, NODE_SPLIT, NODE_LATER };
/* NODE_NOW runs in the first pass; NODE_LATER (every input needing grad is deferred)
** in the second; NODE_SPLIT (both kinds of input) computes its other inputs' gradients
** in the first pass and its deferred inputs' in the second, keeping its output's
** gradient in between. Deferred: a listed leaf, or the output of a NODE_LATER node. A
** node marked whole (node->whole) is never split: with both kinds it runs in the first
** pass, its deferred inputs' gradients included. */
static tt_tensor **tt_deferred;
static int tt_n_deferred;

int tt_set_deferred_grads(tt_tensor *const *leaves, int n) {
  free(tt_deferred);
  tt_deferred = NULL;
  tt_n_deferred = 0;
  if (n <= 0) return 0;
  tt_deferred = malloc(sizeof(tt_tensor *) * (size_t)n);
  TT_CHECK(tt_deferred, "autograd: out of host memory (%d deferred gradients)", n);
  memcpy(tt_deferred, leaves, sizeof(tt_tensor *) * (size_t)n);
  tt_n_deferred = n;
  return 0;
}

/* Sorts the reachable nodes into kinds (kind[i], from reach[i]), in creation order so
** that a node's inputs are classified before it. Marks the deferred tensors. */
static void classify(unsigned char *kind) {
  for (int d = 0; d < tt_n_deferred; d++)
    if (tt_deferred[d]->requires_grad) tt_deferred[d]->grad_deferred = 1;
  for (int64_t i = 0; i < tt_tape_len; i++) {
    if (!kind[i]) continue;
    tt_node *node = tt_tape[i];
    int now = 0, later = 0;
    for (int k = 0; k < node->n_inputs; k++) {
      tt_tensor *in = node->inputs[k];
      if (!in || !in->requires_grad) continue;
      if (in->grad_deferred) later++; else now++;
    }
    /* A node that must run whole runs in the first pass when anything needs it there. */
    kind[i] = later == 0 || (now > 0 && node->whole) ? NODE_NOW
              : now == 0                              ? NODE_LATER
                                                      : NODE_SPLIT;
    if (kind[i] == NODE_LATER) node->out->grad_deferred = 1;
  }
}

/* Hides from a node's backward its inputs of one kind (deferred ones when `deferred`,
** else the others) by clearing their requires_grad: backward functions compute only the
** gradients their inputs need. Returns which inputs to show again (show_inputs). */
static unsigned hide_inputs(tt_node *node, int deferred) {
  unsigned hidden = 0;
  for (int k = 0; k < node->n_inputs; k++) {
    tt_tensor *in = node->inputs[k];
    if (in && in->requires_grad && in->grad_deferred == deferred) {
      in->requires_grad = 0;
      hidden |= 1u << k;
    }
  }
  return hidden;
}

static void show_inputs(tt_node *node, unsigned hidden) {
  for (int k = 0; k < node->n_inputs; k++)
    if (hidden & (1u << k)) node->inputs[k]->requires_grad = 1;
}

/* Runs node i's backward toward its inputs of one kind (`part` 0: the others, 1: the
** deferred ones; -1: all), then counts those uses done: a leaf's grad-ready hook fires
** at its last. */
static void run_node(int64_t i, int part, int *rc) {
  tt_node *node = tt_tape[i];
  tt_tensor *g = node->out->grad;
  if (g && *rc == 0) {
    unsigned hidden = part >= 0 ? hide_inputs(node, !part) : 0;
    int profiled = tt_op_profile_running();
    if (profiled) tt_op_profile_mark(NULL, TT_OP_OUTSIDE);
    *rc = node->backward(node, g);
    if (profiled) tt_op_profile_mark(node->name, TT_OP_BACKWARD);
    show_inputs(node, hidden);
    if (*rc != 0) tt_error_context("backward of %s", node->name);
  }
  for (int k = 0; k < node->n_inputs; k++) {
    tt_tensor *in = node->inputs[k];
    if (!in || !in->requires_grad || (part >= 0 && in->grad_deferred != part)) continue;
    if (--in->tape_uses == 0 && in->is_leaf && tt_grad_hook && *rc == 0)
      tt_grad_hook(in, tt_grad_hook_ud);
  }
}

/* Done with node i: its output's gradient and the node go. */
static void retire_node(int64_t i, int rc) {
  tt_node *node = tt_tape[i];
  tt_tensor_release(node->out->grad);
  node->out->grad = NULL;
  node->out->grad_deferred = 0;
  node_free(node);
  tt_tape[i] = NULL;
  if (tt_tick_hook && rc == 0) tt_tick_hook(tt_tick_hook_ud);
}

/* Runs the reachable nodes in reverse order, freeing each once it ran; the unreachable
** ones keep their order at the front of the tape. A leaf's grad-ready hook fires when
** its last reachable use has added its contribution. With deferred gradients, a second
** pass in the same order does the work toward them. After an error the whole tape is
** dropped and the use counts reset. */
int tt_backward_with(tt_tensor *root, tt_tensor *grad_root) {
  char a[160], b[160];
  TT_CHECK(root->requires_grad, "backward: the tensor does not require grad (no recorded op "
           "produced it from a tensor that requires grad)");
  TT_CHECK(root->ndim == grad_root->ndim &&
               memcmp(root->shape, grad_root->shape, sizeof(int64_t) * (size_t)root->ndim) == 0,
           "backward: gradient shape %s differs from the tensor's %s",
           tt_shape_str(grad_root->shape, grad_root->ndim, a, sizeof a),
           tt_shape_str(root->shape, root->ndim, b, sizeof b));
  unsigned char *kind = calloc((size_t)(tt_tape_len > 0 ? tt_tape_len : 1), 1);
  TT_CHECK(kind, "backward: out of host memory (%lld tape nodes)", (long long)tt_tape_len);
  int saved_mode = tt_grad_enabled;
  tt_grad_enabled = 0;
  tt_backward_depth++;
  /* A nested backward (a checkpoint's recompute) runs whole, deferring nothing: the
  ** outer one keeps the deferred leaves marked for its own second pass. */
  const int64_t base = tt_tape_base;
  int rc = tt_accumulate_grad(root, grad_root);
  mark_reachable(root, kind);
  if (base == 0) classify(kind);
  for (int64_t i = tt_tape_len - 1; i >= base && rc == 0; i--) {
    if (kind[i] == NODE_NOW) {
      run_node(i, -1, &rc);
      retire_node(i, rc);
    } else if (kind[i] == NODE_SPLIT) {
      /* Its own reference keeps the output's gradient from being taken over (shared)
      ** by an input now: the second pass reads it. */
      tt_tensor *g = tt_tape[i]->out->grad;
      tt_tensor_retain(g);
      run_node(i, 0, &rc);
      tt_tensor_release(g);
      if (tt_tick_hook && rc == 0) tt_tick_hook(tt_tick_hook_ud);
    }
  }
  for (int64_t i = tt_tape_len - 1; i >= base && rc == 0; i--) {
    if (kind[i] != NODE_SPLIT && kind[i] != NODE_LATER) continue;
    run_node(i, kind[i] == NODE_SPLIT ? 1 : -1, &rc);
    retire_node(i, rc);
  }
  if (base == 0)
    for (int d = 0; d < tt_n_deferred; d++) tt_deferred[d]->grad_deferred = 0;
  int64_t n = base;
  for (int64_t i = base; i < tt_tape_len; i++)
    if (tt_tape[i]) tt_tape[n++] = tt_tape[i];
  tt_tape_len = n;
  if (rc != 0) {
    for (int64_t i = base; i < tt_tape_len; i++) {
      tt_node *node = tt_tape[i];
      node->out->tape_uses = 0;
      node->out->grad_deferred = 0;
      tt_tensor_release(node->out->grad);   /* a split node's kept gradient */
      node->out->grad = NULL;
      for (int k = 0; k < node->n_inputs; k++)
        if (node->inputs[k]) node->inputs[k]->tape_uses = 0;
    }
    tt_tape_clear();
  }
  free(kind);
  if (!root->is_leaf) {
    tt_tensor_release(root->grad);
    root->grad = NULL;
  }
  tt_grad_enabled = saved_mode;
  tt_backward_depth--;
  return rc;
}

int tt_backward(tt_tensor *loss) {
  TT_CHECK(tt_tensor_numel(loss) == 1, "backward: called on a tensor with %lld elements; "
           "pass an explicit gradient for non-scalars", (long long)tt_tensor_numel(loss));
  tt_tensor *one = NULL;
  TT_TRY(tt_tensor_full(loss->shape, loss->ndim, loss->dtype, loss->device, 1.0, &one));
  int rc = tt_backward_with(loss, one);
  tt_tensor_release(one);
  return rc;
}

/* -- Activation recompute ---------------------------------------------------------- */

/* The stash: values an op's forward chose from state it then changed (an FP8 layer's
** scales, taken from an amax history its forward moves on), kept while a checkpointed
** block runs (TT_CKPT_STASHING) and handed back in the same order while its re-run does
** (TT_CKPT_REPLAYING), so that the re-run computes with the first run's values and changes
** nothing. A checkpoint node owns its block's stash (node->ctx). Values a device keeps
** where the host cannot read them without a wait (the CUDA FP8 layers' scales) are
** stashed as tensors (s: retained, in call order).
** Under selective recompute (tt_checkpoint_keep_gemms) the stash also keeps the block's
** GEMM outputs (t: retained tensors, in call order), which its re-run takes back instead
** of computing them again. */
typedef struct ckpt_stash {
  double *v;
  int64_t n, cap, next;
  tt_tensor **s;
  int64_t ns, scap, snext;
  tt_tensor **t;
  int64_t nt, tcap, tnext;
  int keep;   /* GEMM outputs are kept: the re-run must take each back */
} ckpt_stash;

static int tt_ckpt_mode;
static int tt_ckpt_keep;            /* the block being stashed keeps its GEMM outputs */
static ckpt_stash *tt_ckpt_stash;   /* being filled, or being replayed */

static void stash_free(void *p) {
  ckpt_stash *st = p;
  if (st) {
    for (int64_t i = 0; i < st->nt; i++) tt_tensor_release(st->t[i]);
    for (int64_t i = 0; i < st->ns; i++) tt_tensor_release(st->s[i]);
    free(st->t);
    free(st->s);
    free(st->v);
  }
  free(st);
}

int tt_checkpoint_mode(void) { return tt_ckpt_mode; }

static ckpt_stash *stash_get(void) {
  if (!tt_ckpt_stash) {
    tt_ckpt_stash = calloc(1, sizeof *tt_ckpt_stash);
    if (!tt_ckpt_stash) tt_set_error("checkpoint: out of host memory (stash)");
    else tt_ckpt_stash->keep = tt_ckpt_keep;
  }
  return tt_ckpt_stash;
}

void tt_checkpoint_keep_gemms(int on) { tt_ckpt_keep = on != 0; }

int tt_checkpoint_keep_swap(int on) {
  const int was = tt_ckpt_keep;
  tt_ckpt_keep = on != 0;
  return was;
}

/* Appends t, retained, to a stash's list (*list, *n of *cap). */
static int stash_push(tt_tensor ***list, int64_t *n, int64_t *cap, tt_tensor *t) {
  if (*n == *cap) {
    int64_t grown_cap = *cap ? *cap * 2 : 8;
    tt_tensor **grown = realloc(*list, (size_t)grown_cap * sizeof *grown);
    TT_CHECK(grown, "checkpoint: out of host memory (stash of %lld tensors)",
             (long long)grown_cap);
    *list = grown;
    *cap = grown_cap;
  }
  tt_tensor_retain(t);
  (*list)[(*n)++] = t;
  return 0;
}

int tt_checkpoint_keep_output(tt_tensor *t) {
  if (tt_ckpt_mode != TT_CKPT_STASHING || !tt_ckpt_keep) return 0;
  ckpt_stash *st = stash_get();
  return st ? stash_push(&st->t, &st->nt, &st->tcap, t) : -1;
}

int tt_checkpoint_take_output(const int64_t *shape, int ndim, int dtype, int device,
                              tt_tensor **out) {
  *out = NULL;
  ckpt_stash *st = tt_ckpt_stash;
  if (tt_ckpt_mode != TT_CKPT_REPLAYING || !st || !st->keep) return 0;
  TT_CHECK(st->tnext < st->nt, "checkpoint: the re-run asks for more kept GEMM outputs "
           "(%lld) than its first run kept (the block's forward took another path)",
           (long long)st->tnext + 1);
  tt_tensor *t = st->t[st->tnext];
  int same = t->ndim == ndim && t->dtype == dtype && t->device == device;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  char got[160], want[160];
  TT_CHECK(same, "checkpoint: kept GEMM output %lld is %s %s; the re-run computes %s %s (the "
           "block's forward took another path)", (long long)st->tnext,
           tt_dtype_name(t->dtype), tt_shape_str(t->shape, t->ndim, got, sizeof got),
           tt_dtype_name(dtype), tt_shape_str(shape, ndim, want, sizeof want));
  st->tnext++;
  tt_tensor_retain(t);
  *out = t;
  return 0;
}

int tt_checkpoint_keep_copy(tt_tensor *t) {
  if (tt_ckpt_mode != TT_CKPT_STASHING || !tt_ckpt_keep) return 0;
  /* A copy: the block may change its output in place (RoPE rotates q and k). */
  tt_tensor *copy = NULL;
  int rc = tt_empty_like(t, &copy);
  if (rc == 0) rc = tt_copy_(copy, t);
  if (rc == 0) rc = tt_checkpoint_keep_output(copy);
  tt_tensor_release(copy);
  return rc;
}

void tt_checkpoint_rerun_done(void) {
  if (tt_ckpt_mode == TT_CKPT_REPLAYING) tt_ckpt_mode = TT_CKPT_OFF;
}

int tt_checkpoint_stash(const double *v, int n) {
  if (tt_ckpt_mode != TT_CKPT_STASHING) return 0;
  ckpt_stash *st = stash_get();
  if (!st) return -1;
  if (st->n + n > st->cap) {
    int64_t cap = st->cap ? st->cap * 2 : 16;
    while (cap < st->n + n) cap *= 2;
    double *grown = realloc(st->v, (size_t)cap * sizeof *grown);
    TT_CHECK(grown, "checkpoint: out of host memory (stash of %lld values)", (long long)cap);
    st->v = grown;
    st->cap = cap;
  }
  memcpy(st->v + st->n, v, (size_t)n * sizeof *v);
  st->n += n;
  return 0;
}

int tt_checkpoint_replay(double *v, int n) {
  ckpt_stash *st = tt_ckpt_stash;
  TT_CHECK(tt_ckpt_mode == TT_CKPT_REPLAYING && st && st->next + n <= st->n,
           "checkpoint: the re-run asks for more stashed values than its first run kept "
           "(the block's forward took another path)");
  memcpy(v, st->v + st->next, (size_t)n * sizeof *v);
  st->next += n;
  return 0;
}

int tt_checkpoint_stash_tensor(tt_tensor *t) {
  if (tt_ckpt_mode != TT_CKPT_STASHING) return 0;
  ckpt_stash *st = stash_get();
  return st ? stash_push(&st->s, &st->ns, &st->scap, t) : -1;
}

int tt_checkpoint_replay_tensor(tt_tensor **out) {
  ckpt_stash *st = tt_ckpt_stash;
  *out = NULL;
  TT_CHECK(tt_ckpt_mode == TT_CKPT_REPLAYING && st && st->snext < st->ns,
           "checkpoint: the re-run asks for more stashed tensors than its first run kept "
           "(the block's forward took another path)");
  *out = st->s[st->snext++];
  tt_tensor_retain(*out);
  return 0;
}

void tt_checkpoint_begin(void) {
  stash_free(tt_ckpt_stash);
  tt_ckpt_stash = NULL;
  tt_ckpt_keep = 0;
  tt_ckpt_mode = TT_CKPT_STASHING;
}

void tt_checkpoint_cancel(void) {
  if (tt_ckpt_mode != TT_CKPT_STASHING) return;
  stash_free(tt_ckpt_stash);
  tt_ckpt_stash = NULL;
  tt_ckpt_keep = 0;
  tt_ckpt_mode = TT_CKPT_OFF;
}

void tt_set_recompute_hook(tt_recompute_fn fn, void *userdata) {
  tt_recompute_hook = fn;
  tt_recompute_hook_ud = userdata;
}

/* inputs[0] = x; i[0] = the caller's key; ctx = the block's stash (or NULL). Re-runs the
** block from a fresh leaf sharing x's storage (the hook records its forward and runs the
** nested backward from its output with grad_out), then adds the leaf's gradient into x.
** Whatever the re-run recorded and its backward did not reach is dropped before the
** outer backward goes on. */
static int checkpoint_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *x = node->inputs[0], *leaf = NULL;
  TT_CHECK(tt_recompute_hook, "checkpoint: no recompute hook is set");
  TT_TRY(tt_detach(x, &leaf));
  leaf->requires_grad = 1;
  const int64_t outer_base = tt_tape_base;
  const int outer_grad = tt_grad_enabled;
  tt_tape_base = tt_tape_len;
  tt_grad_enabled = 1;
  ckpt_stash *st = node->ctx;
  if (st) st->next = st->snext = st->tnext = 0;
  tt_ckpt_stash = st;
  tt_ckpt_mode = TT_CKPT_REPLAYING;
  int rc = tt_recompute_hook(node->i[0], leaf, grad_out, tt_recompute_hook_ud);
  if (rc == 0 && st && st->keep && st->tnext != st->nt)
    rc = tt_set_error("checkpoint: the re-run took %lld of the %lld GEMM outputs its first "
                      "run kept (the block's forward took another path)",
                      (long long)st->tnext, (long long)st->nt);
  tt_ckpt_mode = TT_CKPT_OFF;
  tt_ckpt_stash = NULL;
  tt_grad_enabled = outer_grad;
  tape_truncate(tt_tape_base);
  tt_tape_base = outer_base;
  if (rc == 0 && leaf->grad && tt_needs_grad(x)) rc = tt_accumulate_grad(x, leaf->grad);
  tt_tensor_release(leaf);
  return rc;
}

int tt_checkpoint(tt_tensor *x, tt_tensor *y, int64_t key) {
  ckpt_stash *st = tt_ckpt_mode == TT_CKPT_STASHING ? tt_ckpt_stash : NULL;
  if (tt_ckpt_mode == TT_CKPT_STASHING) {
    tt_ckpt_stash = NULL;
    tt_ckpt_keep = 0;
    tt_ckpt_mode = TT_CKPT_OFF;
  }
  if (!tt_should_record(&x, 1)) {
    stash_free(st);
    return 0;
  }
  if (!y->is_leaf || y->requires_grad) {
    stash_free(st);
    return tt_set_error("checkpoint: the block's output was recorded (run the block with "
                        "recording off)");
  }
  tt_node *node = tt_record("checkpoint", checkpoint_backward, y, &x, 1);
  if (!node) {
    stash_free(st);
    return -1;
  }
  node->i[0] = key;
  node->ctx = st;
  node->free_ctx = stash_free;
  return 0;
}
