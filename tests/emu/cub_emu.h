/*
** cub_emu.h — CUB's DeviceRadixSort::SortPairs under the CPU emulator: a stable sort of
** the pairs by the key bits [begin_bit, end_bit), as CUB's radix sort orders them (stable:
** equal keys keep their input order), on the stream (recorded when the stream is being
** captured). The temporary storage it asks for is one byte.
*/
#ifndef TT_CUB_EMU_H
#define TT_CUB_EMU_H
#include <algorithm>
#include <numeric>
#include <vector>

namespace cub {
struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                               const V *values_in, V *values_out, int n, int begin_bit = 0,
                               int end_bit = sizeof(K) * 8, cudaStream_t stream = 0) {
    if (!temp) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    const K mask = end_bit - begin_bit >= (int)sizeof(K) * 8
                       ? (K)~(K)0
                       : (K)((((K)1 << (end_bit - begin_bit)) - 1) << begin_bit);
    /* on the stream, as CUB's kernels are: recorded when it is being captured */
    tt_emu::submit(stream, [=] {
      tt_emu::DeviceWork device;
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return (keys_in[a] & mask) < (keys_in[b] & mask);
      });
      std::vector<K> k(n);
      std::vector<V> v(n);
      for (int i = 0; i < n; i++) k[i] = keys_in[order[i]], v[i] = values_in[order[i]];
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    });
    return cudaSuccess;
  }
};
}  // namespace cub

#endif
