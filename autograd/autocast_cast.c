/* The autograd side of autocast (precision/autocast.h): casting an op's arguments to
 * the dtype its rule names, and the weight cache.
 *
 * Weight cache. A parameter (a leaf that requires grad) used by a "low" op is cast
 * once per weight generation (ct_autocast_weights_changed: every optimizer step) and
 * dtype; each use then gets a fresh tensor over the cached copy's storage with its
 * own node, whose backward casts the gradient to the parameter's dtype. The data is
 * shared, the graph is not: a second backward (gradient accumulation) goes through
 * its own node. Entries retain the parameter too, so its address cannot be reused by
 * another tensor while the entry lives; a new generation drops every entry at the
 * next lookup.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "autograd/autocast_cast_internal.h"
#include "autograd/node.h"
#include "precision/autocast_internal.h"

typedef struct entry {
    ct_tensor *src, *low; /* retained */
} entry;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry *entries;
static int n_entries, cap_entries;
static unsigned long entries_gen;
static atomic_long casts_made; /* for tests: how many copies the cache has made */

static void drop_all_locked(void)
{
    for (int i = 0; i < n_entries; i++) {
        ct_tensor_release(entries[i].src);
        ct_tensor_release(entries[i].low);
    }
    n_entries = 0;
}

void ct_autocast_clear_cache(void)
{
    pthread_mutex_lock(&mu);
    drop_all_locked();
    free(entries);
    entries = NULL;
    cap_entries = 0;
    pthread_mutex_unlock(&mu);
}

long ct_autocast_cache_casts(void) { return atomic_load(&casts_made); }

/* The cached copy of w in dt (retained by the cache; borrowed here), made if needed. */
static ct_tensor *cached(ct_tensor *w, ct_dtype dt)
{
    ct_tensor *low = NULL;
    pthread_mutex_lock(&mu);
    unsigned long gen = cti_autocast_generation();
    if (gen != entries_gen) {
        drop_all_locked();
        entries_gen = gen;
    }
    for (int i = 0; i < n_entries && !low; i++)
        if (entries[i].src == w && entries[i].low->dtype == dt) low = entries[i].low;
    if (!low) {
        if (n_entries == cap_entries) {
            int cap = cap_entries ? 2 * cap_entries : 64;
            entry *e = realloc(entries, (size_t)cap * sizeof *e);
            if (!e) {
                pthread_mutex_unlock(&mu);
                ct_error_set(CT_ERR_NOMEM, "autocast: out of memory for the weight cache");
                return NULL;
            }
            entries = e;
            cap_entries = cap;
        }
        ct_tensor *c = ct_tensor_cast(w, dt); /* frame-owned; the cache keeps its own reference */
        if (c) {
            entries[n_entries++] = (entry){ct_tensor_retain(w), ct_tensor_retain(c)};
            atomic_fetch_add(&casts_made, 1);
            low = c;
        }
    }
    pthread_mutex_unlock(&mu);
    return low;
}

static ct_status weight_backward(ct_node *n, ct_tensor *gy, ct_tensor **gx)
{
    gx[0] = ct_tensor_cast(gy, ct_node_input_meta(n, 0)->dtype);
    return gx[0] ? CT_OK : ct_last_status();
}

/* w (a parameter) in dt through the cache, with a node of its own when grads flow. */
static ct_tensor *weight_arg(ct_tensor *w, ct_dtype dt)
{
    ct_tensor *low = cached(w, dt);
    ct_tensor *y = low ? ct_tensor_view(low, low->ndim, low->shape) : NULL;
    if (!y || !ct_autograd_needed(1, (const ct_tensor *const *)&w)) return y;
    ct_node *n = ct_node_new("autocast_weight", weight_backward, 1, &w);
    if (!n) return NULL;
    return ct_node_attach(n, y) ? NULL : y;
}

ct_tensor *cti_autocast_arg(ct_autocast_op op, ct_tensor *x)
{
    if (!x || !ct_autocast_enabled()) return x;
    ct_dtype dt = ct_autocast_compute_dtype(op, x->dtype);
    if (dt == x->dtype) return x;
    ct_autocast_rule r = ct_autocast_rule_of(op);
    if ((r == CT_AC_LOW || r == CT_AC_FP8) && x->requires_grad && !x->grad_fn) return weight_arg(x, dt);
    return ct_cast(x, dt);
}

static int width(ct_dtype dt) { return dt == CT_DTYPE_F64 ? 3 : dt == CT_DTYPE_F32 ? 2 : 1; }

void cti_autocast_pair(ct_autocast_op op, ct_tensor **a, ct_tensor **b)
{
    if (!*a || !*b || !ct_autocast_enabled() || (*a)->dtype == (*b)->dtype ||
        ct_autocast_rule_of(op) != CT_AC_WIDEST || !ct_dtype_is_float((*a)->dtype) || !ct_dtype_is_float((*b)->dtype))
        return;
    /* f16 and bf16 have the same width: they meet in f32 */
    ct_dtype to = width((*a)->dtype) > width((*b)->dtype) ? (*a)->dtype : (*b)->dtype;
    if (width((*a)->dtype) == width((*b)->dtype)) to = CT_DTYPE_F32;
    if ((*a)->dtype != to) *a = ct_cast(*a, to);
    if ((*b)->dtype != to) *b = ct_cast(*b, to);
}
