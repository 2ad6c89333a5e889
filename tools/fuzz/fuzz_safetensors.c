/*
** libFuzzer target: the safetensors reader on hostile files. Structure-aware: most inputs
** are a valid 8-byte header length and a JSON header built from fuzzer-chosen names,
** dtypes, shapes and offsets (the parts a size check must hold against), followed by
** fuzzer bytes as data; the rest are raw bytes. Every tensor the reader accepts is read
** whole and summed, so an accepted size that does not fit the file shows under ASan.
*/
#include "tetra.h"
#include "tetra_io.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *const DTYPES[] = {"F32", "F16", "BF16", "I64", "I32", "F64", "U8", "F8_E4M3"};
static const int SIZES[] = {4, 2, 2, 8, 4, 8, 1, 1};   /* bytes per element, as DTYPES */

/* Reads a little-endian value of n bytes from the input, advancing it. */
static uint64_t take(const uint8_t **p, size_t *n, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes && *n > 0; i++, (*p)++, (*n)--) v |= (uint64_t)**p << (8 * i);
  return v;
}

/* A header of up to 3 tensors from the input's first bytes. */
static size_t build(const uint8_t *p, size_t n, char *out, size_t cap) {
  size_t len = 0;
  int count = (int)(take(&p, &n, 1) % 4);
  len += (size_t)snprintf(out + len, cap - len, "{");
  uint64_t offset = 0;
  for (int t = 0; t < count && len < cap - 256; t++) {
    int k = (int)(take(&p, &n, 1) % 8);
    int ndim = (int)(take(&p, &n, 1) % 4);
    len += (size_t)snprintf(out + len, cap - len, "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[",
                            t ? "," : "", t, DTYPES[k]);
    uint64_t bytes = SIZES[k];   /* what the shape claims, modulo 2^64 */
    for (int d = 0; d < ndim; d++) {
      /* Mostly small sizes; sometimes one whose byte count wraps 64 bits to a small
      ** number (2^64 / element size + m), sometimes any huge one. */
      uint64_t sel = take(&p, &n, 1);
      uint64_t size = sel < 180   ? sel % 9
                      : sel < 230 ? (UINT64_MAX / (uint64_t)SIZES[k] + 1) + sel % 5
                                  : take(&p, &n, 8) & 0x7FFFFFFFFFFFFFFFull;
      bytes *= size;
      len += (size_t)snprintf(out + len, cap - len, "%s%llu", d ? "," : "",
                              (unsigned long long)size);
    }
    /* Data offsets: usually exactly the (wrapped) claimed size, else fuzzer-chosen. */
    uint64_t a = take(&p, &n, 1) < 230 ? offset : take(&p, &n, 8);
    uint64_t b = a + (take(&p, &n, 1) < 200 ? (bytes & 0xFFFF) : take(&p, &n, 2));
    offset = b;
    len += (size_t)snprintf(out + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                            (unsigned long long)a, (unsigned long long)b);
  }
  len += (size_t)snprintf(out + len, cap - len, "}");
  return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[] = "/tmp/tt_fuzz_st_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 0;
  FILE *f = fdopen(fd, "wb");
  if (size > 0 && data[0] & 1) {   /* structure-aware */
    char header[4096];
    size_t hl = build(data + 1, size - 1, header, sizeof header);
    uint64_t le = hl;
    fwrite(&le, 8, 1, f);
    fwrite(header, 1, hl, f);
    size_t used = size > 32 ? 32 : size;   /* the first bytes chose the header */
    fwrite(data + used, 1, size - used, f);
  } else {
    fwrite(data, 1, size, f);
  }
  fclose(f);
  tt_safetensors *st = NULL;
  if (tt_safetensors_open(path, &st) == 0) {
    for (int i = 0; i < tt_safetensors_count(st); i++) {
      const char *name = tt_safetensors_name(st, i);
      tt_tensor *t = NULL;
      if (tt_safetensors_read(st, name, &t) == 0) {
        tt_tensor *sum = NULL;
        if (t->dtype == TT_F32 && tt_sum(t, NULL, 0, 0, &sum) == 0)
          tt_tensor_release(sum);
        tt_tensor_release(t);
      }
    }
    tt_safetensors_close(st);
  }
  unlink(path);
  return 0;
}
