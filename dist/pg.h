/* ctrain — process groups and collectives.
 *
 *     ct_pg *g = ct_pg_new(NULL);                    ranks from the launcher's environment
 *     ct_work *w = ct_pg_allreduce(g, grad, CT_REDUCE_MEAN);
 *     ... compute while the reduction runs ...
 *     if (ct_work_wait(w)) fail(ct_last_error());
 *     ct_work_free(w);
 *     ct_pg_free(g);
 *
 * A group is a handle: a set of ranks that run collectives together. Every rank of
 * a group must submit the same collectives in the same order with matching
 * arguments (op, reduce op, dtype, element count, root); each collective carries a
 * per-group sequence number and that signature, and a rank that disagrees makes the
 * collective fail on every rank of the group with a message naming both sides
 * ("allreduce #7: rank 0 called allreduce(sum, f32, 1000), rank 2 called
 * allreduce(sum, f32, 1024)"), instead of hanging or producing garbage.
 *
 * Every submit function returns a request (dist/work.h) at once: the transfer runs on
 * the process's communication thread while the caller computes (except a direct
 * allreduce, below). Tensors are retained
 * by the work until it completes and must not be read (outputs) or written (inputs)
 * until then. Tensors must be contiguous CPU tensors; zero elements are fine. Rank
 * numbers (root, dst, src) are ranks in the group. Reductions (sum, avg, max, min)
 * take f32, f64, bf16, f16, i32 and i64; bf16 and f16 are accumulated in f32 and
 * rounded once at the end. AVG divides the sum by the group size (integers: C
 * division, truncating toward zero); integer sums wrap around (two's complement).
 * Data movement alone (broadcast, allgather, gather, scatter, all_to_all, send,
 * recv) takes every dtype.
 *
 * Direct allreduce. On a world group whose ranks share a host ("shm"), an allreduce
 * does not go to the communication thread: the submitting thread reduces it itself
 * through shared memory, in microseconds for small tensors and at memory speed for
 * large ones, with no thread hop or wake-up. The submit blocks, as MPI_Allreduce
 * does, until every rank has submitted it and the result is written (at most the
 * group timeout, then a timeout error naming the ranks missing) and returns the work
 * already complete; its errors are still the work's status, reported by the wait. So
 * a rank must not make its peers wait, before their allreduce, for something it
 * submits only after its own. To overlap an allreduce with computation (as DDP does
 * with its gradient buckets), use a group with async_collectives set, or a sub-group
 * (sub-groups always run on the comm thread). Errors, desyncs, timeouts and dead
 * peers are reported as for the others.
 *
 * Failures. A submit function returns NULL for a bad argument (NULL or
 * non-contiguous tensor, a CUDA tensor, dtype or size mismatch, a root or peer out of
 * range) with ct_last_error() naming the op, the shapes and the rank; nothing is sent
 * then. Everything that goes wrong later is the work's status: CT_ERR_PEER (a rank
 * died, closed its connection, or disagreed), CT_ERR_TIMEOUT (no completion within
 * the group timeout; the message names the op, its sequence number and the ranks not
 * heard from), CT_ERR_FORMAT (a peer sent bytes that are not this protocol). After
 * any of them the group is broken: its pending and later works fail at once with
 * that error, and the job should end (there is no recovery).
 *
 * Thread-safety: one thread at a time may submit to a group (different groups may be
 * used from different threads). Works may be waited on, tested and freed from any
 * thread. ct_pg_new and ct_pg_new_subgroup are collective over their ranks and block;
 * create groups after fork(), never before (the communication thread does not survive
 * a fork).
 *
 * Nodes. Ranks on one node (same boot id, host name and network namespace, or the
 * same CTRAIN_NODE_ID) talk through shared-memory rings, ranks on different nodes over
 * TCP, within one group ("shm+tcp"). A lost or silent peer is named with its node:
 * "rank 3 closed its connection: ... [at 10.0.0.3, host node1]".
 */
#ifndef CT_DIST_PG_H
#define CT_DIST_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/store.h"
#include "dist/work.h"
#include "kernels/reduce.h"

typedef struct ct_pg ct_pg;

/* Reductions use the kernels' ct_reduce_op (kernels/reduce.h): CT_REDUCE_SUM,
 * CT_REDUCE_MEAN (the average over the group's ranks, torch's AVG), CT_REDUCE_MAX,
 * CT_REDUCE_MIN. */

/* Zero means default for every field. */
typedef struct ct_pg_config {
    int rank, world_size;    /* this rank, the number of ranks; default 0 of 1 */
    const char *master_addr; /* rank 0's store; default "127.0.0.1" */
    int master_port;         /* default 29500 (CT_DIST_DEFAULT_PORT) */
    double timeout_s;        /* bounds setup and every collective; default CTRAIN_TIMEOUT, else 300 */
    ct_store *store;         /* optional: rendezvous through this store (borrowed; it must
                              * outlive ct_pg_new only); master_addr/port are then unused */
    const char *transport;   /* "auto" (default; CTRAIN_TRANSPORT when NULL): "shm" when every
                              * rank runs on this node, "shm+tcp" when some ranks share a
                              * node and others do not (rings within a node, TCP across),
                              * else "tcp"; "tcp": TCP connections only; "shm": shared-memory
                              * rings (an error when ranks are on other nodes). A node is a
                              * boot id, host name and network namespace, or the value of
                              * CTRAIN_NODE_ID when set. Every rank must ask for the same one. */
    /* Tuning; every rank must use the same values (a difference is reported as a
     * desync). Sub-groups inherit them. */
    size_t ring_min_bytes; /* allreduce: recursive doubling below, ring from here; default 64 KiB */
    size_t chunk_bytes;    /* pipelining unit of ring, tree and point-to-point transfers; default 512 KiB */
    /* With "shm", allreduce runs on the caller's thread through shared-memory slots
     * (see "Direct allreduce" below) unless this is set (or CTRAIN_SHM_DIRECT=0): then
     * it runs on the comm thread like every other collective. */
    bool async_collectives;
} ct_pg_config;

/* The group of all ranks. NULL cfg: rank, world size, master and timeout from the
 * environment (ct_dist_env_detect: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
 * CTRAIN_TIMEOUT, CTRAIN_TRANSPORT). A world of 1 needs no store and no sockets.
 * Otherwise rank 0 serves the store (unless cfg->store is given), the ranks exchange
 * addresses and host names through it, connect to each other (one TCP connection per
 * pair; with "shm" also a shared-memory ring per direction, the connection only
 * waking the reader) and check that they agree before returning. New handle, owned
 * by the caller (ct_pg_free); NULL with ct_last_error() set on failure (an
 * unreachable master or peer within the timeout names the address). */
CT_API ct_pg *ct_pg_new(const ct_pg_config *cfg);

/* A group of the parent's ranks ranks[0..n-1] (distinct parent ranks; the new
 * group's rank i is ranks[i]). Called by EVERY rank of the parent, in the same order
 * with the same list (as torch.distributed.new_group); the list is checked across
 * ranks. Returns the new handle (owned by the caller) on members; on the parent's
 * other ranks NULL with no error (ct_last_status() == CT_OK); NULL with the error set
 * on failure. It shares the parent's connections; a parent may be freed first. */
CT_API ct_pg *ct_pg_new_subgroup(ct_pg *parent, const int *ranks, int n);

/* This process's rank in g, 0 .. size - 1; -1 for NULL. */
CT_API int ct_pg_rank(const ct_pg *g); /* -1 for NULL */
/* Number of ranks in g; 0 for NULL. */
CT_API int ct_pg_size(const ct_pg *g); /* 0 for NULL */
/* The transport the group's messages use: "tcp", "shm", "shm+tcp" (rings to the
 * peers on this rank's node, TCP to the others), "none" for a group of one rank
 * (static strings); NULL for NULL. Sub-groups use their parent's. */
CT_API const char *ct_pg_transport(const ct_pg *g);

/* What this rank's links carry, per kind: how many peers it reaches over shared-memory
 * rings and over TCP, and the payload bytes it has sent to them since the transport
 * was made (message payloads handed to the transport, headers not counted; on "shm"
 * also the direct allreduce's input put in shared memory for the peers). Counted per
 * transport, which a world group shares with its sub-groups: the figures cover all of
 * them. A group of one rank: all zero. */
typedef struct ct_pg_link_stats {
    int shm_peers, tcp_peers;
    int64_t shm_bytes, tcp_bytes;
} ct_pg_link_stats;

/* Fills *out with what this rank's links carry (peers and payload bytes per kind,
 * ct_pg_link_stats above); CT_ERR_INVALID for NULL arguments. */
CT_API ct_status ct_pg_link_stats_get(const ct_pg *g, ct_pg_link_stats *out);
/* Bytes this rank has sent on g since it was made, as ring algorithms send them,
 * counted per collective when it is submitted from its size S bytes and the group's n
 * ranks: allreduce 2 (n-1)/n S, reduce-scatter (n-1)/n S (S the input), allgather
 * and all-to-all (n-1)/n of the gathered whole, broadcast, reduce, gather, scatter
 * and send S, receive and barrier 0. A group of one rank sends nothing. 0 for NULL. */
CT_API double ct_pg_bytes_sent(const ct_pg *g);

/* Each returns a new work, owned by the caller (ct_work_free), or NULL with the
 * error set. In-place variants overwrite t; out-of-place ones read in and write out
 * (they may be the same tensor where the sizes allow). */
CT_API ct_work *ct_pg_allreduce(ct_pg *g, ct_tensor *t, ct_reduce_op op);
CT_API ct_work *ct_pg_allreduce_out(ct_pg *g, ct_tensor *out, const ct_tensor *in, ct_reduce_op op);
/* in: size * numel(out) elements; rank r gets the reduction of block r */
CT_API ct_work *ct_pg_reduce_scatter(ct_pg *g, ct_tensor *out, const ct_tensor *in, ct_reduce_op op);
/* The same, with in given up: the reduction may run in in's memory (its contents are
 * then unspecified), which saves a copy of in (f32, f64, i32, i64; 16-bit inputs are
 * widened into a buffer of their own anyway). */
CT_API ct_work *ct_pg_reduce_scatter_consume(ct_pg *g, ct_tensor *out, ct_tensor *in, ct_reduce_op op);
/* out: size * numel(in) elements; block r is rank r's in */
CT_API ct_work *ct_pg_allgather(ct_pg *g, ct_tensor *out, const ct_tensor *in);
/* Copies root's t into t on every rank. */
CT_API ct_work *ct_pg_broadcast(ct_pg *g, ct_tensor *t, int root);
/* the reduction lands in root's t; the other ranks' t are left unchanged */
CT_API ct_work *ct_pg_reduce(ct_pg *g, ct_tensor *t, int root, ct_reduce_op op);
/* out (size * numel(in)) is used on root only (NULL elsewhere is fine) */
CT_API ct_work *ct_pg_gather(ct_pg *g, ct_tensor *out, const ct_tensor *in, int root);
/* in (size * numel(out)) is used on root only (NULL elsewhere is fine) */
CT_API ct_work *ct_pg_scatter(ct_pg *g, ct_tensor *out, const ct_tensor *in, int root);
/* in and out: size blocks of equal length; block j of in goes to rank j, block i of
 * out comes from rank i */
CT_API ct_work *ct_pg_all_to_all(ct_pg *g, ct_tensor *out, const ct_tensor *in);
/* Completes once every rank of g has entered it. */
CT_API ct_work *ct_pg_barrier(ct_pg *g);
/* Point to point: the n-th send from a to b with a tag meets the n-th recv on b from
 * a with that tag; dtype and element count must match. They do not take part in the
 * collectives' ordering, so they may be interleaved with collectives freely. */
CT_API ct_work *ct_pg_send(ct_pg *g, const ct_tensor *t, int dst, int tag);
CT_API ct_work *ct_pg_recv(ct_pg *g, ct_tensor *t, int src, int tag);

/* Fails the group's pending works ("the group was freed"), tells the group's other
 * ranks that this one leaves (their collectives that still wait for data from it
 * fail; the others complete), releases its share of the connections (closed with the
 * last group using them) and stops the communication thread with the last group of
 * the process. Sub-groups may be freed before or after their parent. Works stay valid
 * until ct_work_free. NULL is a no-op. */
CT_API void ct_pg_free(ct_pg *g);

/* "sum", "avg", "max", "min"; "invalid" otherwise. */
CT_API const char *ct_reduce_op_name(ct_reduce_op op);

#endif
