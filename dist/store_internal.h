/* The store's wire format, shared by the server (dist/store_server.c) and the
 * client (dist/store.c). The format is documented in docs/maintainers/dist.md.
 *
 * Every message, request or reply, is one frame: a 12-byte header, then
 * body_len bytes. All integers are little-endian.
 *
 *   offset size  request                       reply
 *   0      4     magic "CTKV"                  magic "CTKV"
 *   4      1     version (1)                   version (1)
 *   5      1     op (CT_WIRE_SET ...)          status (CT_WIRE_OK ...)
 *   6      2     nkeys                         0
 *   8      4     body_len                      body_len
 *   12     ...   nkeys x {u32 len, key bytes}, then the value (the rest of the body)
 *
 * A connection's first frame is a HELLO carrying the job's token (see store.h); the
 * server answers OK, or ERROR and closes, before it reads anything else.
 */
#ifndef CT_DIST_STORE_INTERNAL_H
#define CT_DIST_STORE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "dist/store.h"

#define CT_WIRE_MAGIC "CTKV"
#define CT_WIRE_VERSION 1
#define CT_WIRE_HEADER 12

/* request ops */
enum {
    CT_WIRE_SET = 1,  /* 1 key; value = the bytes to store */
    CT_WIRE_GET = 2,  /* 1 key; value = u64 timeout in ms. Reply: the value */
    CT_WIRE_ADD = 3,  /* 1 key; value = i64 delta. Reply: i64 new value */
    CT_WIRE_WAIT = 4, /* 1..CT_STORE_MAX_WAIT_KEYS keys; value = u64 timeout in ms */
    CT_WIRE_HELLO = 5, /* 0 keys; value = the token, 0..CT_STORE_MAX_TOKEN bytes; first and only once */
};

/* reply statuses */
enum {
    CT_WIRE_OK = 0,
    CT_WIRE_TIMEOUT = 1, /* GET: empty body; WAIT: u32 indices of the keys still missing */
    CT_WIRE_ERROR = 2,   /* body: a message (UTF-8, no NUL) */
};

/* The largest body a request with nkeys keys may have; a header claiming more is
 * a foreign or broken peer and its connection is closed. */
static inline uint64_t cti_wire_body_limit(unsigned nkeys)
{
    return (uint64_t)nkeys * (4 + CT_STORE_MAX_KEY) + CT_STORE_MAX_VALUE;
}

/* Replies carry at most a value, or one index per waited key. */
#define CT_WIRE_REPLY_LIMIT ((uint64_t)CT_STORE_MAX_VALUE + 4u * CT_STORE_MAX_WAIT_KEYS)

static inline void cti_wire_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void cti_wire_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static inline void cti_wire_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static inline uint16_t cti_wire_get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline uint32_t cti_wire_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t cti_wire_get64(const uint8_t *p)
{
    return (uint64_t)cti_wire_get32(p) | (uint64_t)cti_wire_get32(p + 4) << 32;
}

static inline void cti_wire_header(uint8_t *h, uint8_t op, uint16_t nkeys, uint32_t body_len)
{
    memcpy(h, CT_WIRE_MAGIC, 4);
    h[4] = CT_WIRE_VERSION;
    h[5] = op;
    cti_wire_put16(h + 6, nkeys);
    cti_wire_put32(h + 8, body_len);
}

/* ---- the server's table (dist/store_table.c); keys are byte strings -------- */

typedef struct ct_store_entry {
    struct ct_store_entry *next;
    uint64_t hash;
    uint8_t *val; /* malloc'd, owned by the table */
    size_t vlen;
    uint32_t klen;
    uint8_t key[];
} ct_store_entry;

typedef struct ct_store_table {
    ct_store_entry **b;
    size_t nb, n; /* buckets (a power of two), entries */
} ct_store_table;

/* The entry of key k (n bytes), borrowed; NULL when absent. */
ct_store_entry *cti_store_table_find(const ct_store_table *t, const uint8_t *k, uint32_t n);
/* Stores val under k, taking ownership of val (and freeing a replaced value).
 * false on allocation failure, with val still the caller's. */
bool cti_store_table_put(ct_store_table *t, const uint8_t *k, uint32_t n, uint8_t *val, size_t vlen);
/* Frees every entry and value; the table is then empty. */
void cti_store_table_free(ct_store_table *t);

/* ---- the server, run by the handle that serves ----------------------------- */

typedef struct ct_store_server ct_store_server;

/* Binds host:port (port 0: any free port), then serves on a thread of its own,
 * to clients whose HELLO carries token (a copy is kept; "" admits only empty tokens).
 * *bound_port = the port bound. NULL on failure with the error set. */
ct_store_server *cti_store_server_start(const char *host, int port, const char *token, int *bound_port);
/* Stops the loop, closes every connection, frees everything. NULL is a no-op. */
void cti_store_server_stop(ct_store_server *srv);

/* The token this handle presents (its config's, else CTRAIN_STORE_TOKEN); the
 * transports' hellos carry it too. Borrowed, valid while the handle lives. */
const char *cti_store_token(const ct_store *s);

/* Whether two tokens are equal, in a time that does not depend on where they differ. */
static inline bool cti_token_equal(const uint8_t *a, size_t na, const char *b)
{
    size_t nb = strlen(b);
    uint8_t diff = (uint8_t)(na != nb);
    for (size_t i = 0; i < na && i < nb; i++) diff |= (uint8_t)(a[i] ^ (uint8_t)b[i]);
    return !diff;
}

#endif
