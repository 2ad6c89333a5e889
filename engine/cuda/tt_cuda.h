/*
** tt_cuda.h — what the engine's CUDA sources (engine/cuda/) share: the kernels' CUDA
** helpers (kernels/kernel_cuda.h: status checks, the current stream, launch helpers) and
** the engine's internals. C++ (nvcc) only; the C side sees engine/tetra_cuda.h.
*/
#ifndef TT_CUDA_H
#define TT_CUDA_H
#include "kernel_cuda.h"
extern "C" {
#include "core/tt_internal.h"
}

/* Fails unless every kernel object of kernels/cuda/ is in the program. The engine reaches the
** kernel tables through weak references, which do not pull members out of a static
** library; this function's strong references (kernels_linked.cu) do. */
int tt_cuda_kernels_linked(void);
#endif
