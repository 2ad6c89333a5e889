/*
** tt_emu.h — what the emulator's tests see of it (tests/emu/cuda_emu.cc).
*/
#ifndef TT_EMU_H
#define TT_EMU_H
#include <stddef.h>
#include <string>

namespace tt_emu {
/* "Device" memory: host memory between guard zones (and a page no access may touch
** past its end), filled with all-ones bits. alloc's buffers stay readable by host code
** (the tests read theirs); alloc_device's, cudaMalloc's, fault when host code touches
** them outside device work (cuda_emu.cc). */
void *alloc(size_t bytes);
void *alloc_device(size_t bytes);
bool release(void *p);
/* "" when every live buffer's guards hold, else which buffer a kernel wrote outside of
** (the guards are then restored). */
std::string check_guards(void);
size_t live_bytes(void);
/* The legacy stream (0) runs its work when issued, not when the host waits for it (the
** emulated device defers it, as a GPU runs it later): the kernels' test sets this, as it
** reads its buffers straight after each launch. */
extern bool legacy_at_once;
/* The multiprocessor count tt_cuda_blocks sizes grids by (small, so that grid-stride
** loops go round). */
extern int sm_count;
}  // namespace tt_emu

#endif
