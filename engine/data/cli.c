/*
** cli.c — `tetra tokenizer ...` and `tetra data ...` (engine/host/main.c forwards argv here).
** Each returns the process exit code: 0 ok, 1 failure (message on stderr), 2 usage.
*/
#include "data/bpe_internal.h"
#include <errno.h>
#include <time.h>
#include <unistd.h>

static const char *tokenizer_usage =
  "usage:\n"
  "  tetra tokenizer encode (--tokenizer FILE | --vocab FILE --merges FILE)\n"
  "                         [--whole] [--no-special] [FILE]\n"
  "      prints the ids of each input line (without its newline), space-separated, one\n"
  "      output line per input line; --whole encodes the whole input as one text.\n"
  "      --tokenizer takes a tokenizer.json or a .tiktoken rank file.\n"
  "  tetra tokenizer decode (--tokenizer FILE | --vocab FILE --merges FILE) [FILE]\n"
  "      reads lines of space-separated ids and prints their text, one line each.\n"
  "  tetra tokenizer train --vocab-size N --out DIR [--threads N] [--special TOKEN]...\n"
  "                        FILES...\n"
  "      learns a byte-level BPE vocabulary; writes DIR/tokenizer.json, vocab.json and\n"
  "      merges.txt. Special tokens default to <|endoftext|>.\n"
  "  tetra tokenizer info (--tokenizer FILE | --vocab FILE --merges FILE)\n"
  "  tetra tokenizer bench (--tokenizer FILE | --vocab FILE --merges FILE) [--repeat N] FILE\n"
  "      encodes FILE as one text on one thread (a cold word cache each time); prints\n"
  "      the best MB/s and the id count.\n";

static const char *data_usage =
  "usage:\n"
  "  tetra data prepare --tokenizer FILE --out DIR [--text-field NAME]\n"
  "                     [--shard-tokens N] [--threads N] FILES...\n"
  "      tokenizes JSONL (field NAME, default text) or text files into memory-mapped\n"
  "      token shards DIR/NNNNN.tok, EOS after each document.\n"
  "  tetra data inspect SHARD...\n"
  "      prints the token count, vocabulary size and first ids of each shard.\n";

typedef struct tok_args {
  const char *tokenizer, *vocab, *merges;
} tok_args;

static int load_tokenizer(const tok_args *a, tt_bpe **out) {
  if (a->tokenizer) return tt_bpe_load(a->tokenizer, out);
  if (a->vocab && a->merges) return tt_bpe_load_vocab_merges(a->vocab, a->merges, out);
  return tt_set_error("give --tokenizer FILE, or --vocab FILE and --merges FILE");
}

static int report(const char *cmd) {
  fprintf(stderr, "tetra %s: %s\n", cmd, tt_last_error());
  return 1;
}

/* Reads all of `path` (or stdin when NULL / "-"). */
static int read_input(const char *path, tt_buf *b) {
  if (path && strcmp(path, "-") != 0) {
    char *text;
    size_t len;
    TT_TRY(tt_read_file(path, &text, &len));
    b->data = text;
    b->len = len;
    b->cap = len + 1;
    return 0;
  }
  char chunk[1 << 16];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) TT_TRY(tt_buf_append(b, chunk, n));
  return tt_buf_append(b, "", 0);
}

static int print_ids(tt_buf *out, const int32_t *ids, size_t n) {
  TT_TRY(tt_buf_reserve(out, n * 12 + 1));
  char *o = out->data + out->len;
  for (size_t i = 0; i < n; i++) {
    if (i) *o++ = ' ';
    o += sprintf(o, "%d", (int)ids[i]);
  }
  *o++ = '\n';
  out->len = (size_t)(o - out->data);
  if (out->len > (1 << 20)) {
    fwrite(out->data, 1, out->len, stdout);
    out->len = 0;
  }
  return 0;
}

static int cmd_encode(const tok_args *a, const char *file, int whole, int allow_special) {
  tt_bpe *bpe = NULL;
  tt_buf in = {0}, out = {0};
  tt_ids ids = {0};
  int rc = -1;
  if (load_tokenizer(a, &bpe) != 0 || read_input(file, &in) != 0) goto done;
  if (whole) {
    if (tt_bpe_encode_append(bpe, bpe->cache, in.data, in.len, allow_special, &ids) != 0 ||
        print_ids(&out, ids.data, ids.len) != 0)
      goto done;
  } else {
    size_t pos = 0;
    while (pos < in.len) {
      const char *s = in.data + pos;
      const char *nl = memchr(s, '\n', in.len - pos);
      size_t n = nl ? (size_t)(nl - s) : in.len - pos;
      pos += n + (nl ? 1 : 0);
      ids.len = 0;
      if (tt_bpe_encode_append(bpe, bpe->cache, s, n, allow_special, &ids) != 0 ||
          print_ids(&out, ids.data, ids.len) != 0)
        goto done;
    }
  }
  fwrite(out.data, 1, out.len, stdout);
  rc = fflush(stdout) == 0 ? 0 : tt_set_error("write error on stdout");
done:
  tt_bpe_free(bpe);
  tt_buf_free(&in);
  tt_buf_free(&out);
  tt_ids_free(&ids);
  return rc;
}

static int cmd_decode(const tok_args *a, const char *file) {
  tt_bpe *bpe = NULL;
  tt_buf in = {0}, out = {0};
  tt_ids ids = {0};
  int rc = -1;
  if (load_tokenizer(a, &bpe) != 0 || read_input(file, &in) != 0) goto done;
  size_t pos = 0;
  int line = 0;
  while (pos < in.len) {
    char *s = in.data + pos;
    char *nl = memchr(s, '\n', in.len - pos);
    size_t n = nl ? (size_t)(nl - s) : in.len - pos;
    pos += n + (nl ? 1 : 0);
    line++;
    if (nl) *nl = '\0';
    ids.len = 0;
    for (char *p = s; *p;) {
      while (*p == ' ' || *p == '\t' || *p == '\r') p++;
      if (!*p) break;
      char *end;
      long v = strtol(p, &end, 10);
      if (end == p) {
        tt_set_error("line %d: not an id: '%.20s'", line, p);
        goto done;
      }
      if (tt_ids_reserve(&ids, 1) != 0) goto done;
      ids.data[ids.len++] = (int32_t)v;
      p = end;
    }
    size_t need;
    if (tt_bpe_decode(bpe, ids.data, ids.len, NULL, 0, &need) != 0 ||
        tt_buf_reserve(&out, need + 1) != 0 ||
        tt_bpe_decode(bpe, ids.data, ids.len, out.data + out.len, need, &need) != 0)
      goto done;
    out.len += need;
    out.data[out.len++] = '\n';
  }
  fwrite(out.data, 1, out.len, stdout);
  rc = 0;
done:
  tt_bpe_free(bpe);
  tt_buf_free(&in);
  tt_buf_free(&out);
  tt_ids_free(&ids);
  return rc;
}

static int cmd_info(const tok_args *a) {
  tt_bpe *bpe = NULL;
  TT_TRY(load_tokenizer(a, &bpe));
  printf("ids: %d\nmerges: %lld\nspecial tokens: %d\n", (int)bpe->n_ids, (long long)bpe->n_pairs,
         bpe->n_specials);
  for (int i = 0; i < bpe->n_specials; i++)
    printf("  %d %s\n", (int)bpe->specials[i].id, bpe->specials[i].content);
  printf("eos: %d\n", (int)tt_bpe_eos_id(bpe));
  tt_bpe_free(bpe);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmd_bench(const tok_args *a, const char *file, int repeat) {
  tt_bpe *bpe = NULL;
  tt_buf in = {0};
  tt_ids ids = {0};
  int rc = -1;
  double best = 1e30;
  if (!file) {
    tt_set_error("bench needs an input file");
    goto done;
  }
  if (load_tokenizer(a, &bpe) != 0 || read_input(file, &in) != 0) goto done;
  for (int r = 0; r < repeat; r++) {
    tt_bpe_cache *cache;
    if (tt_bpe_cache_new(&cache) != 0) goto done;
    ids.len = 0;
    double t0 = now_s();
    int bad = tt_bpe_encode_append(bpe, cache, in.data, in.len, 0, &ids);
    double dt = now_s() - t0;
    tt_bpe_cache_free(cache);
    if (bad) goto done;
    if (dt < best) best = dt;
  }
  printf("%.2f MB/s %zu ids %zu bytes %.4f s\n", (double)in.len / 1e6 / best, ids.len, in.len, best);
  rc = 0;
done:
  tt_bpe_free(bpe);
  tt_buf_free(&in);
  tt_ids_free(&ids);
  return rc;
}

static int parse_int(const char *cmd, const char *opt, const char *v, long long lo, long long *out) {
  char *end;
  errno = 0;
  long long x = v ? strtoll(v, &end, 10) : 0;
  if (!v || errno || *end || x < lo) {
    fprintf(stderr, "tetra %s: %s needs an integer >= %lld\n", cmd, opt, lo);
    return -1;
  }
  *out = x;
  return 0;
}

static int default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int tt_tokenizer_cli(int argc, char **argv) {
  /* argv[0] is "tokenizer" (or the program name): the subcommand follows. */
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(tokenizer_usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *sub = argv[1];
  tok_args a = {0};
  const char *out_dir = NULL, *file = NULL;
  long long vocab_size = 0, threads = default_threads(), repeat = 3;
  int whole = 0, allow_special = 1;
  tt_buf specials = {0};
  const char **files = calloc((size_t)argc, sizeof *files);
  int n_files = 0, rc = 2;
  if (!files) return 1;
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--tokenizer") && v) { a.tokenizer = v; i++; }
    else if (!strcmp(o, "--vocab") && v) { a.vocab = v; i++; }
    else if (!strcmp(o, "--merges") && v) { a.merges = v; i++; }
    else if (!strcmp(o, "--out") && v) { out_dir = v; i++; }
    else if (!strcmp(o, "--vocab-size")) {
      if (parse_int("tokenizer", o, v, 257, &vocab_size)) goto done;
      i++;
    } else if (!strcmp(o, "--threads")) {
      if (parse_int("tokenizer", o, v, 1, &threads)) goto done;
      i++;
    } else if (!strcmp(o, "--repeat")) {
      if (parse_int("tokenizer", o, v, 1, &repeat)) goto done;
      i++;
    } else if (!strcmp(o, "--special") && v) {
      if (tt_buf_append(&specials, v, strlen(v) + 1)) goto done;
      i++;
    } else if (!strcmp(o, "--whole")) whole = 1;
    else if (!strcmp(o, "--no-special")) allow_special = 0;
    else if (o[0] == '-' && o[1] != '\0') {
      fprintf(stderr, "tetra tokenizer: unknown option %s\n%s", o, tokenizer_usage);
      goto done;
    } else files[n_files++] = o;
  }
  file = n_files ? files[0] : NULL;
  if (!strcmp(sub, "encode") && n_files <= 1) {
    rc = cmd_encode(&a, file, whole, allow_special) ? report("tokenizer encode") : 0;
  } else if (!strcmp(sub, "decode") && n_files <= 1) {
    rc = cmd_decode(&a, file) ? report("tokenizer decode") : 0;
  } else if (!strcmp(sub, "bench") && n_files == 1) {
    rc = cmd_bench(&a, file, (int)repeat) ? report("tokenizer bench") : 0;
  } else if (!strcmp(sub, "info")) {
    rc = cmd_info(&a) ? report("tokenizer info") : 0;
  } else if (!strcmp(sub, "train")) {
    if (!out_dir || vocab_size == 0 || n_files == 0) {
      fprintf(stderr, "tetra tokenizer train: needs --vocab-size N, --out DIR and input files\n");
      goto done;
    }
    if (specials.len && tt_buf_append(&specials, "", 1)) goto done;
    rc = tt_bpe_train(files, n_files, (int)vocab_size, out_dir, specials.len ? specials.data : NULL,
                      (int)threads, 1)
             ? report("tokenizer train") : 0;
  } else {
    fprintf(stderr, "tetra tokenizer: bad command '%s'\n%s", sub, tokenizer_usage);
  }
done:
  tt_buf_free(&specials);
  free(files);
  return rc;
}

static int cmd_inspect(char **paths, int n) {
  for (int i = 0; i < n; i++) {
    tt_token_shard *sh;
    TT_TRY(tt_token_shard_open(paths[i], &sh));
    int64_t len = tt_token_shard_size(sh);
    int32_t first[16];
    int64_t k = len < 16 ? len : 16;
    if (tt_token_shard_read(sh, 0, k, first) != 0) {
      tt_token_shard_close(sh);
      return -1;
    }
    printf("%s: %lld tokens, vocabulary %d, first:", paths[i], (long long)len,
           (int)tt_token_shard_vocab(sh));
    for (int64_t j = 0; j < k; j++) printf(" %d", (int)first[j]);
    printf("\n");
    tt_token_shard_close(sh);
  }
  return 0;
}

int tt_data_cli(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs(data_usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "inspect")) return cmd_inspect(argv + 2, argc - 2) ? report("data inspect") : 0;
  if (strcmp(sub, "prepare") != 0) {
    fprintf(stderr, "tetra data: bad command '%s'\n%s", sub, data_usage);
    return 2;
  }
  const char *tokenizer = NULL, *out_dir = NULL, *field = NULL;
  long long shard_tokens = 100000000, threads = default_threads();
  const char **files = calloc((size_t)argc, sizeof *files);
  int n_files = 0, rc = 2;
  if (!files) return 1;
  for (int i = 2; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--tokenizer") && v) { tokenizer = v; i++; }
    else if (!strcmp(o, "--out") && v) { out_dir = v; i++; }
    else if (!strcmp(o, "--text-field") && v) { field = v; i++; }
    else if (!strcmp(o, "--shard-tokens")) {
      if (parse_int("data", o, v, 1, &shard_tokens)) goto done;
      i++;
    } else if (!strcmp(o, "--threads")) {
      if (parse_int("data", o, v, 1, &threads)) goto done;
      i++;
    } else if (o[0] == '-' && o[1] != '\0') {
      fprintf(stderr, "tetra data: unknown option %s\n%s", o, data_usage);
      goto done;
    } else files[n_files++] = o;
  }
  if (!tokenizer || !out_dir || n_files == 0) {
    fprintf(stderr, "tetra data prepare: needs --tokenizer FILE, --out DIR and input files\n");
    goto done;
  }
  rc = tt_data_prepare(files, n_files, tokenizer, field, out_dir, shard_tokens, (int)threads, 1)
           ? report("data prepare") : 0;
done:
  free(files);
  return rc;
}
