/*
** cudnn_load.c — finds cuDNN 9 and opens it with dlopen; the search order is documented
** in tt_cudnn.h (and README, "Environment").
**
** Only the graph library is opened by name. It loads its engine libraries
** (libcudnn_engines_precompiled.so.9, ..._runtime_compiled.so.9, libcudnn_heuristic.so.9)
** itself, by soname; when the graph library came from a directory outside the loader's
** path (a Python wheel), those siblings are opened first from the same directory, so the
** soname lookups find them already loaded instead of another cuDNN (or none).
**
** Nothing here needs a GPU: cudnnGetVersion answers without one, so the search order and
** the refusal of an old or broken library are tested on the CPU (tests/c/test_cudnn_load.c).
*/
#define _GNU_SOURCE   /* dladdr */
#include "cuda/tt_cudnn.h"
#include "core/tt_internal.h"
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GRAPH_LIB "libcudnn_graph.so.9"

static const char *const sibling_libs[] = {
  "libcudnn_heuristic.so.9", "libcudnn_engines_precompiled.so.9",
  "libcudnn_engines_runtime_compiled.so.9",
};

/* -- Opening one candidate ----------------------------------------------------------- */

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Opens `file` (a path, or a bare soname for the loader's own search) and checks it is a
** cuDNN >= 9 with the backend API. 1 on success (the library stays open), else 0 and why. */
static int open_graph_lib(const char *file, char *why, size_t why_n) {
  void *h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, why_n, "cannot open %s: %s", file, e ? e : "unknown error");
    return 0;
  }
  size_t (*get_version)(void) = NULL;
  *(void **)&get_version = dlsym(h, "cudnnGetVersion");
  if (!get_version || !dlsym(h, "cudnnBackendCreateDescriptor")) {
    snprintf(why, why_n, "%s has no cuDNN backend API (cudnnGetVersion, "
             "cudnnBackendCreateDescriptor)", file);
    return 0;
  }
  size_t v = get_version();
  if (v < 90000) {
    snprintf(why, why_n, "%s is cuDNN %zu.%zu, version 9 or newer is needed", file,
             v / 10000 ? v / 10000 : v / 1000, v / 10000 ? v / 100 % 100 : v / 100 % 10);
    return 0;
  }
  /* cudnn-frontend refuses bf16/f16 fused attention (forward) on these: a known defect. */
  if (v == 91000 || v == 91001) {
    snprintf(why, why_n, "%s is cuDNN 9.10.%zu, whose bf16/f16 fused attention has a known "
             "defect (cudnn-frontend refuses it); install 9.10.2 or newer", file, v % 100);
    return 0;
  }
  return 1;
}

/* cuDNN's runtime-compiled engines open NVRTC by soname (libnvrtc.so.12, .13) when a
** graph is finalized. A cuDNN from a Python wheel comes with its NVRTC in the sibling
** wheel nvidia/cuda_nvrtc/lib, which is on no loader path: without it loaded first,
** finalizing such a plan fails and attention falls back (the problem PyTorch fixed by
** preloading it, pytorch#140930). `dir` is cuDNN's lib directory; when
** dir/../../cuda_nvrtc/lib exists, its libnvrtc.so.N (and the builtins it opens by soname)
** are loaded globally, so cuDNN's lookup finds them already there. */
static void preload_wheel_nvrtc(const char *dir) {
  static const char *const patterns[] = {"libnvrtc-builtins.so.[0-9]*", "libnvrtc.so.[0-9]*"};
  char up[4096];
  snprintf(up, sizeof up, "%s/../..", dir);
  char *nvidia = realpath(up, NULL);   /* .../nvidia: the names the loader keeps are clean */
  if (!nvidia) return;
  for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/cuda_nvrtc/lib/%s", nvidia, patterns[i]);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0) continue;
    for (size_t j = 0; j < g.gl_pathc; j++) dlopen(g.gl_pathv[j], RTLD_LAZY | RTLD_GLOBAL);
    globfree(&g);
  }
  free(nvidia);
}

/* The graph library in `dir`, its engine libraries opened first. */
static int open_in_dir(const char *dir, char *path, size_t path_n, char *why, size_t why_n) {
  char file[4096];
  snprintf(file, sizeof file, "%s/%s", dir, GRAPH_LIB);
  if (!exists(file)) {
    snprintf(why, why_n, "no %s in %s", GRAPH_LIB, dir);
    return 0;
  }
  if (!open_graph_lib(file, why, why_n)) return 0;
  preload_wheel_nvrtc(dir);
  /* After the graph library: the engines need its symbols. A sibling that is missing or
  ** fails to open is not fatal here; building a graph then reports it. */
  for (size_t i = 0; i < sizeof sibling_libs / sizeof *sibling_libs; i++) {
    char sib[4096];
    snprintf(sib, sizeof sib, "%s/%s", dir, sibling_libs[i]);
    if (exists(sib)) dlopen(sib, RTLD_LAZY | RTLD_GLOBAL);
  }
  snprintf(path, path_n, "%s", file);
  return 1;
}

/* -- Search steps ------------------------------------------------------------------- */

/* TETRA_CUDNN_PATH: a directory, or a file whose directory is cuDNN's lib directory. */
static int from_override(const char *p, char *path, size_t path_n, char *why, size_t why_n) {
  char reason[1024];
  int ok;
  if (is_dir(p)) {
    ok = open_in_dir(p, path, path_n, reason, sizeof reason);
  } else if (!exists(p)) {
    snprintf(reason, sizeof reason, "no such file or directory");
    ok = 0;
  } else {
    const char *base = strrchr(p, '/');
    base = base ? base + 1 : p;
    if (strncmp(base, "libcudnn_graph", 14) == 0) {
      ok = open_graph_lib(p, reason, sizeof reason);
      if (ok) snprintf(path, path_n, "%s", p);
    } else {
      char dir[4096];
      snprintf(dir, sizeof dir, "%.*s", base == p ? 1 : (int)(base - p - 1),
               base == p ? "." : p);
      ok = open_in_dir(dir, path, path_n, reason, sizeof reason);
    }
  }
  if (!ok) snprintf(why, why_n, "TETRA_CUDNN_PATH=%s: %s", p, reason);
  return ok;
}

/* Appends to `dirs` (n of cap) the nvidia/cudnn/lib directories matching `pattern`. */
static void glob_wheel_dirs(const char *pattern, char (*dirs)[4096], int *n, int cap) {
  glob_t g;
  if (glob(pattern, GLOB_NOSORT, NULL, &g) != 0) return;
  for (size_t i = 0; i < g.gl_pathc && *n < cap; i++)
    if (is_dir(g.gl_pathv[i])) snprintf(dirs[(*n)++], 4096, "%s", g.gl_pathv[i]);
  globfree(&g);
}

enum { MAX_WHEEL_DIRS = 32 };

/* Every Python wheel directory of cuDNN, in search order. */
static int wheel_dirs(char (*dirs)[4096]) {
  int n = 0;
  char pat[4096];
  const char *site = getenv("TETRA_PYTHON_SITE");
  if (site && *site) {
    char *copy = strdup(site), *save = NULL;
    for (char *s = copy ? strtok_r(copy, ":", &save) : NULL; s; s = strtok_r(NULL, ":", &save)) {
      snprintf(pat, sizeof pat, "%s/nvidia/cudnn/lib", s);
      glob_wheel_dirs(pat, dirs, &n, MAX_WHEEL_DIRS);
    }
    free(copy);
  }
  const char *home = getenv("HOME");
  const char *prefixes[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX"), "/opt/*",
                            "/opt/*/venv", "/opt/*/.venv", home ? home : NULL, "/usr/local", "/usr"};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
    const char *p = prefixes[i];
    if (!p || !*p) continue;
    const char *local = p == home ? "/.local" : "";
    snprintf(pat, sizeof pat, "%s%s/lib/python3*/site-packages/nvidia/cudnn/lib", p, local);
    glob_wheel_dirs(pat, dirs, &n, MAX_WHEEL_DIRS);
    snprintf(pat, sizeof pat, "%s%s/lib/python3*/dist-packages/nvidia/cudnn/lib", p, local);
    glob_wheel_dirs(pat, dirs, &n, MAX_WHEEL_DIRS);
  }
  return n;
}

/* The path the system loader found `h`'s library at. */
static void loaded_path(const char *soname, char *path, size_t path_n) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  void *fn = h ? dlsym(h, "cudnnGetVersion") : NULL;
  Dl_info info;
  if (fn && dladdr(fn, &info) && info.dli_fname)
    snprintf(path, path_n, "%s", info.dli_fname);
  else
    snprintf(path, path_n, "%s", soname);
  /* NOLOAD took a reference of its own; the handle that loaded it keeps it loaded. */
  if (h) dlclose(h);
}

int tt_cudnn_probe(char *path, size_t path_n, char *why, size_t why_n) {
  path[0] = why[0] = '\0';
  const char *onoff = getenv("TETRA_CUDNN");
  if (onoff && strcmp(onoff, "0") == 0) {
    snprintf(why, why_n, "TETRA_CUDNN=0");
    return 0;
  }
  if (onoff && *onoff && strcmp(onoff, "1") != 0) {
    snprintf(why, why_n, "TETRA_CUDNN=%s is neither 0 (off) nor 1 (on)", onoff);
    return 0;
  }
  const char *override = getenv("TETRA_CUDNN_PATH");
  if (override && *override) return from_override(override, path, path_n, why, why_n);

  char reason[1024] = "";
  static char dirs[MAX_WHEEL_DIRS][4096];   /* large: not on the stack */
  int n = wheel_dirs(dirs);
  for (int i = 0; i < n; i++)
    if (open_in_dir(dirs[i], path, path_n, reason, sizeof reason)) return 1;
  char sys_reason[1024];
  if (open_graph_lib(GRAPH_LIB, sys_reason, sizeof sys_reason)) {
    loaded_path(GRAPH_LIB, path, path_n);
    return 1;
  }
  if (open_in_dir("/usr/local/cuda/lib64", path, path_n, sys_reason, sizeof sys_reason))
    return 1;
  /* The most telling reason: a wheel that was refused, else the loader's. */
  snprintf(why, why_n, "%s not found (searched Python wheels, the loader path and "
           "/usr/local/cuda/lib64; set TETRA_CUDNN_PATH)%s%s", GRAPH_LIB,
           reason[0] ? ": " : "", reason);
  return 0;
}

/* -- The process's cuDNN ------------------------------------------------------------ */

static struct {
  int ok;
  char path[4096];
  char why[1536];
  size_t version;
  void *lib;
} g_cudnn;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_note_once = PTHREAD_ONCE_INIT;
static const char *g_note_why;

static void load_once(void) {
  g_cudnn.ok = tt_cudnn_probe(g_cudnn.path, sizeof g_cudnn.path, g_cudnn.why,
                              sizeof g_cudnn.why);
  if (!g_cudnn.ok) return;
  /* Already open: this only takes a reference to the same handle. */
  g_cudnn.lib = dlopen(g_cudnn.path, RTLD_NOW | RTLD_GLOBAL);
  size_t (*get_version)(void) = NULL;
  if (g_cudnn.lib) *(void **)&get_version = dlsym(g_cudnn.lib, "cudnnGetVersion");
  g_cudnn.ok = get_version != NULL;
  g_cudnn.version = get_version ? get_version() : 0;
}

int tt_cudnn_available(void) {
  pthread_once(&g_once, load_once);
  if (!g_cudnn.ok) tt_cudnn_fallback_note(g_cudnn.why[0] ? g_cudnn.why : "not found");
  return g_cudnn.ok;
}

const char *tt_cudnn_path(void) {
  pthread_once(&g_once, load_once);
  return g_cudnn.ok ? g_cudnn.path : "";
}

size_t tt_cudnn_version(void) {
  pthread_once(&g_once, load_once);
  return g_cudnn.ok ? g_cudnn.version : 0;
}

void *tt_cudnn_symbol(const char *name) {
  pthread_once(&g_once, load_once);
  return g_cudnn.ok ? dlsym(g_cudnn.lib, name) : NULL;
}

static void print_note(void) {
  fprintf(stderr, "tetra: cuDNN attention is not used (%s); bf16/f16 attention falls "
          "back to the built-in kernel\n", g_note_why);
}

void tt_cudnn_fallback_note(const char *why) {
  g_note_why = why;
  pthread_once(&g_note_once, print_note);
}
