/*
** shards.c — the reader of pre-tokenized token shards (engine/data/prepare.c writes them).
** Readers map the file; the loader copies tokens straight from the mapping into batches.
*/
#include "data/bpe_internal.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* -- Reader ------------------------------------------------------------------------- */

int tt_token_shard_open(const char *path, tt_token_shard **out) {
  char local[4096];
  if (tt_s3_is_url(path)) {   /* mapped from a local copy of the object */
    char **urls;
    int64_t *sizes;
    int n;
    TT_TRY(tt_s3_list(path, &urls, &sizes, &n));
    int64_t size = n == 1 ? sizes[0] : -1;
    for (int i = 0; i < n; i++) free(urls[i]);
    free(urls);
    free(sizes);
    if (size < 0) return tt_set_error("%s: no such object", path);
    TT_TRY(tt_s3_local_copy(path, size, local, sizeof local));
    path = local;
  }
  int fd = open(path, O_RDONLY);
  if (fd < 0) return tt_set_error("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < SHARD_HEADER) {
    close(fd);
    return tt_set_error("%s: not a token shard (too short)", path);
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return tt_set_error("%s: mmap failed: %s", path, strerror(errno));
  const uint8_t *h = map;
  uint32_t version, tb;
  int64_t n;
  int32_t vocab, eos;
  memcpy(&version, h + 8, 4);
  memcpy(&tb, h + 12, 4);
  memcpy(&n, h + 16, 8);
  memcpy(&vocab, h + 24, 4);
  memcpy(&eos, h + 28, 4);
  const char *why = NULL;
  if (memcmp(h, "TTTOKENS", 8) != 0) why = "bad magic";
  else if (version != SHARD_VERSION) why = "unsupported version";
  else if (tb != 2 && tb != 4) why = "bad token width";
  else if (n < 0 || (uint64_t)n * tb + SHARD_HEADER != (uint64_t)st.st_size) why = "size does not match its header";
  if (why) {
    munmap(map, (size_t)st.st_size);
    return tt_set_error("%s: not a token shard (%s)", path, why);
  }
  tt_token_shard *sh = malloc(sizeof *sh);
  if (!sh) {
    munmap(map, (size_t)st.st_size);
    return tt_set_error("out of host memory");
  }
  sh->map = map;
  sh->map_len = (size_t)st.st_size;
  sh->view = (tt_token_view){h + SHARD_HEADER, (int)tb, n};
  sh->vocab = vocab;
  sh->eos = eos;
  madvise(map, sh->map_len, MADV_SEQUENTIAL);
  *out = sh;
  return 0;
}

void tt_token_shard_close(tt_token_shard *sh) {
  if (!sh) return;
  munmap(sh->map, sh->map_len);
  free(sh);
}

int64_t tt_token_shard_size(const tt_token_shard *sh) { return sh->view.n; }
int32_t tt_token_shard_vocab(const tt_token_shard *sh) { return sh->vocab; }

int tt_token_shard_read(const tt_token_shard *sh, int64_t start, int64_t n, int32_t *dst) {
  if (start < 0 || n < 0 || start + n > sh->view.n)
    return tt_set_error("token shard: range [%lld, %lld) outside %lld tokens", (long long)start,
                        (long long)(start + n), (long long)sh->view.n);
  if (sh->view.token_bytes == 2) {
    const uint16_t *p = (const uint16_t *)sh->view.data + start;
    for (int64_t i = 0; i < n; i++) dst[i] = p[i];
  } else {
    memcpy(dst, (const uint32_t *)sh->view.data + start, (size_t)n * 4);
  }
  return 0;
}
