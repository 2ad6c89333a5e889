/* CRC-32C (engine/io/checksum.c) against RFC 3720's test vectors, chunked = whole, a
** file's checksum equals its bytes', and so do its blocks' and any range's. */
#include "tt_test.h"
#include "tetra_io.h"
#include <unistd.h>

Test(checksum, rfc3720_vectors) {
  uint8_t buf[32];
  cr_assert_eq(tt_crc32c(0, "123456789", 9), 0xE3069283u);
  memset(buf, 0, sizeof buf);
  cr_assert_eq(tt_crc32c(0, buf, 32), 0x8A9136AAu);
  memset(buf, 0xFF, sizeof buf);
  cr_assert_eq(tt_crc32c(0, buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
  cr_assert_eq(tt_crc32c(0, buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
  cr_assert_eq(tt_crc32c(0, buf, 32), 0x113FDB5Cu);
}

Test(checksum, chunked_equals_whole_and_files_match) {
  uint8_t data[1000];
  for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 37 + 11);
  uint32_t whole = tt_crc32c(0, data, sizeof data);
  for (size_t cut = 0; cut <= sizeof data; cut += 97) {
    uint32_t c = tt_crc32c(0, data, cut);
    cr_assert_eq(tt_crc32c(c, data + cut, sizeof data - cut), whole, "cut at %zu", cut);
  }
  char path[] = "/tmp/tt_crc_XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, data, sizeof data), (ssize_t)sizeof data);
  close(fd);
  uint32_t fc = 0;
  cr_assert_eq(tt_crc32c_file(path, &fc), 0);
  cr_assert_eq(fc, whole);
  unlink(path);
  cr_assert_neq(tt_crc32c_file(path, &fc), 0);
  cr_assert(strstr(tt_last_error(), path));
}

/* A file of 10,000 bytes in blocks of 4096: two whole blocks and one of 1808 bytes, each
** the CRC of those bytes, the whole file's as well; ranges likewise; a wrong block count
** or a range past the end is an error. The block size grows with the file, 4 KiB to
** 4 MiB, about 1024 blocks a file. */
Test(checksum, blocks_and_ranges_of_a_file) {
  enum { N = 10000 };
  static uint8_t data[N];
  for (int i = 0; i < N; i++) data[i] = (uint8_t)(i * 131 + (i >> 8));
  char path[] = "/tmp/tt_crc_blocks_XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, data, N), (ssize_t)N);
  close(fd);
  uint32_t whole = 0, sums[3] = {0};
  cr_assert_eq(tt_crc32c_file_blocks(path, 4096, &whole, sums, 3), 0, "%s", tt_last_error());
  cr_assert_eq(whole, tt_crc32c(0, data, N));
  cr_assert_eq(sums[0], tt_crc32c(0, data, 4096));
  cr_assert_eq(sums[1], tt_crc32c(0, data + 4096, 4096));
  cr_assert_eq(sums[2], tt_crc32c(0, data + 8192, N - 8192));
  cr_assert_neq(tt_crc32c_file_blocks(path, 4096, &whole, sums, 2), 0);
  cr_assert_neq(tt_crc32c_file_blocks(path, 4096, &whole, sums, 4), 0);
  uint32_t r = 0;
  cr_assert_eq(tt_crc32c_file_range(path, 4095, 3000, &r), 0, "%s", tt_last_error());
  cr_assert_eq(r, tt_crc32c(0, data + 4095, 3000));
  cr_assert_eq(tt_crc32c_file_range(path, 8192, N - 8192, &r), 0);
  cr_assert_eq(r, sums[2]);
  cr_assert_neq(tt_crc32c_file_range(path, 8192, 4096, &r), 0);
  cr_assert(strstr(tt_last_error(), "ends before byte 12288"), "%s", tt_last_error());
  unlink(path);
  cr_assert_eq(tt_checksum_block(0), 4096u);
  cr_assert_eq(tt_checksum_block(10000), 4096u);
  cr_assert_eq(tt_checksum_block(10u << 20), 16384u);   /* 10 MiB: 640 blocks */
  cr_assert_eq(tt_checksum_block(100ull << 30), 4u << 20);   /* 100 GiB: capped */
}

/* tt_safetensors_save_summed takes the sums as it writes: they must be the written file's,
** whole and block by block (tt_crc32c_file_blocks reads it back here), for files of one
** block, of a few with the tensors' bytes across their edges, and of 5 MB (blocks of 8
** KiB), with a strided view and a bf16 tensor among the tensors; a failed save leaves no
** sums to free. */
Test(checksum, summed_save_equals_its_file) {
  const int64_t sizes[][2] = {{3, 5}, {37, 111}, {1024, 1300}};
  for (int c = 0; c < 3; c++) {
    tt_tensor *a = NULL, *at = NULL, *b = NULL, *h = NULL;
    int64_t one[1] = {sizes[c][0] * 7 + 1};
    cr_assert_eq(tt_tensor_randn(sizes[c], 2, 0.0, 1.0, &a), 0);
    cr_assert_eq(tt_transpose(a, 0, 1, &at), 0);   /* written through a contiguous copy */
    cr_assert_eq(tt_tensor_randn(one, 1, 0.0, 1.0, &b), 0);
    cr_assert_eq(tt_cast(b, TT_BF16, &h), 0);
    const char *names[] = {"a.t", "b", "b.bf16"};
    tt_tensor *ts[] = {at, b, h};
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    char path[] = "/tmp/tt_crc_summed_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    tt_file_sums s;
    cr_assert_eq(tt_safetensors_save_summed(path, names, ts, 3, mk, mv, 1, &s), 0, "%s",
                 tt_last_error());
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    uint64_t size = (uint64_t)ftell(f);
    fclose(f);
    cr_assert_eq(s.block, tt_checksum_block(size));
    cr_assert_eq(s.n_blocks, (int64_t)((size + s.block - 1) / s.block), "case %d", c);
    uint32_t whole = 0, *back = calloc((size_t)s.n_blocks, sizeof *back);
    cr_assert_eq(tt_crc32c_file_blocks(path, s.block, &whole, back, s.n_blocks), 0, "%s",
                 tt_last_error());
    cr_assert_eq(s.crc, whole, "case %d: the whole file's CRC", c);
    for (int64_t k = 0; k < s.n_blocks; k++)
      cr_assert_eq(s.sums[k], back[k], "case %d (%llu bytes): block %lld of %lld", c,
                   (unsigned long long)size, (long long)k, (long long)s.n_blocks);
    if (c == 2) cr_assert_gt(s.n_blocks, 500, "5 MB in blocks of %llu", (unsigned long long)s.block);
    free(back);
    tt_file_sums_free(&s);
    cr_assert_null(s.sums);
    unlink(path);
    tt_tensor_release(a);
    tt_tensor_release(at);
    tt_tensor_release(b);
    tt_tensor_release(h);
  }
  tt_tensor *x = NULL;
  int64_t n = 4;
  cr_assert_eq(tt_tensor_randn(&n, 1, 0.0, 1.0, &x), 0);
  const char *name = "x";
  tt_file_sums s = {1, 1, 1, (uint32_t *)&s};
  cr_assert_neq(tt_safetensors_save_summed("/nonexistent-dir/x.safetensors", &name, &x, 1,
                                           NULL, NULL, 0, &s), 0);
  cr_assert_null(s.sums, "a failed save left sums");
  tt_tensor_release(x);
}
