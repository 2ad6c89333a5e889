/*
** fake_cudnn8.c — a library that answers like cuDNN 8.9 (cudnnGetVersion 8907, a backend
** entry point present): test_cudnn_load.c checks that the loader refuses it as too old.
*/
#include <stddef.h>

size_t cudnnGetVersion(void) { return 8907; }
int cudnnBackendCreateDescriptor(int type, void **desc) {
  (void)type;
  (void)desc;
  return 1;
}
