/*
** safetensors reading and writing (engine/io/safetensors.c) against a file written by
** PyTorch + safetensors (tests/fixtures/gen_safetensors_mixed.py) and against
** hand-written headers.
*/
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tetra.h"
#include "tetra_io.h"

#define FIXTURE TETRA_SOURCE_DIR "/tests/fixtures/safetensors_mixed.safetensors"

static tt_safetensors *open_ok(const char *path) {
  tt_safetensors *f = NULL;
  int rc = tt_safetensors_open(path, &f);
  cr_assert_eq(rc, 0, "open %s: %s", path, tt_last_error());
  return f;
}

static tt_tensor *read_ok(tt_safetensors *f, const char *name) {
  tt_tensor *t = NULL;
  cr_assert_eq(tt_safetensors_read(f, name, &t), 0, "%s: %s", name, tt_last_error());
  return t;
}

/* Writes an arbitrary header + data (for malformed files). */
static void write_raw(const char *path, const char *header, const void *data, size_t n) {
  FILE *fp = fopen(path, "wb");
  cr_assert(fp);
  uint64_t len = strlen(header);
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
  fwrite(le, 1, 8, fp);
  fwrite(header, 1, len, fp);
  if (n) fwrite(data, 1, n, fp);
  fclose(fp);
}

static void tmp_path(char *buf, size_t n, const char *tag) {
  snprintf(buf, n, "/tmp/tetra_test_st_%d_%s.safetensors", (int)getpid(), tag);
}

Test(safetensors, reads_pytorch_file) {
  tt_safetensors *f = open_ok(FIXTURE);
  cr_assert_eq(tt_safetensors_count(f), 7);

  int dtype, ndim;
  int64_t shape[TT_MAX_DIMS];
  int i = tt_safetensors_find(f, "f32.matrix");
  cr_assert(i >= 0);
  cr_assert_eq(tt_safetensors_info(f, i, &dtype, shape, &ndim), 0);
  cr_assert_eq(dtype, TT_F32);
  cr_assert_eq(ndim, 2);
  cr_assert(shape[0] == 2 && shape[1] == 3);

  tt_tensor *m = read_ok(f, "f32.matrix");
  for (int k = 0; k < 6; k++) cr_assert_eq(tt_tensor_get(m, k), k * 0.5 - 1.0);
  tt_tensor_release(m);

  /* bf16 / f16 hold exactly the rounded values torch stored. */
  const double bf16_ref[4] = {1.0, -2.5, 3.140625, 0.00099945068359375};
  tt_tensor *b = read_ok(f, "bf16.vector");
  cr_assert_eq(b->dtype, TT_BF16);
  for (int k = 0; k < 4; k++) cr_assert_eq(tt_tensor_get(b, k), bf16_ref[k]);
  tt_tensor_release(b);

  const double f16_ref[4] = {0.0999755859375, -65504.0, 6.097555160522461e-05, 2.0};
  tt_tensor *h = read_ok(f, "f16.matrix");
  cr_assert_eq(h->dtype, TT_F16);
  for (int k = 0; k < 4; k++) cr_assert_eq(tt_tensor_get(h, k), f16_ref[k]);
  tt_tensor_release(h);

  tt_tensor *ids = read_ok(f, "i64.ids");
  cr_assert_eq(ids->dtype, TT_I64);
  const int64_t *iv = tt_tensor_data(ids);
  cr_assert_eq(iv[0], ((int64_t)1 << 40) + 1);
  cr_assert_eq(iv[1], -5);
  cr_assert_eq(iv[2], 7);
  tt_tensor_release(ids);

  tt_tensor *i32 = read_ok(f, "i32.ids");
  const int32_t *jv = tt_tensor_data(i32);
  cr_assert(jv[0] == 1 && jv[1] == -2 && jv[2] == 3 && jv[3] == 2147483647);
  tt_tensor_release(i32);

  tt_tensor *s = read_ok(f, "scalar");
  cr_assert_eq(s->ndim, 0);
  cr_assert_eq(tt_tensor_get(s, 0), 42.25);
  tt_tensor_release(s);

  /* The name with JSON escapes decodes to the original text. */
  cr_assert(tt_safetensors_find(f, "layers.0.\"quoted\"\\name") >= 0);

  cr_assert_eq(tt_safetensors_metadata_count(f), 2);
  cr_assert_str_eq(tt_safetensors_metadata_get(f, "format"), "pt");
  cr_assert_str_eq(tt_safetensors_metadata_get(f, "note"), "h\xc3\xa9llo \"x\"");
  cr_assert_null(tt_safetensors_metadata_get(f, "absent"));
  tt_safetensors_close(f);
}

Test(safetensors, read_into_casts_and_checks_shape) {
  tt_safetensors *f = open_ok(FIXTURE);
  int64_t shape4[1] = {4};
  tt_tensor *dst;
  cr_assert_eq(tt_tensor_zeros(shape4, 1, TT_F32, TT_CPU, &dst), 0);
  cr_assert_eq(tt_safetensors_read_into(f, "bf16.vector", dst), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_get(dst, 2), 3.140625);
  cr_assert_eq(tt_tensor_get(dst, 1), -2.5);

  int64_t shape3[1] = {3};
  tt_tensor *wrong;
  cr_assert_eq(tt_tensor_zeros(shape3, 1, TT_F32, TT_CPU, &wrong), 0);
  cr_assert_eq(tt_safetensors_read_into(f, "bf16.vector", wrong), -1);
  cr_assert(strstr(tt_last_error(), "[4]") && strstr(tt_last_error(), "[3]"), "%s",
            tt_last_error());
  cr_assert_eq(tt_safetensors_read_into(f, "nope", dst), -1);
  cr_assert(strstr(tt_last_error(), "no tensor 'nope'"), "%s", tt_last_error());
  tt_tensor_release(dst);
  tt_tensor_release(wrong);
  tt_safetensors_close(f);
}

Test(safetensors, save_round_trip_strided_and_typed) {
  char path[128];
  tmp_path(path, sizeof path, "rt");
  /* a: (2, 3) f32, saved through its transpose (a strided view) -> (3, 2). */
  double av[6] = {1, 2, 3, 4, 5, 6};
  int64_t s23[2] = {2, 3};
  tt_tensor *a, *at, *ids, *half;
  cr_assert_eq(tt_tensor_from_f64(av, s23, 2, TT_F32, &a), 0);
  cr_assert_eq(tt_transpose(a, 0, 1, &at), 0);
  double idv[2] = {-3, 123456789012.0};
  int64_t s2[1] = {2};
  cr_assert_eq(tt_tensor_from_f64(idv, s2, 1, TT_I64, &ids), 0);
  cr_assert_eq(tt_cast(a, TT_BF16, &half), 0);

  const char *names[3] = {"w.t", "ids", "w.bf16"};
  tt_tensor *ts[3] = {at, ids, half};
  const char *mk[1] = {"step"};
  const char *mv[1] = {"12\n\"x\""};
  cr_assert_eq(tt_safetensors_save(path, names, ts, 3, mk, mv, 1), 0, "%s", tt_last_error());
  cr_assert_neq(access(path, F_OK), -1);

  /* The data starts 8-aligned, as the Python writer lays it out. */
  FILE *fp = fopen(path, "rb");
  uint8_t le[8];
  cr_assert_eq(fread(le, 1, 8, fp), 8);
  fclose(fp);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | le[i];
  cr_assert_eq(hlen % 8, 0);

  tt_safetensors *f = open_ok(path);
  cr_assert_eq(tt_safetensors_count(f), 3);
  cr_assert_str_eq(tt_safetensors_name(f, 0), "w.t");
  tt_tensor *r = read_ok(f, "w.t");
  cr_assert(r->shape[0] == 3 && r->shape[1] == 2);
  const double expect_t[6] = {1, 4, 2, 5, 3, 6};
  for (int k = 0; k < 6; k++) cr_assert_eq(tt_tensor_get(r, k), expect_t[k]);
  tt_tensor *ri = read_ok(f, "ids");
  cr_assert_eq(((int64_t *)tt_tensor_data(ri))[1], 123456789012LL);
  tt_tensor *rb = read_ok(f, "w.bf16");
  cr_assert_eq(rb->dtype, TT_BF16);
  for (int k = 0; k < 6; k++) cr_assert_eq(tt_tensor_get(rb, k), av[k]);
  cr_assert_str_eq(tt_safetensors_metadata_get(f, "step"), "12\n\"x\"");
  tt_tensor_release(r);
  tt_tensor_release(ri);
  tt_tensor_release(rb);
  tt_safetensors_close(f);

  /* Duplicate names are refused and leave no file behind. */
  char dup[128];
  tmp_path(dup, sizeof dup, "dup");
  const char *dn[2] = {"x", "x"};
  tt_tensor *dts[2] = {a, a};
  cr_assert_eq(tt_safetensors_save(dup, dn, dts, 2, NULL, NULL, 0), -1);
  cr_assert(strstr(tt_last_error(), "duplicate"), "%s", tt_last_error());
  cr_assert_eq(access(dup, F_OK), -1);

  unlink(path);
  tt_tensor_release(a);
  tt_tensor_release(at);
  tt_tensor_release(ids);
  tt_tensor_release(half);
}

Test(safetensors, escapes_and_unknown_fields) {
  char path[128];
  tmp_path(path, sizeof path, "esc");
  /* \u00e9 -> U+00E9, \ud83d\ude00 -> U+1F600 (a surrogate pair), plus a field to skip. */
  const char *header =
    "{\"caf\\u00e9\\ud83d\\ude00\": {\"dtype\": \"F32\", \"shape\": [2],"
    " \"extra\": {\"a\": [1, 2.5, true, null]}, \"data_offsets\": [0, 8]},"
    " \"skip_me\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [8, 16]}}";
  float vals[4] = {1.5f, -2.0f, 0, 0};
  write_raw(path, header, vals, 16);
  tt_safetensors *f = open_ok(path);
  int i = tt_safetensors_find(f, "caf\xc3\xa9\xf0\x9f\x98\x80");
  cr_assert(i >= 0);
  tt_tensor *t = read_ok(f, tt_safetensors_name(f, i));
  cr_assert_eq(tt_tensor_get(t, 0), 1.5);
  cr_assert_eq(tt_tensor_get(t, 1), -2.0);
  tt_tensor_release(t);
  /* An F64 tensor is listed (dtype -1) but cannot be loaded. */
  int dtype = 0;
  cr_assert_eq(tt_safetensors_info(f, tt_safetensors_find(f, "skip_me"), &dtype, NULL, NULL), 0);
  cr_assert_eq(dtype, -1);
  tt_tensor *bad = NULL;
  cr_assert_eq(tt_safetensors_read(f, "skip_me", &bad), -1);
  cr_assert(strstr(tt_last_error(), "F64"), "%s", tt_last_error());
  tt_safetensors_close(f);
  unlink(path);
}

Test(safetensors, malformed_files_fail_with_a_message) {
  char path[128];
  tmp_path(path, sizeof path, "bad");
  tt_safetensors *f = NULL;

  /* Offsets past the data. */
  float v[2] = {0};
  write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", v, 8);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "outside"), "%s", tt_last_error());
  cr_assert_null(f);

  /* Byte count disagreeing with shape x dtype. */
  write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", v, 8);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "need 12"), "%s", tt_last_error());

  /* Bytes after the last tensor (appended to, or a doctored header): refused, as the
  ** reference implementation refuses them. */
  write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", v, 8);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "4 bytes follow the last tensor"), "%s", tt_last_error());

  /* Broken JSON. */
  write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2", v, 8);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "bad header"), "%s", tt_last_error());

  /* Header length beyond the file. */
  FILE *fp = fopen(path, "wb");
  uint8_t le[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
  fwrite(le, 1, 8, fp);
  fclose(fp);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "exceeds the file"), "%s", tt_last_error());

  cr_assert_eq(tt_safetensors_open("/nonexistent/x.safetensors", &f), -1);
  cr_assert(strstr(tt_last_error(), "cannot open"), "%s", tt_last_error());
  unlink(path);
}

Test(safetensors, shape_overflowing_64_bits_is_refused) {
  char path[128];
  tmp_path(path, sizeof path, "overflow");
  tt_safetensors *f = NULL;
  float v[2] = {0};

  /* Fuzzer reproducer: 4611686018427387906 f32 elements are 2^64 + 8 bytes, which wrapped
  ** to the 8 bytes present; reading the tensor then ran far past them. */
  write_raw(path,
            "{\"huge\":{\"dtype\":\"F32\",\"shape\":[4611686018427387906],"
            "\"data_offsets\":[0,8]}}", v, 8);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert_null(f);
  cr_assert(strstr(tt_last_error(), "tensor 'huge'") && strstr(tt_last_error(), "overflow"),
            "%s", tt_last_error());

  /* The element count itself wraps: 2^32 * 2^32 * 3 is 0 modulo 2^64, as is its byte size. */
  write_raw(path,
            "{\"wrap\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296,3],"
            "\"data_offsets\":[0,0]}}", NULL, 0);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "tensor 'wrap'") && strstr(tt_last_error(), "overflow"),
            "%s", tt_last_error());

  /* A dtype Tetra cannot load is still listed with its shape, so the shape is checked too. */
  write_raw(path,
            "{\"odd\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,3],"
            "\"data_offsets\":[0,8]}}", v, 8);
  cr_assert_eq(tt_safetensors_open(path, &f), -1);
  cr_assert(strstr(tt_last_error(), "tensor 'odd'") && strstr(tt_last_error(), "overflow"),
            "%s", tt_last_error());
  unlink(path);
}

/* read_box against the whole tensor read and indexed here, for every box of the
** fixture's f32 (2, 3) matrix and i32 (2, 2) ids; box_span names the bytes from the box's
** first element to its last; a bf16 box read into f32 is cast. */
Test(safetensors, read_box_takes_every_box_element_by_element) {
  tt_safetensors *f = open_ok(FIXTURE);
  const char *names[] = {"f32.matrix", "i32.ids"};
  for (int which = 0; which < 2; which++) {
    const char *name = names[which];
    int dtype, ndim;
    int64_t shape[TT_MAX_DIMS];
    cr_assert_eq(tt_safetensors_info(f, tt_safetensors_find(f, name), &dtype, shape, &ndim), 0);
    tt_tensor *whole = read_ok(f, name);
    uint64_t tensor_begin, tensor_end;
    int64_t all_lo[2] = {0, 0};
    cr_assert_eq(tt_safetensors_box_span(f, name, all_lo, shape, &tensor_begin, &tensor_end), 0);
    cr_assert_eq(tensor_end - tensor_begin,
                 (uint64_t)(shape[0] * shape[1]) * tt_dtype_size(dtype));
    for (int64_t r0 = 0; r0 < shape[0]; r0++)
      for (int64_t r1 = r0 + 1; r1 <= shape[0]; r1++)
        for (int64_t c0 = 0; c0 < shape[1]; c0++)
          for (int64_t c1 = c0 + 1; c1 <= shape[1]; c1++) {
            int64_t lo[2] = {r0, c0}, hi[2] = {r1, c1}, box[2] = {r1 - r0, c1 - c0};
            tt_tensor *dst;
            cr_assert_eq(tt_tensor_full(box, 2, dtype, TT_CPU, 99.0, &dst), 0);
            cr_assert_eq(tt_safetensors_read_box(f, name, lo, hi, dst), 0, "%s",
                         tt_last_error());
            for (int64_t i = 0; i < box[0]; i++)
              for (int64_t j = 0; j < box[1]; j++)
                cr_assert_eq(tt_tensor_get(dst, i * box[1] + j),
                             tt_tensor_get(whole, (r0 + i) * shape[1] + c0 + j),
                             "%s box [%lld:%lld, %lld:%lld] at (%lld, %lld)", name,
                             (long long)r0, (long long)r1, (long long)c0, (long long)c1,
                             (long long)i, (long long)j);
            uint64_t b, e, es = tt_dtype_size(dtype);
            cr_assert_eq(tt_safetensors_box_span(f, name, lo, hi, &b, &e), 0);
            cr_assert_eq(b, tensor_begin + (uint64_t)(r0 * shape[1] + c0) * es);
            cr_assert_eq(e, tensor_begin + (uint64_t)((r1 - 1) * shape[1] + c1) * es);
            tt_tensor_release(dst);
          }
    tt_tensor_release(whole);
  }
  int64_t vlo[1] = {1}, vhi[1] = {3}, two[1] = {2};
  tt_tensor *cast;
  cr_assert_eq(tt_tensor_zeros(two, 1, TT_F32, TT_CPU, &cast), 0);
  cr_assert_eq(tt_safetensors_read_box(f, "bf16.vector", vlo, vhi, cast), 0, "%s",
               tt_last_error());
  cr_assert_eq(tt_tensor_get(cast, 0), -2.5);
  cr_assert_eq(tt_tensor_get(cast, 1), 3.140625);
  tt_tensor_release(cast);
  /* Out of range, empty, or a destination of another shape: refused. */
  int64_t lo[2] = {0, 1}, hi[2] = {2, 4}, empty_hi[2] = {2, 1}, ok_hi[2] = {2, 3};
  int64_t two_two[2] = {2, 2}, zero_lo[2] = {0, 0};
  tt_tensor *dst;
  cr_assert_eq(tt_tensor_zeros(two_two, 2, TT_F32, TT_CPU, &dst), 0);
  cr_assert_eq(tt_safetensors_read_box(f, "f32.matrix", lo, hi, dst), -1);
  cr_assert(strstr(tt_last_error(), "[1, 4) of dim 1, which has 3"), "%s", tt_last_error());
  cr_assert_eq(tt_safetensors_read_box(f, "f32.matrix", lo, empty_hi, dst), -1);
  cr_assert_eq(tt_safetensors_read_box(f, "f32.matrix", zero_lo, ok_hi, dst), -1);
  cr_assert(strstr(tt_last_error(), "not shaped like the box"), "%s", tt_last_error());
  tt_tensor_release(dst);
  tt_safetensors_close(f);
}

/* A tensor whose bytes are not aligned to its element size (an f32 after three f16s):
** read_box reads it right all the same. */
Test(safetensors, read_box_of_unaligned_bytes) {
  char path[128];
  tmp_path(path, sizeof path, "unaligned");
  /* header padded with spaces so the data starts at a multiple of 8 */
  char header[256];
  snprintf(header, sizeof header, "%s",
           "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
           "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[6,22]}}");
  while ((8 + strlen(header)) % 8) strcat(header, " ");
  uint8_t data[22] = {0};
  float w[4] = {1.5f, -2.0f, 3.25f, 8.0f};
  memcpy(data + 6, w, sizeof w);
  write_raw(path, header, data, sizeof data);
  tt_safetensors *f = open_ok(path);
  int64_t lo[2] = {0, 1}, hi[2] = {2, 2}, box[2] = {2, 1};
  tt_tensor *dst;
  cr_assert_eq(tt_tensor_zeros(box, 2, TT_F32, TT_CPU, &dst), 0);
  cr_assert_eq(tt_safetensors_read_box(f, "w", lo, hi, dst), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_get(dst, 0), -2.0);
  cr_assert_eq(tt_tensor_get(dst, 1), 8.0);
  tt_tensor_release(dst);
  tt_safetensors_close(f);
  unlink(path);
}
