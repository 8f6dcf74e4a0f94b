/* One child process under a deadline, its output captured (ct_bench_spawn,
 * tools/bench.h): how `ctrain bench` runs each `ctrain launch` and gnuplot.
 *
 * One libuv loop per child: the process (spawned detached, so it leads a process
 * group of its own and a signal to the group reaches what it started), its stdout and
 * stderr pipes, and a one-second timer that reports progress and enforces the
 * deadline. At the deadline the group gets SIGTERM -- `ctrain launch` passes it on to
 * its ranks and SIGKILLs them 5 s later -- and 10 s after that SIGKILL. The child is
 * done when it has exited and both pipes are closed; a pipe still open 1 s after the
 * exit (a leftover grandchild holds it) is closed by force.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "tools/bench.h"

#define CAPTURE_MAX (4u << 20) /* bytes kept per stream */
#define KILL_AFTER_S 10.0      /* SIGTERM at the deadline, SIGKILL this much later */
#define DRAIN_S 1.0            /* pipes may outlive the child this long */

typedef struct child child;

typedef struct capture {
    uv_pipe_t pipe;
    child *c;
    bool open;
    char *buf;
    size_t len, cap;
    char chunk[65536];
} capture;

struct child {
    uv_loop_t loop;
    uv_process_t proc;
    uv_timer_t timer;
    uv_signal_t sig[2];
    capture io[2];
    int open_handles;
    bool exited, timed_out, killed, timer_closed;
    int interrupt;      /* SIGINT or SIGTERM received while it ran */
    double kill_at_s;   /* SIGKILL then, once stopping (0: not stopping) */
    int64_t status;
    int term_signal;
    uint64_t t0_ms, exit_ms;
    double timeout_s;
    void (*tick)(double s, void *ud);
    void *ud;
};

static void on_close(uv_handle_t *h)
{
    child *c = h->data;
    c->open_handles--;
}

static void maybe_done(child *c)
{
    if (c->exited && !c->io[0].open && !c->io[1].open && !c->timer_closed) {
        c->timer_closed = true;
        uv_close((uv_handle_t *)&c->timer, on_close);
        for (int k = 0; k < 2; k++) uv_close((uv_handle_t *)&c->sig[k], on_close);
    }
}

static void capture_close(capture *k)
{
    if (!k->open) return;
    k->open = false;
    uv_close((uv_handle_t *)&k->pipe, on_close);
    maybe_done(k->c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    (void)suggested;
    capture *k = (capture *)h; /* the pipe is the first member */
    *b = uv_buf_init(k->chunk, sizeof k->chunk);
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *b)
{
    capture *k = (capture *)h;
    if (nread < 0) {
        capture_close(k);
        return;
    }
    size_t n = (size_t)nread;
    if (k->len + n > CAPTURE_MAX) n = CAPTURE_MAX - k->len; /* the rest is dropped */
    if (!n) return;
    if (k->len + n + 1 > k->cap) {
        size_t cap = k->cap ? k->cap : 1 << 14;
        while (cap < k->len + n + 1) cap *= 2;
        char *p = realloc(k->buf, cap);
        if (!p) return; /* no memory: this piece is lost, the run goes on */
        k->buf = p;
        k->cap = cap;
    }
    memcpy(k->buf + k->len, b->base, n);
    k->len += n;
    k->buf[k->len] = 0;
}

static void on_exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
    child *c = p->data;
    c->exited = true;
    c->status = status;
    c->term_signal = term_signal;
    c->exit_ms = uv_now(&c->loop);
    uv_close((uv_handle_t *)p, on_close);
    maybe_done(c);
}

static void on_timer(uv_timer_t *t)
{
    child *c = t->data;
    double s = (double)(uv_now(&c->loop) - c->t0_ms) / 1e3;
    if (c->exited) {
        if ((double)(uv_now(&c->loop) - c->exit_ms) / 1e3 >= DRAIN_S) {
            capture_close(&c->io[0]);
            capture_close(&c->io[1]);
        }
        return;
    }
    if (c->tick) c->tick(s, c->ud);
    /* ESRCH: the group is gone and the exit callback is on its way */
    if (!c->timed_out && !c->kill_at_s && s >= c->timeout_s) {
        c->timed_out = true;
        c->kill_at_s = s + KILL_AFTER_S;
        kill(-c->proc.pid, SIGTERM);
    } else if (c->kill_at_s && !c->killed && s >= c->kill_at_s) {
        c->killed = true;
        kill(-c->proc.pid, SIGKILL);
    }
}

/* Ctrl-C or a kill of ours: the child, in a group of its own, would not see it; pass
 * it on (ctrain launch stops its ranks) and SIGKILL if it is still there 10 s later. */
static void on_signal(uv_signal_t *h, int sig)
{
    child *c = h->data;
    if (c->exited) return;
    c->interrupt = sig;
    kill(-c->proc.pid, sig);
    if (!c->kill_at_s) c->kill_at_s = (double)(uv_now(&c->loop) - c->t0_ms) / 1e3 + KILL_AFTER_S;
}

static char *take(capture *k)
{
    char *p = k->buf ? k->buf : calloc(1, 1);
    k->buf = NULL;
    return p;
}

ct_status ct_bench_spawn(char *const *argv, double timeout_s, void (*tick)(double s, void *ud), void *ud,
                         ct_bench_exit *res)
{
    *res = (ct_bench_exit){0};
    child *c = calloc(1, sizeof *c);
    if (!c) return ct_error_set(CT_ERR_NOMEM, "running %s: out of memory", argv[0]);
    c->timeout_s = timeout_s, c->tick = tick, c->ud = ud;
    int rc = uv_loop_init(&c->loop);
    if (rc) {
        free(c);
        return ct_error_set(CT_ERR_INTERNAL, "running %s: uv_loop_init: %s", argv[0], uv_strerror(rc));
    }
    uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE}};
    for (int k = 0; k < 2; k++) {
        capture *io = &c->io[k];
        io->c = c;
        uv_pipe_init(&c->loop, &io->pipe, 0); /* no allocation, no system call: cannot fail */
        io->pipe.data = c;
        io->open = true;
        c->open_handles++;
        stdio[1 + k].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
        stdio[1 + k].data.stream = (uv_stream_t *)&io->pipe;
    }
    uv_timer_init(&c->loop, &c->timer);
    c->timer.data = c;
    c->open_handles++;
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int k = 0; k < 2; k++) {
        uv_signal_init(&c->loop, &c->sig[k]); /* cannot fail once the loop is initialised */
        c->sig[k].data = c;
        c->open_handles++;
    }
    uv_process_options_t opts = {.exit_cb = on_exit_cb,
                                 .file = argv[0],
                                 .args = (char **)argv,
                                 .flags = UV_PROCESS_DETACHED,
                                 .stdio_count = 3,
                                 .stdio = stdio};
    c->t0_ms = uv_now(&c->loop);
    rc = uv_spawn(&c->loop, &c->proc, &opts);
    c->proc.data = c;
    c->open_handles++; /* uv_spawn initialises the handle even when it fails */
    ct_status st = CT_OK;
    if (rc) {
        st = ct_error_set(rc == UV_ENOENT ? CT_ERR_UNSUPPORTED : CT_ERR_IO, "cannot run %s: %s", argv[0],
                          uv_strerror(rc));
        uv_close((uv_handle_t *)&c->proc, on_close);
        c->exited = true;
        capture_close(&c->io[0]);
        capture_close(&c->io[1]);
    } else {
        for (int k = 0; k < 2; k++)
            if (uv_read_start((uv_stream_t *)&c->io[k].pipe, on_alloc, on_read)) capture_close(&c->io[k]);
        if ((rc = uv_timer_start(&c->timer, on_timer, 1000, 1000)))
            st = ct_error_set(CT_ERR_INTERNAL, "running %s: uv_timer_start: %s", argv[0], uv_strerror(rc));
        for (int k = 0; k < 2 && !st; k++)
            if ((rc = uv_signal_start(&c->sig[k], on_signal, sigs[k])))
                st = ct_error_set(CT_ERR_INTERNAL, "running %s: uv_signal_start: %s", argv[0], uv_strerror(rc));
        if (st) kill(-c->proc.pid, SIGKILL); /* no deadline could be kept */
    }
    uv_run(&c->loop, UV_RUN_DEFAULT);
    CT_ASSERT(c->open_handles == 0);
    uv_loop_close(&c->loop);
    if (!st) {
        res->status = c->term_signal ? 128 + c->term_signal : (int)c->status;
        res->timed_out = c->timed_out;
        res->interrupt = c->interrupt;
    }
    res->out = take(&c->io[0]);
    res->err = take(&c->io[1]);
    free(c);
    return st;
}
