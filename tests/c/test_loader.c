/*
** test_loader.c — the streaming loader against references computed in the test:
** packing equals "tokenize each document, EOS after it, cut every seq_len tokens"
** (for JSONL, and for shards written by tt_data_prepare); global batches are identical
** for DP = 1, 2, 4, 8; a restored state continues exactly (also on another DP size);
** blending follows the weights; bad inputs give the documented warnings and errors.
*/
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data/bpe_internal.h"

static char dir[64];
static char tok_path[128];

static void write_text(const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  cr_assert(f != NULL);
  fputs(text, f);
  fclose(f);
}

/* Corpus: two JSONL files of letters-only documents, one of digit documents, one text
** file; a tokenizer trained on them. */
static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/tt_loader_XXXXXX");
  cr_assert(mkdtemp(dir) != NULL);
  static const char *words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
  tt_buf a1 = {0}, a2 = {0}, d = {0}, t = {0};
  uint64_t s = 1;
  for (int i = 0; i < 60; i++) {
    tt_buf *b = i % 2 ? &a2 : &a1;
    tt_buf_printf(b, "{\"id\": %d, \"text\": \"", i);
    int n = 3 + i % 11;
    for (int k = 0; k < n; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      tt_buf_printf(b, "%s%s", k ? " " : "", words[(s >> 33) % 8]);
    }
    tt_buf_printf(b, "\"}\n");
    tt_buf_printf(&d, "{\"text\": \"%d %d %d\"}\n", i * 7, i * 13 + 1, i * 101);
    tt_buf_printf(&t, "Line %d of the text file, with words %s.\n", i, words[i % 8]);
  }
  write_text("a1.jsonl", a1.data);
  write_text("a2.jsonl", a2.data);
  write_text("digits.jsonl", d.data);
  write_text("plain.txt", t.data);
  char p1[128], p2[128], p3[128], p4[128], out[128];
  snprintf(p1, sizeof p1, "%s/a1.jsonl", dir);
  snprintf(p2, sizeof p2, "%s/a2.jsonl", dir);
  snprintf(p3, sizeof p3, "%s/digits.jsonl", dir);
  snprintf(p4, sizeof p4, "%s/plain.txt", dir);
  snprintf(out, sizeof out, "%s/tok", dir);
  const char *files[] = {p1, p2, p3, p4};
  cr_assert(tt_bpe_train(files, 4, 320, out, NULL, 1, 0) == 0, "%s", tt_last_error());
  snprintf(tok_path, sizeof tok_path, "%s/tok/tokenizer.json", dir);
  tt_buf_free(&a1);
  tt_buf_free(&a2);
  tt_buf_free(&d);
  tt_buf_free(&t);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert(system(cmd) == 0);
}

TestSuite(loader, .init = setup, .fini = teardown);

static tt_data_config base_config(tt_data_source *src, int n_src) {
  tt_data_config c;
  memset(&c, 0, sizeof c);
  c.sources = src;
  c.n_sources = n_src;
  c.tokenizer = tok_path;
  c.seq_len = 16;
  c.global_batch = 2;
  c.dp_size = 1;
  c.num_streams = 1;
  c.seed = 1234;
  c.num_workers = 2;
  c.max_bad_lines = -1;
  c.eos_id = -1;
  return c;
}

/* Token stream of the documents of `pattern` in file order, EOS after each, `reps` times. */
static tt_ids reference_stream(const char *pattern, int reps) {
  tt_bpe *bpe;
  cr_assert(tt_bpe_load(tok_path, &bpe) == 0);
  int32_t eos = tt_bpe_eos_id(bpe);
  tt_ids one = {0}, all = {0};
  glob_t g;
  cr_assert(glob(pattern, 0, NULL, &g) == 0);
  tt_json doc = {0};
  tt_buf str = {0};
  for (size_t f = 0; f < g.gl_pathc; f++) {
    char *text;
    size_t len;
    cr_assert(tt_read_file(g.gl_pathv[f], &text, &len) == 0);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
      cr_assert(tt_json_parse(&doc, line, strlen(line)) == 0);
      cr_assert(tt_json_string(&doc, tt_json_get(&doc, 0, "text"), &str) == 0);
      cr_assert(tt_bpe_encode_append(bpe, bpe->cache, str.data, str.len, 0, &one) == 0);
      cr_assert(tt_ids_reserve(&one, 1) == 0);
      one.data[one.len++] = eos;
    }
    free(text);
  }
  globfree(&g);
  for (int r = 0; r < reps; r++) {
    cr_assert(tt_ids_reserve(&all, one.len) == 0);
    memcpy(all.data + all.len, one.data, one.len * sizeof(int32_t));
    all.len += one.len;
  }
  tt_ids_free(&one);
  tt_json_free(&doc);
  tt_buf_free(&str);
  tt_bpe_free(bpe);
  return all;
}

static void check_packing(tt_data_loader *ld, const tt_ids *ref, int64_t T, int batches) {
  int64_t L = tt_data_loader_local_batch(ld);
  int64_t *x = malloc((size_t)(L * T) * sizeof *x), *y = malloc((size_t)(L * T) * sizeof *y);
  for (int b = 0; b < batches; b++) {
    cr_assert(tt_data_loader_next(ld, x, y) == 0, "%s", tt_last_error());
    for (int64_t r = 0; r < L; r++) {
      int64_t start = (b * L + r) * T;
      cr_assert((size_t)(start + T + 1) <= ref->len);
      for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(x[r * T + t], ref->data[start + t], "batch %d row %lld pos %lld", b, (long long)r, (long long)t);
        cr_assert_eq(y[r * T + t], ref->data[start + t + 1]);
      }
    }
  }
  free(x);
  free(y);
}

Test(loader, packing_matches_reference_across_epochs) {
  char pat[128];
  snprintf(pat, sizeof pat, "%s/a*.jsonl", dir);
  tt_ids ref = reference_stream(pat, 4);
  tt_data_source src = {pat, 1.0, -1, NULL};
  tt_data_config c = base_config(&src, 1);
  tt_data_loader *ld;
  cr_assert(tt_data_loader_new(&c, &ld) == 0, "%s", tt_last_error());
  /* Far enough to wrap around the data at least twice. */
  int batches = (int)(ref.len * 3 / 4 / (2 * 16));
  check_packing(ld, &ref, 16, batches);
  tt_data_stats st;
  cr_assert(tt_data_loader_stats(ld, &st) == 0);
  cr_assert_geq(st.epochs, 2);
  cr_assert_eq(st.batches, batches);
  tt_data_loader_free(ld);
  tt_ids_free(&ref);
}

Test(loader, prepared_shards_match_reference) {
  char pat[128], out[128], shards[160];
  snprintf(pat, sizeof pat, "%s/a*.jsonl", dir);
  snprintf(out, sizeof out, "%s/shards", dir);
  const char *files[] = {pat};
  /* Small shards so that sequences cross shard boundaries. */
  cr_assert(tt_data_prepare(files, 1, tok_path, NULL, out, 100, 2, 0) == 0, "%s", tt_last_error());
  tt_ids ref = reference_stream(pat, 1);
  snprintf(shards, sizeof shards, "%s/*.tok", out);
  tt_data_source src = {shards, 1.0, -1, NULL};
  tt_data_config c = base_config(&src, 1);
  c.tokenizer = NULL;
  tt_data_loader *ld;
  cr_assert(tt_data_loader_new(&c, &ld) == 0, "%s", tt_last_error());
  check_packing(ld, &ref, 16, (int)(ref.len / 32) - 1);
  tt_data_loader_free(ld);
  tt_ids_free(&ref);
}

/* -- Determinism: DP layouts and resume --------------------------------------------- */

static tt_data_source blend_src[2];
static char blend_a[256], blend_b[128];

static tt_data_config blend_config(void) {
  snprintf(blend_a, sizeof blend_a, "%s/a*.jsonl,%s/digits.jsonl", dir, dir);
  snprintf(blend_b, sizeof blend_b, "%s/plain.txt", dir);
  blend_src[0] = (tt_data_source){blend_a, 3.0, -1, NULL};
  blend_src[1] = (tt_data_source){blend_b, 1.0, -1, NULL};
  tt_data_config c = base_config(blend_src, 2);
  c.seq_len = 8;
  c.global_batch = 8;
  c.num_streams = 4;
  c.shuffle_buffer = 5;
  return c;
}

/* Runs `n` global batches with the given DP size (all ranks in this process) and
** returns them as (n, B, T) inputs. */
static int64_t *run_global(tt_data_config c, int dp, int n, const uint8_t *state, size_t state_len) {
  int64_t B = c.global_batch, T = c.seq_len, L = B / dp;
  int64_t *out = malloc((size_t)(n * B * T) * sizeof *out);
  int64_t *x = malloc((size_t)(L * T) * sizeof *x), *y = malloc((size_t)(L * T) * sizeof *y);
  tt_data_loader *ld[8];
  c.dp_size = dp;
  for (int r = 0; r < dp; r++) {
    c.dp_rank = r;
    cr_assert(tt_data_loader_new(&c, &ld[r]) == 0, "%s", tt_last_error());
    if (state) cr_assert(tt_data_loader_load_state(ld[r], state, state_len) == 0, "%s", tt_last_error());
  }
  for (int b = 0; b < n; b++)
    for (int r = 0; r < dp; r++) {
      cr_assert(tt_data_loader_next(ld[r], x, y) == 0, "%s", tt_last_error());
      memcpy(out + (b * B + r * L) * T, x, (size_t)(L * T) * sizeof *x);
    }
  for (int r = 0; r < dp; r++) tt_data_loader_free(ld[r]);
  free(x);
  free(y);
  return out;
}

Test(loader, global_batches_do_not_depend_on_dp_size) {
  tt_data_config c = blend_config();
  int n = 12;
  int64_t *ref = run_global(c, 1, n, NULL, 0);
  size_t bytes = (size_t)(n * c.global_batch * c.seq_len) * sizeof(int64_t);
  static const int dps[] = {2, 4, 8};
  for (int i = 0; i < 3; i++) {
    int64_t *got = run_global(c, dps[i], n, NULL, 0);
    cr_assert(memcmp(ref, got, bytes) == 0, "dp=%d differs from dp=1", dps[i]);
    free(got);
  }
  /* Another seed gives another order. */
  c.seed = 99;
  int64_t *other = run_global(c, 1, n, NULL, 0);
  cr_assert(memcmp(ref, other, bytes) != 0);
  free(other);
  free(ref);
}

Test(loader, restored_state_continues_exactly) {
  tt_data_config c = blend_config();
  int n1 = 5, n2 = 9;
  int64_t B = c.global_batch, T = c.seq_len;
  int64_t *full = run_global(c, 1, n1 + n2, NULL, 0);
  /* Interrupted run: n1 batches, state (workers are ahead: queued sequences are part of
  ** it), then a fresh loader. */
  tt_data_loader *ld;
  cr_assert(tt_data_loader_new(&c, &ld) == 0);
  int64_t *x = malloc((size_t)(B * T) * sizeof *x), *y = malloc((size_t)(B * T) * sizeof *y);
  for (int b = 0; b < n1; b++) cr_assert(tt_data_loader_next(ld, x, y) == 0);
  usleep(20000);
  const uint8_t *st;
  size_t len;
  cr_assert(tt_data_loader_state(ld, &st, &len) == 0, "%s", tt_last_error());
  uint8_t *saved = malloc(len);
  memcpy(saved, st, len);
  /* The state call must not disturb the running loader either. */
  for (int b = 0; b < n2; b++) {
    cr_assert(tt_data_loader_next(ld, x, y) == 0);
    cr_assert(memcmp(x, full + (n1 + b) * B * T, (size_t)(B * T) * sizeof *x) == 0, "live batch %d", n1 + b);
  }
  tt_data_loader_free(ld);
  int64_t *rest = run_global(c, 1, n2, saved, len);
  cr_assert(memcmp(rest, full + n1 * B * T, (size_t)(n2 * B * T) * sizeof *rest) == 0,
            "batches after restore differ from the uninterrupted run");
  free(rest);
  /* Resume on another DP size: the states of the two dp=2 ranks, concatenated. */
  tt_data_config c2 = c;
  c2.dp_size = 2;
  tt_buf both = {0};
  int64_t L = B / 2;
  for (int r = 0; r < 2; r++) {
    c2.dp_rank = r;
    cr_assert(tt_data_loader_new(&c2, &ld) == 0);
    for (int b = 0; b < n1; b++) cr_assert(tt_data_loader_next(ld, x, y) == 0);
    cr_assert(tt_data_loader_state(ld, &st, &len) == 0);
    cr_assert(tt_buf_append(&both, st, len) == 0);
    tt_data_loader_free(ld);
  }
  (void)L;
  int64_t *rest1 = run_global(c, 1, n2, (const uint8_t *)both.data, both.len);
  cr_assert(memcmp(rest1, full + n1 * B * T, (size_t)(n2 * B * T) * sizeof *rest1) == 0,
            "dp=2 state resumed on dp=1 differs");
  int64_t *rest4 = run_global(c, 4, n2, (const uint8_t *)both.data, both.len);
  cr_assert(memcmp(rest4, full + n1 * B * T, (size_t)(n2 * B * T) * sizeof *rest4) == 0,
            "dp=2 state resumed on dp=4 differs");
  free(rest1);
  free(rest4);
  tt_buf_free(&both);
  free(saved);
  free(x);
  free(y);
  free(full);
}

Test(loader, blending_follows_weights) {
  char a[128], d[128];
  snprintf(a, sizeof a, "%s/a*.jsonl", dir);
  snprintf(d, sizeof d, "%s/digits.jsonl", dir);
  tt_data_source src[2] = {{a, 3.0, -1, NULL}, {d, 1.0, -1, NULL}};
  tt_data_config c = base_config(src, 2);
  c.seq_len = 4;
  c.global_batch = 4;
  c.num_streams = 2;
  tt_data_loader *ld;
  cr_assert(tt_data_loader_new(&c, &ld) == 0, "%s", tt_last_error());
  tt_bpe *bpe;
  cr_assert(tt_bpe_load(tok_path, &bpe) == 0);
  int64_t x[16], y[16];
  int from_a = 0, total = 0;
  for (int b = 0; b < 150; b++) {
    cr_assert(tt_data_loader_next(ld, x, y) == 0, "%s", tt_last_error());
    for (int r = 0; r < 4; r++) {
      int32_t ids[4];
      char text[256];
      size_t n;
      int k = 0;
      for (int t = 0; t < 4; t++)
        if (x[r * 4 + t] != tt_bpe_eos_id(bpe)) ids[k++] = (int32_t)x[r * 4 + t];
      cr_assert(tt_bpe_decode(bpe, ids, (size_t)k, text, sizeof text, &n) == 0);
      int digits = 0, letters = 0;
      for (size_t i = 0; i < n; i++) {
        digits += text[i] >= '0' && text[i] <= '9';
        letters += text[i] >= 'a' && text[i] <= 'z';
      }
      if (digits + letters == 0) continue;
      cr_assert(digits == 0 || letters == 0, "a sequence mixes sources: '%.*s'", (int)n, text);
      from_a += letters > 0;
      total++;
    }
  }
  double frac = (double)from_a / total;
  cr_assert(frac > 0.68 && frac < 0.82, "fraction from the weight-3 source: %.3f", frac);
  tt_bpe_free(bpe);
  tt_data_loader_free(ld);
}

/* -- Bad input ---------------------------------------------------------------------- */

Test(loader, malformed_lines_are_skipped_counted_and_limited) {
  write_text("bad.jsonl", "{\"text\": \"one two three\"}\n{\"text\": broken}\n\n{\"text\": \"four five\"}\n"
                          "[1, 2]\n{\"text\": \"six seven eight nine\"}\n");
  char p[128];
  snprintf(p, sizeof p, "%s/bad.jsonl", dir);
  tt_data_source src = {p, 1.0, -1, NULL};
  tt_data_config c = base_config(&src, 1);
  c.seq_len = 4;
  c.global_batch = 1;
  tt_data_loader *ld;
  cr_assert(tt_data_loader_new(&c, &ld) == 0, "%s", tt_last_error());
  int64_t x[4], y[4];
  for (int b = 0; b < 6; b++) cr_assert(tt_data_loader_next(ld, x, y) == 0, "%s", tt_last_error());
  tt_data_stats st;
  tt_data_loader_stats(ld, &st);
  cr_assert_geq(st.bad_lines, 2);
  tt_data_loader_free(ld);
  /* Past the limit: an error naming file and line. */
  c.max_bad_lines = 1;
  cr_assert(tt_data_loader_new(&c, &ld) == 0);
  int rc = 0;
  for (int b = 0; b < 6 && rc == 0; b++) rc = tt_data_loader_next(ld, x, y);
  cr_assert(rc != 0);
  char want[160];
  snprintf(want, sizeof want, "%s:5:", p);
  cr_assert(strstr(tt_last_error(), want) != NULL, "%s", tt_last_error());
  tt_data_loader_free(ld);
}

Test(loader, bad_sources_give_clear_errors) {
  char p[128];
  tt_data_loader *ld = NULL;
  tt_data_source src = {p, 1.0, -1, NULL};
  tt_data_config c = base_config(&src, 1);
  int64_t x[32], y[32];
  /* Missing text field (the error comes from the worker, through next). */
  write_text("nofield.jsonl", "{\"content\": \"hello\"}\n");
  snprintf(p, sizeof p, "%s/nofield.jsonl", dir);
  cr_assert(tt_data_loader_new(&c, &ld) == 0);
  cr_assert(tt_data_loader_next(ld, x, y) != 0);
  cr_assert(strstr(tt_last_error(), p) && strstr(tt_last_error(), "\"text\""), "%s", tt_last_error());
  tt_data_loader_free(ld);
  /* A configured field works on the same file. */
  src.text_field = "content";
  c.seq_len = 2;
  c.global_batch = 1;
  cr_assert(tt_data_loader_new(&c, &ld) == 0);
  cr_assert(tt_data_loader_next(ld, x, y) == 0, "%s", tt_last_error());
  tt_data_loader_free(ld);
  src.text_field = NULL;
  /* A glob that matches nothing. */
  snprintf(p, sizeof p, "%s/nothing-*.jsonl", dir);
  cr_assert(tt_data_loader_new(&c, &ld) != 0);
  cr_assert(strstr(tt_last_error(), "matches no file") && strstr(tt_last_error(), p), "%s", tt_last_error());
  /* An empty file. */
  write_text("empty.jsonl", "");
  snprintf(p, sizeof p, "%s/empty.jsonl", dir);
  cr_assert(tt_data_loader_new(&c, &ld) != 0);
  cr_assert(strstr(tt_last_error(), "empty file") && strstr(tt_last_error(), p), "%s", tt_last_error());
  /* An unreadable tokenizer. */
  snprintf(p, sizeof p, "%s/a1.jsonl", dir);
  c.tokenizer = "/nonexistent/tok.json";
  cr_assert(tt_data_loader_new(&c, &ld) != 0);
  cr_assert(strstr(tt_last_error(), "/nonexistent/tok.json"), "%s", tt_last_error());
  c.tokenizer = tok_path;
  /* A layout that cannot be dealt. */
  c.global_batch = 6;
  c.num_streams = 4;
  cr_assert(tt_data_loader_new(&c, &ld) != 0);
  cr_assert(strstr(tt_last_error(), "num_streams"), "%s", tt_last_error());
  /* A file that vanishes mid-run: an error naming it, no crash, no hang. The first file
  ** holds many sequences and the queue one, so the worker cannot have opened the second
  ** before it is removed; the batches before it come from the first file. */
  char g1[128], g2[128], line[64];
  snprintf(g1, sizeof g1, "%s/gone1.jsonl", dir);
  snprintf(g2, sizeof g2, "%s/gone2.jsonl", dir);
  FILE *f = fopen(g1, "wb");
  cr_assert(f != NULL);
  for (int i = 0; i < 2000; i++) {
    snprintf(line, sizeof line, "{\"text\": \"first file, line %d\"}\n", i);
    fputs(line, f);
  }
  fclose(f);
  write_text("gone2.jsonl", "{\"text\": \"second file\"}\n");
  snprintf(p, sizeof p, "%s/gone*.jsonl", dir);
  c.global_batch = 1;
  c.num_streams = 1;
  c.seq_len = 16;
  c.queue_depth = 1;
  cr_assert(tt_data_loader_new(&c, &ld) == 0);
  cr_assert(unlink(g2) == 0);
  int rc = 0, batches = 0;
  while (batches < 100000 && (rc = tt_data_loader_next(ld, x, y)) == 0) batches++;
  cr_assert(rc != 0, "the loader never reported the removed file");
  cr_assert(batches > 0, "the first file gave no batch: %s", tt_last_error());
  cr_assert(strstr(tt_last_error(), g2), "%s", tt_last_error());
  tt_data_loader_free(ld);
}

/* A held-out evaluation split: range [0, f) of a source gives only the documents that
** start there, [f, 1) only the others (here the boundary is the second file's start). */
Test(loader, ranges_split_a_source_without_overlap) {
  char pattern[160], a1[160], digits[160];
  snprintf(pattern, sizeof pattern, "%s/a1.jsonl,%s/digits.jsonl", dir, dir);
  snprintf(a1, sizeof a1, "%s/a1.jsonl", dir);
  snprintf(digits, sizeof digits, "%s/digits.jsonl", dir);
  struct stat st1, st2;
  cr_assert(stat(a1, &st1) == 0 && stat(digits, &st2) == 0);
  double cut = (double)st1.st_size / (double)(st1.st_size + st2.st_size);
  tt_data_source src = {pattern, 1.0, -1, NULL};
  for (int half = 0; half < 2; half++) {
    tt_data_config c = base_config(&src, 1);
    c.range_lo = half ? cut : 0;
    c.range_hi = half ? 1 : cut;
    tt_data_loader *ld;
    cr_assert(tt_data_loader_new(&c, &ld) == 0, "%s", tt_last_error());
    tt_ids ref = reference_stream(half ? digits : a1, 4);
    check_packing(ld, &ref, c.seq_len, 12);
    tt_ids_free(&ref);
    tt_data_loader_free(ld);
  }
}
