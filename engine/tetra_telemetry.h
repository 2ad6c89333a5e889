/*
** tetra_telemetry.h — the live training figures a Prometheus scraper reads.
**
** Read by the C compiler and by LuaJIT's ffi.cdef (lua/tetra/obs/telemetry.lua): flat
** declarations only, no macros.
**
** One store per process. The training thread writes into it (tt_telemetry_step once per
** optimizer step, tt_telemetry_checkpoint after a save; engine/dist times every
** collective into it), each time under one short mutex; the HTTP server's own thread
** copies it under the same mutex and formats the copy. Nothing the scraper does can make
** a step wait for more than that copy.
**
** The endpoint (tt_prom_start) serves GET /metrics in the Prometheus text exposition
** format 0.0.4 through libmicrohttpd on a thread of its own. Builds without libmicrohttpd
** keep the store but tt_prom_available() is 0 and tt_prom_start fails with a message.
*/
#ifndef TETRA_TELEMETRY_H
#define TETRA_TELEMETRY_H
#include <stdint.h>

/* What one optimizer step reports. Seconds are this rank's wall time; the phases
** (data_wait .. optimizer, plus other) add up to step_time_s; mfu < 0: unknown. */
typedef struct tt_step_telemetry {
  double step;
  double loss;
  double lr;
  double grad_norm;
  double tokens_per_s;
  double tokens_total;
  double step_time_s;
  double data_wait_s;
  double forward_s;
  double backward_s;
  double exposed_comm_s;
  double optimizer_s;
  double other_s;
  double loss_scale;
  int skipped;
  double mfu;
  double live_bytes;
  double peak_bytes;
  double cached_bytes;
} tt_step_telemetry;

/* Labels every series carries (job, rank and the mesh coordinates) and the run's
** constant figures: restarts (the supervisor's TETRA_RESTART_COUNT) and the GPU NVML
** reports on (-1: none). Turns collective timing on. Call once, before tt_prom_start. */
int tt_telemetry_configure(const char *job, int rank, int dp, int tp, int pp, int cp,
                           int restarts, int gpu);
/* 1 once configured: engine/dist times collectives only then. */
int tt_telemetry_enabled(void);
void tt_telemetry_step(const tt_step_telemetry *s);
void tt_telemetry_checkpoint(double seconds);
/* Rank 0: the slowest rank of the last step (world rank), its compute seconds (step less
** collective waits) and their ratio to the ranks' median (< 0: unknown). */
void tt_telemetry_straggler(int rank, double compute_s, double ratio);
/* One collective of `op` ("all_reduce", ...) on group `group` ("dp", ...) took `seconds`
** from its start to its completion as this rank saw it. */
void tt_telemetry_collective(const char *op, const char *group, double seconds);
/* The exposition text of the store as it is now (malloc'd, NUL-terminated; the caller
** frees it), NVML figures included when NVML loads; NULL + error when out of memory. */
char *tt_telemetry_format(void);
void tt_telemetry_text_free(char *text);
/* The endpoint's thread CPU seconds for tetra_exporter_cpu_seconds_total: the endpoint
** hands them to the store before each scrape (the store is pulled from, never calls
** back). */
void tt_telemetry_exporter_cpu(double seconds);

/* -- The HTTP endpoint --------------------------------------------------------------- */

/* 1 when this build serves HTTP (libmicrohttpd found at build time). */
int tt_prom_available(void);
/* Listens on addr:port (an IPv4 or IPv6 literal) and serves GET /metrics from a thread of
** its own. Error (with errno's words) when the address is taken or not local. */
int tt_prom_start(const char *addr, int port);
/* The port actually bound (useful with port 0), or -1 when not serving. */
int tt_prom_port(void);
/* CPU seconds the endpoint's thread had used when it began its latest /metrics answer
** (formatting and sending every earlier scrape); 0 when not serving. */
double tt_prom_cpu_seconds(void);
void tt_prom_stop(void);

/* -- Trace (engine/obs/trace.c) ---------------------------------------------------------- */
/* While enabled, every collective of a group of more than one rank is recorded with its
** start and completion (CLOCK_MONOTONIC seconds, tetra.obs.metrics.now's clock) for the
** Chrome/Perfetto trace tetra.obs.trace writes. */
typedef struct tt_trace_event {
  const char *op;      /* "all_reduce", ... (static) */
  char group[24];
  double start_s;
  double end_s;
} tt_trace_event;
void tt_trace_set_enabled(int on);
int tt_trace_enabled(void);
void tt_trace_collective(const char *op, const char *group, double start_s, double end_s);
/* Moves up to max recorded events into out (oldest first); returns how many. */
int tt_trace_take(tt_trace_event *out, int max);

/* -- NVML (loaded at run time; engine/obs/nvml.c) ----------------------------------------- */

/* 1 when libnvidia-ml.so.1 loaded and initialised (tried once). */
int tt_nvml_available(void);

#endif
