/* The comm engine's insides, shared by dist/comm.c (the loop thread, matching,
 * failures), dist/comm_group.c (works on the loop), dist/pg.c, dist/pg_submit.c and
 * dist/pg_direct.c (the caller's side), the algorithms (dist/ring.c,
 * dist/collectives.c, dist/shm_direct.c) and the reduction kernels
 * (dist/reduce_op.c). The design is in docs/maintainers/comm.md. The request a work
 * is to its waiters (dist/work_internal.h) knows nothing of this header: the engine
 * and the group complete works, waiters only wait.
 *
 * Threads. The caller's thread creates a work, fills in its request and hands it to
 * the loop (cti_comm_submit); from then on only the loop thread touches the fields
 * under "loop side" and the algorithm's state, until the work is released. The
 * completion (the req member) is dist/work.c's, under the work's mutex.
 *
 * A work holds two references: the caller's (ct_work_free) and the engine's. The
 * engine holds its own across cti_work_complete and drops it when the work has
 * finished AND no transport I/O refers to its
 * memory any more (io_pending == 0: sends not yet written, a payload being received
 * into its buffers); so a work that failed while the network still held on to its
 * buffers keeps them, and its tensors, alive until the transport lets go.
 */
#ifndef CT_DIST_COMM_INTERNAL_H
#define CT_DIST_COMM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/pg.h"
#include "dist/shm_direct_internal.h"
#include "dist/transport_internal.h"
#include "dist/work_internal.h"

#define CT_COMM_MSG CT_WORK_MSG /* bytes of a work's error message */

/* Defaults, chosen by measurement (docs/maintainers/comm.md). */
#define CT_COMM_RING_MIN_BYTES ((size_t)64 * 1024)
#define CT_COMM_CHUNK_BYTES ((size_t)512 * 1024)
#define CT_COMM_MAX_CHUNK ((size_t)64 << 20)

/* The op of a request; carried in every message header. */
typedef enum ct_comm_op {
    CT_OP_INIT = 1,     /* the check at the end of ct_pg_new */
    CT_OP_NEW_SUBGROUP, /* the parent's check in ct_pg_new_subgroup */
    CT_OP_ALLREDUCE,
    CT_OP_REDUCE_SCATTER,
    CT_OP_ALLGATHER,
    CT_OP_BROADCAST,
    CT_OP_REDUCE,
    CT_OP_GATHER,
    CT_OP_SCATTER,
    CT_OP_ALL_TO_ALL,
    CT_OP_BARRIER,
    CT_OP_SEND,
    CT_OP_RECV,
    CT_OP_COUNT
} ct_comm_op;

/* Algorithm ids, carried in headers: ranks that picked different ones (different
 * tuning) are reported as a desync rather than misreading each other. */
enum { CT_ALGO_RING = 1, CT_ALGO_RD, CT_ALGO_TREE, CT_ALGO_DIRECT, CT_ALGO_DISSEMINATION, CT_ALGO_P2P };

typedef struct ct_comm_group ct_comm_group;

/* One algorithm, run on the loop thread.
 *   start    sets up w->algo_state, sends the first messages; may call cti_comm_ready.
 *   expect   where the payload of message (src, step, chunk) goes and how long it
 *            must be; false when the algorithm expects no such message (now or
 *            ever): the group fails with a protocol error.
 *   deliver  the payload is at the destination expect gave.
 *   needs    whether w still waits for a message from src (a rank that freed the
 *            group sends nothing more: such a work fails, the others complete).
 *   cleanup  frees w->algo_state (called once no I/O refers to it).
 * Sends go through cti_comm_send; a failure already failed the group, after which the
 * algorithm may stop early (its work is finished). */
typedef struct ct_algo {
    const char *name;
    uint8_t id;
    ct_status (*start)(ct_work *w);
    bool (*expect)(ct_work *w, int src, uint32_t step, uint32_t chunk, size_t *len, void **dest);
    void (*deliver)(ct_work *w, int src, uint32_t step, uint32_t chunk);
    bool (*needs)(const ct_work *w, int src);
    void (*cleanup)(ct_work *w);
} ct_algo;

typedef struct ct_comm_cmd {
    struct ct_comm_cmd *next;
    void (*fn)(void *arg);
    void *arg;
    uv_sem_t *done; /* posted after fn for synchronous commands */
} ct_comm_cmd;

enum { CT_WORK_QUEUED = 0, CT_WORK_RUNNING, CT_WORK_FINISHED };

struct ct_work {
    /* completion and references (dist/work_internal.h); must stay the first member */
    ct_work_req req;

    /* the request, fixed before submission */
    ct_comm_op op;
    ct_reduce_op rop; /* 0 for ops without a reduction */
    ct_dtype dtype;
    int64_t count; /* the signature's element count */
    int root;      /* group rank: root; the peer of send/recv; 0 when unused */
    int tag;       /* send/recv */
    uint64_t seq;  /* collectives: per group from 1 (0: init); p2p: per (peer, tag) from 1 */
    int rank, size;
    size_t chunk_bytes;
    const ct_algo *algo;
    ct_tensor *t_out, *t_in; /* retained references (NULL when absent) */
    void *out;               /* data of t_out, or NULL */
    const void *in;          /* data of t_in, or NULL */
    bool in_scratch;         /* the caller gave in up: a reduction may run in it */

    /* loop side */
    ct_comm_group *grp;
    ct_work *next; /* in the group's queue or its list of running sends and receives */
    ct_comm_cmd cmd;
    int state;
    bool ready;      /* the algorithm has all it needs; done once sends drain */
    bool started;    /* algo->start ran: cleanup is due */
    int io_pending;  /* sends not yet written + payloads being received + pins */
    double deadline; /* loop clock, seconds */
    double probe_at;
    bool probed;
    void *algo_state;
};

_Static_assert(offsetof(struct ct_work, req) == 0, "dist/work.c reaches the request through the work");

/* ---- the handle (dist/pg.c, dist/pg_submit.c), used by the caller's thread only ---- */

typedef struct ct_p2p_count { /* sends and receives so far with one (peer, tag) */
    int peer, tag;
    uint64_t sent, received;
} ct_p2p_count;

struct ct_pg {
    ct_comm_group *grp; /* NULL for a group of one rank: its collectives run in place */
    int rank, size;
    uint64_t id;   /* the same on every rank of the group */
    uint64_t seq;  /* the number of the last collective submitted */
    uint64_t nsub; /* sub-groups created from it */
    double timeout_s;
    size_t ring_min_bytes, chunk_bytes;
    ct_p2p_count *p2p;
    int np2p, cap_p2p;
    /* direct allreduce (shm world groups unless async_collectives; dist/shm_direct_internal.h):
     * the slots (the transport's) and the last collective handed to the loop (a direct
     * one runs only after it completed; a reference, or NULL) */
    ct_shm_direct *direct;
    ct_work *last;
    int64_t bytes_sent; /* ct_pg_bytes_sent: updated by cti_pg_submit */
};

/* For cti_pg_submit on a group with direct slots (dist/pg_direct.c): announces w; a
 * direct allreduce then runs to completion on this thread (true: w is complete and
 * the engine's reference dropped; it must not go to the loop); anything else is
 * remembered as the group's last loop collective (false: submit it to the loop). */
bool cti_pg_direct_submit(ct_pg *g, ct_work *w);
/* For ct_pg_free: drops the reference to the last loop collective. */
void cti_pg_direct_release(ct_pg *g);

/* Submits w (request filled in) on g: numbers it, or runs it at once on a group of
 * one. Returns w. */
ct_work *cti_pg_submit(ct_pg *g, ct_work *w);

/* ---- works (dist/comm_group.c) and names (dist/comm_names.c) ------------------------ */

/* A new, zeroed work with both references taken (dist/work_internal.h); its last
 * unref releases the tensors and frees it. NULL on failure (error set). */
ct_work *ct_comm_work_new(void);

/* "allreduce", "broadcast", ...; borrowed. */
const char *cti_comm_op_name(int op);
/* A signature as in the desync messages, e.g. "allreduce(sum, f32, 1000)" or
 * "broadcast(bf16, 7, root 2)", into buf; returns buf. */
const char *cti_comm_sig_str(char *buf, size_t cap, int op, int rop, int dtype, int64_t count, int root);
/* "allreduce #7 (sum, f32, 1000)" or "recv #2 from rank 1 (tag 5, f32, 100)"; returns buf. */
const char *cti_comm_work_title(char *buf, size_t cap, const ct_work *w);

/* ---- the engine (dist/comm.c), caller's thread -------------------------------------- */

/* Registers a group on the loop (starting the comm thread with the first group of
 * the process). Root group: tp is the new transport (ownership passes to the engine
 * even on failure), parent NULL, peers NULL (group rank = transport peer). Sub-group:
 * tp NULL, parent its parent, peers[i] = the parent's rank of group rank i. The group
 * must not receive messages before this returns on every rank: a root group's peers
 * only send once their own ct_pg_new got this far, a sub-group's once the parent's
 * check (which needs this rank) is done. NULL with the error set on failure. */
ct_comm_group *cti_comm_group_new(ct_comm_group *parent, ct_transport *tp, uint64_t id, int rank, int size,
                                 const int *peers, double timeout_s);
/* Fails its pending works, unregisters it, drops its share of the transport;
 * stops the comm thread after the last group. */
void cti_comm_group_free(ct_comm_group *g);
/* Hands w (request filled in, algo chosen) to the loop; it completes later. */
void cti_comm_submit(ct_comm_group *g, ct_work *w);

/* ---- the loop side (dist/comm.c: engine and routing; dist/comm_group.c: works) ---- */


typedef struct ct_comm_early { /* a message that arrived before its work ran */
    struct ct_comm_early *next;
    int src; /* group rank */
    ct_msg m;
    uint8_t data[];
} ct_comm_early;

typedef struct ct_comm_rx { /* the payload being received from a peer, if any */
    ct_work *w;
    ct_comm_early *early;
    char *text; /* an abort's */
} ct_comm_rx;

typedef struct ct_comm_link {
    ct_transport *tp;
    ct_comm_group *groups;
    int refs;
    bool *dead;
    ct_comm_rx *rx;
    /* ids of groups freed here: late messages for them are dropped, not taken for a
     * protocol error (a peer may still be in a collective of a group that failed) */
    uint64_t *freed;
    size_t nfreed, capfreed;
} ct_comm_link;

struct ct_comm_group {
    ct_comm_link *L;
    ct_comm_group *next; /* in L->groups */
    uint64_t id;
    int rank, size;
    int *peers; /* group rank -> transport peer */
    int *grank; /* transport peer -> group rank, or -1 */
    double timeout_s;
    ct_work *head, *tail; /* collectives in order; the head runs */
    ct_work *p2p;         /* running sends and receives */
    ct_comm_early *unexp;
    uint64_t seq_seen, seq_done; /* the last collective submitted, finished */
    ct_status broken;
    char broken_msg[CT_COMM_MSG];
    uv_timer_t timer;
    int64_t *probe_seq; /* per group rank: its seq_seen, -1 no such group there, -2 no answer */
    bool *heard;        /* per group rank: sent something for the running collective */
    bool *left;         /* per group rank: said goodbye (freed the group) */
    bool in_run, rerun;
    /* read by the caller's thread during a direct allreduce: set (release) by the loop
     * once broken and broken_msg are final, or when gone[r] (rank r freed the group) */
    _Atomic int alert;
    _Atomic uint8_t *gone;
    _Atomic uint64_t seq_direct; /* the last direct allreduce (for probe replies) */
};

/* From the caller's thread: fails g as cti_comm_group_fail(g, st, true, msg) on the loop. */
void cti_comm_group_fail_sync(ct_comm_group *g, ct_status st, const char *msg);

static inline bool cti_comm_is_p2p(const ct_work *w) { return w->op == CT_OP_SEND || w->op == CT_OP_RECV; }

/* dist/comm_group.c */
void cti_comm_group_run(ct_comm_group *g);     /* starts queued collectives (fails them when broken) */
void cti_comm_group_fail(ct_comm_group *g, ct_status st, bool tell, const char *msg);
void cti_comm_arm_timer(ct_comm_group *g);
void cti_comm_drop_early(ct_comm_group *g);    /* frees the buffered early messages */
void cti_comm_work_start(ct_work *w);
/* Finishes w with st; msg is prefixed with w's title and what, unless it names w already. */
void cti_comm_work_fail(ct_work *w, ct_status st, const char *what, const char *msg);
void cti_comm_io_done(ct_work *w);             /* one I/O reference or pin is gone */
/* Group rank src freed g: fail what still waits for it. */
void cti_comm_peer_left(ct_comm_group *g, int src);
/* The running work that message m of g from src is for; NULL when none (yet); *stale
 * when it is for a collective that already finished here. */
ct_work *cti_comm_match(ct_comm_group *g, int src, const ct_msg *m, bool *stale);
/* Checks m against w (signature, algorithm, step, length) and sets *dest; false
 * (the group failed) when it does not fit. */
bool cti_comm_accept(ct_work *w, int src, const ct_msg *m, void **dest);
void cti_comm_feed(ct_work *w, ct_comm_early *u); /* a buffered message meets its work; frees u */
const char *cti_comm_rank_name(const ct_comm_group *g, int grank, char *buf, size_t cap);
/* " [at 10.0.0.3, host node1]", the node of group rank grank (its published TCP
 * address and host name), for messages about a lost or silent peer; "" when unknown. */
const char *cti_comm_rank_where(const ct_comm_group *g, int grank, char *buf, size_t cap);
/* Fire and forget (abort, probe, probe reply); nothing when the peer is gone. */
void cti_comm_send_control(ct_comm_link *L, int peer, ct_msg *m, const void *payload);

/* ---- for algorithms (loop thread) ----------------------------------------------------- */

/* Sends a message of w's signature to group rank dst; see ct_transport_ops.send for
 * copy. Non-zero when the group has failed (now or earlier). */
ct_status cti_comm_send(ct_work *w, int dst, uint32_t step, uint32_t chunk, const void *data, size_t len,
                       bool copy);
/* All of w's receives are in and its results written; it completes when its sends are. */
void cti_comm_ready(ct_work *w);
/* Fails w's group (and w) with a message; for allocation failures and protocol errors. */
void cti_comm_fail(ct_work *w, ct_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The algorithms. */
extern const ct_algo cti_algo_ring;          /* allreduce, reduce_scatter, allgather, reduce (dist/ring.c) */
extern const ct_algo cti_algo_rd;            /* allreduce, recursive doubling (dist/ring.c) */
extern const ct_algo cti_algo_tree;          /* broadcast, binomial tree (dist/collectives.c) */
extern const ct_algo cti_algo_direct;        /* gather, scatter, all_to_all */
extern const ct_algo cti_algo_dissemination; /* barrier, init, new_subgroup */
extern const ct_algo cti_algo_p2p;           /* send, recv */

/* The first element of part k (0 <= k <= parts) when n elements are cut into parts
 * equal to within one, the longer ones first; part k is [lo(k), lo(k+1)). */
static inline int64_t cti_comm_part_lo(int64_t n, int64_t parts, int64_t k)
{
    return n / parts * k + (k < n % parts ? k : n % parts);
}

/* ---- reductions (dist/reduce_op.c) -----------------------------------------------------
 * A reduction runs in an accumulation dtype: f32 for bf16 and f16, the dtype itself
 * otherwise. Rounding points for bf16/f16: widening to f32 is exact; every combine
 * rounds in f32 (as f32 arithmetic does); AVG divides the f32 sum once; the result is
 * rounded to bf16/f16 once, in cti_reduce_finish. Integer sums wrap (they are computed
 * in unsigned arithmetic); integer AVG truncates toward zero. MAX and MIN propagate
 * NaN. */

bool cti_reduce_dtype_ok(ct_dtype dt);
ct_dtype cti_reduce_acc_dtype(ct_dtype dt);
/* dst[i] = dst[i] (op) src[i] for n elements of the accumulation dtype acc (AVG sums). */
void cti_reduce_combine(ct_dtype acc, ct_reduce_op op, void *dst, const void *src, int64_t n);
/* acc[i] = in[i] widened to cti_reduce_acc_dtype(dt); a copy when they are the same. */
void cti_reduce_widen(ct_dtype dt, void *acc, const void *in, int64_t n);
/* out[i] = acc[i] (divided by size for AVG) in dtype dt; out may equal acc when dt is
 * its own accumulation dtype. */
void cti_reduce_finish(ct_dtype dt, ct_reduce_op op, int size, void *out, const void *acc, int64_t n);

#endif
