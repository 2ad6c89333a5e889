/*
** emu_engine_stubs.cc — the engine's CUDA runtime functions that kernels/kernel_cuda.h
** declares, for the kernels' test (test_emu_kernels) alone: there the kernels run without
** the engine. The emulated device build (TETRA_CUDA_EMU) compiles engine/runtime/cuda.cu
** instead, which defines them for real.
*/
#include "cuda_emu.h"

extern "C" {
#include "kernel.h"
}
#include "kernel_cuda.h"
#include "tt_emu.h"

/* -- The engine's CUDA runtime, as kernel_cuda.h declares it ------------------------- */

int tt_cu_fail(cudaError_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: %s", file, line, call, cudaGetErrorString(e));
}

int tt_cu_fail(cublasStatus_t e, const char *call, const char *file, int line) {
  return tt_set_error("%s:%d: %s: cuBLAS status %d (no cuBLAS under the emulator)", file,
                      line, call, (int)e);
}

cudaError_t tt_cuda_launch_status(void) { return cudaGetLastError(); }

cudaStream_t tt_cuda_cur_stream(void) { return 0; }

int tt_cuda_sm_count(void) { return tt_emu::sm_count; }

cudaError_t tt_cuda_host_wait(cudaStream_t s) { return cudaStreamSynchronize(s); }

cudaError_t tt_cuda_host_wait_event(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}

int tt_cuda_checks_deferred(void) { return 0; }

int tt_cuda_check_defer(int kind, const unsigned long long *bad_pos, const void *values,
                        int values_i64, int64_t limit) {
  (void)kind, (void)bad_pos, (void)values, (void)values_i64, (void)limit;
  return tt_set_error("tt_cuda_check_defer: deferred checks are off under the emulator");
}

int tt_cuda_blaslt(cublasLtHandle_t *handle, void **workspace, size_t *workspace_bytes) {
  (void)handle, (void)workspace, (void)workspace_bytes;
  return tt_set_error("cuBLASLt: not under the emulator (kernels/cuda/matmul.cu is not "
                      "emulated)");
}
