/*
** mesh.c — the 4D layout of world ranks over (tp, cp, dp, pp) and its groups.
**
** With the default order "tp-cp-dp-pp" (fastest first), world rank
**   r = tp + TP * (cp + CP * (dp + DP * pp))
** so the ranks of one TP group are consecutive (one node's NVLink domain) and pipeline
** stages are the outermost blocks. A group along one dimension is the set of ranks that
** share the three other coordinates.
*/
#include "dist/dist_internal.h"

enum { DIM_TP, DIM_CP, DIM_DP, DIM_PP, NUM_DIMS };
static const char *const dim_names[NUM_DIMS] = {"tp", "cp", "dp", "pp"};

enum { GROUP_TP, GROUP_CP, GROUP_DP, GROUP_PP, GROUP_DPCP, NUM_GROUPS };
static const char *const group_names[NUM_GROUPS] = {"tp", "cp", "dp", "pp", "dpcp"};

struct tt_mesh {
  int size[NUM_DIMS];
  int order[NUM_DIMS];    /* order[0] is the fastest-varying dimension */
  int coord[NUM_DIMS];    /* this process */
  tt_comm *groups[NUM_GROUPS];
};

static int dim_index(const char *name, size_t len) {
  for (int d = 0; d < NUM_DIMS; d++)
    if (strlen(dim_names[d]) == len && strncmp(name, dim_names[d], len) == 0) return d;
  return -1;
}

/* "tp-cp-dp-pp" -> order; each name exactly once, separated by '-' or ','. */
static int parse_order(const char *text, int *order) {
  const char *fallback = "tp-cp-dp-pp";
  if (!text || !*text) text = fallback;
  int seen[NUM_DIMS] = {0}, n = 0;
  const char *p = text;
  while (*p) {
    size_t len = strcspn(p, "-,");
    int d = dim_index(p, len);
    TT_CHECK(d >= 0 && n < NUM_DIMS && !seen[d],
             "parallel.order = \"%s\": expected the four names tp, cp, dp, pp once each, "
             "fastest first, e.g. \"tp-cp-dp-pp\"", text);
    seen[d] = 1;
    order[n++] = d;
    p += len;
    if (*p) p++;
  }
  TT_CHECK(n == NUM_DIMS,
           "parallel.order = \"%s\": expected the four names tp, cp, dp, pp once each, "
           "fastest first, e.g. \"tp-cp-dp-pp\"", text);
  return 0;
}

static int rank_of(const tt_mesh *m, const int *coord) {
  int r = 0;
  for (int k = NUM_DIMS - 1; k >= 0; k--) {
    int d = m->order[k];
    if (coord[d] < 0 || coord[d] >= m->size[d]) return -1;
    r = r * m->size[d] + coord[d];
  }
  return r;
}

static void coords_of(const tt_mesh *m, int rank, int *coord) {
  for (int k = 0; k < NUM_DIMS; k++) {
    int d = m->order[k];
    coord[d] = rank % m->size[d];
    rank /= m->size[d];
  }
}

/* Ranks that share every coordinate outside `in_group` form one group: the color is the
** rank with those coordinates zeroed, the key the rank itself (keeps mesh order). */
static int split_group(tt_mesh *m, const int *in_group, const char *name, tt_comm **out) {
  int c[NUM_DIMS];
  memcpy(c, m->coord, sizeof c);
  for (int d = 0; d < NUM_DIMS; d++)
    if (in_group[d]) c[d] = 0;
  return tt_comm_split(tt_comm_world(), rank_of(m, c), rank_of(m, m->coord), name, out);
}

void tt_mesh_free(tt_mesh *m) {
  if (!m) return;
  for (int i = 0; i < NUM_GROUPS; i++) tt_comm_free(m->groups[i]);
  free(m);
}

int tt_mesh_new(int tp, int cp, int dp, int pp, const char *order, tt_mesh **out) {
  *out = NULL;
  tt_comm *world = tt_comm_world();
  TT_CHECK(world, "mesh: %s", tt_last_error());
  TT_CHECK(tp >= 1 && cp >= 1 && dp >= 1 && pp >= 1,
           "parallel sizes must be >= 1 (tensor %d, context %d, data %d, pipeline %d)", tp,
           cp, dp, pp);
  int64_t need = (int64_t)tp * cp * dp * pp;
  if (need != world->size)
    return tt_set_error(
        "parallel layout tensor %d x context %d x data %d x pipeline %d needs %lld "
        "processes, but %d %s launched; launch with mpirun -np %lld or change "
        "parallel.*_parallel_size so the product is %d",
        tp, cp, dp, pp, (long long)need, world->size, world->size == 1 ? "was" : "were",
        (long long)need, world->size);
  tt_mesh *m = calloc(1, sizeof *m);
  TT_CHECK(m, "mesh: out of host memory");
  m->size[DIM_TP] = tp;
  m->size[DIM_CP] = cp;
  m->size[DIM_DP] = dp;
  m->size[DIM_PP] = pp;
  if (parse_order(order, m->order) != 0) {
    free(m);
    return -1;
  }
  coords_of(m, world->rank, m->coord);
  static const int members[NUM_GROUPS][NUM_DIMS] = {
      {1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}, {0, 1, 1, 0}};
  for (int i = 0; i < NUM_GROUPS; i++) {
    if (split_group(m, members[i], group_names[i], &m->groups[i]) != 0) {
      tt_mesh_free(m);
      return -1;
    }
  }
  *out = m;
  return 0;
}

tt_comm *tt_mesh_group(tt_mesh *m, const char *name) {
  if (name && strcmp(name, "world") == 0) return tt_comm_world();
  for (int i = 0; i < NUM_GROUPS; i++)
    if (name && strcmp(name, group_names[i]) == 0) return m->groups[i];
  tt_set_error("mesh: no group named \"%s\" (tp, cp, dp, pp, dpcp, world)",
               name ? name : "(null)");
  return NULL;
}

int tt_mesh_coord(const tt_mesh *m, const char *dim) {
  int d = dim ? dim_index(dim, strlen(dim)) : -1;
  return d < 0 ? -1 : m->coord[d];
}

int tt_mesh_dim_size(const tt_mesh *m, const char *dim) {
  int d = dim ? dim_index(dim, strlen(dim)) : -1;
  return d < 0 ? -1 : m->size[d];
}

int tt_mesh_rank_at(const tt_mesh *m, int tp, int cp, int dp, int pp) {
  int c[NUM_DIMS] = {tp, cp, dp, pp};
  return rank_of(m, c);
}
