/* A group's works on the loop thread: starting them (in order for collectives, at
 * once for sends and receives), checking and delivering their messages, finishing
 * them, failing the group, and the timeouts with their probes. The routing of
 * messages to groups, the engine and registration are in dist/comm.c; the rules in
 * dist/comm_internal.h and docs/maintainers/comm.md.
 *
 * Reentrancy. Algorithms run inside these functions and may fail the group, which
 * finishes works; so every call into an algorithm holds a pin on its work
 * (io_pending + 1), taken off with cti_comm_io_done afterwards: a work is never
 * released, and its state never freed, while a function on the stack still uses it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"

#define PROBE_WINDOW_S 1.0 /* probes go out this long (at most a quarter of the timeout) before it */

static double now_s(void) { return (double)uv_hrtime() * 1e-9; }

/* "rank 2", or "rank 1 (world rank 3)" in a sub-group */
const char *cti_comm_rank_name(const ct_comm_group *g, int grank, char *buf, size_t cap)
{
    if (g->peers[grank] == grank) snprintf(buf, cap, "rank %d", grank);
    else snprintf(buf, cap, "rank %d (world rank %d)", grank, g->peers[grank]);
    return buf;
}

/* " [at 10.0.0.3, host node1]": the node of group rank grank's process (its TCP
 * address and host name); "" when the transport does not know it. */
const char *cti_comm_rank_where(const ct_comm_group *g, int grank, char *buf, size_t cap)
{
    const char *w = cti_transport_where(g->L->tp, g->peers[grank]);
    if (w[0]) snprintf(buf, cap, " [at %s]", w);
    else if (cap) buf[0] = '\0';
    return buf;
}

static void noop_sent(void *arg, int status)
{
    (void)arg;
    (void)status;
}

/* A message without a work (abort, probe, reply): fire and forget. */
void cti_comm_send_control(ct_comm_link *L, int peer, ct_msg *m, const void *payload)
{
    if (!L->dead[peer]) L->tp->ops->send(L->tp, peer, m, payload, true, noop_sent, NULL);
}

/* ---- works ---------------------------------------------------------------------------- */

/* The request's destructor (dist/work_internal.h): the work's tensors and memory. */
static void work_free(ct_work *w)
{
    ct_tensor_release(w->t_out);
    ct_tensor_release(w->t_in);
    free(w);
}

ct_work *ct_comm_work_new(void)
{
    ct_work *w = calloc(1, sizeof *w);
    if (!w) {
        ct_error_set(CT_ERR_NOMEM, "pg: out of memory for a work");
        return NULL;
    }
    if (ct_work_req_init(w, work_free)) {
        free(w);
        return NULL;
    }
    return w;
}

static void work_release(ct_work *w)
{
    if (w->started && w->algo->cleanup) w->algo->cleanup(w);
    w->algo_state = NULL;
    cti_work_unref(w);
}

static void unlink_work(ct_work **list, ct_work **tail, ct_work *w)
{
    ct_work *prev = NULL;
    for (ct_work *x = *list; x; prev = x, x = x->next) {
        if (x != w) continue;
        if (prev) prev->next = w->next;
        else *list = w->next;
        if (tail && *tail == w) *tail = prev;
        w->next = NULL;
        return;
    }
}

static void work_finish(ct_work *w, ct_status st, const char *text)
{
    if (w->state == CT_WORK_FINISHED) return;
    ct_comm_group *g = w->grp;
    bool was_head = g->head == w;
    if (cti_comm_is_p2p(w)) unlink_work(&g->p2p, NULL, w);
    else unlink_work(&g->head, &g->tail, w);
    if (!cti_comm_is_p2p(w) && w->state == CT_WORK_RUNNING) g->seq_done = w->seq;
    w->state = CT_WORK_FINISHED;
    cti_work_complete(w, st, text);
    if (w->io_pending == 0) work_release(w);
    if (was_head) cti_comm_group_run(g);
    else cti_comm_arm_timer(g);
}

/* One I/O reference (or pin) of w is gone. */
void cti_comm_io_done(ct_work *w)
{
    CT_ASSERT(w->io_pending > 0);
    if (--w->io_pending) return;
    if (w->state == CT_WORK_FINISHED) work_release(w);
    else if (w->state == CT_WORK_RUNNING && w->ready) work_finish(w, CT_OK, NULL);
}

/* Whether text is about w already ("allreduce #7..."), so it need not be prefixed. */
static bool mentions(const ct_work *w, const char *text)
{
    char p[64];
    for (int k = 0; k < 2; k++) {
        if (k && cti_comm_is_p2p(w)) break;
        int n = snprintf(p, sizeof p, "%s #%llu", k ? "collective" : cti_comm_op_name(w->op),
                         (unsigned long long)w->seq);
        if (!strncmp(text, p, (size_t)n) && (text[n] == ' ' || text[n] == ':')) return true;
    }
    return false;
}

void cti_comm_work_fail(ct_work *w, ct_status st, const char *what, const char *msg)
{
    char title[256], text[CT_COMM_MSG];
    if (mentions(w, msg)) snprintf(text, sizeof text, "%s", msg);
    else {
        /* in two parts, so a long msg is cut at CT_COMM_MSG without a truncation warning */
        int n = snprintf(text, sizeof text, "%s: %s: ", cti_comm_work_title(title, sizeof title, w), what);
        if (n >= 0 && (size_t)n < sizeof text) snprintf(text + n, sizeof text - (size_t)n, "%s", msg);
    }
    work_finish(w, st, text);
}

void cti_comm_drop_early(ct_comm_group *g)
{
    while (g->unexp) {
        ct_comm_early *u = g->unexp;
        g->unexp = u->next;
        free(u);
    }
}

/* The group is broken from now on: every running and queued work fails, and so will
 * every later one. tell: send the message to the other ranks, which fail with it. */
void cti_comm_group_fail(ct_comm_group *g, ct_status st, bool tell, const char *msg)
{
    if (g->broken) return;
    g->broken = st;
    snprintf(g->broken_msg, sizeof g->broken_msg, "%s", msg);
    atomic_store_explicit(&g->alert, 1, memory_order_release);
    if (tell) {
        size_t n = strlen(g->broken_msg);
        ct_msg m = {.kind = CT_MSG_ABORT, .status = (uint8_t)st, .group = g->id, .len = (uint32_t)n};
        for (int i = 0; i < g->size; i++)
            if (i != g->rank) cti_comm_send_control(g->L, g->peers[i], &m, g->broken_msg);
    }
    cti_comm_drop_early(g);
    while (g->p2p) cti_comm_work_fail(g->p2p, st, "the group failed", g->broken_msg);
    if (g->head && g->head->state == CT_WORK_RUNNING) cti_comm_work_fail(g->head, st, "the group failed", g->broken_msg);
    cti_comm_group_run(g); /* fails the queued ones */
}

void cti_comm_fail(ct_work *w, ct_status st, const char *fmt, ...)
{
    if (w->state == CT_WORK_FINISHED) return;
    char msg[CT_COMM_MSG - 256], title[256], text[CT_COMM_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(text, sizeof text, "%s: %s", cti_comm_work_title(title, sizeof title, w), msg);
    cti_comm_group_fail(w->grp, st, true, text);
}

void cti_comm_ready(ct_work *w) { w->ready = true; }

static void on_work_sent(void *arg, int status)
{
    (void)status; /* a failed write also fails the connection: the transport reports it */
    cti_comm_io_done(arg);
}

ct_status cti_comm_send(ct_work *w, int dst, uint32_t step, uint32_t chunk, const void *data, size_t len, bool copy)
{
    if (w->state != CT_WORK_RUNNING) return CT_ERR_PEER;
    ct_comm_group *g = w->grp;
    ct_comm_link *L = g->L;
    int peer = g->peers[dst];
    CT_ASSERT(len <= CT_MSG_MAX_PAYLOAD && dst != g->rank);
    char who[64];
    if (L->dead[peer] || g->left[dst]) {
        cti_comm_fail(w, CT_ERR_PEER, "%s %s", cti_comm_rank_name(g, dst, who, sizeof who),
                      g->left[dst] ? "has freed the group" : "is gone");
        return CT_ERR_PEER;
    }
    ct_msg m = {.kind = cti_comm_is_p2p(w) ? CT_MSG_P2P : CT_MSG_COLL, .op = (uint8_t)w->op, .redop = (uint8_t)w->rop,
                .dtype = (uint8_t)w->dtype, .algo = w->algo->id, .root = cti_comm_is_p2p(w) ? w->tag : w->root,
                .group = g->id, .seq = w->seq, .count = w->count, .step = step, .chunk = chunk,
                .len = (uint32_t)len};
    w->io_pending++;
    ct_status st = L->tp->ops->send(L->tp, peer, &m, data, copy, on_work_sent, w);
    if (st) {
        w->io_pending--;
        if (st == CT_ERR_NOMEM) cti_comm_fail(w, st, "out of memory queueing %zu bytes for %s", len,
                                              cti_comm_rank_name(g, dst, who, sizeof who));
        else cti_comm_fail(w, CT_ERR_PEER, "%s is gone", cti_comm_rank_name(g, dst, who, sizeof who));
    }
    return st;
}

/* The signature of message m from src agrees with w's; else the group fails. */
static bool sig_matches(ct_work *w, int src, const ct_msg *m)
{
    ct_comm_group *g = w->grp;
    char mine[160], theirs[160], title[256], text[CT_COMM_MSG];
    if (cti_comm_is_p2p(w)) {
        if (m->dtype == w->dtype && m->count == w->count && m->algo == w->algo->id) return true;
        snprintf(text, sizeof text, "%s: rank %d posted recv(%s, %lld), rank %d sent send(%s, %lld)",
                 cti_comm_work_title(title, sizeof title, w), g->rank, ct_dtype_name(w->dtype), (long long)w->count,
                 src, ct_dtype_name((ct_dtype)m->dtype), (long long)m->count);
        cti_comm_group_fail(g, CT_ERR_PEER, true, text);
        return false;
    }
    if (m->op == w->op && m->redop == w->rop && m->dtype == w->dtype && m->count == w->count && m->root == w->root) {
        if (m->algo == w->algo->id) return true;
        snprintf(text, sizeof text,
                 "%s #%llu: rank %d runs it with algorithm %d (%s), rank %d with algorithm %d: every rank must use "
                 "the same ring_min_bytes",
                 cti_comm_op_name(w->op), (unsigned long long)w->seq, g->rank, w->algo->id, w->algo->name, src, m->algo);
        cti_comm_group_fail(g, CT_ERR_PEER, true, text);
        return false;
    }
    /* named by the op when both called the same one, else "collective", so that the
     * text reads right on every rank it is sent to */
    cti_comm_sig_str(mine, sizeof mine, w->op, w->rop, w->dtype, w->count, w->root);
    cti_comm_sig_str(theirs, sizeof theirs, m->op, m->redop, m->dtype, m->count, m->root);
    snprintf(text, sizeof text, "%s #%llu: rank %d called %s, rank %d called %s",
             m->op == w->op ? cti_comm_op_name(w->op) : "collective", (unsigned long long)w->seq, g->rank, mine, src,
             theirs);
    cti_comm_group_fail(g, CT_ERR_PEER, true, text);
    return false;
}

/* Checks message m from src against running work w; *dest = where its payload goes. */
bool cti_comm_accept(ct_work *w, int src, const ct_msg *m, void **dest)
{
    if (!sig_matches(w, src, m)) return false;
    size_t len = 0;
    *dest = NULL;
    if (!w->algo->expect(w, src, m->step, m->chunk, &len, dest)) {
        cti_comm_fail(w, CT_ERR_FORMAT, "rank %d sent a message this algorithm (%s) does not expect: step %u, chunk %u",
                      src, w->algo->name, m->step, m->chunk);
        return false;
    }
    if (len != m->len) {
        cti_comm_fail(w, CT_ERR_FORMAT,
                      "rank %d sent %u bytes for step %u, chunk %u, where %zu were due (do all ranks use the same "
                      "chunk_bytes?)",
                      src, m->len, m->step, m->chunk, len);
        return false;
    }
    CT_ASSERT(*dest || len == 0);
    w->grp->heard[src] = true;
    return true;
}

/* The running work a message of the group is for; NULL when it is early. *stale for
 * a collective that already finished here. */
ct_work *cti_comm_match(ct_comm_group *g, int src, const ct_msg *m, bool *stale)
{
    *stale = false;
    if (m->kind == CT_MSG_P2P) {
        for (ct_work *w = g->p2p; w; w = w->next)
            if (w->op == CT_OP_RECV && w->root == src && w->tag == m->root && w->seq == m->seq) return w;
        return NULL;
    }
    ct_work *h = g->head;
    if (h && h->state == CT_WORK_RUNNING && h->seq == m->seq) return h;
    *stale = m->seq <= g->seq_done && g->seq_done;
    return NULL;
}

/* A buffered message meets its work: check, copy, deliver. */
void cti_comm_feed(ct_work *w, ct_comm_early *u)
{
    void *dest;
    w->io_pending++;
    if (cti_comm_accept(w, u->src, &u->m, &dest)) {
        if (u->m.len) memcpy(dest, u->data, u->m.len);
        w->algo->deliver(w, u->src, u->m.step, u->m.chunk);
    }
    free(u);
    cti_comm_io_done(w);
}

static bool um_is_for(const ct_comm_early *u, const ct_work *w)
{
    if (cti_comm_is_p2p(w))
        return u->m.kind == CT_MSG_P2P && w->op == CT_OP_RECV && u->src == w->root && u->m.root == w->tag &&
               u->m.seq == w->seq;
    return u->m.kind == CT_MSG_COLL && u->m.seq == w->seq;
}

/* A rank this work involves has freed the group: it cannot run. */
static int departed(const ct_work *w)
{
    const ct_comm_group *g = w->grp;
    if (cti_comm_is_p2p(w)) return g->left[w->root] ? w->root : -1;
    for (int i = 0; i < g->size; i++)
        if (g->left[i]) return i;
    return -1;
}

void cti_comm_work_start(ct_work *w)
{
    ct_comm_group *g = w->grp;
    w->state = CT_WORK_RUNNING;
    int gone = departed(w);
    if (gone >= 0) {
        char title[256], who[64], text[CT_COMM_MSG];
        snprintf(text, sizeof text, "%s: %s has freed the group (ct_pg_free); it takes no part any more",
                 cti_comm_work_title(title, sizeof title, w), cti_comm_rank_name(g, gone, who, sizeof who));
        if (cti_comm_is_p2p(w)) cti_comm_work_fail(w, CT_ERR_PEER, "", text);
        else cti_comm_group_fail(g, CT_ERR_PEER, false, text);
        return;
    }
    double now = now_s(), window = fmin(PROBE_WINDOW_S, g->timeout_s / 4);
    w->deadline = now + g->timeout_s;
    w->probe_at = w->deadline - window;
    if (!cti_comm_is_p2p(w)) memset(g->heard, 0, (size_t)g->size * sizeof *g->heard);
    w->io_pending++; /* pinned while starting */
    w->started = true;
    ct_status st = w->algo->start(w);
    if (st && w->state == CT_WORK_RUNNING)
        cti_comm_fail(w, st, "%s", st == CT_ERR_NOMEM ? "out of memory for the transfer's buffers" : "could not start");
    /* replay what peers sent early, in arrival order */
    /* a failure inside cti_comm_feed frees the list, and finishes w: test w first */
    for (ct_comm_early **p = &g->unexp; w->state == CT_WORK_RUNNING && *p;) {
        ct_comm_early *u = *p;
        if (!um_is_for(u, w)) {
            p = &u->next;
            continue;
        }
        *p = u->next;
        cti_comm_feed(w, u);
    }
    cti_comm_io_done(w);
}

/* Starts the queued collectives in turn (each runs once the one before finished). */
void cti_comm_group_run(ct_comm_group *g)
{
    if (g->in_run) {
        g->rerun = true;
        return;
    }
    g->in_run = true;
    do {
        g->rerun = false;
        while (g->head && g->head->state == CT_WORK_QUEUED) {
            if (g->broken) cti_comm_work_fail(g->head, g->broken, "not run: the group had failed", g->broken_msg);
            else cti_comm_work_start(g->head);
        }
    } while (g->rerun);
    g->in_run = false;
    cti_comm_arm_timer(g);
}

void cti_comm_peer_left(ct_comm_group *g, int src)
{
    g->left[src] = true;
    atomic_store(&g->gone[src], 1);
    atomic_store_explicit(&g->alert, 1, memory_order_release);
    if (g->broken) return;
    /* everything src sent for this group arrived before its goodbye: what still waits
     * for it waits in vain; the rest completes */
    ct_work *h = g->head && g->head->state == CT_WORK_RUNNING ? g->head : NULL;
    for (ct_work *w = h ? h : g->p2p; w; w = w == h ? g->p2p : w->next) {
        if (w->state != CT_WORK_RUNNING || !w->algo->needs(w, src)) continue;
        char title[256], who[64], text[CT_COMM_MSG];
        snprintf(text, sizeof text, "%s: %s freed the group (ct_pg_free) before sending its part",
                 cti_comm_work_title(title, sizeof title, w), cti_comm_rank_name(g, src, who, sizeof who));
        cti_comm_group_fail(g, CT_ERR_PEER, false, text);
        return;
    }
}

/* ---- timeouts -------------------------------------------------------------------------------------- */

static void send_probes(ct_comm_group *g, ct_work *w)
{
    w->probed = true;
    ct_msg m = {.kind = CT_MSG_PROBE, .group = g->id, .seq = w->seq};
    for (int i = 0; i < g->size; i++) {
        g->probe_seq[i] = -2;
        if (i != g->rank) cti_comm_send_control(g->L, g->peers[i], &m, NULL);
    }
}

static void timeout_collective(ct_comm_group *g, ct_work *w)
{
    char title[256], text[CT_COMM_MSG], who[64], me[64], at[CT_PEER_WHERE + 16];
    /* in a sub-group "at rank 1 (world rank 3)", like the peers named below */
    size_t n = (size_t)snprintf(text, sizeof text, "%s timed out after %g s at %s; not heard from:",
                                cti_comm_work_title(title, sizeof title, w), g->timeout_s,
                                cti_comm_rank_name(g, g->rank, me, sizeof me));
    int listed = 0;
    for (int i = 0; i < g->size && n < sizeof text - 600; i++) {
        if (i == g->rank || !w->probed) continue;
        int64_t s = g->probe_seq[i];
        cti_comm_rank_name(g, i, who, sizeof who);
        cti_comm_rank_where(g, i, at, sizeof at);
        if (s == -2)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s %s (no answer)%s", listed++ ? "," : "", who, at);
        else if (s == -1)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s %s (does not have this group)%s", listed++ ? "," : "",
                                  who, at);
        else if ((uint64_t)s < w->seq)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s %s (has not called it; its last collective is #%lld)%s",
                                  listed++ ? "," : "", who, (long long)s, at);
    }
    if (!listed) {
        /* every rank got this far (or none could be asked): name those whose data is missing */
        for (int i = 0; i < g->size && n < sizeof text - 600; i++)
            if (i != g->rank && !g->heard[i])
                n += (size_t)snprintf(text + n, sizeof text - n, "%s %s (no data)%s", listed++ ? "," : "",
                                      cti_comm_rank_name(g, i, who, sizeof who), cti_comm_rank_where(g, i, at, sizeof at));
        if (!listed) n += (size_t)snprintf(text + n, sizeof text - n, " nobody: every rank sent data, too slowly");
    }
    snprintf(text + n, sizeof text - n,
             ". Do all ranks call the same collectives in the same order? Set CTRAIN_TIMEOUT to wait longer");
    cti_comm_group_fail(g, CT_ERR_TIMEOUT, true, text);
}

static void timeout_p2p(ct_comm_group *g, ct_work *w)
{
    char title[256], text[CT_COMM_MSG], who[64], me[64], at[CT_PEER_WHERE + 16];
    cti_comm_rank_name(g, w->root, who, sizeof who);
    cti_comm_rank_name(g, g->rank, me, sizeof me);
    cti_comm_rank_where(g, w->root, at, sizeof at);
    cti_comm_work_title(title, sizeof title, w);
    if (w->op == CT_OP_RECV)
        snprintf(text, sizeof text, "%s timed out after %g s at %s: not heard from %s%s; is it sending? Set "
                 "CTRAIN_TIMEOUT to wait longer", title, g->timeout_s, me, who, at);
    else
        snprintf(text, sizeof text, "%s timed out after %g s at %s: %s%s did not take the data; is it receiving? "
                 "Set CTRAIN_TIMEOUT to wait longer", title, g->timeout_s, me, who, at);
    cti_comm_group_fail(g, CT_ERR_TIMEOUT, true, text);
}

static void on_timer(uv_timer_t *t)
{
    ct_comm_group *g = t->data;
    double now = now_s();
    ct_work *h = g->head;
    if (h && h->state == CT_WORK_RUNNING) {
        if (now >= h->deadline) {
            timeout_collective(g, h);
            return;
        }
        if (!h->probed && now >= h->probe_at) send_probes(g, h);
    }
    for (ct_work *w = g->p2p; w; w = w->next)
        if (now >= w->deadline) {
            timeout_p2p(g, w);
            return;
        }
    cti_comm_arm_timer(g);
}

void cti_comm_arm_timer(ct_comm_group *g)
{
    double next = INFINITY;
    ct_work *h = g->head;
    if (h && h->state == CT_WORK_RUNNING) next = h->probed ? h->deadline : h->probe_at;
    for (ct_work *w = g->p2p; w; w = w->next) next = fmin(next, w->deadline);
    if (g->broken || isinf(next)) {
        uv_timer_stop(&g->timer);
        return;
    }
    double ms = ceil((next - now_s()) * 1e3);
    /* fails only for a handle that is closing, and a group's timer closes with the group */
    CT_ASSERT(uv_timer_start(&g->timer, on_timer, ms > 0 ? (uint64_t)ms : 0, 0) == 0);
}
