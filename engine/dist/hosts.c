/*
** hosts.c — which host each rank runs on, and whether a host still answers.
**
** Every rank learns every rank's hostname at start-up (one all-gather), so that a
** watchdog report names hosts, not only ranks. When a collective misses its deadline,
** the watchdog asks the other hosts of the stuck group whether they answer: a TCP
** connection to port 9 (discard) is refused at once by a host that is up and reachable
** (or accepted, where something listens there). No answer within the probe's time, or
** "no route to host", means the host is cut off from this one: its link is down, its
** packets are dropped, it is powered off. A firewall that silently drops the probe
** makes a live host look cut off, which is why the report says "does not answer".
*/
#include "dist/dist_internal.h"
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define TT_HOST_LEN 64          /* bytes per name in the table (longer names are cut) */
#define TT_PROBE_MAX_HOSTS 256  /* hosts one report probes (in parallel) */
#define TT_PROBE_S 2.0          /* how long a host has to answer */

static char *g_hosts;           /* world size x TT_HOST_LEN, by world rank */
static int g_nhosts;

static void own_hostname(char *out) {
  memset(out, 0, TT_HOST_LEN);
  if (gethostname(out, TT_HOST_LEN - 1) != 0) snprintf(out, TT_HOST_LEN, "?");
}

int tt_dist_hosts_init(MPI_Comm world, int size) {
  char me[TT_HOST_LEN];
  own_hostname(me);
  tt_dist_hosts_free();
  g_hosts = calloc((size_t)size, TT_HOST_LEN);
  if (!g_hosts) return tt_set_error("dist: out of memory for %d host names", size);
  g_nhosts = size;
  TT_MPI(MPI_Allgather(me, TT_HOST_LEN, MPI_CHAR, g_hosts, TT_HOST_LEN, MPI_CHAR, world),
         "init (host names)", NULL);
  return 0;
}

void tt_dist_hosts_free(void) {
  free(g_hosts);
  g_hosts = NULL;
  g_nhosts = 0;
}

const char *tt_dist_rank_host(int world_rank) {
  static char self[TT_HOST_LEN];
  if (g_hosts) {
    if (world_rank < 0 || world_rank >= g_nhosts) return NULL;
    return g_hosts + (size_t)world_rank * TT_HOST_LEN;
  }
  if (world_rank != 0) return NULL;
  own_hostname(self);
  return self;
}

/* -- Probing ------------------------------------------------------------------------ */

enum { PROBE_PENDING = 0, PROBE_ANSWERS = 1, PROBE_SILENT = 2 };

/* Starts a connection to host:9; returns the socket (state PENDING) or -1 with *state
** set: ANSWERS when refused or accepted at once, SILENT when the name does not resolve
** or there is no route. */
static int probe_start(const char *host, int *state) {
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  *state = PROBE_SILENT;
  if (getaddrinfo(host, "9", &hints, &ai) != 0 || !ai) return -1;
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  ai->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(ai);
    return -1;
  }
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  int err = errno;
  freeaddrinfo(ai);
  if (rc == 0 || err == ECONNREFUSED) *state = PROBE_ANSWERS;
  if (rc != 0 && err == EINPROGRESS) {
    *state = PROBE_PENDING;
    return fd;
  }
  close(fd);
  return -1;
}

/* Probes hosts[0..n) at once; state[i] becomes ANSWERS or SILENT. */
static void probe_hosts(const char *const *hosts, int n, int *state) {
  struct pollfd fds[TT_PROBE_MAX_HOSTS];
  int who[TT_PROBE_MAX_HOSTS], nfd = 0;
  for (int i = 0; i < n; i++) {
    int fd = probe_start(hosts[i], &state[i]);
    if (fd >= 0) {
      fds[nfd] = (struct pollfd){.fd = fd, .events = POLLOUT};
      who[nfd++] = i;
    }
  }
  double until = tt_dist_now() + TT_PROBE_S;
  int open = nfd;
  while (open > 0) {
    int left_ms = (int)((until - tt_dist_now()) * 1000.0);
    if (left_ms <= 0 || poll(fds, (nfds_t)nfd, left_ms) <= 0) break;
    for (int k = 0; k < nfd; k++) {
      if (fds[k].fd < 0 || !fds[k].revents) continue;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fds[k].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      state[who[k]] = (err == 0 || err == ECONNREFUSED) ? PROBE_ANSWERS : PROBE_SILENT;
      close(fds[k].fd);
      fds[k].fd = -1;
      open--;
    }
  }
  for (int k = 0; k < nfd; k++) {
    if (fds[k].fd < 0) continue;
    state[who[k]] = PROBE_SILENT;
    close(fds[k].fd);
  }
}

/* Adds the distinct hosts of the given world ranks, other than this rank's own, to
** hosts[*n..) (up to TT_PROBE_MAX_HOSTS). */
static void collect_hosts(const int *ranks, int nranks, const char *mine,
                          const char **hosts, int *n) {
  for (int i = 0; i < nranks && *n < TT_PROBE_MAX_HOSTS; i++) {
    const char *h = tt_dist_rank_host(ranks[i]);
    if (!h || strcmp(h, mine) == 0) continue;
    int seen = 0;
    for (int k = 0; k < *n && !seen; k++) seen = strcmp(hosts[k], h) == 0;
    if (!seen) hosts[(*n)++] = h;
  }
}

int tt_dist_hosts_report(const tt_comm *c, int self_world_rank, char *out, size_t size,
                         int *probed) {
  out[0] = '\0';
  *probed = 0;
  if (!g_hosts) return 0;
  const char *mine = tt_dist_rank_host(self_world_rank);
  const char *hosts[TT_PROBE_MAX_HOSTS];
  int state[TT_PROBE_MAX_HOSTS];
  int n = 0, n_all, silent = 0;
  /* The group's other hosts come first, then every other host of the job, all probed in
  ** one round (a cut-off host's own ranks must report before their daemon's keepalive
  ** ends them). The group's silent hosts are the report; when they all answer (a
  ** collective can wait on a rank that itself waits on a lost host), or none does (is
  ** this host the one cut off?), every host counts. */
  collect_hosts(c->world_ranks, c->size, mine, hosts, &n);
  n_all = n;
  for (int r = 0; r < g_nhosts && n_all < TT_PROBE_MAX_HOSTS; r++)
    collect_hosts(&r, 1, mine, hosts, &n_all);
  if (n_all > 0) probe_hosts(hosts, n_all, state);
  for (int i = 0; i < n; i++) silent += state[i] == PROBE_SILENT;
  if (silent == 0 || silent == n) {
    n = n_all;
    silent = 0;
    for (int i = 0; i < n; i++) silent += state[i] == PROBE_SILENT;
  }
  *probed = n;
  if (silent == 0) {
    if (n > 0) snprintf(out, size, "; every other host answers");
    return 0;
  }
  if (silent == n && n > 1) {
    snprintf(out, size, "; none of the %d other hosts answers: this host (%s) is cut off", n,
             mine);
    return silent;
  }
  size_t used = (size_t)snprintf(out, size, "; %s ", silent == 1 ? "host" : "hosts");
  int listed = 0;
  for (int i = 0; i < n && used + 32 < size; i++) {
    if (state[i] != PROBE_SILENT) continue;
    used += (size_t)snprintf(out + used, size - used, "%s%s (world ranks ", listed++ ? ", " : "",
                             hosts[i]);
    int first = 1;
    for (int r = 0; r < g_nhosts && used + 24 < size; r++) {
      if (strcmp(tt_dist_rank_host(r), hosts[i]) != 0) continue;
      used += (size_t)snprintf(out + used, size - used, "%s%d", first ? "" : ",", r);
      first = 0;
    }
    if (used + 2 < size) used += (size_t)snprintf(out + used, size - used, ")");
  }
  if (used + 20 < size)
    snprintf(out + used, size - used, " %s not answer", silent == 1 ? "does" : "do");
  return silent;
}
