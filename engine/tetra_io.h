/*
** tetra_io.h — safetensors files (engine/io/safetensors.c).
**
** Format (huggingface/safetensors): 8 bytes little-endian header length N, N bytes of
** JSON { name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
** "__metadata__": {string: string} }, then the raw little-endian tensor bytes, offsets
** relative to the end of the header. Dtypes: F32, BF16, F16, F8_E4M3, F8_E5M2, I32, I64.
**
** Flat C only: lua/tetra/ffi.lua feeds this header to ffi.cdef.
*/
#ifndef TETRA_IO_H
#define TETRA_IO_H
#include "tetra.h"

/* An open file: the header is parsed, the data is memory-mapped. */
typedef struct tt_safetensors tt_safetensors;

int tt_safetensors_open(const char *path, tt_safetensors **out);
void tt_safetensors_close(tt_safetensors *f);    /* NULL is fine */

/* Tensors in header order. */
int tt_safetensors_count(const tt_safetensors *f);
const char *tt_safetensors_name(const tt_safetensors *f, int i);   /* NULL out of range */
int tt_safetensors_find(const tt_safetensors *f, const char *name); /* index, or -1 (no error set) */
/* Shape and dtype of tensor i. shape has room for TT_MAX_DIMS entries. The dtype is a
** tt_dtype, or -1 for a file dtype Tetra has no type for (F64, U8 ...). */
int tt_safetensors_info(const tt_safetensors *f, int i, int *dtype, int64_t *shape, int *ndim);
/* A new contiguous CPU tensor holding tensor `name` in its file dtype. */
int tt_safetensors_read(const tt_safetensors *f, const char *name, tt_tensor **out);
/* Copies tensor `name` into dst (same number of elements and shape; any dtype: casts;
** any device). */
int tt_safetensors_read_into(const tt_safetensors *f, const char *name, tt_tensor *dst);

/* The file's byte offset where the tensor data starts (8 + the header's length). */
uint64_t tt_safetensors_data_start(const tt_safetensors *f);
/* The box of tensor `name` whose dim d spans [lo[d], hi[d]) (each non-empty): its bytes
** lie in the file's [*begin, *end), and read_box copies it into dst (shaped hi - lo; any
** dtype: casts; any device), reading from the mapping only the box's elements. */
int tt_safetensors_box_span(const tt_safetensors *f, const char *name, const int64_t *lo,
                            const int64_t *hi, uint64_t *begin, uint64_t *end);
int tt_safetensors_read_box(const tt_safetensors *f, const char *name, const int64_t *lo,
                            const int64_t *hi, tt_tensor *dst);

/* "__metadata__" entries. */
int tt_safetensors_metadata_count(const tt_safetensors *f);
const char *tt_safetensors_metadata_key(const tt_safetensors *f, int i);
const char *tt_safetensors_metadata_get(const tt_safetensors *f, const char *key); /* NULL if absent */

/* Writes n tensors (any strides, any device) and n_meta metadata pairs (may be 0 / NULL)
** to path: written to "path.tmp", fsynced, then renamed over path. */
int tt_safetensors_save(const char *path, const char *const *names,
                        tt_tensor *const *tensors, int n, const char *const *meta_keys,
                        const char *const *meta_values, int n_meta);
/* A file's CRC-32C taken as it was written: the whole file's (crc) and each block's of
** `block` bytes (tt_checksum_block of the file's size; the last may be shorter), n_blocks
** of them in sums (malloc'd: tt_file_sums_free). */
typedef struct tt_file_sums {
  uint32_t crc;
  uint64_t block;
  int64_t n_blocks;
  uint32_t *sums;
} tt_file_sums;
void tt_file_sums_free(tt_file_sums *s);
/* tt_safetensors_save, summing the bytes on their way to the file (*out), where summing
** the file afterwards would read it all back. */
int tt_safetensors_save_summed(const char *path, const char *const *names,
                               tt_tensor *const *tensors, int n, const char *const *meta_keys,
                               const char *const *meta_values, int n_meta, tt_file_sums *out);

/* -- Checksums (engine/io/checksum.c) --------------------------------------------------- */

/* CRC-32C of len bytes, continuing from crc (0 to start): crc32c("123456789") is
** 0xE3069283. */
uint32_t tt_crc32c(uint32_t crc, const void *data, size_t len);
/* CRC-32C of a whole file. */
int tt_crc32c_file(const char *path, uint32_t *out);
/* The block a checkpoint's safetensors file is summed in, for a file of `bytes`: a power
** of two from 4 KiB to 4 MiB, about 1024 blocks a file (a load then sums only the blocks
** it reads: under ZeRO a rank reads 1/dp of each file). */
uint64_t tt_checksum_block(uint64_t bytes);
/* CRC-32C of file path whole (*whole) and, with sums, of each `block` bytes of it (the
** last block may be shorter): the file must have exactly n_sums blocks. */
int tt_crc32c_file_blocks(const char *path, uint64_t block, uint32_t *whole, uint32_t *sums,
                          int64_t n_sums);
/* CRC-32C of len bytes of file path from byte offset. */
int tt_crc32c_file_range(const char *path, uint64_t offset, uint64_t len, uint32_t *out);
/* Bytes this process has read from files so far: *copied out of a safetensors mapping
** (tt_safetensors_read*), *summed by the calls above. */
void tt_io_bytes(uint64_t *copied, uint64_t *summed);

/* -- Asynchronous checkpoint writer (engine/io/ckpt_writer.c) --------------------------- */
/* Files queued, then written (each fsynced) and summed (CRC-32C) in order by one
** background thread, with fsyncs and renames between them. Queued tensors must be host tensors the caller no longer writes
** (the writer holds a reference until free); blobs are copied. */
typedef struct tt_ckpt_writer tt_ckpt_writer;
int tt_ckpt_writer_new(tt_ckpt_writer **out);
int tt_ckpt_writer_add_safetensors(tt_ckpt_writer *w, const char *path,
                                   const char *const *names, tt_tensor *const *tensors,
                                   int n, const char *const *meta_keys,
                                   const char *const *meta_values, int n_meta);
int tt_ckpt_writer_add_bytes(tt_ckpt_writer *w, const char *path, const void *data, size_t len);
/* fsync(path) (a file or a directory), and rename(from, to), in queue order. */
int tt_ckpt_writer_add_fsync(tt_ckpt_writer *w, const char *path);
int tt_ckpt_writer_add_rename(tt_ckpt_writer *w, const char *from, const char *to);
/* A test switch: the thread waits ms milliseconds before it writes. */
void tt_ckpt_writer_set_delay_ms(tt_ckpt_writer *w, int ms);
int tt_ckpt_writer_start(tt_ckpt_writer *w);
/* 0 still writing (or not started), 1 every file written and summed, -1 failed. */
int tt_ckpt_writer_poll(const tt_ckpt_writer *w);
/* Waits for the thread; 0 when every file was written, else -1 with the thread's error. */
int tt_ckpt_writer_wait(tt_ckpt_writer *w);
/* The CRC-32C of the i-th queued operation (0-based) when it wrote a file, once run. */
uint32_t tt_ckpt_writer_crc(const tt_ckpt_writer *w, int i);
/* When the i-th operation wrote a safetensors file, once run: its block size and the
** CRC-32C of each block (*sums, owned by the writer until free); their count, else -1. */
int64_t tt_ckpt_writer_blocks(const tt_ckpt_writer *w, int i, uint64_t *block,
                              const uint32_t **sums);
/* Waits for the thread if it runs, then frees the queue and drops its references. */
void tt_ckpt_writer_free(tt_ckpt_writer *w);
#endif
