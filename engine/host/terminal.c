/*
** terminal.c — Ctrl-C in the REPL and the terminal under mpirun: the SIGINT flag the REPL
** polls at safe points, and rank 0 taking the terminal from mpirun for its prompt.
*/
#include "host/host.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

/* -- Interrupts (Ctrl-C) ------------------------------------------------------------- */

/* The REPL catches SIGINT instead of dying. The handler only sets a flag, which the REPL
** polls at points where stopping is safe (between training steps; under mpirun those are
** points every rank reaches, so the stop is agreed there). For ordinary Lua code the
** handler may also arm a count hook on the running state, as lua.c does, which raises
** "interrupted" at the next Lua instruction the interpreter runs. */
volatile sig_atomic_t g_interrupted = 0;
static volatile sig_atomic_t g_hook_allowed = 0;
volatile sig_atomic_t g_in_readline = 0;
volatile sig_atomic_t g_unanswered = 0;   /* Ctrl-Cs since a safe point took one */
static int g_newline_fd = -1;   /* the terminal, where the echoed ^C gets its line end */
lua_State *g_main_L = NULL;

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  g_interrupted = g_unanswered = 0;
  luaL_error(L, "interrupted (Ctrl-C)");
}

static void on_sigint(int sig) {
  (void)sig;
  g_interrupted = 1;
  /* A command that reaches no safe point (a C call that does not return, a Lua loop
  ** under mpirun) cannot be stopped in place: the third Ctrl-C in a row ends the
  ** process, and under mpirun the job with it. */
  if (!g_in_readline && ++g_unanswered >= 3) {
    static const char msg[] = "\ntetra: Ctrl-C three times and no safe point reached: ending "
                              "the session\n";
    ssize_t w = write(g_newline_fd >= 0 ? g_newline_fd : STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(130);
  }
  /* The terminal echoed "^C" where the cursor was; what the command prints next starts
  ** on a line of its own (write is async-signal-safe). */
  if (!g_in_readline && g_newline_fd >= 0) {
    ssize_t w = write(g_newline_fd, "\n", 1);
    (void)w;
  }
  if (g_hook_allowed && g_main_L)
    lua_sethook(g_main_L, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* The handler runs on a stack of its own. oneDNN's JIT f32 GEMM kernels (Debian 12's
** libdnnl 2.x; fixed upstream in 3.11) point rsp into their heap workspace while they
** run, so a signal frame pushed at rsp lands on the heap: Ctrl-C during a training step
** corrupted malloc's chunks and the process died in a later free (oneDNN issue 4845).
** Linux hands a Ctrl-C to the main thread when it can take it, and that is the thread
** given this stack; tests/cli/sigint_blas.sh sends signals into such GEMMs. An
** alternate stack already set (ASan's) is kept. */
static int use_signal_stack(void) {
  stack_t ss;
  if (sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_DISABLE) && ss.ss_size > 0) return 0;
  long min = sysconf(_SC_SIGSTKSZ);
  size_t size = 64 * 1024;
  if (min > 0 && (size_t)min * 4 > size) size = (size_t)min * 4;
  ss.ss_sp = malloc(size);   /* for the process's life */
  if (!ss.ss_sp) return -1;
  ss.ss_size = size;
  ss.ss_flags = 0;
  return sigaltstack(&ss, NULL);
}

/* host.catch_interrupts(): from now on Ctrl-C sets the flag instead of ending the
** process. No SA_RESTART, so a blocking read returns and the prompt can start again. */
int tt_host_catch_interrupts(lua_State *L) {
  g_newline_fd = g_tty_out ? fileno(g_tty_out) : isatty(STDOUT_FILENO) ? STDOUT_FILENO : -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = use_signal_stack() == 0 ? SA_ONSTACK : 0;
  sigemptyset(&sa.sa_mask);
  lua_pushboolean(L, sigaction(SIGINT, &sa, NULL) == 0);
  return 1;
}

/* host.interrupted([clear]) -> whether Ctrl-C came since the flag was last cleared. */
int tt_host_interrupted(lua_State *L) {
  lua_pushboolean(L, g_interrupted != 0);
  if (lua_toboolean(L, 1)) g_interrupted = g_unanswered = 0;
  return 1;
}

/* host.interrupt_lua(on): whether Ctrl-C may stop Lua code wherever it runs (a command
** that has no safe points of its own), or only sets the flag. */
int tt_host_interrupt_lua(lua_State *L) {
  g_hook_allowed = lua_toboolean(L, 1);
  if (!g_hook_allowed) lua_sethook(g_main_L, NULL, 0, 0);
  return 0;
}

/* -- Stop requests (SIGUSR1) ---------------------------------------------------------- */

/* A training run catches SIGUSR1 (a scheduler's warning before preemption or the end of
** a time limit; mpirun passes it on to every rank): the handler sets a flag that the
** training loop reads at each step boundary, where the ranks agree on it, save a
** checkpoint and stop. SA_RESTART: MPI's and the file system's calls go on. */
static volatile sig_atomic_t g_stop_requested = 0;

static void on_stop_signal(int sig) {
  (void)sig;
  g_stop_requested = 1;
}

/* host.catch_stop_signal() -> whether SIGUSR1 now sets the flag. */
int tt_host_catch_stop_signal(lua_State *L) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART | (use_signal_stack() == 0 ? SA_ONSTACK : 0);
  sigemptyset(&sa.sa_mask);
  lua_pushboolean(L, sigaction(SIGUSR1, &sa, NULL) == 0);
  return 1;
}

/* host.stop_requested([clear]) -> whether SIGUSR1 came since the flag was last cleared. */
int tt_host_stop_requested(lua_State *L) {
  lua_pushboolean(L, g_stop_requested != 0);
  if (lua_toboolean(L, 1)) g_stop_requested = 0;
  return 1;
}

/* -- The terminal under mpirun ---------------------------------------------------------- */

/* mpirun owns the terminal: rank 0's stdin is a pipe, and Ctrl-C goes to mpirun, which
** ends the job. host.take_terminal() opens /dev/tty for rank 0's line editing and makes
** rank 0's process group the terminal's foreground one, so keys and Ctrl-C reach rank 0
** (mpirun, now in the background, stops forwarding stdin). host.give_back_terminal()
** returns the foreground to mpirun's group. */
FILE *g_tty_in = NULL, *g_tty_out = NULL;
static pid_t g_saved_fg = -1;

static int set_foreground(int fd, pid_t pgrp) {
  /* A background group that calls tcsetpgrp is sent SIGTTOU; ignore it for the call. */
  struct sigaction ign, old;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGTTOU, &ign, &old);
  int rc = tcsetpgrp(fd, pgrp);
  sigaction(SIGTTOU, &old, NULL);
  return rc;
}

/* Whether the launcher (our parent, mpirun) reads a terminal: a session piped into mpirun
** is read from that pipe, not from the terminal it was started in. */
static int parent_reads_terminal(void) {
  char link[64], target[PATH_MAX];
  snprintf(link, sizeof link, "/proc/%d/fd/0", (int)getppid());
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  return !strncmp(target, "/dev/pts/", 9) || !strncmp(target, "/dev/tty", 8);
}

int tt_host_take_terminal(lua_State *L) {
  if (!g_tty_in && !parent_reads_terminal()) {
    lua_pushnil(L);
    lua_pushstring(L, "the launcher's input is not a terminal");
    return 2;
  }
  if (!g_tty_in) {
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY);
    if (fd < 0) {
      lua_pushnil(L);
      lua_pushfstring(L, "/dev/tty: %s", strerror(errno));
      return 2;
    }
    g_tty_in = fdopen(fd, "r");
    int fd2 = dup(fd);
    g_tty_out = fd2 >= 0 ? fdopen(fd2, "w") : NULL;
    if (!g_tty_in || !g_tty_out) {
      lua_pushnil(L);
      lua_pushstring(L, "/dev/tty: cannot open a stream");
      return 2;
    }
    setvbuf(g_tty_out, NULL, _IOLBF, 0);
    g_saved_fg = tcgetpgrp(fd);
  }
  int fd = fileno(g_tty_in);
  if (set_foreground(fd, getpgrp()) != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "cannot take the terminal: %s", strerror(errno));
    return 2;
  }
  tt_host_line_streams(g_tty_in, g_tty_out);
  lua_pushboolean(L, 1);
  return 1;
}

int tt_host_give_back_terminal(lua_State *L) {
  if (g_tty_in && g_saved_fg > 0) set_foreground(fileno(g_tty_in), g_saved_fg);
  (void)L;
  return 0;
}

/* host.tty_write(text): to the terminal taken by take_terminal (stdout otherwise). */
int tt_host_tty_write(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  FILE *f = g_tty_out ? g_tty_out : stdout;
  fwrite(s, 1, n, f);
  fflush(f);
  return 0;
}
