/*
** The safetensors header as the one JSON reader (engine/common/json.c) hands it to
** engine/io/safetensors.c: what the format allows is taken exactly (escaped names and
** metadata, offsets past 2^53 that a double would round), the rest refused with a message
** naming the file.
*/
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tetra.h"
#include "tetra_io.h"

/* A file of `header` and n data bytes (zeros). */
static void write_file(const char *path, const char *header, size_t n) {
  FILE *fp = fopen(path, "wb");
  cr_assert(fp);
  uint64_t len = strlen(header);
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
  fwrite(le, 1, 8, fp);
  fwrite(header, 1, len, fp);
  for (size_t i = 0; i < n; i++) fputc(0, fp);
  fclose(fp);
}

static void tmp_path(char *buf, size_t n) {
  snprintf(buf, n, "/tmp/tetra_test_st_header_%d.safetensors", (int)getpid());
}

/* Opens a file that must be refused; the message must hold `want` and the path. */
static void refused(const char *header, size_t n, const char *want) {
  char path[128];
  tmp_path(path, sizeof path);
  write_file(path, header, n);
  tt_safetensors *f = NULL;
  cr_assert_eq(tt_safetensors_open(path, &f), -1, "accepted: %s", header);
  cr_assert_null(f);
  cr_assert(strstr(tt_last_error(), want) && strstr(tt_last_error(), path),
            "header %s: %s (want \"%s\")", header, tt_last_error(), want);
  unlink(path);
}

Test(safetensors_header, escapes_and_metadata_decoded) {
  char path[128];
  tmp_path(path, sizeof path);
  /* Padding spaces after the object, as the Python writer leaves them. */
  write_file(path,
             "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a\\\"b\\u00e9\"},"
             "\"w\\/x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],"
             "\"extra\":[1,{\"deep\":null}]}}    ", 8);
  tt_safetensors *f = NULL;
  cr_assert_eq(tt_safetensors_open(path, &f), 0, "%s", tt_last_error());
  cr_assert_eq(tt_safetensors_count(f), 1);
  cr_assert_str_eq(tt_safetensors_name(f, 0), "w/x");
  cr_assert_eq(tt_safetensors_metadata_count(f), 2);
  cr_assert_str_eq(tt_safetensors_metadata_get(f, "format"), "pt");
  cr_assert_str_eq(tt_safetensors_metadata_get(f, "note"), "a\"b\xc3\xa9");
  tt_safetensors_close(f);
  unlink(path);
}

Test(safetensors_header, offsets_read_exactly) {
  /* 2^53 + 1 has no double: read as one, it would print as 9007199254740992. */
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[9007199254740993,"
          "9007199254740997]}}", 4, "[9007199254740993, 9007199254740997]");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}",
          4, "integer overflow");
}

Test(safetensors_header, hostile_headers_refused) {
  refused("[1, 2]", 0, "the header is not an object");
  refused("{\"x\":[]}", 0, "a tensor entry is not an object");
  refused("{\"x\":{}}", 0, "empty tensor entry");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "lacks dtype, shape or data_offsets");
  refused("{\"x\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
          "dtype is not a string");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
          "expected an integer");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
          "expected an integer");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4,
          "expected a list");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
          4, "too many entries in a list");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]}}",
          4, "dimension too large");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
          "data_offsets needs [begin, end]");
  refused("{\"__metadata__\":{\"k\":1}}", 0, "a __metadata__ value is not a string");
  refused("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
  refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ appears twice");
  refused("{\"x\":{\"dtype\":\"F32\"} trailing", 0, "bad header");
  refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} junk", 4,
          "bad header");
}
