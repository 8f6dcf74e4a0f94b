/* Reductions and allgather: the chunked, pipelined ring and recursive doubling.
 *
 * Ring (n ranks, prev = r-1, next = r+1). The buffer is cut into n segments (equal to
 * within one element), each segment into nc chunks (the same nc for every segment).
 *   reduce-scatter steps u = 0 .. n-2: send segment r-u-1 to next, receive segment
 *     r-u-2 from prev and combine it into the local copy. The segment received at step
 *     u is the one sent at step u+1, and after step n-2 rank r holds segment r fully
 *     reduced.
 *   allgather steps u = n-1 .. 2n-3 (t = u-n+1): send segment r-t, receive segment
 *     r-t-1 into the output and forward it at the next step.
 * Every chunk is its own chain: the moment chunk k of step u arrives and is combined,
 * chunk k of step u+1 is sent, so the reduction of one chunk overlaps the transfer of
 * the others, and a rank never waits for a whole segment. Messages from prev arrive in
 * the order prev sent them, and prev sends (u, k) only after (u-1, k), so one chunk of
 * scratch is enough for the incoming partials. Sends are zero-copy: a segment is not
 * written after it was sent until its final value comes back around the ring, which
 * cannot happen before the send left this rank.
 * Modes: allreduce runs both halves; reduce_scatter the first (rank r keeps segment
 * r); allgather the second; reduce the first, then every rank sends its reduced
 * segment to the root (step n-1). The result is the same on every rank, bit for bit,
 * and does not depend on timing: each segment is combined in ring order.
 * bf16/f16: the reduce-scatter runs on an f32 copy (partials travel as f32); each rank
 * rounds its own segment once and the allgather moves the rounded values.
 *
 * Recursive doubling (allreduce of small messages). p = the largest power of two <= n.
 * Step 0: rank r >= p sends its data to r-p, which combines it. Steps 1..log2 p: ranks
 * below p exchange their partial results with r ^ 2^(s-1) and combine (x + y == y + x,
 * so partners agree bit for bit). Step log2 p + 1: r-p returns the result to r. Every
 * message is the whole buffer in the accumulation dtype, copied when sent (the buffer
 * changes right after).
 */
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"

enum { MODE_ALLREDUCE, MODE_RS, MODE_AG, MODE_REDUCE };

typedef struct ring {
    int mode;
    int n, r, prev, next;
    ct_dtype dt, acc;
    size_t esz, asz;     /* bytes per element of the dtype and of the accumulation dtype */
    int64_t count;       /* elements of the whole buffer */
    int64_t nc;          /* chunks per segment */
    uint8_t *work;       /* count accumulation elements under reduction */
    bool own_work;
    uint8_t *out;        /* count elements (allreduce, allgather), segment r (reduce_scatter), root's t (reduce) */
    uint8_t *scratch;    /* one chunk of partials from prev */
    uint32_t *next_step; /* per chunk: the step expected next from prev */
    uint32_t *next_src;  /* reduce, root: per rank, the chunk expected next */
    int64_t left;        /* messages still to receive */
} ring;

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Elements [*lo, *lo + *len) of chunk k of segment j. */
static void chunk_of(const ring *R, int j, int64_t k, int64_t *lo, int64_t *len)
{
    int64_t s0 = cti_comm_part_lo(R->count, R->n, j), sn = cti_comm_part_lo(R->count, R->n, j + 1) - s0;
    int64_t c0 = cti_comm_part_lo(sn, R->nc, k);
    *lo = s0 + c0;
    *len = cti_comm_part_lo(sn, R->nc, k + 1) - c0;
}

static int64_t chunks_for(int64_t elems, size_t esz, size_t chunk_bytes)
{
    uint64_t bytes = (uint64_t)elems * esz;
    int64_t nc = (int64_t)((bytes + chunk_bytes - 1) / chunk_bytes);
    if (nc > elems) nc = elems; /* no empty chunks by choice */
    if (nc > (1 << 20)) nc = 1 << 20;
    return nc < 1 ? 1 : nc;
}

static void ring_cleanup(ct_work *w)
{
    ring *R = w->algo_state;
    if (!R) return;
    if (R->own_work) free(R->work);
    free(R->scratch);
    free(R->next_step);
    free(R->next_src);
    free(R);
}

static ct_status send_chunk(ct_work *w, int dst, uint32_t step, int64_t k, const uint8_t *base, int j, size_t esz)
{
    ring *R = w->algo_state;
    int64_t lo, len;
    chunk_of(R, j, k, &lo, &len);
    return cti_comm_send(w, dst, step, (uint32_t)k, base + lo * esz, (size_t)len * esz, false);
}

/* Chunk k of segment r is fully reduced in work. */
static void own_final(ct_work *w, int64_t k)
{
    ring *R = w->algo_state;
    int64_t lo, len;
    chunk_of(R, R->r, k, &lo, &len);
    int n = R->n;
    const uint8_t *acc = R->work + lo * R->asz;
    switch (R->mode) {
    case MODE_ALLREDUCE:
        cti_reduce_finish(R->dt, w->rop, n, R->out + lo * R->esz, acc, len);
        send_chunk(w, R->next, (uint32_t)(n - 1), k, R->out, R->r, R->esz);
        break;
    case MODE_RS:
        cti_reduce_finish(R->dt, w->rop, n, R->out + (lo - cti_comm_part_lo(R->count, n, R->r)) * R->esz, acc, len);
        break;
    case MODE_REDUCE:
        if (R->r == w->root) cti_reduce_finish(R->dt, w->rop, n, R->out + lo * R->esz, acc, len);
        else send_chunk(w, w->root, (uint32_t)(n - 1), k, R->work, R->r, R->asz);
        break;
    }
}

static ct_status ring_start(ct_work *w)
{
    ring *R = calloc(1, sizeof *R);
    if (!R) return CT_ERR_NOMEM;
    w->algo_state = R;
    int n = R->n = w->size, r = R->r = w->rank;
    R->prev = mod(r - 1, n);
    R->next = mod(r + 1, n);
    R->dt = w->dtype;
    R->mode = w->op == CT_OP_ALLREDUCE ? MODE_ALLREDUCE
              : w->op == CT_OP_REDUCE_SCATTER ? MODE_RS
              : w->op == CT_OP_ALLGATHER ? MODE_AG
                                          : MODE_REDUCE;
    R->acc = R->mode == MODE_AG ? w->dtype : cti_reduce_acc_dtype(w->dtype);
    R->esz = ct_dtype_size(R->dt);
    R->asz = ct_dtype_size(R->acc);
    R->count = R->mode == MODE_AG ? w->count * n : w->count;
    int64_t maxseg = cti_comm_part_lo(R->count, n, 1);
    R->nc = chunks_for(maxseg, R->mode == MODE_AG ? R->esz : R->asz, w->chunk_bytes);
    R->out = w->out;
    R->next_step = calloc((size_t)R->nc, sizeof *R->next_step);
    R->scratch = malloc((size_t)(cti_comm_part_lo(maxseg, R->nc, 1) + 1) * R->asz);
    if (!R->next_step || !R->scratch) return CT_ERR_NOMEM;
    size_t nbytes = (size_t)R->count * R->asz;
    switch (R->mode) {
    case MODE_ALLREDUCE:
        if (R->acc == R->dt) {
            if (w->in != w->out && nbytes) memmove(w->out, w->in, nbytes);
            R->work = w->out;
        }
        R->left = 2 * (int64_t)(n - 1) * R->nc;
        break;
    case MODE_RS: R->left = (int64_t)(n - 1) * R->nc; break;
    case MODE_AG: {
        int64_t lo = cti_comm_part_lo(R->count, n, r);
        if (w->in != R->out + lo * R->esz && w->count)
            memmove(R->out + lo * R->esz, w->in, (size_t)w->count * R->esz);
        for (int64_t k = 0; k < R->nc; k++) R->next_step[k] = (uint32_t)(n - 1);
        R->left = (int64_t)(n - 1) * R->nc;
        break;
    }
    case MODE_REDUCE:
        if (r == w->root && R->acc == R->dt) R->work = w->out;
        R->left = (int64_t)(n - 1) * R->nc;
        if (r == w->root) {
            R->left *= 2;
            R->next_src = calloc((size_t)n, sizeof *R->next_src);
            if (!R->next_src) return CT_ERR_NOMEM;
        }
        break;
    }
    /* a reduce-scatter whose caller gave its input up reduces in it: no copy */
    if (R->mode == MODE_RS && w->in_scratch && R->acc == R->dt) R->work = (uint8_t *)(uintptr_t)w->in;
    if (R->mode != MODE_AG && !R->work) {
        R->work = malloc(nbytes + 1);
        if (!R->work) return CT_ERR_NOMEM;
        R->own_work = true;
        cti_reduce_widen(R->dt, R->work, w->in, R->count);
    }
    for (int64_t k = 0; k < R->nc; k++) {
        ct_status st = R->mode == MODE_AG ? send_chunk(w, R->next, (uint32_t)(n - 1), k, R->out, r, R->esz)
                                          : send_chunk(w, R->next, 0, k, R->work, mod(r - 1, n), R->asz);
        if (st) return CT_OK; /* the group failed and w with it */
    }
    return CT_OK;
}

static bool ring_expect(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest)
{
    ring *R = w->algo_state;
    int n = R->n;
    if (chunk >= R->nc) return false;
    int64_t lo, clen;
    if (R->mode == MODE_REDUCE && step == (uint32_t)(n - 1)) {
        if (R->r != w->root || src == w->root || R->next_src[src] != chunk) return false;
        chunk_of(R, src, chunk, &lo, &clen);
        *len = (size_t)clen * R->asz;
        *dest = R->work + lo * R->asz;
        return true;
    }
    uint32_t last = R->mode == MODE_ALLREDUCE || R->mode == MODE_AG ? (uint32_t)(2 * n - 3) : (uint32_t)(n - 2);
    if (src != R->prev || step != R->next_step[chunk] || step > last) return false;
    if (step <= (uint32_t)(n - 2)) {
        chunk_of(R, mod(R->r - (int)step - 2, n), chunk, &lo, &clen);
        *len = (size_t)clen * R->asz;
        *dest = R->scratch;
    } else {
        chunk_of(R, mod(R->r - (int)(step - (uint32_t)(n - 1)) - 1, n), chunk, &lo, &clen);
        *len = (size_t)clen * R->esz;
        *dest = R->out + lo * R->esz;
    }
    return true;
}

static void ring_deliver(ct_work *w, int src, uint32_t step, uint32_t chunk)
{
    ring *R = w->algo_state;
    int n = R->n;
    R->left--;
    if (R->mode == MODE_REDUCE && step == (uint32_t)(n - 1)) {
        /* root: rank src's reduced segment is in work */
        R->next_src[src]++;
        int64_t lo, len;
        chunk_of(R, src, chunk, &lo, &len);
        cti_reduce_finish(R->dt, w->rop, n, R->out + lo * R->esz, R->work + lo * R->asz, len);
    } else if (step <= (uint32_t)(n - 2)) {
        R->next_step[chunk]++;
        int j = mod(R->r - (int)step - 2, n);
        int64_t lo, len;
        chunk_of(R, j, chunk, &lo, &len);
        cti_reduce_combine(R->acc, w->rop, R->work + lo * R->asz, R->scratch, len);
        if (step < (uint32_t)(n - 2)) send_chunk(w, R->next, step + 1, chunk, R->work, j, R->asz);
        else own_final(w, chunk);
    } else {
        R->next_step[chunk]++;
        int t = (int)(step - (uint32_t)(n - 1));
        if (t < n - 2) send_chunk(w, R->next, step + 1, chunk, R->out, mod(R->r - t - 1, n), R->esz);
    }
    if (R->left == 0) cti_comm_ready(w);
}

static bool ring_needs(const ct_work *w, int src)
{
    const ring *R = w->algo_state;
    int n = R->n;
    uint32_t last = R->mode == MODE_ALLREDUCE || R->mode == MODE_AG ? (uint32_t)(2 * n - 3) : (uint32_t)(n - 2);
    for (int64_t k = 0; src == R->prev && k < R->nc; k++)
        if (R->next_step[k] <= last) return true;
    return R->mode == MODE_REDUCE && R->r == w->root && src != w->root && R->next_src[src] < R->nc;
}

const ct_algo cti_algo_ring = {.name = "ring", .id = CT_ALGO_RING, .start = ring_start, .expect = ring_expect,
                              .deliver = ring_deliver, .needs = ring_needs, .cleanup = ring_cleanup};

/* ---- recursive doubling ------------------------------------------------------------------- */

typedef struct rd {
    int n, r, p, steps; /* steps = log2 p */
    bool extra, helper; /* r >= p; r < n - p */
    ct_dtype acc;
    size_t nbytes;      /* the whole buffer in the accumulation dtype */
    uint8_t *work;
    uint8_t *slots;     /* per step, its incoming payload */
    bool *arrived;
    int cur;            /* the step to complete next */
} rd;

static void rd_cleanup(ct_work *w)
{
    rd *D = w->algo_state;
    if (!D) return;
    free(D->work);
    free(D->slots);
    free(D->arrived);
    free(D);
}

static void rd_finish(ct_work *w)
{
    rd *D = w->algo_state;
    cti_reduce_finish(w->dtype, w->rop, D->n, w->out, D->work, w->count);
    cti_comm_ready(w);
}

/* Completes every step whose message is in, sending the next step's data. */
static void rd_progress(ct_work *w)
{
    rd *D = w->algo_state;
    while (w->state == CT_WORK_RUNNING) {
        int s = D->cur;
        if (s > D->steps) {
            uint32_t last = (uint32_t)(D->steps + 1);
            if (D->helper && cti_comm_send(w, D->r + D->p, last, 0, D->work, D->nbytes, true)) return;
            D->cur++;
            rd_finish(w);
            return;
        }
        bool wait = s > 0 || D->helper;
        if (wait && !D->arrived[s]) return;
        if (wait) cti_reduce_combine(D->acc, w->rop, D->work, D->slots + (size_t)s * D->nbytes, w->count);
        D->cur++;
        if (D->cur <= D->steps &&
            cti_comm_send(w, D->r ^ (1 << (D->cur - 1)), (uint32_t)D->cur, 0, D->work, D->nbytes, true))
            return;
    }
}

static ct_status rd_start(ct_work *w)
{
    rd *D = calloc(1, sizeof *D);
    if (!D) return CT_ERR_NOMEM;
    w->algo_state = D;
    D->n = w->size;
    D->r = w->rank;
    for (D->p = 1; D->p * 2 <= D->n; D->p *= 2) D->steps++;
    D->extra = D->r >= D->p;
    D->helper = D->r < D->n - D->p;
    D->acc = cti_reduce_acc_dtype(w->dtype);
    D->nbytes = (size_t)w->count * ct_dtype_size(D->acc);
    D->work = malloc(D->nbytes + 1);
    D->slots = malloc((size_t)(D->steps + 2) * D->nbytes + 1);
    D->arrived = calloc((size_t)D->steps + 2, sizeof *D->arrived);
    if (!D->work || !D->slots || !D->arrived) return CT_ERR_NOMEM;
    cti_reduce_widen(w->dtype, D->work, w->in, w->count);
    if (D->extra) cti_comm_send(w, D->r - D->p, 0, 0, D->work, D->nbytes, true); /* a failure failed w */
    else rd_progress(w);
    return CT_OK;
}

/* The rank whose message step brings; -1 when this rank gets none at that step. */
static int rd_source(const rd *D, uint32_t step)
{
    if (D->extra) return step == (uint32_t)D->steps + 1 ? D->r - D->p : -1;
    if (step == 0) return D->helper ? D->r + D->p : -1;
    if (step <= (uint32_t)D->steps) return D->r ^ (1 << (step - 1));
    return -1;
}

static bool rd_expect(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest)
{
    rd *D = w->algo_state;
    if (chunk != 0 || step > (uint32_t)D->steps + 1 || D->arrived[step] || src != rd_source(D, step)) return false;
    *len = D->nbytes;
    /* the extra rank's result lands in work: nothing else uses it by then */
    *dest = D->extra ? D->work : D->slots + step * D->nbytes;
    return true;
}

static void rd_deliver(ct_work *w, int src, uint32_t step, uint32_t chunk)
{
    (void)src;
    (void)chunk;
    rd *D = w->algo_state;
    D->arrived[step] = true;
    if (D->extra) rd_finish(w);
    else rd_progress(w);
}

static bool rd_needs(const ct_work *w, int src)
{
    const rd *D = w->algo_state;
    for (uint32_t s = 0; s <= (uint32_t)D->steps + 1; s++)
        if (!D->arrived[s] && rd_source(D, s) == src) return true;
    return false;
}

const ct_algo cti_algo_rd = {.name = "recursive doubling", .id = CT_ALGO_RD, .start = rd_start, .expect = rd_expect,
                            .deliver = rd_deliver, .needs = rd_needs, .cleanup = rd_cleanup};
