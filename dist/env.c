/* Reading a rank's place from launcher, Open MPI or Slurm variables; the rules are
 * in dist/env.h and docs/maintainers/dist.md. An empty variable counts as unset,
 * as `export VAR=` is the usual way a script clears one. */
#include "dist/env.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/store.h"

#define LOOPBACK "127.0.0.1"

static const char *env_get(const char *var)
{
    const char *v = getenv(var);
    return v && *v ? v : NULL;
}

/* ---- numbers ------------------------------------------------------------- */

/* A decimal integer in 0 .. INT_MAX, digits only (no sign, no spaces). */
static bool parse_count(const char *s, int *out)
{
    if (!s || !isdigit((unsigned char)*s)) return false;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end || v > INT_MAX) return false;
    *out = (int)v;
    return true;
}

/* *out = the variable's value; *set says whether it was there. */
static ct_status env_int(const char *var, bool *set, int *out)
{
    const char *v = env_get(var);
    *set = v != NULL;
    if (v && !parse_count(v, out))
        return ct_error_set(CT_ERR_INVALID, "dist env: %s='%s' is not a non-negative integer", var, v);
    return CT_OK;
}

static ct_status env_int_required(const char *var, const char *why, int *out)
{
    bool set;
    if (env_int(var, &set, out)) return CT_ERR_INVALID;
    if (!set) return ct_error_set(CT_ERR_INVALID, "dist env: %s is not set (%s)", var, why);
    return CT_OK;
}

static ct_status env_int_default(const char *var, int dflt, int *out)
{
    bool set;
    if (env_int(var, &set, out)) return CT_ERR_INVALID;
    if (!set) *out = dflt;
    return CT_OK;
}

ct_status ct_dist_env_int(const char *var, int dflt, int min, int *out)
{
    const char *v = env_get(var);
    int x = dflt;
    if (v && (!parse_count(v, &x) || x < min))
        return ct_error_set(CT_ERR_INVALID, "%s='%s' is not an integer >= %d", var, v, min);
    *out = x;
    return CT_OK;
}

/* ---- master address ------------------------------------------------------ */

static ct_status set_addr(ct_dist_env *e, const char *var, const char *addr)
{
    if (strlen(addr) >= sizeof e->master_addr)
        return ct_error_set(CT_ERR_INVALID, "dist env: %s is %zu characters long; host names are at most %zu",
                            var, strlen(addr), sizeof e->master_addr - 1);
    strcpy(e->master_addr, addr);
    return CT_OK;
}

static ct_status read_port(ct_dist_env *e)
{
    const char *v = env_get("MASTER_PORT");
    if (!v) {
        e->master_port = CT_DIST_DEFAULT_PORT;
        return CT_OK;
    }
    int p;
    if (!parse_count(v, &p) || p > 65535)
        return ct_error_set(CT_ERR_INVALID, "dist env: MASTER_PORT='%s' is not a port number in 0..65535", v);
    e->master_port = p;
    return CT_OK;
}

/* ---- Slurm syntax -------------------------------------------------------- */

/* One bracket of a host list, "01-04,07" up to the ']': *first = the first
 * number as written (zero padding kept). Returns the position after ']' or NULL. */
static const char *hostlist_bracket(const char *p, const char **first, size_t *first_len)
{
    *first = NULL;
    for (;;) {
        const char *lo = p;
        while (isdigit((unsigned char)*p)) p++;
        if (p == lo) return NULL;
        if (!*first) {
            *first = lo;
            *first_len = (size_t)(p - lo);
        }
        if (*p == '-') {
            const char *hi = ++p;
            while (isdigit((unsigned char)*p)) p++;
            if (p == hi) return NULL;
            /* lo > hi is a typo Slurm itself rejects */
            if (strtoull(lo, NULL, 10) > strtoull(hi, NULL, 10)) return NULL;
        }
        if (*p == ']') return p + 1;
        if (*p != ',') return NULL;
        p++;
    }
}

ct_status ct_dist_nodelist_first(const char *nodelist, char *host, size_t cap)
{
    if (!nodelist || !*nodelist)
        return ct_error_set(CT_ERR_INVALID, "Slurm node list: empty");
    size_t n = 0;
    bool first_host = true, empty = true, too_long = false;
    for (const char *p = nodelist;;) {
        if (*p == '\0' || *p == ',') {
            if (empty) goto malformed;
            if (!*p) break;
            first_host = false;
            empty = true;
            p++;
            continue;
        }
        const char *piece;
        size_t len;
        if (*p == '[') {
            p = hostlist_bracket(p + 1, &piece, &len);
            if (!p) goto malformed;
        } else if (*p == ']') {
            goto malformed;
        } else {
            piece = p;
            while (*p && *p != ',' && *p != '[' && *p != ']') p++;
            len = (size_t)(p - piece);
        }
        empty = false;
        if (!first_host) continue;
        if (n + len >= cap) {
            too_long = true;
            continue;
        }
        memcpy(host + n, piece, len);
        n += len;
    }
    if (too_long)
        return ct_error_set(CT_ERR_INVALID, "Slurm node list '%s': the first host is longer than %zu characters",
                            nodelist, cap - 1);
    host[n] = '\0';
    return CT_OK;
malformed:
    return ct_error_set(CT_ERR_INVALID,
                        "Slurm node list '%s' is malformed (expected host list syntax like "
                        "'node[01-04,07],gpu5')",
                        nodelist);
}

/* Tasks on node `node` from a Slurm task layout "4", "2(x3)", "2(x3),1" (the whole
 * layout is checked, not just the groups up to this node). */
static ct_status slurm_tasks_on_node(const char *var, const char *v, int node, int *out)
{
    long long seen = 0;
    int found = -1;
    for (const char *p = v;;) {
        char *end;
        if (!isdigit((unsigned char)*p)) goto malformed;
        errno = 0;
        long count = strtol(p, &end, 10), times = 1;
        if (errno || count > INT_MAX) goto malformed;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x' || !isdigit((unsigned char)p[2])) goto malformed;
            times = strtol(p + 2, &end, 10);
            if (errno || times < 1 || times > INT_MAX || *end != ')') goto malformed;
            p = end + 1;
        }
        if (found < 0 && node < seen + times) found = (int)count;
        seen += times;
        if (*p == '\0') break;
        if (*p != ',') goto malformed;
        p++;
    }
    if (found < 0)
        return ct_error_set(CT_ERR_INVALID, "dist env: %s='%s' describes %lld nodes but SLURM_NODEID is %d", var, v,
                            seen, node);
    *out = found;
    return CT_OK;
malformed:
    return ct_error_set(CT_ERR_INVALID, "dist env: %s='%s' is not a Slurm task layout (like '4', '2(x3)' or '2(x3),1')",
                        var, v);
}

/* names: the variables rank, world size, local rank and local world size came from */
static ct_status check_ranks(const ct_dist_env *e, const char *r, const char *w, const char *lr, const char *lw)
{
    if (e->world_size < 1)
        return ct_error_set(CT_ERR_INVALID, "dist env: %s=%d; it must be at least 1", w, e->world_size);
    if (e->rank >= e->world_size)
        return ct_error_set(CT_ERR_INVALID, "dist env: %s=%d is not below %s=%d", r, e->rank, w, e->world_size);
    if (e->local_world_size < 1 || e->local_world_size > e->world_size)
        return ct_error_set(CT_ERR_INVALID, "dist env: %s gives %d ranks on this node; it must be in 1..%s (%d)", lw,
                            e->local_world_size, w, e->world_size);
    if (e->local_rank >= e->local_world_size)
        return ct_error_set(CT_ERR_INVALID, "dist env: %s=%d is not below the %d ranks %s gives this node", lr,
                            e->local_rank, e->local_world_size, lw);
    return CT_OK;
}

/* ---- the rules ----------------------------------------------------------- */

static ct_status from_launcher(ct_dist_env *e)
{
    if (env_int_required("RANK", "WORLD_SIZE is, so a launcher is assumed; export both or neither", &e->rank) ||
        env_int_required("WORLD_SIZE", "RANK is, so a launcher is assumed; export both or neither", &e->world_size) ||
        env_int_default("LOCAL_RANK", e->rank, &e->local_rank) ||
        env_int_default("LOCAL_WORLD_SIZE", e->world_size, &e->local_world_size) ||
        check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
        return CT_ERR_INVALID;
    const char *addr = env_get("MASTER_ADDR");
    if (set_addr(e, "MASTER_ADDR", addr ? addr : LOOPBACK) || read_port(e)) return CT_ERR_INVALID;
    e->source = "launcher";
    return CT_OK;
}

static ct_status from_mpirun(ct_dist_env *e)
{
    const char *why = "Open MPI's mpirun sets all four OMPI_COMM_WORLD_ variables";
    if (env_int_required("OMPI_COMM_WORLD_RANK", why, &e->rank) ||
        env_int_required("OMPI_COMM_WORLD_SIZE", why, &e->world_size) ||
        env_int_required("OMPI_COMM_WORLD_LOCAL_RANK", why, &e->local_rank) ||
        env_int_required("OMPI_COMM_WORLD_LOCAL_SIZE", why, &e->local_world_size) ||
        check_ranks(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE"))
        return CT_ERR_INVALID;
    const char *addr = env_get("MASTER_ADDR");
    if (!addr && e->local_world_size != e->world_size)
        return ct_error_set(CT_ERR_INVALID,
                            "dist env: mpirun placed %d ranks on several nodes (%d on this one) and MASTER_ADDR is "
                            "not set: export MASTER_ADDR=<rank 0's host> (mpirun -x MASTER_ADDR)",
                            e->world_size, e->local_world_size);
    if (set_addr(e, "MASTER_ADDR", addr ? addr : LOOPBACK) || read_port(e)) return CT_ERR_INVALID;
    e->source = "mpirun";
    return CT_OK;
}

static ct_status from_slurm(ct_dist_env *e)
{
    const char *why = "srun sets it for every task";
    if (env_int_required("SLURM_PROCID", why, &e->rank) || env_int_required("SLURM_NTASKS", why, &e->world_size) ||
        env_int_required("SLURM_LOCALID", why, &e->local_rank))
        return CT_ERR_INVALID;

    /* SLURM_TASKS_PER_NODE is the layout srun actually made; SLURM_NTASKS_PER_NODE only
     * echoes --ntasks-per-node, which a last node with fewer tasks does not follow. */
    const char *var = "SLURM_TASKS_PER_NODE", *layout = env_get(var);
    if (!layout) layout = env_get(var = "SLURM_NTASKS_PER_NODE");
    if (!layout)
        return ct_error_set(CT_ERR_INVALID, "dist env: SLURM_PROCID is set but neither SLURM_TASKS_PER_NODE nor "
                                            "SLURM_NTASKS_PER_NODE is; run the program with srun");
    int node;
    if (env_int_default("SLURM_NODEID", 0, &node)) return CT_ERR_INVALID;
    /* --ntasks-per-node is one count for every node */
    if (strcmp(var, "SLURM_TASKS_PER_NODE")) node = 0;
    if (slurm_tasks_on_node(var, layout, node, &e->local_world_size) ||
        check_ranks(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", var))
        return CT_ERR_INVALID;

    const char *addr = env_get("MASTER_ADDR");
    if (addr) {
        if (set_addr(e, "MASTER_ADDR", addr)) return CT_ERR_INVALID;
    } else {
        const char *lvar = "SLURM_JOB_NODELIST", *list = env_get(lvar);
        if (!list) list = env_get(lvar = "SLURM_NODELIST");
        if (list) {
            if (ct_dist_nodelist_first(list, e->master_addr, sizeof e->master_addr))
                return ct_error_prefix("dist env: %s: ", lvar);
        } else if (e->local_world_size == e->world_size) {
            strcpy(e->master_addr, LOOPBACK);
        } else {
            return ct_error_set(CT_ERR_INVALID, "dist env: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set and the "
                                                "job spans several nodes: export MASTER_ADDR=<rank 0's host>");
        }
    }
    if (read_port(e)) return CT_ERR_INVALID;
    e->source = "slurm";
    return CT_OK;
}

static ct_status read_timeout(double *out)
{
    const char *v = env_get("CTRAIN_TIMEOUT");
    if (!v) {
        *out = CT_DIST_DEFAULT_TIMEOUT_S;
        return CT_OK;
    }
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    if (errno || *end || end == v || isspace((unsigned char)*v) || !isfinite(t) || t <= 0)
        return ct_error_set(CT_ERR_INVALID, "dist env: CTRAIN_TIMEOUT='%s' is not a positive number of seconds", v);
    *out = t;
    return CT_OK;
}

ct_status ct_dist_env_detect(ct_dist_env *out)
{
    if (!out) return ct_error_set(CT_ERR_INVALID, "ct_dist_env_detect: out is NULL");
    ct_dist_env e = {0};
    ct_status st;
    if (env_get("RANK") || env_get("WORLD_SIZE"))
        st = from_launcher(&e);
    else if (env_get("OMPI_COMM_WORLD_RANK") || env_get("OMPI_COMM_WORLD_SIZE"))
        st = from_mpirun(&e);
    else if (env_get("SLURM_PROCID") && env_get("SLURM_NTASKS"))
        /* both, not either: an salloc shell has SLURM_NTASKS without being a task */
        st = from_slurm(&e);
    else {
        e = (ct_dist_env){.world_size = 1, .local_world_size = 1, .master_port = CT_DIST_DEFAULT_PORT,
                          .source = "single"};
        strcpy(e.master_addr, LOOPBACK);
        st = CT_OK;
    }
    if (st || (st = read_timeout(&e.timeout_s))) return st;
    *out = e;
    return CT_OK;
}

const char *ct_dist_job_id(void)
{
    static _Thread_local char id[256];
    const char *v = getenv("CTRAIN_JOB_ID");
    if (v && *v) {
        snprintf(id, sizeof id, "%s", v);
    } else if ((v = getenv("SLURM_JOB_ID")) && *v) {
        const char *step = getenv("SLURM_STEP_ID");
        snprintf(id, sizeof id, "slurm-%s.%s", v, step && *step ? step : "0");
    } else if ((v = getenv("PMIX_NAMESPACE")) && *v) {
        snprintf(id, sizeof id, "pmix-%s", v);
    } else {
        id[0] = '\0';
    }
    return id;
}

const char *ct_dist_store_token(void)
{
    static _Thread_local char token[CT_STORE_MAX_TOKEN + 2];
    const char *v = getenv("CTRAIN_STORE_TOKEN");
    snprintf(token, sizeof token, "%s", v ? v : "");
    return token;
}
