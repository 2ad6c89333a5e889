/*
** alloc.c — per-device caching allocator and the device backend registry.
**
** Freed blocks are kept in per-size free lists (sizes rounded up to a size class) and
** handed out again, so a training step that allocates the same activations every
** iteration stops calling malloc/cudaMalloc after the first step. Every device keeps
** live/peak byte counts for metrics and the memory planner.
**
** On a device with streams, a freed block may still be in use by kernels queued on the
** stream it was used on. Each cached block remembers that stream: a request from the same
** stream takes it at once (stream order does the rest); a request from another stream
** prefers such a block of its own, and otherwise takes the block after ordering its
** stream behind the block's (an event, no host wait). A storage freed on another stream
** than the one it was allocated on orders the freeing stream after the allocating one
** first, so the freeing stream alone covers every use.
*/
#include "core/tt_internal.h"
#include <pthread.h>

/* -- CPU backend --------------------------------------------------------------------- */

static void *cpu_alloc(size_t nbytes, int device) {
  (void)device;
  void *p = NULL;
  /* 64-byte alignment: whole cache lines, and aligned AVX loads. */
  if (posix_memalign(&p, 64, nbytes ? nbytes : 64) != 0) return NULL;
  return p;
}

static void cpu_free(void *p, int device) { (void)device; free(p); }

static int cpu_memcpy(void *dst, int dst_device, const void *src, int src_device,
                      size_t nbytes) {
  if (dst_device != TT_CPU || src_device != TT_CPU)
    return tt_set_error("memcpy: the cpu backend cannot copy to or from cuda:%d",
                        dst_device != TT_CPU ? dst_device : src_device);
  memcpy(dst, src, nbytes);
  return 0;
}

static int cpu_memset0(void *p, int device, size_t nbytes) {
  (void)device;
  memset(p, 0, nbytes);
  return 0;
}

static const tt_device_backend tt_cpu_backend = {
  "cpu", cpu_alloc, cpu_free, cpu_memcpy, cpu_memset0, NULL, NULL, NULL, NULL, NULL, NULL,
};
static const tt_device_backend *tt_cuda_backend;

void tt_register_cuda_backend(const tt_device_backend *backend) { tt_cuda_backend = backend; }

const tt_device_backend *tt_backend_for(int device) {
  if (device == TT_CPU) return &tt_cpu_backend;
  if (device >= 0 && tt_cuda_backend) return tt_cuda_backend;
  tt_set_error("device cuda:%d is not available (%s)", device,
               tt_cuda_backend ? "bad ordinal" : "no CUDA backend: built without CUDA or no GPU");
  return NULL;
}

int tt_no_kernel(const char *op, int device) {
  return tt_set_error("%s: not implemented on %s", op, device == TT_CPU ? "cpu" : "cuda");
}

/* -- Caching ------------------------------------------------------------------------- */

/* Size classes (size_class): 4 a power of two from 64 B to 16 MiB, 32 from there to 1 TiB. */
enum { TT_MAX_DEVICES = 17, TT_FINE_LOG2 = 24,
       TT_NUM_CLASSES = (TT_FINE_LOG2 - 6) * 4 + (40 - TT_FINE_LOG2) * 32 };

typedef struct free_block {
  struct free_block *next;
  void *ptr;
  size_t size;
  void *stream;     /* the stream whose queued work may still use it */
  int idle;         /* no queued work uses it (no streams, or its stream was retired) */
} free_block;

typedef struct device_cache {
  pthread_mutex_t lock;
  free_block *classes[TT_NUM_CLASSES];   /* exact size-class free lists */
  tt_alloc_stats stats;
  /* Streams destroyed (drained first) whose keys no new stream has taken since: a storage
  ** or a pooled block that still names one needs no ordering after it, and asking the
  ** backend for it would use a dead handle (on CUDA an event recorded on a destroyed
  ** stream: undefined, a crash in the driver). */
  void **retired;
  int n_retired, cap_retired;
} device_cache;

static device_cache tt_caches[TT_MAX_DEVICES];
static pthread_once_t tt_caches_once = PTHREAD_ONCE_INIT;

static void init_caches(void) {
  for (int i = 0; i < TT_MAX_DEVICES; i++) pthread_mutex_init(&tt_caches[i].lock, NULL);
}

static device_cache *cache_for(int device) {
  pthread_once(&tt_caches_once, init_caches);
  int slot = device + 1;
  return (slot >= 0 && slot < TT_MAX_DEVICES) ? &tt_caches[slot] : NULL;
}

/* Size classes: 256 B granularity up to 4 KiB is wasteful for tiny tensors, so classes
** are powers of two split into 4 steps (…, 1024, 1280, 1536, 1792, 2048, …): at most 25%
** slack. From 16 MiB on (TT_FINE_LOG2) each power of two is split into 32 steps (512 KiB
** at 16 MiB, 32 MiB at 1 GiB): at most 3.2% slack where a model's large buffers are (a
** 408 MiB ZeRO-3 share of Llama-3 70B was granted 448 MiB with 4 steps, 416 MiB now).
** A training step asks for the same sizes every time, so the finer classes still serve
** it from the cache. Returns the class index and rounds *size up to the class size. */
static int size_class(size_t *size) {
  size_t s = *size < 64 ? 64 : *size;
  int log2 = 63 - __builtin_clzll((unsigned long long)s);
  size_t base = (size_t)1 << log2;
  int steps = log2 >= TT_FINE_LOG2 ? 32 : 4;
  size_t step = base / (size_t)steps;
  size_t k = (s - base + step - 1) / step;      /* 0..steps: `steps` is the next base */
  *size = base + k * step;
  int cls = log2 < TT_FINE_LOG2 ? (log2 - 6) * 4 + (int)k
                                : (TT_FINE_LOG2 - 6) * 4 + (log2 - TT_FINE_LOG2) * 32 + (int)k;
  return cls < TT_NUM_CLASSES ? cls : -1;       /* huge blocks are not cached */
}

/* Puts a block of `size` granted bytes into the cache (freed to the device when its size
** is not cached); `stream` is the stream that may still use it. */
/* Lock held: whether `key` names a stream destroyed since it was last created. */
static int is_retired(const device_cache *c, void *key) {
  for (int i = 0; key && i < c->n_retired; i++)
    if (c->retired[i] == key) return 1;
  return 0;
}

static void cached_free_block(int device, void *p, size_t size, void *stream, int idle) {
  const tt_device_backend *be = tt_backend_for(device);
  device_cache *c = cache_for(device);
  size_t rounded = size;
  int cls = size_class(&rounded);
  free_block *b = cls >= 0 ? malloc(sizeof *b) : NULL;
  if (!b) {
    be->free(p, device);
    return;
  }
  b->ptr = p;
  b->size = size;
  b->stream = stream;
  pthread_mutex_lock(&c->lock);
  b->idle = idle ? 1 : is_retired(c, stream);   /* a pool's block of a destroyed stream */
  b->next = c->classes[cls];
  c->classes[cls] = b;
  c->stats.cached_bytes += (int64_t)size;
  pthread_mutex_unlock(&c->lock);
}

void tt_alloc_mark_idle(int device) {
  device_cache *c = cache_for(device);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < TT_NUM_CLASSES; i++)
    for (free_block *b = c->classes[i]; b; b = b->next) b->idle = 1;
  pthread_mutex_unlock(&c->lock);
}

void tt_alloc_stream_retired(int device, void *key) {
  device_cache *c = cache_for(device);
  if (!c || !key) return;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < TT_NUM_CLASSES; i++)
    for (free_block *b = c->classes[i]; b; b = b->next)
      if (b->stream == key) b->idle = 1;
  if (!is_retired(c, key)) {
    if (c->n_retired == c->cap_retired) {
      int cap = c->cap_retired ? 2 * c->cap_retired : 16;
      void **grown = realloc(c->retired, (size_t)cap * sizeof *grown);
      if (grown) {
        c->retired = grown;
        c->cap_retired = cap;
      }
    }
    /* Out of host memory: the key is not remembered, and a storage still naming it
    ** orders after it as before this set existed. */
    if (c->n_retired < c->cap_retired) c->retired[c->n_retired++] = key;
  }
  pthread_mutex_unlock(&c->lock);
}

void tt_alloc_stream_born(int device, void *key) {
  device_cache *c = cache_for(device);
  if (!c || !key) return;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n_retired; i++)
    if (c->retired[i] == key) c->retired[i--] = c->retired[--c->n_retired];
  pthread_mutex_unlock(&c->lock);
}

/* Takes a block of class `cls` for a request on stream `cur`: idle or of the same stream
** first, else the most recently freed one (*order set: the caller orders `cur` after
** *from). During a capture (`capturing`) only the first kind, or NULL: ordering the
** capturing stream after work outside the capture is not allowed (CUDA's programming
** guide, "Prohibited and unhandled operations"), nor is touching the legacy default
** stream while a blocking stream captures. Lock held. */
static free_block *take_block(device_cache *c, int cls, void *cur, int capturing, int *order,
                              void **from) {
  free_block **link = &c->classes[cls], **pick = NULL;
  for (free_block **l = link; *l; l = &(*l)->next)
    if ((*l)->idle || (*l)->stream == cur) {
      pick = l;
      break;
    }
  if (!pick && capturing) return NULL;
  if (!pick) {
    pick = link;
    *order = 1;
    *from = (*pick)->stream;
  }
  free_block *b = *pick;
  *pick = b->next;
  return b;
}

/* Set by a backend whose allocation failed for another reason than memory (on CUDA an
** earlier kernel's fault, which cudaMalloc reports too): its message stands, and neither
** the cache is emptied nor the call retried. Per thread. */
static __thread int tt_alloc_fault;

void tt_alloc_failed_not_oom(void) { tt_alloc_fault = 1; }

/* TETRA_ALLOC_LIMIT_MIB (tt_alloc_set_limit): the most each device's cache may hold,
** tensors and cached blocks together; 0, none. A request that would pass it fails as one
** the device refused, so a run rehearses its out-of-memory path on a device that small. */
static size_t alloc_limit;

void tt_alloc_set_limit(size_t bytes) { alloc_limit = bytes; }

/* Whether c may take size more bytes under the limit. Lock not held: two threads may
** both pass it by one request each, which the limit tolerates. */
static int within_limit(device_cache *c, size_t size) {
  if (!alloc_limit) return 1;
  pthread_mutex_lock(&c->lock);
  size_t held = (size_t)(c->stats.live_bytes + c->stats.cached_bytes);
  pthread_mutex_unlock(&c->lock);
  return held + size <= alloc_limit;
}

static void *cached_alloc(int device, size_t nbytes, size_t *pgranted, void **pstream) {
  const tt_device_backend *be = tt_backend_for(device);
  device_cache *c = cache_for(device);
  if (!be || !c) return NULL;
  size_t size = nbytes;
  int cls = size_class(&size);
  void *cur = be->current_stream ? be->current_stream() : NULL;
  /* A pool in use: a CUDA graph is being captured on this thread (train/graph.lua). */
  const int capturing = tt_alloc_pool_current(device) != NULL;
  void *p = NULL, *from = NULL;
  int order = 0;
  pthread_mutex_lock(&c->lock);
  c->stats.num_allocs++;
  free_block *b = cls >= 0 && c->classes[cls]
                      ? take_block(c, cls, cur, capturing, &order, &from) : NULL;
  if (b) {
    p = b->ptr;
    c->stats.cached_bytes -= (int64_t)b->size;
    c->stats.num_cache_hits++;
    free(b);
  }
  pthread_mutex_unlock(&c->lock);
  if (p && order && be->order_after(device, from) != 0) {
    cached_free_block(device, p, size, from, 0);
    return NULL;
  }
  if (!p) {
    tt_alloc_fault = 0;
    p = within_limit(c, size) ? be->alloc(size, device) : NULL;
    if (!p && tt_alloc_fault) return NULL;
    /* Give the cache back to the device and try once more before failing; not during a
    ** capture, where freeing device memory (cudaFree) is not allowed and would end it. */
    if (!p && !capturing) {
      tt_alloc_empty_cache(device);
      p = within_limit(c, size) ? be->alloc(size, device) : NULL;
    }
    if (!p) {
      pthread_mutex_lock(&c->lock);
      tt_alloc_stats st = c->stats;
      pthread_mutex_unlock(&c->lock);
      const double gib = 1024.0 * 1024.0 * 1024.0;
      char where[32];
      if (device == TT_CPU) snprintf(where, sizeof where, "%s", be->name);
      else snprintf(where, sizeof where, "%s:%d", be->name, device);
      char limit[80] = "";
      if (!within_limit(c, size))
        snprintf(limit, sizeof limit, " (over TETRA_ALLOC_LIMIT_MIB=%zu)", alloc_limit >> 20);
      tt_set_error("out of memory on %s allocating %.3f GiB (%zu bytes): %.3f GiB held by "
                   "tensors, %.3f GiB cached, peak %.3f GiB%s%s",
                   where, (double)size / gib, size, (double)st.live_bytes / gib,
                   (double)st.cached_bytes / gib, (double)st.peak_bytes / gib, limit,
                   capturing ? " (while a CUDA graph was being captured, when the cache "
                               "cannot be given back)" : "");
      return NULL;
    }
  }
  pthread_mutex_lock(&c->lock);
  c->stats.live_bytes += (int64_t)size;
  if (c->stats.live_bytes > c->stats.peak_bytes) c->stats.peak_bytes = c->stats.live_bytes;
  pthread_mutex_unlock(&c->lock);
  *pgranted = size;
  *pstream = cur;
  return p;
}

static void cached_free(int device, void *p, size_t size, void *alloc_stream) {
  const tt_device_backend *be = tt_backend_for(device);
  device_cache *c = cache_for(device);
  if (!be || !c) return;
  void *cur = be->current_stream ? be->current_stream() : NULL;
  /* Kernels queued on the allocating stream may still use it: the freeing stream waits
  ** for them, or, when that fails, the block stays with the allocating stream. A
  ** destroyed allocating stream has none left. */
  pthread_mutex_lock(&c->lock);
  c->stats.live_bytes -= (int64_t)size;
  const int gone = is_retired(c, alloc_stream);
  pthread_mutex_unlock(&c->lock);
  if (be->current_stream && cur != alloc_stream && !gone &&
      be->order_after(device, alloc_stream) != 0)
    cur = alloc_stream;
  cached_free_block(device, p, size, cur, be->current_stream == NULL);
}

int tt_alloc_stats_get(int device, tt_alloc_stats *out) {
  device_cache *c = cache_for(device);
  TT_CHECK(c, "alloc_stats: bad device %d", device);
  pthread_mutex_lock(&c->lock);
  *out = c->stats;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

size_t tt_alloc_granted_bytes(size_t nbytes) {
  size_t size = nbytes;
  size_class(&size);
  return size;
}

void tt_alloc_reset_peak(int device) {
  device_cache *c = cache_for(device);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  c->stats.peak_bytes = c->stats.live_bytes;
  pthread_mutex_unlock(&c->lock);
}

void tt_alloc_empty_cache(int device) {
  const tt_device_backend *be = tt_backend_for(device);
  device_cache *c = cache_for(device);
  if (!be || !c) return;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < TT_NUM_CLASSES; i++) {
    free_block *b = c->classes[i];
    while (b) {
      free_block *next = b->next;
      be->free(b->ptr, device);
      c->stats.cached_bytes -= (int64_t)b->size;
      free(b);
      b = next;
    }
    c->classes[i] = NULL;
  }
  pthread_mutex_unlock(&c->lock);
}

/* -- Private pools (CUDA graphs) ---------------------------------------------------- */

struct tt_alloc_pool {
  int device;
  int released;             /* the owner let go: free the pool with its last storage */
  int64_t live;             /* storages of the pool not yet freed */
  free_block *classes[TT_NUM_CLASSES];
  free_block *huge;         /* blocks above the cached classes, any size */
  tt_alloc_pool_stats stats;
};

/* Per thread: a data loader thread's CPU tensors never land in a pool the training
** thread uses for CPU work. */
static __thread tt_alloc_pool *tt_pool_current;

int tt_alloc_pool_new(int device, tt_alloc_pool **out) {
  TT_CHECK(out, "alloc_pool_new: out is NULL");
  TT_CHECK(cache_for(device) && tt_backend_for(device), "alloc_pool_new: bad device %d",
           device);
  tt_alloc_pool *p = calloc(1, sizeof *p);
  TT_CHECK(p, "alloc_pool_new: out of host memory");
  p->device = device;
  *out = p;
  return 0;
}

int tt_alloc_pool_use(int device, tt_alloc_pool *pool) {
  if (!pool) {
    if (tt_pool_current && tt_pool_current->device == device) tt_pool_current = NULL;
    return 0;
  }
  TT_CHECK(!pool->released, "alloc_pool_use: the pool was released");
  TT_CHECK(pool->device == device, "alloc_pool_use: the pool is of device %d, not %d",
           pool->device, device);
  TT_CHECK(!tt_pool_current || tt_pool_current == pool,
           "alloc_pool_use: this thread already allocates from another pool");
  tt_pool_current = pool;
  return 0;
}

tt_alloc_pool *tt_alloc_pool_current(int device) {
  return tt_pool_current && tt_pool_current->device == device ? tt_pool_current : NULL;
}

int tt_alloc_pool_stats_get(const tt_alloc_pool *pool, tt_alloc_pool_stats *out) {
  TT_CHECK(pool && out, "alloc_pool_stats_get: pool or out is NULL");
  device_cache *c = cache_for(pool->device);
  pthread_mutex_lock(&c->lock);
  *out = pool->stats;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

/* Every free block of the pool back to the device's cache, and the pool freed. Its
** blocks were last used on the stream that ran the graph: ordered like any freed block. */
static void pool_destroy(tt_alloc_pool *pool) {
  device_cache *c = cache_for(pool->device);
  for (int i = 0; i <= TT_NUM_CLASSES; i++) {
    free_block *b = i < TT_NUM_CLASSES ? pool->classes[i] : pool->huge;
    while (b) {
      free_block *next = b->next;
      pthread_mutex_lock(&c->lock);
      c->stats.cached_bytes -= (int64_t)b->size;
      pthread_mutex_unlock(&c->lock);
      cached_free_block(pool->device, b->ptr, b->size, b->stream, b->idle);
      free(b);
      b = next;
    }
  }
  if (tt_pool_current == pool) tt_pool_current = NULL;
  free(pool);
}

void tt_alloc_pool_release(tt_alloc_pool *pool) {
  if (!pool) return;
  device_cache *c = cache_for(pool->device);
  pthread_mutex_lock(&c->lock);
  pool->released = 1;
  int last = pool->live == 0;
  pthread_mutex_unlock(&c->lock);
  if (tt_pool_current == pool) tt_pool_current = NULL;
  if (last) pool_destroy(pool);
}

/* A block of the pool for `nbytes`: one of its free ones of the size class (any size at
** least nbytes for huge requests), else a new one from the device's cache or the device. */
static void *pool_alloc(tt_alloc_pool *pool, size_t nbytes, size_t *pgranted, void **pstream) {
  device_cache *c = cache_for(pool->device);
  size_t size = nbytes;
  int cls = size_class(&size);
  free_block *b = NULL;
  pthread_mutex_lock(&c->lock);
  free_block **link = cls >= 0 ? &pool->classes[cls] : &pool->huge;
  for (; *link; link = &(*link)->next)
    if ((*link)->size >= size) break;
  if (*link) {
    b = *link;
    *link = b->next;
    c->stats.cached_bytes -= (int64_t)b->size;
    c->stats.live_bytes += (int64_t)b->size;
    if (c->stats.live_bytes > c->stats.peak_bytes) c->stats.peak_bytes = c->stats.live_bytes;
    c->stats.num_allocs++;
    c->stats.num_cache_hits++;
    pool->stats.taken_bytes += (int64_t)b->size;
    pool->live++;
  }
  pthread_mutex_unlock(&c->lock);
  if (b) {
    void *p = b->ptr;
    *pgranted = b->size;
    *pstream = b->stream;
    free(b);
    return p;
  }
  void *p = cached_alloc(pool->device, nbytes, pgranted, pstream);
  if (!p) return NULL;
  pthread_mutex_lock(&c->lock);
  pool->stats.reserved_bytes += (int64_t)*pgranted;
  pool->stats.taken_bytes += (int64_t)*pgranted;
  pool->stats.grown++;
  pool->live++;
  pthread_mutex_unlock(&c->lock);
  return p;
}

/* A storage of the pool freed: its block back to the pool's free list. */
static void pool_free(tt_alloc_pool *pool, void *p, size_t size, void *stream) {
  device_cache *c = cache_for(pool->device);
  free_block *b = malloc(sizeof *b);
  size_t rounded = size;
  int cls = size_class(&rounded);
  pthread_mutex_lock(&c->lock);
  c->stats.live_bytes -= (int64_t)size;
  pool->stats.taken_bytes -= (int64_t)size;
  pool->live--;
  if (b) {
    b->ptr = p;
    b->size = size;
    b->stream = stream;
    b->idle = 0;
    free_block **head = cls >= 0 ? &pool->classes[cls] : &pool->huge;
    b->next = *head;
    *head = b;
    c->stats.cached_bytes += (int64_t)size;
  } else {   /* no host memory for the record: the block leaves the pool (and the graph
             ** may write it later), so say so rather than hand it out */
    pool->stats.reserved_bytes -= (int64_t)size;
  }
  int last = pool->released && pool->live == 0;
  pthread_mutex_unlock(&c->lock);
  if (!b) {
    fprintf(stderr, "tetra: alloc pool: out of host memory; a block of %zu bytes leaks\n",
            size);
  }
  if (last) pool_destroy(pool);
}

/* -- Storage ------------------------------------------------------------------------- */

tt_storage *tt_storage_new(size_t nbytes, int device) {
  tt_storage *s = calloc(1, sizeof *s);
  if (!s) {
    tt_set_error("out of host memory (storage header)");
    return NULL;
  }
  size_t granted = 0;
  tt_alloc_pool *pool = tt_alloc_pool_current(device);
  s->data = pool ? pool_alloc(pool, nbytes, &granted, &s->stream)
                 : cached_alloc(device, nbytes, &granted, &s->stream);
  s->pool = s->data ? pool : NULL;
  if (!s->data) {
    free(s);
    return NULL;
  }
  s->nbytes = granted;
  s->device = device;
  s->refcount = 1;
  return s;
}

/* ZeRO-3 (engine/dist/reducer.c): a parameter's memory given back between the uses of
** its block while every header over it (views, tensors saved for backward) stays
** (tt_storage_evict, below), and taken again (contents undefined) before the next use.
** Both do nothing when there is nothing to do; memory not ours (external) is never
** evicted. */
int tt_storage_restore(tt_storage *s) {
  if (!s || s->data) return 0;
  free(s->lazy);   /* contents undefined: the caller writes them, not the generator */
  s->lazy = NULL;
  return tt_storage_take(s);
}

int tt_storage_take(tt_storage *s) {
  size_t granted = 0;
  tt_alloc_pool *pool = tt_alloc_pool_current(s->device);
  s->data = pool ? pool_alloc(pool, s->nbytes, &granted, &s->stream)
                 : cached_alloc(s->device, s->nbytes, &granted, &s->stream);
  if (!s->data) return -1;   /* the allocator set the message */
  s->pool = pool;
  s->version++;
  return 0;
}

/* A block from outside the pool, freed while this thread allocates from the pool (a
** CUDA graph being captured): the captured kernels may have used it, and every replay will
** use it again at the same address, so it must not go back to the device's cache, where
** a tensor outside the graph could get it. The pool takes it over instead: it is the
** pool's from now on (handed out again inside the pool, returned to the cache when the
** pool is). */
static void pool_adopt(tt_alloc_pool *pool, size_t size) {
  device_cache *c = cache_for(pool->device);
  pthread_mutex_lock(&c->lock);
  pool->stats.reserved_bytes += (int64_t)size;
  pool->stats.taken_bytes += (int64_t)size;
  pool->stats.adopted++;
  pool->live++;
  pthread_mutex_unlock(&c->lock);
}

/* s's block given back, freed (tt_storage_release) or evicted (tt_storage_evict): to its
** pool, to the pool this thread allocates from (adopted, above), or to the device's
** cache; external memory is not ours to give. */
static void give_back(tt_storage *s) {
  tt_alloc_pool *pool = s->pool;
  if (!pool && !s->external && (pool = tt_alloc_pool_current(s->device)) != NULL)
    pool_adopt(pool, s->nbytes);
  if (pool) pool_free(pool, s->data, s->nbytes, s->stream);
  else if (!s->external) cached_free(s->device, s->data, s->nbytes, s->stream);
}

void tt_storage_evict(tt_storage *s) {
  if (s && s->lazy && !s->data) {   /* never drawn: nothing to give back, nothing kept */
    free(s->lazy);
    s->lazy = NULL;
  }
  if (!s || !s->data || s->external) return;
  give_back(s);
  s->data = NULL;
  s->pool = NULL;
}

void tt_storage_release(tt_storage *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  free(s->lazy);
  if (!s->data) {   /* evicted (tt_storage_evict) or never drawn: nothing to give back */
    free(s);
    return;
  }
  give_back(s);
  free(s);
}
