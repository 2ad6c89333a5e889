/*
** step_stats.h — inside the engine: the one check of a step stats tensor (engine/
** step_stats.c), shared by the ops that read or write it (engine/optim/optim.c).
*/
#ifndef TT_STEP_STATS_H
#define TT_STEP_STATS_H
#include "core/tt_internal.h"

/* Any device: the stats' own. */
enum { TT_STATS_ANY_DEVICE = -2 };

/* stats must be a contiguous f32 tensor of TT_STEP_STATS_N values, on `device` unless
** that is TT_STATS_ANY_DEVICE; -1 with "<op>: stats ... must be ..." otherwise. */
int tt_step_stats_check(const char *op, const tt_tensor *stats, int device);

#endif
