/*
** test_tfrecord.c — TFRecord sources in the document reader: the records' text features
** come out in order; the byte space cut anywhere into ranges gives every record exactly
** once (the alignment that streams rely on); corrupted, truncated and mistyped records give errors naming the
** file and the byte offset. (Files written here; tests/data/s3.sh checks files written by
** an independent writer, the PyPI tfrecord package.)
*/
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "data/bpe_internal.h"
#include "tetra_io.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/tt_tfrecord_XXXXXX");
  cr_assert(mkdtemp(dir) != NULL);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert(system(cmd) == 0);
}

TestSuite(tfrecord, .init = setup, .fini = teardown);

static void put_varint(tt_buf *b, uint64_t v) {
  while (v >= 0x80) {
    uint8_t c = (uint8_t)(v | 0x80);
    tt_buf_append(b, &c, 1);
    v >>= 7;
  }
  uint8_t c = (uint8_t)v;
  tt_buf_append(b, &c, 1);
}

static void put_len(tt_buf *b, int field, const void *p, size_t n) {
  put_varint(b, (uint64_t)field << 3 | 2);
  put_varint(b, n);
  tt_buf_append(b, p, n);
}

/* tf.train.Example with a bytes feature `name` = text (or an int64 feature when text is
** NULL). */
static void example(tt_buf *out, const char *name, const char *text) {
  tt_buf list = {0}, feature = {0}, entry = {0}, features = {0};
  if (text) {
    put_len(&list, 1, text, strlen(text));
    put_len(&feature, 1, list.data, list.len);
  } else {
    uint8_t packed[] = {0x0a, 0x01, 0x07};   /* Int64List { value: [7] } */
    put_len(&feature, 3, packed, sizeof packed);
  }
  put_len(&entry, 1, name, strlen(name));
  put_len(&entry, 2, feature.data, feature.len);
  put_len(&features, 1, entry.data, entry.len);
  out->len = 0;
  put_len(out, 1, features.data, features.len);
  tt_buf_free(&list), tt_buf_free(&feature), tt_buf_free(&entry), tt_buf_free(&features);
}

static uint32_t masked(const void *p, size_t n) {
  uint32_t c = tt_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void frame(tt_buf *file, const tt_buf *data) {
  uint64_t n = data->len;
  uint8_t h[12];
  memcpy(h, &n, 8);   /* little-endian host */
  uint32_t c = masked(h, 8);
  memcpy(h + 8, &c, 4);
  tt_buf_append(file, h, 12);
  tt_buf_append(file, data->data, data->len);
  c = masked(data->data, data->len);
  tt_buf_append(file, &c, 4);
}

static void write_file(const char *name, const tt_buf *b, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  cr_assert(f != NULL);
  cr_assert(fwrite(b->data, 1, b->len, f) == b->len);
  fclose(f);
}

/* Documents of reader range [start, end) appended to out, one per line. */
static int read_range(const tt_doc_files *fs, int64_t start, int64_t end, tt_buf *out) {
  tt_doc_reader r;
  tt_doc_reader_init(&r, fs, "text", start, end, 0);
  const char *text;
  size_t len;
  int end_doc, got, n = 0;
  while ((got = tt_doc_reader_next(&r, &text, &len, &end_doc)) == 1) {
    cr_assert(end_doc);
    tt_buf_append(out, text, len);
    tt_buf_append(out, "\n", 1);
    n++;
  }
  tt_doc_reader_free(&r);
  return got < 0 ? -1 : n;
}

Test(tfrecord, any_cut_gives_every_record_once) {
  tt_buf file = {0}, data = {0}, expect = {0};
  char text[256];
  for (int i = 0; i < 40; i++) {
    snprintf(text, sizeof text, "record %d: %.*s", i, 3 + (i * 7) % 40,
             "the quick brown fox jumps over the lazy dog again and again");
    example(&data, "text", text);
    frame(&file, &data);
    tt_buf_printf(&expect, "%s\n", text);
  }
  char path[256];
  write_file("a.tfrecord", &file, path, sizeof path);
  tt_doc_files fs;
  cr_assert(tt_doc_files_expand(path, -1, &fs) == 0, "%s", tt_last_error());
  cr_assert_eq(fs.type, TT_DATA_TFRECORD);
  tt_buf all = {0};
  cr_assert_eq(read_range(&fs, 0, fs.total, &all), 40, "%s", tt_last_error());
  cr_assert_str_eq(all.data, expect.data);
  for (int64_t cut = 1; cut < fs.total; cut += 7) {
    tt_buf got = {0};
    int a = read_range(&fs, 0, cut, &got);
    int b = read_range(&fs, cut, fs.total, &got);
    cr_assert(a >= 0 && b >= 0, "cut %lld: %s", (long long)cut, tt_last_error());
    cr_assert_eq(a + b, 40, "cut at byte %lld: %d + %d records", (long long)cut, a, b);
    cr_assert_str_eq(got.data, expect.data, "cut at byte %lld", (long long)cut);
    tt_buf_free(&got);
  }
  tt_doc_files_free(&fs);
  tt_buf_free(&file), tt_buf_free(&data), tt_buf_free(&expect), tt_buf_free(&all);
}

Test(tfrecord, damaged_records_name_file_and_offset) {
  tt_buf file = {0}, data = {0};
  for (int i = 0; i < 3; i++) {
    example(&data, "text", "some text");
    frame(&file, &data);
  }
  size_t second = file.len / 3;
  char path[256];
  /* A flipped byte in the second record's data. */
  tt_buf bad = {0};
  tt_buf_append(&bad, file.data, file.len);
  bad.data[second + 20] ^= 0x40;
  write_file("crc.tfrecord", &bad, path, sizeof path);
  tt_doc_files fs;
  cr_assert(tt_doc_files_expand(path, -1, &fs) == 0, "%s", tt_last_error());
  tt_buf out = {0};
  cr_assert_eq(read_range(&fs, 0, fs.total, &out), -1);
  char want[400];
  snprintf(want, sizeof want, "%s: corrupt TFRecord at byte %zu (data checksum mismatch)", path, second);
  cr_assert_str_eq(tt_last_error(), want);
  tt_doc_files_free(&fs);
  /* Truncated in the last record. */
  bad.data[second + 20] ^= 0x40;
  bad.len = file.len - 5;
  write_file("short.tfrecord", &bad, path, sizeof path);
  cr_assert(tt_doc_files_expand(path, -1, &fs) == 0, "%s", tt_last_error());
  cr_assert_eq(read_range(&fs, 0, fs.total, &out), -1);
  cr_assert(strstr(tt_last_error(), "short.tfrecord: TFRecord truncated at byte") != NULL, "%s", tt_last_error());
  tt_doc_files_free(&fs);
  /* A file ending in a header whose length is huge, 3 bytes before the end (found by
  ** fuzz_tfrecord: the size check wrapped around and asked for 2^51 bytes). */
  bad.len = 0;
  tt_buf_append(&bad, file.data, second);
  {
    uint8_t h[15] = {0};
    uint64_t huge = 1ull << 51;
    memcpy(h, &huge, 8);
    uint32_t c = masked(h, 8);
    memcpy(h + 8, &c, 4);
    tt_buf_append(&bad, h, sizeof h);
  }
  write_file("tail.tfrecord", &bad, path, sizeof path);
  cr_assert(tt_doc_files_expand(path, -1, &fs) == 0, "%s", tt_last_error());
  cr_assert_eq(read_range(&fs, 0, fs.total, &out), -1);
  cr_assert(strstr(tt_last_error(), "tail.tfrecord: TFRecord truncated at byte") != NULL, "%s", tt_last_error());
  cr_assert_eq(read_range(&fs, 5, fs.total, &out), 0, "%s", tt_last_error());   /* no record starts after 5 */
  tt_doc_files_free(&fs);
  /* Not a TFRecord at all (refused when the source is opened). */
  tt_buf text = {0};
  tt_buf_printf(&text, "just some text, long enough to have a header's worth of bytes\n");
  write_file("plain.tfrecord", &text, path, sizeof path);
  cr_assert_eq(tt_doc_files_expand(path, -1, &fs), -1);
  cr_assert(strstr(tt_last_error(), "plain.tfrecord: not a TFRecord file") != NULL, "%s", tt_last_error());
  /* The text feature missing, or of the wrong kind. */
  file.len = 0;
  example(&data, "body", "text under another name");
  frame(&file, &data);
  write_file("noname.tfrecord", &file, path, sizeof path);
  cr_assert(tt_doc_files_expand(path, -1, &fs) == 0, "%s", tt_last_error());
  cr_assert_eq(read_range(&fs, 0, fs.total, &out), -1);
  cr_assert(strstr(tt_last_error(), "the record at byte 0 has no bytes feature \"text\" (set data.text_field)") != NULL,
            "%s", tt_last_error());
  tt_doc_files_free(&fs);
  file.len = 0;
  example(&data, "text", NULL);
  frame(&file, &data);
  write_file("ints.tfrecord", &file, path, sizeof path);
  cr_assert(tt_doc_files_expand(path, -1, &fs) == 0, "%s", tt_last_error());
  cr_assert_eq(read_range(&fs, 0, fs.total, &out), -1);
  cr_assert(strstr(tt_last_error(), "a float or int64 list, not bytes") != NULL, "%s", tt_last_error());
  tt_doc_files_free(&fs);
  tt_buf_free(&file), tt_buf_free(&data), tt_buf_free(&bad), tt_buf_free(&out), tt_buf_free(&text);
}
