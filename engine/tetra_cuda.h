/*
** tetra_cuda.h — the CUDA device backend: start-up, device choice, streams, events and
** pinned host memory. Implemented in engine/runtime/cuda.cu (tt_cuda_init in
** engine/cuda/backend.cu); in a build without CUDA nothing here is linked, and lua/tetra
** checks for tt_cuda_init before calling it.
** Flat C only: lua/tetra/ffi.lua feeds this header to ffi.cdef.
*/
#ifndef TETRA_CUDA_H
#define TETRA_CUDA_H
#include <stddef.h>
#include <stdint.h>

/* Finds the GPUs, picks this process's device and registers the backend (tensors on
** cuda:N work after it). The device is the local rank modulo the GPU count, the local
** rank read from OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK or SLURM_LOCALID (0 when none is
** set). Idempotent. -1 with "no CUDA device: <reason>" when there is no usable GPU. */
int tt_cuda_init(void);
/* GPUs visible to this process (0 when there is no driver or device; never fails). */
int tt_cuda_device_count(void);
/* Opens cuBLASLt, which the engine opens on first use rather than links (kernel_cuda.h):
** 1 when it opened with every entry point the engine calls, else 0 with the message set.
** Needs no GPU. */
int tt_blaslt_loaded(void);
/* The device tensors created as "cuda" (no ordinal) go to: the one tt_cuda_init chose,
** or the last tt_cuda_set_device. */
int tt_cuda_current_device(void);
int tt_cuda_set_device(int device);
/* Writes "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)" into buf. */
int tt_cuda_device_info(int device, char *buf, size_t n);
/* Free and total device memory in bytes. */
int tt_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
/* Waits for all work on the current device. */
int tt_cuda_synchronize(void);

/* Times the host has waited for the GPU since start-up: every copy into host memory,
** every stream, event or device synchronisation of the engine counts one. A training
** step makes one (its step stats read); tests assert that. */
int64_t tt_cuda_host_sync_count(void);

/* Deferred input checks: while on, an embedding id or cross-entropy target out of range
** no longer makes the op wait for the device to report it; the failure is recorded on the
** device, and the step finds it at its one read: tt_cuda_checks_flag writes 1.0 to the
** f32 at dst (device memory) when a failure was recorded (nothing when checks were never
** deferred on this device), and tt_cuda_checks_take (a
** host wait; call it when the flag was set) returns -1 with the first failure's message
** ("embedding: id 70000 at position 12 is outside the vocabulary [0, 32000)") and
** clears the records, or 0 when there was none. Off by default: each op then checks its
** own inputs at once. */
int tt_cuda_set_deferred_checks(int on);
int tt_cuda_checks_flag(void *dst);
int tt_cuda_checks_take(void);

/* -- Streams and events ------------------------------------------------------------- */
/* Kernels and copies run on the current stream (NULL: the default stream). Ops issued
** from one thread are ordered on it; a stream is a handle the caller destroys. */
typedef struct tt_cuda_stream tt_cuda_stream;
typedef struct tt_cuda_event tt_cuda_event;

int tt_cuda_stream_create(tt_cuda_stream **out);
void tt_cuda_stream_destroy(tt_cuda_stream *s);
int tt_cuda_set_stream(tt_cuda_stream *s);
tt_cuda_stream *tt_cuda_get_stream(void);
/* The current stream as the runtime's cudaStream_t (NULL: the legacy default stream), for
** C code that calls CUDA itself (engine/dist/nccl.c). */
void *tt_cuda_stream_raw(void);
/* hook(), when set, runs every millisecond or so while the host waits for the device
** (tt_cuda_host_wait polls instead of blocking): the NCCL watchdog checks the collectives
** the device waits for there. NULL: block. */
void tt_cuda_set_host_wait_hook(void (*hook)(void));
int tt_cuda_stream_synchronize(tt_cuda_stream *s);
/* The cuBLASLt workspace GEMMs issued on stream `s` (NULL: the default stream) use on the
** current device: one per stream, so GEMMs on two streams never share one. */
int tt_cuda_gemm_workspace(tt_cuda_stream *s, void **out);
/* 1 when every kernel launch waits for the GPU and checks for errors, so a fault is
** reported by the call that launched the kernel (slow; for debugging). TETRA_CUDA_SYNC=1
** in the environment turns it on at tt_cuda_init; the setter changes it later. */
int tt_cuda_sync_launches(void);
int tt_cuda_set_sync_launches(int on);
/* Makes `s` wait for everything recorded in event `e` (no host wait). */
int tt_cuda_stream_wait_event(tt_cuda_stream *s, tt_cuda_event *e);

/* timing 1: the event can be used with tt_cuda_event_elapsed_ms. */
int tt_cuda_event_create(int timing, tt_cuda_event **out);
void tt_cuda_event_destroy(tt_cuda_event *e);
int tt_cuda_event_record(tt_cuda_event *e, tt_cuda_stream *s);
int tt_cuda_event_synchronize(tt_cuda_event *e);
/* 1 when the work before the event has finished, 0 when not yet, -1 on error. */
int tt_cuda_event_query(tt_cuda_event *e);
int tt_cuda_event_elapsed_ms(tt_cuda_event *start, tt_cuda_event *end, float *out_ms);

/* -- CUDA graphs -------------------------------------------------------------------- */
/* Capture the work issued on the current stream (a stream of tt_cuda_stream_create: the
** legacy default stream cannot be captured) between begin and end into a graph, then
** replay it with one launch. The captured kernels keep their pointers: every tensor they
** touch must stay allocated, at the same address, until the graph is destroyed (allocate
** the capture's tensors from a private pool, tt_alloc_pool_use in tetra.h, so that blocks
** freed during or after it stay the graph's), and no host wait may happen while capturing
** (it fails with a message naming the capture). */
typedef struct tt_cuda_graph tt_cuda_graph;
int tt_cuda_graph_begin(void);
/* Ends the capture begun on the current stream; *out: the instantiated graph. */
int tt_cuda_graph_end(tt_cuda_graph **out);
/* Launches the graph on the current stream (no host wait). */
int tt_cuda_graph_replay(tt_cuda_graph *g);
void tt_cuda_graph_destroy(tt_cuda_graph *g);
/* 1 while the current stream is being captured. */
int tt_cuda_graph_capturing(void);

/* -- Pinned host memory ------------------------------------------------------------- */
/* Page-locked host buffers: copies from them to the GPU run asynchronously and at full
** PCIe speed (the data loader's staging buffers). */
int tt_cuda_host_alloc(size_t nbytes, void **out);
void tt_cuda_host_free(void *p);
/* Asynchronous host -> device copy on the current stream from a pinned buffer; the
** buffer must stay untouched until an event recorded after it completes. */
int tt_cuda_copy_to_device_async(void *dst, int device, const void *pinned_src,
                                 size_t nbytes);
/* Asynchronous device -> host copy on the current stream into a pinned buffer; its
** contents are there once an event recorded after it completes. */
int tt_cuda_copy_to_host_async(void *pinned_dst, const void *src, int device, size_t nbytes);

#endif
