/*
** fake_cudnn8.c — a library that answers like cuDNN FAKE_CUDNN_VERSION (cudnnGetVersion;
** 8907, cuDNN 8.9, unless the build says otherwise; a backend entry point present):
** test_cudnn_load.c checks that the loader refuses it, as too old, or as a version with a
** known attention defect (9.10.0, built as fake_cudnn9100).
*/
#include <stddef.h>

#ifndef FAKE_CUDNN_VERSION
#define FAKE_CUDNN_VERSION 8907
#endif

size_t cudnnGetVersion(void) { return FAKE_CUDNN_VERSION; }
int cudnnBackendCreateDescriptor(int type, void **desc) {
  (void)type;
  (void)desc;
  return 1;
}
