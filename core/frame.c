#include "core/frame.h"

#include <stdlib.h>

/* One growable array of references per thread; a frame is the range from its
 * mark to the end. Kept references wait in `kept` (tagged with the depth that
 * kept them) and move into the parent's range when that depth pops. */
typedef struct {
    ct_tensor **v;
    int64_t n, cap;
} ref_vec;

typedef struct {
    ct_tensor *t;
    int depth;
} kept_ref;

static _Thread_local ref_vec refs;
static _Thread_local int64_t *marks;
static _Thread_local int depth;
static _Thread_local kept_ref *kept;
static _Thread_local int64_t nkept, kept_cap, marks_cap;

/* p (an array of *cap elements of esz bytes) reallocated to twice the size, or to
 * `first` elements when empty. A frame that cannot grow cannot own: fatal OOM. */
static void *grow(void *p, int64_t *cap, size_t esz, int64_t first)
{
    int64_t n = *cap ? *cap * 2 : first;
    void *q = realloc(p, (size_t)n * esz);
    CT_ASSERT(q != NULL);
    *cap = n;
    return q;
}

/* Frees the per-thread arrays (nothing is left in them). */
static void free_all(void)
{
    free(refs.v);
    refs = (ref_vec){0};
    free(marks);
    marks = NULL;
    marks_cap = 0;
    free(kept);
    kept = NULL;
    nkept = kept_cap = 0;
}

static void refs_push(ct_tensor *t)
{
    if (refs.n == refs.cap) refs.v = grow(refs.v, &refs.cap, sizeof *refs.v, 256);
    refs.v[refs.n++] = t;
}

int ct_frame_push(void)
{
    if (depth == marks_cap) marks = grow(marks, &marks_cap, sizeof *marks, 16);
    marks[depth++] = refs.n;
    return depth;
}

void ct_frame_pop(void)
{
    if (depth == 0) return;
    int64_t mark = marks[--depth];
    /* release newest first, so views go before the tensors they were made from */
    for (int64_t i = refs.n - 1; i >= mark; i--) ct_tensor_release(refs.v[i]);
    refs.n = mark;
    while (nkept > 0 && kept[nkept - 1].depth == depth + 1) refs_push(kept[--nkept].t);
    if (depth == 0 && refs.n == 0) free_all();
}

int ct_frame_depth(void) { return depth; }

int64_t ct_frame_size(void) { return refs.n - (depth ? marks[depth - 1] : 0); }

ct_tensor *ct_frame_adopt(ct_tensor *t)
{
    if (t) refs_push(t);
    return t;
}

ct_tensor *ct_keep(ct_tensor *t)
{
    if (!t || depth == 0) return t;
    if (nkept == kept_cap) kept = grow(kept, &kept_cap, sizeof *kept, 64);
    ct_tensor_retain(t);
    kept[nkept++] = (kept_ref){t, depth};
    return t;
}

void ct_frame_reset_root(void)
{
    while (depth > 0) ct_frame_pop();
    for (int64_t i = refs.n - 1; i >= 0; i--) ct_tensor_release(refs.v[i]);
    free_all();
}
