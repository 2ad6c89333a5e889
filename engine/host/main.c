/*
** main.c — the `tetra` binary: LuaJIT plus the whole engine.
**
** The engine's symbols are exported (CMake ENABLE_EXPORTS), so Lua reaches them through
** ffi.C. This file only does what the FFI cannot do well: parse the command line, find
** the Lua library and headers, load YAML into Lua tables (libyaml), read lines with
** libedit, and forward the `tokenizer` / `data` subcommands to their C implementations.
** Everything else (recipes, configs, the REPL, the spec runner) lives in lua/tetra/.
**
** Exit codes: 0 ok, 1 runtime error, 2 bad usage (one line on stderr).
*/
#include "tetra.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <yaml.h>

#ifdef TETRA_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#ifndef TETRA_VERSION
#define TETRA_VERSION "0.0.0"
#endif
#ifndef TETRA_SOURCE_DIR
#define TETRA_SOURCE_DIR "."
#endif

/* Implemented by other modules when they are linked in; absent symbols are NULL. */
extern int tt_tokenizer_cli(int argc, char **argv) __attribute__((weak));
extern int tt_data_cli(int argc, char **argv) __attribute__((weak));
extern int tt_cuda_init(void) __attribute__((weak));

enum { EXIT_USAGE = 2 };

static const char usage_text[] =
  "usage: tetra [command] [arguments]\n"
  "\n"
  "  tetra                          open the interactive REPL\n"
  "  tetra run FILE [--set k=v]...  run a Lua recipe or a YAML config\n"
  "  tetra -i FILE [--set k=v]...   run FILE's setup, then open the REPL with its\n"
  "                                 model, optimizer, data and config in scope\n"
  "  mpirun -np N tetra -i FILE     one prompt (rank 0's terminal) for every rank\n"
  "  tetra -e CODE [ARG]...         run a Lua chunk\n"
  "  tetra test PATH...             run Lua spec files (or every *_spec.lua in a dir)\n"
  "  tetra tokenizer ...            tokenizer tools (tetra tokenizer --help)\n"
  "  tetra data ...                 data tools (tetra data --help)\n"
  "  tetra convert --to hf|--from hf SRC OUT\n"
  "                                 Hugging Face folders <-> checkpoints (tetra convert --help)\n"
  "  tetra monitor-config HOSTFILE --port BASE [--np N]\n"
  "                                 a Prometheus scrape config for a job's ranks\n"
  "  tetra trace merge OUT FILE...   one Chrome/Perfetto timeline from the ranks'\n"
  "                                 traces (log.trace_steps)\n"
  "  tetra launch [opts] -- CMD...  run CMD (mpirun ... tetra run ...), restarting it\n"
  "                                 from the latest checkpoint when it fails\n"
  "                                 (tetra launch --help)\n"
  "  tetra plot OUT_DIR FILE... [--label NAME=FILE]\n"
  "                                 PNG charts of metrics files (gnuplot)\n"
  "  tetra profile RECIPE [--set k=v]...\n"
  "                                 per-layer times and memory, the balanced\n"
  "                                 pipeline split, measured (tetra profile --help)\n"
  "  tetra plan [FILE] [options]    predict memory and speed of every parallel layout\n"
  "                                 on a cluster, best first (tetra plan --help)\n"
  "  tetra sweep [FILE] [options]   run layouts under mpirun beside the prediction\n"
  "                                 (tetra sweep --help)\n"
  "  tetra --help | --version\n"
  "\n"
  "Config values: recipe defaults < YAML file < --set key=value (e.g.\n"
  "--set parallel.tensor_parallel_size=2). TETRA_HOME overrides where the Lua library\n"
  "and engine headers are found.\n";

static int usage_error(const char *fmt, const char *arg) {
  fputs("tetra: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs(" (see tetra --help)\n", stderr);
  return EXIT_USAGE;
}

/* -- Finding the library root ------------------------------------------------------- */

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static int is_root(const char *dir) {
  char probe[PATH_MAX];
  int n = snprintf(probe, sizeof probe, "%s/lua/tetra/init.lua", dir);
  return n > 0 && (size_t)n < sizeof probe && file_exists(probe);
}

/* The directory holding lua/ and engine/: $TETRA_HOME, an install prefix's
** share/tetra next to the executable, or the source tree the binary was built from.
** `root` has PATH_MAX bytes. */
static int find_root(char *root) {
  const char *home = getenv("TETRA_HOME");
  if (home && *home && strlen(home) < PATH_MAX && is_root(home)) {
    strcpy(root, home);
    return 0;
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = '\0';
      int k = snprintf(root, PATH_MAX, "%s/../share/tetra", exe);
      if (k > 0 && k < PATH_MAX && is_root(root)) return 0;
    }
  }
  if (strlen(TETRA_SOURCE_DIR) < PATH_MAX && is_root(TETRA_SOURCE_DIR)) {
    strcpy(root, TETRA_SOURCE_DIR);
    return 0;
  }
  return -1;
}

/* -- YAML -> Lua tables ------------------------------------------------------------- */

/* Plain (unquoted) scalars become numbers, booleans or nil the way YAML 1.2's core
** schema reads them; quoted scalars always stay strings. */
static void push_scalar(lua_State *L, const yaml_event_t *ev) {
  const char *s = (const char *)ev->data.scalar.value;
  size_t len = ev->data.scalar.length;
  if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
    lua_pushlstring(L, s, len);
    return;
  }
  if (len == 0 || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
      !strcmp(s, "NULL")) {
    lua_pushnil(L);
    return;
  }
  if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
    lua_pushboolean(L, 1);
    return;
  }
  if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
    lua_pushboolean(L, 0);
    return;
  }
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  if (*p == '.') p++;
  if (*p >= '0' && *p <= '9' && !(s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s + len) {
      lua_pushnumber(L, v);
      return;
    }
  }
  lua_pushlstring(L, s, len);
}

typedef struct yaml_reader {
  yaml_parser_t parser;
  char err[512];
} yaml_reader;

static int yaml_fail(yaml_reader *r, const char *what, const yaml_event_t *ev) {
  if (ev)
    snprintf(r->err, sizeof r->err, "%s at line %zu", what, ev->start_mark.line + 1);
  else if (r->parser.problem)
    snprintf(r->err, sizeof r->err, "%s at line %zu", r->parser.problem,
             r->parser.problem_mark.line + 1);
  else
    snprintf(r->err, sizeof r->err, "%s", what);
  return -1;
}

/* Pushes the node that starts with `ev` (already parsed). Returns 0 or -1 (r->err). */
static int yaml_push_node(lua_State *L, yaml_reader *r, yaml_event_t *ev, int depth);

static int yaml_next(yaml_reader *r, yaml_event_t *ev) {
  if (!yaml_parser_parse(&r->parser, ev)) return yaml_fail(r, "invalid YAML", NULL);
  return 0;
}

static int yaml_push_mapping(lua_State *L, yaml_reader *r, int depth) {
  lua_newtable(L);
  for (;;) {
    yaml_event_t key;
    if (yaml_next(r, &key)) return -1;
    if (key.type == YAML_MAPPING_END_EVENT) {
      yaml_event_delete(&key);
      return 0;
    }
    if (key.type != YAML_SCALAR_EVENT) {
      int rc = yaml_fail(r, "mapping keys must be plain scalars", &key);
      yaml_event_delete(&key);
      return rc;
    }
    /* Keys stay strings, even "1" or "true", so config paths read as written. */
    lua_pushlstring(L, (const char *)key.data.scalar.value, key.data.scalar.length);
    yaml_event_delete(&key);
    yaml_event_t val;
    if (yaml_next(r, &val)) return -1;
    int rc = yaml_push_node(L, r, &val, depth + 1);
    yaml_event_delete(&val);
    if (rc) return -1;
    lua_rawset(L, -3);
  }
}

static int yaml_push_sequence(lua_State *L, yaml_reader *r, int depth) {
  lua_newtable(L);
  int i = 0;
  for (;;) {
    yaml_event_t item;
    if (yaml_next(r, &item)) return -1;
    if (item.type == YAML_SEQUENCE_END_EVENT) {
      yaml_event_delete(&item);
      return 0;
    }
    int rc = yaml_push_node(L, r, &item, depth + 1);
    yaml_event_delete(&item);
    if (rc) return -1;
    lua_rawseti(L, -2, ++i);
  }
}

static int yaml_push_node(lua_State *L, yaml_reader *r, yaml_event_t *ev, int depth) {
  if (depth > 64) return yaml_fail(r, "YAML nested too deeply", ev);
  if (!lua_checkstack(L, 4)) return yaml_fail(r, "out of Lua stack", ev);
  switch (ev->type) {
  case YAML_SCALAR_EVENT: push_scalar(L, ev); return 0;
  case YAML_MAPPING_START_EVENT: return yaml_push_mapping(L, r, depth);
  case YAML_SEQUENCE_START_EVENT: return yaml_push_sequence(L, r, depth);
  case YAML_ALIAS_EVENT: return yaml_fail(r, "YAML aliases (*name) are not supported", ev);
  default: return yaml_fail(r, "unexpected YAML event", ev);
  }
}

/* Parses one YAML document from the reader's input and pushes it (nil when empty). */
static int yaml_push_document(lua_State *L, yaml_reader *r) {
  yaml_event_t ev;
  int top = lua_gettop(L);
  for (;;) {
    if (yaml_next(r, &ev)) return -1;
    if (ev.type == YAML_STREAM_END_EVENT) {
      yaml_event_delete(&ev);
      lua_pushnil(L);
      return 0;
    }
    if (ev.type == YAML_STREAM_START_EVENT || ev.type == YAML_DOCUMENT_START_EVENT) {
      yaml_event_delete(&ev);
      continue;
    }
    if (ev.type == YAML_DOCUMENT_END_EVENT) {
      yaml_event_delete(&ev);
      lua_pushnil(L);
      return 0;
    }
    int rc = yaml_push_node(L, r, &ev, 0);
    yaml_event_delete(&ev);
    if (rc) lua_settop(L, top);
    return rc;
  }
}

/* host.load_yaml(path) / host.parse_yaml(text) -> value | nil, "message". */
static int l_yaml(lua_State *L, int from_file) {
  const char *arg = luaL_checkstring(L, 1);
  size_t text_len = 0;
  if (!from_file) lua_tolstring(L, 1, &text_len);
  FILE *fp = NULL;
  if (from_file) {
    fp = fopen(arg, "rb");
    if (!fp) {
      lua_pushnil(L);
      lua_pushfstring(L, "%s: %s", arg, strerror(errno));
      return 2;
    }
  }
  yaml_reader r;
  memset(&r, 0, sizeof r);
  if (!yaml_parser_initialize(&r.parser)) {
    if (fp) fclose(fp);
    return luaL_error(L, "out of memory initialising the YAML parser");
  }
  if (fp)
    yaml_parser_set_input_file(&r.parser, fp);
  else
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)arg, text_len);
  int rc = yaml_push_document(L, &r);
  yaml_parser_delete(&r.parser);
  if (fp) fclose(fp);
  if (rc) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", from_file ? arg : "(yaml)", r.err);
    return 2;
  }
  return 1;
}

static int l_load_yaml(lua_State *L) { return l_yaml(L, 1); }
static int l_parse_yaml(lua_State *L) { return l_yaml(L, 0); }

/* -- Interrupts (Ctrl-C) ------------------------------------------------------------- */

/* The REPL catches SIGINT instead of dying. The handler only sets a flag, which the REPL
** polls at points where stopping is safe (between training steps; under mpirun those are
** points every rank reaches, so the stop is agreed there). For ordinary Lua code the
** handler may also arm a count hook on the running state, as lua.c does, which raises
** "interrupted" at the next Lua instruction the interpreter runs. */
static volatile sig_atomic_t g_interrupted = 0;
static volatile sig_atomic_t g_hook_allowed = 0;
static volatile sig_atomic_t g_in_readline = 0;
static volatile sig_atomic_t g_unanswered = 0;   /* Ctrl-Cs since a safe point took one */
static int g_newline_fd = -1;   /* the terminal, where the echoed ^C gets its line end */
static lua_State *g_main_L = NULL;

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

/* host.catch_interrupts(): from now on Ctrl-C sets the flag instead of ending the
** process. No SA_RESTART, so a blocking read returns and the prompt can start again. */
static FILE *g_tty_out;

static int l_catch_interrupts(lua_State *L) {
  g_newline_fd = g_tty_out ? fileno(g_tty_out) : isatty(STDOUT_FILENO) ? STDOUT_FILENO : -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  lua_pushboolean(L, sigaction(SIGINT, &sa, NULL) == 0);
  return 1;
}

/* host.interrupted([clear]) -> whether Ctrl-C came since the flag was last cleared. */
static int l_interrupted(lua_State *L) {
  lua_pushboolean(L, g_interrupted != 0);
  if (lua_toboolean(L, 1)) g_interrupted = g_unanswered = 0;
  return 1;
}

/* host.interrupt_lua(on): whether Ctrl-C may stop Lua code wherever it runs (a command
** that has no safe points of its own), or only sets the flag. */
static int l_interrupt_lua(lua_State *L) {
  g_hook_allowed = lua_toboolean(L, 1);
  if (!g_hook_allowed) lua_sethook(g_main_L, NULL, 0, 0);
  return 0;
}

/* -- The terminal under mpirun ---------------------------------------------------------- */

/* mpirun owns the terminal: rank 0's stdin is a pipe, and Ctrl-C goes to mpirun, which
** ends the job. host.take_terminal() opens /dev/tty for rank 0's line editing and makes
** rank 0's process group the terminal's foreground one, so keys and Ctrl-C reach rank 0
** (mpirun, now in the background, stops forwarding stdin). host.give_back_terminal()
** returns the foreground to mpirun's group. */
static FILE *g_tty_in = NULL;
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

static int l_take_terminal(lua_State *L) {
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
#ifdef TETRA_HAVE_LIBEDIT
  rl_instream = g_tty_in;
  rl_outstream = g_tty_out;
#endif
  lua_pushboolean(L, 1);
  return 1;
}

static int l_give_back_terminal(lua_State *L) {
  if (g_tty_in && g_saved_fg > 0) set_foreground(fileno(g_tty_in), g_saved_fg);
  (void)L;
  return 0;
}

/* host.tty_write(text): to the terminal taken by take_terminal (stdout otherwise). */
static int l_tty_write(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  FILE *f = g_tty_out ? g_tty_out : stdout;
  fwrite(s, 1, n, f);
  fflush(f);
  return 0;
}

/* -- Line reading (libedit when present) -------------------------------------------- */

#ifdef TETRA_HAVE_LIBEDIT
/* Tab completion: libedit hands over the word before the cursor; the Lua function set by
** host.set_completer(fn) gets (word, line up to the cursor) and returns an array of
** candidates, each a whole replacement for the word. */
static int g_completer_ref = LUA_NOREF;
static lua_State *g_completer_L = NULL;
static char **g_matches = NULL;
static int g_n_matches = 0, g_next_match = 0;

static void free_matches(void) {
  for (int i = 0; i < g_n_matches; i++) free(g_matches[i]);
  free(g_matches);
  g_matches = NULL;
  g_n_matches = g_next_match = 0;
}

static char *match_generator(const char *text, int state) {
  (void)text;
  if (state == 0) g_next_match = 0;
  if (g_next_match >= g_n_matches) return NULL;
  return strdup(g_matches[g_next_match++]);
}

static char **complete(const char *text, int start, int end) {
  (void)end;
  lua_State *L = g_completer_L;
  rl_attempted_completion_over = 1;   /* no file-name completion when Lua finds none */
  free_matches();
  if (!L || g_completer_ref == LUA_NOREF) return NULL;
  int top = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, g_completer_ref);
  lua_pushstring(L, text);
  lua_pushlstring(L, rl_line_buffer, (size_t)start + strlen(text));
  if (lua_pcall(L, 2, 1, 0) != 0 || !lua_istable(L, -1)) {
    lua_settop(L, top);
    return NULL;
  }
  int n = (int)lua_objlen(L, -1);
  g_matches = n > 0 ? calloc((size_t)n, sizeof(char *)) : NULL;
  for (int i = 0; g_matches && i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    const char *m = lua_tostring(L, -1);
    if (m && (g_matches[g_n_matches] = strdup(m)) != NULL) g_n_matches++;
    lua_pop(L, 1);
  }
  lua_settop(L, top);
  if (g_n_matches == 0) return NULL;
  return rl_completion_matches(text, match_generator);
}
#endif

/* host.set_completer(fn): fn(word, line) -> { candidates } drives Tab. */
static int l_set_completer(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
#ifdef TETRA_HAVE_LIBEDIT
  if (g_completer_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, g_completer_ref);
  lua_pushvalue(L, 1);
  g_completer_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  /* Dots and colons stay inside the word, so "model.tok<Tab>" completes a field. */
  static char breaks[] = " \t\n\"'`<>=;|&{}()[],+-*/%^~#";
  rl_completer_word_break_characters = breaks;
  rl_basic_word_break_characters = breaks;
  rl_attempted_completion_function = complete;
#endif
  return 0;
}

/* host.readline(prompt) -> line without the newline; nil at end of input; or false when
** Ctrl-C interrupted the line being typed (the REPL starts a fresh one). The prompt is
** only shown on a terminal so piped sessions stay clean. */
static int l_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "");
  int tty = isatty(STDIN_FILENO) || g_tty_in;
  g_interrupted = g_unanswered = 0;
#ifdef TETRA_HAVE_LIBEDIT
  if (tty) {
    g_completer_L = L;
    g_in_readline = 1;
    char *line = readline(prompt);
    g_in_readline = 0;
    g_completer_L = NULL;
    if (g_interrupted) {
      g_interrupted = 0;
      free(line);
      fputs("^C\n", rl_outstream ? rl_outstream : stdout);
      fflush(rl_outstream ? rl_outstream : stdout);
      lua_pushboolean(L, 0);
      return 1;
    }
    if (!line) return 0;
    lua_pushstring(L, line);
    free(line);
    return 1;
  }
#endif
  FILE *in = g_tty_in ? g_tty_in : stdin;
  if (tty) {
    FILE *out = g_tty_out ? g_tty_out : stdout;
    fputs(prompt, out);
    fflush(out);
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  int c, any = 0;
  while ((c = getc(in)) != EOF && c != '\n') {
    luaL_addchar(&b, (char)c);
    any = 1;
  }
  if (c == EOF && g_interrupted && ferror(in)) {
    clearerr(in);
    g_interrupted = 0;
    lua_pushboolean(L, 0);
    return 1;
  }
  if (c == EOF && !any) return 0;
  luaL_pushresult(&b);
  return 1;
}

static int l_add_history(lua_State *L) {
  const char *line = luaL_checkstring(L, 1);
#ifdef TETRA_HAVE_LIBEDIT
  add_history(line);
#else
  (void)line;
#endif
  return 0;
}

/* host.history(path, "load"|"save"): silently does nothing without libedit. */
static int l_history(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  const char *op = luaL_checkstring(L, 2);
#ifdef TETRA_HAVE_LIBEDIT
  stifle_history(2000);
  int rc = !strcmp(op, "save") ? write_history(path) : read_history(path);
  lua_pushboolean(L, rc == 0);
#else
  (void)path;
  (void)op;
  lua_pushboolean(L, 0);
#endif
  return 1;
}

/* -- Small OS helpers --------------------------------------------------------------- */

static int l_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, STDIN_FILENO)));
  return 1;
}

static int l_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
  return 1;
}

/* host.sleep(seconds). */
static int l_sleep(lua_State *L) {
  double s = luaL_checknumber(L, 1);
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
  return 0;
}

static int l_is_dir(lua_State *L) {
  struct stat st;
  lua_pushboolean(L, stat(luaL_checkstring(L, 1), &st) == 0 && S_ISDIR(st.st_mode));
  return 1;
}

/* host.listdir(path) -> { names... } (sorted, without . and ..) | nil, message. */
static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int l_listdir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  DIR *d = opendir(path);
  if (!d) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", path, strerror(errno));
    return 2;
  }
  lua_newtable(L);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    lua_pushstring(L, e->d_name);
    lua_rawseti(L, -2, ++n);
  }
  closedir(d);
  /* Sort through a C array of the interned strings (they stay anchored in the table). */
  const char **names = malloc(sizeof(char *) * (size_t)(n ? n : 1));
  if (!names) return luaL_error(L, "out of memory listing %s", path);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    names[i] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, i + 1);
  }
  free(names);
  return 1;
}

static const luaL_Reg host_funcs[] = {
  {"load_yaml", l_load_yaml}, {"parse_yaml", l_parse_yaml}, {"readline", l_readline},
  {"add_history", l_add_history}, {"history", l_history}, {"isatty", l_isatty},
  {"now", l_now}, {"is_dir", l_is_dir}, {"listdir", l_listdir}, {"sleep", l_sleep},
  {"catch_interrupts", l_catch_interrupts}, {"interrupted", l_interrupted},
  {"interrupt_lua", l_interrupt_lua}, {"set_completer", l_set_completer},
  {"take_terminal", l_take_terminal}, {"give_back_terminal", l_give_back_terminal},
  {"tty_write", l_tty_write}, {NULL, NULL}};

/* Registers package.loaded["tetra.host"] and sets package.path to the library root. */
static void open_host(lua_State *L, const char *root) {
  lua_newtable(L);
  luaL_register(L, NULL, host_funcs);
  lua_pushstring(L, root);
  lua_setfield(L, -2, "root");
  lua_pushstring(L, TETRA_SOURCE_DIR);
  lua_setfield(L, -2, "source_dir");
  lua_pushstring(L, TETRA_VERSION);
  lua_setfield(L, -2, "version");
#ifdef TETRA_HAVE_LIBEDIT
  lua_pushboolean(L, 1);
#else
  lua_pushboolean(L, 0);
#endif
  lua_setfield(L, -2, "have_libedit");
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushvalue(L, -3);
  lua_setfield(L, -2, "tetra.host");
  lua_pop(L, 1);
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;%s", root, root, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 3);
}

/* -- Running Lua -------------------------------------------------------------------- */

/* Message handler: errors raised as {message = ..., user = true} (config errors, usage
** errors from Lua) print as they are; anything else gets a traceback. */
static int msg_handler(lua_State *L) {
  if (lua_istable(L, 1)) {
    lua_getfield(L, 1, "message");
    if (lua_isstring(L, -1)) return 1;
    lua_pop(L, 1);
  }
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* Calls the function below `nargs` arguments on the stack; an integer result is the exit
** code (nil / true: 0, false: 1). Errors print "tetra: message" and give 1. */
static int call_lua(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msg_handler);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, 1, base);
  int code = 0;
  if (rc != 0) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "tetra: %s\n", msg ? msg : "(error)");
    code = 1;
  } else if (lua_type(L, -1) == LUA_TNUMBER) {
    code = (int)lua_tointeger(L, -1);
  } else if (lua_type(L, -1) == LUA_TBOOLEAN) {
    code = lua_toboolean(L, -1) ? 0 : 1;
  }
  lua_settop(L, base - 1);
  return code;
}

/* invoke(module, fn, ...) = require(module)[fn](...), run inside the pcall so that a
** failing require reports like any other error. */
static int l_invoke(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 1);
  lua_getfield(L, -1, lua_tostring(L, 2));
  lua_replace(L, 2);
  lua_pop(L, 1);
  lua_remove(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/* Pushes the callable and the two leading arguments for call_lua(L, 2 + nargs). */
static void push_module_fn(lua_State *L, const char *module, const char *fn) {
  lua_pushcfunction(L, l_invoke);
  lua_pushstring(L, module);
  lua_pushstring(L, fn);
}

static void push_strings(lua_State *L, char **v, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* Sets the global `arg` like the luajit executable: arg[0] = script, arg[1..] = rest. */
static void set_arg(lua_State *L, const char *script, char **rest, int n) {
  push_strings(L, rest, n);
  lua_pushstring(L, script);
  lua_rawseti(L, -2, 0);
  lua_setglobal(L, "arg");
}

/* Collects --set key=value pairs (also --set=key=value) from argv[from..] into a Lua
** array of strings on the stack. Returns 0 or EXIT_USAGE after printing why. */
static int push_sets(lua_State *L, int argc, char **argv, int from) {
  lua_newtable(L);
  int n = 0;
  for (int i = from; i < argc; i++) {
    const char *kv = NULL;
    if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "-s")) {
      if (i + 1 >= argc) return usage_error("%s needs key=value", argv[i]);
      kv = argv[++i];
    } else if (!strncmp(argv[i], "--set=", 6)) {
      kv = argv[i] + 6;
    } else {
      return usage_error("unexpected argument '%s'", argv[i]);
    }
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return usage_error("--set needs key=value, got '%s'", kv);
    lua_pushstring(L, kv);
    lua_rawseti(L, -2, ++n);
  }
  return 0;
}

static int cmd_run(lua_State *L, int argc, char **argv, int interactive) {
  if (argc < 3) {
    if (interactive) {
      push_module_fn(L, "tetra.repl", "main");
      return call_lua(L, 2);
    }
    return usage_error("%s needs a FILE: tetra run FILE [--set key=value]...", "run");
  }
  if (argv[2][0] == '-' && argv[2][1] != '\0')
    return usage_error("expected a FILE, got option '%s'", argv[2]);
  set_arg(L, argv[2], argv + 3, argc - 3);
  push_module_fn(L, interactive ? "tetra.repl" : "tetra.config", interactive ? "main" : "run_file");
  lua_pushstring(L, argv[2]);
  int rc = push_sets(L, argc, argv, 3);
  if (rc) return rc;
  return call_lua(L, 4);
}

static int cmd_eval(lua_State *L, int argc, char **argv) {
  if (argc < 3) return usage_error("%s needs CODE", "-e");
  set_arg(L, "-e", argv + 3, argc - 3);
  if (luaL_loadbuffer(L, argv[2], strlen(argv[2]), "=(command line)")) {
    fprintf(stderr, "tetra: %s\n", lua_tostring(L, -1));
    return 1;
  }
  return call_lua(L, 0);
}

static int cmd_test(lua_State *L, int argc, char **argv) {
  if (argc < 3) return usage_error("%s needs at least one spec file or directory", "test");
  push_module_fn(L, "tetra.spec", "main");
  push_strings(L, argv + 2, argc - 2);
  return call_lua(L, 3);
}

/* A command name is a plain word ([a-z0-9-]) whose module file is in lua/tetra/cli/
** ("monitor-config" -> monitor_config.lua). */
static int is_lua_command(const char *root, const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > 64) return 0;
  char file[96];
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return 0;
    file[i] = c == '-' ? '_' : c;
  }
  file[n] = '\0';
  char path[PATH_MAX];
  int len = snprintf(path, sizeof path, "%s/lua/tetra/cli/%s.lua", root, file);
  return len > 0 && (size_t)len < sizeof path && file_exists(path);
}

static int cmd_lua(lua_State *L, int argc, char **argv) {
  char module[96] = "tetra.cli.";
  size_t at = strlen(module);
  for (const char *c = argv[1]; *c && at + 1 < sizeof module; c++) module[at++] = *c == '-' ? '_' : *c;
  module[at] = '\0';
  set_arg(L, argv[1], argv + 2, argc - 2);
  if (!lua_checkstack(L, argc + 8)) return usage_error("%s: too many arguments", argv[1]);
  push_module_fn(L, module, "main");
  for (int i = 2; i < argc; i++) lua_pushstring(L, argv[i]);
  return call_lua(L, 2 + (argc - 2));
}

/* OpenMP workers that spin between parallel regions take the cores from OpenBLAS's own
** threads (and from other processes on a shared node): a Llama block's forward+backward
** measured 3x slower on 2 busy cores with libgomp's default policy. libgomp reads
** OMP_WAIT_POLICY in its constructor, before main; an executable's .preinit_array runs
** before any shared library's constructor, so the passive policy is chosen there when
** the user has not chosen one (no re-execution: the process keeps its name, and valgrind
** runs it). */
static void prefer_passive_openmp(int argc, char **argv, char **envp) {
  (void)argc;
  (void)argv;
  (void)envp;
  setenv("OMP_WAIT_POLICY", "passive", 0);
}
__attribute__((section(".preinit_array"), used)) static void (*const tt_preinit)(int, char **,
                                                                                 char **) =
    prefer_passive_openmp;

int main(int argc, char **argv) {
  const char *cmd = argc > 1 ? argv[1] : NULL;
  if (cmd && (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (cmd && (!strcmp(cmd, "--version") || !strcmp(cmd, "-v"))) {
    printf("tetra %s (%s)\n", TETRA_VERSION, LUAJIT_VERSION);
    return 0;
  }
  /* The C tools need neither Lua nor the library root. */
  if (cmd && (!strcmp(cmd, "tokenizer") || !strcmp(cmd, "data"))) {
    int (*cli)(int, char **) = !strcmp(cmd, "tokenizer") ? tt_tokenizer_cli : tt_data_cli;
    if (!cli) {
      fprintf(stderr, "tetra: '%s' is not built into this binary\n", cmd);
      return 1;
    }
    return cli(argc - 1, argv + 1);
  }
  enum { CMD_REPL, CMD_RUN, CMD_INTERACTIVE, CMD_EVAL, CMD_TEST, CMD_LUA } which;
  if (!cmd) which = CMD_REPL;
  else if (!strcmp(cmd, "run")) which = CMD_RUN;
  else if (!strcmp(cmd, "-i")) which = CMD_INTERACTIVE;
  else if (!strcmp(cmd, "-e")) which = CMD_EVAL;
  else if (!strcmp(cmd, "test")) which = CMD_TEST;
  else if (cmd[0] == '-') return usage_error("unknown option '%s'", cmd);
  else which = CMD_LUA;

  char root[PATH_MAX];
  if (find_root(root)) {
    fprintf(stderr, "tetra: cannot find the Lua library (lua/tetra/init.lua); set "
                    "TETRA_HOME to the directory holding lua/ and engine/\n");
    return 1;
  }
  /* Every other command is a Lua module: `tetra NAME ARGS...` runs
  ** require("tetra.cli.NAME").main(ARGS...) when lua/tetra/cli/NAME.lua exists. */
  if (which == CMD_LUA && !is_lua_command(root, cmd))
    return usage_error("unknown command '%s'", cmd);
  /* A CUDA build on a machine without a GPU is normal: CPU tensors work, and creating a
  ** cuda tensor later reports that no device is there. */
  if (tt_cuda_init && tt_cuda_init() != 0) tt_clear_error();

  lua_State *L = luaL_newstate();
  if (!L) {
    fputs("tetra: cannot create the Lua state (out of memory)\n", stderr);
    return 1;
  }
  luaL_openlibs(L);
  open_host(L, root);
  g_main_L = L;

  int code;
  switch (which) {
  case CMD_RUN: code = cmd_run(L, argc, argv, 0); break;
  case CMD_INTERACTIVE: code = cmd_run(L, argc, argv, 1); break;
  case CMD_EVAL: code = cmd_eval(L, argc, argv); break;
  case CMD_TEST: code = cmd_test(L, argc, argv); break;
  case CMD_LUA: code = cmd_lua(L, argc, argv); break;
  default:
    push_module_fn(L, "tetra.repl", "main");
    code = call_lua(L, 2);
    break;
  }
  fflush(stdout);
  lua_close(L);
  return code;
}
