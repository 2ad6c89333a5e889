/*
** tt_emu.h — what the emulator's tests see of it (tests/emu/cuda_emu.cc).
*/
#ifndef TT_EMU_H
#define TT_EMU_H
#include <stddef.h>
#include <string>

namespace tt_emu {
/* "Device" memory: host memory between guard zones, filled with all-ones bits. */
void *alloc(size_t bytes);
bool release(void *p);
/* "" when every live buffer's guards hold, else which buffer a kernel wrote outside of
** (the guards are then restored). */
std::string check_guards(void);
size_t live_bytes(void);
/* The multiprocessor count tt_cuda_blocks sizes grids by (small, so that grid-stride
** loops go round). */
extern int sm_count;
}  // namespace tt_emu

#endif
