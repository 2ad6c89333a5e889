/*
** test_cudnn_load.c — the cuDNN loader's search order (engine/cuda/tt_cudnn.h), on the CPU.
**
** Each test builds a directory layout of its own under a temporary directory, with
** symlinks to the real cuDNN 9 graph library of this machine (found the way the system
** loader finds it) or to a fake library that answers like cuDNN 8.9, points the
** environment at it and checks which path tt_cudnn_probe reports, or the reason it gives.
** Criterion runs every test in a process of its own, so no library opened by one test is
** still loaded in the next. Without a cuDNN 9 on the machine the tests that need one skip
** and the program exits 77 (ctest: "Not Run").
*/
#define _GNU_SOURCE   /* dladdr */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda/tt_cudnn.h"
#include "tt_skip_main.h"

static char tmp[256], path[4096], why[2048];

/* The real libcudnn_graph.so.9 of this machine, or a skip (named) when there is none. */
static const char *real_graph_lib(void) {
  static char real[4096];
  void *h = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcudnn_graph.so.9", RTLD_LAZY);
  void *fn = h ? dlsym(h, "cudnnGetVersion") : NULL;
  Dl_info info;
  if (!fn || !dladdr(fn, &info) || !info.dli_fname) {
    if (access("/usr/local/cuda/lib64/libcudnn_graph.so.9", R_OK) != 0)
      cr_skip_test("no cuDNN 9 on this machine (libcudnn_graph.so.9)");
    return "/usr/local/cuda/lib64/libcudnn_graph.so.9";
  }
  char *r = realpath(info.dli_fname, NULL);
  snprintf(real, sizeof real, "%s", r ? r : info.dli_fname);
  free(r);
  return real;
}

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* tmp/<dir> with libcudnn_graph.so.9 -> `target`. */
static void layout(const char *dir, const char *target) {
  char d[1024];
  snprintf(d, sizeof d, "%s/%s", tmp, dir);
  sh("mkdir -p '%s'%s", d, "");
  sh("ln -sf '%s' '%s/libcudnn_graph.so.9'", target, d);
}

static void setup(void) {
  snprintf(tmp, sizeof tmp, "/tmp/tt_cudnn_load_XXXXXX");
  cr_assert(mkdtemp(tmp) != NULL);
  unsetenv("TETRA_CUDNN");
  unsetenv("TETRA_CUDNN_PATH");
  unsetenv("TETRA_PYTHON_SITE");
  unsetenv("VIRTUAL_ENV");
  unsetenv("CONDA_PREFIX");
}

static void teardown(void) { sh("rm -rf '%s'%s", tmp, ""); }

TestSuite(cudnn_load, .init = setup, .fini = teardown);

Test(cudnn_load, override_directory) {
  layout("lib", real_graph_lib());
  char dir[1024], want[1200];
  snprintf(dir, sizeof dir, "%s/lib", tmp);
  snprintf(want, sizeof want, "%s/libcudnn_graph.so.9", dir);
  setenv("TETRA_CUDNN_PATH", dir, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  cr_assert_str_eq(path, want);
}

Test(cudnn_load, override_file) {
  layout("lib", real_graph_lib());
  char file[1200];
  snprintf(file, sizeof file, "%s/lib/libcudnn_graph.so.9", tmp);
  setenv("TETRA_CUDNN_PATH", file, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  cr_assert_str_eq(path, file);
}

/* Any other file of the lib directory (libcudnn.so.9) names that directory. */
Test(cudnn_load, override_sibling_file) {
  layout("lib", real_graph_lib());
  char file[1200], want[1200];
  snprintf(file, sizeof file, "%s/lib/libcudnn.so.9", tmp);
  snprintf(want, sizeof want, "%s/lib/libcudnn_graph.so.9", tmp);
  sh("touch '%s'%s", file, "");
  setenv("TETRA_CUDNN_PATH", file, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  cr_assert_str_eq(path, want);
}

/* An override that points at nothing is not searched past: the reason names it. */
Test(cudnn_load, override_at_nothing) {
  layout("venv/lib/python3.11/site-packages/nvidia/cudnn/lib", real_graph_lib());
  char venv[1024], missing[1024];
  snprintf(venv, sizeof venv, "%s/venv", tmp);
  snprintf(missing, sizeof missing, "%s/nowhere", tmp);
  setenv("VIRTUAL_ENV", venv, 1);
  setenv("TETRA_CUDNN_PATH", missing, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0, "opened %s", path);
  cr_assert(strstr(why, "TETRA_CUDNN_PATH=") && strstr(why, "no such file"), "%s", why);
}

Test(cudnn_load, override_empty_directory) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/empty", tmp);
  sh("mkdir -p '%s'%s", dir, "");
  setenv("TETRA_CUDNN_PATH", dir, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0);
  cr_assert(strstr(why, "no libcudnn_graph.so.9 in"), "%s", why);
}

Test(cudnn_load, disabled) {
  layout("lib", real_graph_lib());
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/lib", tmp);
  setenv("TETRA_CUDNN_PATH", dir, 1);
  setenv("TETRA_CUDNN", "0", 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0);
  cr_assert_str_eq(why, "TETRA_CUDNN=0");
}

Test(cudnn_load, bad_switch_value) {
  setenv("TETRA_CUDNN", "off", 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0, "opened %s", path);
  cr_assert_str_eq(why, "TETRA_CUDNN=off is neither 0 (off) nor 1 (on)");
  setenv("TETRA_CUDNN", "1", 1);
  layout("lib", real_graph_lib());
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/lib", tmp);
  setenv("TETRA_CUDNN_PATH", dir, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
}

/* A virtual environment's wheel comes before the system's cuDNN. */
Test(cudnn_load, virtual_env_wheel) {
  layout("venv/lib/python3.12/site-packages/nvidia/cudnn/lib", real_graph_lib());
  char venv[1024], want[1200];
  snprintf(venv, sizeof venv, "%s/venv", tmp);
  snprintf(want, sizeof want, "%s/lib/python3.12/site-packages/nvidia/cudnn/lib/"
           "libcudnn_graph.so.9", venv);
  setenv("VIRTUAL_ENV", venv, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  cr_assert_str_eq(path, want);
}

/* TETRA_PYTHON_SITE (a list) comes before $VIRTUAL_ENV. */
Test(cudnn_load, python_site_list) {
  layout("site/nvidia/cudnn/lib", real_graph_lib());
  layout("venv/lib/python3.12/site-packages/nvidia/cudnn/lib", real_graph_lib());
  char site[2048], venv[1024], want[1200];
  snprintf(site, sizeof site, "%s/nothing:%s/site", tmp, tmp);
  snprintf(venv, sizeof venv, "%s/venv", tmp);
  snprintf(want, sizeof want, "%s/site/nvidia/cudnn/lib/libcudnn_graph.so.9", tmp);
  setenv("TETRA_PYTHON_SITE", site, 1);
  setenv("VIRTUAL_ENV", venv, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  cr_assert_str_eq(path, want);
}

/* A wheel's cuDNN brings its NVRTC in the sibling wheel nvidia/cuda_nvrtc/lib, on no
** loader path: it is loaded with cuDNN (from there, not from anywhere else), so that
** cuDNN's runtime-compiled engines find it by soname when a plan is finalized. */
Test(cudnn_load, wheel_nvrtc_preloaded) {
  const char *graph = real_graph_lib();
  char nvrtc[4096];
  snprintf(nvrtc, sizeof nvrtc, "%s", "/usr/local/cuda/lib64/libnvrtc.so.13");
  if (access(nvrtc, R_OK) != 0) cr_skip_test("no libnvrtc.so.13 in /usr/local/cuda/lib64");
  cr_assert_null(dlopen("libnvrtc.so.13", RTLD_LAZY | RTLD_NOLOAD),
                 "NVRTC is loaded before the probe: the test cannot tell who loaded it");
  layout("site/nvidia/cudnn/lib", graph);
  char lib[1024], site[1024];
  snprintf(lib, sizeof lib, "%s/site/nvidia/cuda_nvrtc/lib", tmp);
  sh("mkdir -p '%s'%s", lib, "");
  sh("ln -sf '%s' '%s/libnvrtc.so.13'", nvrtc, lib);
  snprintf(site, sizeof site, "%s/site", tmp);
  setenv("TETRA_PYTHON_SITE", site, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  void *h = dlopen("libnvrtc.so.13", RTLD_LAZY | RTLD_NOLOAD);
  cr_assert_not_null(h, "libnvrtc.so.13 was not loaded with the wheel's cuDNN");
  void *fn = dlsym(h, "nvrtcVersion");
  Dl_info info;
  cr_assert(fn && dladdr(fn, &info) && info.dli_fname, "no nvrtcVersion in the loaded NVRTC");
  char want[1200];
  snprintf(want, sizeof want, "%s/libnvrtc.so.13", lib);
  cr_assert_str_eq(info.dli_fname, want, "NVRTC came from %s, not the wheel", info.dli_fname);
}

/* Without overrides or wheels: the system's cuDNN, reported by its real path. */
Test(cudnn_load, system_loader) {
  const char *real = real_graph_lib();
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 1, "%s", why);
  char *r = realpath(path, NULL);
  cr_assert(r != NULL, "reported path %s does not exist", path);
  cr_assert_str_eq(r, real);
  free(r);
}

/* A library that is not cuDNN, and one that is cuDNN 8: both refused with the path. */
Test(cudnn_load, refuses_other_library) {
  layout("lib", "/bin/true");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/lib", tmp);
  setenv("TETRA_CUDNN_PATH", dir, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0);
  cr_assert(strstr(why, "cannot open") && strstr(why, dir), "%s", why);
}

Test(cudnn_load, refuses_cudnn_9_10_0) {
  layout("lib", TT_FAKE_CUDNN9100);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/lib", tmp);
  setenv("TETRA_CUDNN_PATH", dir, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0, "opened %s", path);
  cr_assert(strstr(why, "cuDNN 9.10.0") && strstr(why, "known defect"), "%s", why);
}

Test(cudnn_load, refuses_cudnn8) {
  layout("lib", TT_FAKE_CUDNN8);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/lib", tmp);
  setenv("TETRA_CUDNN_PATH", dir, 1);
  cr_assert_eq(tt_cudnn_probe(path, sizeof path, why, sizeof why), 0, "opened %s", path);
  cr_assert(strstr(why, "cuDNN 8.9, version 9 or newer is needed"), "%s", why);
}

/* The process-wide loader: not available -> exactly one line on stderr, however often
** it is asked. */
Test(cudnn_load, one_fallback_line) {
  setenv("TETRA_CUDNN", "0", 1);
  char log[1200];
  snprintf(log, sizeof log, "%s/stderr", tmp);
  fflush(stderr);
  int saved = dup(2);
  cr_assert(freopen(log, "w", stderr) != NULL);
  int a = tt_cudnn_available(), b = tt_cudnn_available();
  fflush(stderr);
  dup2(saved, 2);
  cr_assert_eq(a, 0);
  cr_assert_eq(b, 0);
  cr_assert_str_eq(tt_cudnn_path(), "");
  cr_assert_null(tt_cudnn_symbol("cudnnGetVersion"));
  FILE *f = fopen(log, "r");
  char line[512];
  int lines = 0, named = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    named += strstr(line, "TETRA_CUDNN=0") && strstr(line, "falls back") ? 1 : 0;
  }
  fclose(f);
  cr_assert_eq(lines, 1);
  cr_assert_eq(named, 1);
}
