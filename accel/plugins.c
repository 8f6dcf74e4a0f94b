/* ctrain — DeepSpeed and FSDP settings into the sharding engine's (accel/plugins.h). */
#include "accel/plugins.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dist/env.h"

/* Index of v among names (case-insensitive), or an error listing them. */
static ct_status choice(const char *what, const char *v, const char *const *names, int n, int *out)
{
    for (int i = 0; v && i < n; i++)
        if (!strcasecmp(v, names[i])) {
            *out = i;
            return CT_OK;
        }
    char allowed[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s", i ? ", " : "", names[i]);
    return ct_error_set(CT_ERR_INVALID, "%s '%s'; allowed: %s", what, v ? v : "(null)", allowed);
}

ct_status ct_fsdp_strategy_parse(const char *v, ct_shard_strategy *out)
{
    /* accelerate numbers them 1..4 in this order */
    static const char *const names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                        "1", "2", "3", "4"};
    static const ct_shard_strategy map[] = {CT_SHARD_FULL, CT_SHARD_GRAD_OP, CT_SHARD_NO_SHARD, CT_SHARD_HYBRID};
    int i = 0;
    ct_status st = choice("sharding_strategy", v, names, 8, &i);
    if (!st) *out = map[i % 4];
    return st;
}

ct_status ct_fsdp_wrap_policy_parse(const char *v, ct_wrap_policy *out)
{
    static const char *const names[] = {"NO_WRAP", "TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP"};
    static const ct_wrap_policy map[] = {CT_WRAP_NONE, CT_WRAP_TRANSFORMER, CT_WRAP_SIZE};
    int i = 0;
    ct_status st = choice("auto_wrap_policy", v, names, 3, &i);
    if (!st) *out = map[i];
    return st;
}

ct_status ct_fsdp_backward_prefetch_parse(const char *v, ct_backward_prefetch *out)
{
    static const char *const names[] = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
    static const ct_backward_prefetch map[] = {CT_PREFETCH_BACKWARD_PRE, CT_PREFETCH_BACKWARD_POST, CT_PREFETCH_NONE};
    int i = 0;
    ct_status st = choice("backward_prefetch", v, names, 3, &i);
    if (!st) *out = map[i];
    return st;
}

ct_status ct_fsdp_state_dict_type_parse(const char *v, bool *sharded)
{
    static const char *const names[] = {"FULL_STATE_DICT", "SHARDED_STATE_DICT"};
    int i = 0;
    ct_status st = choice("state_dict_type", v, names, 2, &i);
    if (!st) *sharded = i == 1;
    return st;
}

ct_status ct_offload_device_parse(const char *v, bool *cpu)
{
    static const char *const names[] = {"none", "cpu"};
    int i = 0;
    ct_status st = choice("offload device", v, names, 2, &i);
    if (!st) *cpu = i == 1;
    return st;
}

ct_status ct_bool_parse(const char *v, bool *out)
{
    static const char *const names[] = {"false", "true", "0", "1", "no", "yes", "off", "on"};
    int i = 0;
    ct_status st = choice("boolean", v, names, 8, &i);
    if (!st) *out = i % 2 == 1;
    return st;
}

/* ---- DeepSpeed ------------------------------------------------------------------- */

static const ct_shard_strategy stage_strategy[] = {CT_SHARD_NO_SHARD, CT_SHARD_OPTIMIZER, CT_SHARD_GRAD_OP,
                                                   CT_SHARD_FULL};

/* The communication settings a ds_config gives (absent or "auto": the engine's
 * defaults). reduce_bucket_size becomes the unit size: the engine reduces a unit's
 * gradients once the unit is done, so units of about that many parameters are
 * DeepSpeed's buckets. A stage3_prefetch_bucket_size of 0 turns prefetching off, as
 * in DeepSpeed. */
static void from_ds_comm(const ct_ds_config *c, bool rank_zero, ct_sharding_settings *o)
{
    ct_shard_config *s = &o->shard;
    if (c->from[CT_DS_REDUCE_BUCKET] == CT_DS_GIVEN)
        s->wrap = (ct_wrap_config){.policy = CT_WRAP_SIZE, .min_num_params = c->zero.reduce_bucket_size};
    if (c->from[CT_DS_ALLGATHER_BUCKET] == CT_DS_GIVEN) s->allgather_bucket = c->zero.allgather_bucket_size;
    if (c->from[CT_DS_PREFETCH_BUCKET] == CT_DS_GIVEN) {
        s->prefetch_bucket = c->zero.stage3_prefetch_bucket_size;
        if (!s->prefetch_bucket) s->backward_prefetch = CT_PREFETCH_NONE, s->forward_prefetch = false;
    }
    if (c->from[CT_DS_PERSISTENCE] == CT_DS_GIVEN) s->persistence_threshold = c->zero.stage3_param_persistence_threshold;
    if (c->zero.overlap_comm_given) s->no_overlap_comm = !c->zero.overlap_comm;
    if (!c->zero.contiguous_gradients && rank_zero)
        fprintf(stderr, "ctrain: %s: contiguous_gradients false has no effect: each unit's gradients are always "
                        "packed into one buffer\n", o->source);
}

static ct_status from_deepspeed(const ct_deepspeed_plugin *p, bool rank_zero, ct_sharding_settings *o)
{
    if (p->zero_stage < 0 || p->zero_stage > 3)
        return ct_error_set(CT_ERR_INVALID, "zero_stage %d; allowed: 0, 1, 2, 3", p->zero_stage);
    bool off_opt = false, off_param = false;
    if (p->offload_optimizer_device && ct_offload_device_parse(p->offload_optimizer_device, &off_opt))
        return ct_error_prefix("offload_optimizer_device: ");
    if (p->offload_param_device && ct_offload_device_parse(p->offload_param_device, &off_param))
        return ct_error_prefix("offload_param_device: ");
    if (p->gradient_accumulation_steps < 0)
        return ct_error_set(CT_ERR_INVALID, "gradient_accumulation_steps %d; expected >= 1 (0: the Accelerator's)",
                            p->gradient_accumulation_steps);
    if (!(p->gradient_clipping >= 0))
        return ct_error_set(CT_ERR_INVALID, "gradient_clipping %g; expected >= 0 (0: none)", p->gradient_clipping);
    int stage = p->zero_stage;
    o->gradient_accumulation_steps = p->gradient_accumulation_steps;
    o->gradient_clipping = p->gradient_clipping;
    if (p->config_file && *p->config_file) {
        ct_ds_config *c = &o->ds;
        if (ct_ds_config_load(p->config_file, c)) return ct_last_status();
        o->has_ds = true;
        snprintf(o->ds_path, sizeof o->ds_path, "%s", p->config_file);
        snprintf(o->source_buf, sizeof o->source_buf, "ds_config '%s'", p->config_file);
        o->source = o->source_buf;
        if (rank_zero)
            for (int i = 0; i < c->n_warnings && i < CT_DS_MAX_WARNINGS; i++) fprintf(stderr, "ctrain: %s\n", c->warnings[i]);
        /* a plugin value beside the file must say the same */
        if (p->zero_stage && p->zero_stage != c->zero.stage)
            return ct_error_set(CT_ERR_INVALID, "zero_stage %d given, but %s says zero_optimization.stage %d",
                                p->zero_stage, o->source, c->zero.stage);
        stage = c->zero.stage;
        off_opt = off_opt || c->zero.offload_optimizer == CT_DS_OFFLOAD_CPU;
        off_param = off_param || c->zero.offload_param == CT_DS_OFFLOAD_CPU;
        if (c->from[CT_DS_GRAD_ACCUM] == CT_DS_GIVEN) {
            if (p->gradient_accumulation_steps && p->gradient_accumulation_steps != c->gradient_accumulation_steps)
                return ct_error_set(CT_ERR_INVALID, "gradient_accumulation_steps %d given, but %s says %lld",
                                    p->gradient_accumulation_steps, o->source,
                                    (long long)c->gradient_accumulation_steps);
            o->gradient_accumulation_steps = (int)c->gradient_accumulation_steps;
        }
        if (c->from[CT_DS_GRAD_CLIP] == CT_DS_GIVEN) {
            if (p->gradient_clipping > 0 && p->gradient_clipping != c->gradient_clipping)
                return ct_error_set(CT_ERR_INVALID, "gradient_clipping %g given, but %s says %g", p->gradient_clipping,
                                    o->source, c->gradient_clipping);
            o->gradient_clipping = c->gradient_clipping;
        }
        if (c->from[CT_DS_FP16] == CT_DS_GIVEN && c->fp16.enabled) {
            o->mixed_precision = "fp16";
            o->scaler_set = true;
            o->scaler = (ct_loss_scaler_config){.hysteresis = c->fp16.hysteresis, .min_scale = c->fp16.min_loss_scale};
            if (c->fp16.loss_scale > 0) { /* DeepSpeed's static scale: never grows, never shrinks */
                o->scaler.init_scale = c->fp16.loss_scale;
                o->scaler.growth_interval = 1 << 30;
                o->scaler.min_scale = o->scaler.max_scale = c->fp16.loss_scale;
            } else {
                o->scaler.init_scale = (double)(1ull << c->fp16.initial_scale_power);
                o->scaler.growth_interval = (int)c->fp16.loss_scale_window;
            }
        }
        if (c->from[CT_DS_BF16] == CT_DS_GIVEN && c->bf16_enabled) o->mixed_precision = "bf16";
        if (!strcmp(c->communication_data_type, "bf16")) o->shard.reduce_dtype = CT_DTYPE_BF16;
        if (!strcmp(c->communication_data_type, "fp16")) o->shard.reduce_dtype = CT_DTYPE_F16;
        from_ds_comm(c, rank_zero, o);
    }
    if (off_param && stage != 3)
        return ct_error_set(CT_ERR_INVALID, "offload_param_device cpu needs ZeRO stage 3 (stage is %d)", stage);
    o->shard.strategy = stage_strategy[stage];
    o->shard.offload_optimizer = off_opt || off_param;
    if (o->shard.offload_optimizer && stage == 0)
        return ct_error_set(CT_ERR_INVALID, "offload_optimizer_device cpu needs ZeRO stage 1, 2 or 3 (stage is 0)");
    return CT_OK;
}

/* ---- FSDP -------------------------------------------------------------------------- */

static ct_status split_classes(const char *v, ct_sharding_settings *o)
{
    snprintf(o->names, sizeof o->names, "%s", v);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(o->names, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        if (n == CT_SHARDING_MAX_CLASSES)
            return ct_error_set(CT_ERR_INVALID, "transformer_cls_names_to_wrap: more than %d names",
                                CT_SHARDING_MAX_CLASSES);
        o->classes[n++] = t;
    }
    o->shard.wrap.classes = o->classes;
    o->shard.wrap.nclasses = n;
    return CT_OK;
}

static ct_status from_fsdp(const ct_fsdp_plugin *p, ct_sharding_settings *o)
{
    ct_shard_config *c = &o->shard;
    c->strategy = CT_SHARD_FULL;
    if (p->sharding_strategy && ct_fsdp_strategy_parse(p->sharding_strategy, &c->strategy)) return ct_last_status();
    if (p->auto_wrap_policy && ct_fsdp_wrap_policy_parse(p->auto_wrap_policy, &c->wrap.policy)) return ct_last_status();
    if (p->backward_prefetch && ct_fsdp_backward_prefetch_parse(p->backward_prefetch, &c->backward_prefetch))
        return ct_last_status();
    if (p->state_dict_type && ct_fsdp_state_dict_type_parse(p->state_dict_type, &o->sharded_state_dict))
        return ct_last_status();
    if (p->min_num_params < 0)
        return ct_error_set(CT_ERR_INVALID, "min_num_params %lld; expected >= 1 (0: 100000000)",
                            (long long)p->min_num_params);
    c->wrap.min_num_params = p->min_num_params ? p->min_num_params : 100000000;
    if (c->wrap.policy == CT_WRAP_TRANSFORMER) {
        if (!p->transformer_cls_names_to_wrap || !*p->transformer_cls_names_to_wrap)
            return ct_error_set(CT_ERR_INVALID, "auto_wrap_policy TRANSFORMER_BASED_WRAP needs "
                                                "transformer_cls_names_to_wrap (the module types to wrap, e.g. Block)");
        if (split_classes(p->transformer_cls_names_to_wrap, o)) return ct_last_status();
    }
    static const char *const dtypes[] = {"fp32", "bf16", "fp16"};
    static const ct_dtype dtype_of[] = {CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_F16};
    int i = 0;
    if (p->param_dtype) {
        if (choice("param_dtype", p->param_dtype, dtypes, 3, &i)) return ct_last_status();
        c->param_dtype = dtype_of[i];
    }
    if (p->reduce_dtype) {
        if (choice("reduce_dtype", p->reduce_dtype, dtypes, 3, &i)) return ct_last_status();
        c->reduce_dtype = dtype_of[i];
    }
    c->offload_optimizer = p->cpu_offload;
    c->forward_prefetch = p->forward_prefetch;
    c->no_reshard_after_forward = p->reshard_after_forward == CT_FLAG_OFF;
    c->no_broadcast = p->sync_module_states == CT_FLAG_OFF;
    if (c->offload_optimizer && c->strategy == CT_SHARD_NO_SHARD)
        return ct_error_set(CT_ERR_INVALID, "cpu_offload needs a sharded strategy (NO_SHARD replicates everything)");
    return CT_OK;
}

/* ---- the launcher's variables ---------------------------------------------------------- */

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static ct_status env_bool(const char *name, bool *out)
{
    const char *v = env(name);
    if (v && ct_bool_parse(v, out)) return ct_error_prefix("%s: ", name);
    return CT_OK;
}

static ct_status from_env(bool rank_zero, ct_sharding_settings *o)
{
    bool use_ds = false, use_fsdp = false;
    if (env_bool("CTRAIN_USE_DEEPSPEED", &use_ds) || env_bool("CTRAIN_USE_FSDP", &use_fsdp)) return ct_last_status();
    if (use_ds && use_fsdp)
        return ct_error_set(CT_ERR_INVALID, "CTRAIN_USE_DEEPSPEED and CTRAIN_USE_FSDP are both set: choose one");
    if (use_ds) {
        ct_deepspeed_plugin p = {.offload_optimizer_device = env("CTRAIN_OFFLOAD_OPTIMIZER_DEVICE"),
                                 .offload_param_device = env("CTRAIN_OFFLOAD_PARAM_DEVICE"),
                                 .config_file = env("CTRAIN_DEEPSPEED_CONFIG_FILE")};
        if (ct_dist_env_int("CTRAIN_ZERO_STAGE", 0, 0, &p.zero_stage) ||
            ct_dist_env_int("CTRAIN_GRADIENT_ACCUMULATION_STEPS", 0, 1, &p.gradient_accumulation_steps))
            return ct_last_status();
        if (p.zero_stage > 3)
            return ct_error_set(CT_ERR_INVALID, "CTRAIN_ZERO_STAGE='%s'; allowed: 0, 1, 2, 3", env("CTRAIN_ZERO_STAGE"));
        const char *clip = env("CTRAIN_GRADIENT_CLIPPING");
        if (clip) {
            char *end;
            p.gradient_clipping = strtod(clip, &end);
            if (*end || !(p.gradient_clipping >= 0))
                return ct_error_set(CT_ERR_INVALID, "CTRAIN_GRADIENT_CLIPPING='%s'; expected a number >= 0", clip);
        }
        o->source = "ctrain launch --use_deepspeed";
        return from_deepspeed(&p, rank_zero, o);
    }
    if (use_fsdp) {
        int min = 0;
        bool offload = false, fwd = false, reshard = true, sync = true;
        if (ct_dist_env_int("CTRAIN_FSDP_MIN_NUM_PARAMS", 0, 1, &min) ||
            env_bool("CTRAIN_FSDP_OFFLOAD_PARAMS", &offload) || env_bool("CTRAIN_FSDP_FORWARD_PREFETCH", &fwd) ||
            env_bool("CTRAIN_FSDP_RESHARD_AFTER_FORWARD", &reshard) ||
            env_bool("CTRAIN_FSDP_SYNC_MODULE_STATES", &sync))
            return ct_last_status();
        ct_fsdp_plugin p = {.sharding_strategy = env("CTRAIN_FSDP_SHARDING_STRATEGY"),
                            .auto_wrap_policy = env("CTRAIN_FSDP_AUTO_WRAP_POLICY"),
                            .transformer_cls_names_to_wrap = env("CTRAIN_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP"),
                            .min_num_params = min,
                            .cpu_offload = offload,
                            .backward_prefetch = env("CTRAIN_FSDP_BACKWARD_PREFETCH"),
                            .forward_prefetch = fwd,
                            .reshard_after_forward = reshard ? CT_FLAG_ON : CT_FLAG_OFF,
                            .state_dict_type = env("CTRAIN_FSDP_STATE_DICT_TYPE"),
                            .sync_module_states = sync ? CT_FLAG_ON : CT_FLAG_OFF};
        o->source = "ctrain launch --use_fsdp";
        return from_fsdp(&p, o);
    }
    return CT_OK;
}

ct_status ct_sharding_settings_resolve(const ct_deepspeed_plugin *ds, const ct_fsdp_plugin *fsdp, bool rank_zero,
                                       ct_sharding_settings *out)
{
    *out = (ct_sharding_settings){0};
    ct_ds_config_init(&out->ds);
    if (ds && fsdp)
        return ct_error_set(CT_ERR_INVALID, "both a deepspeed_plugin and an fsdp_plugin were given: choose one");
    ct_status st;
    if (ds) {
        out->source = "deepspeed_plugin";
        st = from_deepspeed(ds, rank_zero, out);
    } else if (fsdp) {
        out->source = "fsdp_plugin";
        st = from_fsdp(fsdp, out);
    } else {
        st = from_env(rank_zero, out);
    }
    return st ? ct_error_prefix("%s: ", out->source ? out->source : "sharding settings") : CT_OK;
}

ct_status ct_sharding_settings_check_ds(ct_sharding_settings *s, int world, int64_t micro_batch, int grad_accum,
                                        double grad_clip, const char *mixed_precision)
{
    if (!s->has_ds) return CT_OK;
    /* without a loader, a file that names no batch size has nothing to multiply out */
    if (micro_batch <= 0 && s->ds.from[CT_DS_TRAIN_BATCH] == CT_DS_ABSENT &&
        s->ds.from[CT_DS_MICRO_BATCH] == CT_DS_ABSENT)
        micro_batch = 1;
    ct_ds_defaults d = {.world_size = world,
                        .micro_batch = micro_batch,
                        .grad_accum = grad_accum,
                        .grad_clip = grad_clip > 0 ? grad_clip : -1,
                        .mixed_precision = mixed_precision};
    return ct_ds_config_resolve(&s->ds, s->ds_path, &d);
}
