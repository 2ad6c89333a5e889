/* CRC-32C (engine/io/checksum.c) against RFC 3720's test vectors, chunked = whole, and a
** file's checksum equals its bytes'. */
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
