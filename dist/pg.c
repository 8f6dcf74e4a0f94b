/* Process groups: creating the world group (rendezvous, transport, a check across
 * ranks), sub-groups, and freeing. The submit functions are in dist/pg_submit.c.
 *
 * World group. Every rank takes a generation number from the store (a per-rank
 * counter, so the n-th ct_pg_new of every rank agrees on it without coordination)
 * and sets up the transport under the keys ct/pg/<generation>/... (TCP, shared
 * memory when every rank runs on one node, or both: dist/shm_setup.c); then the ranks
 * run a dissemination barrier, "init" (seq 0), whose signature carries the world
 * size: it proves every pair of ranks can talk and that they agree on the size.
 * After it, no rank uses the store again, so a store made here is freed.
 *
 * Sub-groups share their parent's transport; their messages carry their own 64-bit
 * id, derived from the parent's id and how many sub-groups the parent created before
 * (the same on every rank, since every parent rank creates them in the same order).
 * Creation is a barrier on the parent whose signature carries a hash of the rank
 * list, run after the members registered the new group on their loop, so no message
 * for it can arrive before it exists.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"
#include "dist/env.h"
#include "dist/shm_internal.h"
#include "dist/tcp_internal.h"

/* The root group's id; sub-groups mix it with their creation index. */
#define ROOT_ID 1u

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

/* CTRAIN_TIMEOUT, else 300 s; a value that is set but not a positive number is an error. */
static ct_status env_timeout(double *out)
{
    const char *v = getenv("CTRAIN_TIMEOUT");
    *out = CT_DIST_DEFAULT_TIMEOUT_S;
    if (!v || !*v) return CT_OK;
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    if (errno || *end || !(t > 0) || isinf(t))
        return ct_error_set(CT_ERR_INVALID, "pg: CTRAIN_TIMEOUT='%s' is not a positive number of seconds", v);
    *out = t;
    return CT_OK;
}

/* CTRAIN_SHM_DIRECT: "0" keeps allreduce on the comm thread, "1" (or unset) runs it
 * directly on shm groups. */
static ct_status env_direct(bool *async)
{
    const char *v = getenv("CTRAIN_SHM_DIRECT");
    if (!v || !*v || !strcmp(v, "1")) return CT_OK;
    if (!strcmp(v, "0")) {
        *async = true;
        return CT_OK;
    }
    return ct_error_set(CT_ERR_INVALID, "pg: CTRAIN_SHM_DIRECT='%s' is not 0 or 1", v);
}

static ct_pg *pg_alloc(int rank, int size, uint64_t id, double timeout_s, size_t ring_min, size_t chunk)
{
    ct_pg *g = calloc(1, sizeof *g);
    if (!g) {
        ct_error_set(CT_ERR_NOMEM, "pg: out of memory for a group handle");
        return NULL;
    }
    g->rank = rank;
    g->size = size;
    g->id = id;
    g->timeout_s = timeout_s;
    g->ring_min_bytes = ring_min;
    g->chunk_bytes = chunk;
    return g;
}

/* A barrier on g whose signature carries (count, root), waited for. */
static ct_status check_across(ct_pg *g, ct_comm_op op, int64_t count, int root)
{
    ct_work *w = ct_comm_work_new();
    if (!w) return ct_last_status();
    w->op = op;
    w->dtype = CT_DTYPE_U8;
    w->count = count;
    w->root = root;
    w->algo = &cti_algo_dissemination;
    cti_pg_submit(g, w);
    ct_status st = ct_work_wait(w);
    ct_work_free(w);
    return st;
}

ct_pg *ct_pg_new(const ct_pg_config *cfg)
{
    ct_pg_config c = {0};
    ct_dist_env env;
    if (cfg) {
        c = *cfg;
    } else {
        if (ct_dist_env_detect(&env)) return NULL;
        c.rank = env.rank;
        c.world_size = env.world_size;
        c.master_addr = env.master_addr;
        c.master_port = env.master_port;
        c.timeout_s = env.timeout_s;
    }
    if (c.world_size == 0) c.world_size = 1;
    if (!(c.timeout_s > 0) && env_timeout(&c.timeout_s)) return NULL;
    if (!c.master_addr || !*c.master_addr) c.master_addr = "127.0.0.1";
    if (cfg && c.master_port == 0) c.master_port = CT_DIST_DEFAULT_PORT;
    if (c.world_size < 1 || c.rank < 0 || c.rank >= c.world_size) {
        ct_error_set(CT_ERR_INVALID, "ct_pg_new: rank %d of world size %d: want 0 <= rank < world_size", c.rank,
                     c.world_size);
        return NULL;
    }
    if (c.master_port < 0 || c.master_port > 65535) {
        ct_error_set(CT_ERR_INVALID, "ct_pg_new: master_port %d is outside 0..65535", c.master_port);
        return NULL;
    }
    const char *want = c.transport && *c.transport ? c.transport : getenv("CTRAIN_TRANSPORT");
    bool from_env = !(c.transport && *c.transport);
    if (!want || !*want) want = "auto";
    if (strcmp(want, "auto") && strcmp(want, "tcp") && strcmp(want, "shm")) {
        bool later = !strcmp(want, "nccl") || !strcmp(want, "mpi");
        ct_error_set(later ? CT_ERR_UNSUPPORTED : CT_ERR_INVALID,
                     "ct_pg_new: transport '%s'%s %s; use \"auto\", \"tcp\" or \"shm\"", want,
                     from_env ? " (from CTRAIN_TRANSPORT)" : "", later ? "is not built yet" : "is unknown");
        return NULL;
    }
    size_t ring_min = c.ring_min_bytes ? c.ring_min_bytes : CT_COMM_RING_MIN_BYTES;
    size_t chunk = c.chunk_bytes ? c.chunk_bytes : CT_COMM_CHUNK_BYTES;
    if (chunk < 64 || chunk > CT_COMM_MAX_CHUNK) {
        ct_error_set(CT_ERR_INVALID, "ct_pg_new: chunk_bytes %zu is outside 64 .. %zu", chunk, CT_COMM_MAX_CHUNK);
        return NULL;
    }
    bool async = c.async_collectives;
    if (env_direct(&async)) return NULL;
    int port_lo, port_hi;
    if (c.world_size > 1 && cti_tcp_port_range(&port_lo, &port_hi)) { /* before a rank waits on the others */
        ct_error_prefix("ct_pg_new: rank %d of %d: ", c.rank, c.world_size);
        return NULL;
    }
    ct_pg *g = pg_alloc(c.rank, c.world_size, ROOT_ID, c.timeout_s, ring_min, chunk);
    if (!g || c.world_size == 1) return g;

    ct_store *s = c.store;
    if (!s) {
        s = ct_store_new(&(ct_store_config){.host = c.master_addr, .port = c.master_port, .serve = c.rank == 0,
                                            .world_size = c.world_size, .rank = c.rank, .timeout_s = c.timeout_s});
        if (!s) {
            ct_error_prefix("ct_pg_new: rank %d of %d: ", c.rank, c.world_size);
            free(g);
            return NULL;
        }
    }
    char key[64], prefix[64];
    int64_t gen = 0;
    snprintf(key, sizeof key, "ct/pg/gen/%d", c.rank);
    ct_transport *tp = NULL;
    if (!ct_store_add(s, key, 1, &gen)) {
        snprintf(prefix, sizeof prefix, "ct/pg/%lld", (long long)gen);
        tp = cti_transport_select(&(ct_transport_setup){.store = s, .prefix = prefix, .rank = c.rank,
                                                       .size = c.world_size, .timeout_s = c.timeout_s,
                                                       .master_addr = c.master_addr},
                                 want);
    }
    /* every rank says whether it runs allreduce directly before the init check, and
     * compares after it */
    ct_shm_direct *direct = cti_shm_transport_direct(tp);
    if (direct) cti_shm_direct_set_mode(direct, !async);
    if (tp) g->grp = cti_comm_group_new(NULL, tp, ROOT_ID, c.rank, c.world_size, NULL, c.timeout_s);
    ct_status st = g->grp ? check_across(g, CT_OP_INIT, c.world_size, 0) : ct_last_status();
    if (!st && direct) st = cti_shm_direct_check_modes(direct);
    if (!st && direct && !async) g->direct = direct;
    if (s != c.store) ct_store_free(s);
    if (st) {
        ct_error_prefix("ct_pg_new: rank %d of %d: ", c.rank, c.world_size);
        ct_pg_free(g);
        return NULL;
    }
    return g;
}

ct_pg *ct_pg_new_subgroup(ct_pg *parent, const int *ranks, int n)
{
    if (!parent || !ranks) {
        ct_error_set(CT_ERR_INVALID, "ct_pg_new_subgroup: NULL %s", parent ? "rank list" : "parent");
        return NULL;
    }
    if (n < 1) { /* more than the parent's size cannot pass the checks below */
        ct_error_set(CT_ERR_INVALID, "ct_pg_new_subgroup: %d ranks; want at least 1", n);
        return NULL;
    }
    uint32_t hash = 2166136261u; /* FNV-1a over the list, so that ranks can compare it */
    int member = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size) {
            ct_error_set(CT_ERR_INVALID, "ct_pg_new_subgroup: ranks[%d] = %d is not a rank of the parent (0 .. %d)", i,
                         ranks[i], parent->size - 1);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                ct_error_set(CT_ERR_INVALID, "ct_pg_new_subgroup: rank %d is listed twice (ranks[%d] and ranks[%d])",
                             ranks[i], j, i);
                return NULL;
            }
        if (ranks[i] == parent->rank) member = i;
        for (int b = 0; b < 4; b++) hash = (hash ^ (uint8_t)((unsigned)ranks[i] >> 8 * b)) * 16777619u;
    }
    uint64_t id = mix64(parent->id ^ mix64(++parent->nsub));
    ct_pg *sub = NULL;
    ct_status failed = CT_OK;
    char why[CT_COMM_MSG] = "";
    if (member >= 0) {
        sub = pg_alloc(member, n, id, parent->timeout_s, parent->ring_min_bytes, parent->chunk_bytes);
        if (sub && n > 1) sub->grp = cti_comm_group_new(parent->grp, NULL, id, member, n, ranks, parent->timeout_s);
        if (!sub || (n > 1 && !sub->grp)) {
            failed = ct_last_status();
            snprintf(why, sizeof why, "%s", ct_last_error());
            free(sub);
            sub = NULL;
        }
    }
    /* A rank whose part failed still joins the check, with a count of -1: the others
     * fail with a desync naming it instead of waiting for it. */
    if (parent->size > 1 && check_across(parent, CT_OP_NEW_SUBGROUP, failed ? -1 : n, (int)hash) && !failed) {
        ct_error_prefix("ct_pg_new_subgroup: ");
        ct_pg_free(sub);
        return NULL;
    }
    if (failed) {
        ct_error_set(failed, "%s", why);
        return NULL;
    }
    if (!sub) ct_error_clear(); /* not a member: NULL without an error */
    return sub;
}

int ct_pg_rank(const ct_pg *g) { return g ? g->rank : -1; }

int ct_pg_size(const ct_pg *g) { return g ? g->size : 0; }

/* The link's transport is set before the group is returned and never changes. */
const char *ct_pg_transport(const ct_pg *g) { return !g ? NULL : g->grp ? g->grp->L->tp->ops->name : "none"; }

ct_status ct_pg_link_stats_get(const ct_pg *g, ct_pg_link_stats *out)
{
    if (!g || !out)
        return ct_error_set(CT_ERR_INVALID, "ct_pg_link_stats_get: NULL %s", g ? "output" : "group");
    *out = (ct_pg_link_stats){0};
    if (!g->grp) return CT_OK;
    /* the transport is set before the group is returned and freed after its last group */
    const ct_transport *tp = g->grp->L->tp;
    ct_link_count c = {.peers = {0}};
    tp->ops->stats(tp, &c);
    out->shm_peers = c.peers[CT_LINK_SHM];
    out->tcp_peers = c.peers[CT_LINK_TCP];
    out->shm_bytes = c.bytes[CT_LINK_SHM];
    out->tcp_bytes = c.bytes[CT_LINK_TCP];
    return CT_OK;
}

void ct_pg_free(ct_pg *g)
{
    if (!g) return;
    cti_pg_direct_release(g);
    cti_comm_group_free(g->grp);
    free(g->p2p);
    free(g);
}
