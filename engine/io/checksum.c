/*
** checksum.c — CRC-32C (Castagnoli), the checksum of checkpoint files (and of TFRecord
** records): the SSE4.2 crc32 instruction where the CPU has it, a table otherwise. Both
** give the same value (RFC 3720's CRC-32C: reflected polynomial 0x82F63B78, initial and
** final value inverted), so a file checked on one machine verifies on another.
*/
#include "tetra_io.h"
#include "core/tt_internal.h"
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

/* Made once, by whichever thread needs it first: the checkpoint writer's, a TFRecord
** loader's and the main thread's checks may all start at once. */
static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
}

static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n) {
  pthread_once(&table_once, make_table);
  while (n--) crc = table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const uint8_t *p,
                                                             size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  uint32_t c32 = (uint32_t)c;
  for (; n > 0; n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

uint32_t tt_crc32c(uint32_t crc, const void *data, size_t len) {
  crc = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc_sse42(crc, data, len);
#endif
  return ~crc_table(crc, data, len);
}

/* Bytes read from files: summed here, and copied out of a safetensors mapping
** (tt_io_count_copied). */
static _Atomic uint64_t bytes_summed, bytes_copied;

void tt_io_count_copied(uint64_t n) { bytes_copied += n; }
void tt_io_bytes(uint64_t *copied, uint64_t *summed) {
  *copied = bytes_copied;
  *summed = bytes_summed;
}

uint64_t tt_checksum_block(uint64_t bytes) {
  uint64_t block = 4096;
  while (block < (4u << 20) && block * 1024 < bytes) block *= 2;
  return block;
}

int tt_crc32c_file_blocks(const char *path, uint64_t block, uint32_t *whole, uint32_t *sums,
                          int64_t n_sums) {
  TT_CHECK(block > 0 && block <= (64u << 20), "%s: block of %llu bytes", path,
           (unsigned long long)block);
  FILE *f = fopen(path, "rb");
  if (!f) return tt_set_error("%s: %s", path, strerror(errno));
  uint8_t *buf = malloc((size_t)block);
  if (!buf) {
    fclose(f);
    return tt_set_error("out of host memory");
  }
  uint32_t crc = 0;
  int64_t k = 0;
  size_t n;
  int rc = 0;
  /* fread fills a whole block unless the file ends first. */
  while ((n = fread(buf, 1, (size_t)block, f)) > 0) {
    crc = tt_crc32c(crc, buf, n);
    bytes_summed += n;
    if (sums) {
      if (k >= n_sums) {
        rc = tt_set_error("%s: longer than %lld blocks of %llu bytes (written to meanwhile?)",
                          path, (long long)n_sums, (unsigned long long)block);
        break;
      }
      sums[k] = tt_crc32c(0, buf, n);
    }
    k++;
  }
  if (!rc && ferror(f)) rc = tt_set_error("%s: read error", path);
  if (!rc && sums && k != n_sums)
    rc = tt_set_error("%s: %lld blocks of %llu bytes, %lld expected (written to meanwhile?)",
                      path, (long long)k, (unsigned long long)block, (long long)n_sums);
  free(buf);
  fclose(f);
  if (!rc) *whole = crc;
  return rc;
}

int tt_crc32c_file(const char *path, uint32_t *out) {
  return tt_crc32c_file_blocks(path, 1u << 20, out, NULL, 0);
}

int tt_crc32c_file_range(const char *path, uint64_t offset, uint64_t len, uint32_t *out) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return tt_set_error("%s: %s", path, strerror(errno));
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  if (!buf) {
    close(fd);
    return tt_set_error("out of host memory");
  }
  uint32_t crc = 0;
  int rc = 0;
  while (len > 0) {
    ssize_t n = pread(fd, buf, len < CHUNK ? (size_t)len : CHUNK, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      rc = n < 0 ? tt_set_error("%s: %s", path, strerror(errno))
                 : tt_set_error("%s: ends before byte %llu", path,
                                (unsigned long long)(offset + len));
      break;
    }
    crc = tt_crc32c(crc, buf, (size_t)n);
    bytes_summed += (uint64_t)n;
    offset += (uint64_t)n;
    len -= (uint64_t)n;
  }
  free(buf);
  close(fd);
  if (!rc) *out = crc;
  return rc;
}
