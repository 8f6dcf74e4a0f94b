/* Direct allreduce through shared-memory slots, on the caller's thread; the protocol
 * is described in dist/shm_direct_internal.h. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm_internal.h"
#include "dist/shm_direct_internal.h"

#define SPIN_S 1e-3 /* spin this long before sleeping, when every rank can have a core */

struct ct_shm_direct {
    int rank, size;
    size_t slot;
    ct_direct_ctl **ctl; /* per rank */
    uint8_t **data;      /* per rank: two buffers of slot bytes */
    uint64_t k;          /* chunks run so far (every rank's count is the same) */
    void *acc, *tmp;     /* a chunk in the accumulation dtype, twice */
    double spin_s;
    _Atomic int64_t bytes; /* put in the own slot for the others (cti_shm_direct_bytes) */
};

int64_t cti_shm_direct_bytes(const ct_shm_direct *d)
{
    return atomic_load_explicit(&((ct_shm_direct *)d)->bytes, memory_order_relaxed);
}

static double now_s(void) { return (double)uv_hrtime() * 1e-9; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

size_t cti_shm_direct_seg_bytes(size_t slot) { return 4096 + 2 * slot; }

ct_shm_direct *cti_shm_direct_new(int rank, int size, void *const *segs, size_t slot, double spin_s)
{
    ct_shm_direct *d = calloc(1, sizeof *d);
    if (d) {
        d->ctl = calloc((size_t)size, sizeof *d->ctl);
        d->data = calloc((size_t)size, sizeof *d->data);
        /* bf16/f16 accumulate in f32: a chunk of slot / 2 elements takes 2 * slot bytes */
        d->acc = malloc(2 * slot);
        d->tmp = malloc(2 * slot);
    }
    if (!d || !d->ctl || !d->data || !d->acc || !d->tmp) {
        cti_shm_direct_free(d);
        ct_error_set(CT_ERR_NOMEM, "shm: out of memory for the direct allreduce of %d ranks", size);
        return NULL;
    }
    d->rank = rank;
    d->size = size;
    d->slot = slot;
    for (int q = 0; q < size; q++) {
        d->ctl[q] = (ct_direct_ctl *)((uint8_t *)segs[q] + CT_DIRECT_CTL_OFFSET);
        d->data[q] = (uint8_t *)segs[q] + 4096;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    /* ranks that share a core would spin in each other's time slice */
    d->spin_s = spin_s >= 0 ? spin_s : cpus >= size ? SPIN_S : 0;
    return d;
}

void cti_shm_direct_free(ct_shm_direct *d)
{
    if (!d) return;
    free(d->ctl);
    free(d->data);
    free(d->acc);
    free(d->tmp);
    free(d);
}

void cti_shm_direct_set_mode(ct_shm_direct *d, bool direct)
{
    atomic_store(&d->ctl[d->rank]->mode, direct ? 1u : 2u);
}

ct_status cti_shm_direct_check_modes(const ct_shm_direct *d)
{
    uint32_t mine = atomic_load(&d->ctl[d->rank]->mode);
    for (int q = 0; q < d->size; q++) {
        uint32_t m = atomic_load(&d->ctl[q]->mode);
        if (m != mine)
            return ct_error_set(CT_ERR_INVALID,
                                "shm: rank %d runs allreduce %s and rank %d %s; every rank must use the same "
                                "async_collectives setting (ct_pg_config, CTRAIN_SHM_DIRECT)",
                                d->rank, mine == 1 ? "directly" : "on the comm thread", q,
                                m == 1 ? "directly" : m == 2 ? "on the comm thread" : "has not said");
    }
    return CT_OK;
}

static uint64_t sig_word(const ct_work *w, bool direct)
{
    return (uint64_t)w->op | (uint64_t)w->rop << 8 | (uint64_t)w->dtype << 16 | (uint64_t)direct << 24 |
           (uint64_t)(uint32_t)w->root << 32;
}

void cti_shm_direct_announce(ct_shm_direct *d, const ct_work *w, bool direct)
{
    ct_direct_ctl *c = d->ctl[d->rank];
    ct_direct_sig *s = &c->hist[w->seq % CT_DIRECT_HIST];
    atomic_store_explicit(&s->seq, w->seq, memory_order_relaxed);
    atomic_store_explicit(&s->count, (uint64_t)w->count, memory_order_relaxed);
    atomic_store_explicit(&s->word, sig_word(w, direct), memory_order_relaxed);
    atomic_store_explicit(&c->seq, w->seq, memory_order_release);
}

/* ---- waiting ------------------------------------------------------------------------------- */

static void bell_ring(ct_shm_direct *d)
{
    ct_direct_ctl *b = d->ctl[0];
    /* after the counter's (seq_cst) store: a sleeper that registered before it is seen here */
    if (atomic_load(&b->sleepers)) {
        atomic_fetch_add(&b->bell, 1);
        syscall(SYS_futex, (uint32_t *)&b->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

static void post(ct_shm_direct *d, _Atomic uint64_t *counter, uint64_t v)
{
    atomic_store(counter, v);
    bell_ring(d);
}

enum { F_SEQ, F_POSTED, F_REDUCED, F_CONSUMED };

static _Atomic uint64_t *field(ct_direct_ctl *c, int f)
{
    switch (f) {
    case F_SEQ: return &c->seq;
    case F_POSTED: return &c->posted;
    case F_REDUCED: return &c->reduced;
    default: return &c->consumed;
    }
}

/* The first rank whose field is below want, or -1 when all have it. */
static int lagging(const ct_shm_direct *d, int f, uint64_t want)
{
    for (int q = 0; q < d->size; q++)
        if (q != d->rank && atomic_load_explicit(field(d->ctl[q], f), memory_order_acquire) < want) return q;
    return -1;
}

typedef enum { WAIT_OK, WAIT_BROKEN, WAIT_GONE, WAIT_TIMEOUT } wait_result;

/* Waits until every rank's field f >= want. WAIT_TIMEOUT at w->deadline, WAIT_BROKEN
 * when the group failed, WAIT_GONE when the rank waited for freed the group; *who =
 * the rank waited for. */
static wait_result wait_for(ct_shm_direct *d, ct_comm_group *grp, const ct_work *w, int f, uint64_t want,
                            int *who)
{
    int q = lagging(d, f, want);
    if (q < 0) return WAIT_OK;
    double t0 = now_s();
    for (unsigned i = 1;; i++) {
        cpu_relax();
        if ((q = lagging(d, f, want)) < 0) return WAIT_OK;
        if ((i & 255) == 0 && now_s() - t0 >= d->spin_s) break;
    }
    ct_direct_ctl *b = d->ctl[0];
    for (;;) {
        atomic_fetch_add(&b->sleepers, 1);
        uint32_t bell = atomic_load(&b->bell);
        q = lagging(d, f, want);
        if (q >= 0) {
            double t = now_s(), until = w->deadline;
            /* alert: the group failed, or some rank freed it (it wrote what it wrote
             * before it said so: look once more) */
            if (atomic_load_explicit(&grp->alert, memory_order_acquire) &&
                (grp->broken || atomic_load(&grp->gone[q])) && (q = lagging(d, f, want)) >= 0 &&
                (grp->broken || atomic_load(&grp->gone[q]))) {
                atomic_fetch_sub(&b->sleepers, 1);
                *who = q;
                return grp->broken ? WAIT_BROKEN : WAIT_GONE;
            }
            if (t >= until) {
                atomic_fetch_sub(&b->sleepers, 1);
                *who = q;
                return WAIT_TIMEOUT;
            }
            double nap = fmin(until - t, CT_DIRECT_NAP_MS * 1e-3);
            struct timespec ts = {.tv_sec = (time_t)nap, .tv_nsec = (long)((nap - floor(nap)) * 1e9)};
            syscall(SYS_futex, (uint32_t *)&b->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
        }
        atomic_fetch_sub(&b->sleepers, 1);
        if (q < 0) return WAIT_OK;
    }
}

/* ---- failures ------------------------------------------------------------------------------ */

/* w fails with "<title>: <text>", and so does the group on every rank. */
static void fail(ct_comm_group *grp, ct_work *w, ct_status st, const char *text)
{
    char title[256], msg[CT_COMM_MSG];
    cti_comm_work_title(title, sizeof title, w);
    if (strstr(text, title)) snprintf(msg, sizeof msg, "%s", text);
    else snprintf(msg, sizeof msg, "%s: %.760s", title, text);
    cti_comm_group_fail_sync(grp, st, msg);
    cti_work_complete(w, st, msg);
}

/* The wait for rank q ended with r (not WAIT_OK): fail w saying why. */
static void fail_wait(ct_shm_direct *d, ct_comm_group *grp, ct_work *w, wait_result r, int q)
{
    char title[256], text[CT_COMM_MSG], who[64];
    cti_comm_work_title(title, sizeof title, w);
    cti_comm_rank_name(grp, q, who, sizeof who);
    if (r == WAIT_BROKEN) {
        /* the group failed on the comm thread: its message, once set, never changes */
        snprintf(text, sizeof text, "%s: the group failed: %.700s", title, grp->broken_msg);
        if (strstr(grp->broken_msg, title)) snprintf(text, sizeof text, "%s", grp->broken_msg);
        cti_work_complete(w, grp->broken, text);
        return;
    }
    if (r == WAIT_GONE) {
        snprintf(text, sizeof text, "%s: %s freed the group (ct_pg_free) before sending its part", title, who);
        fail(grp, w, CT_ERR_PEER, text);
        return;
    }
    size_t n = (size_t)snprintf(text, sizeof text, "%s timed out after %g s at rank %d; not heard from:", title,
                                grp->timeout_s, d->rank);
    int listed = 0;
    char at[CT_PEER_WHERE + 16];
    for (int i = 0; i < d->size && n < sizeof text - 600; i++) {
        if (i == d->rank) continue;
        uint64_t s = atomic_load(&d->ctl[i]->seq);
        cti_comm_rank_name(grp, i, who, sizeof who);
        if (s < w->seq)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s %s (has not called it; its last collective is #%llu)%s",
                                  listed++ ? "," : "", who, (unsigned long long)s,
                                  cti_comm_rank_where(grp, i, at, sizeof at));
    }
    if (!listed && q >= 0)
        snprintf(text + n, sizeof text - n, " %s (called it, then stopped: is it stuck?)%s",
                 cti_comm_rank_name(grp, q, who, sizeof who), cti_comm_rank_where(grp, q, at, sizeof at));
    else if (!listed)
        snprintf(text + n, sizeof text - n, " %s (called it, then stopped: is it stuck?)", who);
    fail(grp, w, CT_ERR_TIMEOUT, text);
}

/* Every rank has announced w: compare signatures. false (w failed) on a desync. */
static bool same_signature(ct_shm_direct *d, ct_comm_group *grp, ct_work *w)
{
    uint64_t word = sig_word(w, true);
    for (int q = 0; q < d->size; q++) {
        if (q == d->rank) continue;
        ct_direct_ctl *c = d->ctl[q];
        const ct_direct_sig *s = &c->hist[w->seq % CT_DIRECT_HIST];
        uint64_t seq = atomic_load_explicit(&s->seq, memory_order_relaxed);
        uint64_t count = atomic_load_explicit(&s->count, memory_order_relaxed);
        uint64_t tw = atomic_load_explicit(&s->word, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        uint64_t latest = atomic_load(&c->seq);
        char text[CT_COMM_MSG], who[64], mine[160], theirs[160];
        cti_comm_rank_name(grp, q, who, sizeof who);
        if (seq != w->seq || latest - w->seq >= CT_DIRECT_HIST) {
            snprintf(text, sizeof text,
                     "%s #%llu: %s is already at collective #%llu, too far ahead to compare: do all ranks call the "
                     "same collectives in the same order?",
                     cti_comm_op_name(w->op), (unsigned long long)w->seq, who, (unsigned long long)latest);
            fail(grp, w, CT_ERR_PEER, text);
            return false;
        }
        if (count == (uint64_t)w->count && tw == word) continue;
        int op = (int)(tw & 255), rop = (int)(tw >> 8 & 255), dt = (int)(tw >> 16 & 255);
        int root = (int)(int32_t)(uint32_t)(tw >> 32);
        bool direct = tw >> 24 & 1;
        if (count == (uint64_t)w->count && (tw & ~(1ull << 24)) == (word & ~(1ull << 24)) && !direct) {
            snprintf(text, sizeof text,
                     "%s #%llu: rank %d runs it directly in shared memory, %s on the comm thread: every rank must use "
                     "the same async_collectives setting",
                     cti_comm_op_name(w->op), (unsigned long long)w->seq, d->rank, who);
        } else {
            cti_comm_sig_str(mine, sizeof mine, w->op, w->rop, w->dtype, w->count, w->root);
            cti_comm_sig_str(theirs, sizeof theirs, op, rop, dt, (int64_t)count, root);
            snprintf(text, sizeof text, "%s #%llu: rank %d called %s, %s called %s",
                     op == (int)w->op ? cti_comm_op_name(w->op) : "collective", (unsigned long long)w->seq, d->rank,
                     mine, who, theirs);
        }
        fail(grp, w, CT_ERR_PEER, text);
        return false;
    }
    return true;
}

/* ---- the allreduce --------------------------------------------------------------------------- */

/* This rank's segment [lo, lo + len) of the chunk in buffer buf_off: its own input
 * (in; it may be the output itself) combined with every other rank's copy in rank
 * order, finished into out and into this rank's buffer for the others to copy. Only
 * the owner computes a segment, so every rank gets the same bits. */
static void reduce_segment(ct_shm_direct *d, const ct_work *w, size_t buf_off, int64_t lo, int64_t len,
                           const uint8_t *in, uint8_t *out)
{
    ct_dtype dt = w->dtype, acc_dt = cti_reduce_acc_dtype(dt);
    size_t es = ct_dtype_size(dt), off = buf_off + (size_t)lo * es, bytes = (size_t)len * es;
    uint8_t *mine = d->data[d->rank] + off;
    if (len == 0) return;
    void *acc = acc_dt == dt ? (void *)out : d->acc; /* f32, f64, i32, i64: in the output itself */
    if (acc == out) {
        if (out != in) memcpy(out, in, bytes);
    } else {
        cti_reduce_widen(dt, acc, in, len);
    }
    for (int q = 0; q < d->size; q++) {
        if (q == d->rank) continue;
        const void *src = d->data[q] + off;
        if (acc_dt != dt) {
            cti_reduce_widen(dt, d->tmp, src, len);
            src = d->tmp;
        }
        cti_reduce_combine(acc_dt, w->rop, acc, src, len);
    }
    cti_reduce_finish(dt, w->rop, d->size, out, acc, len);
    memcpy(mine, out, bytes);
}

void cti_shm_direct_allreduce(ct_shm_direct *d, ct_comm_group *grp, ct_work *w)
{
    int who = -1;
    if (atomic_load_explicit(&grp->alert, memory_order_acquire) && grp->broken) {
        char title[256], text[CT_COMM_MSG];
        cti_comm_work_title(title, sizeof title, w);
        snprintf(text, sizeof text, "%s: not run: the group had failed: %.700s", title, grp->broken_msg);
        cti_work_complete(w, grp->broken, text);
        return;
    }
    wait_result r = wait_for(d, grp, w, F_SEQ, w->seq, &who);
    if (r != WAIT_OK) {
        fail_wait(d, grp, w, r, who);
        return;
    }
    if (!same_signature(d, grp, w)) return;
    atomic_store(&grp->seq_direct, w->seq);
    w->deadline = now_s() + grp->timeout_s;

    /* committed: every rank is in it, so it runs to the end (or to a failure) */
    size_t es = ct_dtype_size(w->dtype);
    int64_t per = (int64_t)(d->slot / es), n = w->count;
    int64_t chunks = n ? (n + per - 1) / per : 1; /* an empty one still meets once */
    const uint8_t *in = w->in;
    uint8_t *out = w->out;
    ct_direct_ctl *me = d->ctl[d->rank];
    for (int64_t c = 0; c < chunks; c++) {
        uint64_t k = d->k;
        size_t buf = (size_t)(k & 1) * d->slot;
        int64_t e0 = c * per, m = n - e0 < per ? n - e0 : per;
        if (m < 0) m = 0;
        if (k >= 1 && (r = wait_for(d, grp, w, F_CONSUMED, k - 1, &who)) != WAIT_OK) goto failed;
        /* the others' segments of this rank's input (its own it reduces from in) */
        int64_t lo = cti_comm_part_lo(m, d->size, d->rank), hi = cti_comm_part_lo(m, d->size, d->rank + 1);
        uint8_t *slot = d->data[d->rank] + buf;
        if (lo > 0) memcpy(slot, in + (size_t)e0 * es, (size_t)lo * es);
        if (m > hi) memcpy(slot + (size_t)hi * es, in + (size_t)(e0 + hi) * es, (size_t)(m - hi) * es);
        /* the others read these segments now and this rank's reduced one below: m elements */
        atomic_fetch_add_explicit(&d->bytes, m * (int64_t)es, memory_order_relaxed);
        post(d, &me->posted, k + 1);

        if ((r = wait_for(d, grp, w, F_POSTED, k + 1, &who)) != WAIT_OK) goto failed;
        reduce_segment(d, w, buf, lo, hi - lo, in + (size_t)(e0 + lo) * es, out + (size_t)(e0 + lo) * es);
        post(d, &me->reduced, k + 1);

        if ((r = wait_for(d, grp, w, F_REDUCED, k + 1, &who)) != WAIT_OK) goto failed;
        for (int q = 0; q < d->size; q++) {
            if (q == d->rank) continue;
            int64_t qlo = cti_comm_part_lo(m, d->size, q), qhi = cti_comm_part_lo(m, d->size, q + 1);
            if (qhi > qlo)
                memcpy(out + (size_t)(e0 + qlo) * es, d->data[q] + buf + (size_t)qlo * es, (size_t)(qhi - qlo) * es);
        }
        post(d, &me->consumed, k + 1);
        d->k = k + 1;
    }
    cti_work_complete(w, CT_OK, NULL);
    return;

failed:
    /* the counters are out of step from here: the group is broken for good */
    fail_wait(d, grp, w, r, who);
}
