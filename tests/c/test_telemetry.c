/*
** test_telemetry.c — the telemetry store and its HTTP server (engine/obs/telemetry.c,
** engine/obs/prometheus.c): a scraper thread formatting as fast as it can never sees a torn
** step (tetra_step, the step histogram's count and +Inf bucket, tokens are written
** together under one lock), and the server answers /metrics, 404 and 405 over a real
** loopback socket while a client that connected and said nothing is still open.
** The torn-step check is statistical: it catches a store split over two lock sections
** taken far apart, not a race whose window is a few nanoseconds (a write of the last
** record outside the lock passed 239 snapshots unseen).
*/
#include "tt_test.h"
#include "tetra_telemetry.h"
#include <arpa/inet.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

/* The value of the first sample line starting with `prefix` (NAN when absent). */
static double sample(const char *text, const char *prefix) {
  for (const char *p = text; p && *p;) {
    if (strncmp(p, prefix, strlen(prefix)) == 0) {
      const char *v = strchr(p, '}');
      return v ? strtod(v + 1, NULL) : NAN;
    }
    p = strchr(p, '\n');
    if (p) p++;
  }
  return NAN;
}

static volatile int g_stop;
static int g_torn, g_snapshots;

static void *scraper(void *arg) {
  (void)arg;
  while (!g_stop) {
    char *t = tt_telemetry_format();
    if (!t) continue;
    double step = sample(t, "tetra_step{");
    double count = sample(t, "tetra_step_seconds_count{");
    double inf = sample(t, "tetra_step_seconds_bucket{job=\"t\",rank=\"0\",dp=\"0\",tp=\"0\",pp=\"0\",cp=\"0\",le=\"+Inf\"}");
    double tokens = sample(t, "tetra_tokens_total{");
    if (step > 0 && (count != step || inf != step || tokens != step * 256)) g_torn++;
    __atomic_add_fetch(&g_snapshots, 1, __ATOMIC_RELAXED);
    tt_telemetry_text_free(t);
  }
  return NULL;
}

Test(telemetry, a_concurrent_scrape_never_sees_a_torn_step) {
  cr_assert_eq(tt_telemetry_configure("t", 0, 0, 0, 0, 0, 0, -1), 0);
  pthread_t th;
  g_stop = 0;
  pthread_create(&th, NULL, scraper, NULL);
  tt_step_telemetry s = {0};
  /* 200,000 steps, and on until the scraper has formatted 20 times: on a busy machine
  ** its thread may not run at all while the first 200,000 are written. */
  int last = 0;
  for (int i = 1; i <= 200000 || (__atomic_load_n(&g_snapshots, __ATOMIC_RELAXED) < 20 &&
                                   i <= 200000000);
       i++) {
    s.step = i;
    s.tokens_total = 256.0 * i;
    s.step_time_s = 1e-3 * (i % 7);
    s.mfu = -1;
    tt_telemetry_step(&s);
    if (i % 3 == 0) tt_telemetry_collective("all_reduce", "dp", 1e-4);
    last = i;
  }
  g_stop = 1;
  pthread_join(th, NULL);
  cr_assert_geq(g_snapshots, 20, "the scraper formatted only %d times", g_snapshots);
  cr_assert_eq(g_torn, 0, "%d of %d snapshots were torn", g_torn, g_snapshots);
  char *t = tt_telemetry_format();
  cr_assert_eq(sample(t, "tetra_step{"), last);
  cr_assert_eq(sample(t, "tetra_collective_seconds_count{"), last / 3);
  tt_telemetry_text_free(t);
}

/* Scrapes answer from the text formatted last time while nothing changed: every kind of
** write must be seen by the next scrape all the same. */
static double scrape(const char *name) {
  char *t = tt_telemetry_format();
  cr_assert_not_null(t, "%s", tt_last_error());
  double v = sample(t, name);
  tt_telemetry_text_free(t);
  return v;
}

Test(telemetry, every_write_reaches_the_next_scrape) {
  cr_assert_eq(tt_telemetry_configure("c", 0, 0, 0, 0, 0, 0, -1), 0);
  tt_step_telemetry s = {.step = 1, .tokens_total = 64, .step_time_s = 0.01, .mfu = -1};
  tt_telemetry_step(&s);
  cr_assert_eq(scrape("tetra_step{"), 1);
  cr_assert_eq(scrape("tetra_step{"), 1);   /* unchanged: the kept text */
  tt_telemetry_collective("all_reduce", "dp", 1e-3);
  cr_assert_eq(scrape("tetra_collective_seconds_count{"), 1);
  tt_telemetry_checkpoint(0.5);
  cr_assert_eq(scrape("tetra_checkpoint_saves_total{"), 1);
  s.step = 2;
  tt_telemetry_step(&s);
  cr_assert_eq(scrape("tetra_step{"), 2);
  /* The live series are read at each scrape. */
  cr_assert_gt(scrape("tetra_process_cpu_seconds_total{"), 0);
  cr_assert(!isnan(scrape("tetra_exporter_cpu_seconds_total{")));
  cr_assert_eq(tt_telemetry_configure("d", 1, 0, 0, 0, 0, 0, -1), 0);
  cr_assert_eq(scrape("tetra_step{"), 0, "a reconfigured store still shows the old step");
}

/* Sends `req` to 127.0.0.1:port and returns the whole answer (malloc'd). */
static char *http(int port, const char *req) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
  size_t n = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd, buf + n, cap - 1 - n)) > 0) {
    n += (size_t)got;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[n] = '\0';
  close(fd);
  return buf;
}

Test(telemetry, serves_metrics_over_http_past_a_silent_client) {
  if (!tt_prom_available()) cr_skip_test("built without libmicrohttpd");
  cr_assert_eq(tt_telemetry_configure("http", 3, 1, 0, 1, 0, 2, -1), 0);
  tt_step_telemetry s = {.step = 7, .loss = 2.5, .mfu = -1};
  tt_telemetry_step(&s);
  cr_assert_eq(tt_prom_start("127.0.0.1", 0), 0, "%s", tt_last_error());
  int port = tt_prom_port();
  cr_assert_gt(port, 0);
  cr_assert_neq(tt_prom_start("127.0.0.1", 0), 0, "a second start must fail");
  int silent = socket(AF_INET, SOCK_STREAM, 0);   /* connects and never speaks */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  cr_assert_eq(connect(silent, (struct sockaddr *)&a, sizeof a), 0);
  char *ok = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
  cr_assert(strstr(ok, "HTTP/1.0 200") || strstr(ok, "HTTP/1.1 200"), "%.200s", ok);
  cr_assert(strstr(ok, "text/plain; version=0.0.4"), "%.300s", ok);
  cr_assert(strstr(ok, "tetra_loss{job=\"http\",rank=\"3\",dp=\"1\",tp=\"0\",pp=\"1\",cp=\"0\"} 2.5\n"));
  cr_assert(strstr(ok, "tetra_restarts{job=\"http\",rank=\"3\",dp=\"1\",tp=\"0\",pp=\"1\",cp=\"0\"} 2\n"));
  free(ok);
  char *missing = http(port, "GET /other HTTP/1.0\r\n\r\n");
  cr_assert(strstr(missing, " 404 "), "%.100s", missing);
  free(missing);
  char *post = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  cr_assert(strstr(post, " 405 "), "%.100s", post);
  free(post);
  close(silent);
  /* The port is taken while we serve: a second server there fails with errno's words. */
  tt_prom_stop();
  cr_assert_eq(tt_prom_port(), -1);
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_port = 0;
  cr_assert_eq(bind(holder, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(holder, 1), 0);
  socklen_t len = sizeof a;
  getsockname(holder, (struct sockaddr *)&a, &len);
  cr_assert_neq(tt_prom_start("127.0.0.1", ntohs(a.sin_port)), 0);
  cr_assert(strstr(tt_last_error(), "Address already in use"), "%s", tt_last_error());
  close(holder);
  cr_assert_neq(tt_prom_start("localhost", 0), 0, "a name, not an address, is refused");
  cr_assert(strstr(tt_last_error(), "log.prometheus_addr"), "%s", tt_last_error());
}
