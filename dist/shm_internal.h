/* The shared-memory transport: between its setup (dist/shm_setup.c, the caller's
 * thread) and its loop side (dist/shm.c), and the transport choice used by
 * dist/pg.c.
 *
 * A segment carries one direction of one pair of ranks, a -> b: a control page
 * (ct_shm_ring) and `capacity` data bytes used as a byte ring, written only by a
 * (the producer) and read only by b (the consumer). head and tail count bytes since
 * the start and never wrap (2^64 bytes); byte i lives at data[i % capacity]. The
 * producer writes bytes, then publishes head (release); the consumer reads
 * head (acquire), copies the bytes out, then publishes tail (release). The stream in
 * the ring is exactly the TCP transport's: 56-byte headers each followed by its
 * payload, cut anywhere by the ring's edge and its free space.
 *
 * Sleeping. The consumer that finds the ring empty sets rx_sleep and looks again;
 * the producer, after publishing head, rings the doorbell (one byte on the pair's
 * TCP connection) only when it takes rx_sleep from 1 to 0. The producer that finds
 * no space sets tx_sleep; the consumer, after publishing tail, rings when it takes
 * tx_sleep from 1 to 0. Both sides order "store flag; load counter" against "store
 * counter; load flag" with sequentially consistent fences, so at least one of them
 * sees the other: nobody sleeps on bytes or space that are already there.
 */
#ifndef CT_DIST_SHM_INTERNAL_H
#define CT_DIST_SHM_INTERNAL_H

#include <stdalign.h>
#include <stdatomic.h>

#include "dist/transport_internal.h"

#define CT_SHM_MAGIC 0x4d485354u /* "TSHM" */
#define CT_SHM_VERSION 1u
#define CT_SHM_CTL_BYTES 4096u              /* the control page before the data */
#define CT_SHM_RING_BYTES (4u << 20)        /* default data bytes per direction */
#define CT_SHM_RING_MIN 64u                 /* CTRAIN_SHM_RING_BYTES bounds */
#define CT_SHM_RING_MAX (1u << 30)

typedef struct ct_shm_ring {
    uint32_t magic, version; /* written by the producer before the consumer maps it */
    uint64_t capacity;
    alignas(64) _Atomic uint64_t head; /* bytes written: the producer's */
    alignas(64) _Atomic uint64_t tail; /* bytes read: the consumer's */
    alignas(64) _Atomic uint32_t rx_sleep; /* the consumer looks again only when rung */
    _Atomic uint32_t tx_sleep;             /* the producer waits for space */
} ct_shm_ring;

_Static_assert(sizeof(ct_shm_ring) <= CT_SHM_CTL_BYTES, "the ring's control block fits its page");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "atomics shared between processes must be lock-free");

/* The loop side over set-up segments. fds[p]: the TCP connection to rank p (the
 * doorbell; -1 at rank); tx[p], rx[p]: the mapped segments rank -> p and p -> rank,
 * each CT_SHM_CTL_BYTES + capacity bytes (NULL at rank, and both NULL with fds[p] -1
 * for a peer on another node: not this transport's); slots[q]: rank q's
 * direct-allreduce segment (dist/shm_direct_internal.h; capacity 2 * slot; spin_s as in
 * cti_shm_direct_new), or slots NULL for no direct allreduce (a transport that serves
 * only some of the ranks). Takes all of them
 * (malloc'd arrays, sockets, mappings), also on failure (NULL, error set). */
ct_transport *cti_shm_transport_wrap(int rank, int size, int *fds, ct_shm_ring **tx, ct_shm_ring **rx,
                                     ct_shm_ring **slots, size_t slot, double spin_s);

/* The direct allreduce over the slots of an shm transport (owned by it); NULL for
 * another transport. */
struct ct_shm_direct *cti_shm_transport_direct(ct_transport *t);

/* Sets up the transport that want names: "tcp", "shm", or "auto" ("shm" when every
 * rank runs on this node and asked for "auto" or "shm" and the segments could be
 * made; "shm+tcp" when some ranks share a node and others do not; else "tcp").
 * Publishes "<want> <job id> <node> <host name>" under <prefix>/host/<rank> before
 * the TCP setup (dist/tcp_setup.c), whose connections every transport uses, and
 * decides from every rank's entry after it, so that every rank decides the same.
 * New transport owned by the caller, its where[] filled in; NULL with the error set
 * (a forced "shm" across nodes names the ranks elsewhere; disagreeing ranks are
 * named). */
ct_transport *cti_transport_select(const ct_transport_setup *s, const char *want);

#endif
