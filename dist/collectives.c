/* Collectives without a reduction, and point to point.
 *
 * broadcast: a binomial tree rooted at root, pipelined by chunks. With v = (r - root)
 *   mod n, the parent of v is v without its highest set bit and the children are v + 2^k
 *   for every 2^k > v below n (the largest subtree, v + 1, first). A rank forwards each
 *   chunk to its children as soon as it has arrived, straight from the tensor.
 * gather, scatter, all_to_all: direct messages, each rank's block in chunks; a
 *   receiver takes the chunks of a sender in order, into their place in the output.
 * barrier (and the checks of ct_pg_new and ct_pg_new_subgroup): dissemination, ceil(log2
 *   n) rounds; in round k a rank tells r + 2^k and waits to hear from r - 2^k, and only
 *   enters round k+1 after both. When a rank completes, every rank has entered.
 * send/recv: the tensor in chunks.
 */
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"

/* Bytes [lo, lo + len) of chunk k when nbytes are cut into nc chunks. */
static void byte_chunk(size_t nbytes, int64_t nc, int64_t k, size_t *lo, size_t *len)
{
    *lo = (size_t)cti_comm_part_lo((int64_t)nbytes, nc, k);
    *len = (size_t)cti_comm_part_lo((int64_t)nbytes, nc, k + 1) - *lo;
}

static int64_t nchunks(size_t nbytes, size_t chunk_bytes)
{
    int64_t nc = (int64_t)((nbytes + chunk_bytes - 1) / chunk_bytes);
    return nc < 1 ? 1 : nc;
}

static void free_state(ct_work *w) { free(w->algo_state); }

/* ---- broadcast: binomial tree --------------------------------------------------------------- */

typedef struct tree {
    int parent; /* group rank; -1 at the root */
    int nchild;
    int child[32];
    size_t nbytes;
    int64_t nc;
    uint32_t next; /* the chunk expected next from the parent */
} tree;

static ct_status send_children(ct_work *w, int64_t k)
{
    tree *T = w->algo_state;
    size_t lo, len;
    byte_chunk(T->nbytes, T->nc, k, &lo, &len);
    for (int i = 0; i < T->nchild; i++)
        if (cti_comm_send(w, T->child[i], 0, (uint32_t)k, (uint8_t *)w->out + lo, len, false)) return CT_ERR_PEER;
    return CT_OK;
}

static ct_status tree_start(ct_work *w)
{
    tree *T = calloc(1, sizeof *T);
    if (!T) return CT_ERR_NOMEM;
    w->algo_state = T;
    int n = w->size, v = (w->rank - w->root + n) % n;
    T->nbytes = (size_t)w->count * ct_dtype_size(w->dtype);
    T->nc = nchunks(T->nbytes, w->chunk_bytes);
    int top = 0; /* the highest set bit of v */
    while (v >> top > 1) top++;
    T->parent = v ? ((v & ~(1 << top)) + w->root) % n : -1;
    for (int k = 0; k < 31 && (1 << k) < n; k++)
        if ((1 << k) > v && v + (1 << k) < n) T->child[T->nchild++] = (v + (1 << k) + w->root) % n;
    if (v) return CT_OK;
    for (int64_t k = 0; k < T->nc; k++)
        if (send_children(w, k)) return CT_OK;
    cti_comm_ready(w);
    return CT_OK;
}

static bool tree_expect(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest)
{
    tree *T = w->algo_state;
    if (src != T->parent || step != 0 || chunk != T->next || (int64_t)chunk >= T->nc) return false;
    size_t lo;
    byte_chunk(T->nbytes, T->nc, chunk, &lo, len);
    *dest = (uint8_t *)w->out + lo;
    return true;
}

static void tree_deliver(ct_work *w, int src, uint32_t step, uint32_t chunk)
{
    (void)src;
    (void)step;
    tree *T = w->algo_state;
    T->next++;
    send_children(w, chunk);
    if ((int64_t)T->next == T->nc) cti_comm_ready(w);
}

static bool tree_needs(const ct_work *w, int src)
{
    const tree *T = w->algo_state;
    return src == T->parent && (int64_t)T->next < T->nc;
}

const ct_algo cti_algo_tree = {.name = "binomial tree", .id = CT_ALGO_TREE, .start = tree_start,
                              .expect = tree_expect, .deliver = tree_deliver, .needs = tree_needs,
                              .cleanup = free_state};

/* ---- gather, scatter, all_to_all: direct ----------------------------------------------------------- */

typedef struct direct {
    size_t block;     /* bytes per rank */
    int64_t nc;       /* chunks per block */
    int64_t left;     /* chunks still to receive */
    const uint8_t *in; /* what is sent: the input, or a copy when it overlaps the output */
    uint8_t *copy;
    uint32_t next[];  /* per sender, the chunk expected next */
} direct;

static void direct_cleanup(ct_work *w)
{
    direct *D = w->algo_state;
    if (D) free(D->copy);
    free(D);
}

static bool overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const uint8_t *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
}

/* Sends block j of D->in (or, with j < 0, the whole of it) to dst. */
static ct_status send_block(ct_work *w, int dst, const uint8_t *base)
{
    direct *D = w->algo_state;
    for (int64_t k = 0; k < D->nc; k++) {
        size_t lo, len;
        byte_chunk(D->block, D->nc, k, &lo, &len);
        if (cti_comm_send(w, dst, 0, (uint32_t)k, base + lo, len, false)) return CT_ERR_PEER;
    }
    return CT_OK;
}

static ct_status direct_start(ct_work *w)
{
    int n = w->size, r = w->rank;
    direct *D = calloc(1, sizeof *D + (size_t)n * sizeof(uint32_t));
    if (!D) return CT_ERR_NOMEM;
    w->algo_state = D;
    D->block = (size_t)w->count * ct_dtype_size(w->dtype);
    D->nc = nchunks(D->block, w->chunk_bytes);
    D->in = w->in;
    uint8_t *out = w->out;
    size_t B = D->block;
    switch (w->op) {
    case CT_OP_GATHER:
        if (r != w->root) {
            send_block(w, w->root, D->in);
            cti_comm_ready(w);
            return CT_OK;
        }
        if (out + r * B != D->in && B) memmove(out + r * B, D->in, B);
        D->left = (int64_t)(n - 1) * D->nc;
        return CT_OK;
    case CT_OP_SCATTER:
        if (r != w->root) {
            D->left = D->nc;
            return CT_OK;
        }
        break;
    default: /* all_to_all */
        D->left = (int64_t)(n - 1) * D->nc;
        break;
    }
    /* root of a scatter, or all_to_all: the blocks of in go out while out fills up */
    bool in_place = w->op == CT_OP_SCATTER && out == D->in + r * B; /* out is the root's own block */
    if (overlaps(out, w->op == CT_OP_SCATTER ? B : n * B, D->in, n * B) && !in_place) {
        D->copy = malloc(n * B);
        if (!D->copy) return CT_ERR_NOMEM;
        memcpy(D->copy, D->in, n * B);
        D->in = D->copy;
    }
    uint8_t *mine = w->op == CT_OP_SCATTER ? out : out + r * B;
    if (mine != D->in + r * B && B) memmove(mine, D->in + r * B, B);
    for (int i = 1; i < n; i++) /* r+1 first, so that ranks do not all send to rank 0 at once */
        if (send_block(w, (r + i) % n, D->in + (size_t)((r + i) % n) * B)) return CT_OK;
    if (w->op == CT_OP_SCATTER) cti_comm_ready(w);
    return CT_OK;
}

/* Whether src sends this rank anything in w. */
static bool direct_from(const ct_work *w, int src)
{
    return w->op == CT_OP_ALL_TO_ALL || (w->op == CT_OP_GATHER ? w->rank == w->root : src == w->root);
}

static bool direct_expect(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest)
{
    direct *D = w->algo_state;
    if (!direct_from(w, src) || step != 0 || chunk != D->next[src] || (int64_t)chunk >= D->nc) return false;
    size_t lo;
    byte_chunk(D->block, D->nc, chunk, &lo, len);
    size_t at = w->op == CT_OP_SCATTER ? 0 : (size_t)src * D->block;
    *dest = (uint8_t *)w->out + at + lo;
    return true;
}

static void direct_deliver(ct_work *w, int src, uint32_t step, uint32_t chunk)
{
    (void)step;
    (void)chunk;
    direct *D = w->algo_state;
    D->next[src]++;
    if (--D->left == 0) cti_comm_ready(w);
}

static bool direct_needs(const ct_work *w, int src)
{
    const direct *D = w->algo_state;
    return direct_from(w, src) && (int64_t)D->next[src] < D->nc;
}

const ct_algo cti_algo_direct = {.name = "direct", .id = CT_ALGO_DIRECT, .start = direct_start,
                                .expect = direct_expect, .deliver = direct_deliver, .needs = direct_needs,
                                .cleanup = direct_cleanup};

/* ---- barrier: dissemination ----------------------------------------------------------------------- */

typedef struct dis {
    int rounds, cur;
    bool arrived[32];
} dis;

static ct_status dis_send(ct_work *w, int round)
{
    return cti_comm_send(w, (w->rank + (1 << round)) % w->size, (uint32_t)round, 0, NULL, 0, false);
}

static ct_status dis_start(ct_work *w)
{
    dis *S = calloc(1, sizeof *S);
    if (!S) return CT_ERR_NOMEM;
    w->algo_state = S;
    while ((1 << S->rounds) < w->size) S->rounds++;
    dis_send(w, 0);
    return CT_OK;
}

static int dis_source(const ct_work *w, int round) { return ((w->rank - (1 << round)) % w->size + w->size) % w->size; }

static bool dis_expect(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest)
{
    dis *S = w->algo_state;
    if (chunk || step >= (uint32_t)S->rounds || S->arrived[step] || src != dis_source(w, (int)step)) return false;
    *len = 0;
    *dest = NULL;
    return true;
}

static void dis_deliver(ct_work *w, int src, uint32_t step, uint32_t chunk)
{
    (void)src;
    (void)chunk;
    dis *S = w->algo_state;
    S->arrived[step] = true;
    while (S->cur < S->rounds && S->arrived[S->cur]) {
        S->cur++;
        if (S->cur < S->rounds && dis_send(w, S->cur)) return;
    }
    if (S->cur == S->rounds) cti_comm_ready(w);
}

static bool dis_needs(const ct_work *w, int src)
{
    const dis *S = w->algo_state;
    for (int k = 0; k < S->rounds; k++)
        if (!S->arrived[k] && dis_source(w, k) == src) return true;
    return false;
}

const ct_algo cti_algo_dissemination = {.name = "dissemination", .id = CT_ALGO_DISSEMINATION, .start = dis_start,
                                       .expect = dis_expect, .deliver = dis_deliver, .needs = dis_needs,
                                       .cleanup = free_state};

/* ---- send and recv ---------------------------------------------------------------------------------- */

typedef struct p2p {
    size_t nbytes;
    int64_t nc;
    uint32_t next;
} p2p;

static ct_status p2p_start(ct_work *w)
{
    p2p *P = calloc(1, sizeof *P);
    if (!P) return CT_ERR_NOMEM;
    w->algo_state = P;
    P->nbytes = (size_t)w->count * ct_dtype_size(w->dtype);
    P->nc = nchunks(P->nbytes, w->chunk_bytes);
    if (w->op == CT_OP_RECV) return CT_OK;
    for (int64_t k = 0; k < P->nc; k++) {
        size_t lo, len;
        byte_chunk(P->nbytes, P->nc, k, &lo, &len);
        if (cti_comm_send(w, w->root, 0, (uint32_t)k, (const uint8_t *)w->in + lo, len, false)) return CT_OK;
    }
    cti_comm_ready(w);
    return CT_OK;
}

static bool p2p_expect(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest)
{
    p2p *P = w->algo_state;
    if (src != w->root || step != 0 || chunk != P->next || (int64_t)chunk >= P->nc) return false;
    size_t lo;
    byte_chunk(P->nbytes, P->nc, chunk, &lo, len);
    *dest = (uint8_t *)w->out + lo;
    return true;
}

static void p2p_deliver(ct_work *w, int src, uint32_t step, uint32_t chunk)
{
    (void)src;
    (void)step;
    (void)chunk;
    p2p *P = w->algo_state;
    if ((int64_t)++P->next == P->nc) cti_comm_ready(w);
}

static bool p2p_needs(const ct_work *w, int src)
{
    const p2p *P = w->algo_state;
    return w->op == CT_OP_RECV && src == w->root && (int64_t)P->next < P->nc;
}

const ct_algo cti_algo_p2p = {.name = "point to point", .id = CT_ALGO_P2P, .start = p2p_start,
                             .expect = p2p_expect, .deliver = p2p_deliver, .needs = p2p_needs,
                             .cleanup = free_state};
