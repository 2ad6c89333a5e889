/*
** main.c — the `tetra` binary: LuaJIT plus the whole engine.
**
** The engine's symbols are exported (CMake ENABLE_EXPORTS), so Lua reaches them through
** ffi.C. The program only does what the FFI cannot do well: this file parses the command
** line, finds the Lua library and headers, registers the tetra.host module and forwards
** the `tokenizer` / `data` subcommands to their C implementations; yaml.c loads YAML into
** Lua tables (libyaml), terminal.c handles Ctrl-C and the terminal under mpirun, and
** lineedit.c reads lines (libedit). Everything else (recipes, configs, the REPL, the spec
** runner) lives in lua/tetra/.
**
** Exit codes: 0 ok, 1 runtime error, 2 bad usage (one line on stderr), 3 a training run
** stopped at SIGUSR1 after its checkpoint (tetra.train.loop).
*/
#include "tetra.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include "common/cpu.h"
#include "common/preinit_env.h"
#include "tetra_dist.h"
#include "host/host.h"

#ifndef TETRA_VERSION
#define TETRA_VERSION "0.0.0"
#endif
#ifndef TETRA_SOURCE_DIR
#define TETRA_SOURCE_DIR "."
#endif

/* Implemented by other modules when they are linked in; absent symbols are NULL. */
extern int tt_tokenizer_cli(int argc, char **argv) __attribute__((weak));
extern int tt_data_cli(int argc, char **argv) __attribute__((weak));
#ifdef TETRA_HAVE_CUDA
/* A strong reference: it pulls the CUDA backend out of libtetra_cuda.a, and the backend
** every kernel family (engine/cuda/kernels_linked.cu). */
int tt_cuda_init(void);
#endif

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
  {"load_yaml", tt_host_load_yaml}, {"parse_yaml", tt_host_parse_yaml}, {"readline", tt_host_readline},
  {"add_history", tt_host_add_history}, {"history", tt_host_history}, {"isatty", l_isatty},
  {"now", l_now}, {"is_dir", l_is_dir}, {"listdir", l_listdir}, {"sleep", l_sleep},
  {"catch_interrupts", tt_host_catch_interrupts}, {"interrupted", tt_host_interrupted},
  {"interrupt_lua", tt_host_interrupt_lua}, {"set_completer", tt_host_set_completer},
  {"take_terminal", tt_host_take_terminal}, {"give_back_terminal", tt_host_give_back_terminal},
  {"tty_write", tt_host_tty_write}, {"catch_stop_signal", tt_host_catch_stop_signal},
  {"stop_requested", tt_host_stop_requested}, {NULL, NULL}};

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

/* Settings libraries read in their constructors, before main, chosen when the user has
** not chosen them: an executable's .preinit_array runs before any shared library's
** constructor (no re-execution: the process keeps its name, and valgrind runs it);
** common/preinit_env.h says how a variable reaches the constructors from there, and main
** gives the environment back.
**
** OMP_WAIT_POLICY=passive: OpenMP workers that spin between parallel regions take the
** cores from OpenBLAS's own threads (and from other processes on a shared node): a Llama
** block's forward+backward measured 3x slower on 2 busy cores with libgomp's default.
**
** OPENBLAS_THREAD_TIMEOUT=4: OpenBLAS's workers, likewise, sleep as soon as a GEMM ends
** (after 2^4 cycles, the least it takes) rather than spin on sched_yield for 2^28 cycles,
** about 0.1 s, through the OpenMP ops between two GEMMs. tools/bench/train_vs_torch.lua's
** Llama on 2 idle cores: system time 1.5-2.5 s to 0.5-0.9 s in a 10-step run, the median
** step about 5% faster (noisy: 3 runs each).
**
** OPENBLAS_CORETYPE: an OpenBLAS older than the CPU may pick SSE3 kernels on an AVX-512
** machine (issue 31); the core the CPU's cpuid warrants is named instead (common/cpu.c),
** and warn_weak_blas_core checks after start-up what the library took. */
static void before_libraries(int argc, char **argv, char **envp) {
  (void)argc;
  (void)argv;
  tt_preinit_setenv(envp, "OMP_WAIT_POLICY", "passive");
  tt_blas_core_choose_at_start(envp);
  tt_preinit_setenv(envp, "OPENBLAS_THREAD_TIMEOUT", "4");   /* (last: a slot may lack) */
}
__attribute__((section(".preinit_array"), used)) static void (*const tt_preinit)(int, char **,
                                                                                 char **) =
    before_libraries;

/* One warning line on stderr (rank 0 of a launched job only) when OpenBLAS runs kernels
** older than the CPU: the library ignored the name, or the user forced a weak one. */
static void warn_weak_blas_core(void) {
  char line[512];
  if (tt_dist_env_rank() == 0 &&
      tt_blas_core_warning(tt_blas_core_choice_get(), openblas_get_corename(), line,
                           sizeof line))
    fprintf(stderr, "%s\n", line);
}

/* TETRA_ALLOC_LIMIT_MIB: the most each device's allocator may hold (tt_alloc_set_limit),
** to rehearse a run on a smaller device than this one; unset or empty, no limit. */
static int set_alloc_limit(void) {
  const char *v = getenv("TETRA_ALLOC_LIMIT_MIB");
  if (!v || !*v) return 0;
  char *end;
  errno = 0;
  unsigned long long mib = strtoull(v, &end, 10);
  if (*v < '0' || *v > '9' || *end || errno || mib == 0 || mib > (SIZE_MAX >> 20)) {
    fprintf(stderr, "tetra: TETRA_ALLOC_LIMIT_MIB=%s is not a whole number of MiB above 0 "
            "(e.g. 4096): unset it for no limit\n", v);
    return -1;
  }
  tt_alloc_set_limit((size_t)mib << 20);
  return 0;
}

/* The matmul family's library: the user's TETRA_BLAS, else this CPU's (tt_blas_library_for)
** when it is installed, else OpenBLAS; why, for --version. 0, or -1 with the error set. */
static int select_blas(char *why, size_t n) {
  const char *user = getenv("TETRA_BLAS");
  if (user && *user) {
    snprintf(why, n, "your TETRA_BLAS=%s", user);
    return tt_blas_select(user);
  }
  const char *want = tt_blas_library_for(&tt_blas_core_choice_get()->cpu);
  if (tt_blas_select(want) == 0) {
    snprintf(why, n, "chosen for this CPU; TETRA_BLAS=openblas, blis or onednn overrides");
    return 0;
  }
  snprintf(why, n, "this CPU's choice, %s, is not installed: on Debian, apt-get install "
           "libdnnl2", want);
  return tt_blas_select("openblas");
}

int main(int argc, char **argv) {
  tt_preinit_restore();
  /* A file past the size limit (ulimit -f) fails its write with EFBIG, which the writer
  ** reports (a checkpoint: one line naming the file), instead of killing the process. */
  signal(SIGXFSZ, SIG_IGN);
  const char *cmd = argc > 1 ? argv[1] : NULL;
  warn_weak_blas_core();
  /* TETRA_BLAS: the library of the matmul family's products (kernels/cpu/blas.c); unset,
  ** the one this CPU ran fastest (tt_blas_library_for), or OpenBLAS where that one is not
  ** installed. TETRA_BF16_GEMM: how bf16 products run. */
  char blas_why[160];
  if (set_alloc_limit() != 0) return 2;
  if (select_blas(blas_why, sizeof blas_why) != 0 ||
      tt_bf16_gemm_select(getenv("TETRA_BF16_GEMM"),
                          tt_blas_core_choice_get()->cpu.avx512_bf16) != 0) {
    fprintf(stderr, "tetra: %s\n", tt_last_error());
    return 2;
  }
  if (cmd && (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (cmd && (!strcmp(cmd, "--version") || !strcmp(cmd, "-v"))) {
    char blas[256];
    tt_blas_core_describe(tt_blas_core_choice_get(), openblas_get_corename(), blas, sizeof blas);
    printf("tetra %s (%s)\n%s\nCPU matmul products on %s (%s); bf16 products: %s "
           "(TETRA_BF16_GEMM: emulate or dot)\n", TETRA_VERSION, LUAJIT_VERSION, blas,
           tt_blas_selected(), blas_why, tt_bf16_gemm_selected());
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
#ifdef TETRA_HAVE_CUDA
  if (tt_cuda_init() != 0) tt_clear_error();
#endif

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
  /* A rank of a multi-process job that failed ends the job before its Lua state closes
  ** (exit runs the dist module's handler, which aborts the job): closing runs finalizers
  ** that free NCCL communicators, which waits for collectives still pending (a failed one
  ** never finishes) and is itself collective, so a failed rank could wait there for good
  ** instead of ending the job. */
  if (code != 0 && tt_dist_is_initialized()) exit(code);
  lua_close(L);
  return code;
}
