/* ctrain — the sharding engine's plan: which parameters form which unit, where each
 * sits in its unit's flat buffer, and which slice of that buffer each rank owns.
 *
 * Units follow the wrap policy, as FSDP's auto-wrap does, bottom up over the module
 * tree:
 *   no_wrap                 one unit, the whole model;
 *   transformer_based_wrap  one unit per module whose type is one of the named
 *                           classes (e.g. "Block"), innermost first;
 *   size_based_wrap         a module becomes a unit when the parameters of its
 *                           subtree not already in a unit number at least
 *                           min_num_params (containers, ModuleList and
 *                           ModuleDict, never: as in FSDP);
 * and the parameters left over form the root unit, last. A tensor registered twice
 * (tied weights) belongs to the first unit that reaches it.
 *
 * Layout: a unit's parameters are laid end to end in registration order, then the
 * buffer is padded with zeros to a multiple of the world size N: numel <= padded,
 * padded = N * shard. Rank r owns elements [r*shard, (r+1)*shard): any parameter count
 * works, the last rank simply owns the padding.
 */
#ifndef CT_PARALLEL_SHARD_PLAN_H
#define CT_PARALLEL_SHARD_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"
#include "nn/module.h"

typedef enum ct_wrap_policy {
    CT_WRAP_NONE,        /* no_wrap */
    CT_WRAP_TRANSFORMER, /* transformer_based_wrap */
    CT_WRAP_SIZE         /* size_based_wrap */
} ct_wrap_policy;

typedef struct ct_wrap_config {
    ct_wrap_policy policy;
    const char *const *classes; /* transformer_based_wrap: module types to wrap */
    int nclasses;
    int64_t min_num_params;     /* size_based_wrap: >= 1 */
} ct_wrap_config;

typedef struct ct_shard_param {
    ct_tensor *param; /* borrowed from the module */
    char *name;       /* dotted name in the model */
    int64_t offset;   /* first element in the unit's flat buffer */
    int64_t numel;
} ct_shard_param;

typedef struct ct_shard_unit {
    char *name;              /* dotted name of the wrapped module; "" for the root unit */
    const ct_module *module; /* borrowed */
    ct_shard_param *params;
    int nparams;
    int64_t numel;  /* sum of the parameters' elements */
    int64_t padded; /* numel rounded up to a multiple of the world size */
    int64_t shard;  /* padded / world size: each rank's slice */
} ct_shard_unit;

typedef struct ct_shard_plan {
    int world;
    ct_shard_unit *units; /* execution order of a forward: inner units first, root last */
    int nunits;
    int64_t numel, padded; /* over all units */
} ct_shard_plan;

/* Builds the plan of root's parameters for world ranks. Errors: world < 1, an unknown
 * policy, a transformer policy without classes or naming a type the model does not
 * have (a typo would otherwise make one unit silently), min_num_params < 1, a model
 * without parameters, a parameter that is not floating point. */
CT_API ct_status ct_shard_plan_build(const ct_module *root, const ct_wrap_config *wrap, int world, ct_shard_plan *out);
/* The same over the parameters of root listed in only (NULL: all of them); the others
 * belong to no unit (a pipeline stage's plan leaves out the other stages' parameters,
 * whose memory is released). The units and the layout are those of the full plan with
 * the unlisted parameters removed. */
CT_API ct_status ct_shard_plan_build_subset(const ct_module *root, const ct_wrap_config *wrap, int world,
                                            const ct_param_list *only, ct_shard_plan *out);
/* Frees a plan ct_shard_plan_build made; NULL is fine. */
CT_API void ct_shard_plan_free(ct_shard_plan *p);

/* The part of parameter p that rank r owns: elements [*begin, *end) of p (flat),
 * empty (*begin == *end) when r's slice does not reach it. */
CT_API void ct_shard_param_slice(const ct_shard_unit *u, const ct_shard_param *p, int r, int64_t *begin, int64_t *end);

#endif
