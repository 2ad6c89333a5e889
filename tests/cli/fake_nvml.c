/*
** fake_nvml.c — a libnvidia-ml.so.1 stand-in for tests/cli/nvml.sh: the NVML entry points
** engine/obs/nvml.c opens, answering fixed figures that depend on the device index, so the
** test can see which device was asked for and that every figure reaches its series.
** The real library is not on CI machines (it comes with the NVIDIA driver).
*/
#include <string.h>

typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct {
  void *device;
  unsigned long long type, data;
  unsigned int gi, ci;
} event_t;

static int xid_pending = 1;

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {
  if (i > 7) return 2;   /* NVML_ERROR_INVALID_ARGUMENT */
  *dev = (void *)(unsigned long)(i + 1);
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev) {
  if (strcmp(uuid, "GPU-6") != 0) return 6;   /* NVML_ERROR_NOT_FOUND */
  *dev = (void *)7UL;
  return 0;
}
static unsigned idx(void *dev) { return (unsigned)(unsigned long)dev - 1; }
int nvmlDeviceGetName(void *dev, char *name, unsigned int n) {
  (void)dev;
  strncpy(name, "Fake \"H200\"", n);
  return 0;
}
int nvmlDeviceGetTemperature(void *dev, int sensor, unsigned int *t) {
  if (sensor != 0) return 2;
  *t = 60 + idx(dev);
  return 0;
}
int nvmlDeviceGetMemoryInfo(void *dev, mem_t *m) {
  m->total = 144ULL << 30;
  m->used = (unsigned long long)(idx(dev) + 1) << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetUtilizationRates(void *dev, util_t *u) {
  u->gpu = 90 + idx(dev);
  u->memory = 40;
  return 0;
}
int nvmlDeviceGetPowerUsage(void *dev, unsigned int *mw) {
  *mw = 250500 + idx(dev);
  return 0;
}
int nvmlDeviceGetClockInfo(void *dev, int type, unsigned int *mhz) {
  (void)dev;
  if (type != 1) return 2;
  *mhz = 1980;
  return 0;
}
int nvmlEventSetCreate(void **set) {
  *set = (void *)1;
  return 0;
}
int nvmlDeviceRegisterEvents(void *dev, unsigned long long types, void *set) {
  (void)dev;
  (void)set;
  return types == 8 ? 0 : 2;
}
int nvmlEventSetWait_v2(void *set, event_t *ev, unsigned int timeout_ms) {
  (void)set;
  (void)timeout_ms;
  if (!xid_pending) return 10;   /* NVML_ERROR_TIMEOUT */
  xid_pending = 0;
  memset(ev, 0, sizeof *ev);
  ev->type = 8;
  ev->data = 79;   /* "GPU has fallen off the bus" */
  return 0;
}
int nvmlEventSetFree(void *set) {
  (void)set;
  return 0;
}
