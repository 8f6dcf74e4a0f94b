/* ctrain — Megatron-LM's settings from a plugin struct or the launcher's variables
 * (accel/plugins.h). */
#include "accel/plugins.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/env.h"

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static ct_status env_bool(const char *name, bool *out)
{
    const char *v = env(name);
    if (v && ct_bool_parse(v, out))
        return ct_error_set(CT_ERR_INVALID, "%s='%s'; allowed: true, false, 1, 0, yes, no, on, off", name, v);
    return CT_OK;
}

ct_status ct_megatron_lm_plugin_from_env(bool *on, ct_megatron_lm_plugin *out)
{
    *out = (ct_megatron_lm_plugin){0};
    *on = false;
    if (env_bool("CTRAIN_USE_MEGATRON_LM", on)) return ct_last_status();
    if (!*on) return CT_OK;
    if (ct_dist_env_int("CTRAIN_MEGATRON_TP_DEGREE", 1, 1, &out->tp_degree) ||
        ct_dist_env_int("CTRAIN_MEGATRON_PP_DEGREE", 1, 1, &out->pp_degree) ||
        ct_dist_env_int("CTRAIN_MEGATRON_NUM_MICRO_BATCHES", 1, 1, &out->num_micro_batches) ||
        env_bool("CTRAIN_MEGATRON_SEQUENCE_PARALLELISM", &out->sequence_parallelism) ||
        env_bool("CTRAIN_MEGATRON_USE_DISTRIBUTED_OPTIMIZER", &out->use_distributed_optimizer))
        return ct_last_status();
    const char *clip = env("CTRAIN_MEGATRON_GRADIENT_CLIPPING");
    if (clip) {
        char *end;
        out->gradient_clipping = strtod(clip, &end);
        if (*end || !(out->gradient_clipping >= 0) || !isfinite(out->gradient_clipping))
            return ct_error_set(CT_ERR_INVALID, "CTRAIN_MEGATRON_GRADIENT_CLIPPING='%s'; expected a number >= 0 "
                                                "(0: no clipping)", clip);
    }
    return CT_OK;
}

ct_status ct_megatron_lm_plugin_resolve(const ct_megatron_lm_plugin *p, int world, ct_megatron_lm_plugin *out)
{
    ct_megatron_lm_plugin r = *p;
    const struct {
        const char *name;
        int *v;
    } ints[] = {{"tp_degree", &r.tp_degree}, {"pp_degree", &r.pp_degree}, {"num_micro_batches", &r.num_micro_batches}};
    for (int i = 0; i < 3; i++) {
        if (*ints[i].v < 0)
            return ct_error_set(CT_ERR_INVALID, "megatron_lm_plugin: %s = %d; expected >= 1 (0 = 1)", ints[i].name,
                                *ints[i].v);
        if (!*ints[i].v) *ints[i].v = 1;
    }
    if (!(r.gradient_clipping >= 0) || !isfinite(r.gradient_clipping))
        return ct_error_set(CT_ERR_INVALID, "megatron_lm_plugin: gradient_clipping = %g; expected a number >= 0 "
                                            "(0: no clipping)", r.gradient_clipping);
    if (r.sequence_parallelism && r.tp_degree == 1)
        return ct_error_set(CT_ERR_INVALID, "megatron_lm_plugin: sequence_parallelism needs tp_degree > 1 (it splits "
                                            "the sequence over the tensor-parallel ranks); tp_degree is 1");
    if (world > 0 && world % (r.tp_degree * r.pp_degree))
        return ct_error_set(CT_ERR_INVALID,
                            "megatron_lm_plugin: world size %d is not divisible by tp_degree %d x pp_degree %d = %d "
                            "(world = dp x tp x pp)",
                            world, r.tp_degree, r.pp_degree, r.tp_degree * r.pp_degree);
    if (out) *out = r;
    return CT_OK;
}
