/*
** safetensors.c — reading and writing safetensors files (format in tetra_io.h).
**
** Reading maps the file and parses the JSON header with the engine's one JSON reader
** (common/json.c), then takes from it exactly what the format allows (objects of
** strings and unsigned integers), ignoring other fields of a tensor entry. Tensor bytes (a
** whole tensor, or a box of one) are copied out of the mapping into engine storage, so the mapping never outlives the file
** handle. Writing builds the header, pads it with spaces to a multiple of 8 bytes (so
** the data starts aligned, as the Python writer does), and goes through a temporary
** file that is fsynced and renamed: a crash leaves the old file or the new one.
*/
#include "tetra_io.h"
#include "core/tt_internal.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_entry {
  char *name;
  int dtype;                 /* tt_dtype or -1 */
  char file_dtype[16];
  int ndim;
  int64_t shape[TT_MAX_DIMS];
  uint64_t begin, end;       /* byte offsets into the data region */
} st_entry;

struct tt_safetensors {
  char *path;
  uint8_t *map;
  size_t map_size;
  const uint8_t *data;       /* start of the data region */
  uint64_t data_size;
  int n;
  st_entry *entries;
  int n_meta;
  char **meta_keys;
  char **meta_values;
};

/* -- Dtype names -------------------------------------------------------------------- */

static const struct { const char *name; int dtype; } dtype_names[] = {
  {"F32", TT_F32}, {"BF16", TT_BF16}, {"F16", TT_F16}, {"F8_E4M3", TT_E4M3},
  {"F8_E5M2", TT_E5M2}, {"I32", TT_I32}, {"I64", TT_I64},
};
enum { N_DTYPE_NAMES = sizeof dtype_names / sizeof dtype_names[0] };

static int dtype_from_file(const char *name) {
  for (int i = 0; i < N_DTYPE_NAMES; i++)
    if (!strcmp(dtype_names[i].name, name)) return dtype_names[i].dtype;
  return -1;
}

static const char *dtype_to_file(int dtype) {
  for (int i = 0; i < N_DTYPE_NAMES; i++)
    if (dtype_names[i].dtype == dtype) return dtype_names[i].name;
  return NULL;
}

/* -- The JSON header ---------------------------------------------------------------- */
/* Parsed by the one JSON reader (common/json.c) into nodes over the header text; read
** here as the format allows: an object of tensor entries (dtype, shape, data_offsets;
** other fields ignored) and an optional "__metadata__" object of strings. */

typedef struct header {
  tt_json doc;
  const char *path;          /* for messages */
} header;

static int bad_header(const header *h, const char *what) {
  return tt_set_error("safetensors: %s: bad header: %s", h->path, what);
}

/* String node idx as a new malloc'd string (escapes decoded). */
static int header_string(const header *h, int32_t idx, const char *what, char **out) {
  if (h->doc.nodes[idx].type != TT_JSON_STRING) return bad_header(h, what);
  tt_buf b = {0};
  if (tt_json_string(&h->doc, idx, &b) != 0) {
    tt_buf_free(&b);
    return -1;
  }
  *out = b.data;
  return 0;
}

/* Number node idx as an unsigned integer: digits only, read exactly (a double would round
** offsets above 2^53), refused when it does not fit 64 bits. */
static int header_uint(const header *h, int32_t idx, uint64_t *out) {
  const tt_json_node *n = &h->doc.nodes[idx];
  const char *d = h->doc.src + n->start;
  if (n->type != TT_JSON_NUMBER) return bad_header(h, "expected an integer");
  uint64_t v = 0;
  for (uint32_t i = 0; i < n->len; i++) {
    if (d[i] < '0' || d[i] > '9') return bad_header(h, "expected an integer");
    uint64_t digit = (uint64_t)(d[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return bad_header(h, "integer overflow");
    v = v * 10 + digit;
  }
  *out = v;
  return 0;
}

/* A list of unsigned integers [a, b, ...] into vals (at most max entries). */
static int header_uint_list(const header *h, int32_t idx, uint64_t *vals, int max, int *n) {
  const tt_json_node *list = &h->doc.nodes[idx];
  if (list->type != TT_JSON_ARRAY) return bad_header(h, "expected a list");
  if (list->count > max) return bad_header(h, "too many entries in a list");
  *n = 0;
  for (int32_t c = list->child; c >= 0; c = h->doc.nodes[c].next)
    TT_TRY(header_uint(h, c, &vals[(*n)++]));
  return 0;
}

static int parse_entry(const header *h, int32_t obj, st_entry *e) {
  const tt_json_node *o = &h->doc.nodes[obj];
  if (o->type != TT_JSON_OBJECT) return bad_header(h, "a tensor entry is not an object");
  if (o->count == 0) return bad_header(h, "empty tensor entry");
  int32_t dtype = tt_json_get(&h->doc, obj, "dtype");
  int32_t shape = tt_json_get(&h->doc, obj, "shape");
  int32_t offsets = tt_json_get(&h->doc, obj, "data_offsets");
  if (dtype < 0 || shape < 0 || offsets < 0)
    return tt_set_error("safetensors: %s: tensor '%s' lacks dtype, shape or data_offsets",
                        h->path, e->name);
  char *name = NULL;
  TT_TRY(header_string(h, dtype, "dtype is not a string", &name));
  snprintf(e->file_dtype, sizeof e->file_dtype, "%s", name);
  e->dtype = dtype_from_file(name);
  free(name);
  uint64_t dims[TT_MAX_DIMS];
  TT_TRY(header_uint_list(h, shape, dims, TT_MAX_DIMS, &e->ndim));
  for (int i = 0; i < e->ndim; i++) {
    if (dims[i] > (uint64_t)INT64_MAX) return bad_header(h, "dimension too large");
    e->shape[i] = (int64_t)dims[i];
  }
  uint64_t off[2];
  int n = 0;
  TT_TRY(header_uint_list(h, offsets, off, 2, &n));
  if (n != 2) return bad_header(h, "data_offsets needs [begin, end]");
  e->begin = off[0];
  e->end = off[1];
  return 0;
}

static int parse_metadata(const header *h, int32_t obj, tt_safetensors *f) {
  const tt_json_node *o = &h->doc.nodes[obj];
  if (o->type != TT_JSON_OBJECT) return bad_header(h, "__metadata__ is not an object");
  if (f->meta_keys) return bad_header(h, "__metadata__ appears twice");
  f->meta_keys = calloc((size_t)o->count + 1, sizeof(char *));
  f->meta_values = calloc((size_t)o->count + 1, sizeof(char *));
  if (!f->meta_keys || !f->meta_values) return tt_set_error("safetensors: out of host memory");
  for (int32_t k = o->child; k >= 0; k = h->doc.nodes[h->doc.nodes[k].next].next) {
    char **key = &f->meta_keys[f->n_meta], **val = &f->meta_values[f->n_meta];
    TT_TRY(header_string(h, k, "a __metadata__ key is not a string", key));
    f->n_meta++;   /* counted once the key is held, so closing frees it */
    TT_TRY(header_string(h, h->doc.nodes[k].next, "a __metadata__ value is not a string",
                         val));
  }
  return 0;
}

static int parse_entries(const header *h, tt_safetensors *f) {
  const tt_json_node *top = &h->doc.nodes[0];
  if (top->type != TT_JSON_OBJECT) return bad_header(h, "the header is not an object");
  f->entries = calloc((size_t)top->count + 1, sizeof(st_entry));
  if (!f->entries) return tt_set_error("safetensors: out of host memory");
  for (int32_t k = top->child; k >= 0; k = h->doc.nodes[h->doc.nodes[k].next].next) {
    const int32_t value = h->doc.nodes[k].next;
    if (tt_json_string_eq(&h->doc, k, "__metadata__")) {
      TT_TRY(parse_metadata(h, value, f));
      continue;
    }
    st_entry *e = &f->entries[f->n];
    TT_TRY(header_string(h, k, "a tensor name is not a string", &e->name));
    f->n++;   /* counted once its name is held, so closing frees it */
    TT_TRY(parse_entry(h, value, e));
  }
  return 0;
}

static int parse_header(tt_safetensors *f, const char *text, size_t len) {
  header h = {.path = f->path};
  int rc = tt_json_parse(&h.doc, text, len);
  if (rc != 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", tt_last_error());
    tt_set_error("safetensors: %s: bad header: %s", f->path, why);
  } else {
    rc = parse_entries(&h, f);
  }
  tt_json_free(&h.doc);
  return rc;
}

/* Checks every entry's bytes against its shape and the data region, and that the last
** tensor ends where the file does: bytes beyond it are a damaged or doctored file (the
** reference implementation refuses them too). */
static int check_entries(const tt_safetensors *f) {
  uint64_t last_end = 0;
  for (int i = 0; i < f->n; i++) {
    const st_entry *e = &f->entries[i];
    if (e->end > last_end) last_end = e->end;
    if (e->end < e->begin || e->end > f->data_size)
      return tt_set_error("safetensors: %s: tensor '%s' data_offsets [%llu, %llu] outside "
                          "the %llu data bytes", f->path, e->name,
                          (unsigned long long)e->begin, (unsigned long long)e->end,
                          (unsigned long long)f->data_size);
    /* Checked products: a size that wraps modulo 2^64 can match the bytes present (shape
    ** [2^62 + 2] of F32 "needs" 8 bytes) and reading the tensor would run past them. The
    ** shape of a dtype Tetra cannot load is checked as well: tt_safetensors_info gives it
    ** out. */
    int64_t numel;
    uint64_t nbytes = 0;
    if (tt_shape_numel_checked("safetensors", e->shape, e->ndim, &numel) != 0 ||
        (e->dtype >= 0 && __builtin_mul_overflow((uint64_t)numel,
                                                 (uint64_t)tt_dtype_size(e->dtype), &nbytes))) {
      char shape[160];
      return tt_set_error("safetensors: %s: tensor '%s' has shape %s, whose size overflows "
                          "64 bits", f->path, e->name,
                          tt_shape_str(e->shape, e->ndim, shape, sizeof shape));
    }
    if (e->dtype >= 0 && nbytes != e->end - e->begin)
      return tt_set_error("safetensors: %s: tensor '%s' has %llu bytes, its shape and dtype "
                          "%s need %llu", f->path, e->name,
                          (unsigned long long)(e->end - e->begin), e->file_dtype,
                          (unsigned long long)nbytes);
  }
  if (f->n > 0 && last_end != f->data_size)
    return tt_set_error("safetensors: %s: %llu bytes follow the last tensor's data (the "
                        "file is longer than its header says: appended or damaged)", f->path,
                        (unsigned long long)(f->data_size - last_end));
  return 0;
}

/* -- Reading ------------------------------------------------------------------------ */

void tt_safetensors_close(tt_safetensors *f) {
  if (!f) return;
  if (f->map) munmap(f->map, f->map_size);
  for (int i = 0; i < f->n; i++) free(f->entries[i].name);
  free(f->entries);
  for (int i = 0; i < f->n_meta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->meta_keys);
  free(f->meta_values);
  free(f->path);
  free(f);
}

static int open_mapped(tt_safetensors *f, const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return tt_set_error("safetensors: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return tt_set_error("safetensors: cannot stat %s: %s", path, strerror(err));
  }
  if (st.st_size < 8) {
    close(fd);
    return tt_set_error("safetensors: %s: file too short (%lld bytes)", path,
                        (long long)st.st_size);
  }
  f->map_size = (size_t)st.st_size;
  void *m = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return tt_set_error("safetensors: cannot map %s: %s", path, strerror(errno));
  f->map = m;
  return 0;
}

int tt_safetensors_open(const char *path, tt_safetensors **out) {
  *out = NULL;
  tt_safetensors *f = calloc(1, sizeof *f);
  if (!f) return tt_set_error("safetensors: out of host memory");
  f->path = strdup(path);
  if (!f->path || open_mapped(f, path)) {
    if (!f->path) tt_set_error("safetensors: out of host memory");
    tt_safetensors_close(f);
    return -1;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
  if (hlen > f->map_size - 8) {
    tt_set_error("safetensors: %s: header length %llu exceeds the file (%zu bytes); not a "
                 "safetensors file?", path, (unsigned long long)hlen, f->map_size);
    tt_safetensors_close(f);
    return -1;
  }
  f->data = f->map + 8 + hlen;
  f->data_size = f->map_size - 8 - hlen;
  if (parse_header(f, (const char *)f->map + 8, (size_t)hlen) || check_entries(f)) {
    tt_safetensors_close(f);
    return -1;
  }
  *out = f;
  return 0;
}

int tt_safetensors_count(const tt_safetensors *f) { return f->n; }

const char *tt_safetensors_name(const tt_safetensors *f, int i) {
  return (i >= 0 && i < f->n) ? f->entries[i].name : NULL;
}

int tt_safetensors_find(const tt_safetensors *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->entries[i].name, name)) return i;
  return -1;
}

int tt_safetensors_info(const tt_safetensors *f, int i, int *dtype, int64_t *shape, int *ndim) {
  TT_CHECK(i >= 0 && i < f->n, "safetensors: tensor index %d out of range (%d tensors)", i, f->n);
  const st_entry *e = &f->entries[i];
  if (dtype) *dtype = e->dtype;
  if (ndim) *ndim = e->ndim;
  if (shape) memcpy(shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
  return 0;
}

static int lookup(const tt_safetensors *f, const char *name, const st_entry **pe) {
  int i = tt_safetensors_find(f, name);
  TT_CHECK(i >= 0, "safetensors: %s has no tensor '%s'", f->path, name);
  *pe = &f->entries[i];
  TT_CHECK((*pe)->dtype >= 0, "safetensors: %s: tensor '%s' has dtype %s, which Tetra cannot "
           "load", f->path, name, (*pe)->file_dtype);
  return 0;
}

int tt_safetensors_read(const tt_safetensors *f, const char *name, tt_tensor **out) {
  const st_entry *e = NULL;
  TT_TRY(lookup(f, name, &e));
  tt_tensor *t;
  TT_TRY(tt_tensor_empty(e->shape, e->ndim, e->dtype, TT_CPU, &t));
  memcpy(tt_tensor_data(t), f->data + e->begin, (size_t)(e->end - e->begin));
  tt_io_count_copied(e->end - e->begin);
  *out = t;
  return 0;
}

int tt_safetensors_read_into(const tt_safetensors *f, const char *name, tt_tensor *dst) {
  const st_entry *e = NULL;
  TT_TRY(lookup(f, name, &e));
  int same = e->ndim == dst->ndim;
  for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == dst->shape[d];
  if (!same) {
    char a[96], b[96];
    return tt_set_error("safetensors: %s: tensor '%s' is %s, the destination is %s", f->path,
                        name, tt_shape_str(e->shape, e->ndim, a, sizeof a),
                        tt_shape_str(dst->shape, dst->ndim, b, sizeof b));
  }
  tt_tensor *src;
  TT_TRY(tt_safetensors_read(f, name, &src));
  int rc = 0;
  if (dst->device == TT_CPU) {
    rc = tt_copy_(dst, src);
  } else {
    tt_tensor *dev = NULL;
    rc = tt_to_device(src, dst->device, &dev);
    if (!rc) rc = tt_copy_(dst, dev);
    tt_tensor_release(dev);
  }
  tt_tensor_release(src);
  return rc;
}

uint64_t tt_safetensors_data_start(const tt_safetensors *f) {
  return (uint64_t)(f->data - f->map);
}

/* Checks that [lo, hi) is a box of e (non-empty in every dim) and dst, when given, is
** shaped like it; the first and last element's flat indices in e. */
static int box_of(const tt_safetensors *f, const st_entry *e, const int64_t *lo,
                  const int64_t *hi, const tt_tensor *dst, int64_t *first, int64_t *last) {
  int64_t stride = 1;
  *first = *last = 0;
  for (int d = e->ndim - 1; d >= 0; d--) {
    TT_CHECK(lo[d] >= 0 && lo[d] < hi[d] && hi[d] <= e->shape[d],
             "safetensors: %s: tensor '%s': [%lld, %lld) of dim %d, which has %lld", f->path,
             e->name, (long long)lo[d], (long long)hi[d], d, (long long)e->shape[d]);
    TT_CHECK(!dst || (dst->ndim == e->ndim && dst->shape[d] == hi[d] - lo[d]),
             "safetensors: %s: tensor '%s': the destination is not shaped like the box",
             f->path, e->name);
    *first += lo[d] * stride;
    *last += (hi[d] - 1) * stride;
    stride *= e->shape[d];
  }
  return 0;
}

int tt_safetensors_box_span(const tt_safetensors *f, const char *name, const int64_t *lo,
                            const int64_t *hi, uint64_t *begin, uint64_t *end) {
  const st_entry *e = NULL;
  TT_TRY(lookup(f, name, &e));
  int64_t first, last;
  TT_TRY(box_of(f, e, lo, hi, NULL, &first, &last));
  uint64_t base = tt_safetensors_data_start(f) + e->begin;
  size_t es = tt_dtype_size(e->dtype);
  *begin = base + (uint64_t)first * es;
  *end = base + (uint64_t)(last + 1) * es;
  return 0;
}

int tt_safetensors_read_box(const tt_safetensors *f, const char *name, const int64_t *lo,
                            const int64_t *hi, tt_tensor *dst) {
  const st_entry *e = NULL;
  TT_TRY(lookup(f, name, &e));
  int64_t first, last;
  TT_TRY(box_of(f, e, lo, hi, dst, &first, &last));
  size_t es = tt_dtype_size(e->dtype), nbytes = (size_t)(e->end - e->begin);
  /* The mapping, wrapped as a tensor only for this call (it is read, never written). A
  ** tensor whose bytes are not aligned to its element size (a file that mixes dtypes) is
  ** read whole into aligned memory first. */
  void *bytes = (void *)(f->data + e->begin), *bounce = NULL;
  int64_t box_numel = 1;
  for (int d = 0; d < e->ndim; d++) box_numel *= hi[d] - lo[d];
  if ((uintptr_t)bytes % es) {
    bounce = malloc(nbytes ? nbytes : 1);
    TT_CHECK(bounce, "safetensors: out of host memory (%zu bytes)", nbytes);
    memcpy(bounce, bytes, nbytes);
    bytes = bounce;
    tt_io_count_copied(nbytes);
  } else {
    tt_io_count_copied((uint64_t)box_numel * es);
  }
  tt_tensor *whole = NULL, *view = NULL, *host = NULL, *dev = NULL;
  int rc = tt_tensor_from_buffer(bytes, e->shape, e->ndim, e->dtype, &whole);
  view = whole;
  if (whole) tt_tensor_retain(whole);
  for (int d = 0; rc == 0 && d < e->ndim; d++) {
    if (lo[d] == 0 && hi[d] == e->shape[d]) continue;
    tt_tensor *n = NULL;
    rc = tt_narrow(view, d, lo[d], hi[d] - lo[d], &n);
    tt_tensor_release(view);
    view = n;
  }
  if (rc == 0 && dst->device == TT_CPU) {
    rc = tt_copy_(dst, view);
  } else if (rc == 0) {
    int64_t shape[TT_MAX_DIMS];
    for (int d = 0; d < e->ndim; d++) shape[d] = hi[d] - lo[d];
    rc = tt_tensor_empty(shape, e->ndim, e->dtype, TT_CPU, &host);
    if (rc == 0) rc = tt_copy_(host, view);
    if (rc == 0) rc = tt_to_device(host, dst->device, &dev);
    if (rc == 0) rc = tt_copy_(dst, dev);
  }
  tt_tensor_release(dev);
  tt_tensor_release(host);
  tt_tensor_release(view);
  tt_tensor_release(whole);
  free(bounce);
  return rc;
}

int tt_safetensors_metadata_count(const tt_safetensors *f) { return f->n_meta; }

const char *tt_safetensors_metadata_key(const tt_safetensors *f, int i) {
  return (i >= 0 && i < f->n_meta) ? f->meta_keys[i] : NULL;
}

const char *tt_safetensors_metadata_get(const tt_safetensors *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
  return NULL;
}

/* -- Writing ------------------------------------------------------------------------ */

typedef struct sbuf {
  char *s;
  size_t len, cap;
  int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *s2 = realloc(b->s, cap);
    if (!s2) {
      b->oom = 1;
      return;
    }
    b->s = s2;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_string(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      sb_put(b, esc, 2);
    } else if (c < 0x20) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", c);
      sb_str(b, esc);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_put(b, "\"", 1);
}

/* The sums of a file being written (tt_safetensors_save_summed): the whole file's CRC,
** the current block's so far (fill bytes of it), and the blocks done. */
typedef struct {
  tt_file_sums *out;
  uint32_t cur;
  uint64_t fill;
  int64_t done;
} summer;

static void sum_bytes(summer *s, const uint8_t *p, size_t n) {
  tt_file_sums *o = s->out;
  o->crc = tt_crc32c(o->crc, p, n);
  while (n > 0) {
    size_t take = o->block - s->fill < n ? (size_t)(o->block - s->fill) : n;
    s->cur = tt_crc32c(s->cur, p, take);
    s->fill += take;
    p += take;
    n -= take;
    if (s->fill == o->block) {   /* more blocks than planned: counted, caught below */
      if (s->done < o->n_blocks) o->sums[s->done] = s->cur;
      s->done++;
      s->cur = 0;
      s->fill = 0;
    }
  }
}

/* Writes n bytes, summed on the way when s is not NULL. */
static int write_all(int fd, const void *p, size_t n, const char *path, summer *s) {
  const char *q = p;
  if (s) sum_bytes(s, p, n);
  while (n > 0) {
    ssize_t w = write(fd, q, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return tt_set_error("safetensors: writing %s: %s", path, strerror(errno));
    }
    q += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The header: tensors in the given order, offsets packed back to back. */
static int build_header(sbuf *b, const char *const *names, tt_tensor *const *tensors, int n,
                        const char *const *meta_keys, const char *const *meta_values,
                        int n_meta) {
  sb_str(b, "{");
  if (n_meta > 0) {
    sb_str(b, "\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
      if (i) sb_str(b, ",");
      sb_json_string(b, meta_keys[i]);
      sb_str(b, ":");
      sb_json_string(b, meta_values[i]);
    }
    sb_str(b, "}");
  }
  uint64_t offset = 0;
  for (int i = 0; i < n; i++) {
    const tt_tensor *t = tensors[i];
    const char *dt = dtype_to_file(t->dtype);
    TT_CHECK(dt, "safetensors: tensor '%s' has dtype %s, which the format cannot hold",
             names[i], tt_dtype_name(t->dtype));
    for (int k = 0; k < i; k++)
      TT_CHECK(strcmp(names[k], names[i]) != 0, "safetensors: duplicate tensor name '%s'",
               names[i]);
    uint64_t nbytes = (uint64_t)tt_tensor_numel(t) * tt_dtype_size(t->dtype);
    char num[64];
    if (i || n_meta > 0) sb_str(b, ",");
    sb_json_string(b, names[i]);
    sb_str(b, ":{\"dtype\":\"");
    sb_str(b, dt);
    sb_str(b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
      sb_str(b, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
             (unsigned long long)(offset + nbytes));
    sb_str(b, num);
    offset += nbytes;
  }
  sb_str(b, "}");
  while (b->len % 8 != 0) sb_str(b, " ");
  TT_CHECK(!b->oom, "safetensors: out of host memory building the header");
  return 0;
}

/* Writes one tensor's bytes in logical order (copying to a contiguous CPU tensor when
** the view is strided or on a device). */
static int write_tensor(int fd, tt_tensor *t, const char *path, summer *s) {
  tt_tensor *host = NULL;
  if (t->device != TT_CPU) {
    TT_TRY(tt_to_device(t, TT_CPU, &host));
  } else {
    TT_TRY(tt_contiguous(t, &host));
  }
  tt_tensor *c = host;
  if (!tt_tensor_is_contiguous(host)) {
    int rc = tt_clone(host, &c);
    tt_tensor_release(host);
    TT_TRY(rc);
  }
  size_t nbytes = (size_t)tt_tensor_numel(c) * tt_dtype_size(c->dtype);
  int rc = write_all(fd, tt_tensor_data(c), nbytes, path, s);
  tt_tensor_release(c);
  return rc;
}

/* tt_safetensors_save, with the sums taken on the way when out is not NULL. */
static int save_file(const char *path, const char *const *names, tt_tensor *const *tensors,
                     int n, const char *const *meta_keys, const char *const *meta_values,
                     int n_meta, tt_file_sums *out) {
  if (out) *out = (tt_file_sums){0, 0, 0, NULL};
  TT_CHECK(n >= 0 && n_meta >= 0, "safetensors: negative count");
  sbuf b = {0};
  if (build_header(&b, names, tensors, n, meta_keys, meta_values, n_meta)) {
    free(b.s);
    return -1;
  }
  summer sum = {out, 0, 0, 0}, *s = NULL;
  if (out) {   /* the file's size is known from the header: its blocks too */
    uint64_t size = 8 + (uint64_t)b.len;
    for (int i = 0; i < n; i++)
      size += (uint64_t)tt_tensor_numel(tensors[i]) * tt_dtype_size(tensors[i]->dtype);
    *out = (tt_file_sums){0, tt_checksum_block(size), 0, NULL};
    out->n_blocks = (int64_t)((size + out->block - 1) / out->block);
    out->sums = malloc(sizeof(uint32_t) * (size_t)(out->n_blocks ? out->n_blocks : 1));
    if (!out->sums) {
      free(b.s);
      return tt_set_error("safetensors: out of host memory");
    }
    s = &sum;
  }
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 5);
  if (!tmp) {
    free(b.s);
    tt_file_sums_free(out);
    return tt_set_error("safetensors: out of host memory");
  }
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp", 5);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    tt_set_error("safetensors: cannot create %s: %s", tmp, strerror(errno));
    free(tmp);
    free(b.s);
    tt_file_sums_free(out);
    return -1;
  }
  uint8_t len_le[8];
  for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
  int rc = write_all(fd, len_le, 8, tmp, s);
  if (!rc) rc = write_all(fd, b.s, b.len, tmp, s);
  for (int i = 0; !rc && i < n; i++) rc = write_tensor(fd, tensors[i], tmp, s);
  if (!rc && s && sum.fill) {   /* the last, shorter block */
    if (sum.done < out->n_blocks) out->sums[sum.done] = sum.cur;
    sum.done++;
  }
  if (!rc && s && sum.done != out->n_blocks)
    rc = tt_set_error("safetensors: %s: summed %lld blocks, %lld expected", tmp,
                      (long long)sum.done, (long long)out->n_blocks);
  if (!rc && fsync(fd) != 0) rc = tt_set_error("safetensors: fsync %s: %s", tmp, strerror(errno));
  if (close(fd) != 0 && !rc) rc = tt_set_error("safetensors: close %s: %s", tmp, strerror(errno));
  if (!rc && rename(tmp, path) != 0)
    rc = tt_set_error("safetensors: rename %s -> %s: %s", tmp, path, strerror(errno));
  if (rc) {
    unlink(tmp);
    tt_file_sums_free(out);
  }
  free(tmp);
  free(b.s);
  return rc;
}

int tt_safetensors_save(const char *path, const char *const *names,
                        tt_tensor *const *tensors, int n, const char *const *meta_keys,
                        const char *const *meta_values, int n_meta) {
  return save_file(path, names, tensors, n, meta_keys, meta_values, n_meta, NULL);
}

int tt_safetensors_save_summed(const char *path, const char *const *names,
                               tt_tensor *const *tensors, int n, const char *const *meta_keys,
                               const char *const *meta_values, int n_meta, tt_file_sums *out) {
  TT_CHECK(out, "safetensors: no place for the sums");
  return save_file(path, names, tensors, n, meta_keys, meta_values, n_meta, out);
}

void tt_file_sums_free(tt_file_sums *s) {
  if (!s) return;
  free(s->sums);
  s->sums = NULL;
  s->n_blocks = 0;
}
