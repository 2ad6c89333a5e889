/*
** tt_runtime.h — what the CUDA runtime (engine/runtime/cuda.cu) offers the engine's CUDA
** backend beyond the kernels' helpers (kernels/kernel_cuda.h) and the public API
** (tetra_cuda.h). C++ (nvcc) only.
*/
#ifndef TT_RUNTIME_H
#define TT_RUNTIME_H
#include "kernel_cuda.h"

/* Reads TETRA_CUDA_SYNC, counts the devices, picks this rank's GPU and creates its
** context; once per process (later calls return 0). */
int tt_cuda_runtime_init(void);

/* Makes `device` current for this thread (an error when it does not exist). */
int tt_cuda_use_device(int device);

/* Called for every device when a stream is destroyed, after its queued work finished:
** the allocator releases the blocks last used on it. */
void tt_cuda_set_stream_retired_hook(void (*hook)(int device, void *stream));
/* Called for every device when a stream is created (its handle may be a destroyed
** stream's again). */
void tt_cuda_set_stream_born_hook(void (*hook)(int device, void *stream));
#endif
