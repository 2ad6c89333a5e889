/*
** cpu.h — which OpenBLAS kernels this CPU deserves. A DYNAMIC_ARCH OpenBLAS picks its
** kernels from cpuid in its constructor, and one that predates the CPU guesses: Debian
** 12's 0.3.21 runs its Prescott (SSE3) kernels on some AVX-512 Xeons, GEMMs 3x slower,
** and says nothing (issue 31). The programs (tetra, the engine benchmark) therefore read
** cpuid themselves before any library's constructor runs (.preinit_array), name the core
** the CPU's instruction sets warrant in OPENBLAS_CORETYPE unless the user already set it,
** and after start-up compare it with what OpenBLAS reports it uses.
**
** The choice and the judgement are pure functions of the features, so they are tested on
** canned cpuid values of machines the tests never run on.
*/
#ifndef TT_CPU_H
#define TT_CPU_H
#include <stddef.h>

typedef struct tt_cpu_features {
  char vendor[13];   /* cpuid leaf 0: "GenuineIntel", "AuthenticAMD", "HygonGenuine" ... */
  int avx, avx2, fma;
  int avx512f, avx512bw, avx512vl, avx512dq, avx512cd, avx512_bf16;
  int os_avx;        /* the OS saves the ymm state (XCR0 bits 1-2) */
  int os_avx512;     /* ... and the zmm and opmask state (XCR0 bits 5-7) */
} tt_cpu_features;

/* This CPU's features (all zero off x86). */
void tt_cpu_features_read(tt_cpu_features *pOut);

/* "AVX-512, AVX512_BF16, AVX2, FMA, AVX" or "no AVX": what the choice rests on. */
void tt_cpu_features_describe(const tt_cpu_features *f, char *out, size_t n);

/* The OpenBLAS core (an OPENBLAS_CORETYPE name) for these features: Cooperlake with
** AVX512_BF16, else SkylakeX with AVX-512 F/BW/VL/DQ/CD, Zen (AMD, Hygon) or Haswell with
** AVX2 and FMA, each only when the OS saves the registers; NULL when nothing better than
** the library's own detection is known. */
const char *tt_blas_core_for(const tt_cpu_features *f);

/* The library the matmul family's products run on when TETRA_BLAS is unset: "onednn" on
** Intel CPUs with AVX-512 (an AVX512_BF16 Xeon trained the benchmark Llama 1.1x faster
** with oneDNN's sgemm than with OpenBLAS's, tools/bench/gemm_backends.sh shows why), else
** "openblas" (level with oneDNN on the AMD Zen measured). tetra falls back to OpenBLAS
** when oneDNN is not installed, and says which in --version. */
const char *tt_blas_library_for(const tt_cpu_features *f);

/* 1 when `corename` (openblas_get_corename(), any case) names kernels of an older
** instruction set than tt_blas_core_for(f): Prescott, Core2 or Nehalem on an AVX2 or
** AVX-512 CPU, Haswell or Zen on an AVX-512 one. 0 when they match, when no choice is
** known for the CPU, or when the name is one this table does not know. */
int tt_blas_core_weaker(const char *corename, const tt_cpu_features *f);

/* What a program decided at start-up, for the line that reports it later. */
typedef struct tt_blas_core_choice {
  int decided;           /* 0 until tt_blas_core_decide ran (a program without the hook) */
  char user[32];         /* the user's own OPENBLAS_CORETYPE ("" when unset) */
  int user_set;
  const char *chosen;    /* what the program set, or NULL (user's value, or nothing known) */
  tt_cpu_features cpu;
} tt_blas_core_choice;

/* Pure: the decision for an environment value (NULL = unset) and features. A user's value
** always wins, even one the library does not know. */
void tt_blas_core_decide(const char *user_value, const tt_cpu_features *f,
                         tt_blas_core_choice *pOut);

/* For a program's .preinit_array (its envp): reads cpuid and the environment, sets
** OPENBLAS_CORETYPE for OpenBLAS's constructor when tt_blas_core_decide chose a core
** (preinit_env.h), and records the decision. main calls tt_preinit_restore after. */
void tt_blas_core_choose_at_start(char **envp);

/* The decision recorded by tt_blas_core_choose_at_start (decided == 0 before it ran). */
const tt_blas_core_choice *tt_blas_core_choice_get(void);

/* One line (no newline) for `corename`, the core OpenBLAS reports, e.g.
** "OpenBLAS core SkylakeX (set from cpuid: AVX-512, AVX2, FMA, AVX; OPENBLAS_CORETYPE
** overrides)". */
void tt_blas_core_describe(const tt_blas_core_choice *c, const char *corename, char *out,
                           size_t n);

/* When `corename` is weaker than the CPU (tt_blas_core_weaker on c->cpu), writes one
** warning line (no newline) naming the core, the CPU's features and the fix, and returns
** 1; otherwise returns 0 and writes "". */
int tt_blas_core_warning(const tt_blas_core_choice *c, const char *corename, char *out,
                         size_t n);

#endif
