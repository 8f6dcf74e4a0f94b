/* Tests for data/loader.c. The loader runs over a dataset written here through the
 * public vtable (the header's recipe): item i is x = (i, -i), y = i, so every batch
 * says which samples it holds. Coverage, padding and rank partitions are checked by
 * counting; the shuffle against its documented derivation and a chi-square test of
 * uniformity; prefetch against no prefetch; resumption against an uninterrupted run. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/frame.h"
#include "core/philox.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "data/loader.h"
#include "data/token_dataset.h"

/* ---- a dataset through the public vtable ---------------------------------------- */

typedef struct idx_ds {
    ct_dataset base;
    int64_t n;
    int64_t fail_at; /* get fails for this item (-1: never) */
    long sleep_ns;   /* per get, to keep the worker busy */
    pthread_t caller;          /* the test's thread */
    atomic_int gets;           /* items read so far */
    atomic_int gets_off_caller; /* of which on another thread */
} idx_ds;

static int64_t idx_len(const ct_dataset *ds) { return ((const idx_ds *)ds)->n; }

static ct_status idx_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    idx_ds *d = (idx_ds *)ds;
    if (d->sleep_ns) nanosleep(&(struct timespec){0, d->sleep_ns}, NULL);
    atomic_fetch_add(&d->gets, 1);
    if (!pthread_equal(pthread_self(), d->caller)) atomic_fetch_add(&d->gets_off_caller, 1);
    if (i == d->fail_at) return ct_error_set(CT_ERR_IO, "idx dataset: item %lld is unreadable", (long long)i);
    /* a temporary, to check the loader gives each get a frame on the worker too */
    ct_tensor *tmp = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(16));
    if (!tmp) return ct_last_status();
    int64_t *x = ct_dataset_row(out[0], row);
    x[0] = i;
    x[1] = -i;
    *(int64_t *)ct_dataset_row(out[1], row) = i;
    return CT_OK;
}

static void idx_free(ct_dataset *ds) { free(ds); }

static const ct_dataset_vtable idx_vtable = {"idx", idx_len, idx_get, idx_free};

static ct_dataset *idx_new(int64_t n)
{
    idx_ds *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    d->n = n;
    d->fail_at = -1;
    ct_dataset_slot slots[2] = {{CT_DTYPE_I64, 1, {2}}, {CT_DTYPE_I64, 0, {0}}};
    cr_assert_eq(ct_dataset_init(&d->base, &idx_vtable, 2, slots), CT_OK, "%s", ct_last_error());
    return &d->base;
}

/* ---- collecting batches --------------------------------------------------------- */

typedef struct run {
    int64_t idx[4096]; /* sample indices in the order returned */
    int64_t n;
    int64_t sizes[512]; /* rows per batch */
    int64_t pads[512];  /* last_padding after each batch */
    int64_t nb;
} run;

/* Takes batches until END (or max batches); checks each batch's shapes and x/y agreement. */
static void take(ct_loader *l, run *r, int64_t max)
{
    ct_loader_result res = CT_LOADER_BATCH;
    while (r->nb < max && res == CT_LOADER_BATCH) CT_FRAME {
        ct_tensor *x, *y;
        res = ct_loader_next(l, &x, &y);
        if (res == CT_LOADER_BATCH) {
            cr_assert_eq(x->ndim, 2);
            cr_assert_eq(x->shape[1], 2);
            cr_assert_eq(y->ndim, 1);
            cr_assert_eq(y->shape[0], x->shape[0]);
            const int64_t *xp = ct_tensor_data(x), *yp = ct_tensor_data(y);
            for (int64_t j = 0; j < x->shape[0]; j++) {
                cr_assert_eq(xp[2 * j], yp[j]);
                cr_assert_eq(xp[2 * j + 1], -yp[j]);
                r->idx[r->n++] = yp[j];
            }
            r->sizes[r->nb] = x->shape[0];
            r->pads[r->nb++] = ct_loader_last_padding(l);
        }
    }
    cr_assert_neq(res, CT_LOADER_ERROR, "%s", ct_last_error());
}

/* One whole epoch: batches until END. */
static void epoch(ct_loader *l, run *r)
{
    memset(r, 0, sizeof *r);
    int64_t e = ct_loader_epoch(l);
    take(l, r, 1 << 30);
    cr_assert_eq(ct_loader_epoch(l), e + 1, "END moves to the next epoch");
    cr_assert_eq(ct_loader_position(l), 0);
}

static void assert_permutation(const int64_t *v, int64_t n, int64_t of)
{
    cr_assert_eq(n, of);
    char *seen = calloc((size_t)of, 1);
    for (int64_t i = 0; i < n; i++) {
        cr_assert(v[i] >= 0 && v[i] < of && !seen[v[i]], "sample %lld repeated or out of range", (long long)v[i]);
        seen[v[i]] = 1;
    }
    free(seen);
}

/* ---- order and coverage ---------------------------------------------------------- */

Test(loader, sequential_batches_drop_last_on_and_off)
{
    ct_dataset *ds = idx_new(10);
    for (int pf = 0; pf < 2; pf++) {
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 3, .no_prefetch = pf});
        cr_assert_not_null(l, "%s", ct_last_error());
        cr_assert_eq(ct_loader_num_batches(l), 4);
        run r;
        for (int e = 0; e < 2; e++) {
            epoch(l, &r);
            cr_assert_eq(r.nb, 4);
            for (int64_t i = 0; i < 10; i++) cr_assert_eq(r.idx[i], i);
            cr_assert_eq(r.sizes[3], 1, "the last batch keeps the remainder");
        }
        ct_loader_free(l);
        l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 3, .drop_last = true, .no_prefetch = pf});
        cr_assert_eq(ct_loader_num_batches(l), 3);
        epoch(l, &r);
        cr_assert_eq(r.n, 9);
        for (int64_t i = 0; i < 9; i++) cr_assert_eq(r.idx[i], i);
        ct_loader_free(l);
    }
    ct_dataset_free(ds);
}

Test(loader, shuffle_covers_each_sample_once)
{
    ct_dataset *ds = idx_new(37);
    for (int dl = 0; dl < 2; dl++) {
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 5, .shuffle = true, .seed = 7, .drop_last = dl});
        run r, first;
        epoch(l, &first);
        for (int e = 0; e < 4; e++) {
            epoch(l, &r);
            if (!dl) {
                assert_permutation(r.idx, r.n, 37);
                cr_assert_eq(r.nb, 8);
            } else {
                cr_assert_eq(r.nb, 7);
                cr_assert_eq(r.n, 35);
                int64_t all[37];
                memcpy(all, r.idx, 35 * sizeof(int64_t));
                /* the dropped two are the ones missing: together a permutation */
                int64_t k = 35;
                for (int64_t s = 0; s < 37; s++) {
                    bool found = false;
                    for (int64_t i = 0; i < 35; i++) found |= r.idx[i] == s;
                    if (!found) all[k++] = s;
                }
                assert_permutation(all, k, 37);
            }
            cr_assert(memcmp(r.idx, first.idx, (size_t)r.n * sizeof(int64_t)) != 0, "epochs differ");
        }
        ct_loader_free(l);
    }
    ct_dataset_free(ds);
}

Test(loader, same_seed_and_epoch_same_order)
{
    ct_dataset *ds = idx_new(50);
    ct_loader *a = ct_loader_new(ds, &(ct_loader_config){.batch_size = 7, .shuffle = true, .seed = 42});
    ct_loader *b = ct_loader_new(ds, &(ct_loader_config){.batch_size = 7, .shuffle = true, .seed = 42, .no_prefetch = true});
    ct_loader *c = ct_loader_new(ds, &(ct_loader_config){.batch_size = 7, .shuffle = true, .seed = 43});
    static run ra[3], rb[3], rc;
    for (int e = 0; e < 3; e++) {
        epoch(a, &ra[e]);
        epoch(b, &rb[e]);
        cr_assert_eq(memcmp(ra[e].idx, rb[e].idx, sizeof ra[e].idx), 0, "epoch %d: prefetch on = off", e);
    }
    cr_assert(memcmp(ra[0].idx, ra[1].idx, sizeof ra[0].idx) != 0);
    cr_assert(memcmp(ra[1].idx, ra[2].idx, sizeof ra[0].idx) != 0);
    epoch(c, &rc);
    cr_assert(memcmp(ra[0].idx, rc.idx, sizeof rc.idx) != 0, "another seed, another order");
    /* going back to epoch 1 gives epoch 1's order again */
    cr_assert_eq(ct_loader_set_epoch(c, 1), CT_OK);
    ct_loader_free(c);
    c = ct_loader_new(ds, &(ct_loader_config){.batch_size = 7, .shuffle = true, .seed = 42});
    cr_assert_eq(ct_loader_set_epoch(c, 1), CT_OK);
    epoch(c, &rc);
    cr_assert_eq(memcmp(rc.idx, ra[1].idx, sizeof rc.idx), 0);
    ct_loader_free(a);
    ct_loader_free(b);
    ct_loader_free(c);
    ct_dataset_free(ds);
}

/* The order is the documented one: Fisher-Yates from high index down with
 * ct_rng_below on a generator seeded by one Philox block of (epoch, "data") under
 * the key seed. Pinning it keeps orders identical across versions and machines. */
Test(loader, shuffle_follows_the_documented_derivation)
{
    int64_t n = 23;
    ct_dataset *ds = idx_new(n);
    uint64_t seed = 0x123456789abcdefULL;
    ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 23, .shuffle = true, .seed = seed});
    for (int64_t e = 0; e < 3; e++) {
        uint32_t ctr[4] = {(uint32_t)e, 0, 0x64617461u, 0}, key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
        ct_philox4x32_10(ctr, key, o);
        ct_rng rng;
        ct_rng_init(&rng, (uint64_t)o[1] << 32 | o[0]);
        int64_t want[23];
        for (int64_t i = 0; i < n; i++) want[i] = i;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)ct_rng_below(&rng, (uint64_t)i + 1), t = want[i];
            want[i] = want[j];
            want[j] = t;
        }
        run r;
        epoch(l, &r);
        cr_assert_eq(memcmp(r.idx, want, sizeof want), 0, "epoch %lld", (long long)e);
    }
    ct_loader_free(l);
    ct_dataset_free(ds);
}

/* Each of the 6 orders of 3 samples equally likely over 6000 epochs (chi-square,
 * 5 degrees of freedom: 20.5 is the 0.999 quantile). An off-by-one in the swap range
 * makes some orders impossible. */
Test(loader, shuffle_is_uniform)
{
    ct_dataset *ds = idx_new(3);
    ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 3, .shuffle = true, .seed = 99, .no_prefetch = true});
    int counts[6] = {0};
    int epochs = 6000;
    for (int e = 0; e < epochs; e++) {
        CT_FRAME {
            ct_tensor *x, *y;
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_BATCH);
            const int64_t *v = ct_tensor_data(y);
            int code = (int)(v[0] * 2 + (v[1] > v[2])); /* first element and the order of the rest */
            counts[code]++;
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_END);
        }
    }
    double chi = 0, expect = epochs / 6.0;
    for (int k = 0; k < 6; k++) chi += (counts[k] - expect) * (counts[k] - expect) / expect;
    cr_assert_lt(chi, 20.5, "counts %d %d %d %d %d %d", counts[0], counts[1], counts[2], counts[3], counts[4],
                 counts[5]);
    ct_loader_free(l);
    ct_dataset_free(ds);
}

/* ---- cursor ------------------------------------------------------------------------- */

Test(loader, cursor_resume_gives_exactly_the_remaining_batches)
{
    ct_dataset *ds = idx_new(61);
    for (int pf = 0; pf < 2; pf++) {
        ct_loader_config cfg = {.batch_size = 4, .shuffle = true, .seed = 5, .no_prefetch = pf};
        /* uninterrupted: epochs 0, 1, 2 */
        ct_loader *a = ct_loader_new(ds, &cfg);
        static run full[3];
        for (int e = 0; e < 3; e++) epoch(a, &full[e]);
        ct_loader_free(a);
        /* interrupted in epoch 1 after 6 batches; the cursor is saved */
        ct_loader *b = ct_loader_new(ds, &cfg);
        run r;
        epoch(b, &r);
        memset(&r, 0, sizeof r);
        take(b, &r, 6);
        cr_assert_eq(memcmp(r.idx, full[1].idx, 24 * sizeof(int64_t)), 0);
        int64_t se = ct_loader_epoch(b), sp = ct_loader_position(b);
        cr_assert_eq(se, 1);
        cr_assert_eq(sp, 6);
        ct_loader_free(b); /* mid-epoch, with a prefetched batch pending */
        /* resumed in a fresh loader */
        ct_loader *c = ct_loader_new(ds, &cfg);
        cr_assert_eq(ct_loader_set_cursor(c, se, sp), CT_OK);
        epoch(c, &r);
        cr_assert_eq(r.nb, full[1].nb - 6);
        cr_assert_eq(memcmp(r.idx, full[1].idx + 24, (size_t)r.n * sizeof(int64_t)), 0);
        epoch(c, &r);
        cr_assert_eq(memcmp(r.idx, full[2].idx, sizeof r.idx), 0);
        /* moving the cursor after a batch was prefetched (the pause lets the worker
         * finish it, as a training step would) discards it for the right one */
        nanosleep(&(struct timespec){0, 30 * 1000 * 1000}, NULL);
        cr_assert_eq(ct_loader_set_cursor(c, 0, 3), CT_OK);
        memset(&r, 0, sizeof r);
        take(c, &r, 2);
        cr_assert_eq(memcmp(r.idx, full[0].idx + 12, 8 * sizeof(int64_t)), 0);
        ct_loader_free(c);
    }
    ct_dataset_free(ds);
}

Test(loader, cursor_at_the_end_and_bad_cursors)
{
    ct_dataset *ds = idx_new(9);
    ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 4});
    cr_assert_eq(ct_loader_num_batches(l), 3);
    cr_assert_eq(ct_loader_set_cursor(l, 2, 3), CT_OK);
    ct_tensor *x = (ct_tensor *)1, *y = (ct_tensor *)1;
    ct_error_clear();
    cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_END);
    cr_assert(x == NULL && y == NULL);
    cr_assert_eq(ct_last_status(), CT_OK, "END is not an error");
    cr_assert_eq(ct_loader_epoch(l), 3);
    cr_assert_eq(ct_loader_position(l), 0);
    cr_assert_eq(ct_loader_set_cursor(l, 0, 4), CT_ERR_INVALID);
    cr_assert(strstr(ct_last_error(), "position = 4") && strstr(ct_last_error(), "<= 3"), "%s", ct_last_error());
    cr_assert_eq(ct_loader_set_cursor(l, -1, 0), CT_ERR_INVALID);
    cr_assert(strstr(ct_last_error(), "epoch = -1") != NULL, "%s", ct_last_error());
    cr_assert_eq(ct_loader_epoch(l), 3, "a rejected cursor leaves the old one");
    cr_assert_eq(ct_loader_set_cursor(NULL, 0, 0), CT_ERR_INVALID);
    cr_assert_eq(ct_loader_epoch(NULL), -1);
    ct_loader_free(l);
    ct_dataset_free(ds);
}

/* ---- ranks ---------------------------------------------------------------------- */

/* For every world size and rank: the partition of each epoch's order. */
static void check_ranks(int64_t n, int w, int64_t bs, bool drop_last, bool uneven, bool shuffle)
{
    ct_dataset *ds = idx_new(n);
    /* the whole order, from one rank with one batch */
    ct_loader *all = ct_loader_new(ds, &(ct_loader_config){.batch_size = n, .shuffle = shuffle, .seed = 3,
                                                          .no_prefetch = true});
    static run whole, r[8];
    epoch(all, &whole);
    ct_loader_free(all);
    int64_t *count = calloc((size_t)n, sizeof *count);
    for (int k = 0; k < w; k++) {
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = bs, .shuffle = shuffle, .seed = 3,
                                                            .drop_last = drop_last, .rank = k, .world_size = w,
                                                            .uneven_batches = uneven});
        cr_assert_not_null(l, "%s", ct_last_error());
        epoch(l, &r[k]);
        cr_assert_eq(ct_loader_num_batches(l), r[k].nb);
        /* rank k takes positions k, k + w, ... of the order, wrapping past the end */
        for (int64_t i = 0; i < r[k].n; i++) {
            int64_t p = k + w * i;
            cr_assert_eq(r[k].idx[i], whole.idx[p % n], "rank %d row %lld", k, (long long)i);
            if (p < n) count[r[k].idx[i]]++;
        }
        /* padding: trailing rows of the last batch, exactly the wrapped positions */
        int64_t wrapped = 0;
        for (int64_t i = 0; i < r[k].n; i++) wrapped += k + w * i >= n;
        int64_t pad_sum = 0;
        for (int64_t b = 0; b < r[k].nb; b++) {
            pad_sum += r[k].pads[b];
            if (b + 1 < r[k].nb) cr_assert_eq(r[k].pads[b], 0);
        }
        cr_assert_eq(pad_sum, wrapped);
        if (uneven || drop_last) cr_assert_eq(wrapped, 0, "no duplicates");
        ct_loader_free(l);
    }
    /* disjoint and complete (minus what drop_last drops) */
    int64_t covered = 0;
    for (int64_t s = 0; s < n; s++) {
        cr_assert_leq(count[s], 1, "sample %lld on two ranks", (long long)s);
        covered += count[s];
    }
    if (!drop_last) cr_assert_eq(covered, n);
    if (!uneven)
        for (int k = 1; k < w; k++) {
            cr_assert_eq(r[k].nb, r[0].nb, "even batches: rank %d", k);
            for (int64_t b = 0; b < r[0].nb; b++) cr_assert_eq(r[k].sizes[b], r[0].sizes[b]);
        }
    free(count);
    ct_dataset_free(ds);
}

Test(loader, ranks_partition_the_order)
{
    int64_t ns[] = {1, 2, 10, 17, 24};
    int ws[] = {1, 2, 3, 4, 8};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof ws / sizeof ws[0]; b++)
            for (int flags = 0; flags < 8; flags++)
                check_ranks(ns[a], ws[b], 2 + (int64_t)(a % 2), flags & 1, flags & 2, flags & 4);
}

/* Resharding a loader (what the Accelerator's prepare does) gives exactly the batches
 * of a loader made for that rank, prefetched batch or not; bad ranks change nothing. */
Test(loader, set_shard_equals_a_loader_made_for_the_rank, .timeout = 20)
{
    ct_dataset *ds = idx_new(23);
    static run want, got;
    for (int prefetch = 0; prefetch <= 1; prefetch++)
        for (int k = 0; k < 3; k++) {
            ct_loader_config c = {.batch_size = 3, .shuffle = true, .seed = 9, .no_prefetch = !prefetch};
            ct_loader *l = ct_loader_new(ds, &c);
            cr_assert_not_null(l, "%s", ct_last_error());
            cr_assert_eq(ct_loader_set_cursor(l, 2, 1), CT_OK); /* a queued batch of the old share */
            cr_assert_eq(ct_loader_set_shard(l, k, 3), CT_OK, "%s", ct_last_error());
            cr_assert_eq(ct_loader_epoch(l), 2);
            cr_assert_eq(ct_loader_position(l), 0);
            epoch(l, &got);
            c.rank = k, c.world_size = 3;
            ct_loader *ref = ct_loader_new(ds, &c);
            cr_assert_eq(ct_loader_set_epoch(ref, 2), CT_OK);
            epoch(ref, &want);
            cr_assert_eq(got.n, want.n);
            cr_assert_eq(got.nb, want.nb);
            cr_assert(!memcmp(got.idx, want.idx, sizeof got.idx), "rank %d prefetch %d", k, prefetch);
            cr_assert(!memcmp(got.pads, want.pads, sizeof got.pads));
            cr_assert_eq(ct_loader_set_shard(l, 3, 3), CT_ERR_INVALID);
            cr_assert(strstr(ct_last_error(), "rank = 3") && strstr(ct_last_error(), "world_size = 3"), "%s",
                      ct_last_error());
            cr_assert_eq(ct_loader_set_shard(l, 0, 0), CT_ERR_INVALID);
            cr_assert_eq(ct_loader_num_batches(l), want.nb);
            ct_loader_free(ref);
            ct_loader_free(l);
        }
    ct_dataset_free(ds);
}

Test(loader, even_batches_pad_by_wrapping)
{
    /* 10 samples, 3 ranks, batch 2: padded to 12 positions, 4 per rank: 2 batches each;
     * positions 10, 11 (ranks 1, 2, last row) are samples 0 and 1 again */
    ct_dataset *ds = idx_new(10);
    int64_t want[3][4] = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
    for (int k = 0; k < 3; k++) {
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 2, .rank = k, .world_size = 3});
        run r;
        epoch(l, &r);
        cr_assert_eq(r.nb, 2);
        cr_assert_eq(memcmp(r.idx, want[k], sizeof want[k]), 0, "rank %d", k);
        cr_assert_eq(r.pads[1], k == 0 ? 0 : 1);
        ct_loader_free(l);
        /* uneven: rank 0 keeps 4, ranks 1 and 2 get 3 (batches 2, 2, 2 with a short last) */
        l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 2, .rank = k, .world_size = 3, .uneven_batches = true});
        epoch(l, &r);
        cr_assert_eq(r.n, k == 0 ? 4 : 3);
        ct_loader_free(l);
        /* drop_last: 3 per rank, one full batch */
        l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 2, .rank = k, .world_size = 3, .drop_last = true});
        epoch(l, &r);
        cr_assert_eq(r.nb, 1);
        cr_assert_eq(memcmp(r.idx, want[k], 2 * sizeof(int64_t)), 0);
        ct_loader_free(l);
    }
    ct_dataset_free(ds);
}

/* ---- errors and lifetime ----------------------------------------------------------- */

Test(loader, bad_config_names_key_and_value)
{
    ct_dataset *ds = idx_new(5);
    struct {
        ct_loader_config cfg;
        const char *frag;
    } cases[] = {
        {{.batch_size = 0}, "batch_size = 0"},
        {{.batch_size = -4}, "batch_size = -4"},
        {{.batch_size = 1, .world_size = -2}, "world_size = -2"},
        {{.batch_size = 1, .rank = 3, .world_size = 3}, "rank = 3"},
        {{.batch_size = 1, .rank = -1}, "rank = -1"},
        {{.batch_size = 1, .rank = 1}, "rank = 1 is out of range for world_size = 1"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cr_assert_null(ct_loader_new(ds, &cases[k].cfg));
        cr_assert_eq(ct_last_status(), CT_ERR_INVALID);
        cr_assert(strstr(ct_last_error(), cases[k].frag) != NULL, "%s", ct_last_error());
    }
    cr_assert_null(ct_loader_new(NULL, &(ct_loader_config){.batch_size = 1}));
    cr_assert_null(ct_loader_new(ds, NULL));
    ct_tensor *x;
    cr_assert_eq(ct_loader_next(NULL, &x, NULL), CT_LOADER_ERROR);
    ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 2});
    cr_assert_eq(ct_loader_next(l, NULL, NULL), CT_LOADER_ERROR);
    ct_loader_free(l);
    ct_loader_free(NULL);
    ct_dataset_free(ds);
}

Test(loader, dataset_errors_reach_the_caller)
{
    ct_dataset *ds = idx_new(12);
    for (int pf = 0; pf < 2; pf++) {
        ((idx_ds *)ds)->fail_at = 5;
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 4, .no_prefetch = pf});
        ct_tensor *x, *y;
        CT_FRAME {
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_BATCH);
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_ERROR);
            cr_assert(x == NULL && y == NULL);
            cr_assert_eq(ct_last_status(), CT_ERR_IO);
            cr_assert(strstr(ct_last_error(), "item 5 is unreadable") && strstr(ct_last_error(), "epoch 0 batch 1 row 1"),
                      "%s", ct_last_error());
            cr_assert_eq(ct_loader_position(l), 1, "the cursor stays on the failed batch");
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_ERROR, "and it fails again");
            ((idx_ds *)ds)->fail_at = -1;
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_BATCH, "%s", ct_last_error());
            cr_assert_eq(((int64_t *)ct_tensor_data(y))[1], 5);
        }
        ct_loader_free(l);
    }
    ct_dataset_free(ds);
}

Test(loader, token_dataset_batches)
{
    /* 1 + 4 * 8 tokens in memory: 4 windows of 8 */
    static uint8_t buf[1024 + 2 * 33];
    uint32_t hdr[3] = {20240520, 1, 33};
    memcpy(buf, hdr, sizeof hdr);
    for (int i = 0; i < 33; i++) {
        uint16_t t = (uint16_t)(1000 + i * 3);
        memcpy(buf + 1024 + 2 * i, &t, 2);
    }
    ct_dataset *ds = ct_token_dataset_open_memory(buf, sizeof buf, "mem", &(ct_token_dataset_config){.block_size = 8});
    cr_assert_not_null(ds, "%s", ct_last_error());
    ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 3});
    ct_tensor *x, *y;
    int64_t rows = 0;
    CT_FRAME {
        while (ct_loader_next(l, &x, &y) == CT_LOADER_BATCH) {
            cr_assert_eq(x->dtype, CT_DTYPE_I64);
            cr_assert_eq(x->shape[1], 8);
            for (int64_t j = 0; j < x->shape[0]; j++, rows++)
                for (int64_t t = 0; t < 8; t++) {
                    cr_assert_eq(ct_tensor_get(x, (int64_t[]){j, t}), 1000 + 3 * (rows * 8 + t));
                    cr_assert_eq(ct_tensor_get(y, (int64_t[]){j, t}), 1000 + 3 * (rows * 8 + t + 1));
                }
        }
    }
    cr_assert_eq(rows, 4);
    ct_loader_free(l);
    ct_dataset_free(ds);
}

/* x only: (i, -i) */
static ct_status one_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    (void)ds;
    int64_t *x = ct_dataset_row(out[0], row);
    x[0] = i;
    x[1] = -i;
    return CT_OK;
}

Test(loader, one_slot_dataset_and_frame_ownership)
{
    idx_ds *d = calloc(1, sizeof *d);
    d->n = 20;
    static const ct_dataset_vtable broken = {"one", idx_len, NULL, idx_free};
    static const ct_dataset_vtable one = {"one", idx_len, one_get, idx_free};
    cr_assert_eq(ct_dataset_init(&d->base, &broken, 1, (ct_dataset_slot[]){{CT_DTYPE_I64, 1, {2}}}), CT_ERR_INVALID);
    cr_assert(strstr(ct_last_error(), "vtable.get is NULL") != NULL, "%s", ct_last_error());
    cr_assert_eq(ct_dataset_init(&d->base, &one, 0, (ct_dataset_slot[]){{CT_DTYPE_I64, 1, {2}}}), CT_ERR_INVALID);
    cr_assert(strstr(ct_last_error(), "nslots = 0") != NULL, "%s", ct_last_error());
    cr_assert_eq(ct_dataset_init(&d->base, &one, 1, (ct_dataset_slot[]){{CT_DTYPE_I64, 8, {2}}}), CT_ERR_INVALID);
    cr_assert_eq(ct_dataset_init(&d->base, &one, 1, (ct_dataset_slot[]){{CT_DTYPE_I64, 1, {-2}}}), CT_ERR_INVALID);
    cr_assert_eq(ct_dataset_init(&d->base, &one, 1, (ct_dataset_slot[]){{CT_DTYPE_I64, 1, {2}}}), CT_OK);
    /* batches live in the caller's frame: after the loop and free, nothing is left */
    int64_t before = ct_storage_live_bytes();
    ct_loader *l = ct_loader_new(&d->base, &(ct_loader_config){.batch_size = 6, .shuffle = true});
    CT_FRAME {
        ct_tensor *x, *y = (ct_tensor *)1;
        int64_t got = 0, sum = 0;
        while (ct_loader_next(l, &x, &y) == CT_LOADER_BATCH) {
            cr_assert_null(y, "a one-slot dataset has no y");
            for (int64_t j = 0; j < x->shape[0]; j++) sum += ((int64_t *)ct_tensor_data(x))[2 * j];
            got += x->shape[0];
        }
        cr_assert_eq(got, 20);
        cr_assert_eq(sum, 190);
        cr_assert_eq(ct_frame_size(), 4, "the four batches, and nothing else, are in this frame");
    }
    ct_loader_free(l);
    cr_assert_eq(ct_storage_live_bytes(), before);
    ct_dataset_free(&d->base);
}

/* Prefetch, shown without timing anything: with it, the worker thread asks
 * the dataset for the next batch's items while the caller holds the current
 * batch and calls nothing; without it, every item is read on the caller's
 * thread, on demand. */
Test(loader, prefetch_reads_ahead_on_a_worker_thread, .timeout = 20)
{
    ct_dataset *ds = idx_new(48);
    idx_ds *d = (idx_ds *)ds;
    for (int pf = 0; pf < 2; pf++) {
        d->caller = pthread_self();
        atomic_store(&d->gets, 0);
        atomic_store(&d->gets_off_caller, 0);
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 8, .no_prefetch = pf});
        CT_FRAME {
            ct_tensor *x, *y;
            cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_BATCH);
            /* wait (bounded) for the worker to fill batch 2 while we do nothing */
            for (int i = 0; i < 5000 && atomic_load(&d->gets) < 16; i++)
                nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
            if (pf == 0) {
                cr_assert_eq(atomic_load(&d->gets), 16, "the next batch was read ahead");
                cr_assert_geq(atomic_load(&d->gets_off_caller), 8, "by another thread");
            } else {
                cr_assert_eq(atomic_load(&d->gets), 8, "without prefetch nothing is read ahead");
                cr_assert_eq(atomic_load(&d->gets_off_caller), 0, "and everything on the caller's thread");
            }
        }
        ct_loader_free(l);
    }
    ct_dataset_free(ds);
}

Test(loader, free_mid_epoch_with_prefetch, .timeout = 10)
{
    ct_dataset *ds = idx_new(400);
    ((idx_ds *)ds)->sleep_ns = 200000; /* 0.2 ms per item: the worker is busy when freed */
    int64_t before = ct_storage_live_bytes();
    for (int k = 0; k < 20; k++) {
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = 16, .shuffle = true, .seed = (uint64_t)k});
        cr_assert_not_null(l);
        CT_FRAME {
            ct_tensor *x, *y;
            for (int b = 0; b < k % 3; b++) cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_BATCH);
        }
        ct_loader_free(l); /* k % 3 == 0: freed before the first batch was taken */
    }
    /* an empty dataset: every epoch ends at once, nothing to prefetch */
    ct_dataset *empty = idx_new(0);
    ct_loader *l = ct_loader_new(empty, &(ct_loader_config){.batch_size = 4});
    ct_tensor *x, *y;
    cr_assert_eq(ct_loader_num_batches(l), 0);
    cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_END);
    cr_assert_eq(ct_loader_next(l, &x, &y), CT_LOADER_END);
    cr_assert_eq(ct_loader_epoch(l), 2);
    ct_loader_free(l);
    ct_dataset_free(empty);
    cr_assert_eq(ct_storage_live_bytes(), before, "prefetch buffers released");
    ct_dataset_free(ds);
}
