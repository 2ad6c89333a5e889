/*
** test_bpe.c — the byte-level BPE tokenizer: pre-tokenizer splits (expected values from
** Python's `regex` with the GPT-2 pattern), UTF-8 repair (as Python's
** bytes.decode('utf-8', 'replace')), encoding against a naive reference BPE on random
** words (short words take the scan path, long ones the heap path), special tokens,
** decoding, the tiktoken loader, training, the byte tokenizer, and clear errors for bad
** files.
** Parity with tokenizers / tiktoken themselves is in tests/data/parity.py.
*/
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data/bpe_internal.h"

static void write_text(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert(f != NULL, "cannot write %s", path);
  cr_assert(fwrite(text, 1, len, f) == len);
  fclose(f);
}

static char *temp_dir(void) {
  char *d = strdup("/tmp/tt_bpe_XXXXXX");
  cr_assert(mkdtemp(d) != NULL);
  return d;
}

/* -- Pre-tokenizer ------------------------------------------------------------------ */

static void check_split(const char *text, const char *const *want, int n_want) {
  const uint8_t *s = (const uint8_t *)text;
  size_t len = strlen(text), pos = 0;
  int k = 0;
  while (pos < len) {
    size_t end = tt_pretok_next(s, len, pos);
    cr_assert(k < n_want, "'%s': more pieces than expected", text);
    cr_assert(end - pos == strlen(want[k]) && memcmp(text + pos, want[k], end - pos) == 0,
              "'%s': piece %d is '%.*s', expected '%s'", text, k, (int)(end - pos), text + pos, want[k]);
    k++;
    pos = end;
  }
  cr_assert_eq(k, n_want, "'%s': %d pieces, expected %d", text, k, n_want);
}

#define SPLIT(text, ...) do { \
    const char *w_[] = {__VA_ARGS__}; \
    check_split(text, w_, (int)(sizeof w_ / sizeof w_[0])); } while (0)

Test(bpe, pretokenizer_matches_gpt2_pattern) {
  SPLIT("Hello world", "Hello", " world");
  SPLIT("it's I'll 'd''s", "it", "'s", " I", "'ll", " '", "d", "''", "s");
  SPLIT("a  b", "a", " ", " b");
  SPLIT("x \n\ty", "x", " \n", "\t", "y");
  SPLIT("123abc 45 !!? ", "123", "abc", " 45", " !!?", " ");
  SPLIT("  \n", "  \n");
  SPLIT("日本 語\u3000x", "日本", " 語", "\u3000", "x");
  SPLIT("don't!'s", "don", "'t", "!'", "s");
}

Test(bpe, utf8_repair_matches_python_replace) {
  static const struct { const char *in; size_t n; int fffd; const char *rest; } cases[] = {
    {"\xff", 1, 1, ""}, {"\xc3(", 2, 1, "("}, {"\xe2\x82", 2, 1, ""},
    {"\xed\xa0\x80", 3, 3, ""}, {"\xc0\xaf", 2, 2, ""}, {"\xf4\x90\x80\x80", 4, 4, ""},
    {"\xf0\x9f\x98", 3, 1, ""}, {"\x80\x80", 2, 2, ""}, {"\xe0\x80\xaf", 3, 3, ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t out[64];
    size_t n = tt_utf8_sanitize((const uint8_t *)cases[i].in, cases[i].n, out);
    size_t rl = strlen(cases[i].rest);
    cr_assert_eq(n, 3 * (size_t)cases[i].fffd + rl, "case %zu: %zu bytes", i, n);
    for (int k = 0; k < cases[i].fffd; k++)
      cr_assert(memcmp(out + 3 * k, "\xef\xbf\xbd", 3) == 0, "case %zu", i);
    cr_assert(memcmp(out + 3 * cases[i].fffd, cases[i].rest, rl) == 0);
  }
  const char *ok = "a\xf0\x9f\x98\x80" "b";
  cr_assert_eq(tt_utf8_valid_prefix((const uint8_t *)ok, strlen(ok)), strlen(ok));
}

/* -- Encoding against a naive reference --------------------------------------------- */

/* A vocabulary over bytes 'a'..'d' with merges listed in rank order. */
static const char *merge_list[][2] = {
  {"a", "b"}, {"c", "d"}, {"ab", "ab"}, {"a", "a"}, {"b", "cd"}, {"abab", "cd"}, {"d", "a"},
  {"aa", "b"}, {"cd", "cd"}, {"da", "b"}, {"c", "c"}, {"abab", "abab"}, {"cc", "d"},
};
enum { N_MERGES = sizeof merge_list / sizeof merge_list[0] };

/* Reference: repeatedly merge the adjacent pair with the lowest rank (leftmost first). */
static int ref_bpe(const char *word, char parts[][64], int n) {
  for (int i = 0; i < n; i++) { parts[i][0] = word[i]; parts[i][1] = '\0'; }
  for (;;) {
    int best = -1, best_rank = N_MERGES;
    for (int i = 0; i + 1 < n; i++)
      for (int r = 0; r < best_rank; r++)
        if (!strcmp(parts[i], merge_list[r][0]) && !strcmp(parts[i + 1], merge_list[r][1])) {
          best = i;
          best_rank = r;
          break;
        }
    if (best < 0) return n;
    size_t la = strlen(parts[best]), lb = strlen(parts[best + 1]);
    memcpy(parts[best] + la, parts[best + 1], lb + 1);
    memmove(parts[best + 1], parts[best + 2], (size_t)(n - best - 2) * sizeof parts[0]);
    n--;
  }
}

static tt_bpe *toy_tokenizer(char *dir) {
  /* vocab.json: the 256 byte-level characters, then the merge results. */
  tt_buf v = {0}, m = {0};
  char tmp[16];
  cr_assert(tt_buf_append(&v, "{", 1) == 0);
  for (int b = 0; b < 256; b++) {
    uint8_t byte = (uint8_t)b;
    size_t l = tt_bytelevel_encode(&byte, 1, tmp);
    if (b) tt_buf_append(&v, ",", 1);
    tt_buf_json_string(&v, tmp, l);
    tt_buf_printf(&v, ":%d", b);
  }
  tt_buf_append(&m, "#version: 0.2\n", 14);
  for (int r = 0; r < N_MERGES; r++) {
    tt_buf_printf(&v, ",\"%s%s\":%d", merge_list[r][0], merge_list[r][1], 256 + r);
    tt_buf_printf(&m, "%s %s\n", merge_list[r][0], merge_list[r][1]);
  }
  tt_buf_printf(&v, ",\"<|endoftext|>\":%d}", 256 + N_MERGES);
  char vp[256], mp[256];
  snprintf(vp, sizeof vp, "%s/vocab.json", dir);
  snprintf(mp, sizeof mp, "%s/merges.txt", dir);
  write_text(vp, v.data, v.len);
  write_text(mp, m.data, m.len);
  tt_buf_free(&v);
  tt_buf_free(&m);
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load_vocab_merges(vp, mp, &bpe) == 0, "%s", tt_last_error());
  return bpe;
}

Test(bpe, encode_matches_reference_bpe) {
  char *dir = temp_dir();
  tt_bpe *bpe = toy_tokenizer(dir);
  static char parts[1200][64];
  char word[1200];
  int32_t ids[1200];
  uint64_t seed = 7;
  for (int trial = 0; trial < 300; trial++) {
    /* Mostly short words (scan path); every tenth is long (heap path). */
    int n = trial % 10 == 9 ? 300 + trial : 1 + trial % 23;
    for (int i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      word[i] = (char)('a' + (seed >> 33) % 4);
    }
    word[n] = '\0';
    int k = ref_bpe(word, parts, n);
    size_t got;
    cr_assert(tt_bpe_encode(bpe, word, (size_t)n, 0, ids, 1200, &got) == 0, "%s", tt_last_error());
    cr_assert_eq(got, (size_t)k, "trial %d (%d letters): %zu ids, reference %d", trial, n, got, k);
    for (int i = 0; i < k; i++) {
      int32_t want = tt_bpe_token_id(bpe, parts[i]);
      cr_assert_eq(ids[i], want, "trial %d, piece %d '%s'", trial, i, parts[i]);
    }
  }
  tt_bpe_free(bpe);
  free(dir);
}

Test(bpe, special_tokens_and_decode) {
  char *dir = temp_dir();
  tt_bpe *bpe = toy_tokenizer(dir);
  int32_t eot = tt_bpe_eos_id(bpe);
  cr_assert_eq(eot, 256 + N_MERGES);
  const char *text = "abab<|endoftext|>cd";
  int32_t ids[32];
  size_t n;
  cr_assert(tt_bpe_encode(bpe, text, strlen(text), 1, ids, 32, &n) == 0);
  cr_assert_eq(n, 3);
  cr_assert_eq(ids[0], tt_bpe_token_id(bpe, "abab"));
  cr_assert_eq(ids[1], eot);
  cr_assert_eq(ids[2], tt_bpe_token_id(bpe, "cd"));
  /* Without allow_special the marker is ordinary text. */
  cr_assert(tt_bpe_encode(bpe, text, strlen(text), 0, ids, 32, &n) == 0);
  cr_assert_gt(n, 3);
  for (size_t i = 0; i < n; i++) cr_assert_neq(ids[i], eot);
  char out[64];
  size_t m;
  cr_assert(tt_bpe_decode(bpe, ids, n, out, sizeof out, &m) == 0);
  cr_assert(m == strlen(text) && memcmp(out, text, m) == 0);
  /* A short buffer reports the full size. */
  cr_assert(tt_bpe_encode(bpe, text, strlen(text), 1, ids, 1, &n) == 0);
  cr_assert_eq(n, 3);
  int32_t bad = 99999;
  cr_assert(tt_bpe_decode(bpe, &bad, 1, out, sizeof out, &m) != 0);
  cr_assert(strstr(tt_last_error(), "99999") != NULL);
  tt_bpe_free(bpe);
  free(dir);
}

Test(bpe, tiktoken_rank_file) {
  /* Ranks: bytes a=0 b=1 c=2, "ab"=3, "abc"=4, "bc"=5. tiktoken merges by the rank of the
  ** concatenation: "abc" -> a,b,c -> (ab)(c) [rank 3] -> abc [rank 4]. */
  char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/t.tiktoken", dir);
  const char *text = "YQ== 0\nYg== 1\nYw== 2\nYWI= 3\nYWJj 4\nYmM= 5\n";
  write_text(path, text, strlen(text));
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load(path, &bpe) == 0, "%s", tt_last_error());
  int32_t ids[8];
  size_t n;
  cr_assert(tt_bpe_encode(bpe, "abc", 3, 0, ids, 8, &n) == 0);
  cr_assert(n == 1 && ids[0] == 4);
  cr_assert(tt_bpe_encode(bpe, "cbc", 3, 0, ids, 8, &n) == 0);
  cr_assert(n == 2 && ids[0] == 2 && ids[1] == 5);
  cr_assert_eq(tt_bpe_eos_id(bpe), 6);
  tt_bpe_free(bpe);
  free(dir);
}

/* The error for a bad tiktoken file names the file and line once ("f:2: ...", not
** "f: f:2: ..."). */
static void assert_tiktoken_error(const char *path, int line, const char *needle) {
  char where[300];
  snprintf(where, sizeof where, "%s:%d: ", path, line);
  const char *err = tt_last_error();
  cr_assert(strncmp(err, where, strlen(where)) == 0, "error '%s' does not start with '%s'", err,
            where);
  cr_assert(strstr(err + strlen(where), path) == NULL, "error '%s' names the file twice", err);
  cr_assert(strstr(err, needle) != NULL, "error '%s' does not contain '%s'", err, needle);
}

Test(bpe, tiktoken_line_without_a_token_is_an_error) {
  /* Fuzzer reproducer: " 1" has an empty token. Reading it resized the token buffer to 0
  ** bytes, which frees it, and the error path freed it again (abort in glibc). */
  char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/d.tiktoken", dir);
  write_text(path, "YQ== 0\n 1\n", 10);
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load(path, &bpe) != 0);
  cr_assert_null(bpe);
  assert_tiktoken_error(path, 2, "expected \"<base64 token> <rank>\"");
  unlink(path);
  rmdir(dir);
  free(dir);
}

Test(bpe, tiktoken_rank_beyond_the_file_is_refused) {
  /* Fuzzer reproducer: 15 bytes whose one rank sized the id tables (4 GB for 10^9). Real
  ** files rank their N tokens 0..N-1; a rank far beyond the file's line count is refused
  ** before anything is allocated for it. */
  char *dir = temp_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/h.tiktoken", dir);
  static const char *const huge[] = {"1000000000", "2000000000", "99999999999999999999999"};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    char text[64];
    int n = snprintf(text, sizeof text, "YQ== %s", huge[i]);
    write_text(path, text, (size_t)n);
    tt_bpe *bpe = NULL;
    cr_assert(tt_bpe_load(path, &bpe) != 0, "rank %s accepted", huge[i]);
    cr_assert_null(bpe);
    assert_tiktoken_error(path, 1, huge[i]);
  }
  /* Within bounds (rank < 16 x lines), a gap is allowed: ids 1-4 are simply unused. */
  write_text(path, "YQ== 0\nYg== 5\n", 14);
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load(path, &bpe) == 0, "%s", tt_last_error());
  cr_assert_eq(tt_bpe_vocab_size(bpe), 7);
  cr_assert_eq(tt_bpe_eos_id(bpe), 6);
  int32_t ids[4];
  size_t n;
  cr_assert(tt_bpe_encode(bpe, "ab", 2, 0, ids, 4, &n) == 0);
  cr_assert(n == 2 && ids[0] == 0 && ids[1] == 5);
  tt_bpe_free(bpe);
  unlink(path);
  rmdir(dir);
  free(dir);
}

/* -- Training ----------------------------------------------------------------------- */

Test(bpe, train_first_merge_is_most_frequent_pair_and_roundtrips) {
  char *dir = temp_dir();
  char corpus[256], out[256], tj[300];
  snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
  snprintf(out, sizeof out, "%s/vocab", dir);
  snprintf(tj, sizeof tj, "%s/tokenizer.json", out);
  tt_buf c = {0};
  for (int i = 0; i < 200; i++)
    tt_buf_printf(&c, "the cat sat on the mat %d times; zzq zzq zzq\nüber naïve 日本語 %d\n", i, i * 7);
  write_text(corpus, c.data, c.len);
  const char *files[] = {corpus};
  cr_assert(tt_bpe_train(files, 1, 400, out, NULL, 2, 0) == 0, "%s", tt_last_error());
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load(tj, &bpe) == 0, "%s", tt_last_error());
  cr_assert_eq(tt_bpe_vocab_size(bpe), 400);
  cr_assert_eq(tt_bpe_eos_id(bpe), 399);
  /* Reference count of adjacent byte pairs over pre-tokens: the most frequent pair
  ** (ties: smaller bytes) must be merge 0, i.e. id 256. */
  static int64_t counts[256][256];
  memset(counts, 0, sizeof counts);
  const uint8_t *s = (const uint8_t *)c.data;
  size_t pos = 0;
  while (pos < c.len) {
    size_t end = tt_pretok_next(s, c.len, pos);
    for (size_t i = pos; i + 1 < end; i++) counts[s[i]][s[i + 1]]++;
    pos = end;
  }
  int ba = 0, bb = 0;
  for (int a = 0; a < 256; a++)
    for (int b = 0; b < 256; b++)
      if (counts[a][b] > counts[ba][bb]) { ba = a; bb = b; }
  uint8_t pair[2] = {(uint8_t)ba, (uint8_t)bb};
  cr_assert_eq(tt_bpe_lookup(bpe, pair, 2), 256, "most frequent pair %02x %02x", ba, bb);
  /* Round trip and compression on the training text. */
  static int32_t ids[1 << 16];
  size_t n, m;
  cr_assert(tt_bpe_encode(bpe, c.data, c.len, 0, ids, 1 << 16, &n) == 0);
  cr_assert_lt(n, c.len / 3, "%zu ids for %zu bytes", n, c.len);
  char *back = malloc(c.len);
  cr_assert(tt_bpe_decode(bpe, ids, n, back, c.len, &m) == 0);
  cr_assert(m == c.len && memcmp(back, c.data, m) == 0);
  /* vocab.json + merges.txt give the same ids. */
  char vp[300], mp[300];
  snprintf(vp, sizeof vp, "%s/vocab.json", out);
  snprintf(mp, sizeof mp, "%s/merges.txt", out);
  tt_bpe *b2 = NULL;
  cr_assert(tt_bpe_load_vocab_merges(vp, mp, &b2) == 0, "%s", tt_last_error());
  static int32_t ids2[1 << 16];
  cr_assert(tt_bpe_encode(b2, c.data, c.len, 0, ids2, 1 << 16, &m) == 0);
  cr_assert(m == n && memcmp(ids, ids2, n * sizeof *ids) == 0);
  free(back);
  tt_buf_free(&c);
  tt_bpe_free(bpe);
  tt_bpe_free(b2);
  free(dir);
}

/* -- The byte tokenizer ------------------------------------------------------------- */

/* data.tokenizer: byte. Every byte its own id, ill-formed UTF-8 and special-looking text
** included; EOS the newline; an id no byte has decodes to U+FFFD. */
Test(bpe, byte_tokenizer_ids_are_the_bytes) {
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load("byte", &bpe) == 0, "%s", tt_last_error());
  cr_assert(tt_bpe_vocab_size(bpe) == 256);
  cr_assert(tt_bpe_eos_id(bpe) == '\n');
  unsigned char text[256 + 13];
  for (int b = 0; b < 256; b++) text[b] = (unsigned char)(255 - b);
  memcpy(text + 256, "<|endoftext|>", 13);
  int32_t ids[sizeof text];
  size_t n = 0;
  cr_assert(tt_bpe_encode(bpe, (const char *)text, sizeof text, 1, ids, sizeof text, &n) == 0);
  cr_assert(n == sizeof text, "%zu ids for %zu bytes", n, sizeof text);
  for (size_t i = 0; i < n; i++) cr_assert(ids[i] == text[i], "id %zu: %d", i, ids[i]);
  char out[sizeof text];
  size_t len = 0;
  cr_assert(tt_bpe_decode(bpe, ids, n, out, sizeof out, &len) == 0);
  cr_assert(len == sizeof text && memcmp(out, text, len) == 0);
  const int32_t odd[] = {'a', 256, 'b'};
  cr_assert(tt_bpe_decode(bpe, odd, 3, out, sizeof out, &len) == 0);
  cr_assert(len == 5 && memcmp(out, "a\xEF\xBF\xBD" "b", 5) == 0);
  tt_bpe_free(bpe);
}

/* -- Bad files ---------------------------------------------------------------------- */

Test(bpe, bad_tokenizer_files_give_clear_errors) {
  char *dir = temp_dir();
  char path[256];
  tt_bpe *bpe = NULL;
  cr_assert(tt_bpe_load("/nonexistent/tokenizer.json", &bpe) != 0);
  cr_assert(strstr(tt_last_error(), "/nonexistent/tokenizer.json") != NULL, "%s", tt_last_error());
  snprintf(path, sizeof path, "%s/broken.json", dir);
  write_text(path, "{\"model\": {\"vocab\": {\"a\": 0,}", 29);
  cr_assert(tt_bpe_load(path, &bpe) != 0);
  cr_assert(strstr(tt_last_error(), path) != NULL && strstr(tt_last_error(), "invalid JSON"),
            "%s", tt_last_error());
  snprintf(path, sizeof path, "%s/wordpiece.json", dir);
  const char *wp = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}";
  write_text(path, wp, strlen(wp));
  cr_assert(tt_bpe_load(path, &bpe) != 0);
  cr_assert(strstr(tt_last_error(), "BPE") != NULL, "%s", tt_last_error());
  snprintf(path, sizeof path, "%s/bad.tiktoken", dir);
  write_text(path, "YQ== 0\n!!!! 1\n", 14);
  cr_assert(tt_bpe_load(path, &bpe) != 0);
  cr_assert(strstr(tt_last_error(), ":2:") != NULL, "%s", tt_last_error());
  snprintf(path, sizeof path, "%s/empty.json", dir);
  write_text(path, "", 0);
  cr_assert(tt_bpe_load(path, &bpe) != 0);
  cr_assert(strstr(tt_last_error(), "empty") != NULL, "%s", tt_last_error());
  free(dir);
}
