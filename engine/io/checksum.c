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
#include <stdio.h>

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

int tt_crc32c_file(const char *path, uint32_t *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return tt_set_error("%s: %s", path, strerror(errno));
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  if (!buf) {
    fclose(f);
    return tt_set_error("out of host memory");
  }
  uint32_t crc = 0;
  size_t n;
  while ((n = fread(buf, 1, CHUNK, f)) > 0) crc = tt_crc32c(crc, buf, n);
  int bad = ferror(f);
  free(buf);
  fclose(f);
  if (bad) return tt_set_error("%s: read error", path);
  *out = crc;
  return 0;
}
