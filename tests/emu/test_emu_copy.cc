/*
** test_emu_copy.cc — the CUDA strided copy (engine/cuda/copy.cu, its 32-bit index path)
** and the precision kernels (kernels/cuda/cast.cu: unscaling with the inf check, FP8
** quantisation with amax), run by the emulator, against references written here from
** the engine's element conversions (engine/common/dtype.c) and plain loops over the
** views' strides.
*/
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <random>
#include <vector>

#include "cuda_emu.h"
#include "tt_emu.h"
extern "C" {
#include "kernel.h"
#include "tetra.h"
#include "tt_cuda_ops.h"
int tt_cuda_copy_strided(tt_tensor *dst, const tt_tensor *src);
const char *tt_last_error(void);
}

/* As engine/core/tensor.c gives it for a tensor already drawn: the storage's data at the
** tensor's offset. The copy reads its tensors' data through it. */
extern "C" void *tt_tensor_data(const tt_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)tt_dtype_size(t->dtype);
}

namespace {

std::mt19937_64 rng(7);

/* One element of dtype at p[i] as a double, and back (the engine's conversions). */
double get(const void *p, int dtype, int64_t i) {
  switch (dtype) {
    case TT_F32: return ((const float *)p)[i];
    case TT_BF16: return tt_bf16_to_float(((const uint16_t *)p)[i]);
    case TT_F16: return tt_f16_to_float(((const uint16_t *)p)[i]);
    case TT_E4M3:
    case TT_E5M2: return tt_fp8_to_float(((const uint8_t *)p)[i], dtype);
    case TT_I32: return ((const int32_t *)p)[i];
    default: return (double)((const int64_t *)p)[i];
  }
}

void put(void *p, int dtype, int64_t i, double v) {
  switch (dtype) {
    case TT_F32: ((float *)p)[i] = (float)v; break;
    case TT_BF16: ((uint16_t *)p)[i] = tt_float_to_bf16((float)v); break;
    case TT_F16: ((uint16_t *)p)[i] = tt_float_to_f16((float)v); break;
    case TT_E4M3:
    case TT_E5M2: ((uint8_t *)p)[i] = tt_float_to_fp8((float)v, dtype); break;
    case TT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: ((int64_t *)p)[i] = (int64_t)v; break;
  }
}

/* A view on "device" memory: its own storage, shape, strides and offset. */
struct View {
  tt_storage st = {};
  tt_tensor t = {};
  View(int dtype, int64_t elems, int ndim, const int64_t *shape, const int64_t *stride,
       int64_t offset) {
    st.nbytes = (size_t)elems * tt_dtype_size(dtype);
    st.data = tt_emu::alloc(st.nbytes);
    t.storage = &st;
    t.offset = offset;
    t.ndim = ndim;
    for (int d = 0; d < ndim; d++) t.shape[d] = shape[d], t.stride[d] = stride[d];
    t.dtype = dtype;
    t.device = 0;
  }
  ~View() { tt_emu::release(st.data); }
};

/* Offsets of every element of the row-major index space of shape, under stride. */
std::vector<int64_t> offsets(int ndim, const int64_t *shape, const int64_t *stride,
                             int64_t offset) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; i++) {
    int64_t rest = i, off = offset;
    for (int d = ndim - 1; d >= 0; d--) {
      off += rest % shape[d] * stride[d];
      rest /= shape[d];
    }
    r[i] = off;
  }
  return r;
}

struct Case {
  const char *name;
  int ndim;
  int64_t shape[4];
  int64_t src_stride[4], src_offset, src_elems;
  int64_t dst_stride[4], dst_offset, dst_elems;
};

}  // namespace

Test(emu, strided_copy) {
  const Case cases[] = {
    /* a transpose of the last two dimensions of (2, 3, 5, 7) into a contiguous tensor */
    {"transpose", 4, {2, 3, 7, 5}, {105, 35, 1, 7}, 0, 210, {105, 35, 5, 1}, 0, 210},
    /* a slice (every other row, from row 1) of a (9, 11) tensor */
    {"slice", 2, {4, 6}, {22, 1}, 13, 99, {6, 1}, 0, 24},
    /* a broadcast source (stride 0) into a strided destination with an offset */
    {"broadcast", 3, {3, 4, 5}, {0, 5, 1}, 0, 20, {40, 10, 1}, 3, 130},
    /* contiguous on both sides: one run */
    {"contiguous", 2, {17, 33}, {33, 1}, 0, 561, {33, 1}, 0, 561},
    /* a column of a (40, 3) tensor: one dimension, stride 3 */
    {"column", 1, {40}, {3}, 2, 120, {1}, 0, 40},
  };
  const int pairs[][2] = {
    {TT_F32, TT_F32}, {TT_BF16, TT_BF16}, {TT_E4M3, TT_E4M3}, {TT_I64, TT_I64},
    {TT_BF16, TT_F32}, {TT_F32, TT_BF16}, {TT_F16, TT_F32}, {TT_F32, TT_F16},
    {TT_E4M3, TT_F32}, {TT_F32, TT_E5M2}, {TT_F32, TT_I64}, {TT_I32, TT_F32},
    {TT_BF16, TT_E4M3},
  };
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (const Case &c : cases)
    for (auto &p : pairs) {
      const int dt = p[0], sdt = p[1];
      char what[96];
      snprintf(what, sizeof what, "%s, %s from %s", c.name, tt_dtype_name(dt),
               tt_dtype_name(sdt));
      View src(sdt, c.src_elems, c.ndim, c.shape, c.src_stride, c.src_offset);
      View dst(dt, c.dst_elems, c.ndim, c.shape, c.dst_stride, c.dst_offset);
      /* source values that every dtype of the pair holds exactly or rounds once */
      std::vector<char> sv(src.st.nbytes);
      for (int64_t i = 0; i < c.src_elems; i++) {
        const double v = (sdt == TT_I32 || sdt == TT_I64 || dt == TT_I32 || dt == TT_I64)
                             ? (double)(int)nd(rng)
                             : (double)nd(rng);
        put(sv.data(), sdt, i, v);
      }
      memcpy(src.st.data, sv.data(), sv.size());
      std::vector<char> dv(dst.st.nbytes, (char)0x5a);   /* what the copy must not touch */
      memcpy(dst.st.data, dv.data(), dv.size());
      cr_assert_eq(tt_cuda_copy_strided(&dst.t, &src.t), 0, "%s: %s", what, tt_last_error());
      const std::string guards = tt_emu::check_guards();
      cr_assert(guards.empty(), "%s: %s", what, guards.c_str());
      const std::vector<int64_t> so = offsets(c.ndim, c.shape, c.src_stride, c.src_offset);
      const std::vector<int64_t> dof = offsets(c.ndim, c.shape, c.dst_stride, c.dst_offset);
      for (size_t i = 0; i < so.size(); i++) put(dv.data(), dt, dof[i], get(sv.data(), sdt, so[i]));
      size_t diff = 0, first = 0;
      for (size_t b = 0; b < dv.size(); b++)
        if (dv[b] != ((char *)dst.st.data)[b] && diff++ == 0) first = b;
      cr_expect(diff == 0, "%s: %zu of %zu bytes differ from the reference (first at byte %zu)",
                what, diff, dv.size(), first);
    }
}

Test(emu, unscale_and_fp8) {
  const int64_t n = 4099;
  std::normal_distribution<float> nd(0.0f, 30.0f);
  std::vector<float> x(n);
  for (auto &v : x) v = nd(rng);
  for (int dt : {TT_F32, TT_BF16, TT_F16})
    for (int bad = 0; bad < 2; bad++) {
      const size_t es = tt_dtype_size(dt);
      std::vector<char> h(n * es), want(n * es);
      for (int64_t i = 0; i < n; i++) put(h.data(), dt, i, x[i]);
      if (bad) put(h.data(), dt, 1234, INFINITY);
      for (int64_t i = 0; i < n; i++) put(want.data(), dt, i, (float)get(h.data(), dt, i) * 0.125f);
      void *d = tt_emu::alloc(h.size());
      memcpy(d, h.data(), h.size());
      int found = 0;
      cr_assert_eq(tt_cuda_unscale_check(d, dt, n, 0.125f, &found), 0, "%s", tt_last_error());
      cr_expect_eq(found, bad, "unscale_check %s: found_inf %d, want %d", tt_dtype_name(dt),
                   found, bad);
      cr_expect(memcmp(d, want.data(), h.size()) == 0, "unscale_check %s: values",
                tt_dtype_name(dt));
      /* the flag left on the device, with the scale from the device */
      memcpy(d, h.data(), h.size());
      float *dev = (float *)tt_emu::alloc(2 * sizeof(float));
      dev[0] = 0.0f, dev[1] = 0.125f;
      cr_assert_eq(tt_cuda_unscale_flag_dev(d, dt, n, dev + 1, dev), 0, "%s", tt_last_error());
      cr_expect_eq(dev[0], bad ? 1.0f : 0.0f, "unscale_flag_dev %s: found_inf %g",
                   tt_dtype_name(dt), dev[0]);
      cr_expect(memcmp(d, want.data(), h.size()) == 0, "unscale_flag_dev %s: values",
                tt_dtype_name(dt));
      tt_emu::release(dev);
      tt_emu::release(d);
    }
  /* FP8: the bytes of the engine's own rounding (tt_float_to_fp8), amax = max |x|, and the
  ** fake-quantised f32 values */
  for (int f8 : {TT_E4M3, TT_E5M2})
    for (int dt : {TT_F32, TT_BF16}) {
      const float scale = f8 == TT_E4M3 ? 448.0f / 100.0f : 2.0f;
      const size_t es = tt_dtype_size(dt);
      std::vector<char> h(n * es);
      for (int64_t i = 0; i < n; i++) put(h.data(), dt, i, x[i]);
      void *d = tt_emu::alloc(h.size());
      memcpy(d, h.data(), h.size());
      uint8_t *q = (uint8_t *)tt_emu::alloc(n);
      float amax = 0, want_amax = 0;
      cr_assert_eq(tt_cuda_fp8_quantize(d, dt, n, scale, f8, 0, q, &amax), 0, "%s",
                   tt_last_error());
      size_t diff = 0;
      int64_t first = -1;
      for (int64_t i = 0; i < n; i++) {
        const float v = (float)get(h.data(), dt, i);
        want_amax = fmaxf(want_amax, fabsf(v));
        if (q[i] != tt_float_to_fp8(v * scale, f8) && diff++ == 0) first = i;
      }
      cr_expect(diff == 0, "fp8 quantize %s from %s: %zu of %ld bytes differ (first %ld: %g -> "
                "0x%02x, want 0x%02x)", tt_dtype_name(f8), tt_dtype_name(dt), diff, (long)n,
                (long)first, first < 0 ? 0.0 : get(h.data(), dt, first) * scale,
                first < 0 ? 0 : q[first],
                first < 0 ? 0 : tt_float_to_fp8((float)get(h.data(), dt, first) * scale, f8));
      cr_expect_eq(amax, want_amax, "fp8 amax %g, want %g", amax, want_amax);
      float *fake = (float *)tt_emu::alloc(n * sizeof(float));
      cr_assert_eq(tt_cuda_fp8_quantize(d, dt, n, scale, f8, 1, fake, &amax), 0, "%s",
                   tt_last_error());
      float *back = (float *)tt_emu::alloc(n * sizeof(float));
      cr_assert_eq(tt_cuda_fp8_dequantize(q, f8, n, scale, back), 0, "%s", tt_last_error());
      diff = 0;
      for (int64_t i = 0; i < n; i++) {
        const float w = tt_fp8_to_float(q[i], f8) * (1.0f / scale);
        diff += fake[i] != w || back[i] != w;
      }
      cr_expect(diff == 0, "fp8 fake quantize / dequantize %s: %zu values differ",
                tt_dtype_name(f8), diff);
      for (void *p : {d, (void *)q, (void *)fake, (void *)back}) tt_emu::release(p);
    }
}
