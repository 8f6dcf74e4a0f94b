/* The per-weight fp8 scaling state; the rules are in precision/fp8_state.h. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "precision/autocast_internal.h"
#include "precision/fp8_state.h"

typedef struct slot {
    ct_tensor *w;         /* retained: its address is the key */
    ct_fp8_meta meta[3];  /* input, weight, gradient */
    ct_tensor *wq;        /* retained; NULL until made for wq_gen */
    unsigned long wq_gen;
    ct_tensor *g_amax;    /* f32 [1], retained */
} slot;

struct ct_fp8_state {
    ct_fp8_recipe recipe;
    pthread_mutex_t mu;
    slot *slots;
    int n, cap;
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
    if (w->ndim != 2 || !float_ok || w->device.type != CT_DEVICE_CPU)
        return ct_error_set(CT_ERR_INVALID, "fp8 state: weight %s: want a 2-D f32, bf16 or f16 CPU tensor",
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
