/* The comm engine: one libuv loop on one thread per process, shared by every group;
 * the routing of incoming messages to groups and works; registering and freeing
 * groups. What happens to a group's works is in dist/comm_group.c; the protocol and
 * the failure story in docs/maintainers/comm.md; the work rules in
 * dist/comm_internal.h.
 *
 * The caller's threads talk to the loop through a command queue (a mutex-protected
 * list and uv_async_send): register a group, submit a work, free a group. Everything
 * else happens on the loop: transports deliver headers and payloads, works are
 * matched and advanced, timers fire.
 *
 * Routing. A link is one transport and the groups that share it (a root group and
 * its sub-groups). A message names its group (id) and sequence number. Collectives of
 * a group run one at a time, in order: a collective message for the running one is
 * checked (signature, algorithm, step, length) and read straight into the buffer the
 * algorithm chooses; one for a later collective (a peer that is ahead) is buffered
 * ("early") and replayed when that collective starts; one for an earlier collective
 * is a protocol error. Sends and receives run as soon as they are submitted and
 * match by (peer, tag, seq).
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_internal.h"
#include "dist/loop_thread_internal.h"

#define ABORT_MAX 4096 /* bytes of an abort message's text */

/* ---- the engine ------------------------------------------------------------------------ */

typedef struct engine {
    uv_loop_t loop;
    uv_async_t wake;
    uv_thread_t thread;
    uv_mutex_t mu; /* guards the queue */
    ct_comm_cmd *head, *tail;
    int refs; /* live groups; guarded by eng_mu */
} engine;

static engine *eng;
static pthread_mutex_t eng_mu = PTHREAD_MUTEX_INITIALIZER;

static void on_wake(uv_async_t *a)
{
    engine *e = a->data;
    for (;;) {
        uv_mutex_lock(&e->mu);
        ct_comm_cmd *c = e->head;
        e->head = e->tail = NULL;
        uv_mutex_unlock(&e->mu);
        if (!c) return;
        while (c) {
            /* a submit's command lives in its work, which may be gone after fn */
            ct_comm_cmd *next = c->next;
            uv_sem_t *done = c->done;
            c->fn(c->arg);
            if (done) uv_sem_post(done);
            c = next;
        }
    }
}

static void post(engine *e, ct_comm_cmd *c)
{
    c->next = NULL;
    uv_mutex_lock(&e->mu);
    if (e->tail) e->tail->next = c;
    else e->head = c;
    e->tail = c;
    uv_mutex_unlock(&e->mu);
    /* only fails on a handle that is not an async one */
    CT_ASSERT(uv_async_send(&e->wake) == 0);
}

/* Runs fn(arg) on the loop and waits for it. */
static void call(engine *e, void (*fn)(void *), void *arg)
{
    uv_sem_t done;
    CT_ASSERT(uv_sem_init(&done, 0) == 0); /* fails only without system resources for a semaphore */
    ct_comm_cmd c = {.fn = fn, .arg = arg, .done = &done};
    post(e, &c);
    uv_sem_wait(&done);
    uv_sem_destroy(&done);
}

static void loop_main(void *arg)
{
    engine *e = arg;
    uv_run(&e->loop, UV_RUN_DEFAULT);
}

static void stop_cmd(void *arg)
{
    engine *e = arg;
    uv_close((uv_handle_t *)&e->wake, NULL);
}

static engine *engine_acquire(void)
{
    pthread_mutex_lock(&eng_mu);
    if (!eng) {
        engine *e = calloc(1, sizeof *e);
        int rc = e ? uv_loop_init(&e->loop) : UV_ENOMEM;
        if (rc) {
            free(e);
            pthread_mutex_unlock(&eng_mu);
            ct_error_set(rc == UV_ENOMEM ? CT_ERR_NOMEM : CT_ERR_INTERNAL, "pg: cannot start the comm loop: %s",
                         uv_strerror(rc));
            return NULL;
        }
        const char *what = "uv_mutex_init";
        if ((rc = uv_mutex_init(&e->mu))) goto fail_loop;
        what = "uv_async_init";
        if ((rc = uv_async_init(&e->loop, &e->wake, on_wake))) goto fail_mutex;
        e->wake.data = e;
        if ((rc = cti_loop_thread_create(&e->thread, loop_main, e, &what))) goto fail_async;
        eng = e;
        goto started;
    fail_async:
        uv_close((uv_handle_t *)&e->wake, NULL);
        uv_run(&e->loop, UV_RUN_DEFAULT);
    fail_mutex:
        uv_mutex_destroy(&e->mu);
    fail_loop:
        uv_loop_close(&e->loop);
        free(e);
        pthread_mutex_unlock(&eng_mu);
        ct_error_set(CT_ERR_INTERNAL, "pg: cannot start the comm thread: %s: %s", what, uv_strerror(rc));
        return NULL;
    }
started:
    eng->refs++;
    engine *e = eng;
    pthread_mutex_unlock(&eng_mu);
    return e;
}

static void engine_release(void)
{
    pthread_mutex_lock(&eng_mu);
    if (--eng->refs == 0) {
        engine *e = eng;
        ct_comm_cmd c = {.fn = stop_cmd, .arg = e};
        post(e, &c);
        uv_thread_join(&e->thread);
        /* every group's timer and every transport were closed before the last release */
        CT_ASSERT(uv_loop_close(&e->loop) == 0);
        uv_mutex_destroy(&e->mu);
        free(e);
        eng = NULL;
    }
    pthread_mutex_unlock(&eng_mu);
}
/* ---- routing messages to groups --------------------------------------------------------------- */

static ct_comm_group *find_group(ct_comm_link *L, uint64_t id)
{
    for (ct_comm_group *g = L->groups; g; g = g->next)
        if (g->id == id) return g;
    return NULL;
}

/* Forgets the payload in progress from peer (the peer is gone or the link closes). */
static void rx_abandon(ct_comm_link *L, int peer)
{
    ct_comm_rx r = L->rx[peer];
    L->rx[peer] = (ct_comm_rx){0};
    free(r.early);
    free(r.text);
    if (r.w) cti_comm_io_done(r.w);
}

static void peer_failed(ct_comm_link *L, int peer, ct_status st, const char *msg)
{
    L->dead[peer] = true;
    rx_abandon(L, peer);
    for (ct_comm_group *g = L->groups; g; g = g->next) {
        int r = g->grank[peer];
        if (r < 0 || g->broken || g->left[r]) continue; /* a rank that said goodbye may go */
        char who[64], title[256], text[CT_COMM_MSG], at[CT_PEER_WHERE + 16];
        cti_comm_rank_name(g, r, who, sizeof who);
        cti_comm_rank_where(g, r, at, sizeof at);
        ct_work *h = g->head && g->head->state == CT_WORK_RUNNING ? g->head : NULL;
        if (h) snprintf(text, sizeof text, "%s: %s %s%s", cti_comm_work_title(title, sizeof title, h), who, msg, at);
        else snprintf(text, sizeof text, "process group of %d ranks: %s %s%s", g->size, who, msg, at);
        cti_comm_group_fail(g, st, true, text);
    }
}

static void link_on_peer_error(void *ctx, int peer, ct_status st, const char *msg) { peer_failed(ctx, peer, st, msg); }

static int protocol_error(ct_comm_link *L, int peer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int protocol_error(ct_comm_link *L, int peer, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    peer_failed(L, peer, CT_ERR_FORMAT, msg);
    return -1;
}

static int link_on_header(void *ctx, int peer, const ct_msg *m, void **dest)
{
    ct_comm_link *L = ctx;
    ct_comm_rx *rx = &L->rx[peer];
    *dest = NULL;
    if (m->kind == CT_MSG_ABORT) {
        if (m->len > ABORT_MAX) return protocol_error(L, peer, "sent an abort message of %u bytes", m->len);
        rx->text = malloc((size_t)m->len + 1);
        if (!rx->text) return 1;
        *dest = rx->text;
        return 0;
    }
    if (m->kind == CT_MSG_PROBE || m->kind == CT_MSG_PROBE_REPLY || m->kind == CT_MSG_BYE)
        return m->len ? protocol_error(L, peer, "sent a control message with a %u-byte payload", m->len) : 0;
    ct_comm_group *g = find_group(L, m->group);
    for (size_t i = 0; !g && i < L->nfreed; i++)
        if (L->freed[i] == m->group) return 1;
    if (!g)
        return protocol_error(L, peer,
                              "sent a message for process group %016llx, which this rank does not have (do all ranks "
                              "create sub-groups in the same order?)",
                              (unsigned long long)m->group);
    int src = g->grank[peer];
    if (src < 0) return protocol_error(L, peer, "sent a message for a process group it is not in");
    if (g->broken) return 1;
    bool stale;
    ct_work *w = cti_comm_match(g, src, m, &stale);
    if (w) {
        if (!cti_comm_accept(w, src, m, dest)) return 1;
        rx->w = w;
        w->io_pending++;
        return 0;
    }
    if (stale) {
        char text[CT_COMM_MSG];
        snprintf(text, sizeof text, "rank %d sent a message for %s #%llu, which already finished here", src,
                 cti_comm_op_name(m->op), (unsigned long long)m->seq);
        cti_comm_group_fail(g, CT_ERR_FORMAT, true, text);
        return 1;
    }
    ct_comm_early *u = malloc(sizeof *u + m->len);
    if (!u) {
        cti_comm_group_fail(g, CT_ERR_NOMEM, true, "out of memory buffering a message that arrived early");
        return 1;
    }
    u->next = NULL;
    u->src = src;
    u->m = *m;
    rx->early = u;
    *dest = m->len ? u->data : NULL;
    return 0;
}

static void on_abort(ct_comm_link *L, int peer, const ct_msg *m, char *text)
{
    ct_comm_group *g = find_group(L, m->group);
    text[m->len] = '\0';
    ct_status st = m->status >= CT_ERR_INVALID && m->status <= CT_ERR_PEER ? (ct_status)m->status : CT_ERR_PEER;
    if (g && g->grank[peer] >= 0) cti_comm_group_fail(g, st, false, text);
}

static void link_on_message(void *ctx, int peer, const ct_msg *m, void *payload)
{
    (void)payload;
    ct_comm_link *L = ctx;
    ct_comm_rx r = L->rx[peer];
    L->rx[peer] = (ct_comm_rx){0};
    if (m->kind == CT_MSG_ABORT) {
        if (r.text) on_abort(L, peer, m, r.text);
        free(r.text);
        return;
    }
    if (m->kind == CT_MSG_PROBE) {
        ct_comm_group *g = find_group(L, m->group);
        uint64_t seen = g ? g->seq_seen : 0, direct = g ? atomic_load(&g->seq_direct) : 0;
        ct_msg reply = {.kind = CT_MSG_PROBE_REPLY, .group = m->group, .seq = seen > direct ? seen : direct,
                        .count = g != NULL};
        cti_comm_send_control(L, peer, &reply, NULL);
        return;
    }
    if (m->kind == CT_MSG_BYE) {
        ct_comm_group *g = find_group(L, m->group);
        if (g && g->grank[peer] >= 0) cti_comm_peer_left(g, g->grank[peer]);
        return;
    }
    if (m->kind == CT_MSG_PROBE_REPLY) {
        ct_comm_group *g = find_group(L, m->group);
        if (g && g->grank[peer] >= 0) g->probe_seq[g->grank[peer]] = m->count ? (int64_t)m->seq : -1;
        return;
    }
    if (r.w) {
        ct_work *w = r.w;
        if (w->state == CT_WORK_RUNNING) w->algo->deliver(w, w->grp->grank[peer], m->step, m->chunk);
        cti_comm_io_done(w);
        return;
    }
    ct_comm_early *u = r.early;
    ct_comm_group *g = find_group(L, m->group);
    if (!u || !g || g->broken) {
        free(u);
        return;
    }
    bool stale;
    ct_work *w = cti_comm_match(g, u->src, m, &stale);
    if (w) {
        cti_comm_feed(w, u); /* its work started while the payload was arriving */
        return;
    }
    ct_comm_early **p = &g->unexp;
    while (*p) p = &(*p)->next;
    *p = u;
}

/* ---- registration and teardown (commands run on the loop) -------------------------------------------- */

typedef struct reg_args {
    ct_comm_group *g, *parent;
    ct_comm_link *L; /* a new link, for a root group */
    const int *peers;
    ct_status st;
    engine *e;
} reg_args;

static void group_free_mem(ct_comm_group *g)
{
    free(g->peers);
    free(g->grank);
    free(g->probe_seq);
    free(g->heard);
    free(g->left);
    free((void *)g->gone);
    free(g);
}

static void on_group_closed(uv_handle_t *h) { group_free_mem(h->data); }

static void on_transport_closed(ct_transport *tp, void *arg)
{
    ct_comm_link *L = arg;
    for (int p = 0; p < tp->size; p++) rx_abandon(L, p);
    tp->ops->free(tp);
    free(L->dead);
    free(L->rx);
    free(L->freed);
    free(L);
}

static void link_unref(ct_comm_link *L)
{
    if (--L->refs == 0) L->tp->ops->close(L->tp, on_transport_closed, L);
}

static void reg_cmd(void *arg)
{
    reg_args *a = arg;
    ct_comm_group *g = a->g;
    ct_comm_link *L = a->parent ? a->parent->L : a->L;
    if (find_group(L, g->id)) {
        a->st = CT_ERR_INTERNAL; /* two groups drew the same 64-bit id */
        return;
    }
    for (int i = 0; i < L->tp->size; i++) g->grank[i] = -1;
    for (int i = 0; i < g->size; i++) {
        g->peers[i] = a->parent ? a->parent->peers[a->peers[i]] : i;
        g->grank[g->peers[i]] = i;
    }
    CT_ASSERT(uv_timer_init(&a->e->loop, &g->timer) == 0); /* only initialises a struct */
    g->timer.data = g;
    g->L = L;
    g->next = L->groups;
    L->groups = g;
    L->refs++;
    if (!a->parent) {
        ct_transport_handler h = {.ctx = L, .on_header = link_on_header, .on_message = link_on_message,
                                  .on_peer_error = link_on_peer_error};
        a->st = L->tp->ops->start(L->tp, &a->e->loop, &h);
    }
}

static void free_cmd(void *arg)
{
    ct_comm_group *g = arg;
    /* goodbye first: the peers then take this rank's closing connection for an
     * orderly exit, not a crash */
    ct_msg bye = {.kind = CT_MSG_BYE, .group = g->id};
    for (int i = 0; i < g->size; i++)
        if (i != g->rank) cti_comm_send_control(g->L, g->peers[i], &bye, NULL);
    if (!g->broken) {
        g->broken = CT_ERR_INVALID;
        snprintf(g->broken_msg, sizeof g->broken_msg, "the process group was freed before it completed");
    }
    cti_comm_drop_early(g);
    while (g->p2p) cti_comm_work_fail(g->p2p, CT_ERR_INVALID, "not completed", "the process group was freed");
    if (g->head) cti_comm_work_fail(g->head, CT_ERR_INVALID, "not completed", "the process group was freed");
    uv_timer_stop(&g->timer);
    ct_comm_link *L = g->L;
    for (ct_comm_group **p = &L->groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    if (L->nfreed == L->capfreed) {
        size_t cap = L->capfreed ? 2 * L->capfreed : 8;
        uint64_t *f = realloc(L->freed, cap * sizeof *f);
        if (f) {
            L->freed = f;
            L->capfreed = cap;
        }
    }
    if (L->nfreed < L->capfreed) L->freed[L->nfreed++] = g->id;
    uv_close((uv_handle_t *)&g->timer, on_group_closed);
    link_unref(L);
}

static void submit_cmd(void *arg)
{
    ct_work *w = arg;
    ct_comm_group *g = w->grp;
    if (cti_comm_is_p2p(w)) {
        if (g->broken) {
            cti_comm_work_fail(w, g->broken, "the group had failed", g->broken_msg);
            return;
        }
        w->next = g->p2p;
        g->p2p = w;
        cti_comm_work_start(w);
        cti_comm_arm_timer(g);
        return;
    }
    g->seq_seen = w->seq;
    if (g->tail) g->tail->next = w;
    else g->head = w;
    g->tail = w;
    cti_comm_group_run(g);
}

/* ---- the caller's side ------------------------------------------------------------------------------- */

ct_comm_group *cti_comm_group_new(ct_comm_group *parent, ct_transport *tp, uint64_t id, int rank, int size,
                                  const int *peers, double timeout_s)
{
    int world = parent ? parent->L->tp->size : tp->size;
    ct_comm_group *g = calloc(1, sizeof *g);
    ct_comm_link *L = parent ? NULL : calloc(1, sizeof *L);
    if (g) {
        g->peers = malloc((size_t)size * sizeof *g->peers);
        g->grank = malloc((size_t)world * sizeof *g->grank);
        g->probe_seq = calloc((size_t)size, sizeof *g->probe_seq);
        g->heard = calloc((size_t)size, sizeof *g->heard);
        g->left = calloc((size_t)size, sizeof *g->left);
        g->gone = calloc((size_t)size, sizeof *g->gone);
    }
    if (L) {
        L->tp = tp;
        L->dead = calloc((size_t)world, sizeof *L->dead);
        L->rx = calloc((size_t)world, sizeof *L->rx);
    }
    bool ok = g && g->peers && g->grank && g->probe_seq && g->heard && g->left && g->gone &&
              (parent || (L && L->dead && L->rx));
    engine *e = ok ? engine_acquire() : NULL;
    if (!e) {
        if (g) group_free_mem(g);
        if (L) {
            free(L->dead);
            free(L->rx);
            free(L);
        }
        if (tp) tp->ops->free(tp);
        if (!ok) ct_error_set(CT_ERR_NOMEM, "pg: out of memory registering a group of %d ranks", size);
        return NULL;
    }
    g->id = id;
    g->rank = rank;
    g->size = size;
    g->timeout_s = timeout_s;
    reg_args a = {.g = g, .parent = parent, .L = L, .peers = peers, .e = e};
    call(e, reg_cmd, &a);
    if (a.st) {
        ct_status st = a.st;
        if (g->L) cti_comm_group_free(g); /* registered: unregister (closes a new transport) */
        else {
            group_free_mem(g);
            engine_release();
        }
        ct_error_set(st, "pg: cannot register the group on the comm loop (%s)",
                     st == CT_ERR_INTERNAL ? "its id is taken" : "the transport did not start");
        return NULL;
    }
    return g;
}

void cti_comm_group_free(ct_comm_group *g)
{
    if (!g) return;
    call(eng, free_cmd, g);
    engine_release();
}

typedef struct fail_args {
    ct_comm_group *g;
    ct_status st;
    const char *msg;
} fail_args;

static void fail_cmd(void *arg)
{
    fail_args *a = arg;
    cti_comm_group_fail(a->g, a->st, true, a->msg);
}

void cti_comm_group_fail_sync(ct_comm_group *g, ct_status st, const char *msg)
{
    fail_args a = {.g = g, .st = st, .msg = msg};
    call(eng, fail_cmd, &a);
}

void cti_comm_submit(ct_comm_group *g, ct_work *w)
{
    w->grp = g;
    w->cmd.fn = submit_cmd;
    w->cmd.arg = w;
    w->cmd.done = NULL;
    post(eng, &w->cmd);
}
