/* ctrain — transports: how the comm engine (dist/comm.c) moves framed messages
 * between the ranks of a job.
 *
 * A transport connects one rank to every other rank of a world (its "peers",
 * numbered 0 .. size-1 as the ranks of the group that created it) and then, on the
 * comm thread's libuv loop, sends and receives messages: a fixed header (ct_msg)
 * followed by `len` payload bytes. Messages from one peer arrive in the order that
 * peer sent them. Two are built: TCP (dist/tcp_setup.c, dist/tcp.c) and shared-memory
 * rings for ranks on one node (dist/shm_setup.c, dist/shm.c); a third, "shm+tcp"
 * (dist/mux.c), routes each peer to one of them when some peers share this rank's
 * node and others do not. A transport may serve only some of the world's ranks
 * ("its" peers): it is never asked to send to the others and reports nothing about
 * them. NCCL will fit behind the
 * same operations: the setup is each transport's own (store exchange of addresses,
 * segment names or the NCCL unique id) and the loop side only needs
 * "send this", "here is a header, where does its payload go", "it arrived" and
 * "this peer is gone".
 *
 * Ownership and threads. A transport is created by the caller's thread (which
 * blocks during the setup), then handed to the loop with start; from then on every
 * operation except free runs on the loop thread. close stops everything (pending
 * sends complete with UV_ECANCELED) and reports when it is done; free comes after.
 *
 * Message header, 56 bytes, little-endian (docs/maintainers/comm.md):
 *   0 magic "CTCM" | 4 version | 5 kind | 6 op | 7 reduce op | 8 dtype | 9 algorithm
 *   10 status | 11 zero | 12 root (p2p: tag) | 16 group id | 24 sequence number
 *   32 element count | 40 step | 44 chunk | 48 payload length | 52 zero
 */
#ifndef CT_DIST_TRANSPORT_H
#define CT_DIST_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/error.h"
#include "dist/store.h"

#define CT_MSG_MAGIC "CTCM"
#define CT_MSG_VERSION 1
#define CT_MSG_HEADER 56
/* No message is larger (transfers are chunked well below it); a header claiming
 * more is corrupt. */
#define CT_MSG_MAX_PAYLOAD (256u << 20)

typedef enum ct_msg_kind {
    CT_MSG_COLL = 1,    /* a piece of a collective: group, seq, signature, step, chunk */
    CT_MSG_P2P = 2,     /* a piece of a send: seq counts sends per (pair, tag); root = tag */
    CT_MSG_ABORT = 3,   /* the group failed: status, payload = the message text */
    CT_MSG_PROBE = 4,   /* a timing-out rank asks how far the peer got in the group */
    CT_MSG_PROBE_REPLY = 5,
    CT_MSG_BYE = 6,     /* the sender freed the group: it sends nothing more for it */
} ct_msg_kind;

typedef struct ct_msg {
    uint8_t kind, op, redop, dtype, algo, status;
    int32_t root;
    uint64_t group, seq;
    int64_t count;
    uint32_t step, chunk, len;
} ct_msg;

static inline void cti_msg_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static inline uint64_t cti_msg_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static inline void cti_msg_encode(uint8_t out[CT_MSG_HEADER], const ct_msg *m)
{
    memset(out, 0, CT_MSG_HEADER);
    memcpy(out, CT_MSG_MAGIC, 4);
    out[4] = CT_MSG_VERSION;
    out[5] = m->kind;
    out[6] = m->op;
    out[7] = m->redop;
    out[8] = m->dtype;
    out[9] = m->algo;
    out[10] = m->status;
    cti_msg_put(out + 12, (uint32_t)m->root, 4);
    cti_msg_put(out + 16, m->group, 8);
    cti_msg_put(out + 24, m->seq, 8);
    cti_msg_put(out + 32, (uint64_t)m->count, 8);
    cti_msg_put(out + 40, m->step, 4);
    cti_msg_put(out + 44, m->chunk, 4);
    cti_msg_put(out + 48, m->len, 4);
}

/* false, with the reason in why, when the bytes are not a header of this version. */
static inline bool cti_msg_decode(const uint8_t in[CT_MSG_HEADER], ct_msg *m, char *why, size_t cap)
{
    if (memcmp(in, CT_MSG_MAGIC, 4)) {
        char shown[20];
        for (int i = 0; i < 4; i++) shown[i] = in[i] >= 0x20 && in[i] < 0x7f ? (char)in[i] : '?';
        shown[4] = '\0';
        snprintf(why, cap, "bad magic '%s' (%02x %02x %02x %02x), not a ctrain comm frame", shown, in[0], in[1],
                 in[2], in[3]);
        return false;
    }
    if (in[4] != CT_MSG_VERSION) {
        snprintf(why, cap, "protocol version %d, this rank speaks %d (mixed ctrain versions?)", in[4],
                 CT_MSG_VERSION);
        return false;
    }
    if (in[11] || cti_msg_get(in + 52, 4)) {
        snprintf(why, cap, "reserved header bytes are not zero");
        return false;
    }
    m->kind = in[5];
    m->op = in[6];
    m->redop = in[7];
    m->dtype = in[8];
    m->algo = in[9];
    m->status = in[10];
    m->root = (int32_t)(uint32_t)cti_msg_get(in + 12, 4);
    m->group = cti_msg_get(in + 16, 8);
    m->seq = cti_msg_get(in + 24, 8);
    m->count = (int64_t)cti_msg_get(in + 32, 8);
    m->step = (uint32_t)cti_msg_get(in + 40, 4);
    m->chunk = (uint32_t)cti_msg_get(in + 44, 4);
    m->len = (uint32_t)cti_msg_get(in + 48, 4);
    if (m->kind < CT_MSG_COLL || m->kind > CT_MSG_BYE) {
        snprintf(why, cap, "unknown message kind %d", m->kind);
        return false;
    }
    if (m->len > CT_MSG_MAX_PAYLOAD) {
        snprintf(why, cap, "payload length %u exceeds the limit of %u bytes", m->len, CT_MSG_MAX_PAYLOAD);
        return false;
    }
    return true;
}

typedef struct ct_transport ct_transport;
typedef struct ct_link_count ct_link_count;

/* What the transport calls on the loop thread. ctx is the handler's own. */
typedef struct ct_transport_handler {
    void *ctx;
    /* A header arrived from peer. Return 0 with *dest = where its m->len payload
     * bytes go (NULL when m->len is 0); 1 to have the payload read and dropped; -1
     * to close the connection to peer (the handler has already reported why; no
     * on_peer_error follows). */
    int (*on_header)(void *ctx, int peer, const ct_msg *m, void **dest);
    /* The payload announced by the last on_header(…) == 0 from peer is complete at payload. */
    void (*on_message)(void *ctx, int peer, const ct_msg *m, void *payload);
    /* peer is gone: EOF or reset (CT_ERR_PEER) or bytes that are not frames
     * (CT_ERR_FORMAT). msg starts with a verb ("closed the connection ..."), the
     * handler names the rank. Called once per peer; nothing more arrives from it
     * and a payload in progress is abandoned (its buffer is no longer touched). */
    void (*on_peer_error)(void *ctx, int peer, ct_status st, const char *msg);
} ct_transport_handler;

/* The receiving side of one peer's byte stream, shared by the transports: a header is
 * assembled in hdr, decoded, and the handler says where its payload goes (or to drop
 * it); the payload is then copied to dest until m.len bytes have come. */
typedef struct ct_msg_reader {
    uint8_t hdr[CT_MSG_HEADER];
    size_t hdr_got;
    ct_msg m;
    bool in_payload, drop;
    uint8_t *dest;
    size_t got;
} ct_msg_reader;

/* The message in r is complete: hand it to the handler (unless dropped) and wait for
 * the next header. */
static inline void cti_msg_reader_done(ct_msg_reader *r, const ct_transport_handler *h, int peer)
{
    r->in_payload = false;
    r->hdr_got = 0;
    if (!r->drop) h->on_message(h->ctx, peer, &r->m, r->dest);
}

/* A whole header is in r->hdr: decodes it and asks h where its payload goes; a message
 * without payload is delivered at once. 0, or -1 with the reason in why (not a frame of
 * this protocol), or -2 (the handler refused the connection). */
static inline int cti_msg_reader_header(ct_msg_reader *r, const ct_transport_handler *h, int peer, char *why,
                                        size_t cap)
{
    if (!cti_msg_decode(r->hdr, &r->m, why, cap)) return -1;
    void *dest = NULL;
    int rc = h->on_header(h->ctx, peer, &r->m, &dest);
    if (rc < 0) return -2;
    r->drop = rc > 0;
    r->dest = dest;
    r->got = 0;
    r->in_payload = true;
    CT_ASSERT(r->drop || dest || r->m.len == 0);
    if (r->m.len == 0) cti_msg_reader_done(r, h, peer);
    return 0;
}

/* A send completed: status 0, or a libuv error (UV_ECANCELED when the transport
 * closed first). Runs on the loop thread, never inside the send call. */
typedef void (*ct_transport_send_cb)(void *arg, int status);

typedef struct ct_transport_ops {
    const char *name;
    /* Starts receiving on loop; the handler must stay valid until closed. */
    ct_status (*start)(ct_transport *t, uv_loop_t *loop, const ct_transport_handler *h);
    /* Queues the header and len payload bytes for peer. Without copy the payload is
     * read in place until cb runs (the caller keeps it alive and unchanged); with
     * copy it is copied first. Non-zero (cb will not run) when peer is gone. */
    ct_status (*send)(ct_transport *t, int peer, const ct_msg *m, const void *payload, bool copy,
                      ct_transport_send_cb cb, void *arg);
    /* Closes every connection; closed(t, arg) runs on the loop once they are shut. */
    void (*close)(ct_transport *t, void (*closed)(ct_transport *t, void *arg), void *arg);
    /* Frees a transport never started, or closed. */
    void (*free)(ct_transport *t);
    /* Adds this transport's peers and the payload bytes sent to them so far to out
     * (any thread: the counters are atomic). */
    void (*stats)(const ct_transport *t, ct_link_count *out);
} ct_transport_ops;

/* Per kind of link (shared memory, TCP): how many peers, payload bytes sent. */
enum { CT_LINK_SHM = 0, CT_LINK_TCP = 1, CT_LINK_KINDS = 2 };
typedef struct ct_link_count {
    int peers[CT_LINK_KINDS];
    int64_t bytes[CT_LINK_KINDS];
} ct_link_count;

#define CT_PEER_WHERE 400 /* bytes of a peer's "ip, host name": 127 + 7 + 255 and the NUL */

struct ct_transport {
    const ct_transport_ops *ops;
    int rank, size;
    /* where[p]: "10.0.0.3, host node1", peer p's published address and host name, for
     * messages that name a lost peer's node; NULL when not known (a transport made
     * without cti_transport_select). Owned by the transport (cti_transport_base_free). */
    char (*where)[CT_PEER_WHERE];
};

/* What the ops' free must release of the base. */
static inline void cti_transport_base_free(ct_transport *t)
{
    free(t->where);
    t->where = NULL;
}

/* Peer p's node for a message: "10.0.0.3, host node1"; "" when unknown. */
static inline const char *cti_transport_where(const ct_transport *t, int p)
{
    return t && t->where && p >= 0 && p < t->size ? t->where[p] : "";
}

/* Everything a transport's setup needs: the rendezvous store, a key prefix unique
 * to this group's creation, the ranks, the deadline and the master's address (used
 * to choose the interface to advertise). */
typedef struct ct_transport_setup {
    ct_store *store;
    const char *prefix;
    int rank, size;
    double timeout_s;
    const char *master_addr;
} ct_transport_setup;

/* TCP (dist/tcp.c): every rank listens on a port (ephemeral, or from
 * CTRAIN_PORT_RANGE) of every interface, publishes "ip port" under <prefix>/addr/<rank>, connects to
 * the lower ranks and accepts the higher ones, each connection opened by a hello
 * that carries a per-group nonce. New transport owned by the caller; NULL with the
 * error set (names the peer and address) on failure or when the deadline passes. */
ct_transport *cti_tcp_transport_new(const ct_transport_setup *s);

/* The composite transport (dist/mux.c): peer p goes to shm when use_shm[p], else to
 * tcp. Both must serve exactly those peers; takes them (also on failure: NULL, error
 * set) and copies use_shm. */
ct_transport *cti_mux_transport_new(int rank, int size, ct_transport *shm, ct_transport *tcp, const bool *use_shm);

#endif
