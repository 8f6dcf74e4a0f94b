/* The `ctrain launch` supervisor (tools/launch.h; user documentation in
 * docs/launch.md). One thread runs one libuv loop that owns everything below.
 *
 * An attempt. The local ranks are spawned together, each made the leader of a new
 * process group by setsid (UV_PROCESS_DETACHED): a signal to a rank goes to its
 * whole group, which reaches what the rank started too (`sh -c 'sleep 60'`), and a
 * Ctrl-C at the terminal reaches the ranks only through the launcher. A rank's
 * stdout and stderr are pipes; each complete line is written to the launcher's
 * stdout or stderr as "[rankN] line\n" with one write(2) per read, so lines of
 * different ranks never mix. A line longer than 64 KiB goes out as 64 KiB pieces,
 * each prefixed as a line of its own; a partial last line is written when the pipe
 * closes.
 *
 * Decisions are taken on the monitor timer, every --monitor_interval seconds; the
 * libuv callbacks only record what happened:
 *   - a rank that exited non-zero or by a signal, while the group was running, is
 *     the failure (the first one recorded wins). The tick then sends SIGTERM to the
 *     other running ranks' groups and arms the kill timer: SIGKILL 3 s later.
 *   - SIGINT/SIGTERM to the launcher are passed on at once to every running rank's
 *     group and arm the kill timer for 5 s; a second signal sends SIGKILL at once.
 *     The launcher then exits 128 + signal and never restarts.
 *   - the attempt is over when every rank has exited and every pipe is closed. A
 *     pipe still open 1 s after the last rank exited (a leftover grandchild holds
 *     it) is closed by force, so a stray process cannot keep the launcher alive.
 * When the attempt is over the launcher restarts the group (a failure with restarts
 * left; CTRAIN_RESTART_COUNT + 1) or finishes: prints the failure line, closes its
 * timers and signal handles, and the loop returns.
 *
 * The elastic rendezvous (o->elastic; tools/launch_rdzv.h) adds phases around the
 * attempts, driven by the same tick: PHASE_RDZV polls the round joined until it closes,
 * then spawns the round's ranks; PHASE_RUN also asks, each tick, whether another
 * launcher opened a newer round (then the group is stopped and, uncounted, joins it);
 * a failure with restarts left joins the next round instead of respawning at once;
 * PHASE_BARRIER keeps machine rank 0 serving after its ranks finished, until the
 * round's other launchers are done. The store calls are requests answered at once, so
 * output and signals keep flowing between them.
 */
#include "tools/launch.h"
#include "tools/launch_rdzv.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#define TERM_GRACE_MS 3000   /* after a failure: SIGTERM, then SIGKILL */
#define SIGNAL_GRACE_MS 5000 /* after SIGINT/SIGTERM: the signal, then SIGKILL */
#define DRAIN_GRACE_MS 1000  /* pipes may outlive the last rank this long */

typedef struct launcher launcher;
typedef struct rank_proc rank_proc;

/* One of a rank's output pipes. buf holds the current partial line (len bytes);
 * libuv reads straight after it, so a line is never copied before it is relayed.
 * The spare byte lets a line of exactly CT_LAUNCH_LINE_MAX bytes meet its newline
 * and go out whole; only when the spare byte is also filled is a piece split off. */
typedef struct stream {
    uv_pipe_t pipe;
    rank_proc *r;
    int out_fd;  /* 1 or 2: where the prefixed lines go */
    int *log_fd; /* the --log_dir file (an entry of launcher.log_fds; -1: none) */
    bool open;
    size_t len;
    char buf[CT_LAUNCH_LINE_MAX + 1];
} stream;

struct rank_proc {
    launcher *L;
    uv_process_t proc;
    int rank, pid;
    bool running; /* spawned and its exit not yet seen */
    stream *out[2];
};

typedef enum { WHY_NONE, WHY_RANK, WHY_SPAWN } why;
/* the elastic rendezvous: waiting for a round, running it, the host waiting for the others */
typedef enum { PHASE_RUN, PHASE_RDZV, PHASE_BARRIER } phase;

struct launcher {
    const ct_launch_opts *o;
    uv_loop_t loop;
    uv_signal_t sig[2];
    uv_timer_t monitor, kill_timer;
    int n, port, restart;
    rank_proc *ranks;
    stream *streams;   /* 2 per rank */
    int *log_fds;      /* 2 per rank, -1 when not teed; kept across restarts */
    int open_handles;  /* process and pipe handles of this attempt not yet closed */
    int running;       /* ranks of this attempt not yet exited */
    uint64_t last_exit_ms;
    bool stopping;     /* the group has been told to stop */
    why why;           /* the failure of this attempt */
    int fail_rank, fail_pid, fail_signal, stopped_others, spawn_code;
    int64_t fail_status;
    int interrupt;     /* SIGINT/SIGTERM received by the launcher, 0 if none */
    bool fd_dead[3];   /* our stdout/stderr stopped taking writes */
    char *out;         /* prefixed lines of one read */
    size_t out_cap;
    int exit_code;
    ct_launch_rdzv *rdzv; /* NULL: the static rendezvous */
    phase phase;
    ct_launch_round round; /* the round running (elastic) */
    bool new_round;        /* stopped for a newer round another launcher opened */
    bool rdzv_lost;        /* stopped because the host cannot be asked */
};

/* ---- output ---------------------------------------------------------------------- */

/* Writes all of buf to fd. Blocking on a slow reader of our stdout is the right
 * backpressure: the ranks' pipes then fill and they wait too. Returns errno or 0. */
static int write_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                if (poll(&p, 1, -1) < 0 && errno != EINTR) return errno;
                continue;
            }
            return errno;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

static void emit(launcher *L, int fd, const char *buf, size_t len)
{
    if (!len || L->fd_dead[fd]) return;
    int e = write_all(fd, buf, len);
    if (!e) return;
    L->fd_dead[fd] = true;
    if (fd == 1)
        fprintf(stderr, "ctrain launch: writing the ranks' output to stdout failed (%s); dropping it from now on\n",
                strerror(e));
}

static void tee_write(stream *s, const char *buf, size_t len)
{
    if (*s->log_fd < 0) return;
    int e = write_all(*s->log_fd, buf, len);
    if (!e) return;
    fprintf(stderr, "ctrain launch: --log_dir %s: writing rank%d.%s failed (%s); no longer logging it\n",
            s->r->L->o->log_dir, s->r->rank, s->out_fd == 1 ? "stdout" : "stderr", strerror(e));
    close(*s->log_fd);
    *s->log_fd = -1;
}

/* Appends "[rankN] " + line + "\n" to L->out. */
static bool out_line(launcher *L, size_t *used, int rank, const char *line, size_t len)
{
    char prefix[32];
    int np = snprintf(prefix, sizeof prefix, "[rank%d] ", rank);
    size_t need = *used + (size_t)np + len + 1;
    if (need > L->out_cap) {
        size_t cap = L->out_cap ? L->out_cap : 1 << 17;
        while (cap < need) cap *= 2;
        char *p = realloc(L->out, cap);
        if (!p) return false;
        L->out = p;
        L->out_cap = cap;
    }
    memcpy(L->out + *used, prefix, (size_t)np);
    memcpy(L->out + *used + np, line, len);
    L->out[*used + (size_t)np + len] = '\n';
    *used = need;
    return true;
}

/* Relays the complete lines of s->buf; `scanned` bytes are known to hold no
 * newline. At the end of the stream the partial rest goes out as a line too. */
static void relay(stream *s, size_t scanned, bool at_end)
{
    launcher *L = s->r->L;
    size_t used = 0, start = 0;
    bool ok = true;
    for (const char *nl; ok && (nl = memchr(s->buf + scanned, '\n', s->len - scanned)) != NULL;) {
        size_t end = (size_t)(nl - s->buf);
        ok = out_line(L, &used, s->r->rank, s->buf + start, end - start);
        start = scanned = end + 1;
    }
    size_t rest = s->len - start;
    if (ok && rest > CT_LAUNCH_LINE_MAX) {
        ok = out_line(L, &used, s->r->rank, s->buf + start, CT_LAUNCH_LINE_MAX);
        start += CT_LAUNCH_LINE_MAX;
        rest -= CT_LAUNCH_LINE_MAX;
    }
    if (ok && rest && at_end) {
        ok = out_line(L, &used, s->r->rank, s->buf + start, rest);
        start = s->len;
        rest = 0;
    }
    emit(L, s->out_fd, L->out, used);
    if (!ok) {
        /* No memory for the prefixed copy: the bytes still go out, unprefixed. */
        fprintf(stderr, "ctrain launch: out of memory relaying rank %d's output; writing it unprefixed\n", s->r->rank);
        emit(L, s->out_fd, s->buf + start, rest);
        start = s->len;
        rest = 0;
    }
    memmove(s->buf, s->buf + start, rest);
    s->len = rest;
}

static void on_pipe_close(uv_handle_t *h)
{
    stream *s = h->data;
    s->r->L->open_handles--;
}

static void stream_close(stream *s)
{
    if (!s->open) return;
    s->open = false;
    if (s->len) relay(s, 0, true);
    uv_close((uv_handle_t *)&s->pipe, on_pipe_close);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    (void)suggested;
    stream *s = h->data;
    *b = uv_buf_init(s->buf + s->len, (unsigned)(sizeof s->buf - s->len));
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *b)
{
    stream *s = h->data;
    if (nread > 0) {
        tee_write(s, b->base, (size_t)nread);
        size_t old = s->len;
        s->len += (size_t)nread;
        relay(s, old, false);
    } else if (nread < 0) {
        if (nread != UV_EOF)
            fprintf(stderr, "ctrain launch: reading rank %d's %s failed: %s\n", s->r->rank,
                    s->out_fd == 1 ? "stdout" : "stderr", uv_strerror((int)nread));
        stream_close(s);
    }
}

/* ---- the group ------------------------------------------------------------------- */

/* Sends sig to the process group of every running rank; returns how many. */
static int signal_group(launcher *L, int sig)
{
    int k = 0;
    for (int i = 0; i < L->n; i++) {
        rank_proc *r = &L->ranks[i];
        if (!r->running) continue;
        /* ESRCH: the group is gone and the exit callback is on its way. */
        if (kill(-r->pid, sig) != 0 && errno != ESRCH)
            fprintf(stderr, "ctrain launch: kill(-%d, %s) for rank %d failed: %s\n", r->pid, strsignal(sig), r->rank,
                    strerror(errno));
        k++;
    }
    return k;
}

static void on_kill_timer(uv_timer_t *t)
{
    signal_group(t->data, SIGKILL);
}

static void arm_kill_timer(launcher *L, uint64_t ms)
{
    /* An earlier deadline already set stays. */
    if (uv_is_active((uv_handle_t *)&L->kill_timer) && uv_timer_get_due_in(&L->kill_timer) <= ms) return;
    int rc = uv_timer_start(&L->kill_timer, on_kill_timer, ms, 0);
    if (rc) {
        fprintf(stderr, "ctrain launch: uv_timer_start: %s; sending SIGKILL now\n", uv_strerror(rc));
        signal_group(L, SIGKILL);
    }
}

static void stop_group(launcher *L)
{
    L->stopping = true;
    L->stopped_others = signal_group(L, SIGTERM);
    arm_kill_timer(L, TERM_GRACE_MS);
}

static void on_proc_close(uv_handle_t *h)
{
    rank_proc *r = h->data;
    r->L->open_handles--;
}

static void on_rank_exit(uv_process_t *p, int64_t status, int term_signal)
{
    rank_proc *r = p->data;
    launcher *L = r->L;
    r->running = false;
    L->running--;
    if ((status || term_signal) && L->why == WHY_NONE && !L->stopping && !L->interrupt) {
        L->why = WHY_RANK;
        L->fail_rank = r->rank;
        L->fail_pid = r->pid;
        L->fail_status = status;
        L->fail_signal = term_signal;
    }
    if (!L->running) L->last_exit_ms = uv_now(&L->loop);
    uv_close((uv_handle_t *)p, on_proc_close);
}

static int spawn_exit_code(int rc)
{
    if (rc == UV_ENOENT || rc == UV_ENOTDIR || rc == UV_ENAMETOOLONG) return CT_LAUNCH_EXIT_NOT_FOUND;
    if (rc == UV_ENOMEM || rc == UV_EMFILE || rc == UV_ENFILE || rc == UV_EAGAIN) return CT_LAUNCH_EXIT_SETUP;
    return CT_LAUNCH_EXIT_NOT_EXEC;
}

static void spawn_failed(launcher *L, int rank, int rc)
{
    const char *prog = L->o->program_argv[0];
    const char *hint = "";
    if (rc == UV_ENOENT)
        hint = strchr(prog, '/') ? " (check the path)" : " (not found on PATH; give a path such as ./prog)";
    else if (rc == UV_EACCES)
        hint = " (is it executable? chmod +x)";
    fprintf(stderr, "ctrain launch: cannot run '%s' for rank %d: %s%s\n", prog, rank, uv_strerror(rc), hint);
    L->why = WHY_SPAWN;
    L->spawn_code = spawn_exit_code(rc);
}

/* Starts rank r (local rank i) of this attempt. Any handle initialised here is
 * counted in open_handles and closed through the usual callbacks. */
static void spawn_rank(launcher *L, int i)
{
    const ct_launch_opts *o = L->o;
    rank_proc *r = &L->ranks[i];
    const int node = L->rdzv ? L->round.node_rank : o->machine_rank;
    *r = (rank_proc){.L = L, .rank = node * o->local_processes + i};
    char **env = L->rdzv ? ct_launch_env_round(o, i, L->round.port, L->restart, node, L->round.nodes, L->round.round)
                         : ct_launch_env_new(o, i, L->port, L->restart);
    if (!env) {
        fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
        L->why = WHY_SPAWN;
        L->spawn_code = CT_LAUNCH_EXIT_SETUP;
        return;
    }
    uv_stdio_container_t stdio[3];
    /* stdin is shared with the launcher; when it is closed, libuv gives /dev/null. */
    stdio[0].flags = fcntl(0, F_GETFD) == -1 ? UV_IGNORE : UV_INHERIT_FD;
    stdio[0].data.fd = 0;
    for (int k = 0; k < 2; k++) {
        stream *s = &L->streams[2 * i + k];
        s->r = r;
        s->out_fd = 1 + k;
        s->log_fd = &L->log_fds[2 * i + k];
        s->len = 0;
        r->out[k] = s;
        int rc = uv_pipe_init(&L->loop, &s->pipe, 0);
        CT_ASSERT(rc == 0); /* cannot fail on Unix: no allocation, no system call */
        s->pipe.data = s;
        s->open = true;
        L->open_handles++;
        stdio[1 + k].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
        stdio[1 + k].data.stream = (uv_stream_t *)&s->pipe;
    }
    uv_process_options_t opts = {
        .exit_cb = on_rank_exit,
        .file = o->program_argv[0],
        .args = o->program_argv,
        .env = env,
        .flags = UV_PROCESS_DETACHED,
        .stdio_count = 3,
        .stdio = stdio,
    };
    int rc = uv_spawn(&L->loop, &r->proc, &opts);
    ct_launch_env_free(env);
    r->proc.data = r;
    L->open_handles++; /* uv_spawn initialises the handle even when it fails */
    if (rc) {
        spawn_failed(L, r->rank, rc);
        uv_close((uv_handle_t *)&r->proc, on_proc_close);
        stream_close(r->out[0]);
        stream_close(r->out[1]);
        return;
    }
    r->pid = r->proc.pid;
    r->running = true;
    L->running++;
    for (int k = 0; k < 2; k++) {
        rc = uv_read_start((uv_stream_t *)&r->out[k]->pipe, on_alloc, on_read);
        if (rc) {
            fprintf(stderr, "ctrain launch: reading rank %d's output: uv_read_start: %s\n", r->rank, uv_strerror(rc));
            stream_close(r->out[k]);
            if (L->why == WHY_NONE) {
                L->why = WHY_SPAWN;
                L->spawn_code = CT_LAUNCH_EXIT_SETUP;
            }
        }
    }
}

static void spawn_group(launcher *L)
{
    L->running = 0;
    L->last_exit_ms = 0;
    L->stopping = false;
    L->why = WHY_NONE;
    L->stopped_others = 0;
    L->new_round = L->rdzv_lost = false;
    L->phase = PHASE_RUN;
    for (int i = 0; i < L->n && L->why == WHY_NONE; i++) spawn_rank(L, i);
    if (L->why != WHY_NONE) stop_group(L);
}

/* "rank 1 (pid 4242) exited with status 3; stopped the other 3 ranks" */
static void describe_failure(launcher *L, char *buf, size_t cap)
{
    int k = snprintf(buf, cap, "rank %d (pid %d) ", L->fail_rank, L->fail_pid);
    if (L->fail_signal)
        k += snprintf(buf + k, cap - (size_t)k, "was killed by signal %d (%s)", L->fail_signal,
                      strsignal(L->fail_signal));
    else
        k += snprintf(buf + k, cap - (size_t)k, "exited with status %lld", (long long)L->fail_status);
    int s = L->stopped_others;
    if (s && s == L->n - 1)
        snprintf(buf + k, cap - (size_t)k, s == 1 ? "; stopped the other rank" : "; stopped the other %d ranks", s);
    else if (s)
        snprintf(buf + k, cap - (size_t)k, "; stopped %d other rank%s still running", s, s == 1 ? "" : "s");
}

static void finish(launcher *L, int code)
{
    L->exit_code = code;
    /* elastic: a launcher that ends a round failing tells the host, which would else wait
     * for it (the host's own failure has no one to tell) */
    if (L->rdzv && code != 0 && L->o->machine_rank != 0 && !L->rdzv_lost) ct_launch_rdzv_failed(L->rdzv, code);
    uv_close((uv_handle_t *)&L->monitor, NULL);
    uv_close((uv_handle_t *)&L->kill_timer, NULL);
    for (int i = 0; i < 2; i++) uv_close((uv_handle_t *)&L->sig[i], NULL);
}

/* Joins the next round of the elastic rendezvous (leave: this launcher's ranks
 * failed); the monitor then polls it. */
static void rejoin(launcher *L, bool leave)
{
    if (ct_launch_rdzv_join(L->rdzv, leave)) {
        fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
        finish(L, CT_LAUNCH_EXIT_SETUP);
        return;
    }
    L->phase = PHASE_RDZV;
}

/* The elastic rendezvous's part of attempt_over; false when the static logic goes on. */
static bool elastic_over(launcher *L)
{
    if (L->interrupt || L->why == WHY_SPAWN) return false;
    if (L->rdzv_lost) {
        finish(L, CT_LAUNCH_EXIT_SETUP);
        return true;
    }
    if (L->why == WHY_NONE && L->new_round) {
        /* a membership change, not a failure here: not counted (torchrun's rule) */
        rejoin(L, false);
        return true;
    }
    if (L->why == WHY_NONE) {
        if (ct_launch_rdzv_done(L->rdzv)) {
            fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
            finish(L, CT_LAUNCH_EXIT_SETUP);
        } else if (L->o->machine_rank == 0 && L->round.nodes > 1) {
            L->phase = PHASE_BARRIER; /* keep serving until the others are done */
        } else {
            finish(L, 0);
        }
        return true;
    }
    if (L->restart >= L->o->max_restarts) return false;
    char what[256];
    describe_failure(L, what, sizeof what);
    L->restart++;
    fprintf(stderr, "ctrain launch: %s; joining the next rendezvous round (restart %d of %d)\n", what, L->restart,
            L->o->max_restarts);
    rejoin(L, true);
    return true;
}

/* Every rank of the attempt has exited and every pipe is closed. */
static void attempt_over(launcher *L)
{
    uv_timer_stop(&L->kill_timer);
    if (L->rdzv && elastic_over(L)) return;
    if (L->interrupt || L->why != WHY_RANK) {
        finish(L, L->interrupt ? 128 + L->interrupt : L->why == WHY_SPAWN ? L->spawn_code : 0);
        return;
    }
    char what[256];
    describe_failure(L, what, sizeof what);
    if (L->restart < L->o->max_restarts) {
        L->restart++;
        fprintf(stderr, "ctrain launch: %s; restarting the %d local rank%s (restart %d of %d)\n", what, L->n,
                L->n == 1 ? "" : "s", L->restart, L->o->max_restarts);
        spawn_group(L);
        return;
    }
    fprintf(stderr, "ctrain launch: %s\n", what);
    finish(L, L->fail_signal ? 128 + L->fail_signal : (int)(L->fail_status & 0xff));
}

/* The elastic rendezvous's part of a tick; true when the tick is done. */
static bool elastic_tick(launcher *L)
{
    if (L->phase == PHASE_RDZV) {
        if (L->interrupt) {
            finish(L, 128 + L->interrupt);
            return true;
        }
        int k = ct_launch_rdzv_poll(L->rdzv, &L->round);
        if (k < 0) {
            fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
            finish(L, CT_LAUNCH_EXIT_SETUP);
        } else if (k > 0) {
            const ct_launch_round *r = &L->round;
            fprintf(stderr,
                    "ctrain launch: rendezvous round %d: %d node%s (machine ranks %s); this is node %d, ranks %d..%d "
                    "of %d\n",
                    r->round, r->nodes, r->nodes == 1 ? "" : "s", r->machines, r->node_rank,
                    r->node_rank * L->n, r->node_rank * L->n + L->n - 1, r->nodes * L->n);
            spawn_group(L);
        }
        return true;
    }
    if (L->phase == PHASE_BARRIER) {
        int k = L->interrupt ? 1 : ct_launch_rdzv_all_done(L->rdzv);
        if (k < 0) fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
        /* this machine's ranks finished the job with theirs; a launcher that died after is
         * no reason to fail it, nor to serve for --rdzv_timeout */
        if (k == 2)
            fprintf(stderr,
                    "ctrain launch: the launcher of machine rank(s) %s has sent no heartbeat for %g s and has not "
                    "reported its ranks' end (killed, frozen or cut off?); not waiting for it\n",
                    ct_launch_rdzv_gone(L->rdzv), CT_LAUNCH_SILENT_S);
        if (k) finish(L, L->interrupt ? 128 + L->interrupt : k < 0 ? CT_LAUNCH_EXIT_SETUP : 0);
        return true;
    }
    if (L->stopping || L->interrupt || L->why != WHY_NONE || !L->running) return false;
    int newer = ct_launch_rdzv_newer(L->rdzv);
    if (newer < 0) {
        fprintf(stderr, "ctrain launch: %s; stopping the local ranks (the host, machine rank 0, ends the job when "
                        "it is lost)\n", ct_last_error());
        L->rdzv_lost = true;
        stop_group(L);
    } else if (newer > 0) {
        fprintf(stderr, "ctrain launch: rendezvous round %d was opened (a node failed or joined); stopping the local "
                        "ranks to join it (not counted as a restart)\n", newer);
        L->new_round = true;
        stop_group(L);
    }
    return false;
}

static void on_tick(uv_timer_t *t)
{
    launcher *L = t->data;
    if (L->rdzv) ct_launch_rdzv_beat(L->rdzv);
    if (L->rdzv && elastic_tick(L)) return;
    if (L->why == WHY_RANK && !L->stopping) stop_group(L);
    if (L->running) return;
    if (L->open_handles && uv_now(&L->loop) - L->last_exit_ms >= DRAIN_GRACE_MS)
        for (int i = 0; i < 2 * L->n; i++) stream_close(&L->streams[i]);
    if (!L->open_handles) attempt_over(L);
}

static void on_signal(uv_signal_t *h, int sig)
{
    launcher *L = h->data;
    if (L->interrupt) {
        int k = signal_group(L, SIGKILL);
        fprintf(stderr, "ctrain launch: got SIG%s again; killed %d rank%s\n", sigabbrev_np(sig), k, k == 1 ? "" : "s");
        return;
    }
    L->interrupt = sig;
    L->stopping = true;
    int k = signal_group(L, sig);
    fprintf(stderr, "ctrain launch: got SIG%s; passed it on to %d rank%s (SIGKILL in %d s)\n", sigabbrev_np(sig), k,
            k == 1 ? "" : "s", SIGNAL_GRACE_MS / 1000);
    arm_kill_timer(L, SIGNAL_GRACE_MS);
}

/* ---- setup ----------------------------------------------------------------------- */

/* A port free on this machine now: bind port 0 on every interface, read back what
 * the kernel chose, close. Rank 0 binds it later; another process could take it in
 * between, which a fixed --main_process_port avoids. what names the purpose in errors. */
ct_status ct_launch_free_port(const char *what, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ct_error_set(CT_ERR_IO, "%s: socket: %s", what, strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = 0};
    socklen_t len = sizeof a;
    ct_status st = CT_OK;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0)
        st = ct_error_set(CT_ERR_IO, "%s: bind to port 0: %s", what, strerror(errno));
    else if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        st = ct_error_set(CT_ERR_IO, "%s: getsockname: %s", what, strerror(errno));
    else
        *port = ntohs(a.sin_port);
    close(fd);
    return st;
}

/* mkdir -p */
static ct_status make_dirs(const char *dir)
{
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p) return ct_error_set(CT_ERR_NOMEM, "--log_dir %s: out of memory", dir);
    memcpy(p, dir, n + 1);
    ct_status st = CT_OK;
    for (size_t i = 1; i <= n && !st; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        struct stat sb;
        if (mkdir(p, 0777) != 0 && (errno != EEXIST || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)))
            st = ct_error_set(CT_ERR_IO, "--log_dir %s: cannot create %s: %s", dir, p,
                              errno == EEXIST ? "exists and is not a directory" : strerror(errno));
        p[i] = c;
    }
    free(p);
    return st;
}

static ct_status open_logs(launcher *L)
{
    const ct_launch_opts *o = L->o;
    for (int i = 0; i < 2 * L->n; i++) L->log_fds[i] = -1;
    if (!o->log_dir || !o->tee) return CT_OK;
    if (make_dirs(o->log_dir)) return ct_last_status();
    for (int i = 0; i < L->n; i++)
        for (int k = 0; k < 2; k++) {
            if (!(o->tee & (1 << k))) continue;
            char path[4096];
            int rank = o->machine_rank * o->local_processes + i;
            snprintf(path, sizeof path, "%s/rank%d.%s", o->log_dir, rank, k ? "stderr" : "stdout");
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0) return ct_error_set(CT_ERR_IO, "--log_dir: cannot open %s: %s", path, strerror(errno));
            L->log_fds[2 * i + k] = fd;
        }
    return CT_OK;
}

static void launcher_free(launcher *L)
{
    ct_launch_rdzv_free(L->rdzv);
    if (L->log_fds)
        for (int i = 0; i < 2 * L->n; i++)
            if (L->log_fds[i] >= 0) close(L->log_fds[i]);
    free(L->log_fds);
    free(L->streams);
    free(L->ranks);
    free(L->out);
}

static int setup_failed(launcher *L, bool loop_open)
{
    fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
    if (loop_open) {
        uv_run(&L->loop, UV_RUN_DEFAULT); /* let closed handles finish closing */
        uv_loop_close(&L->loop);
    }
    launcher_free(L);
    return CT_LAUNCH_EXIT_SETUP;
}

int ct_launch_run(const ct_launch_opts *o)
{
    launcher L = {.o = o, .n = o->local_processes, .port = o->main_process_port};
    /* A closed reader of our stdout must be an error from write(2), not a signal
     * that kills the launcher and orphans the ranks. Ranks get default dispositions
     * back from libuv. */
    signal(SIGPIPE, SIG_IGN);
    L.ranks = calloc((size_t)L.n, sizeof *L.ranks);
    L.streams = calloc(2 * (size_t)L.n, sizeof *L.streams);
    L.log_fds = calloc(2 * (size_t)L.n, sizeof *L.log_fds);
    if (!L.ranks || !L.streams || !L.log_fds) {
        ct_error_set(CT_ERR_NOMEM, "out of memory for %d local ranks", L.n);
        return setup_failed(&L, false);
    }
    if (open_logs(&L)) return setup_failed(&L, false);
    if (!o->elastic && L.port == 0 && ct_launch_free_port("--main_process_port 0", &L.port))
        return setup_failed(&L, false);
    if (o->elastic) {
        /* before the signal handlers: until the loop runs, Ctrl-C ends the launcher at once */
        L.rdzv = ct_launch_rdzv_new(o);
        if (!L.rdzv || ct_launch_rdzv_join(L.rdzv, false)) return setup_failed(&L, false);
        L.phase = PHASE_RDZV;
        fprintf(stderr, "ctrain launch: machine rank %d joined the rendezvous at %s (--min_nodes %d, --max_nodes %d)\n",
                o->machine_rank, ct_launch_rdzv_endpoint(L.rdzv), o->min_nodes, o->max_nodes);
    }

    int rc = uv_loop_init(&L.loop);
    if (rc) {
        ct_error_set(CT_ERR_INTERNAL, "uv_loop_init: %s", uv_strerror(rc));
        return setup_failed(&L, false);
    }
    uv_timer_init(&L.loop, &L.monitor);
    uv_timer_init(&L.loop, &L.kill_timer);
    L.monitor.data = L.kill_timer.data = &L;
    const int sigs[2] = {SIGINT, SIGTERM};
    int nsig = 0;
    for (; nsig < 2 && !rc; nsig++) {
        rc = uv_signal_init(&L.loop, &L.sig[nsig]);
        if (rc) break;
        L.sig[nsig].data = &L;
        rc = uv_signal_start(&L.sig[nsig], on_signal, sigs[nsig]);
    }
    uint64_t ms = (uint64_t)(o->monitor_interval_s * 1000.0 + 0.5);
    if (ms < 1) ms = 1;
    if (!rc) rc = uv_timer_start(&L.monitor, on_tick, ms, ms);
    if (rc) {
        ct_error_set(CT_ERR_INTERNAL, "starting the signal handlers and the monitor: %s", uv_strerror(rc));
        uv_close((uv_handle_t *)&L.monitor, NULL);
        uv_close((uv_handle_t *)&L.kill_timer, NULL);
        for (int i = 0; i < nsig; i++) uv_close((uv_handle_t *)&L.sig[i], NULL);
        return setup_failed(&L, true);
    }

    if (!L.rdzv) spawn_group(&L);
    rc = uv_run(&L.loop, UV_RUN_DEFAULT);
    CT_ASSERT(L.open_handles == 0);
    rc = uv_loop_close(&L.loop);
    if (rc) fprintf(stderr, "ctrain launch: uv_loop_close: %s\n", uv_strerror(rc));
    launcher_free(&L);
    return L.exit_code;
}

int ct_launch_main(int argc, char **argv)
{
    ct_launch_opts o;
    if (ct_launch_args_parse(argc, argv, &o)) {
        fprintf(stderr, "ctrain launch: %s\n", ct_last_error());
        return CT_LAUNCH_EXIT_USAGE;
    }
    if (o.help) {
        ct_launch_usage(stdout);
        return 0;
    }
    if (o.config_default) fprintf(stderr, "ctrain launch: using the configuration in %s\n", o.config_path);
    return ct_launch_run(&o);
}
