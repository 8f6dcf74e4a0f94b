/* Direct allreduce over shared memory: the caller's thread reduces through per-rank
 * slots, with no comm-thread hop, no message framing and no socket wake-up while the
 * ranks are all there. The design and its measurements are in
 * docs/maintainers/comm.md, "Direct allreduce".
 *
 * Every rank of a world on one host owns one slot segment (made with the rings by
 * dist/shm_setup.c, /ctrain-<job>-<r>-<r>): a control block and two data buffers of
 * `slot` bytes. The control block holds
 *   - the signature history: the signature of collective s (every collective of the
 *     world group, direct or not) at hist[s % CT_DIRECT_HIST], then seq = s
 *     (release). A rank about to run a direct allreduce compares every peer's entry
 *     for its number with its own: a desync is found before any data moves;
 *   - three chunk counters, monotonic over the group's life: posted (this rank's
 *     input of chunk k is in its buffer k % 2), reduced (its segment of chunk k is
 *     reduced, in place in that buffer), consumed (it has copied every segment of
 *     chunk k out, so chunk k's buffers may be reused by chunk k + 2).
 *
 * Chunk k of an allreduce of n ranks (elements [e0, e0 + m)) is cut into n segments
 * equal to within one element (cti_comm_part_lo); rank r owns segment r:
 *   1. wait until every rank's consumed >= k - 1 (its buffer k % 2 is free);
 *      copy the input's chunk into the own buffer; posted = k + 1;
 *   2. wait until every rank's posted >= k + 1; reduce segment r over the ranks'
 *      buffers in rank order 0 .. n-1 (in f32 for bf16/f16), write it over the own
 *      buffer's segment r (no other rank reads that one) and the output; reduced = k + 1;
 *   3. wait until every rank's reduced >= k + 1; copy every other segment q from rank
 *      q's buffer into the output; consumed = k + 1.
 * Every segment is reduced once, by its owner, in rank order: every rank gets the same
 * bits. User memory is read once and written once; the buffers stay in cache.
 *
 * Waiting spins (the ranks are usually there within microseconds), then sleeps on a
 * futex in rank 0's control block (a poster wakes it only when somebody sleeps, by
 * the same store/load ordering as the rings' doorbells); it wakes at least every
 * CT_DIRECT_NAP_MS to look at the group's failure flags (a dead peer, found by the
 * comm thread through the pair's connection; a rank that freed the group) and the
 * deadline.
 */
#ifndef CT_DIST_SHM_DIRECT_INTERNAL_H
#define CT_DIST_SHM_DIRECT_INTERNAL_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define CT_DIRECT_HIST 64                      /* signatures kept per rank */
#define CT_DIRECT_CTL_OFFSET 512u              /* the control block, in the segment's first page */
#define CT_DIRECT_SLOT_BYTES (1u << 20)        /* default bytes per buffer (CTRAIN_SHM_SLOT_BYTES) */
#define CT_DIRECT_SLOT_MIN 256u
#define CT_DIRECT_SLOT_MAX (64u << 20)
#define CT_DIRECT_NAP_MS 20

/* One signature: (seq, count, op | rop << 8 | dtype << 16 | direct << 24 | root << 32). */
typedef struct ct_direct_sig {
    _Atomic uint64_t seq, count, word;
} ct_direct_sig;

typedef struct ct_direct_ctl {
    alignas(64) _Atomic uint64_t seq; /* the last collective whose signature is in hist */
    alignas(64) _Atomic uint64_t posted;
    alignas(64) _Atomic uint64_t reduced;
    alignas(64) _Atomic uint64_t consumed;
    alignas(64) _Atomic uint32_t bell; /* rank 0's: the futex word */
    _Atomic uint32_t sleepers;         /* rank 0's: ranks asleep on bell */
    _Atomic uint32_t mode;             /* 1: this rank runs allreduce directly; 2: on the comm thread */
    alignas(64) ct_direct_sig hist[CT_DIRECT_HIST];
} ct_direct_ctl;

_Static_assert(CT_DIRECT_CTL_OFFSET + sizeof(ct_direct_ctl) <= 4096, "the control block fits the first page");

typedef struct ct_shm_direct ct_shm_direct;
typedef struct ct_work ct_work;
typedef struct ct_comm_group ct_comm_group;

/* Over the mapped slot segments segs[0..size-1] (each 4096 + 2 * slot bytes; the
 * caller keeps them mapped for the handle's life). spin_s: how long a waiting rank
 * polls before it sleeps; negative: 1 ms when every rank can have a core, else 0.
 * NULL with the error set. */
ct_shm_direct *cti_shm_direct_new(int rank, int size, void *const *segs, size_t slot, double spin_s);
void cti_shm_direct_free(ct_shm_direct *d);
/* Bytes this rank has put in its slot for the others to read (its input of every
 * direct allreduce); any thread. */
int64_t cti_shm_direct_bytes(const ct_shm_direct *d);
/* The slot segment's size for slot bytes per buffer. */
size_t cti_shm_direct_seg_bytes(size_t slot);

/* Publishes this rank's mode (before the group's init check) and, after it, compares
 * every rank's: an error naming the ranks that differ. */
void cti_shm_direct_set_mode(ct_shm_direct *d, bool direct);
ct_status cti_shm_direct_check_modes(const ct_shm_direct *d);

/* Publishes the signature of collective w (any op) as this rank's latest. */
void cti_shm_direct_announce(ct_shm_direct *d, const ct_work *w, bool direct);

/* Runs allreduce w to the end on the caller's thread (w's request filled in,
 * announced; this rank's earlier collectives of the group complete) and completes w,
 * with success or a failure (which also fails the group on every rank). grp supplies
 * the failure flags and the group timeout; w->deadline (the absolute uv_hrtime time
 * in seconds) bounds the wait for the other ranks to call it, and the group timeout
 * after that the rest. */
void cti_shm_direct_allreduce(ct_shm_direct *d, ct_comm_group *grp, ct_work *w);

#endif
