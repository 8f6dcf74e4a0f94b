/* Writes a launch configuration in Accelerate's layout with libyaml's emitter
 * (tools/config_file.h).
 *
 * Accelerate writes ClusterConfig.to_dict() with yaml.safe_dump: the keys sorted,
 * None values and empty sections left out, block style, two-space indents, strings
 * that YAML would read as something else ('no', '0') single-quoted. The same here,
 * with only the section of the chosen distributed_type. A path ending in .json gets
 * the same keys in JSON (flow style, double-quoted strings), which both YAML and
 * Accelerate's JSON reader load.
 */
#include "tools/config_file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

typedef enum { E_STR, E_PLAIN, E_MAP } entry_kind;

typedef struct entry {
    const char *key;
    entry_kind kind;
    char v[1100];
    const struct entry *sub; /* E_MAP */
    int nsub;
} entry;

typedef struct {
    entry e[32];
    int n;
} entries;

static void put(entries *l, const char *key, entry_kind kind, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(entries *l, const char *key, entry_kind kind, const char *fmt, ...)
{
    CT_ASSERT(l->n < 32);
    entry *e = &l->e[l->n++];
    *e = (entry){.key = key, .kind = kind};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->v, sizeof e->v, fmt, ap);
    va_end(ap);
}

static void put_bool(entries *l, const char *key, bool b)
{
    put(l, key, E_PLAIN, "%s", b ? "true" : "false");
}

/* A float as Python's repr and PyYAML write it: the shortest digits that read back
 * the same, with ".0" when they look like an integer (1.0, 1.0e-05). */
static void put_float(entries *l, const char *key, double x)
{
    char b[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(b, sizeof b, "%.*g", p, x);
        if (strtod(b, NULL) == x) break;
    }
    char *e = strchr(b, 'e');
    if (!strchr(b, '.')) {
        char tail[40] = "";
        if (e) {
            snprintf(tail, sizeof tail, "%s", e);
            *e = 0;
        }
        put(l, key, E_PLAIN, "%s.0%s", b, tail);
    } else {
        put(l, key, E_PLAIN, "%s", b);
    }
}

static void put_map(entries *l, const char *key, const entries *sub)
{
    CT_ASSERT(l->n < 32);
    l->e[l->n++] = (entry){.key = key, .kind = E_MAP, .sub = sub->e, .nsub = sub->n};
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->key, ((const entry *)b)->key);
}

/* The entries of *c, as Accelerate's to_dict would have them. */
static void collect(const ct_cluster_config *c, entries *top, entries *sec, entries *fp8)
{
    put(top, "compute_environment", E_STR, "%s", c->compute_environment);
    put_bool(top, "debug", c->debug);
    put(top, "distributed_type", E_STR, "%s", ct_dist_type_name(c->distributed_type));
    put_bool(top, "downcast_bf16", c->downcast_bf16);
    put_bool(top, "enable_cpu_affinity", c->enable_cpu_affinity);
    if (c->gpu_ids[0]) put(top, "gpu_ids", E_STR, "%s", c->gpu_ids);
    put(top, "machine_rank", E_PLAIN, "%d", c->machine_rank);
    if (c->main_process_ip[0]) put(top, "main_process_ip", E_STR, "%s", c->main_process_ip);
    if (c->main_process_port >= 0) put(top, "main_process_port", E_PLAIN, "%d", c->main_process_port);
    put(top, "main_training_function", E_STR, "%s", c->main_training_function[0] ? c->main_training_function : "main");
    if (c->mixed_precision[0]) put(top, "mixed_precision", E_STR, "%s", c->mixed_precision);
    put(top, "num_machines", E_PLAIN, "%d", c->num_machines);
    put(top, "num_processes", E_PLAIN, "%d", c->num_processes);
    if (c->num_cpu_threads_per_process > 0)
        put(top, "num_cpu_threads_per_process", E_PLAIN, "%d", c->num_cpu_threads_per_process);
    if (c->gradient_accumulation_steps > 0)
        put(top, "gradient_accumulation_steps", E_PLAIN, "%d", c->gradient_accumulation_steps);
    put(top, "rdzv_backend", E_STR, "%s", c->rdzv_backend[0] ? c->rdzv_backend : "static");
    put_bool(top, "same_network", c->same_network);
    put_bool(top, "tpu_use_cluster", false);
    put_bool(top, "tpu_use_sudo", false);
    put_bool(top, "use_cpu", c->use_cpu);

    if (!strcmp(c->mixed_precision, "fp8")) {
        if (c->fp8.fp8_format[0]) put(fp8, "fp8_format", E_STR, "%s", c->fp8.fp8_format);
        if (c->fp8.amax_history_len > 0) put(fp8, "amax_history_len", E_PLAIN, "%d", c->fp8.amax_history_len);
        if (c->fp8.amax_compute_algo[0]) put(fp8, "amax_compute_algo", E_STR, "%s", c->fp8.amax_compute_algo);
        if (c->fp8.margin >= 0) put(fp8, "margin", E_PLAIN, "%d", c->fp8.margin);
        if (fp8->n) put_map(top, "fp8_config", fp8);
    }

    switch (c->distributed_type) {
    case CT_DIST_DEEPSPEED: {
        const __typeof__(c->deepspeed) *d = &c->deepspeed;
        if (d->deepspeed_config_file[0]) {
            put(sec, "deepspeed_config_file", E_STR, "%s", d->deepspeed_config_file);
        } else {
            put(sec, "gradient_accumulation_steps", E_PLAIN, "%d", d->gradient_accumulation_steps);
            if (d->gradient_clipping >= 0) put_float(sec, "gradient_clipping", d->gradient_clipping);
            put(sec, "offload_optimizer_device", E_STR, "%s", d->offload_optimizer_device[0] ? d->offload_optimizer_device : "none");
            put(sec, "offload_param_device", E_STR, "%s", d->offload_param_device[0] ? d->offload_param_device : "none");
            if (d->zero3_save_16bit_model[0])
                put(sec, "zero3_save_16bit_model", E_PLAIN, "%s", d->zero3_save_16bit_model);
            put(sec, "zero_stage", E_PLAIN, "%d", d->zero_stage);
        }
        put_bool(sec, "zero3_init_flag", d->zero3_init_flag);
        put_map(top, "deepspeed_config", sec);
        break;
    }
    case CT_DIST_FSDP: {
        const __typeof__(c->fsdp) *f = &c->fsdp;
        put_bool(sec, "fsdp_activation_checkpointing", f->activation_checkpointing);
        if (f->auto_wrap_policy[0]) put(sec, "fsdp_auto_wrap_policy", E_STR, "%s", f->auto_wrap_policy);
        put(sec, "fsdp_backward_prefetch", E_STR, "%s", f->backward_prefetch);
        put_bool(sec, "fsdp_cpu_ram_efficient_loading", f->cpu_ram_efficient_loading);
        put_bool(sec, "fsdp_forward_prefetch", f->forward_prefetch);
        if (f->min_num_params > 0) put(sec, "fsdp_min_num_params", E_PLAIN, "%ld", f->min_num_params);
        put_bool(sec, "fsdp_offload_params", f->offload_params);
        /* written only when off: it is what the strategy implies otherwise */
        if (!f->reshard_after_forward) put_bool(sec, "fsdp_reshard_after_forward", false);
        put(sec, "fsdp_sharding_strategy", E_STR, "%s", f->sharding_strategy);
        put(sec, "fsdp_state_dict_type", E_STR, "%s", f->state_dict_type);
        put_bool(sec, "fsdp_sync_module_states", f->sync_module_states);
        if (f->transformer_layer_cls_to_wrap[0])
            put(sec, "fsdp_transformer_layer_cls_to_wrap", E_STR, "%s", f->transformer_layer_cls_to_wrap);
        put_bool(sec, "fsdp_use_orig_params", f->use_orig_params);
        if (f->version) put(sec, "fsdp_version", E_PLAIN, "%d", f->version);
        put_map(top, "fsdp_config", sec);
        break;
    }
    case CT_DIST_MEGATRON_LM: {
        const __typeof__(c->megatron) *m = &c->megatron;
        if (m->gradient_clipping >= 0) put_float(sec, "megatron_lm_gradient_clipping", m->gradient_clipping);
        put(sec, "megatron_lm_num_micro_batches", E_PLAIN, "%d", m->num_micro_batches);
        put(sec, "megatron_lm_pp_degree", E_PLAIN, "%d", m->pp_degree);
        put_bool(sec, "megatron_lm_recompute_activations", m->recompute_activations);
        put_bool(sec, "megatron_lm_sequence_parallelism", m->sequence_parallelism);
        put(sec, "megatron_lm_tp_degree", E_PLAIN, "%d", m->tp_degree);
        put_bool(sec, "megatron_lm_use_distributed_optimizer", m->use_distributed_optimizer);
        put_map(top, "megatron_lm_config", sec);
        break;
    }
    default: break;
    }
    qsort(top->e, (size_t)top->n, sizeof *top->e, by_key);
    qsort(sec->e, (size_t)sec->n, sizeof *sec->e, by_key);
    qsort(fp8->e, (size_t)fp8->n, sizeof *fp8->e, by_key);
}

/* ---- emitting ------------------------------------------------------------------------ */

typedef struct {
    yaml_emitter_t em;
    bool json;
} out;

static ct_status emit(out *o, yaml_event_t *ev)
{
    if (!yaml_emitter_emit(&o->em, ev))
        return ct_error_set(CT_ERR_IO, "config: writing YAML: %s", o->em.problem ? o->em.problem : "libyaml failed");
    return CT_OK;
}

/* A string PyYAML would read back as something else (a bool, null or number): quoted.
 * Numbers: what strtod reads whole (0, 1.5, 1e3, 0x1f), with YAML 1.1's digit
 * separators and base-60 colons, and .inf/.nan. */
static bool ambiguous(const char *v)
{
    static const char *const words[] = {"yes", "no", "true", "false", "on", "off", "null", "~",
                                        ".inf", "-.inf", "+.inf", ".nan", NULL};
    if (!*v) return true;
    for (int i = 0; words[i]; i++)
        if (!strcasecmp(v, words[i])) return true;
    char digits[64];
    size_t n = 0;
    for (const char *p = v; *p && n + 1 < sizeof digits; p++)
        if (*p != '_' && *p != ':') digits[n++] = *p;
    digits[n] = 0;
    char *end;
    strtod(digits, &end);
    return end != digits && !*end;
}

static ct_status scalar(out *o, const char *v, bool plain)
{
    yaml_scalar_style_t style = o->json ? (plain ? YAML_PLAIN_SCALAR_STYLE : YAML_DOUBLE_QUOTED_SCALAR_STYLE)
                                : plain || !ambiguous(v) ? YAML_ANY_SCALAR_STYLE
                                                         : YAML_SINGLE_QUOTED_SCALAR_STYLE;
    yaml_event_t ev;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)v, (int)strlen(v), 1, 1, style))
        return ct_error_set(CT_ERR_NOMEM, "config: writing YAML: out of memory");
    return emit(o, &ev);
}

static ct_status mapping(out *o, const entry *e, int n)
{
    yaml_event_t ev;
    yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, o->json ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE);
    if (emit(o, &ev)) return ct_last_status();
    for (int i = 0; i < n; i++) {
        if (scalar(o, e[i].key, false)) return ct_last_status();
        ct_status s = e[i].kind == E_MAP ? mapping(o, e[i].sub, e[i].nsub) : scalar(o, e[i].v, e[i].kind == E_PLAIN);
        if (s) return s;
    }
    yaml_mapping_end_event_initialize(&ev);
    return emit(o, &ev);
}

static ct_status write_stream(const ct_cluster_config *c, FILE *f, bool json)
{
    entries top = {0}, sec = {0}, fp8 = {0};
    collect(c, &top, &sec, &fp8);
    out o = {.json = json};
    if (!yaml_emitter_initialize(&o.em)) return ct_error_set(CT_ERR_NOMEM, "config: libyaml could not start an emitter");
    yaml_emitter_set_output_file(&o.em, f);
    yaml_emitter_set_unicode(&o.em, 1);
    yaml_emitter_set_indent(&o.em, 2);
    yaml_emitter_set_width(&o.em, -1); /* never fold a long value */
    yaml_event_t ev;
    ct_status s;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    if (!(s = emit(&o, &ev))) {
        yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
        s = emit(&o, &ev);
    }
    if (!s) s = mapping(&o, top.e, top.n);
    if (!s) {
        yaml_document_end_event_initialize(&ev, 1);
        s = emit(&o, &ev);
    }
    if (!s) {
        yaml_stream_end_event_initialize(&ev);
        s = emit(&o, &ev);
    }
    if (!s && !yaml_emitter_flush(&o.em)) s = ct_error_set(CT_ERR_IO, "config: writing YAML: %s", strerror(errno));
    yaml_emitter_delete(&o.em);
    return s;
}

ct_status ct_cluster_config_print(const ct_cluster_config *c, FILE *f)
{
    return write_stream(c, f, false);
}

/* mkdir -p of path's folder */
static ct_status make_parents(const char *path)
{
    char dir[1100];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return ct_error_set(CT_ERR_INVALID, "config: the path '%s' is too long", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return CT_OK;
    *slash = 0;
    for (char *p = dir + 1;; p++) {
        if (*p && *p != '/') continue;
        char keep = *p;
        *p = 0;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return ct_error_set(CT_ERR_IO, "config: cannot create the folder '%s': %s", dir, strerror(errno));
        *p = keep;
        if (!keep) break;
    }
    return CT_OK;
}

ct_status ct_cluster_config_write(const ct_cluster_config *c, const char *path)
{
    if (!path || !*path) return ct_error_set(CT_ERR_INVALID, "config: no path to write the configuration to");
    size_t n = strlen(path);
    bool json = n >= 5 && !strcasecmp(path + n - 5, ".json");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return ct_error_set(CT_ERR_INVALID, "config: '%s' is a directory: expected a file name", path);
    if (make_parents(path)) return ct_last_status();
    char tmp[1200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return ct_error_set(CT_ERR_INVALID, "config: the path '%s' is too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0) return ct_error_set(CT_ERR_IO, "config: cannot create '%s': %s", tmp, strerror(errno));
    FILE *f = fchmod(fd, 0644) == 0 ? fdopen(fd, "w") : NULL; /* mkstemp's 0600 is not a config file's */
    if (!f) {
        close(fd);
        unlink(tmp);
        return ct_error_set(CT_ERR_IO, "config: cannot write '%s': %s", tmp, strerror(errno));
    }
    ct_status s = write_stream(c, f, json);
    if (!s && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        s = ct_error_set(CT_ERR_IO, "config: cannot write '%s': %s", tmp, strerror(errno));
    if (fclose(f) != 0 && !s) s = ct_error_set(CT_ERR_IO, "config: cannot write '%s': %s", tmp, strerror(errno));
    if (!s && rename(tmp, path) != 0)
        s = ct_error_set(CT_ERR_IO, "config: cannot replace '%s': %s", path, strerror(errno));
    if (s) unlink(tmp);
    return s;
}
