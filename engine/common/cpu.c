/*
** cpu.c — the CPU's instruction sets from cpuid, and the OpenBLAS core they warrant (see
** cpu.h). Names are those OpenBLAS's driver/others/dynamic.c accepts in OPENBLAS_CORETYPE
** and returns from openblas_get_corename(). Debian 12's 0.3.21 accepts Haswell, Zen and
** SkylakeX by name; its force_coretype stops one entry short of Cooperlake, and an unknown
** name falls back to its feature test (AVX512_BF16 -> Cooperlake, AVX-512 -> SkylakeX,
** AVX2 -> Haswell), so "Cooperlake" ends at the Cooperlake kernels there too, and newer
** releases accept it by name. Cooperlake's sgemm is SkylakeX's; it adds bf16 GEMMs.
*/
#include "cpu.h"
#include "preinit_env.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* -- Reading cpuid ------------------------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long read_xcr0(void) {
  unsigned int lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}
#endif

void tt_cpu_features_read(tt_cpu_features *pOut) {
  memset(pOut, 0, sizeof *pOut);
#if defined(__x86_64__) || defined(__i386__)
  unsigned int max, a, b, c, d;
  if (!__get_cpuid(0, &max, &b, &c, &d)) return;
  memcpy(pOut->vendor, &b, 4);
  memcpy(pOut->vendor + 4, &d, 4);
  memcpy(pOut->vendor + 8, &c, 4);
  pOut->vendor[12] = '\0';
  if (max < 1) return;
  __cpuid_count(1, 0, a, b, c, d);
  pOut->fma = (c >> 12) & 1;
  pOut->avx = (c >> 28) & 1;
  if ((c >> 27) & 1) {   /* OSXSAVE: xgetbv is there */
    unsigned long long xcr0 = read_xcr0();
    pOut->os_avx = (xcr0 & 0x6) == 0x6;
    pOut->os_avx512 = (xcr0 & 0xe6) == 0xe6;
  }
  if (max < 7) return;
  unsigned int max7;
  __cpuid_count(7, 0, max7, b, c, d);
  pOut->avx2 = (b >> 5) & 1;
  pOut->avx512f = (b >> 16) & 1;
  pOut->avx512dq = (b >> 17) & 1;
  pOut->avx512cd = (b >> 28) & 1;
  pOut->avx512bw = (b >> 30) & 1;
  pOut->avx512vl = (b >> 31) & 1;
  if (max7 >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    pOut->avx512_bf16 = (a >> 5) & 1;
  }
#endif
}

/* -- The choice ----------------------------------------------------------------------- */

/* Instruction-set tiers of OpenBLAS's x86 cores; 0 = a name this table does not know. */
enum { TIER_UNKNOWN, TIER_SSE, TIER_AVX, TIER_AVX2, TIER_AVX512 };

static const struct {
  const char *name;
  int tier;
} core_tiers[] = {
    {"Katmai", TIER_SSE},      {"Coppermine", TIER_SSE},   {"Northwood", TIER_SSE},
    {"Prescott", TIER_SSE},    {"Banias", TIER_SSE},       {"Atom", TIER_SSE},
    {"Core2", TIER_SSE},       {"Penryn", TIER_SSE},       {"Dunnington", TIER_SSE},
    {"Nehalem", TIER_SSE},     {"Athlon", TIER_SSE},       {"Opteron", TIER_SSE},
    {"Opteron_SSE3", TIER_SSE}, {"Barcelona", TIER_SSE},   {"Nano", TIER_SSE},
    {"Bobcat", TIER_SSE},      {"Sandybridge", TIER_AVX},  {"Bulldozer", TIER_AVX},
    {"Piledriver", TIER_AVX},  {"Steamroller", TIER_AVX},  {"Excavator", TIER_AVX},
    {"Haswell", TIER_AVX2},    {"Zen", TIER_AVX2},         {"SkylakeX", TIER_AVX512},
    {"Cooperlake", TIER_AVX512}, {"SapphireRapids", TIER_AVX512},
};

static int core_tier(const char *name) {
  for (size_t i = 0; i < sizeof core_tiers / sizeof core_tiers[0]; i++)
    if (!strcasecmp(name, core_tiers[i].name)) return core_tiers[i].tier;
  return TIER_UNKNOWN;
}

static int has_avx512(const tt_cpu_features *f) {
  return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512cd &&
         f->os_avx512;
}

static int has_avx2(const tt_cpu_features *f) {
  return f->avx && f->avx2 && f->fma && f->os_avx;
}

const char *tt_blas_core_for(const tt_cpu_features *f) {
  if (has_avx512(f) && has_avx2(f)) return f->avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (has_avx2(f))
    return !strcmp(f->vendor, "AuthenticAMD") || !strcmp(f->vendor, "HygonGenuine") ? "Zen"
                                                                                   : "Haswell";
  return NULL;
}

const char *tt_blas_library_for(const tt_cpu_features *f) {
  return !strcmp(f->vendor, "GenuineIntel") && has_avx512(f) && has_avx2(f) ? "onednn"
                                                                            : "openblas";
}

int tt_blas_core_weaker(const char *corename, const tt_cpu_features *f) {
  const char *want = tt_blas_core_for(f);
  if (!want || !corename) return 0;
  int have = core_tier(corename);
  return have != TIER_UNKNOWN && have < core_tier(want);
}

void tt_cpu_features_describe(const tt_cpu_features *f, char *out, size_t n) {
  const struct {
    int on;
    const char *name;
  } sets[] = {
      {has_avx512(f), "AVX-512"},
      {f->avx512f && !has_avx512(f),
       f->os_avx512 ? "part of AVX-512" : "AVX-512 (not saved by the OS)"},
      {f->avx512_bf16, "AVX512_BF16"},
      {f->avx2, "AVX2"},
      {f->fma, "FMA"},
      {f->avx, f->os_avx ? "AVX" : "AVX (not saved by the OS)"},
  };
  size_t at = 0;
  if (n == 0) return;
  out[0] = '\0';
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
    if (!sets[i].on) continue;
    int w = snprintf(out + at, n - at, "%s%s", at ? ", " : "", sets[i].name);
    if (w < 0 || (size_t)w >= n - at) return;
    at += (size_t)w;
  }
  if (at == 0) snprintf(out, n, "no AVX");
}

/* -- At start-up ---------------------------------------------------------------------- */

void tt_blas_core_decide(const char *user_value, const tt_cpu_features *f,
                         tt_blas_core_choice *pOut) {
  memset(pOut, 0, sizeof *pOut);
  pOut->decided = 1;
  pOut->cpu = *f;
  if (user_value) {
    pOut->user_set = 1;
    snprintf(pOut->user, sizeof pOut->user, "%s", user_value);
    return;
  }
  pOut->chosen = tt_blas_core_for(f);
}

static tt_blas_core_choice g_choice;

void tt_blas_core_choose_at_start(char **envp) {
  tt_cpu_features f;
  tt_cpu_features_read(&f);
  tt_blas_core_decide(tt_preinit_getenv(envp, "OPENBLAS_CORETYPE"), &f, &g_choice);
  if (g_choice.chosen && tt_preinit_setenv(envp, "OPENBLAS_CORETYPE", g_choice.chosen) != 1)
    g_choice.chosen = NULL;   /* no slot to lend: the library's own choice stands */
}

const tt_blas_core_choice *tt_blas_core_choice_get(void) { return &g_choice; }

void tt_blas_core_describe(const tt_blas_core_choice *c, const char *corename, char *out,
                           size_t n) {
  char cpu[128];
  tt_cpu_features_describe(&c->cpu, cpu, sizeof cpu);
  if (!c->decided)
    snprintf(out, n, "OpenBLAS core %s (the library's own choice)", corename);
  else if (c->user_set)
    snprintf(out, n, "OpenBLAS core %s (your OPENBLAS_CORETYPE=%s; cpuid: %s)", corename,
             c->user, cpu);
  else if (c->chosen)
    snprintf(out, n, "OpenBLAS core %s (set from cpuid: %s; OPENBLAS_CORETYPE overrides)",
             corename, cpu);
  else
    snprintf(out, n, "OpenBLAS core %s (the library's own choice; cpuid: %s)", corename, cpu);
}

int tt_blas_core_warning(const tt_blas_core_choice *c, const char *corename, char *out,
                         size_t n) {
  if (n) out[0] = '\0';
  if (!tt_blas_core_weaker(corename, &c->cpu)) return 0;
  char cpu[128], why[96];
  tt_cpu_features_describe(&c->cpu, cpu, sizeof cpu);
  const char *want = tt_blas_core_for(&c->cpu);
  if (c->user_set)
    snprintf(why, sizeof why, "your OPENBLAS_CORETYPE=%s chose them", c->user);
  else if (c->chosen)
    snprintf(why, sizeof why, "this OpenBLAS ignored OPENBLAS_CORETYPE=%s", c->chosen);
  else
    snprintf(why, sizeof why, "the library's own choice");
  /* When the library ignored the name tetra set, repeating it would not help. */
  char fix[64];
  if (c->chosen && !c->user_set) snprintf(fix, sizeof fix, "an OpenBLAS that knows %s", want);
  else snprintf(fix, sizeof fix, "set OPENBLAS_CORETYPE=%s", want);
  snprintf(out, n,
           "tetra: warning: OpenBLAS runs its %s kernels (%s) on a CPU with %s: GEMMs run "
           "several times slower; the fix: %s",
           corename, why, cpu, fix);
  return 1;
}
