/* The per-weight fp8 scaling state; the rules are in precision/fp8_state.h. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "precision/autocast_internal.h"
#include "precision/fp8_state.h"

typedef struct slot {
    ct_tensor *w;         /* retained: its address is the key */
    ct_fp8_meta meta[3];  /* input, weight, gradient */
    ct_tensor *wq;        /* retained; NULL until made for wq_gen */
    unsigned long wq_gen;
    ct_tensor *g_amax;    /* f32 [1], retained */
} slot;

/* One slot's metas as ct_fp8_state_import received them (for a slot not made yet). */
typedef struct saved_meta {
    float scale, pending;
    float *history; /* len */
    int64_t pos, seen;
} saved_meta;

struct ct_fp8_state {
    ct_fp8_recipe recipe;
    pthread_mutex_t mu;
    slot *slots;
    int n, cap;
    saved_meta *saved; /* 3 per slot for slots [n, nsaved): taken by slot_add */
    int nsaved;
};

ct_fp8_state *ct_fp8_state_new(const ct_fp8_recipe *r)
{
    ct_fp8_recipe rr;
    if (ct_fp8_recipe_resolve(r, &rr)) return NULL;
    ct_fp8_state *s = calloc(1, sizeof *s);
    if (!s) {
        ct_error_set(CT_ERR_NOMEM, "fp8 state: out of memory");
        return NULL;
    }
    s->recipe = rr;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

static void slot_free(slot *sl)
{
    for (int k = 0; k < 3; k++) ct_fp8_meta_free(&sl->meta[k]);
    ct_tensor_release(sl->w);
    ct_tensor_release(sl->wq);
    ct_tensor_release(sl->g_amax);
}

void ct_fp8_state_free(ct_fp8_state *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) slot_free(&s->slots[i]);
    free(s->slots);
    for (int i = 0; s->saved && i < 3 * s->nsaved; i++) free(s->saved[i].history);
    free(s->saved);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const ct_fp8_recipe *ct_fp8_state_recipe(const ct_fp8_state *s) { return &s->recipe; }

int ct_fp8_state_weights(const ct_fp8_state *s) { return s ? s->n : 0; }

int ct_fp8_state_amax_count(const ct_fp8_state *s) { return 3 * ct_fp8_state_weights(s); }

static ct_status slot_add(ct_fp8_state *s, ct_tensor *w, int *index)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 32;
        slot *p = realloc(s->slots, (size_t)cap * sizeof *p);
        if (!p) return ct_error_set(CT_ERR_NOMEM, "fp8 state: out of memory for %d weight slots", cap);
        s->slots = p;
        s->cap = cap;
    }
    slot sl = {0};
    static const ct_fp8_role roles[3] = {CT_FP8_FORWARD, CT_FP8_FORWARD, CT_FP8_BACKWARD};
    ct_status st = CT_OK;
    int k = 0;
    for (; k < 3 && !st; k++) st = ct_fp8_meta_init(&sl.meta[k], &s->recipe, roles[k]);
    if (!st) {
        ct_tensor *cell = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1)); /* frame-owned; the slot keeps a reference */
        if (cell) sl.g_amax = ct_tensor_retain(cell);
        else st = ct_last_status();
    }
    if (st) {
        for (int j = 0; j < 3; j++) ct_fp8_meta_free(&sl.meta[j]);
        return st;
    }
    if (s->n < s->nsaved) /* a checkpoint's metas for this slot */
        for (int j = 0; j < 3; j++) {
            const saved_meta *sm = &s->saved[3 * s->n + j];
            ct_fp8_meta *m = &sl.meta[j];
            m->scale = sm->scale, m->pending = sm->pending, m->pos = (int)sm->pos, m->seen = (int)sm->seen;
            memcpy(m->history, sm->history, (size_t)m->len * sizeof *m->history);
        }
    sl.w = ct_tensor_retain(w);
    s->slots[s->n] = sl;
    *index = s->n++;
    return CT_OK;
}

ct_status ct_fp8_state_use(ct_fp8_state *s, ct_tensor *w, ct_fp8_use *u)
{
    char d[128];
    if (!s || !w || !u) return ct_error_set(CT_ERR_INVALID, "fp8 state: NULL state, weight or result");
    const bool float_ok = w->dtype == CT_DTYPE_F32 || w->dtype == CT_DTYPE_BF16 || w->dtype == CT_DTYPE_F16;
    if (w->ndim != 2 || !float_ok)
        return ct_error_set(CT_ERR_INVALID, "fp8 state: weight %s: want a 2-D f32, bf16 or f16 tensor",
                            ct_tensor_describe(w, d, sizeof d));
    pthread_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->n && s->slots[i].w != w) i++;
    ct_status st = i == s->n ? slot_add(s, w, &i) : CT_OK;
    slot *sl = st ? NULL : &s->slots[i];
    unsigned long gen = cti_autocast_generation();
    if (sl && (!sl->wq || sl->wq_gen != gen)) {
        float amax = 0.0f;
        ct_tensor *q = ct_fp8_quantize(w, sl->meta[1].dtype, sl->meta[1].scale, &amax);
        if (q) {
            ct_tensor_release(sl->wq);
            sl->wq = ct_tensor_retain(q);
            sl->wq_gen = gen;
            ct_fp8_meta_observe(&sl->meta[1], amax);
        } else {
            st = ct_error_prefix("fp8 state: weight %s: ", ct_tensor_describe(w, d, sizeof d));
        }
    }
    if (!st)
        *u = (ct_fp8_use){.slot = i, .wq = sl->wq, .x_dtype = sl->meta[0].dtype, .x_scale = sl->meta[0].scale,
                          .g_dtype = sl->meta[2].dtype, .g_scale = sl->meta[2].scale, .g_amax = sl->g_amax};
    pthread_mutex_unlock(&s->mu);
    return st;
}

void ct_fp8_state_observe_input(ct_fp8_state *s, int slot_index, float amax)
{
    pthread_mutex_lock(&s->mu);
    if (slot_index >= 0 && slot_index < s->n) ct_fp8_meta_observe(&s->slots[slot_index].meta[0], amax);
    pthread_mutex_unlock(&s->mu);
}

void ct_fp8_amax_cell_raise(ct_tensor *cell, float a)
{
    float *c = ct_tensor_data(cell);
    if (isnan(a) || isnan(*c)) *c = NAN;
    else if (a > *c) *c = a;
}

/* the gradient meta's pending raised by the backward cell */
static float grad_pending(const slot *sl)
{
    float p = sl->meta[2].pending, c = *(const float *)ct_tensor_data(sl->g_amax);
    return isnan(p) || isnan(c) ? NAN : c > p ? c : p;
}

void ct_fp8_state_amax_get(ct_fp8_state *s, float *buf)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        buf[3 * i] = s->slots[i].meta[0].pending;
        buf[3 * i + 1] = s->slots[i].meta[1].pending;
        buf[3 * i + 2] = grad_pending(&s->slots[i]);
    }
    pthread_mutex_unlock(&s->mu);
}

void ct_fp8_state_amax_set(ct_fp8_state *s, const float *buf)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        for (int k = 0; k < 3; k++) s->slots[i].meta[k].pending = buf[3 * i + k];
        *(float *)ct_tensor_data(s->slots[i].g_amax) = 0.0f;
    }
    pthread_mutex_unlock(&s->mu);
}

void ct_fp8_state_step(ct_fp8_state *s)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        slot *sl = &s->slots[i];
        sl->meta[2].pending = grad_pending(sl);
        *(float *)ct_tensor_data(sl->g_amax) = 0.0f;
        for (int k = 0; k < 3; k++) ct_fp8_meta_step(&sl->meta[k]);
        ct_tensor_release(sl->wq);
        sl->wq = NULL;
    }
    pthread_mutex_unlock(&s->mu);
}

const ct_fp8_meta *ct_fp8_state_meta(const ct_fp8_state *s, int slot_index, int which)
{
    if (!s || slot_index < 0 || slot_index >= s->n || which < 0 || which > 2) return NULL;
    return &s->slots[slot_index].meta[which];
}

/* ---- checkpoints ------------------------------------------------------------------- */

ct_status ct_fp8_state_export(ct_fp8_state *s, ct_tensor *out[4])
{
    if (!s || !out) return ct_error_set(CT_ERR_INVALID, "fp8_state_export: NULL argument");
    pthread_mutex_lock(&s->mu);
    const int64_t n = s->n, len = s->recipe.amax_history_len;
    out[0] = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(n, 3));
    out[1] = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(n, 3));
    out[2] = ct_tensor_empty(CT_DTYPE_F32, CT_SHAPE(n, 3, len));
    out[3] = ct_tensor_empty(CT_DTYPE_I64, CT_SHAPE(n, 3, 2));
    ct_status st = out[0] && out[1] && out[2] && out[3] ? CT_OK : ct_error_prefix("fp8_state_export: ");
    for (int64_t i = 0; i < n && !st; i++)
        for (int k = 0; k < 3; k++) {
            const ct_fp8_meta *m = &s->slots[i].meta[k];
            ((float *)ct_tensor_data(out[0]))[3 * i + k] = m->scale;
            ((float *)ct_tensor_data(out[1]))[3 * i + k] = k == 2 ? grad_pending(&s->slots[i]) : m->pending;
            memcpy((float *)ct_tensor_data(out[2]) + (3 * i + k) * len, m->history, (size_t)len * sizeof(float));
            ((int64_t *)ct_tensor_data(out[3]))[2 * (3 * i + k)] = m->pos;
            ((int64_t *)ct_tensor_data(out[3]))[2 * (3 * i + k) + 1] = m->seen;
        }
    pthread_mutex_unlock(&s->mu);
    return st;
}

ct_status ct_fp8_state_import(ct_fp8_state *s, ct_tensor *const in[4])
{
    if (!s || !in || !in[0] || !in[1] || !in[2] || !in[3])
        return ct_error_set(CT_ERR_INVALID, "fp8_state_import: NULL argument");
    const int64_t len = s->recipe.amax_history_len, n = in[0]->ndim == 2 ? in[0]->shape[0] : -1;
    const struct {
        ct_dtype dt;
        int nd;
        int64_t sh[3];
    } want[4] = {{CT_DTYPE_F32, 2, {n, 3}}, {CT_DTYPE_F32, 2, {n, 3}}, {CT_DTYPE_F32, 3, {n, 3, len}},
                 {CT_DTYPE_I64, 3, {n, 3, 2}}};
    static const char *const what[4] = {"scale", "pending", "history", "counters"};
    for (int t = 0; t < 4; t++) {
        const ct_tensor *x = in[t];
        char a[96], b[96];
        if (n < 0 || x->dtype != want[t].dt || x->ndim != want[t].nd ||
            memcmp(x->shape, want[t].sh, (size_t)x->ndim * sizeof *x->shape))
            return ct_error_set(CT_ERR_INVALID, "fp8_state_import: %s is %s%s, expected %s%s (amax history %" PRId64 ")",
                                what[t], ct_dtype_name(x->dtype), ct_shape_str(x->ndim, x->shape, a, sizeof a),
                                ct_dtype_name(want[t].dt), ct_shape_str(want[t].nd, want[t].sh, b, sizeof b), len);
    }
    ct_tensor *c[4];
    for (int t = 0; t < 4; t++)
        if (!(c[t] = ct_tensor_contiguous(in[t]))) return ct_error_prefix("fp8_state_import: ");
    const float *scale = ct_tensor_data(c[0]), *pend = ct_tensor_data(c[1]), *hist = ct_tensor_data(c[2]);
    const int64_t *cnt = ct_tensor_data(c[3]);
    for (int64_t i = 0; i < 3 * n; i++)
        if (cnt[2 * i] < 0 || cnt[2 * i] >= len || cnt[2 * i + 1] < 0 || cnt[2 * i + 1] > len)
            return ct_error_set(CT_ERR_INVALID, "fp8_state_import: meta %" PRId64 " has pos %" PRId64 " seen %" PRId64
                                ", outside an amax history of %" PRId64, i, cnt[2 * i], cnt[2 * i + 1], len);
    pthread_mutex_lock(&s->mu);
    ct_status st = CT_OK;
    if (n < s->n)
        st = ct_error_set(CT_ERR_INVALID, "fp8_state_import: %" PRId64 " weight slots saved, this run has %d already",
                          n, s->n);
    saved_meta *saved = NULL;
    if (!st && n > s->n && !(saved = calloc((size_t)(3 * n), sizeof *saved)))
        st = ct_error_set(CT_ERR_NOMEM, "fp8_state_import: out of memory");
    for (int64_t i = 3 * (int64_t)s->n; saved && i < 3 * n && !st; i++) {
        saved[i] = (saved_meta){scale[i], pend[i], malloc((size_t)len * sizeof(float)), cnt[2 * i], cnt[2 * i + 1]};
        if (!saved[i].history) st = ct_error_set(CT_ERR_NOMEM, "fp8_state_import: out of memory");
        else memcpy(saved[i].history, hist + i * len, (size_t)len * sizeof(float));
    }
    if (st) {
        for (int64_t i = 0; saved && i < 3 * n; i++) free(saved[i].history);
        free(saved);
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    for (int i = 0; i < s->n; i++) {
        slot *sl = &s->slots[i];
        for (int k = 0; k < 3; k++) {
            const int64_t j = 3 * (int64_t)i + k;
            ct_fp8_meta *m = &sl->meta[k];
            m->scale = scale[j], m->pending = pend[j], m->pos = (int)cnt[2 * j], m->seen = (int)cnt[2 * j + 1];
            memcpy(m->history, hist + j * len, (size_t)len * sizeof(float));
        }
        *(float *)ct_tensor_data(sl->g_amax) = 0.0f;
        ct_tensor_release(sl->wq);
        sl->wq = NULL;
    }
    for (int i = 0; s->saved && i < 3 * s->nsaved; i++) free(s->saved[i].history);
    free(s->saved);
    s->saved = saved, s->nsaved = saved ? (int)n : 0;
    pthread_mutex_unlock(&s->mu);
    return CT_OK;
}
