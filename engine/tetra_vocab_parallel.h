/*
** tetra_vocab_parallel.h — cross-entropy over logits split by vocabulary across a
** tensor-parallel group (Megatron's vocab-parallel loss). Public; tetra.parallel.tensor
** declares it through tetra.ffi.cdef_header("tetra_vocab_parallel.h").
*/
#ifndef TETRA_VOCAB_PARALLEL_H
#define TETRA_VOCAB_PARALLEL_H

#include "tetra_dist.h"

/* logits: (..., Vl) f32 or bf16 (the arithmetic f32; the gradient in the logits' dtype),
** on the CPU or a GPU, this rank's columns [vocab_start, vocab_start + Vl) of the full
** (..., V) logits; targets: (...) i32/i64 global ids on the same device, the same on every
** rank of `group`. out: the scalar mean of -log softmax(full logits)[target] over targets !=
** ignore_index, the same on every rank. Three row collectives in the forward (the max,
** then the sum of exp and the target logit in one all-reduce); the full logits are never
** gathered. The backward is local: each rank gets the gradient of its own columns. A
** target that no rank of the group owns is an error (on a GPU with deferred checks on, it
** is recorded for the step's read, as for tt_cross_entropy). */
int tt_vocab_parallel_cross_entropy(tt_comm *group, tt_tensor *logits, tt_tensor *targets,
                                    int64_t vocab_start, int64_t ignore_index,
                                    tt_tensor **out);

#endif
