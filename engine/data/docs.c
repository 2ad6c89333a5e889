/*
** docs.c — data source files: glob expansion and the document reader that streams use.
** A stream owns a byte range of a source; the lines that start inside it are its
** documents, so any number of streams share any number of files without overlap.
*/
#include "bpe_internal.h"
#include <errno.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TEXT_CHUNK = 64 * 1024 };

static int has_ext(const char *p, const char *ext) {
  size_t a = strlen(p), b = strlen(ext);
  return a >= b && strcmp(p + a - b, ext) == 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
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
static int sniff_text(const char *path) {
  enum { SAMPLE = 64 * 1024 };
  uint8_t *buf = malloc(SAMPLE);
  if (!buf) return tt_set_error("out of host memory");
  FILE *f = fopen(path, "rb");
  if (!f) {
    free(buf);
    return tt_set_error("%s: %s", path, strerror(errno));
  }
  size_t n = fread(buf, 1, SAMPLE, f);
  fclose(f);
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
  char *save = NULL;
  for (char *pat = strtok_r(copy, ",\n", &save); pat; pat = strtok_r(NULL, ",\n", &save)) {
    while (*pat == ' ') pat++;
    size_t l = strlen(pat);
    while (l > 0 && pat[l - 1] == ' ') pat[--l] = '\0';
    if (l == 0) continue;
    glob_t g;
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
    for (size_t i = 0; i < g.gl_pathc; i++) {
      if (out->n == cap) {
        cap = cap ? cap * 2 : 16;
        char **p = realloc(out->paths, (size_t)cap * sizeof *p);
        if (!p) { globfree(&g); tt_set_error("out of host memory"); goto done; }
        out->paths = p;
      }
      out->paths[out->n] = strdup(g.gl_pathv[i]);
      if (!out->paths[out->n]) { globfree(&g); tt_set_error("out of host memory"); goto done; }
      out->n++;
    }
    globfree(&g);
  }
  if (out->n == 0) {
    tt_set_error("data source: no paths given");
    goto done;
  }
  qsort(out->paths, (size_t)out->n, sizeof *out->paths, cmp_str);
  int m = 1;
  for (int i = 1; i < out->n; i++) {
    if (strcmp(out->paths[i], out->paths[m - 1]) == 0) free(out->paths[i]);
    else out->paths[m++] = out->paths[i];
  }
  out->n = m;
  if (type < 0) {
    const char *p0 = out->paths[0];
    type = has_ext(p0, ".jsonl") || has_ext(p0, ".json") || has_ext(p0, ".ndjson") ? TT_DATA_JSONL
           : has_ext(p0, ".tok") ? TT_DATA_TOKENS : TT_DATA_TEXT;
  }
  out->type = type;
  out->sizes = malloc((size_t)out->n * sizeof *out->sizes);
  out->starts = malloc((size_t)out->n * sizeof *out->starts);
  if (!out->sizes || !out->starts) { tt_set_error("out of host memory"); goto done; }
  for (int i = 0; i < out->n; i++) {
    const char *p = out->paths[i];
    if (type == TT_DATA_TOKENS) {
      if (shard_tokens(p, &out->sizes[i]) != 0) goto done;
    } else {
      struct stat st;
      if (stat(p, &st) != 0) { tt_set_error("%s: %s", p, strerror(errno)); goto done; }
      if (!S_ISREG(st.st_mode)) { tt_set_error("%s: not a regular file", p); goto done; }
      if (access(p, R_OK) != 0) { tt_set_error("%s: not readable: %s", p, strerror(errno)); goto done; }
      out->sizes[i] = (int64_t)st.st_size;
    }
    if (out->sizes[i] == 0) { tt_set_error("%s: empty file", p); goto done; }
    if (type != TT_DATA_TOKENS && sniff_text(p) != 0) goto done;
    out->starts[i] = out->total;
    out->total += out->sizes[i];
  }
  rc = 0;
done:
  free(copy);
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
  r->f = fopen(p, "rb");
  if (!r->f) return tt_set_error("%s: cannot open (removed during the run?): %s", p, strerror(errno));
  if (fseeko(r->f, (off_t)r->off, SEEK_SET) != 0) {
    fclose(r->f);
    r->f = NULL;
    return tt_set_error("%s: cannot seek to byte %lld", p, (long long)r->off);
  }
  r->open_file = r->file;
  return 0;
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

int tt_doc_reader_next(tt_doc_reader *r, const char **text, size_t *len, int *end_doc) {
  const tt_doc_files *fs = r->files;
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
        if (ferror(r->f)) return tt_set_error("%s: read error", path);
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
      if (bad) {
        r->bad_lines++;
        int64_t ln = line_number(r, line_start);
        fprintf(stderr, "tetra data: warning: %s:%lld: malformed JSON line skipped (%s)\n", path,
                (long long)ln, tt_last_error());
        if (r->bad_lines > r->max_bad)
          return tt_set_error("%s:%lld: more than %lld malformed JSON lines (data.max_bad_lines)",
                              path, (long long)ln, (long long)r->max_bad);
        continue;
      }
      int32_t v = tt_json_get(&r->doc, 0, r->field);
      if (v < 0 || r->doc.nodes[v].type != TT_JSON_STRING)
        return tt_set_error("%s:%lld: no string field \"%s\" (set data.text_field)", path,
                            (long long)line_number(r, line_start), r->field);
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
        if (ferror(r->f)) return tt_set_error("%s: read error", path);
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
