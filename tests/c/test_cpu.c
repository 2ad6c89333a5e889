/*
** The OpenBLAS core a CPU warrants (engine/common/cpu.c) on canned cpuid features of
** machines the tests never run on (an AVX-512 Xeon with and without AVX512_BF16, an AVX2
** Intel, a Zen, an SSE-only one), the judgement of a reported core against them, the line
** and warning that report it, and the .preinit_array route that gets a variable to
** OpenBLAS's constructor (engine/common/preinit_env.c): this program lends itself
** OPENBLAS_CORETYPE=Sandybridge there, a core no CPU of the last decade autodetects to.
*/
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu.h"
#include "common/preinit_env.h"

/* -- Canned features ------------------------------------------------------------------ */

static tt_cpu_features avx2_intel(void) {
  tt_cpu_features f = {.vendor = "GenuineIntel", .avx = 1, .avx2 = 1, .fma = 1, .os_avx = 1};
  return f;
}

/* Sapphire / Emerald Rapids: AVX-512 F/BW/VL/DQ/CD and AVX512_BF16, the OS saving zmm. */
static tt_cpu_features sapphire_rapids(void) {
  tt_cpu_features f = avx2_intel();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = 1;
  f.avx512_bf16 = 1;
  f.os_avx512 = 1;
  return f;
}

static tt_cpu_features skylake_x(void) {
  tt_cpu_features f = sapphire_rapids();
  f.avx512_bf16 = 0;
  return f;
}

static tt_cpu_features zen3(void) {
  tt_cpu_features f = avx2_intel();
  strcpy(f.vendor, "AuthenticAMD");
  return f;
}

static tt_cpu_features sse_only(void) {
  tt_cpu_features f = {.vendor = "GenuineIntel"};
  return f;
}

/* -- The choice --------------------------------------------------------------------- */

Test(cpu, avx512_gets_the_avx512_kernels) {
  tt_cpu_features spr = sapphire_rapids(), skx = skylake_x();
  cr_assert_str_eq(tt_blas_core_for(&spr), "Cooperlake");
  cr_assert_str_eq(tt_blas_core_for(&skx), "SkylakeX");
}

Test(cpu, intel_avx512_gets_onednn_the_rest_openblas) {
  tt_cpu_features spr = sapphire_rapids(), skx = skylake_x(), intel = avx2_intel(),
                  amd = zen3(), old = sse_only(), zen4 = sapphire_rapids();
  strcpy(zen4.vendor, "AuthenticAMD");
  cr_assert_str_eq(tt_blas_library_for(&spr), "onednn");
  cr_assert_str_eq(tt_blas_library_for(&skx), "onednn");
  cr_assert_str_eq(tt_blas_library_for(&intel), "openblas");
  cr_assert_str_eq(tt_blas_library_for(&amd), "openblas");
  cr_assert_str_eq(tt_blas_library_for(&zen4), "openblas");
  cr_assert_str_eq(tt_blas_library_for(&old), "openblas");
  spr.os_avx512 = 0;   /* registers the OS does not save: no AVX-512 */
  cr_assert_str_eq(tt_blas_library_for(&spr), "openblas");
}

Test(cpu, avx2_gets_haswell_or_zen_by_vendor) {
  tt_cpu_features intel = avx2_intel(), amd = zen3(), hygon = zen3();
  strcpy(hygon.vendor, "HygonGenuine");
  cr_assert_str_eq(tt_blas_core_for(&intel), "Haswell");
  cr_assert_str_eq(tt_blas_core_for(&amd), "Zen");
  cr_assert_str_eq(tt_blas_core_for(&hygon), "Zen");
}

Test(cpu, nothing_known_below_avx2) {
  tt_cpu_features old = sse_only(), avx_only = avx2_intel();
  avx_only.avx2 = avx_only.fma = 0;
  cr_assert_null(tt_blas_core_for(&old));
  cr_assert_null(tt_blas_core_for(&avx_only));
}

/* Registers the OS does not save are no registers: a kernel using them would fault. */
Test(cpu, needs_the_os_to_save_the_registers) {
  tt_cpu_features no_zmm = sapphire_rapids(), no_ymm = avx2_intel();
  no_zmm.os_avx512 = 0;
  no_ymm.os_avx = 0;
  cr_assert_str_eq(tt_blas_core_for(&no_zmm), "Haswell");
  cr_assert_null(tt_blas_core_for(&no_ymm));
}

/* AVX-512 F alone (Knights Landing) lacks the BW/VL/DQ the SkylakeX kernels use. */
Test(cpu, avx512_needs_all_five_subsets) {
  tt_cpu_features knl = skylake_x();
  knl.avx512bw = knl.avx512vl = knl.avx512dq = 0;
  cr_assert_str_eq(tt_blas_core_for(&knl), "Haswell");
}

/* -- The judgement ------------------------------------------------------------------ */

Test(cpu, weaker_cores_are_judged_weak) {
  tt_cpu_features spr = sapphire_rapids(), amd = zen3();
  const char *weak_on_avx512[] = {"Prescott", "Core2", "Nehalem", "Sandybridge", "Haswell",
                                  "Zen", "PRESCOTT"};
  for (size_t i = 0; i < sizeof weak_on_avx512 / sizeof weak_on_avx512[0]; i++)
    cr_assert(tt_blas_core_weaker(weak_on_avx512[i], &spr), "%s", weak_on_avx512[i]);
  cr_assert(tt_blas_core_weaker("Prescott", &amd));
  cr_assert(tt_blas_core_weaker("Excavator", &amd));
}

Test(cpu, matching_or_unknown_cores_are_fine) {
  tt_cpu_features spr = sapphire_rapids(), skx = skylake_x(), intel = avx2_intel(),
                  amd = zen3(), old = sse_only();
  cr_assert_not(tt_blas_core_weaker("SkylakeX", &spr));
  cr_assert_not(tt_blas_core_weaker("Cooperlake", &spr));
  cr_assert_not(tt_blas_core_weaker("SapphireRapids", &spr));
  cr_assert_not(tt_blas_core_weaker("skylakex", &skx));   /* a single-target build's case */
  cr_assert_not(tt_blas_core_weaker("Zen", &intel));
  cr_assert_not(tt_blas_core_weaker("Haswell", &amd));
  cr_assert_not(tt_blas_core_weaker("Prescott", &old));   /* nothing better known */
  cr_assert_not(tt_blas_core_weaker("Zen5", &spr));       /* a name from the future */
  cr_assert_not(tt_blas_core_weaker(NULL, &spr));
}

/* -- The decision at start-up and its report --------------------------------------- */

Test(cpu, the_users_coretype_wins) {
  tt_cpu_features spr = sapphire_rapids();
  tt_blas_core_choice c;
  tt_blas_core_decide("Prescott", &spr, &c);
  cr_assert(c.decided && c.user_set);
  cr_assert_null(c.chosen);
  cr_assert_str_eq(c.user, "Prescott");
  tt_blas_core_decide("", &spr, &c);   /* set, even empty: the library's business */
  cr_assert(c.user_set);
  cr_assert_null(c.chosen);
  tt_blas_core_decide(NULL, &spr, &c);
  cr_assert_not(c.user_set);
  cr_assert_str_eq(c.chosen, "Cooperlake");
}

Test(cpu, the_line_says_who_chose) {
  tt_cpu_features skx = skylake_x();
  tt_blas_core_choice c;
  char line[256];
  tt_blas_core_decide(NULL, &skx, &c);
  tt_blas_core_describe(&c, "SkylakeX", line, sizeof line);
  cr_assert_str_eq(line, "OpenBLAS core SkylakeX (set from cpuid: AVX-512, AVX2, FMA, AVX; "
                         "OPENBLAS_CORETYPE overrides)");
  tt_blas_core_decide("Haswell", &skx, &c);
  tt_blas_core_describe(&c, "Haswell", line, sizeof line);
  cr_assert_str_eq(line, "OpenBLAS core Haswell (your OPENBLAS_CORETYPE=Haswell; cpuid: "
                         "AVX-512, AVX2, FMA, AVX)");
}

Test(cpu, the_warning_names_core_cpu_and_fix) {
  tt_cpu_features spr = sapphire_rapids();
  tt_blas_core_choice c;
  char line[512];
  tt_blas_core_decide("Prescott", &spr, &c);
  cr_assert_eq(tt_blas_core_warning(&c, "Prescott", line, sizeof line), 1);
  cr_assert_str_eq(line, "tetra: warning: OpenBLAS runs its Prescott kernels (your "
                         "OPENBLAS_CORETYPE=Prescott chose them) on a CPU with AVX-512, "
                         "AVX512_BF16, AVX2, FMA, AVX: GEMMs run several times slower; the "
                         "fix: set OPENBLAS_CORETYPE=Cooperlake");
  /* The library ignored the name tetra set: naming it again would not help. */
  tt_blas_core_decide(NULL, &spr, &c);
  cr_assert_eq(tt_blas_core_warning(&c, "Prescott", line, sizeof line), 1);
  cr_assert(strstr(line, "this OpenBLAS ignored OPENBLAS_CORETYPE=Cooperlake"), "%s", line);
  cr_assert(strstr(line, "the fix: an OpenBLAS that knows Cooperlake"), "%s", line);
  cr_assert_eq(tt_blas_core_warning(&c, "Cooperlake", line, sizeof line), 0);
  cr_assert_str_eq(line, "");
}

/* -- The route to OpenBLAS's constructor -------------------------------------------- */

/* Each process of this program (Criterion starts its workers afresh) lends the variable
** before the libraries start, and notes what OpenBLAS took and what the environment holds
** once given back: this program's own constructor runs after every library's. */
static int g_lent;           /* what tt_preinit_setenv answered */
static char g_core[32];      /* openblas_get_corename() after OpenBLAS's constructor */
static int g_set_after;      /* OPENBLAS_CORETYPE still set after tt_preinit_restore */

static void lend_coretype(int argc, char **argv, char **envp) {
  (void)argc;
  (void)argv;
  g_lent = tt_preinit_setenv(envp, "OPENBLAS_CORETYPE", "Sandybridge");
}
__attribute__((section(".preinit_array"), used)) static void (*const test_preinit)(int, char **,
                                                                                   char **) =
    lend_coretype;

__attribute__((constructor)) static void after_libraries(void) {
  snprintf(g_core, sizeof g_core, "%s", openblas_get_corename());
  tt_preinit_restore();
  g_set_after = getenv("OPENBLAS_CORETYPE") != NULL;
}

Test(cpu, preinit_reaches_openblas_and_gives_the_environment_back) {
  if (g_lent == 0 && g_set_after) cr_skip_test("OPENBLAS_CORETYPE is set by the caller");
  cr_assert_eq(g_lent, 1, "no slot lent (the environment has none of _, PWD, HOME ...)");
  cr_assert_str_eq(g_core, "Sandybridge");
  cr_assert_not(g_set_after);
}

Test(cpu, preinit_getenv_and_setenv_on_an_array) {
  char home[] = "HOME=/root", term[] = "TERM=xterm", omp[] = "OMP_NUM_THREADS=2";
  char *envp[] = {omp, home, term, NULL};
  cr_assert_str_eq(tt_preinit_getenv(envp, "OMP_NUM_THREADS"), "2");
  cr_assert_null(tt_preinit_getenv(envp, "OMP_NUM"));
  cr_assert_eq(tt_preinit_setenv(envp, "OMP_NUM_THREADS", "4"), 0);   /* the user's stays */
  cr_assert_str_eq(envp[0], "OMP_NUM_THREADS=2");
  char *none[] = {omp, NULL};
  cr_assert_eq(tt_preinit_setenv(none, "OMP_WAIT_POLICY", "passive"), 0);   /* no slot */
}
