/*
** kernels_linked.cu — makes sure every CUDA kernel family is in the program.
**
** The engine finds a family's CUDA table (tt_norm_cuda, ...) through a weak reference, so
** a build without CUDA links. A weak reference does not pull an object out of a static
** library, though: without the strong references below, libtetra_cuda.a would contribute
** only the objects something else happened to need, and the ops would report "not
** implemented on cuda". tt_cuda_init calls tt_cuda_kernels_linked, which the binary
** references strongly, so every family comes along. Files without a kernel table (cast,
** matmul_lowp, fp8_linear, and engine/cuda/copy.cu, which tt_copy_ reaches through the weak
** tt_cuda_copy_strided) are anchored through their family name alone. Before copy was
** listed, the first H200 run failed every training step at its first strided copy.
** tests/gpu_check/weak_symbols.sh checks the built programs for unresolved weak tt_*
** references.
*/
#include "cuda/tt_cuda.h"
extern "C" {
#include "activation.h"
#include "attention.h"
#include "elementwise.h"
#include "embedding.h"
#include "fused.h"
#include "loss.h"
#include "matmul.h"
#include "norm.h"
#include "optim.h"
#include "reduce.h"
#include "rope.h"
#include "vocab_parallel.h"
}

#define FAMILIES(X) \
  X(elementwise) X(activation) X(reduce) X(matmul) X(embedding) X(norm) X(rope) \
  X(attention) X(loss) X(optim) X(cast) X(matmul_lowp) X(fp8_linear) X(fused) \
  X(vocab_parallel) X(copy)

#define DECLARE(fam) extern "C" const char tt_cuda_family_##fam[];
FAMILIES(DECLARE)
#undef DECLARE

int tt_cuda_kernels_linked(void) {
#define NAME(fam) tt_cuda_family_##fam,
  static const char *const names[] = {FAMILIES(NAME)};
#undef NAME
  const void *const tables[] = {
    &tt_elementwise_cuda, &tt_activation_cuda, &tt_reduce_cuda, &tt_matmul_cuda,
    &tt_embedding_cuda, &tt_norm_cuda, &tt_rope_cuda, &tt_attention_cuda, &tt_loss_cuda,
    &tt_optim_cuda, names[10], names[11], names[12], &tt_fused_cuda,
    &tt_vocab_parallel_cuda, names[15],
  };
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
    TT_CHECK(tables[i] != NULL, "cuda: the kernel table of %s is not linked in", names[i]);
  return 0;
}
