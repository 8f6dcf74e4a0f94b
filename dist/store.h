/* ctrain — the rendezvous store: a TCP key-value store served by rank 0.
 *
 *     ct_dist_env env;
 *     ct_dist_env_detect(&env);
 *     ct_store *s = ct_store_new(&(ct_store_config){
 *         .host = env.master_addr, .port = env.master_port, .serve = env.rank == 0,
 *         .world_size = env.world_size, .rank = env.rank, .timeout_s = env.timeout_s});
 *     if (!s) fail(ct_last_error());
 *     ct_store_set(s, "addr/3", buf, n);            every rank publishes ...
 *     ct_store_get(s, "addr/0", 0, &val, &len);     ... and reads what others published
 *     ct_store_barrier(s, "init", 0);
 *     ct_store_free(s);
 *
 * The handle that serves (rank 0) runs the server on a libuv loop on a thread of its
 * own and is also a client of it; every handle talks to the server over one TCP
 * connection. Keys are byte strings of 1..CT_STORE_MAX_KEY bytes, values of
 * 0..CT_STORE_MAX_VALUE bytes; keys are never deleted, a set replaces the value.
 *
 * Waiting. get and wait block until the keys exist; the server parks the request
 * and answers it when another client sets the key, or when the timeout expires.
 * A timeout_s <= 0 means the handle's default (ct_store_config.timeout_s, itself
 * 300 s when <= 0).
 *
 * Jobs. The serving handle records its job's id under "ct/job"; every handle reads it
 * when it connects and refuses a store of another job (CT_ERR_PEER: "the store at
 * 127.0.0.1:29500 belongs to another job ..."), so two jobs that share a port fail
 * clearly, and the job that owns the store is not disturbed. Jobs without an id on
 * either side are not told apart.
 *
 * Tokens. Every connection first presents the job's token (ct_store_config.token, else
 * CTRAIN_STORE_TOKEN, which ctrain launch sets to a random one per job); the server
 * admits a connection only when the token equals its own ("" on both sides when no
 * token is set: ranks started by hand need none). A connection that sends anything
 * else first, or another token, is closed and logged on stderr ("ctrain: store on
 * port 29500: refused a connection from 10.0.0.7:51234: wrong token"); the server
 * serves on. A handle whose token is refused keeps retrying until its timeout (a
 * previous job's store may still hold the port), then fails with CT_ERR_PEER.
 *
 * Failures, all bounded in time:
 *   - the master cannot be reached within the timeout: CT_ERR_TIMEOUT naming
 *     host:port (clients retry connecting until then, so ranks may start in any order);
 *   - a key or a barrier's rank does not arrive in time: CT_ERR_TIMEOUT naming the
 *     missing keys or ranks;
 *   - the connection breaks (the master died): CT_ERR_PEER naming the address; the
 *     server stops answering: CT_ERR_TIMEOUT. After either the handle is broken and
 *     every later call fails at once with the same error.
 *
 * Thread-safety: a handle may be used from several threads; its requests are
 * serialised (a blocking get holds the handle until answered; use a second handle
 * for concurrent waits). ct_store_free must not overlap other calls on the handle.
 * Distinct handles are independent. A process that forks
 * must create its handles after the fork: the server's thread does not survive it.
 */
#ifndef CT_DIST_STORE_H
#define CT_DIST_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/api.h"
#include "core/error.h"

#define CT_STORE_MAX_KEY 1024                  /* bytes */
#define CT_STORE_MAX_VALUE (64u * 1024 * 1024) /* bytes */
#define CT_STORE_MAX_WAIT_KEYS 4096            /* keys in one ct_store_wait */
#define CT_STORE_DEFAULT_TIMEOUT_S 300.0
#define CT_STORE_MAX_TOKEN 256 /* bytes */

typedef struct ct_store ct_store;

/* Zero means default for every field. */
typedef struct ct_store_config {
    const char *host; /* the master's address or host name; default "127.0.0.1" */
    int port;         /* 0..65535; 0 only with serve (any free port: ct_store_port) */
    bool serve;       /* start the server here (rank 0), then connect to it */
    int world_size;   /* ranks taking part in barriers; default 1 */
    int rank;         /* this handle's rank in barriers, 0 .. world_size - 1 */
    double timeout_s; /* connect and default wait timeout; <= 0: 300 s */
    const char *job;  /* this job's id; NULL: ct_dist_job_id() (dist/env.h) */
    const char *token; /* this job's token, 0..CT_STORE_MAX_TOKEN bytes; NULL: ct_dist_store_token() */
    const char *server; /* who serves it, as errors name it ("machine rank 0's launcher");
                         * NULL: "the master" (rank 0) */
} ct_store_config;

/* Starts the server when cfg->serve (binding cfg->host: an IP address is bound as
 * given, a host name binds every interface, "localhost" the loopback), then connects,
 * retrying until the timeout. New handle, owned by the caller (ct_store_free);
 * NULL on failure with ct_last_error() set. */
CT_API ct_store *ct_store_new(const ct_store_config *cfg);

/* The server's port: the bound one for the serving handle (useful with port 0),
 * else the configured one. */
CT_API int ct_store_port(const ct_store *s);

/* Stores n bytes under key (replacing any value) and wakes requests waiting on it. */
CT_API ct_status ct_store_set(ct_store *s, const char *key, const void *val, size_t n);

/* Waits until key exists, then *val = a copy of its value (malloc'd, owned by the
 * caller, followed by a NUL byte not counted in *n so text can be used as is).
 * CT_ERR_TIMEOUT when the key is not set within timeout_s. */
CT_API ct_status ct_store_get(ct_store *s, const char *key, double timeout_s, void **val, size_t *n);

/* Atomically adds delta to the counter under key (a missing key counts as 0) and
 * sets *result (may be NULL) to the new value. Counters are stored as decimal text
 * ("12"), so ct_store_get reads them; adding to a non-integer value is CT_ERR_INVALID. */
CT_API ct_status ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *result);

/* Waits until every key exists (1..CT_STORE_MAX_WAIT_KEYS keys). CT_ERR_TIMEOUT
 * names the keys still missing. */
CT_API ct_status ct_store_wait(ct_store *s, const char *const *keys, int nkeys, double timeout_s);

/* Returns when all world_size ranks have called it with the same name (the n-th call
 * with a name meets the n-th call of every other rank). CT_ERR_TIMEOUT names the ranks
 * that did not arrive ("barrier 'init': ranks 2, 3 of 4 did not arrive within 5 s"). */
CT_API ct_status ct_store_barrier(ct_store *s, const char *name, double timeout_s);

/* Closes the connection; the serving handle also stops the loop thread, closes every
 * client's connection and frees the data. NULL is a no-op. */
CT_API void ct_store_free(ct_store *s);

#endif
