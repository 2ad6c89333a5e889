/*
** bpe_internal.h — what the data modules share: Unicode classes, the GPT-2
** pre-tokenizer and the tokenizer's internal layout (buffers, hashing and JSON come from
** common/common.h).
*/
#ifndef TT_BPE_INTERNAL_H
#define TT_BPE_INTERNAL_H
#include "common/common.h"
#include "tetra_data.h"
#include <stdint.h>

/* -- Unicode ------------------------------------------------------------------------ */

extern const uint32_t tt_unicode_letter_ranges[][2];
extern const size_t tt_unicode_letter_ranges_count;
extern const uint32_t tt_unicode_number_ranges[][2];
extern const size_t tt_unicode_number_ranges_count;

enum { TT_CC_OTHER = 0, TT_CC_LETTER = 1, TT_CC_NUMBER = 2, TT_CC_SPACE = 3 };
/* Class of a code point for the GPT-2 pattern: \p{L}, \p{N}, \s (Unicode White_Space,
** which is also Oniguruma's \s) or anything else. */
int tt_char_class(uint32_t cp);
/* Length of the well-formed UTF-8 prefix of s (stops at the first ill-formed byte). */
size_t tt_utf8_valid_prefix(const uint8_t *s, size_t len);
/* Copies s into dst replacing each maximal ill-formed subsequence by U+FFFD (EF BF BD);
** dst needs 3 * len bytes. Returns the output length. */
size_t tt_utf8_sanitize(const uint8_t *s, size_t len, uint8_t *dst);

/* End (exclusive) of the GPT-2 pre-token starting at `pos` in well-formed UTF-8 text:
** 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
size_t tt_pretok_next(const uint8_t *s, size_t len, size_t pos);

/* The GPT-2 byte <-> unicode table: printable bytes (33-126, 161-172, 174-255) stand for
** themselves, the 68 others for 256, 257, ... in byte order. */
static inline uint32_t tt_byte_to_cp(uint8_t b) {
  if (b <= 32) return 256u + b;
  if (b >= 127 && b <= 160) return 162u + b;
  if (b == 173) return 323u;
  return b;
}
/* Inverse: code point -> byte, or -1 when cp is not in the table. */
static inline int tt_cp_to_byte(uint32_t cp) {
  if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
    return (int)cp;
  if (cp >= 256 && cp <= 288) return (int)(cp - 256);
  if (cp >= 289 && cp <= 322) return (int)(cp - 162);
  if (cp == 323) return 173;
  return -1;
}
/* Decodes a byte-level string (UTF-8 of mapped code points) into raw bytes in dst (at most
** len bytes). Returns the byte count, or -1 when a character is not in the table. */
int64_t tt_bytelevel_decode(const char *s, size_t len, uint8_t *dst);
/* Encodes raw bytes as a byte-level string; dst needs 2 * len bytes. Returns its length. */
size_t tt_bytelevel_encode(const uint8_t *s, size_t len, char *dst);

/* -- Tokenizer layout --------------------------------------------------------------- */

typedef struct tt_bpe_special {
  char *content;
  size_t len;
  int32_t id;
} tt_bpe_special;

struct tt_bpe {
  int32_t n_ids;            /* largest id + 1 */
  int32_t ids_cap;          /* room in tok_off / tok_len */
  /* Bytes of each id: tok_bytes[tok_off[i] .. tok_off[i] + tok_len[i]), len -1 = no id. */
  uint32_t *tok_off;
  int32_t *tok_len;
  tt_buf tok_bytes;
  /* Bytes -> id (open addressing; slots hold id + 1, 0 = empty). */
  int32_t *bytes_map;
  uint32_t bytes_mask;
  int32_t byte_id[256];     /* id of each single byte, -1 when the vocabulary lacks it */
  /* (left id, right id) -> rank << 32 | merged id (open addressing, key ~0 = empty). */
  uint64_t *pair_keys;
  uint64_t *pair_vals;
  uint32_t pair_mask;
  int64_t n_pairs;
  tt_bpe_special *specials;
  int n_specials;
  int ignore_merges;        /* HF: a word already in the vocabulary is one token */
  int add_prefix_space;     /* HF ByteLevel option */
  int32_t unk_id;
  int raw_bytes;            /* the byte tokenizer (tt_bpe_bytes): an id per byte, as is */
  tt_bpe_cache *cache;      /* used by tt_bpe_encode */
};

/* Ids index tables sized by the largest id (tok_off, tok_len), so one large id in a file
** must not pick an allocation of gigabytes. Real vocabularies stay far below this (o200k:
** 200k ids, the largest public ones about 256k). */
enum { TT_BPE_MAX_IDS = 1 << 24 };

/* Building a tokenizer: tt_bpe_init, then set ids, then pairs, then tt_bpe_finish. */
int tt_bpe_init(tt_bpe *bpe, int32_t n_ids_hint);
int tt_bpe_set_token(tt_bpe *bpe, int32_t id, const uint8_t *bytes, size_t len);
int32_t tt_bpe_lookup(const tt_bpe *bpe, const uint8_t *bytes, size_t len);
int tt_bpe_add_pair(tt_bpe *bpe, int32_t left, int32_t right, uint32_t rank, int32_t merged);
int tt_bpe_finish(tt_bpe *bpe);

/* Appends the ids of text to out (the body of tt_bpe_encode_with). */
int tt_bpe_encode_append(const tt_bpe *bpe, tt_bpe_cache *cache, const char *text,
                         size_t len, int allow_special, tt_ids *out);

/* Loaders (bpe_load.c). */
int tt_bpe_load_hf_json(const char *path, const char *text, size_t len, tt_bpe **out);
int tt_bpe_load_tiktoken_text(const char *path, const char *text, size_t len, tt_bpe **out);

/* -- Document sources (docs.c) ----------------------------------------------------- */

/* The files of one data source, sorted, viewed as one concatenated byte (or, for token
** shards, token) space. */
typedef struct tt_doc_files {
  char **paths;
  int64_t *sizes;        /* bytes (text, JSONL) or tokens (shards) */
  int64_t *starts;       /* prefix sums of sizes */
  int n;
  int64_t total;
  int type;              /* TT_DATA_* */
} tt_doc_files;

/* Expands paths/globs (separated by ',' or newlines) into sorted files. Errors name the
** pattern that matches nothing, the unreadable file, the empty file. type -1 infers from
** the first file's extension (.jsonl/.json/.ndjson, .tok, else text). */
int tt_doc_files_expand(const char *patterns, int type, tt_doc_files *out);
void tt_doc_files_free(tt_doc_files *f);

/* Reads the documents whose first byte lies in [start, end) of a source's byte space:
** JSONL lines (one document each, the text field decoded) or text (a file's share of the
** range is one document, returned in chunks cut where the GPT-2 pattern cannot join). */
typedef struct tt_doc_reader {
  const tt_doc_files *files;
  const char *field;
  int64_t start, end;
  int32_t file;          /* position of the next unread byte */
  int64_t off;
  int need_align;        /* skip to the next line start before reading */
  FILE *f;
  int32_t open_file;     /* file f holds open, -1 none */
  char *line;
  size_t line_cap;
  tt_buf text;
  tt_json doc;
  int64_t bad_lines, max_bad;
} tt_doc_reader;

void tt_doc_reader_init(tt_doc_reader *r, const tt_doc_files *files, const char *field,
                        int64_t start, int64_t end, int64_t max_bad);
void tt_doc_reader_rewind(tt_doc_reader *r);
void tt_doc_reader_free(tt_doc_reader *r);
/* 1: a piece in text, len (valid until the next call), *end_doc set when the document
** ends with it; 0: end of the range; -1: error. */
int tt_doc_reader_next(tt_doc_reader *r, const char **text, size_t *len, int *end_doc);

/* Object storage (s3.c). tt_s3_list: the objects matching pattern (s3://b/prefix*glob,
** '*' not crossing '/'), as s3:// URLs with their sizes (caller frees). tt_s3_fopen: a
** read-only, seekable FILE over an object of `size` bytes, read in blocks with one block
** fetched ahead. tt_s3_local_copy: the object in the local cache ($TETRA_S3_CACHE, or
** $TMPDIR/tetra-s3-cache), downloaded if absent; its path into `path`. */
int tt_s3_is_url(const char *path);
int tt_s3_list(const char *pattern, char ***urls, int64_t **sizes, int *n);
int tt_s3_read(const char *url, int64_t off, void *buf, size_t len);
FILE *tt_s3_fopen(const char *url, int64_t size);
int tt_s3_local_copy(const char *url, int64_t size, char *path, size_t cap);

/* Token shard files (written by prepare.c, read by shards.c): a 64-byte header, then the
** tokens as little-endian uint16 (vocabularies up to 65536 ids) or uint32.
**   0  "TTTOKENS"   8  u32 version (1)   12 u32 bytes per token   16 i64 token count
**   24 i32 vocabulary size   28 i32 EOS id   32..63 zero */
enum { SHARD_HEADER = 64, SHARD_VERSION = 1 };

/* Token shards (shards.c): the mapped tokens of shard i of a TT_DATA_TOKENS source. */
typedef struct tt_token_view {
  const void *data;
  int token_bytes;       /* 2 or 4 */
  int64_t n;
} tt_token_view;

struct tt_token_shard {
  void *map;
  size_t map_len;
  tt_token_view view;
  int32_t vocab, eos;
};

#endif
