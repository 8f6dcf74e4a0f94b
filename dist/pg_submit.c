/* The submit functions of dist/pg.h: argument checks, the request, the algorithm.
 * A group of one rank runs the collective at once, on the caller's thread (it is a
 * copy at most: with one rank, every reduction is the identity). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"

/* Stands in for the data of an empty tensor, which may have none (NULL + 0 is not C). */
static _Alignas(64) uint8_t no_data[64];

static bool check_group(const ct_pg *g, const char *op)
{
    if (!g) ct_error_set(CT_ERR_INVALID, "%s: NULL process group", op);
    return g != NULL;
}

static bool check_tensor(const ct_pg *g, const char *op, const char *name, const ct_tensor *t)
{
    char d[128];
    if (!t) {
        /* a NULL from an earlier op keeps that op's message */
        if (!ct_last_status())
            ct_error_set(CT_ERR_INVALID, "%s: %s is NULL (rank %d of %d)", op, name, g->rank, g->size);
        return false;
    }
    if (t->device.type != CT_DEVICE_CPU) {
        ct_error_set(CT_ERR_UNSUPPORTED, "%s: %s is %s; the tcp transport moves CPU tensors only (rank %d of %d)", op,
                     name, ct_tensor_describe(t, d, sizeof d), g->rank, g->size);
        return false;
    }
    if (!ct_tensor_is_contiguous(t)) {
        ct_error_set(CT_ERR_INVALID, "%s: %s %s is not contiguous; pass ct_tensor_contiguous(%s) (rank %d of %d)", op,
                     name, ct_tensor_describe(t, d, sizeof d), name, g->rank, g->size);
        return false;
    }
    return true;
}

static bool check_reduce(const ct_pg *g, const char *op, const ct_tensor *t, ct_reduce_op rop)
{
    char d[128];
    if ((unsigned)rop > CT_REDUCE_MIN) {
        ct_error_set(CT_ERR_INVALID, "%s: reduce op %d is not sum, avg, max or min (rank %d of %d)", op, (int)rop,
                     g->rank, g->size);
        return false;
    }
    if (!cti_reduce_dtype_ok(t->dtype)) {
        ct_error_set(CT_ERR_UNSUPPORTED, "%s: %s cannot be reduced; reductions take f32, f64, bf16, f16, i32, i64 "
                     "(rank %d of %d)", op, ct_tensor_describe(t, d, sizeof d), g->rank, g->size);
        return false;
    }
    return true;
}

static bool check_rank(const ct_pg *g, const char *op, const char *what, int r)
{
    if (r >= 0 && r < g->size) return true;
    ct_error_set(CT_ERR_INVALID, "%s: %s %d is not a rank of the group (0 .. %d; this is rank %d)", op, what, r,
                 g->size - 1, g->rank);
    return false;
}

/* numel(big) == factor * numel(small) and the dtypes agree. */
static bool check_pair(const ct_pg *g, const char *op, const char *bn, const ct_tensor *big, const char *sn,
                       const ct_tensor *small, int64_t factor)
{
    if (big->dtype == small->dtype && ct_tensor_numel(big) == factor * ct_tensor_numel(small)) return true;
    char a[128], b[128], want[96];
    if (factor == 1) snprintf(want, sizeof want, "as many elements");
    else snprintf(want, sizeof want, "numel(%s) = %lld x numel(%s)", bn, (long long)factor, sn);
    ct_error_set(CT_ERR_INVALID, "%s: %s is %s and %s is %s; want the same dtype and %s (rank %d of %d)", op, bn,
                 ct_tensor_describe(big, a, sizeof a), sn, ct_tensor_describe(small, b, sizeof b), want, g->rank,
                 g->size);
    return false;
}

static void *data_of(const ct_tensor *t) { return t ? (ct_tensor_numel(t) ? ct_tensor_data(t) : no_data) : NULL; }

static ct_work *make(const ct_pg *g, ct_comm_op op, ct_reduce_op rop, ct_dtype dt, int64_t count, int root,
                     ct_tensor *out, const ct_tensor *in)
{
    ct_work *w = ct_comm_work_new();
    if (!w) return NULL;
    w->op = op;
    w->rop = rop;
    w->dtype = dt;
    w->count = count;
    w->root = root;
    w->t_out = out ? ct_tensor_retain(out) : NULL;
    w->t_in = in ? ct_tensor_retain((ct_tensor *)in) : NULL;
    w->out = data_of(out);
    w->in = data_of(in);
    switch (op) {
    case CT_OP_ALLREDUCE: {
        /* recursive doubling sends the whole buffer (in the accumulation dtype) at once:
         * only while that is one message of at most the largest chunk */
        size_t bytes = (size_t)count * ct_dtype_size(dt);
        bool small = bytes < g->ring_min_bytes &&
                     (size_t)count * ct_dtype_size(cti_reduce_acc_dtype(dt)) <= CT_COMM_MAX_CHUNK;
        w->algo = small ? &cti_algo_rd : &cti_algo_ring;
        break;
    }
    case CT_OP_REDUCE_SCATTER:
    case CT_OP_ALLGATHER:
    case CT_OP_REDUCE: w->algo = &cti_algo_ring; break;
    case CT_OP_BROADCAST: w->algo = &cti_algo_tree; break;
    case CT_OP_GATHER:
    case CT_OP_SCATTER:
    case CT_OP_ALL_TO_ALL: w->algo = &cti_algo_direct; break;
    case CT_OP_SEND:
    case CT_OP_RECV: w->algo = &cti_algo_p2p; break;
    default: w->algo = &cti_algo_dissemination; break;
    }
    return w;
}

/* One rank: out = in where both exist (every reduction of one value is the value). */
static void run_alone(ct_work *w)
{
    size_t n = 0;
    if (w->t_out && w->t_in) n = ct_tensor_nbytes(w->t_out) < ct_tensor_nbytes(w->t_in) ? ct_tensor_nbytes(w->t_out)
                                                                                          : ct_tensor_nbytes(w->t_in);
    if (n && w->out != w->in) memmove(w->out, w->in, n);
}

/* What a ring algorithm sends of w on a group of n > 1 ranks (ct_pg_bytes_sent). */
static double ring_bytes(const ct_work *w, int n)
{
    const double s = (double)w->count * (double)ct_dtype_size(w->dtype), f = (double)(n - 1) / n;
    switch (w->op) {
    case CT_OP_ALLREDUCE: return 2.0 * f * s;
    case CT_OP_REDUCE_SCATTER: return f * s; /* count: the whole input */
    case CT_OP_ALLGATHER: return (n - 1) * s; /* count: one rank's piece */
    case CT_OP_ALL_TO_ALL: return (n - 1) * s; /* count: one block */
    case CT_OP_BROADCAST: case CT_OP_REDUCE: case CT_OP_GATHER: case CT_OP_SCATTER: case CT_OP_SEND: return s;
    default: return 0.0;
    }
}

double ct_pg_bytes_sent(const ct_pg *g)
{
    return g ? (double)__atomic_load_n(&g->bytes_sent, __ATOMIC_RELAXED) : 0.0;
}

ct_work *cti_pg_submit(ct_pg *g, ct_work *w)
{
    /* atomic: works may be submitted from more than one thread */
    if (g->size > 1) __atomic_fetch_add(&g->bytes_sent, (int64_t)(ring_bytes(w, g->size) + 0.5), __ATOMIC_RELAXED);
    w->rank = g->rank;
    w->size = g->size;
    w->chunk_bytes = g->chunk_bytes;
    if (w->op != CT_OP_SEND && w->op != CT_OP_RECV && w->op != CT_OP_INIT) w->seq = ++g->seq;
    if (!g->grp) {
        run_alone(w);
        cti_work_complete(w, CT_OK, NULL);
        cti_work_unref(w); /* no engine */
        return w;
    }
    if (g->direct && !cti_comm_is_p2p(w) && w->op != CT_OP_INIT && cti_pg_direct_submit(g, w)) return w;
    cti_comm_submit(g->grp, w);
    return w;
}

ct_work *ct_pg_allreduce(ct_pg *g, ct_tensor *t, ct_reduce_op op)
{
    const char *name = "allreduce";
    if (!check_group(g, name) || !check_tensor(g, name, "t", t) || !check_reduce(g, name, t, op)) return NULL;
    ct_work *w = make(g, CT_OP_ALLREDUCE, op, t->dtype, ct_tensor_numel(t), 0, t, t);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_allreduce_out(ct_pg *g, ct_tensor *out, const ct_tensor *in, ct_reduce_op op)
{
    const char *name = "allreduce_out";
    if (!check_group(g, name) || !check_tensor(g, name, "out", out) || !check_tensor(g, name, "in", in) ||
        !check_reduce(g, name, in, op) || !check_pair(g, name, "out", out, "in", in, 1))
        return NULL;
    ct_work *w = make(g, CT_OP_ALLREDUCE, op, in->dtype, ct_tensor_numel(in), 0, out, in);
    return w ? cti_pg_submit(g, w) : NULL;
}

static ct_work *reduce_scatter(ct_pg *g, ct_tensor *out, const ct_tensor *in, ct_reduce_op op, bool scratch)
{
    const char *name = scratch ? "reduce_scatter_consume" : "reduce_scatter";
    if (!check_group(g, name) || !check_tensor(g, name, "out", out) || !check_tensor(g, name, "in", in) ||
        !check_reduce(g, name, in, op) || !check_pair(g, name, "in", in, "out", out, g->size))
        return NULL;
    ct_work *w = make(g, CT_OP_REDUCE_SCATTER, op, in->dtype, ct_tensor_numel(in), 0, out, in);
    if (w) w->in_scratch = scratch; /* before the comm thread can see it */
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_reduce_scatter(ct_pg *g, ct_tensor *out, const ct_tensor *in, ct_reduce_op op)
{
    return reduce_scatter(g, out, in, op, false);
}

ct_work *ct_pg_reduce_scatter_consume(ct_pg *g, ct_tensor *out, ct_tensor *in, ct_reduce_op op)
{
    return reduce_scatter(g, out, in, op, true);
}

ct_work *ct_pg_allgather(ct_pg *g, ct_tensor *out, const ct_tensor *in)
{
    const char *name = "allgather";
    if (!check_group(g, name) || !check_tensor(g, name, "out", out) || !check_tensor(g, name, "in", in) ||
        !check_pair(g, name, "out", out, "in", in, g->size))
        return NULL;
    ct_work *w = make(g, CT_OP_ALLGATHER, 0, in->dtype, ct_tensor_numel(in), 0, out, in);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_broadcast(ct_pg *g, ct_tensor *t, int root)
{
    const char *name = "broadcast";
    if (!check_group(g, name) || !check_tensor(g, name, "t", t) || !check_rank(g, name, "root", root)) return NULL;
    ct_work *w = make(g, CT_OP_BROADCAST, 0, t->dtype, ct_tensor_numel(t), root, t, t);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_reduce(ct_pg *g, ct_tensor *t, int root, ct_reduce_op op)
{
    const char *name = "reduce";
    if (!check_group(g, name) || !check_tensor(g, name, "t", t) || !check_reduce(g, name, t, op) ||
        !check_rank(g, name, "root", root))
        return NULL;
    ct_work *w = make(g, CT_OP_REDUCE, op, t->dtype, ct_tensor_numel(t), root, t, t);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_gather(ct_pg *g, ct_tensor *out, const ct_tensor *in, int root)
{
    const char *name = "gather";
    if (!check_group(g, name) || !check_tensor(g, name, "in", in) || !check_rank(g, name, "root", root)) return NULL;
    bool at_root = g->rank == root;
    if (at_root && (!check_tensor(g, name, "out", out) || !check_pair(g, name, "out", out, "in", in, g->size)))
        return NULL;
    ct_work *w = make(g, CT_OP_GATHER, 0, in->dtype, ct_tensor_numel(in), root, at_root ? out : NULL, in);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_scatter(ct_pg *g, ct_tensor *out, const ct_tensor *in, int root)
{
    const char *name = "scatter";
    if (!check_group(g, name) || !check_tensor(g, name, "out", out) || !check_rank(g, name, "root", root)) return NULL;
    bool at_root = g->rank == root;
    if (at_root && (!check_tensor(g, name, "in", in) || !check_pair(g, name, "in", in, "out", out, g->size)))
        return NULL;
    ct_work *w = make(g, CT_OP_SCATTER, 0, out->dtype, ct_tensor_numel(out), root, out, at_root ? in : NULL);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_all_to_all(ct_pg *g, ct_tensor *out, const ct_tensor *in)
{
    const char *name = "all_to_all";
    if (!check_group(g, name) || !check_tensor(g, name, "out", out) || !check_tensor(g, name, "in", in) ||
        !check_pair(g, name, "out", out, "in", in, 1))
        return NULL;
    char d[128];
    if (ct_tensor_numel(in) % g->size) {
        ct_error_set(CT_ERR_INVALID, "all_to_all: in %s does not split into %d equal blocks (rank %d of %d)",
                     ct_tensor_describe(in, d, sizeof d), g->size, g->rank, g->size);
        return NULL;
    }
    /* the algorithm moves blocks: its count is per block; the signature shows the same */
    ct_work *w = make(g, CT_OP_ALL_TO_ALL, 0, in->dtype, ct_tensor_numel(in) / g->size, 0, out, in);
    return w ? cti_pg_submit(g, w) : NULL;
}

ct_work *ct_pg_barrier(ct_pg *g)
{
    if (!check_group(g, "barrier")) return NULL;
    ct_work *w = make(g, CT_OP_BARRIER, 0, CT_DTYPE_U8, 0, 0, NULL, NULL);
    return w ? cti_pg_submit(g, w) : NULL;
}

/* The next number of a send (or recv) with (peer, tag). */
static bool p2p_next(ct_pg *g, int peer, int tag, bool send, uint64_t *seq)
{
    ct_p2p_count *c = NULL;
    for (int i = 0; i < g->np2p && !c; i++)
        if (g->p2p[i].peer == peer && g->p2p[i].tag == tag) c = &g->p2p[i];
    if (!c) {
        if (g->np2p == g->cap_p2p) {
            int cap = g->cap_p2p ? 2 * g->cap_p2p : 8;
            ct_p2p_count *p = realloc(g->p2p, (size_t)cap * sizeof *p);
            if (!p) {
                ct_error_set(CT_ERR_NOMEM, "%s: out of memory counting transfers", send ? "send" : "recv");
                return false;
            }
            g->p2p = p;
            g->cap_p2p = cap;
        }
        c = &g->p2p[g->np2p++];
        *c = (ct_p2p_count){.peer = peer, .tag = tag};
    }
    *seq = send ? ++c->sent : ++c->received;
    return true;
}

static ct_work *p2p(ct_pg *g, ct_tensor *t, int peer, int tag, bool send)
{
    const char *name = send ? "send" : "recv";
    if (!check_group(g, name) || !check_tensor(g, name, "t", t) || !check_rank(g, name, send ? "dst" : "src", peer))
        return NULL;
    if (peer == g->rank) {
        ct_error_set(CT_ERR_INVALID, "%s: rank %d cannot %s itself", name, peer, send ? "send to" : "receive from");
        return NULL;
    }
    uint64_t seq;
    if (!p2p_next(g, peer, tag, send, &seq)) return NULL;
    ct_work *w = make(g, send ? CT_OP_SEND : CT_OP_RECV, 0, t->dtype, ct_tensor_numel(t), peer, send ? NULL : t,
                      send ? t : NULL);
    if (!w) return NULL;
    w->tag = tag;
    w->seq = seq;
    return cti_pg_submit(g, w);
}

ct_work *ct_pg_send(ct_pg *g, const ct_tensor *t, int dst, int tag) { return p2p(g, (ct_tensor *)t, dst, tag, true); }

ct_work *ct_pg_recv(ct_pg *g, ct_tensor *t, int src, int tag) { return p2p(g, t, src, tag, false); }
