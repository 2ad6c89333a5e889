/*
** nvml.c — GPU figures for the Prometheus endpoint, read through NVML at run time.
**
** libnvidia-ml.so.1 comes with the NVIDIA driver, not with the CUDA toolkit, so it is
** opened with dlopen the first time a scrape asks: a machine without it simply has no
** DCGM_FI_* series. The few NVML entry points used are declared here (their ABI is
** stable since NVML 5); no header from the driver is needed to build.
**
** Series carry the names dcgm-exporter gives the same fields (DCGM_FI_DEV_GPU_TEMP ...),
** so a DCGM user's dashboards and alerts read them unchanged, plus the job's labels and
** gpu (the CUDA ordinal this rank uses). Only the HTTP thread calls in here.
**
** Not verified on a GPU in this repository's CI (no GPU there): tests/cli/nvml.sh runs
** it against a library of its own that answers like NVML, and without any NVML.
*/
#include "tetra_telemetry.h"
#include "core/tt_internal.h"
#include "common/common.h"
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

typedef int nvml_return;   /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef void *nvml_device;
typedef void *nvml_event_set;
typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct { unsigned int gpu, memory; } nvml_utilization;
typedef struct {   /* nvmlEventData_t */
  nvml_device device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
} nvml_event_data;

enum {
  NVML_SUCCESS = 0,
  NVML_TEMPERATURE_GPU = 0,
  NVML_CLOCK_SM = 1,
  NVML_EVENT_XID_CRITICAL = 8,   /* nvmlEventTypeXidCriticalError */
};

static struct {
  int loaded;
  nvml_return (*init)(void);
  nvml_return (*by_index)(unsigned int, nvml_device *);
  nvml_return (*by_uuid)(const char *, nvml_device *);
  nvml_return (*name)(nvml_device, char *, unsigned int);
  nvml_return (*temperature)(nvml_device, int, unsigned int *);
  nvml_return (*memory)(nvml_device, nvml_memory *);
  nvml_return (*utilization)(nvml_device, nvml_utilization *);
  nvml_return (*power)(nvml_device, unsigned int *);
  nvml_return (*clock)(nvml_device, int, unsigned int *);
  nvml_return (*event_set_create)(nvml_event_set *);
  nvml_return (*register_events)(nvml_device, unsigned long long, nvml_event_set);
  nvml_return (*event_wait)(nvml_event_set, nvml_event_data *, unsigned int);
  nvml_return (*event_set_free)(nvml_event_set);
  nvml_device device;
  int device_for;            /* the CUDA ordinal `device` was looked up for */
  nvml_event_set events;     /* NULL when XID events cannot be registered */
  unsigned long long last_xid;
  unsigned long long xid_count;
} nv = {.device_for = -1};

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void *sym(void *lib, const char *name) { return dlsym(lib, name); }

static void load(void) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  *(void **)&nv.init = sym(lib, "nvmlInit_v2");
  *(void **)&nv.by_index = sym(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&nv.by_uuid = sym(lib, "nvmlDeviceGetHandleByUUID");
  *(void **)&nv.name = sym(lib, "nvmlDeviceGetName");
  *(void **)&nv.temperature = sym(lib, "nvmlDeviceGetTemperature");
  *(void **)&nv.memory = sym(lib, "nvmlDeviceGetMemoryInfo");
  *(void **)&nv.utilization = sym(lib, "nvmlDeviceGetUtilizationRates");
  *(void **)&nv.power = sym(lib, "nvmlDeviceGetPowerUsage");
  *(void **)&nv.clock = sym(lib, "nvmlDeviceGetClockInfo");
  *(void **)&nv.event_set_create = sym(lib, "nvmlEventSetCreate");
  *(void **)&nv.register_events = sym(lib, "nvmlDeviceRegisterEvents");
  *(void **)&nv.event_wait = sym(lib, "nvmlEventSetWait_v2");
  *(void **)&nv.event_set_free = sym(lib, "nvmlEventSetFree");
  if (!nv.init || !nv.by_index || nv.init() != NVML_SUCCESS) {
    dlclose(lib);
    return;
  }
  nv.loaded = 1;   /* the library stays open for the life of the process */
}

int tt_nvml_available(void) {
  pthread_once(&nv_once, load);
  return nv.loaded;
}

/* NVML numbers every GPU of the machine; CUDA only those in CUDA_VISIBLE_DEVICES (by
** index or UUID). Finds the NVML device behind CUDA ordinal `gpu`. */
static int find_device(int gpu, nvml_device *out) {
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  char entry[96] = "";
  if (vis && *vis) {
    const char *p = vis;
    for (int i = 0; i < gpu && p; i++) {
      p = strchr(p, ',');
      if (p) p++;
    }
    if (!p) return -1;
    size_t n = strcspn(p, ",");
    if (n >= sizeof entry) return -1;
    memcpy(entry, p, n);
    entry[n] = '\0';
  }
  if (entry[0] == '\0') return nv.by_index((unsigned)gpu, out) == NVML_SUCCESS ? 0 : -1;
  if (strncmp(entry, "GPU-", 4) == 0 || strncmp(entry, "MIG-", 4) == 0)
    return nv.by_uuid && nv.by_uuid(entry, out) == NVML_SUCCESS ? 0 : -1;
  char *end = NULL;
  long idx = strtol(entry, &end, 10);
  if (*end != '\0' || idx < 0) return -1;
  return nv.by_index((unsigned)idx, out) == NVML_SUCCESS ? 0 : -1;
}

/* Counts the XID errors that arrived since the last scrape (non-blocking). */
static void drain_xid_events(void) {
  if (!nv.events) return;
  nvml_event_data ev;
  while (nv.event_wait(nv.events, &ev, 0) == NVML_SUCCESS) {
    if (ev.event_type & NVML_EVENT_XID_CRITICAL) {
      nv.last_xid = ev.event_data;
      nv.xid_count++;
    }
  }
}

static int put(tt_buf *b, const char *name, const char *type, const char *help,
               const char *labels, double v) {
  return tt_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %.17g\n", name, help, name,
                       type, name, labels, v);
}

/* Appends this rank's GPU figures; nothing (and success) without NVML or the device. */
int tt_nvml_format(tt_buf *b, const char *labels, int gpu) {
  if (!tt_nvml_available()) return 0;
  if (nv.device_for != gpu) {
    if (find_device(gpu, &nv.device) != 0) return 0;
    nv.device_for = gpu;
    if (nv.event_set_create && nv.register_events && nv.event_wait && nv.event_set_free &&
        nv.event_set_create(&nv.events) == NVML_SUCCESS &&
        nv.register_events(nv.device, NVML_EVENT_XID_CRITICAL, nv.events) != NVML_SUCCESS) {
      nv.event_set_free(nv.events);   /* not permitted (containers often forbid it) */
      nv.events = NULL;
    }
  }
  char model[96] = "unknown", all[512];
  if (nv.name) nv.name(nv.device, model, sizeof model);
  for (char *p = model; *p; p++)
    if (*p == '"' || *p == '\\' || *p == '\n') *p = '_';
  snprintf(all, sizeof all, "%s,gpu=\"%d\",modelName=\"%s\"", labels, gpu, model);
  unsigned int u = 0;
  if (nv.temperature && nv.temperature(nv.device, NVML_TEMPERATURE_GPU, &u) == NVML_SUCCESS)
    TT_TRY(put(b, "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C).", all, u));
  nvml_memory m;
  if (nv.memory && nv.memory(nv.device, &m) == NVML_SUCCESS) {
    const double mib = 1024.0 * 1024.0;
    TT_TRY(put(b, "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (MiB).", all,
               (double)m.used / mib));
    TT_TRY(put(b, "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (MiB).", all,
               (double)m.free / mib));
    TT_TRY(put(b, "DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (MiB).", all,
               (double)m.total / mib));
  }
  nvml_utilization ut;
  if (nv.utilization && nv.utilization(nv.device, &ut) == NVML_SUCCESS) {
    TT_TRY(put(b, "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (%).", all, ut.gpu));
    TT_TRY(put(b, "DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (%).", all,
               ut.memory));
  }
  if (nv.power && nv.power(nv.device, &u) == NVML_SUCCESS)
    TT_TRY(put(b, "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (W).", all, u / 1000.0));
  if (nv.clock && nv.clock(nv.device, NVML_CLOCK_SM, &u) == NVML_SUCCESS)
    TT_TRY(put(b, "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (MHz).", all, u));
  if (nv.events) {
    drain_xid_events();
    TT_TRY(put(b, "DCGM_FI_DEV_XID_ERRORS", "gauge",
               "Value of the last XID error seen since start (0: none).", all,
               (double)nv.last_xid));
    TT_TRY(put(b, "tetra_gpu_xid_errors_total", "counter",
               "XID errors seen since start.", all, (double)nv.xid_count));
  }
  return 0;
}
