/*
** ckpt_writer.c — a background thread that writes a checkpoint's files (asynchronous
** checkpoints, checkpoint.async in lua/tetra/checkpoint/init.lua).
**
** The training thread queues operations: safetensors files of host tensors it will not
** touch again (snapshots taken at the step boundary), byte blobs (copied here), fsyncs
** and renames. start() hands the queue to one thread, which runs them in order (each
** file fsynced and summed: CRC-32C, a safetensors file also per block, taken as
** tt_safetensors_save_summed writes it) while training
** goes on; poll() and wait() tell the training thread when it is done. A checkpoint
** takes two queues: every rank's files, then, once every rank's writer has finished,
** rank 0's publishing (checksums.json, the directory's rename, `latest`).
**
** The thread only reads the tensors (and takes and drops extra references, which are
** atomic); it never frees one: the writer keeps a reference to each until
** tt_ckpt_writer_free, called on the training thread, so the caching allocator is used
** from that thread alone.
*/
#include "core/tt_internal.h"
#include "tetra_io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* -- The queue --------------------------------------------------------------------- */

enum { CKPT_SAFETENSORS, CKPT_BYTES, CKPT_FSYNC, CKPT_RENAME };

typedef struct {
  int kind;
  char *path;
  char *to;   /* CKPT_RENAME: the new name */
  /* CKPT_SAFETENSORS: the tensors; CKPT_BYTES: the blob (bytes, len). */
  int n_tensors, n_meta;
  char **names;
  tt_tensor **tensors;
  char **meta_keys, **meta_values;
  char *bytes;
  size_t len;
  uint32_t crc;
  /* CKPT_SAFETENSORS: the CRC-32C of each block of tt_checksum_block's size */
  uint64_t block;
  int64_t n_blocks;
  uint32_t *blocks;
} ckpt_file;

struct tt_ckpt_writer {
  ckpt_file *files;
  int n, cap;
  pthread_t thread;
  int started, joined;
  atomic_int state;          /* 0 running (or not started), 1 done, -1 failed */
  int delay_ms;              /* a test switch: wait before writing */
  char error[512];
};

int tt_ckpt_writer_new(tt_ckpt_writer **out) {
  tt_ckpt_writer *w = calloc(1, sizeof *w);
  TT_CHECK(w, "checkpoint writer: out of host memory");
  atomic_init(&w->state, 0);
  *out = w;
  return 0;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static void free_file(ckpt_file *f) {
  free(f->blocks);
  free(f->path);
  free(f->to);
  for (int i = 0; i < f->n_tensors; i++) {
    if (f->names) free(f->names[i]);
    if (f->tensors) tt_tensor_release(f->tensors[i]);
  }
  for (int i = 0; i < f->n_meta; i++) {
    if (f->meta_keys) free(f->meta_keys[i]);
    if (f->meta_values) free(f->meta_values[i]);
  }
  free(f->names);
  free(f->tensors);
  free(f->meta_keys);
  free(f->meta_values);
  free(f->bytes);
}

/* A new zeroed entry at the end of the queue (NULL when out of memory or started). */
static ckpt_file *push(tt_ckpt_writer *w, const char *path) {
  if (w->started) {
    tt_set_error("checkpoint writer: files added after start");
    return NULL;
  }
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 8;
    ckpt_file *f = realloc(w->files, (size_t)cap * sizeof *f);
    if (!f) {
      tt_set_error("checkpoint writer: out of host memory");
      return NULL;
    }
    w->files = f;
    w->cap = cap;
  }
  ckpt_file *f = &w->files[w->n];
  memset(f, 0, sizeof *f);
  f->path = dup_str(path);
  if (!f->path) {
    tt_set_error("checkpoint writer: out of host memory");
    return NULL;
  }
  w->n++;
  return f;
}

int tt_ckpt_writer_add_safetensors(tt_ckpt_writer *w, const char *path,
                                   const char *const *names, tt_tensor *const *tensors,
                                   int n, const char *const *meta_keys,
                                   const char *const *meta_values, int n_meta) {
  TT_CHECK(n >= 0 && n_meta >= 0, "checkpoint writer: negative count");
  ckpt_file *f = push(w, path);
  if (!f) return -1;
  f->kind = CKPT_SAFETENSORS;
  f->names = calloc((size_t)n + 1, sizeof *f->names);
  f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
  f->meta_keys = calloc((size_t)n_meta + 1, sizeof *f->meta_keys);
  f->meta_values = calloc((size_t)n_meta + 1, sizeof *f->meta_values);
  TT_CHECK(f->names && f->tensors && f->meta_keys && f->meta_values,
           "checkpoint writer: out of host memory");
  for (int i = 0; i < n; i++) {
    TT_CHECK(tensors[i]->device == TT_CPU,
             "checkpoint writer: tensor '%s' is not in host memory (snapshot it first)", names[i]);
    f->names[i] = dup_str(names[i]);
    tt_tensor_retain(tensors[i]);
    f->tensors[i] = tensors[i];
    f->n_tensors = i + 1;
    TT_CHECK(f->names[i], "checkpoint writer: out of host memory");
  }
  for (int i = 0; i < n_meta; i++) {
    f->meta_keys[i] = dup_str(meta_keys[i]);
    f->meta_values[i] = dup_str(meta_values[i]);
    f->n_meta = i + 1;
    TT_CHECK(f->meta_keys[i] && f->meta_values[i], "checkpoint writer: out of host memory");
  }
  return 0;
}

int tt_ckpt_writer_add_bytes(tt_ckpt_writer *w, const char *path, const void *data, size_t len) {
  ckpt_file *f = push(w, path);
  if (!f) return -1;
  f->kind = CKPT_BYTES;
  f->bytes = malloc(len ? len : 1);
  TT_CHECK(f->bytes, "checkpoint writer: out of host memory (%zu bytes)", len);
  if (len) memcpy(f->bytes, data, len);
  f->len = len;
  return 0;
}

int tt_ckpt_writer_add_fsync(tt_ckpt_writer *w, const char *path) {
  ckpt_file *f = push(w, path);
  if (!f) return -1;
  f->kind = CKPT_FSYNC;
  return 0;
}

int tt_ckpt_writer_add_rename(tt_ckpt_writer *w, const char *from, const char *to) {
  ckpt_file *f = push(w, from);
  if (!f) return -1;
  f->kind = CKPT_RENAME;
  f->to = dup_str(to);
  TT_CHECK(f->to, "checkpoint writer: out of host memory");
  return 0;
}

/* -- The thread -------------------------------------------------------------------- */

static int write_blob(const ckpt_file *f) {
  int fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TT_CHECK(fd >= 0, "checkpoint writer: cannot create %s: %s", f->path, strerror(errno));
  size_t done = 0;
  while (done < f->len) {
    ssize_t k = write(fd, f->bytes + done, f->len - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = errno;
      close(fd);
      return tt_set_error("checkpoint writer: write %s: %s", f->path, strerror(e));
    }
    done += (size_t)k;
  }
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return tt_set_error("checkpoint writer: fsync %s: %s", f->path, strerror(e));
  }
  TT_CHECK(close(fd) == 0, "checkpoint writer: close %s: %s", f->path, strerror(errno));
  return 0;
}

static int fsync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  TT_CHECK(fd >= 0, "checkpoint writer: cannot open %s to fsync: %s", path, strerror(errno));
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    return tt_set_error("checkpoint writer: fsync %s: %s", path, strerror(e));
  }
  close(fd);
  return 0;
}

static int run_op(ckpt_file *f) {
  switch (f->kind) {
  case CKPT_SAFETENSORS: {
    tt_file_sums sums;
    TT_TRY(tt_safetensors_save_summed(f->path, (const char *const *)f->names, f->tensors,
                                      f->n_tensors, (const char *const *)f->meta_keys,
                                      (const char *const *)f->meta_values, f->n_meta, &sums));
    f->crc = sums.crc;
    f->block = sums.block;
    f->n_blocks = sums.n_blocks;
    f->blocks = sums.sums;
    return 0;
  }
  case CKPT_BYTES:
    f->crc = tt_crc32c(0, f->bytes, f->len);
    return write_blob(f);
  case CKPT_FSYNC:
    return fsync_path(f->path);
  default:
    TT_CHECK(rename(f->path, f->to) == 0, "checkpoint writer: cannot rename %s to %s: %s",
             f->path, f->to, strerror(errno));
    return 0;
  }
}

static void *writer_main(void *arg) {
  tt_ckpt_writer *w = arg;
  if (w->delay_ms > 0) {
    struct timespec ts = { w->delay_ms / 1000, (long)(w->delay_ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  }
  for (int i = 0; i < w->n; i++) {
    if (run_op(&w->files[i])) {
      snprintf(w->error, sizeof w->error, "%s", tt_last_error());
      atomic_store(&w->state, -1);
      return NULL;
    }
  }
  atomic_store(&w->state, 1);
  return NULL;
}

void tt_ckpt_writer_set_delay_ms(tt_ckpt_writer *w, int ms) { w->delay_ms = ms; }

int tt_ckpt_writer_start(tt_ckpt_writer *w) {
  TT_CHECK(!w->started, "checkpoint writer: already started");
  int rc = pthread_create(&w->thread, NULL, writer_main, w);
  TT_CHECK(rc == 0, "checkpoint writer: cannot start a thread: %s", strerror(rc));
  w->started = 1;
  return 0;
}

int tt_ckpt_writer_poll(const tt_ckpt_writer *w) {
  return w->started ? atomic_load(&((tt_ckpt_writer *)w)->state) : 0;
}

int tt_ckpt_writer_wait(tt_ckpt_writer *w) {
  TT_CHECK(w->started, "checkpoint writer: not started");
  if (!w->joined) {
    pthread_join(w->thread, NULL);
    w->joined = 1;
  }
  TT_CHECK(atomic_load(&w->state) == 1, "%s", w->error);
  return 0;
}

uint32_t tt_ckpt_writer_crc(const tt_ckpt_writer *w, int i) {
  return i >= 0 && i < w->n ? w->files[i].crc : 0;
}

int64_t tt_ckpt_writer_blocks(const tt_ckpt_writer *w, int i, uint64_t *block,
                              const uint32_t **sums) {
  if (i < 0 || i >= w->n || !w->files[i].blocks) return -1;
  *block = w->files[i].block;
  *sums = w->files[i].blocks;
  return w->files[i].n_blocks;
}

void tt_ckpt_writer_free(tt_ckpt_writer *w) {
  if (!w) return;
  if (w->started && !w->joined) pthread_join(w->thread, NULL);
  for (int i = 0; i < w->n; i++) free_file(&w->files[i]);
  free(w->files);
  free(w);
}
