/*
** tetra_data.h — the public C API of Tetra's data pipeline: the byte-level BPE tokenizer
** (GPT-2 compatible), its trainer, the streaming loader and pre-tokenized shards.
**
** Like tetra.h, this header is also read by LuaJIT's ffi.cdef (through
** require("tetra.ffi").cdef_header): flat declarations, no macros, no inline functions.
** Functions that can fail return int (0 ok, -1 error, message in tt_last_error()).
*/
#ifndef TETRA_DATA_H
#define TETRA_DATA_H
#include <stddef.h>
#include <stdint.h>

/* -- Tokenizer ---------------------------------------------------------------------- */

typedef struct tt_bpe tt_bpe;
/* A word cache for one thread. tt_bpe_encode uses the tokenizer's own cache (one thread at
** a time); concurrent encoders each pass their own cache to tt_bpe_encode_with. */
typedef struct tt_bpe_cache tt_bpe_cache;

/* Loads a Hugging Face tokenizer.json (BPE model with a ByteLevel pre-tokenizer), or a
** tiktoken rank file (".tiktoken": base64 token and rank per line), picked by content.
** The name "byte" (data.tokenizer: byte, the default) is the byte tokenizer instead. */
int tt_bpe_load(const char *path, tt_bpe **out);
/* The byte tokenizer: each byte of the text is its own id (vocabulary 256), as it is
** (no merges, no pre-tokenizer, ill-formed UTF-8 kept); the end-of-text id is the
** newline byte, so documents packed one after another read as lines. Decoding writes
** U+FFFD for an id above 255 (a model with a larger vocabulary may sample one). */
int tt_bpe_bytes(tt_bpe **out);
/* Loads GPT-2 style vocab.json + merges.txt. */
int tt_bpe_load_vocab_merges(const char *vocab_path, const char *merges_path, tt_bpe **out);
void tt_bpe_free(tt_bpe *bpe);

/* Number of ids (largest id + 1), special tokens included. */
int32_t tt_bpe_vocab_size(const tt_bpe *bpe);
/* Id of a special/added token by its text, or of a vocabulary entry by its byte-level
** string ("Ġthe"); -1 when absent. */
int32_t tt_bpe_token_id(const tt_bpe *bpe, const char *token);
/* The end-of-text id: "<|endoftext|>", "</s>", "<eos>" or "<|end_of_text|>"; -1 if none. */
int32_t tt_bpe_eos_id(const tt_bpe *bpe);
/* Registers `content` as a special token with id `id` (an existing id or the next free). */
int tt_bpe_add_special(tt_bpe *bpe, const char *content, int32_t id);

/* Encodes `len` bytes of text. Invalid UTF-8 is read as U+FFFD per maximal ill-formed
** subsequence (as Python's bytes.decode('utf-8', 'replace')). With allow_special != 0
** the special/added tokens in the text become their ids; otherwise they are plain text.
** Writes at most `cap` ids and sets *n_out to the full count: call again with a larger
** buffer when *n_out > cap. */
int tt_bpe_encode(tt_bpe *bpe, const char *text, size_t len, int allow_special,
                  int32_t *ids, size_t cap, size_t *n_out);
int tt_bpe_cache_new(tt_bpe_cache **out);
void tt_bpe_cache_free(tt_bpe_cache *cache);
int tt_bpe_encode_with(const tt_bpe *bpe, tt_bpe_cache *cache, const char *text, size_t len,
                       int allow_special, int32_t *ids, size_t cap, size_t *n_out);
/* Bytes of ids into buf (at most cap), *n_out = full length. Unknown ids are an error. */
int tt_bpe_decode(const tt_bpe *bpe, const int32_t *ids, size_t n, char *buf, size_t cap,
                  size_t *n_out);

/* Learns a byte-level BPE vocabulary of `vocab_size` ids (256 bytes + merges + the special
** tokens) from text files (".jsonl" files contribute their "text" field), counting words
** on `num_threads` threads, and writes tokenizer.json, vocab.json and merges.txt into
** out_dir. specials: NUL-separated list ending with an empty string, or NULL for
** "<|endoftext|>". verbose != 0 prints progress to stderr. */
int tt_bpe_train(const char *const *files, int n_files, int vocab_size, const char *out_dir,
                 const char *specials, int num_threads, int verbose);

struct tt_tensor;

/* -- Loader ------------------------------------------------------------------------- */

enum { TT_DATA_JSONL = 0, TT_DATA_TEXT = 1, TT_DATA_TOKENS = 2, TT_DATA_TFRECORD = 3 };

typedef struct tt_data_source {
  const char *paths;       /* paths or globs, separated by ',' or newlines */
  double weight;           /* blending weight (> 0) */
  int type;                /* TT_DATA_*, or -1 to infer from the extension */
  const char *text_field;  /* JSONL field, NULL for "text" */
} tt_data_source;

typedef struct tt_data_config {
  const tt_data_source *sources;
  int n_sources;
  const char *tokenizer;       /* tokenizer.json or .tiktoken (NULL when only token shards) */
  const char *vocab_file;      /* alternatively vocab.json + merges.txt */
  const char *merges_file;
  int64_t seq_len;             /* sequences hold seq_len + 1 tokens */
  int64_t global_batch;        /* rows per step over all data-parallel ranks */
  int dp_rank, dp_size;
  int num_streams;             /* must divide global_batch; 0: gcd(global_batch, 8) */
  int64_t shuffle_buffer;      /* sequences per stream; 0 = no shuffle */
  uint64_t seed;
  int num_workers;             /* tokenizer threads; 0: 2 */
  int queue_depth;             /* prefetched sequences per stream; 0: prefetch_steps' worth */
  int prefetch_steps;          /* steps of sequences prefetched per stream; 0: 2 */
  int64_t max_bad_lines;       /* malformed JSONL lines tolerated; < 0: 100 */
  int32_t eos_id;              /* -1: the tokenizer's EOS */
  double range_lo, range_hi;   /* the fraction of each source read: [lo, hi); 0, 0: all */
} tt_data_config;

typedef struct tt_data_loader tt_data_loader;

typedef struct tt_data_stats {
  double tokens_per_s;         /* tokens produced per second by the workers since start */
  double wait_s;               /* time the last next_batch waited for data */
  double total_wait_s;         /* summed over all next_batch calls */
  int64_t queue_depth;         /* prefetched sequences ready for this rank */
  int64_t tokens;              /* tokens produced so far */
  int64_t batches;             /* batches returned */
  int64_t bad_lines;           /* malformed lines skipped */
  int64_t epochs;              /* largest epoch over the sources (0 in the first pass) */
} tt_data_stats;

int tt_data_loader_new(const tt_data_config *cfg, tt_data_loader **out);
void tt_data_loader_free(tt_data_loader *loader);
int64_t tt_data_loader_local_batch(const tt_data_loader *loader);
/* Fills this rank's rows: inputs and targets (local_batch, seq_len) int64, row-major. */
int tt_data_loader_next(tt_data_loader *loader, int64_t *inputs, int64_t *targets);
/* Like tt_data_loader_next, into two new i64 CPU tensors (owned by the caller). */
int tt_data_loader_next_tensors(tt_data_loader *loader, struct tt_tensor **inputs,
                                struct tt_tensor **targets);
/* Serialised state (a byte blob owned by the loader, valid until the next call). */
int tt_data_loader_state(tt_data_loader *loader, const uint8_t **data, size_t *len);
int tt_data_loader_load_state(tt_data_loader *loader, const uint8_t *data, size_t len);
int tt_data_loader_stats(tt_data_loader *loader, tt_data_stats *out);

/* -- Pre-tokenized shards ----------------------------------------------------------- */

/* Tokenizes the documents of `files` (JSONL or text) into shard files out_dir/NNNNN.tok
** of at most shard_tokens tokens each, EOS after each document. */
int tt_data_prepare(const char *const *files, int n_files, const char *tokenizer,
                    const char *text_field, const char *out_dir, int64_t shard_tokens,
                    int num_threads, int verbose);

typedef struct tt_token_shard tt_token_shard;
/* Maps a shard read-only. */
int tt_token_shard_open(const char *path, tt_token_shard **out);
void tt_token_shard_close(tt_token_shard *shard);
int64_t tt_token_shard_size(const tt_token_shard *shard);
int32_t tt_token_shard_vocab(const tt_token_shard *shard);
/* Copies tokens [start, start + n) as int32. */
int tt_token_shard_read(const tt_token_shard *shard, int64_t start, int64_t n, int32_t *dst);

/* -- Object storage (s3.c) ---------------------------------------------------------- */

/* Paths "s3://BUCKET/KEY" (KEY may hold a glob) are read through the S3 API. Settings
** default to the AWS environment variables; NULL / negative / 0 keep a setting:
** endpoint (AWS_ENDPOINT_URL), region (AWS_REGION), retries per request (6), seconds
** before a connection attempt or a stalled transfer is given up and retried (20), bytes
** per ranged GET, which is also the read-ahead (8 MiB). */
int tt_s3_configure(const char *endpoint, const char *region, int retries, double timeout_s,
                    int64_t block_bytes);
/* Requests sent, retried, and object bytes received, since the start (all threads). */
void tt_s3_counters(int64_t *requests, int64_t *retries, int64_t *bytes);

/* -- Command line (the tetra binary forwards `tetra tokenizer|data ...`) ------------- */

int tt_tokenizer_cli(int argc, char **argv);
int tt_data_cli(int argc, char **argv);

#endif
