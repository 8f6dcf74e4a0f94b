/* What a launch configuration means to `ctrain launch`: the flags it amounts to
 * (tools/config_file.h). Launch reads them before the command line's flags, so a
 * flag given on the command line wins, as in `accelerate launch`.
 *
 *   num_processes, num_machines, machine_rank,      the flags of the same names
 *   main_process_ip, main_process_port,
 *   num_cpu_threads_per_process, gpu_ids,
 *   rdzv_backend (c10d only)
 *   gradient_accumulation_steps, mixed_precision
 *   use_cpu (or distributed_type MULTI_CPU)         --cpu
 *   debug                                           --debug
 *   fp8_config (mixed_precision fp8)                --fp8_format, --fp8_amax_history_len, ...
 *   DEEPSPEED                                       --use_deepspeed and, from deepspeed_config,
 *                                                   --deepspeed_config_file, or --zero_stage,
 *                                                   --offload_*_device, --gradient_accumulation_steps,
 *                                                   --gradient_clipping
 *   FSDP                                            --use_fsdp and --fsdp_* from fsdp_config
 *   MEGATRON_LM                                     --use_megatron_lm and --megatron_lm_tp_degree,
 *                                                   --megatron_lm_pp_degree, ... from megatron_lm_config
 *                                                   (recompute_activations is kept, not passed);
 *                                                   with a deepspeed_config or fsdp_config that has
 *                                                   keys, also that strategy's flags (it shards the
 *                                                   data-parallel axis)
 */
#include "tools/config_file.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ct_status add(ct_cluster_launch_args *a, const char *flag)
{
    if (a->argc >= CT_CLUSTER_LAUNCH_ARGS_MAX)
        return ct_error_set(CT_ERR_INTERNAL, "config: more than %d launch arguments", CT_CLUSTER_LAUNCH_ARGS_MAX);
    a->argv[a->argc++] = flag;
    return CT_OK;
}

/* flag and a formatted value kept in a->buf */
static ct_status addv(ct_cluster_launch_args *a, const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ct_status addv(ct_cluster_launch_args *a, const char *flag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = sizeof a->buf - a->used;
    int w = vsnprintf(a->buf + a->used, room, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= room)
        return ct_error_set(CT_ERR_INTERNAL, "config: the launch arguments need more than %zu bytes", sizeof a->buf);
    if (add(a, flag) || add(a, a->buf + a->used)) return ct_last_status();
    a->used += (size_t)w + 1;
    return CT_OK;
}

static const char *tf(bool b)
{
    return b ? "true" : "false";
}

/* a clipping norm with the fewest digits that read back the same */
static ct_status add_clip(ct_cluster_launch_args *a, const char *flag, double v)
{
    int p = 1;
    char t[40];
    do snprintf(t, sizeof t, "%.*g", p, v);
    while (strtod(t, NULL) != v && ++p <= 17);
    return addv(a, flag, "%s", t);
}

/* --use_deepspeed and its flags from deepspeed_config */
static ct_status deepspeed_args(const ct_cluster_config *c, ct_cluster_launch_args *a)
{
    const __typeof__(c->deepspeed) *d = &c->deepspeed;
    ct_status s = add(a, "--use_deepspeed");
    if (d->deepspeed_config_file[0]) {
        if (!s) s = addv(a, "--deepspeed_config_file", "%s", d->deepspeed_config_file);
        return s;
    }
    if (!s) s = addv(a, "--zero_stage", "%d", d->zero_stage);
    if (!s && d->offload_optimizer_device[0])
        s = addv(a, "--offload_optimizer_device", "%s", d->offload_optimizer_device);
    if (!s && d->offload_param_device[0]) s = addv(a, "--offload_param_device", "%s", d->offload_param_device);
    if (!s && d->gradient_accumulation_steps > 0)
        s = addv(a, "--gradient_accumulation_steps", "%d", d->gradient_accumulation_steps);
    if (!s && d->gradient_clipping >= 0) s = add_clip(a, "--gradient_clipping", d->gradient_clipping);
    return s;
}

/* --use_fsdp and its flags from fsdp_config */
static ct_status fsdp_args(const ct_cluster_config *c, ct_cluster_launch_args *a)
{
    const __typeof__(c->fsdp) *f = &c->fsdp;
    ct_status s = add(a, "--use_fsdp");
    if (!s) s = addv(a, "--fsdp_sharding_strategy", "%s", f->sharding_strategy);
    if (!s && f->auto_wrap_policy[0]) s = addv(a, "--fsdp_auto_wrap_policy", "%s", f->auto_wrap_policy);
    if (!s && f->transformer_layer_cls_to_wrap[0])
        s = addv(a, "--fsdp_transformer_layer_cls_to_wrap", "%s", f->transformer_layer_cls_to_wrap);
    if (!s && f->min_num_params > 0) s = addv(a, "--fsdp_min_num_params", "%ld", f->min_num_params);
    if (!s) s = addv(a, "--fsdp_offload_params", "%s", tf(f->offload_params));
    if (!s) s = addv(a, "--fsdp_backward_prefetch", "%s", f->backward_prefetch);
    if (!s) s = addv(a, "--fsdp_forward_prefetch", "%s", tf(f->forward_prefetch));
    /* passed only when off: on, the strategy decides (SHARD_GRAD_OP keeps parameters) */
    if (!s && !f->reshard_after_forward) s = addv(a, "--fsdp_reshard_after_forward", "false");
    if (!s) s = addv(a, "--fsdp_state_dict_type", "%s", f->state_dict_type);
    if (!s) s = addv(a, "--fsdp_sync_module_states", "%s", tf(f->sync_module_states));
    return s;
}

ct_status ct_cluster_config_launch_args(const ct_cluster_config *c, bool with_sharding, ct_cluster_launch_args *a)
{
    a->argc = 0;
    a->used = 0;
    ct_status s = addv(a, "--num_processes", "%d", c->num_processes);
    if (!s) s = addv(a, "--num_machines", "%d", c->num_machines);
    if (!s) s = addv(a, "--machine_rank", "%d", c->machine_rank);
    if (!s && c->main_process_ip[0]) s = addv(a, "--main_process_ip", "%s", c->main_process_ip);
    if (!s && c->main_process_port >= 0) s = addv(a, "--main_process_port", "%d", c->main_process_port);
    /* c10d: the elastic rendezvous over num_machines nodes (restarts re-form the group);
     * static (the default) is today's launch; etcd is kept and not used */
    if (!s && !strcmp(c->rdzv_backend, "c10d")) s = addv(a, "--rdzv_backend", "%s", "c10d");
    if (!s && (c->use_cpu || c->distributed_type == CT_DIST_MULTI_CPU)) s = add(a, "--cpu");
    if (!s && c->num_cpu_threads_per_process > 0)
        s = addv(a, "--num_cpu_threads_per_process", "%d", c->num_cpu_threads_per_process);
    if (!s && c->gpu_ids[0]) s = addv(a, "--gpu_ids", "%s", c->gpu_ids);
    if (!s && c->debug) s = add(a, "--debug");
    if (!s && c->gradient_accumulation_steps > 0)
        s = addv(a, "--gradient_accumulation_steps", "%d", c->gradient_accumulation_steps);
    if (!s && c->mixed_precision[0]) s = addv(a, "--mixed_precision", "%s", c->mixed_precision);
    if (!s && !strcmp(c->mixed_precision, "fp8")) {
        if (c->fp8.fp8_format[0]) s = addv(a, "--fp8_format", "%s", c->fp8.fp8_format);
        if (!s && c->fp8.amax_history_len > 0) s = addv(a, "--fp8_amax_history_len", "%d", c->fp8.amax_history_len);
        if (!s && c->fp8.amax_compute_algo[0]) s = addv(a, "--fp8_amax_compute_algo", "%s", c->fp8.amax_compute_algo);
        if (!s && c->fp8.margin >= 0) s = addv(a, "--fp8_margin", "%d", c->fp8.margin);
    }
    if (s || !with_sharding) return s;

    if (c->distributed_type == CT_DIST_DEEPSPEED) return deepspeed_args(c, a);
    if (c->distributed_type == CT_DIST_MEGATRON_LM) {
        const __typeof__(c->megatron) *m = &c->megatron;
        s = add(a, "--use_megatron_lm");
        if (!s) s = addv(a, "--megatron_lm_tp_degree", "%d", m->tp_degree);
        if (!s) s = addv(a, "--megatron_lm_pp_degree", "%d", m->pp_degree);
        if (!s) s = addv(a, "--megatron_lm_num_micro_batches", "%d", m->num_micro_batches);
        if (!s) s = addv(a, "--megatron_lm_sequence_parallelism", "%s", tf(m->sequence_parallelism));
        if (!s) s = addv(a, "--megatron_lm_use_distributed_optimizer", "%s", tf(m->use_distributed_optimizer));
        if (!s && m->gradient_clipping >= 0) s = add_clip(a, "--megatron_lm_gradient_clipping", m->gradient_clipping);
        /* ZeRO or FSDP over the data-parallel axis, when the file gives that section too */
        if (!s && c->has_deepspeed_config && c->has_fsdp_config)
            s = ct_error_set(CT_ERR_INVALID, "config: distributed_type MEGATRON_LM with both a deepspeed_config and "
                                             "an fsdp_config: at most one shards the data-parallel axis");
        if (!s && c->has_deepspeed_config) s = deepspeed_args(c, a);
        if (!s && c->has_fsdp_config) s = fsdp_args(c, a);
        return s;
    }
    if (c->distributed_type == CT_DIST_FSDP) s = fsdp_args(c, a);
    return s;
}
