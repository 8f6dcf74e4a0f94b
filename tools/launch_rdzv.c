/* The elastic rendezvous's rounds over the launchers' store (tools/launch_rdzv.h;
 * user documentation: docs/launch.md, "Elastic training").
 *
 * A round k is open from the moment someone joins it until the host publishes its
 * result. The host closes it when --max_nodes launchers joined, or when at least
 * --min_nodes did and --rdzv_last_call seconds passed since the last one joined
 * (torchrun's last call); it fails it when fewer than --min_nodes joined within
 * --rdzv_timeout. The participants, sorted by machine rank, are the round's node
 * ranks: the host (machine rank 0) is always node 0, so MASTER_ADDR stays
 * --main_process_ip, and the host picks the free port that the round's ranks use
 * for their own store.
 */
#include "tools/launch_rdzv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ct_launch_rdzv {
    const ct_launch_opts *o;
    ct_store *store;
    bool host;
    int round;            /* the round joined */
    bool in_run;          /* the round closed with this launcher in it */
    double joined_at;     /* when this launcher joined the round (s) */
    int64_t seen_joined;  /* host: <k>/joined at the last look */
    double last_join_at;  /* host: when it last grew */
    int nodes;            /* the round's participants, once closed */
    double done_since;    /* host: when its own ranks finished */
    double last_beat;     /* when this launcher last bumped its heartbeat */
    char machines[512];   /* the round's participants, "0,1,3", once closed */
    int64_t *hb_seen;     /* host, per machine rank: the heartbeat last read */
    double *hb_changed;   /* ... and when it last changed */
    char gone[400];       /* host: the silent launchers, for ct_launch_rdzv_gone */
    char endpoint[300];
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *key(char *buf, size_t cap, int round, const char *what)
{
    snprintf(buf, cap, "ctl/%d/%s", round, what);
    return buf;
}

/* Adds delta to counter k (a missing key reads 0), its new value into *v. */
static ct_status add(ct_launch_rdzv *z, const char *k, int64_t delta, int64_t *v)
{
    if (ct_store_add(z->store, k, delta, v))
        return ct_error_prefix("the rendezvous host at %s (machine rank 0's launcher) cannot be asked: ",
                               z->endpoint);
    return CT_OK;
}

/* A counter's value without changing it. */
static ct_status counter(ct_launch_rdzv *z, const char *k, int64_t *v) { return add(z, k, 0, v); }

static ct_status bump(ct_launch_rdzv *z, const char *k, int64_t *v) { return add(z, k, 1, v); }

const char *ct_launch_rdzv_endpoint(const ct_launch_rdzv *z)
{
    return z->endpoint;
}

ct_launch_rdzv *ct_launch_rdzv_new(const ct_launch_opts *o)
{
    ct_launch_rdzv *z = calloc(1, sizeof *z);
    if (z) {
        z->hb_seen = calloc((size_t)o->max_nodes, sizeof *z->hb_seen);
        z->hb_changed = calloc((size_t)o->max_nodes, sizeof *z->hb_changed);
    }
    if (!z || !z->hb_seen || !z->hb_changed) {
        ct_error_set(CT_ERR_NOMEM, "out of memory for the rendezvous");
        ct_launch_rdzv_free(z);
        return NULL;
    }
    z->o = o;
    z->host = o->machine_rank == 0;
    snprintf(z->endpoint, sizeof z->endpoint, "%s:%d", o->main_process_ip, o->main_process_port);
    z->store = ct_store_new(&(ct_store_config){
        .host = o->main_process_ip, .port = o->main_process_port, .serve = z->host, .world_size = 1,
        .timeout_s = o->rdzv_timeout_s, .job = o->job_id[0] ? o->job_id : NULL, .token = o->store_token,
        .server = "the rendezvous host"});
    if (!z->store) {
        ct_error_prefix(z->host ? "cannot serve the rendezvous on %s (--main_process_ip, --main_process_port): "
                                : "cannot reach the rendezvous host at %s (--main_process_ip, --main_process_port: "
                                  "machine rank 0's launcher) within --rdzv_timeout %g s: ",
                        z->endpoint, o->rdzv_timeout_s);
        ct_launch_rdzv_free(z);
        return NULL;
    }
    if (z->host && o->main_process_port == 0)
        snprintf(z->endpoint, sizeof z->endpoint, "%s:%d", o->main_process_ip, ct_store_port(z->store));
    z->round = -1;
    return z;
}

void ct_launch_rdzv_free(ct_launch_rdzv *z)
{
    if (!z) return;
    if (z->store) ct_store_free(z->store);
    free(z->hb_seen);
    free(z->hb_changed);
    free(z);
}

ct_status ct_launch_rdzv_join(ct_launch_rdzv *z, bool leave)
{
    char k[128];
    int64_t newest, v;
    if (counter(z, "ctl/round", &newest)) return ct_last_status();
    int target = (int)newest;
    if (leave && z->round >= 0 && target <= z->round) {
        /* the first to leave round k opens k+1; the others join it */
        if (bump(z, key(k, sizeof k, z->round, "next"), &v)) return ct_last_status();
        if (v == 1 && bump(z, "ctl/round", &newest)) return ct_last_status();
        target = z->round + 1;
    }
    z->round = target;
    z->in_run = false;
    z->nodes = 0;
    char mk[64];
    snprintf(mk, sizeof mk, "m/%d", z->o->machine_rank);
    if (bump(z, key(k, sizeof k, target, mk), &v)) return ct_last_status();
    if (v > 1)
        return ct_error_set(CT_ERR_INVALID,
                            "round %d: machine rank %d joined it already: is another launcher running with "
                            "--machine_rank %d?",
                            target, z->o->machine_rank, z->o->machine_rank);
    if (bump(z, key(k, sizeof k, target, "joined"), &v)) return ct_last_status();
    z->joined_at = z->last_join_at = now_s();
    z->seen_joined = 0;
    return CT_OK;
}

/* "0,1 joined; missing 2, 3" for round k; *n = how many joined. */
static ct_status who(ct_launch_rdzv *z, int round, char *joined, char *missing, size_t cap, int *n)
{
    size_t uj = 0, um = 0;
    joined[0] = missing[0] = 0;
    *n = 0;
    for (int r = 0; r < z->o->max_nodes; r++) {
        char mk[64], k[96];
        int64_t v;
        snprintf(mk, sizeof mk, "m/%d", r);
        if (counter(z, key(k, sizeof k, round, mk), &v)) return ct_last_status();
        char *buf = v > 0 ? joined : missing;
        size_t *u = v > 0 ? &uj : &um;
        if (*u < cap) *u += (size_t)snprintf(buf + *u, cap - *u, "%s%d", *u ? "," : "", r);
        if (v > 0) ++*n;
    }
    return CT_OK;
}

static ct_status publish(ct_launch_rdzv *z, const char *result)
{
    char k[128];
    int64_t v;
    if (ct_store_set(z->store, key(k, sizeof k, z->round, "result"), result, strlen(result)))
        return ct_error_prefix("rendezvous round %d: ", z->round);
    return bump(z, key(k, sizeof k, z->round, "closed"), &v);
}

/* The host's look at an open round: close it, fail it, or wait. */
static ct_status host_look(ct_launch_rdzv *z)
{
    const ct_launch_opts *o = z->o;
    char k[128];
    int64_t j;
    if (counter(z, key(k, sizeof k, z->round, "joined"), &j)) return ct_last_status();
    double t = now_s();
    if (j != z->seen_joined) z->seen_joined = j, z->last_join_at = t;
    bool full = j >= o->max_nodes, enough = j >= o->min_nodes && t - z->last_join_at >= o->rdzv_last_call_s;
    bool late = t - z->joined_at >= o->rdzv_timeout_s;
    if (!full && !enough && !late) return CT_OK;
    char joined[400], missing[400], result[1200];
    int n;
    if (who(z, z->round, joined, missing, sizeof joined, &n)) return ct_last_status();
    if (n < o->min_nodes) {
        /* late: too few within the timeout; the others learn it from the result */
        snprintf(result, sizeof result,
                 "fail round %d: %d of --min_nodes %d node(s) joined within --rdzv_timeout %g s (machine rank%s %s "
                 "joined; missing: %s)",
                 z->round, n, o->min_nodes, o->rdzv_timeout_s, n == 1 ? "" : "s", joined, missing);
        publish(z, result);
        return ct_error_set(CT_ERR_TIMEOUT, "%s", result + 5);
    }
    int port = 0;
    /* the round's ranks bind it soon after (ct_launch_free_port says what may race) */
    if (ct_launch_free_port("rendezvous: picking a free port for the ranks", &port)) return ct_last_status();
    snprintf(result, sizeof result, "ok %d %s", port, joined);
    return publish(z, result);
}

/* Reads a closed round's result into *out; 1 with this launcher in it, 0 without. */
static int read_result(ct_launch_rdzv *z, ct_launch_round *out)
{
    char k[128];
    void *val;
    size_t n;
    if (ct_store_get(z->store, key(k, sizeof k, z->round, "result"), 0, &val, &n)) {
        ct_error_prefix("rendezvous round %d: ", z->round);
        return -1;
    }
    const char *s = val;
    if (!strncmp(s, "fail ", 5)) {
        ct_error_set(CT_ERR_TIMEOUT, "the host failed %s", s + 5);
        free(val);
        return -1;
    }
    int port, len = 0;
    if (sscanf(s, "ok %d %n", &port, &len) != 1 || !len) {
        ct_error_set(CT_ERR_FORMAT, "rendezvous round %d: a malformed result '%s'", z->round, s);
        free(val);
        return -1;
    }
    *out = (ct_launch_round){.round = z->round, .port = port, .node_rank = -1};
    snprintf(out->machines, sizeof out->machines, "%s", s + len);
    snprintf(z->machines, sizeof z->machines, "%s", s + len);
    for (const char *p = s + len; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p) break;
        if (r == z->o->machine_rank) out->node_rank = out->nodes;
        out->nodes++;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    free(val);
    z->nodes = out->nodes;
    return out->node_rank >= 0;
}

int ct_launch_rdzv_poll(ct_launch_rdzv *z, ct_launch_round *out)
{
    char k[128];
    int64_t closed, newest;
    if (counter(z, "ctl/round", &newest)) return -1;
    if (counter(z, key(k, sizeof k, z->round, "closed"), &closed)) return -1;
    if (!closed && newest > z->round) {
        /* replaced before it closed: go on in the newest round */
        return ct_launch_rdzv_join(z, false) ? -1 : 0;
    }
    if (!closed && z->host) {
        if (host_look(z)) return -1;
        if (counter(z, key(k, sizeof k, z->round, "closed"), &closed)) return -1;
    }
    if (!closed) {
        if (now_s() - z->joined_at < z->o->rdzv_timeout_s + (z->host ? 0 : 2 * z->o->rdzv_last_call_s + 1))
            return 0;
        char joined[400], missing[400];
        int n;
        if (who(z, z->round, joined, missing, sizeof joined, &n)) return -1;
        ct_error_set(CT_ERR_TIMEOUT,
                     "round %d did not close within --rdzv_timeout %g s: %d of --min_nodes %d node(s) joined "
                     "(machine ranks %s; missing: %s)",
                     z->round, z->o->rdzv_timeout_s, n, z->o->min_nodes, joined, missing);
        return -1;
    }
    int in = read_result(z, out);
    if (in < 0) return -1;
    if (!in) return ct_launch_rdzv_join(z, true) ? -1 : 0; /* closed without us: the next one */
    z->in_run = true;
    return 1;
}

int ct_launch_rdzv_newer(ct_launch_rdzv *z)
{
    int64_t newest;
    if (counter(z, "ctl/round", &newest)) return -1;
    return newest > z->round ? (int)newest : 0;
}

ct_status ct_launch_rdzv_done(ct_launch_rdzv *z)
{
    char k[128], mk[64];
    int64_t v;
    z->done_since = now_s();
    snprintf(mk, sizeof mk, "done/%d", z->o->machine_rank);
    if (bump(z, key(k, sizeof k, z->round, mk), &v)) return ct_last_status();
    return bump(z, key(k, sizeof k, z->round, "done"), &v);
}

void ct_launch_rdzv_beat(ct_launch_rdzv *z)
{
    double t = now_s();
    if (t - z->last_beat < CT_LAUNCH_HEARTBEAT_S) return;
    z->last_beat = t;
    char k[64];
    int64_t v;
    snprintf(k, sizeof k, "ctl/hb/%d", z->o->machine_rank);
    if (bump(z, k, &v)) ct_error_clear(); /* the next request reports a lost host */
}

void ct_launch_rdzv_failed(ct_launch_rdzv *z, int status)
{
    if (z->round < 0 || status == 0) return;
    char k[128], mk[64];
    int64_t v;
    snprintf(mk, sizeof mk, "failed/%d", z->o->machine_rank);
    if (add(z, key(k, sizeof k, z->round, mk), status, &v)) ct_error_clear(); /* best effort */
}

const char *ct_launch_rdzv_gone(const ct_launch_rdzv *z)
{
    return z->gone;
}

/* The host: 1 when every participant not done yet has been silent (no heartbeat) for
 * CT_LAUNCH_SILENT_S, their machine ranks into z->gone; 0 while one still beats. A
 * participant's clock starts when the host's own ranks finished. */
static int others_gone(ct_launch_rdzv *z)
{
    double t = now_s();
    size_t used = 0;
    z->gone[0] = '\0';
    for (const char *p = z->machines; *p;) {
        char *end;
        long m = strtol(p, &end, 10);
        if (end == p) break;
        p = *end == ',' ? end + 1 : end;
        if (m == z->o->machine_rank || m < 0 || m >= z->o->max_nodes) continue;
        char k[128], mk[64];
        int64_t done, failed, hb;
        snprintf(mk, sizeof mk, "done/%ld", m);
        if (counter(z, key(k, sizeof k, z->round, mk), &done)) return -1;
        if (done) continue;
        snprintf(mk, sizeof mk, "failed/%ld", m);
        if (counter(z, key(k, sizeof k, z->round, mk), &failed)) return -1;
        if (failed) {
            ct_error_set(CT_ERR_PEER,
                         "round %d: the launcher of machine rank %ld ended with status %" PRId64
                         " (its ranks failed with no restart left, or it was interrupted): the job did not finish "
                         "there; see its output",
                         z->round, m, failed);
            return -1;
        }
        snprintf(k, sizeof k, "ctl/hb/%ld", m);
        if (counter(z, k, &hb)) return -1;
        if (hb != z->hb_seen[m] || z->hb_changed[m] < z->done_since) { /* it beat, or the first look */
            z->hb_seen[m] = hb;
            z->hb_changed[m] = t;
        }
        if (t - z->hb_changed[m] < CT_LAUNCH_SILENT_S) return 0;
        if (used < sizeof z->gone) used += (size_t)snprintf(z->gone + used, sizeof z->gone - used, "%s%ld", used ? "," : "", m);
    }
    return 1;
}

int ct_launch_rdzv_all_done(ct_launch_rdzv *z)
{
    char k[128];
    int64_t done;
    if (counter(z, key(k, sizeof k, z->round, "done"), &done)) return -1;
    if (done >= z->nodes) return 1;
    int newer = ct_launch_rdzv_newer(z);
    if (newer != 0) return newer > 0 ? 1 : -1;
    int gone = others_gone(z);
    if (gone) return gone > 0 ? 2 : -1;
    if (now_s() - z->done_since < z->o->rdzv_timeout_s) return 0;
    ct_error_set(CT_ERR_TIMEOUT,
                 "round %d: %" PRId64 " of %d node(s) finished within --rdzv_timeout %g s after this one; "
                 "stopped waiting for the others",
                 z->round, done, z->nodes, z->o->rdzv_timeout_s);
    return -1;
}
