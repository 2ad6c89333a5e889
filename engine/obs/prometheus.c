/*
** prometheus.c — the /metrics endpoint: libmicrohttpd serving the telemetry store.
**
** libmicrohttpd runs its own polling thread (epoll where it has it), so the server never
** runs on the training thread, and a client that connects and stalls, sends garbage or
** reads slowly only holds a connection slot until the idle timeout. The training thread
** is touched only by the store's mutex (telemetry.c).
**
** We open the listening socket ourselves (then hand it to libmicrohttpd) so that a port
** already taken is reported with the system's own words.
*/
#include "tetra_telemetry.h"
#include "core/tt_internal.h"
#include <errno.h>
#include <string.h>

#ifdef TETRA_HAVE_MHD
#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A scraper must finish a request within this many idle seconds, or is dropped. */
enum { IDLE_TIMEOUT_S = 10, MAX_CONNECTIONS = 64 };

static struct MHD_Daemon *g_daemon;
static int g_port = -1;
/* CPU seconds of the server's thread when it began its latest /metrics answer: written
** and read on that thread only (the answer reports it). */
static double g_cpu_s;

static double thread_cpu_now(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned int status,
                             const char *type, char *body, enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, mode);
  if (!r) {
    if (mode == MHD_RESPMEM_MUST_FREE) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size,
                                  void **req_cls) {
  (void)cls;
  (void)version;
  (void)upload_data;
  /* The first call only announces the headers; answer on the second. */
  if (*req_cls == NULL) {
    *req_cls = conn;
    return MHD_YES;
  }
  if (*upload_size != 0) {   /* a body we do not want: drop it */
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                 (char *)"only GET /metrics\n", MHD_RESPMEM_PERSISTENT);
  if (strcmp(url, "/metrics") != 0)
    return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain",
                 (char *)"not found: try /metrics\n", MHD_RESPMEM_PERSISTENT);
  g_cpu_s = thread_cpu_now();
  tt_telemetry_exporter_cpu(g_cpu_s);
  char *text = tt_telemetry_format();
  if (!text)
    return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                 (char *)"out of memory\n", MHD_RESPMEM_PERSISTENT);
  return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text,
               MHD_RESPMEM_MUST_FREE);
}

/* A listening socket on addr:port, or -1 with the reason. */
static int listen_on(const char *addr, int port, int *bound_port) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  int family;
  struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, addr, &v4->sin_addr) == 1) {
    family = AF_INET;
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
    len = sizeof *v4;
  } else if (inet_pton(AF_INET6, addr, &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    len = sizeof *v6;
  } else {
    return tt_set_error("log.prometheus_addr = \"%s\": not an IPv4 or IPv6 address "
                        "(127.0.0.1 keeps the endpoint local; 0.0.0.0 opens it to the "
                        "network)", addr);
  }
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TT_CHECK(fd >= 0, "prometheus: socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 64) != 0) {
    int err = errno;
    close(fd);
    return tt_set_error("cannot serve Prometheus metrics on %s:%d: %s (log.prometheus_port "
                        "is the base port, each rank adds its local rank: pick a free "
                        "range)", addr, port, strerror(err));
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 ||
      getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
    int err = errno;
    close(fd);
    return tt_set_error("prometheus: listening socket on %s:%d: %s", addr, port, strerror(err));
  }
  *bound_port = ntohs(family == AF_INET ? v4->sin_port : v6->sin6_port);
  return fd;
}

int tt_prom_available(void) { return 1; }

int tt_prom_start(const char *addr, int port) {
  TT_CHECK(!g_daemon, "prometheus: the endpoint is already running on port %d", g_port);
  TT_CHECK(port >= 0 && port <= 65535, "log.prometheus_port: %d is not a TCP port", port);
  int bound = 0;
  int fd = listen_on(addr, port, &bound);
  if (fd < 0) return -1;
  g_daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL,
                              on_request, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)IDLE_TIMEOUT_S,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
                              MHD_OPTION_END);
  if (!g_daemon) {
    close(fd);
    return tt_set_error("prometheus: libmicrohttpd could not start on %s:%d", addr, bound);
  }
  g_port = bound;
  return 0;
}

int tt_prom_port(void) { return g_daemon ? g_port : -1; }

double tt_prom_cpu_seconds(void) { return g_daemon ? g_cpu_s : 0; }

void tt_prom_stop(void) {
  if (!g_daemon) return;
  MHD_stop_daemon(g_daemon);   /* also closes the listening socket */
  tt_telemetry_exporter_cpu(0);
  g_daemon = NULL;
  g_port = -1;
}

#else   /* built without libmicrohttpd */

int tt_prom_available(void) { return 0; }

int tt_prom_start(const char *addr, int port) {
  (void)addr;
  (void)port;
  return tt_set_error("log.prometheus_port: this tetra was built without libmicrohttpd "
                      "(apt-get install libmicrohttpd-dev, then rebuild), so it cannot "
                      "serve metrics");
}

int tt_prom_port(void) { return -1; }
double tt_prom_cpu_seconds(void) { return 0; }
void tt_prom_stop(void) {}

#endif
