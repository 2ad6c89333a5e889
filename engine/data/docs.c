/*
** docs.c — data source files: glob expansion and the document reader that streams use.
** A stream owns a byte range of a source; the lines that start inside it are its
** documents, so any number of streams share any number of files without overlap.
*/
#include "data/bpe_internal.h"
#include "tetra_io.h"
#include <errno.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TEXT_CHUNK = 64 * 1024 };

static int has_ext(const char *p, const char *ext) {
  size_t a = strlen(p), b = strlen(ext);
  return a >= b && strcmp(p + a - b, ext) == 0;
}

/* qsort has no context argument: the paths an index sort compares (one sort at a time,
** under the caller's lock-free single use in tt_doc_files_expand). */
static _Thread_local char **sort_paths;
static int cmp_index(const void *a, const void *b) {
  return strcmp(sort_paths[*(const int *)a], sort_paths[*(const int *)b]);
}

void tt_doc_files_free(tt_doc_files *f) {
  for (int i = 0; i < f->n; i++) free(f->paths[i]);
  free(f->paths);
  free(f->sizes);
  free(f->starts);
  memset(f, 0, sizeof *f);
}

/* Refuses a file that is not text (a binary handed over as training data would train on
** garbage, silently): a NUL byte, or UTF-8 that is ill-formed before the last 3 bytes of
** the sample (a sequence may run past its end), in the first 64 KB. */
static int sniff_text(const char *path, int64_t size) {
  enum { SAMPLE = 64 * 1024 };
  uint8_t *buf = malloc(SAMPLE);
  if (!buf) return tt_set_error("out of host memory");
  size_t n = (size_t)(size < SAMPLE ? size : SAMPLE);
  if (tt_s3_is_url(path)) {
    if (tt_s3_read(path, 0, buf, n) != 0) {
      free(buf);
      return -1;
    }
  } else {
    FILE *f = fopen(path, "rb");
    if (!f) {
      free(buf);
      return tt_set_error("%s: %s", path, strerror(errno));
    }
    n = fread(buf, 1, SAMPLE, f);
    fclose(f);
  }
  int rc = 0;
  const uint8_t *nul = memchr(buf, 0, n);
  size_t valid = tt_utf8_valid_prefix(buf, n);
  if (nul)
    rc = tt_set_error("%s: not text (a NUL byte at offset %zu): training data must be UTF-8 "
                      "text or JSONL; use data.datasets with type = \"tokens\" for token shards",
                      path, (size_t)(nul - buf));
  else if (valid + 3 < n)
    rc = tt_set_error("%s: not UTF-8 text (an ill-formed byte at offset %zu): convert it to "
                      "UTF-8 (iconv) first", path, valid);
  free(buf);
  return rc;
}

/* TFRecord framing: u64 length, u32 masked CRC-32C of the length, the data, u32 masked
** CRC-32C of the data (little-endian). */
static uint32_t masked_crc(const void *p, size_t n) {
  uint32_t c = tt_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Refuses a file that does not start with a TFRecord header. */
static int sniff_tfrecord(const char *path, int64_t size) {
  uint8_t h[12];
  if (size < 16) return tt_set_error("%s: not a TFRecord file (%lld bytes)", path, (long long)size);
  if (tt_s3_is_url(path)) {
    TT_TRY(tt_s3_read(path, 0, h, sizeof h));
  } else {
    FILE *f = fopen(path, "rb");
    if (!f) return tt_set_error("%s: %s", path, strerror(errno));
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    if (n != sizeof h) return tt_set_error("%s: read error", path);
  }
  if (masked_crc(h, 8) != le32(h + 8))
    return tt_set_error("%s: not a TFRecord file (the first record's length checksum is wrong)", path);
  return 0;
}

/* Size of a token shard in tokens, from its header. */
static int shard_tokens(const char *path, int64_t *out) {
  tt_token_shard *sh;
  TT_TRY(tt_token_shard_open(path, &sh));
  *out = tt_token_shard_size(sh);
  tt_token_shard_close(sh);
  return 0;
}

int tt_doc_files_expand(const char *patterns, int type, tt_doc_files *out) {
  memset(out, 0, sizeof *out);
  if (!patterns || !*patterns) return tt_set_error("data source: no paths given");
  char *copy = strdup(patterns);
  if (!copy) return tt_set_error("out of host memory");
  int cap = 0, rc = -1;
  int64_t *listed = NULL;   /* object sizes from a listing; -1 for local files */
  char *save = NULL;
  for (char *pat = strtok_r(copy, ",\n", &save); pat; pat = strtok_r(NULL, ",\n", &save)) {
    while (*pat == ' ') pat++;
    size_t l = strlen(pat);
    while (l > 0 && pat[l - 1] == ' ') pat[--l] = '\0';
    if (l == 0) continue;
    char **found = NULL;
    int64_t *found_sizes = NULL;
    int nfound = 0;
    glob_t g = {0};
    if (tt_s3_is_url(pat)) {
      if (tt_s3_list(pat, &found, &found_sizes, &nfound) != 0) goto done;
      if (nfound == 0) {
        free(found);
        free(found_sizes);
        tt_set_error("data path '%s' matches no object", pat);
        goto done;
      }
    } else {
      int grc = glob(pat, 0, NULL, &g);
      if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        tt_set_error("data path '%s' matches no file", pat);
        goto done;
      }
      if (grc != 0) {
        globfree(&g);
        tt_set_error("data path '%s': glob failed", pat);
        goto done;
      }
      found = g.gl_pathv;
      nfound = (int)g.gl_pathc;
    }
    int ok = 1;
    for (int i = 0; i < nfound && ok; i++) {
      if (out->n == cap) {
        cap = cap ? cap * 2 : 16;
        char **p = realloc(out->paths, (size_t)cap * sizeof *p);
        if (p) out->paths = p;
        int64_t *q = p ? realloc(listed, (size_t)cap * sizeof *q) : NULL;
        if (q) listed = q;
        if (!p || !q) { ok = 0; break; }
      }
      out->paths[out->n] = strdup(found[i]);
      if (!out->paths[out->n]) { ok = 0; break; }
      listed[out->n++] = found_sizes ? found_sizes[i] : -1;
    }
    if (found_sizes) {
      for (int i = 0; i < nfound; i++) free(found[i]);
      free(found);
      free(found_sizes);
    } else {
      globfree(&g);
    }
    if (!ok) { tt_set_error("out of host memory"); goto done; }
  }
  if (out->n == 0) {
    tt_set_error("data source: no paths given");
    goto done;
  }
  {
    /* Sorted by name, duplicates dropped; sizes travel with their paths. */
    int *order = malloc((size_t)out->n * sizeof *order);
    char **paths = malloc((size_t)out->n * sizeof *paths);
    int64_t *sizes = malloc((size_t)out->n * sizeof *sizes);
    if (!order || !paths || !sizes) {
      free(order), free(paths), free(sizes);
      tt_set_error("out of host memory");
      goto done;
    }
    for (int i = 0; i < out->n; i++) order[i] = i;
    sort_paths = out->paths;
    qsort(order, (size_t)out->n, sizeof *order, cmp_index);
    int m = 0;
    for (int i = 0; i < out->n; i++) {
      char *p = out->paths[order[i]];
      if (m > 0 && strcmp(p, paths[m - 1]) == 0) { free(p); continue; }
      paths[m] = p;
      sizes[m++] = listed[order[i]];
    }
    free(order);
    free(out->paths);
    free(listed);
    out->paths = paths;
    listed = sizes;
    out->n = m;
  }
  if (type < 0) {
    const char *p0 = out->paths[0];
    type = has_ext(p0, ".jsonl") || has_ext(p0, ".json") || has_ext(p0, ".ndjson") ? TT_DATA_JSONL
           : has_ext(p0, ".tok") ? TT_DATA_TOKENS
           : has_ext(p0, ".tfrecord") || has_ext(p0, ".tfrecords") ? TT_DATA_TFRECORD : TT_DATA_TEXT;
  }
  out->type = type;
  out->sizes = malloc((size_t)out->n * sizeof *out->sizes);
  out->starts = malloc((size_t)out->n * sizeof *out->starts);
  if (!out->sizes || !out->starts) { tt_set_error("out of host memory"); goto done; }
  for (int i = 0; i < out->n; i++) {
    const char *p = out->paths[i];
    if (type == TT_DATA_TOKENS) {
      if (shard_tokens(p, &out->sizes[i]) != 0) goto done;
    } else if (listed[i] >= 0) {
      out->sizes[i] = listed[i];
    } else {
      struct stat st;
      if (stat(p, &st) != 0) { tt_set_error("%s: %s", p, strerror(errno)); goto done; }
      if (!S_ISREG(st.st_mode)) { tt_set_error("%s: not a regular file", p); goto done; }
      if (access(p, R_OK) != 0) { tt_set_error("%s: not readable: %s", p, strerror(errno)); goto done; }
      out->sizes[i] = (int64_t)st.st_size;
    }
    if (out->sizes[i] == 0) { tt_set_error("%s: empty file", p); goto done; }
    if (type == TT_DATA_TFRECORD && sniff_tfrecord(p, out->sizes[i]) != 0) goto done;
    if ((type == TT_DATA_JSONL || type == TT_DATA_TEXT) && sniff_text(p, out->sizes[i]) != 0) goto done;
    out->starts[i] = out->total;
    out->total += out->sizes[i];
  }
  rc = 0;
done:
  free(copy);
  free(listed);
  if (rc != 0) tt_doc_files_free(out);
  return rc;
}

/* -- Reader ------------------------------------------------------------------------- */

void tt_doc_reader_init(tt_doc_reader *r, const tt_doc_files *files, const char *field,
                        int64_t start, int64_t end, int64_t max_bad) {
  memset(r, 0, sizeof *r);
  r->files = files;
  r->field = field ? field : "text";
  r->start = start;
  r->end = end;
  r->open_file = -1;
  r->max_bad = max_bad;
  tt_doc_reader_rewind(r);
}

void tt_doc_reader_rewind(tt_doc_reader *r) {
  const tt_doc_files *fs = r->files;
  int32_t f = 0;
  while (f < fs->n && fs->starts[f] + fs->sizes[f] <= r->start) f++;
  r->file = f;
  r->off = f < fs->n ? r->start - fs->starts[f] : 0;
  r->need_align = r->off > 0;
  /* The open file's position is wherever reading stopped: reopen at the new place. */
  if (r->f) fclose(r->f);
  r->f = NULL;
  r->open_file = -1;
}

void tt_doc_reader_free(tt_doc_reader *r) {
  if (r->f) fclose(r->f);
  r->f = NULL;
  r->open_file = -1;
  free(r->line);
  r->line = NULL;
  tt_buf_free(&r->text);
  tt_json_free(&r->doc);
}

/* Opens (or keeps) the current file positioned at r->off. */
static int ensure_open(tt_doc_reader *r) {
  if (r->open_file == r->file && r->f) return 0;
  if (r->f) fclose(r->f);
  r->open_file = -1;
  const char *p = r->files->paths[r->file];
  if (tt_s3_is_url(p)) {
    r->f = tt_s3_fopen(p, r->files->sizes[r->file]);
    if (!r->f) return -1;
  } else {
    r->f = fopen(p, "rb");
    if (!r->f) return tt_set_error("%s: cannot open (removed during the run?): %s", p, strerror(errno));
  }
  if (fseeko(r->f, (off_t)r->off, SEEK_SET) != 0) {
    fclose(r->f);
    r->f = NULL;
    return tt_set_error("%s: cannot seek to byte %lld", p, (long long)r->off);
  }
  r->open_file = r->file;
  return 0;
}

/* Where byte `off` of the open file is, for messages: "path:LINE" (1-based, counted only
** then) for a local file, "path (byte N)" for an object in storage. */
static int64_t line_number(tt_doc_reader *r, int64_t off);
static const char *where(tt_doc_reader *r, int64_t off, char *buf, size_t cap) {
  const char *path = r->files->paths[r->file];
  if (tt_s3_is_url(path)) snprintf(buf, cap, "%s (byte %lld)", path, (long long)off);
  else snprintf(buf, cap, "%s:%lld", path, (long long)line_number(r, off));
  return buf;
}

/* A failed read: an object's reader has said why already. */
static int read_failed(const char *path) {
  return tt_s3_is_url(path) ? -1 : tt_set_error("%s: read error", path);
}

/* 1-based line number of byte `off` of the open file (counted only for warnings). */
static int64_t line_number(tt_doc_reader *r, int64_t off) {
  char buf[1 << 16];
  int64_t line = 1, pos = 0;
  int fd = fileno(r->f);
  while (pos < off) {
    size_t want = (size_t)(off - pos < (int64_t)sizeof buf ? off - pos : (int64_t)sizeof buf);
    ssize_t n = pread(fd, buf, want, (off_t)pos);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; i++) line += buf[i] == '\n';
    pos += n;
  }
  return line;
}

static void next_file(tt_doc_reader *r) {
  r->file++;
  r->off = 0;
  r->need_align = 0;
}

static int is_plain_ascii(int c) { return c > 0x20 && c < 0x7F; }

/* -- TFRecord ------------------------------------------------------------------------ */

/* The protobuf wire format, as far as tf.train.Example needs it. */
typedef struct pb {
  const uint8_t *p, *end;
} pb;

static int pb_varint(pb *b, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (b->p >= b->end) return -1;
    uint8_t c = *b->p++;
    *v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) return 0;
  }
  return -1;
}

/* Next field of b: its number, and for length-delimited fields (wire type 2) its bytes in
** *sub; other wire types are stepped over (*sub empty). 1: a field, 0: the end, -1: bad. */
static int pb_next(pb *b, uint64_t *field, int *wire, pb *sub) {
  if (b->p >= b->end) return 0;
  uint64_t key, v;
  if (pb_varint(b, &key)) return -1;
  *field = key >> 3;
  *wire = (int)(key & 7);
  sub->p = sub->end = NULL;
  switch (*wire) {
  case 0: return pb_varint(b, &v) ? -1 : 1;
  case 1: if (b->end - b->p < 8) return -1; b->p += 8; return 1;
  case 5: if (b->end - b->p < 4) return -1; b->p += 4; return 1;
  case 2:
    if (pb_varint(b, &v) || v > (uint64_t)(b->end - b->p)) return -1;
    sub->p = b->p;
    sub->end = b->p + v;
    b->p += v;
    return 1;
  default: return -1;
  }
}

/* The one value of the bytes feature `name` of a serialized tf.train.Example
** (Example.features = 1 -> Features.feature = 1: map entries key = 1, value = 2 ->
** Feature.bytes_list = 1 -> BytesList.value = 1). 1 found, 0 absent, -1 with why. */
static int example_text(const uint8_t *data, size_t n, const char *name, const uint8_t **out,
                        size_t *out_len, const char **why) {
  pb ex = {data, data + n}, features, entry, fld;
  uint64_t f;
  int w, rc;
  size_t name_len = strlen(name);
  *why = "not a tf.train.Example";
  while ((rc = pb_next(&ex, &f, &w, &features)) == 1) {
    if (f != 1 || w != 2) continue;
    while ((rc = pb_next(&features, &f, &w, &entry)) == 1) {
      if (f != 1 || w != 2) continue;
      pb key = {0}, value = {0};
      int found_key = 0;
      while ((rc = pb_next(&entry, &f, &w, &fld)) == 1) {
        if (w != 2) continue;
        if (f == 1) key = fld, found_key = 1;
        else if (f == 2) value = fld;
      }
      if (rc < 0) return -1;
      if (!found_key || (size_t)(key.end - key.p) != name_len || memcmp(key.p, name, name_len)) continue;
      int lists = 0;
      while ((rc = pb_next(&value, &f, &w, &fld)) == 1) {
        lists++;
        if (f != 1 || w != 2) {
          *why = "the feature is a float or int64 list, not bytes";
          return -1;
        }
        const uint8_t *first = NULL;
        size_t first_len = 0;
        int count = 0;
        pb bl = fld, v;
        while ((rc = pb_next(&bl, &f, &w, &v)) == 1) {
          if (f != 1 || w != 2) continue;
          if (count++ == 0) first = v.p, first_len = (size_t)(v.end - v.p);
        }
        if (rc < 0) return -1;
        if (count != 1) {
          *why = count == 0 ? "the feature has no value" : "the feature has several values (one document per record expected)";
          return -1;
        }
        *out = first;
        *out_len = first_len;
        return 1;
      }
      if (rc < 0) return -1;
      if (!lists) {
        *why = "the feature is empty";
        return -1;
      }
    }
    if (rc < 0) return -1;
  }
  return rc < 0 ? -1 : 0;
}

/* Reads the record at byte `off` of the open file into r->text (its data, without the
** framing) and its length into *data_len. 1: read; -1: an error naming the file and the
** offset. With probe, a record that does not check out returns 0 instead (alignment). */
static int tfrecord_read(tt_doc_reader *r, int64_t off, uint64_t *data_len, int probe) {
  const char *path = r->files->paths[r->file];
  int64_t size = r->files->sizes[r->file];
  uint8_t h[12], tail[4];
  if (off + 12 > size) {
    if (probe) return 0;
    return tt_set_error("%s: TFRecord truncated at byte %lld (a partial record header)", path, (long long)off);
  }
  if (fseeko(r->f, (off_t)off, SEEK_SET) != 0) return tt_set_error("%s: cannot seek to byte %lld", path, (long long)off);
  if (fread(h, 1, 12, r->f) != 12) return read_failed(path);
  uint64_t n = le64(h);
  if (masked_crc(h, 8) != le32(h + 8)) {
    if (probe) return 0;
    return tt_set_error("%s: corrupt TFRecord at byte %lld (length checksum mismatch)", path, (long long)off);
  }
  if (off + 16 > size || n > (uint64_t)(size - off - 16)) {
    if (probe) return 0;
    return tt_set_error("%s: TFRecord truncated at byte %lld (record of %llu bytes past the end)", path,
                        (long long)off, (unsigned long long)n);
  }
  r->text.len = 0;
  TT_TRY(tt_buf_reserve(&r->text, (size_t)n));
  if (fread(r->text.data, 1, (size_t)n, r->f) != (size_t)n || fread(tail, 1, 4, r->f) != 4) return read_failed(path);
  r->text.len = (size_t)n;
  if (masked_crc(r->text.data, (size_t)n) != le32(tail)) {
    if (probe) return 0;
    return tt_set_error("%s: corrupt TFRecord at byte %lld (data checksum mismatch)", path, (long long)off);
  }
  *data_len = n;
  return 1;
}

/* Moves r->off to the first record starting at or after it: TFRecord has no markers, so
** the first offset whose length and data checksums both hold (a false match needs a
** valid record embedded in another's bytes). Every stream of a source applies the same
** rule, so the streams' records neither overlap nor miss. */
static int tfrecord_align(tt_doc_reader *r) {
  enum { WINDOW = 64 * 1024 };
  int64_t size = r->files->sizes[r->file];
  uint8_t *buf = malloc(WINDOW + 12);
  if (!buf) return tt_set_error("out of host memory");
  for (int64_t base = r->off; base + 16 <= size; base += WINDOW) {
    size_t want = (size_t)(size - base < WINDOW + 12 ? size - base : WINDOW + 12);
    if (fseeko(r->f, (off_t)base, SEEK_SET) != 0 || fread(buf, 1, want, r->f) != want) {
      free(buf);
      return read_failed(r->files->paths[r->file]);
    }
    for (size_t i = 0; i < WINDOW && i + 12 <= want; i++) {
      if (masked_crc(buf + i, 8) != le32(buf + i + 8)) continue;
      uint64_t n;
      int rc = tfrecord_read(r, base + (int64_t)i, &n, 1);
      if (rc < 0) {
        free(buf);
        return -1;
      }
      if (rc == 1) {
        free(buf);
        r->off = base + (int64_t)i;
        return 0;
      }
    }
  }
  free(buf);
  r->off = size;   /* no record starts in the rest of this file */
  return 0;
}

static int tfrecord_next(tt_doc_reader *r, const char **text, size_t *len, int *end_doc) {
  const tt_doc_files *fs = r->files;
  for (;;) {
    if (r->file >= fs->n || fs->starts[r->file] + r->off >= r->end) return 0;
    if (r->off >= fs->sizes[r->file]) { next_file(r); continue; }
    TT_TRY(ensure_open(r));
    if (r->need_align) {
      r->need_align = 0;
      TT_TRY(tfrecord_align(r));
      continue;
    }
    const char *path = fs->paths[r->file];
    int64_t at = r->off;
    uint64_t n;
    if (tfrecord_read(r, at, &n, 0) < 0) return -1;
    r->off = at + 16 + (int64_t)n;
    const uint8_t *value;
    const char *why;
    int rc = example_text((const uint8_t *)r->text.data, (size_t)n, r->field, &value, len, &why);
    if (rc < 0)
      return tt_set_error("%s: the record at byte %lld: %s (feature \"%s\")", path, (long long)at, why, r->field);
    if (rc == 0)
      return tt_set_error("%s: the record at byte %lld has no bytes feature \"%s\" (set data.text_field)",
                          path, (long long)at, r->field);
    *text = (const char *)value;
    *end_doc = 1;
    return 1;
  }
}

int tt_doc_reader_next(tt_doc_reader *r, const char **text, size_t *len, int *end_doc) {
  const tt_doc_files *fs = r->files;
  if (fs->type == TT_DATA_TFRECORD) return tfrecord_next(r, text, len, end_doc);
  for (;;) {
    if (r->file >= fs->n || fs->starts[r->file] + r->off >= r->end) return 0;
    if (r->off >= fs->sizes[r->file]) { next_file(r); continue; }
    TT_TRY(ensure_open(r));
    if (r->need_align) {
      /* Start on a line boundary: the line running across `start` is the previous
      ** range's. */
      r->need_align = 0;
      if (fseeko(r->f, (off_t)(r->off - 1), SEEK_SET) != 0) return tt_set_error("%s: seek failed", fs->paths[r->file]);
      int c = fgetc(r->f);
      if (c != '\n') {
        ssize_t n = getline(&r->line, &r->line_cap, r->f);
        if (n <= 0) { next_file(r); continue; }
        r->off += n;
      }
      continue;
    }
    const char *path = fs->paths[r->file];
    if (fs->type == TT_DATA_JSONL) {
      int64_t line_start = r->off;
      ssize_t n = getline(&r->line, &r->line_cap, r->f);
      if (n <= 0) {
        if (ferror(r->f)) return read_failed(path);
        next_file(r);   /* the file shrank: its end came early */
        continue;
      }
      r->off += n;
      size_t l = (size_t)n;
      while (l > 0 && (r->line[l - 1] == '\n' || r->line[l - 1] == '\r' || r->line[l - 1] == ' ' ||
                       r->line[l - 1] == '\t'))
        l--;
      size_t s = 0;
      while (s < l && (r->line[s] == ' ' || r->line[s] == '\t')) s++;
      if (s == l) continue;
      int bad = tt_json_parse(&r->doc, r->line + s, l - s) != 0;
      if (!bad && r->doc.nodes[0].type != TT_JSON_OBJECT) bad = tt_set_error("not a JSON object");
      char at[4200];
      if (bad) {
        r->bad_lines++;
        where(r, line_start, at, sizeof at);
        fprintf(stderr, "tetra data: warning: %s: malformed JSON line skipped (%s)\n", at,
                tt_last_error());
        if (r->bad_lines > r->max_bad)
          return tt_set_error("%s: more than %lld malformed JSON lines (data.max_bad_lines)", at,
                              (long long)r->max_bad);
        continue;
      }
      int32_t v = tt_json_get(&r->doc, 0, r->field);
      if (v < 0 || r->doc.nodes[v].type != TT_JSON_STRING)
        return tt_set_error("%s: no string field \"%s\" (set data.text_field)",
                            where(r, line_start, at, sizeof at), r->field);
      TT_TRY(tt_json_string(&r->doc, v, &r->text));
      *text = r->text.data;
      *len = r->text.len;
      *end_doc = 1;
      return 1;
    }
    /* Text: gather lines up to a chunk, cutting only where the pattern cannot join. */
    r->text.len = 0;
    for (;;) {
      if (fs->starts[r->file] + r->off >= r->end || r->off >= fs->sizes[r->file]) break;
      int64_t line_start = r->off;
      ssize_t n = getline(&r->line, &r->line_cap, r->f);
      if (n <= 0) {
        if (ferror(r->f)) return read_failed(path);
        r->off = fs->sizes[r->file];
        break;
      }
      size_t tl = r->text.len;
      if (tl >= TEXT_CHUNK && tl >= 2 && r->text.data[tl - 1] == '\n' &&
          is_plain_ascii((unsigned char)r->text.data[tl - 2]) && is_plain_ascii((unsigned char)r->line[0])) {
        if (fseeko(r->f, (off_t)line_start, SEEK_SET) != 0) return tt_set_error("%s: seek failed", path);
        break;
      }
      TT_TRY(tt_buf_append(&r->text, r->line, (size_t)n));
      r->off += n;
    }
    *end_doc = fs->starts[r->file] + r->off >= r->end || r->off >= fs->sizes[r->file];
    if (r->text.len == 0) continue;
    *text = r->text.data;
    *len = r->text.len;
    return 1;
  }
}
