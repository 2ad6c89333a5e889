/*
** alloc.c — per-device caching allocator and the device backend registry.
**
** Freed blocks are kept in per-size free lists (sizes rounded up to a size class) and
** handed out again, so a training step that allocates the same activations every
** iteration stops calling malloc/cudaMalloc after the first step. Every device keeps
** live/peak byte counts for metrics and the memory planner.
*/
#include "tt_internal.h"
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
  "cpu", cpu_alloc, cpu_free, cpu_memcpy, cpu_memset0,
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

enum { TT_MAX_DEVICES = 17, TT_NUM_CLASSES = 4 * 40 };

typedef struct free_block {
  struct free_block *next;
  void *ptr;
  size_t size;
} free_block;

typedef struct device_cache {
  pthread_mutex_t lock;
  free_block *classes[TT_NUM_CLASSES];   /* exact size-class free lists */
  tt_alloc_stats stats;
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
** slack. Returns the class index and rounds *size up to the class size. */
static int size_class(size_t *size) {
  size_t s = *size < 64 ? 64 : *size;
  int log2 = 63 - __builtin_clzll((unsigned long long)s);
  size_t base = (size_t)1 << log2;
  size_t step = log2 >= 2 ? base / 4 : 1;
  size_t k = (s - base + step - 1) / step;      /* 0..4 */
  size_t rounded = base + k * step;
  *size = rounded;
  int cls = (log2 - 6) * 4 + (int)k;
  return cls < TT_NUM_CLASSES ? cls : -1;       /* huge blocks are not cached */
}

static void *cached_alloc(int device, size_t nbytes, size_t *pgranted) {
  const tt_device_backend *be = tt_backend_for(device);
  device_cache *c = cache_for(device);
  if (!be || !c) return NULL;
  size_t size = nbytes;
  int cls = size_class(&size);
  void *p = NULL;
  pthread_mutex_lock(&c->lock);
  c->stats.num_allocs++;
  if (cls >= 0 && c->classes[cls]) {
    free_block *b = c->classes[cls];
    c->classes[cls] = b->next;
    p = b->ptr;
    c->stats.cached_bytes -= (int64_t)b->size;
    c->stats.num_cache_hits++;
    free(b);
  }
  pthread_mutex_unlock(&c->lock);
  if (!p) {
    p = be->alloc(size, device);
    if (!p) {
      /* Give the cache back to the device and try once more before failing. */
      tt_alloc_empty_cache(device);
      p = be->alloc(size, device);
    }
    if (!p) {
      tt_set_error("out of memory on %s allocating %zu bytes", be->name, size);
      return NULL;
    }
  }
  pthread_mutex_lock(&c->lock);
  c->stats.live_bytes += (int64_t)size;
  if (c->stats.live_bytes > c->stats.peak_bytes) c->stats.peak_bytes = c->stats.live_bytes;
  pthread_mutex_unlock(&c->lock);
  *pgranted = size;
  return p;
}

static void cached_free(int device, void *p, size_t size) {
  const tt_device_backend *be = tt_backend_for(device);
  device_cache *c = cache_for(device);
  if (!be || !c) return;
  size_t rounded = size;
  int cls = size_class(&rounded);
  free_block *b = cls >= 0 ? malloc(sizeof *b) : NULL;
  pthread_mutex_lock(&c->lock);
  c->stats.live_bytes -= (int64_t)size;
  if (b) {
    b->ptr = p;
    b->size = size;
    b->next = c->classes[cls];
    c->classes[cls] = b;
    c->stats.cached_bytes += (int64_t)size;
  }
  pthread_mutex_unlock(&c->lock);
  if (!b) be->free(p, device);
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

/* -- Storage ------------------------------------------------------------------------- */

tt_storage *tt_storage_new(size_t nbytes, int device) {
  tt_storage *s = calloc(1, sizeof *s);
  if (!s) {
    tt_set_error("out of host memory (storage header)");
    return NULL;
  }
  size_t granted = 0;
  s->data = cached_alloc(device, nbytes, &granted);
  if (!s->data) {
    free(s);
    return NULL;
  }
  s->nbytes = granted;
  s->device = device;
  s->refcount = 1;
  return s;
}

void tt_storage_release(tt_storage *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (!s->external) cached_free(s->device, s->data, s->nbytes);
  free(s);
}
