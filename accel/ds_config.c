/* ctrain — DeepSpeed's ds_config.json: parsing (cJSON) and resolving "auto"
 * (see accel/ds_config.h for the keys). */
#include "accel/ds_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"

/* DeepSpeed's defaults (deepspeed/runtime/zero/config.py, fp16 config). */
#define DS_BUCKET 500000000      /* reduce_bucket_size, allgather_bucket_size: 5e8 elements */
#define DS_PREFETCH 50000000     /* stage3_prefetch_bucket_size: 5e7 */
#define DS_PERSISTENCE 100000    /* stage3_param_persistence_threshold: 1e5 */
#define DS_MAX_INT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact */
#define DS_MAX_FILE (16 << 20)

void ct_ds_config_init(ct_ds_config *c)
{
    memset(c, 0, sizeof *c);
    c->gradient_accumulation_steps = 1;
    c->fp16.initial_scale_power = 16;
    c->fp16.loss_scale_window = 1000;
    c->fp16.hysteresis = 2;
    c->fp16.min_loss_scale = 1;
    c->zero.reduce_bucket_size = c->zero.allgather_bucket_size = DS_BUCKET;
    c->zero.stage3_prefetch_bucket_size = DS_PREFETCH;
    c->zero.stage3_param_persistence_threshold = DS_PERSISTENCE;
    c->zero.contiguous_gradients = true;
}

typedef struct parse_ctx {
    const char *name;
    ct_ds_config *c;
} parse_ctx;

static void warn(ct_ds_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(ct_ds_config *c, const char *fmt, ...)
{
    if (c->n_warnings < CT_DS_MAX_WARNINGS) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->warnings[c->n_warnings], sizeof c->warnings[0], fmt, ap);
        va_end(ap);
    }
    c->n_warnings++;
}

/* "ds_config 'NAME': PATH = VALUE: expected ALLOWED" */
static ct_status bad(const parse_ctx *p, const char *path, const cJSON *v, const char *allowed)
{
    char *text = cJSON_PrintUnformatted(v);
    ct_status st = ct_error_set(CT_ERR_INVALID, "ds_config '%s': %s = %.80s%s: expected %s", p->name, path,
                                text ? text : "?", text && strlen(text) > 80 ? "..." : "", allowed);
    cJSON_free(text);
    return st;
}

static bool is_auto(const cJSON *v) { return cJSON_IsString(v) && !strcmp(v->valuestring, "auto"); }

static void join(char *out, size_t cap, const char *prefix, const char *key)
{
    snprintf(out, cap, "%s%s%s", prefix, *prefix ? "." : "", key);
}

/* A whole number in [lo, hi] (or "auto" when from != NULL). */
static ct_status get_int(const parse_ctx *p, const char *path, const cJSON *v, int64_t lo, int64_t hi, int64_t *out,
                         ct_ds_from *from)
{
    if (from && is_auto(v)) {
        *from = CT_DS_AUTO;
        return CT_OK;
    }
    if (cJSON_IsNumber(v)) {
        const double x = v->valuedouble;
        if (x == floor(x) && x >= (double)lo && x <= (double)hi && fabs(x) <= DS_MAX_INT) {
            *out = (int64_t)x;
            if (from) *from = CT_DS_GIVEN;
            return CT_OK;
        }
    }
    char allowed[96];
    if (hi == INT64_MAX) snprintf(allowed, sizeof allowed, "a whole number >= %lld%s", (long long)lo, from ? " or \"auto\"" : "");
    else snprintf(allowed, sizeof allowed, "a whole number from %lld to %lld%s", (long long)lo, (long long)hi,
                  from ? " or \"auto\"" : "");
    return bad(p, path, v, allowed);
}

/* A finite number >= lo (> lo when strict), or "auto" when from != NULL. */
static ct_status get_real(const parse_ctx *p, const char *path, const cJSON *v, double lo, bool strict, double *out,
                          ct_ds_from *from)
{
    if (from && is_auto(v)) {
        *from = CT_DS_AUTO;
        return CT_OK;
    }
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && (strict ? v->valuedouble > lo : v->valuedouble >= lo)) {
        *out = v->valuedouble;
        if (from) *from = CT_DS_GIVEN;
        return CT_OK;
    }
    char allowed[64];
    snprintf(allowed, sizeof allowed, "a number %s %g%s", strict ? ">" : ">=", lo, from ? " or \"auto\"" : "");
    return bad(p, path, v, allowed);
}

static ct_status get_bool(const parse_ctx *p, const char *path, const cJSON *v, bool *out, ct_ds_from *from)
{
    if (from && is_auto(v)) {
        *from = CT_DS_AUTO;
        return CT_OK;
    }
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        if (from) *from = CT_DS_GIVEN;
        return CT_OK;
    }
    return bad(p, path, v, from ? "true, false or \"auto\"" : "true or false");
}

static ct_status need_object(const parse_ctx *p, const char *path, const cJSON *v)
{
    return cJSON_IsObject(v) ? CT_OK : bad(p, path, v, "an object");
}

/* Each member of obj once: a key given twice is an error (cJSON would keep both and
 * read the first; DeepSpeed's json module keeps the last). */
static ct_status check_unique(const parse_ctx *p, const char *prefix, const cJSON *obj)
{
    for (const cJSON *a = obj->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && !strcmp(a->string, b->string)) {
                char path[160];
                join(path, sizeof path, prefix, a->string);
                return ct_error_set(CT_ERR_INVALID, "ds_config '%s': %s is given twice", p->name, path);
            }
    return CT_OK;
}

static ct_status parse_offload(const parse_ctx *p, const char *path, const cJSON *obj, ct_ds_offload *out)
{
    ct_status st;
    if ((st = need_object(p, path, obj)) || (st = check_unique(p, path, obj))) return st;
    for (const cJSON *v = obj->child; v; v = v->next) {
        char key[160];
        join(key, sizeof key, path, v->string);
        if (!strcmp(v->string, "device")) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "none")) *out = CT_DS_OFFLOAD_NONE;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "cpu")) *out = CT_DS_OFFLOAD_CPU;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "nvme"))
                return bad(p, key, v, "\"none\" or \"cpu\" (ctrain does not offload to NVMe)");
            else return bad(p, key, v, "\"none\" or \"cpu\"");
        } else if (!strcmp(v->string, "pin_memory")) {
            bool pin;
            if ((st = get_bool(p, key, v, &pin, NULL))) return st; /* host memory is the compute memory on a CPU */
        } else {
            warn(p->c, "ds_config '%s': unknown key '%s' (ignored)", p->name, key);
        }
    }
    return CT_OK;
}

static ct_status parse_zero(const parse_ctx *p, const cJSON *obj)
{
    ct_ds_config *c = p->c;
    ct_status st;
    if ((st = need_object(p, "zero_optimization", obj)) || (st = check_unique(p, "zero_optimization", obj))) return st;
    for (const cJSON *v = obj->child; v; v = v->next) {
        char key[160];
        join(key, sizeof key, "zero_optimization", v->string);
        const char *k = v->string;
        int64_t x;
        st = CT_OK;
        if (!strcmp(k, "stage")) {
            if ((st = get_int(p, key, v, 0, 3, &x, NULL))) return st;
            c->zero.stage = (int)x;
        } else if (!strcmp(k, "offload_optimizer")) {
            st = parse_offload(p, key, v, &c->zero.offload_optimizer);
        } else if (!strcmp(k, "offload_param")) {
            st = parse_offload(p, key, v, &c->zero.offload_param);
        } else if (!strcmp(k, "reduce_bucket_size")) {
            st = get_int(p, key, v, 1, INT64_MAX, &c->zero.reduce_bucket_size, &c->from[CT_DS_REDUCE_BUCKET]);
        } else if (!strcmp(k, "allgather_bucket_size")) {
            st = get_int(p, key, v, 1, INT64_MAX, &c->zero.allgather_bucket_size, &c->from[CT_DS_ALLGATHER_BUCKET]);
        } else if (!strcmp(k, "stage3_prefetch_bucket_size")) {
            st = get_int(p, key, v, 0, INT64_MAX, &c->zero.stage3_prefetch_bucket_size, &c->from[CT_DS_PREFETCH_BUCKET]);
        } else if (!strcmp(k, "stage3_param_persistence_threshold")) {
            st = get_int(p, key, v, 0, INT64_MAX, &c->zero.stage3_param_persistence_threshold,
                         &c->from[CT_DS_PERSISTENCE]);
        } else if (!strcmp(k, "overlap_comm")) {
            st = get_bool(p, key, v, &c->zero.overlap_comm, NULL);
            c->zero.overlap_comm_given = !st;
        } else if (!strcmp(k, "contiguous_gradients")) {
            st = get_bool(p, key, v, &c->zero.contiguous_gradients, NULL);
        } else {
            warn(c, "ds_config '%s': unknown key '%s' (ignored)", p->name, key);
        }
        if (st) return st;
    }
    /* DeepSpeed offloads the optimizer from stage 1 and the parameters at stage 3 only */
    if (c->zero.offload_optimizer == CT_DS_OFFLOAD_CPU && c->zero.stage < 1)
        return ct_error_set(CT_ERR_INVALID,
                            "ds_config '%s': zero_optimization.offload_optimizer.device = \"cpu\" needs "
                            "zero_optimization.stage 1, 2 or 3 (it is %d)",
                            p->name, c->zero.stage);
    if (c->zero.offload_param == CT_DS_OFFLOAD_CPU && c->zero.stage != 3)
        return ct_error_set(CT_ERR_INVALID,
                            "ds_config '%s': zero_optimization.offload_param.device = \"cpu\" needs "
                            "zero_optimization.stage 3 (it is %d)",
                            p->name, c->zero.stage);
    return CT_OK;
}

static ct_status parse_fp16(const parse_ctx *p, const cJSON *obj)
{
    ct_ds_config *c = p->c;
    ct_status st;
    if ((st = need_object(p, "fp16", obj)) || (st = check_unique(p, "fp16", obj))) return st;
    for (const cJSON *v = obj->child; v; v = v->next) {
        char key[160];
        join(key, sizeof key, "fp16", v->string);
        const char *k = v->string;
        int64_t x;
        st = CT_OK;
        if (!strcmp(k, "enabled")) {
            st = get_bool(p, key, v, &c->fp16.enabled, &c->from[CT_DS_FP16]);
        } else if (!strcmp(k, "loss_scale")) {
            st = get_real(p, key, v, 0, false, &c->fp16.loss_scale, NULL);
        } else if (!strcmp(k, "initial_scale_power")) {
            if (!(st = get_int(p, key, v, 0, 63, &x, NULL))) c->fp16.initial_scale_power = (int)x;
        } else if (!strcmp(k, "loss_scale_window")) {
            st = get_int(p, key, v, 1, INT64_MAX, &c->fp16.loss_scale_window, NULL);
        } else if (!strcmp(k, "hysteresis")) {
            if (!(st = get_int(p, key, v, 1, INT32_MAX, &x, NULL))) c->fp16.hysteresis = (int)x;
        } else if (!strcmp(k, "min_loss_scale")) {
            st = get_real(p, key, v, 0, true, &c->fp16.min_loss_scale, NULL);
        } else {
            warn(c, "ds_config '%s': unknown key '%s' (ignored)", p->name, key);
        }
        if (st) return st;
    }
    return CT_OK;
}

static ct_status parse_bf16(const parse_ctx *p, const char *section, const cJSON *obj)
{
    ct_status st;
    if ((st = need_object(p, section, obj)) || (st = check_unique(p, section, obj))) return st;
    for (const cJSON *v = obj->child; v; v = v->next) {
        char key[160];
        join(key, sizeof key, section, v->string);
        if (!strcmp(v->string, "enabled")) {
            if ((st = get_bool(p, key, v, &p->c->bf16_enabled, &p->c->from[CT_DS_BF16]))) return st;
        } else {
            warn(p->c, "ds_config '%s': unknown key '%s' (ignored)", p->name, key);
        }
    }
    return CT_OK;
}

static ct_status parse_top(const parse_ctx *p, const cJSON *root)
{
    ct_ds_config *c = p->c;
    ct_status st;
    if (!cJSON_IsObject(root)) return bad(p, "the top level", root, "an object");
    if ((st = check_unique(p, "", root))) return st;
    if (cJSON_GetObjectItemCaseSensitive(root, "bf16") && cJSON_GetObjectItemCaseSensitive(root, "bfloat16"))
        return ct_error_set(CT_ERR_INVALID, "ds_config '%s': bf16 and bfloat16 are the same section: give one",
                            p->name);
    for (const cJSON *v = root->child; v; v = v->next) {
        const char *k = v->string;
        st = CT_OK;
        if (!strcmp(k, "train_batch_size")) {
            st = get_int(p, k, v, 1, INT64_MAX, &c->train_batch_size, &c->from[CT_DS_TRAIN_BATCH]);
        } else if (!strcmp(k, "train_micro_batch_size_per_gpu")) {
            st = get_int(p, k, v, 1, INT64_MAX, &c->train_micro_batch_size_per_gpu, &c->from[CT_DS_MICRO_BATCH]);
        } else if (!strcmp(k, "gradient_accumulation_steps")) {
            st = get_int(p, k, v, 1, INT64_MAX, &c->gradient_accumulation_steps, &c->from[CT_DS_GRAD_ACCUM]);
        } else if (!strcmp(k, "gradient_clipping")) {
            st = get_real(p, k, v, 0, false, &c->gradient_clipping, &c->from[CT_DS_GRAD_CLIP]);
        } else if (!strcmp(k, "fp16")) {
            st = parse_fp16(p, v);
        } else if (!strcmp(k, "bf16") || !strcmp(k, "bfloat16")) {
            st = parse_bf16(p, k, v);
        } else if (!strcmp(k, "zero_optimization")) {
            st = parse_zero(p, v);
        } else if (!strcmp(k, "communication_data_type")) {
            static const char *const types[] = {"fp32", "fp16", "bf16"};
            int i = 0;
            while (i < 3 && !(cJSON_IsString(v) && !strcmp(v->valuestring, types[i]))) i++;
            if (i == 3) st = bad(p, k, v, "\"fp32\", \"fp16\" or \"bf16\"");
            else snprintf(c->communication_data_type, sizeof c->communication_data_type, "%s", types[i]);
        } else if (!strcmp(k, "optimizer") || !strcmp(k, "scheduler")) {
            warn(c, "ds_config '%s': '%s' is not used: ctrain steps the %s given to ct_accelerator_prepare", p->name, k,
                 k);
        } else {
            warn(c, "ds_config '%s': unknown key '%s' (ignored)", p->name, k);
        }
        if (st) return st;
    }
    if (c->fp16.enabled && c->from[CT_DS_FP16] == CT_DS_GIVEN && c->bf16_enabled && c->from[CT_DS_BF16] == CT_DS_GIVEN)
        return ct_error_set(CT_ERR_INVALID, "ds_config '%s': fp16.enabled and bf16.enabled are both true: pick one",
                            p->name);
    return CT_OK;
}

/* 1-based line and column of byte offset off in text. */
static void line_col(const char *text, size_t off, int *line, int *col)
{
    *line = 1, *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

ct_status ct_ds_config_parse(const char *text, size_t len, const char *name, ct_ds_config *c)
{
    ct_ds_config_init(c);
    if (!name) name = "(text)";
    if (!text) return ct_error_set(CT_ERR_INVALID, "ds_config '%s': no text", name);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        int line, col;
        size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        line_col(text, off, &line, &col);
        return ct_error_set(CT_ERR_FORMAT, "ds_config '%s': not valid JSON (line %d, column %d)", name, line, col);
    }
    size_t rest = (size_t)(end - text);
    while (rest < len && (text[rest] == ' ' || text[rest] == '\n' || text[rest] == '\r' || text[rest] == '\t' ||
                          text[rest] == '\0'))
        rest++;
    ct_status st = CT_OK;
    if (rest < len) {
        int line, col;
        line_col(text, rest, &line, &col);
        st = ct_error_set(CT_ERR_FORMAT, "ds_config '%s': text after the JSON object (line %d, column %d)", name, line,
                          col);
    }
    ct_ds_config tmp;
    ct_ds_config_init(&tmp);
    parse_ctx p = {.name = name, .c = &tmp};
    if (!st) st = parse_top(&p, root);
    cJSON_Delete(root);
    if (!st) *c = tmp;
    return st;
}

ct_status ct_ds_config_load(const char *path, ct_ds_config *c)
{
    ct_ds_config_init(c);
    if (!path || !*path) return ct_error_set(CT_ERR_INVALID, "ds_config: no file name");
    size_t n = 0;
    char *buf = cti_file_read_text(path, DS_MAX_FILE, "ds_config", &n);
    if (!buf) return ct_last_status();
    ct_status st = ct_ds_config_parse(buf, n, path, c);
    free(buf);
    return st;
}

/* ---- resolve ------------------------------------------------------------------- */

static const char *from_text(ct_ds_from f) { return f == CT_DS_AUTO ? " (\"auto\")" : ""; }

ct_status ct_ds_config_resolve(ct_ds_config *c, const char *name, const ct_ds_defaults *d)
{
    if (!name) name = "(text)";
    const int64_t ws = d->world_size;
    if (ws < 1) return ct_error_set(CT_ERR_INVALID, "ds_config '%s': world size %lld is not >= 1", name, (long long)ws);

    /* the three batch sizes: 0 = not known */
    int64_t ga = 0, mb = 0, tb = 0;
    switch (c->from[CT_DS_GRAD_ACCUM]) {
    case CT_DS_GIVEN:
        ga = c->gradient_accumulation_steps;
        if (d->grad_accum > 0 && d->grad_accum != ga)
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': gradient_accumulation_steps = %lld, but the Accelerator was given "
                                "%lld: give one of them, or make them agree (or write \"auto\")",
                                name, (long long)ga, (long long)d->grad_accum);
        break;
    case CT_DS_AUTO: ga = d->grad_accum > 0 ? d->grad_accum : 1; break;
    default: ga = d->grad_accum > 0 ? d->grad_accum : 0; break;
    }
    switch (c->from[CT_DS_MICRO_BATCH]) {
    case CT_DS_GIVEN:
        mb = c->train_micro_batch_size_per_gpu;
        if (d->micro_batch > 0 && d->micro_batch != mb)
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': train_micro_batch_size_per_gpu = %lld, but the prepared data loader's "
                                "batch size is %lld",
                                name, (long long)mb, (long long)d->micro_batch);
        break;
    case CT_DS_AUTO:
        if (d->micro_batch <= 0)
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': train_micro_batch_size_per_gpu is \"auto\", but no data loader was "
                                "prepared to take it from: prepare one, or write the number",
                                name);
        mb = d->micro_batch;
        break;
    default: mb = d->micro_batch > 0 ? d->micro_batch : 0; break;
    }
    if (c->from[CT_DS_TRAIN_BATCH] == CT_DS_GIVEN) tb = c->train_batch_size;

    if (ga && mb) {
        if (tb && tb != mb * ga * ws)
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': train_batch_size = %lld does not multiply out: "
                                "train_micro_batch_size_per_gpu %lld%s x gradient_accumulation_steps %lld%s x world "
                                "size %lld = %lld",
                                name, (long long)tb, (long long)mb, from_text(c->from[CT_DS_MICRO_BATCH]),
                                (long long)ga, from_text(c->from[CT_DS_GRAD_ACCUM]), (long long)ws,
                                (long long)(mb * ga * ws));
        tb = mb * ga * ws;
    } else if (tb && mb) {
        if (tb % (mb * ws))
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': train_batch_size = %lld is not a multiple of "
                                "train_micro_batch_size_per_gpu %lld x world size %lld",
                                name, (long long)tb, (long long)mb, (long long)ws);
        ga = tb / (mb * ws);
    } else if (tb) {
        if (!ga) ga = 1;
        if (tb % (ga * ws))
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': train_batch_size = %lld is not a multiple of "
                                "gradient_accumulation_steps %lld x world size %lld",
                                name, (long long)tb, (long long)ga, (long long)ws);
        mb = tb / (ga * ws);
    } else if (mb) {
        if (!ga) ga = 1;
        tb = mb * ga * ws;
    } else {
        return ct_error_set(CT_ERR_INVALID,
                            "ds_config '%s': the micro batch size is not known: give train_micro_batch_size_per_gpu or "
                            "train_batch_size, or prepare a data loader first",
                            name);
    }

    double clip = c->gradient_clipping;
    if (c->from[CT_DS_GRAD_CLIP] == CT_DS_GIVEN) {
        if (d->grad_clip >= 0 && d->grad_clip != clip)
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': gradient_clipping = %g, but the Accelerator was given %g: give one "
                                "of them, or make them agree (or write \"auto\")",
                                name, clip, d->grad_clip);
    } else {
        clip = d->grad_clip >= 0 ? d->grad_clip : 0;
    }

    const char *mp = d->mixed_precision;
    bool fp16 = c->fp16.enabled, bf16 = c->bf16_enabled;
    const struct {
        ct_ds_field field;
        const char *dtype;
        bool *on;
    } prec[2] = {{CT_DS_FP16, "fp16", &fp16}, {CT_DS_BF16, "bf16", &bf16}};
    for (int i = 0; i < 2; i++) {
        const bool want = mp && !strcmp(mp, prec[i].dtype);
        if (c->from[prec[i].field] != CT_DS_GIVEN) *prec[i].on = want;
        else if (mp && *prec[i].on != want)
            return ct_error_set(CT_ERR_INVALID,
                                "ds_config '%s': %s.enabled = %s, but mixed_precision is \"%s\": make them agree (or "
                                "write \"auto\")",
                                name, prec[i].dtype, *prec[i].on ? "true" : "false", mp);
    }
    if (fp16 && bf16)
        return ct_error_set(CT_ERR_INVALID, "ds_config '%s': fp16 and bf16 would both be on: pick one", name);

    /* "auto" buckets from the model's width, as Accelerate fills them: h^2, 0.9 h^2, 10 h */
    const int64_t h = d->hidden_size;
    if (h > 0) {
        if (c->from[CT_DS_REDUCE_BUCKET] == CT_DS_AUTO) c->zero.reduce_bucket_size = h * h;
        if (c->from[CT_DS_ALLGATHER_BUCKET] == CT_DS_AUTO) c->zero.allgather_bucket_size = h * h;
        if (c->from[CT_DS_PREFETCH_BUCKET] == CT_DS_AUTO)
            c->zero.stage3_prefetch_bucket_size = (int64_t)(0.9 * (double)(h * h));
        if (c->from[CT_DS_PERSISTENCE] == CT_DS_AUTO) c->zero.stage3_param_persistence_threshold = 10 * h;
    }

    c->gradient_accumulation_steps = ga;
    c->train_micro_batch_size_per_gpu = mb;
    c->train_batch_size = tb;
    c->gradient_clipping = clip;
    c->fp16.enabled = fp16;
    c->bf16_enabled = bf16;
    return CT_OK;
}
