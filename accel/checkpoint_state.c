/* ctrain — a checkpoint's trainer_state.json (the scalars of a training run: step,
 * scheduler, accumulation, loss scaler, loader cursor, generators) and the registered
 * objects (accel/checkpoint.h). 64-bit seeds and offsets are written as decimal
 * strings, every double with 17 significant digits, so everything reads back exactly. */
#include "accel/checkpoint_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"

/* ---- writing -------------------------------------------------------------------------- */

static void add_u64(cJSON *o, const char *key, uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%" PRIu64, v);
    cJSON_AddStringToObject(o, key, b);
}

static void add_i64(cJSON *o, const char *key, int64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%" PRId64, v);
    cJSON_AddStringToObject(o, key, b);
}

static void add_f64(cJSON *o, const char *key, double v)
{
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    cJSON_AddStringToObject(o, key, b);
}

ct_status cti_ckpt_write_trainer_state(const char *dir, const cti_trainer_state *s)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return ct_error_set(CT_ERR_NOMEM, "out of memory");
    add_i64(root, "step", s->step);
    if (s->has_sched) add_i64(cJSON_AddObjectToObject(root, "scheduler"), "position", s->sched_position);
    cJSON *acc = cJSON_AddObjectToObject(root, "gradient_accumulation");
    if (acc) add_i64(acc, "steps", s->accumulation_steps), add_i64(acc, "micro", s->micro);
    if (s->has_scaler) {
        cJSON *o = cJSON_AddObjectToObject(root, "loss_scaler");
        if (o) {
            add_f64(o, "scale", s->scale);
            add_i64(o, "good_steps", s->good_steps);
            add_i64(o, "overflows", s->overflows);
            add_i64(o, "steps", s->scaler_steps);
            add_i64(o, "skipped", s->scaler_skipped);
        }
    }
    if (s->has_loader) {
        cJSON *o = cJSON_AddObjectToObject(root, "loader");
        if (o) {
            add_i64(o, "batch_size", s->batch_size);
            add_i64(o, "world_size", s->loader_world);
            add_i64(o, "num_batches", s->num_batches);
            cJSON_AddBoolToObject(o, "shuffle", s->shuffle);
            add_u64(o, "seed", s->loader_seed);
        }
    }
    cJSON *rng = cJSON_AddObjectToObject(root, "rng");
    cJSON *ranks = cJSON_CreateArray();
    if (rng && ranks) {
        cJSON_AddBoolToObject(rng, "lockstep", s->lockstep);
        if (s->seeded) {
            cJSON *rule = cJSON_AddObjectToObject(rng, "set_seed");
            if (rule) add_u64(rule, "seed", s->seed_base), cJSON_AddBoolToObject(rule, "device_specific", s->seed_per_rank);
        }
        for (int r = 0; r < s->nranks; r++) {
            cJSON *o = cJSON_CreateObject();
            if (!o) break;
            add_u64(o, "seed", s->ranks[r].rng_seed);
            add_u64(o, "offset", s->ranks[r].rng_offset);
            add_i64(o, "epoch", s->ranks[r].epoch);
            add_i64(o, "position", s->ranks[r].position);
            cJSON_AddItemToArray(ranks, o);
        }
        cJSON_AddItemToObject(rng, "ranks", ranks);
        ranks = NULL;
    }
    cJSON_Delete(ranks);
    if (s->has_fp8) {
        cJSON *o = cJSON_AddObjectToObject(root, "fp8");
        if (o) add_i64(o, "amax_history_len", s->fp8_history), add_i64(o, "slots", s->fp8_slots);
    }
    cJSON *custom = cJSON_AddArrayToObject(root, "custom");
    for (int i = 0; custom && i < s->ncustom; i++) cJSON_AddItemToArray(custom, cJSON_CreateString(s->custom[i]));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return ct_error_set(CT_ERR_NOMEM, "out of memory writing %s", CT_CKPT_STATE);
    ct_status st = cti_ckpt_write_text(dir, CT_CKPT_STATE, text);
    free(text);
    return st;
}

/* ---- reading -------------------------------------------------------------------------- */

typedef struct reader {
    const char *path;
    ct_status st;
} reader;

static const cJSON *need(reader *r, const cJSON *o, const char *key, const char *what)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && !r->st) r->st = ct_error_set(CT_ERR_FORMAT, "%s: no \"%s\" (%s)", r->path, key, what);
    return v;
}

static const char *str_of(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = need(r, o, key, "a string");
    if (v && !cJSON_IsString(v) && !r->st) r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" is not a string", r->path, key);
    return v && cJSON_IsString(v) ? v->valuestring : NULL;
}

static int64_t get_i64(reader *r, const cJSON *o, const char *key, int64_t lo)
{
    const char *s = str_of(r, o, key);
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (s && (end == s || *end || errno || v < lo) && !r->st)
        r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" is \"%s\", expected an integer >= %" PRId64, r->path, key, s, lo);
    return r->st ? 0 : v;
}

static uint64_t get_u64(reader *r, const cJSON *o, const char *key)
{
    const char *s = str_of(r, o, key);
    char *end = NULL;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (s && (end == s || *end || errno || *s == '-') && !r->st)
        r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" is \"%s\", expected an unsigned integer", r->path, key, s);
    return r->st ? 0 : v;
}

static double get_f64(reader *r, const cJSON *o, const char *key)
{
    const char *s = str_of(r, o, key);
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    if (s && (end == s || *end) && !r->st)
        r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" is \"%s\", expected a number", r->path, key, s);
    return v;
}

static bool get_bool(reader *r, const cJSON *o, const char *key)
{
    const cJSON *v = need(r, o, key, "true or false");
    if (v && !cJSON_IsBool(v) && !r->st) r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"%s\" is not true or false", r->path, key);
    return v && cJSON_IsTrue(v);
}

static void parse(reader *r, const cJSON *root, cti_trainer_state *s)
{
    s->step = get_i64(r, root, "step", 0);
    const cJSON *o;
    if ((o = cJSON_GetObjectItemCaseSensitive(root, "scheduler")))
        s->has_sched = true, s->sched_position = get_i64(r, o, "position", 0);
    if ((o = need(r, root, "gradient_accumulation", "an object"))) {
        const int64_t k = get_i64(r, o, "steps", 1);
        s->accumulation_steps = k > 1 << 30 ? 1 << 30 : (int)k;
        s->micro = get_i64(r, o, "micro", 0);
    }
    if ((o = cJSON_GetObjectItemCaseSensitive(root, "loss_scaler"))) {
        s->has_scaler = true;
        s->scale = get_f64(r, o, "scale");
        s->good_steps = get_i64(r, o, "good_steps", 0);
        s->overflows = get_i64(r, o, "overflows", 0);
        s->scaler_steps = get_i64(r, o, "steps", 0);
        s->scaler_skipped = get_i64(r, o, "skipped", 0);
    }
    if ((o = cJSON_GetObjectItemCaseSensitive(root, "loader"))) {
        s->has_loader = true;
        s->batch_size = get_i64(r, o, "batch_size", 1);
        s->loader_world = get_i64(r, o, "world_size", 1);
        s->num_batches = get_i64(r, o, "num_batches", 0);
        s->shuffle = get_bool(r, o, "shuffle");
        s->loader_seed = get_u64(r, o, "seed");
    }
    const cJSON *rng = need(r, root, "rng", "the generators");
    if (rng) {
        s->lockstep = get_bool(r, rng, "lockstep");
        if ((o = cJSON_GetObjectItemCaseSensitive(rng, "set_seed")))
            s->seeded = true, s->seed_base = get_u64(r, o, "seed"), s->seed_per_rank = get_bool(r, o, "device_specific");
        const cJSON *ranks = need(r, rng, "ranks", "one entry per rank");
        const int n = cJSON_GetArraySize(ranks);
        if (!r->st && (!cJSON_IsArray(ranks) || n < 1))
            r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"rng.ranks\" is not a list with an entry per rank", r->path);
        if (!r->st && !(s->ranks = calloc((size_t)n, sizeof *s->ranks)))
            r->st = ct_error_set(CT_ERR_NOMEM, "out of memory");
        int i = 0;
        for (const cJSON *e = r->st ? NULL : ranks->child; e; e = e->next, i++)
            s->ranks[i] = (cti_rank_state){get_u64(r, e, "seed"), get_u64(r, e, "offset"), get_i64(r, e, "epoch", 0),
                                           get_i64(r, e, "position", 0)};
        s->nranks = r->st ? 0 : n;
    }
    if ((o = cJSON_GetObjectItemCaseSensitive(root, "fp8")))
        s->has_fp8 = true, s->fp8_history = get_i64(r, o, "amax_history_len", 1), s->fp8_slots = get_i64(r, o, "slots", 0);
    const cJSON *custom = need(r, root, "custom", "the registered objects' names");
    const int nc = cJSON_GetArraySize(custom);
    if (!r->st && nc > 0 && !(s->custom = calloc((size_t)nc, sizeof *s->custom)))
        r->st = ct_error_set(CT_ERR_NOMEM, "out of memory");
    int i = 0;
    for (const cJSON *e = r->st ? NULL : custom->child; e && !r->st; e = e->next, i++) {
        if (!cJSON_IsString(e) || strlen(e->valuestring) >= sizeof s->custom[0])
            r->st = ct_error_set(CT_ERR_FORMAT, "%s: \"custom\" entry %d is not an object name", r->path, i);
        else snprintf(s->custom[i], sizeof s->custom[i], "%s", e->valuestring);
    }
    s->ncustom = r->st ? 0 : nc;
}

ct_status cti_ckpt_read_trainer_state(const char *dir, cti_trainer_state *s)
{
    *s = (cti_trainer_state){0};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, CT_CKPT_STATE);
    char *text = NULL;
    size_t len = 0;
    const int e = cti_ckpt_read_text(path, 16u << 20, &text, &len);
    if (e > 0) return ct_error_set(CT_ERR_FORMAT, "checkpoint '%s': cannot open %s: %s", dir, CT_CKPT_STATE, strerror(e));
    ct_status st = e ? ct_error_set(CT_ERR_IO, "cannot read '%s'", path) : CT_OK;
    cJSON *root = st ? NULL : cJSON_ParseWithLength(text, len);
    if (!st && !cJSON_IsObject(root)) st = ct_error_set(CT_ERR_FORMAT, "%s: not a JSON object", path);
    reader r = {path, st};
    if (!st) parse(&r, root, s);
    cJSON_Delete(root);
    free(text);
    if (r.st) cti_trainer_state_free(s);
    return r.st;
}

void cti_trainer_state_free(cti_trainer_state *s)
{
    free(s->ranks);
    free(s->custom);
    *s = (cti_trainer_state){0};
}

/* ---- registered objects ------------------------------------------------------------------ */

static bool good_name(const char *n)
{
    size_t len = n ? strlen(n) : 0;
    if (len < 1 || len > 64) return false;
    for (; *n; n++)
        if (!((*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') || (*n >= '0' && *n <= '9') || *n == '_' ||
              *n == '.' || *n == '-'))
            return false;
    return true;
}

ct_status ct_accelerator_register_for_checkpointing(ct_accelerator *acc, const ct_checkpointable *obj)
{
    const char *op = "accelerator_register_for_checkpointing";
    if (!acc || !obj) return ct_error_set(CT_ERR_INVALID, "%s: %s is NULL", op, acc ? "obj" : "accelerator");
    if (!good_name(obj->name))
        return ct_error_set(CT_ERR_INVALID, "%s: name '%s' must be 1 to 64 of [A-Za-z0-9_.-]", op,
                            obj->name ? obj->name : "(null)");
    if (!obj->state_dict || !obj->load_state_dict)
        return ct_error_set(CT_ERR_INVALID, "%s: '%s' needs both state_dict and load_state_dict", op, obj->name);
    for (int i = 0; i < acc->nobjects; i++)
        if (!strcmp(acc->objects[i].name, obj->name))
            return ct_error_set(CT_ERR_INVALID, "%s: an object named '%s' is registered already", op, obj->name);
    ct_checkpointable *p = realloc(acc->objects, (size_t)(acc->nobjects + 1) * sizeof *p);
    char *name = strdup(obj->name);
    if (!p || !name) {
        free(name);
        if (p) acc->objects = p;
        return ct_error_set(CT_ERR_NOMEM, "%s: out of memory", op);
    }
    acc->objects = p;
    p[acc->nobjects] = *obj;
    p[acc->nobjects++].name = name;
    return CT_OK;
}

/* ---- a generator as a registered object -------------------------------------------------- */

static ct_status rng_state_dict(void *obj, ct_state_dict *out)
{
    const ct_rng *r = obj;
    *out = (ct_state_dict){0};
    out->names = calloc(2, sizeof *out->names);
    out->tensors = calloc(2, sizeof *out->tensors);
    if (!out->names || !out->tensors) {
        ct_state_dict_free(out);
        return ct_error_set(CT_ERR_NOMEM, "rng state_dict: out of memory");
    }
    const uint64_t v[2] = {r->seed, r->offset};
    static const char *const keys[2] = {"seed", "offset"};
    ct_status st = CT_OK;
    CT_FRAME {
        for (int i = 0; i < 2 && !st; i++) {
            int64_t bits;
            memcpy(&bits, &v[i], sizeof bits); /* the u64 as stored: i64 of the same bits */
            ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(1), &bits);
            if (!t || !(out->names[i] = strdup(keys[i]))) st = ct_error_set(CT_ERR_NOMEM, "rng state_dict: out of memory");
            else out->tensors[i] = ct_tensor_retain(t), out->n = i + 1;
        }
    }
    if (st) ct_state_dict_free(out);
    return st;
}

static ct_status rng_load_state_dict(void *obj, const ct_state_dict *sd)
{
    uint64_t v[2];
    static const char *const keys[2] = {"seed", "offset"};
    for (int k = 0; k < 2; k++) {
        const ct_tensor *t = NULL;
        for (int i = 0; i < sd->n && !t; i++)
            if (!strcmp(sd->names[i], keys[k])) t = sd->tensors[i];
        if (!t || t->dtype != CT_DTYPE_I64 || ct_tensor_numel(t) != 1)
            return ct_error_set(CT_ERR_FORMAT, "rng load_state_dict: '%s' is %s, expected one i64", keys[k],
                                t ? "another shape or dtype" : "missing");
        const int64_t bits = *(const int64_t *)ct_tensor_data((ct_tensor *)t);
        memcpy(&v[k], &bits, sizeof bits);
    }
    ct_rng *r = obj;
    r->seed = v[0], r->offset = v[1];
    return CT_OK;
}

ct_checkpointable ct_rng_checkpointable(const char *name, ct_rng *rng)
{
    return (ct_checkpointable){.name = name, .state_dict = rng_state_dict, .load_state_dict = rng_load_state_dict, .obj = rng};
}

const char *ct_accelerator_last_checkpoint(const ct_accelerator *acc)
{
    return acc && acc->last_checkpoint ? acc->last_checkpoint : "";
}
