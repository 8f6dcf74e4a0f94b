/* ctrain — where this process sits in a distributed job, read from its environment.
 *
 *     ct_dist_env env;
 *     if (ct_dist_env_detect(&env)) fail(ct_last_error());
 *     printf("rank %d of %d (%s)\n", env.rank, env.world_size, env.source);
 *
 * The rules, first match wins (details and examples in docs/maintainers/dist.md):
 *   1. "launcher": RANK and WORLD_SIZE (set by `ctrain launch` and torchrun);
 *      LOCAL_RANK defaults to RANK, LOCAL_WORLD_SIZE to WORLD_SIZE, MASTER_ADDR to
 *      127.0.0.1, MASTER_PORT to 29500.
 *   2. "mpirun": OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (Open MPI);
 *      MASTER_ADDR/MASTER_PORT if set, else 127.0.0.1 when every rank is on this
 *      node; across nodes MASTER_ADDR must be exported.
 *   3. "slurm": SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the node's task count
 *      from SLURM_TASKS_PER_NODE (or SLURM_NTASKS_PER_NODE) and SLURM_NODEID;
 *      the master is MASTER_ADDR, else the first host of SLURM_JOB_NODELIST.
 *   4. "single": nothing set; rank 0 of 1 on 127.0.0.1:29500.
 * timeout_s is CTRAIN_TIMEOUT (seconds, > 0, may be fractional), else 300.
 *
 * A value that is set but unusable (not a number, negative, rank >= world size,
 * a port outside 0..65535, a malformed Slurm node list) is an error naming the
 * variable and its value; so is half of a rule's pair (RANK without WORLD_SIZE),
 * since running alone when a launcher meant otherwise would hang the other ranks.
 *
 * Thread-safety: reads the environment with getenv; do not call it while another
 * thread changes the environment.
 */
#ifndef CT_DIST_ENV_H
#define CT_DIST_ENV_H

#include "core/api.h"
#include "core/error.h"

#define CT_DIST_DEFAULT_PORT 29500
#define CT_DIST_DEFAULT_TIMEOUT_S 300.0

typedef struct ct_dist_env {
    int rank, world_size;             /* 0 <= rank < world_size */
    int local_rank, local_world_size; /* this node's share: 0 <= local_rank < local_world_size */
    char master_addr[256];            /* host name or address of rank 0's store */
    int master_port;                  /* 0 .. 65535 (0: the server picks one) */
    double timeout_s;                 /* for rendezvous and collectives */
    const char *source;               /* "launcher", "mpirun", "slurm" or "single"; static */
} ct_dist_env;

/* Fills *out from the process environment by the rules above. On error *out is
 * untouched and the message names the variable and its value. */
CT_API ct_status ct_dist_env_detect(ct_dist_env *out);

/* The first host of a Slurm host list ("node[01-04,07],gpu5" -> "node01"), after
 * checking the whole list's syntax. Writes at most cap bytes (NUL included).
 * CT_ERR_INVALID when the list is malformed or the host does not fit. */
CT_API ct_status ct_dist_nodelist_first(const char *nodelist, char *host, size_t cap);

/* *out = the integer in environment variable var (decimal digits only, >= min), or
 * dflt when it is unset or empty. CT_ERR_INVALID naming the variable and its value
 * otherwise ("CTRAIN_X='two' is not an integer >= 1"; callers prefix their name). */
CT_API ct_status ct_dist_env_int(const char *var, int dflt, int min, int *out);

/* This job's id, to tell it from another job that happens to use the same
 * MASTER_ADDR:MASTER_PORT: CTRAIN_JOB_ID (ctrain launch sets a random one), else
 * SLURM_JOB_ID.SLURM_STEP_ID, else PMIX_NAMESPACE (mpirun); "" when none is known.
 * Static storage, valid until the next call. */
CT_API const char *ct_dist_job_id(void);

/* The token this job's store and transports admit (dist/store.h): CTRAIN_STORE_TOKEN,
 * set by ctrain launch; "" when unset (no token required). Static storage, valid until
 * the next call; a value longer than CT_STORE_MAX_TOKEN is refused by ct_store_new. */
CT_API const char *ct_dist_store_token(void);

#endif
