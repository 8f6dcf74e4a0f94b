/* Tests for dist/store.c and dist/store_server.c: the key-value operations across
 * handles, waiting, barriers across fork()ed ranks, timeouts that name what is
 * missing, an unreachable and a dead master, and the server's handling of foreign
 * or malformed connections (driven over raw sockets with hand-built frames that
 * follow the format in docs/maintainers/dist.md). Every server binds port 0 on
 * the loopback; every test has a Criterion timeout and every child an alarm. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/store.h"
#include "tests/clock.h"
#include "tests/free_port.h"

static void sleep_ms(int ms) { nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL); }

static ct_store *serve(int world, double timeout_s)
{
    ct_store *s = ct_store_new(&(ct_store_config){.host = "127.0.0.1", .serve = true, .world_size = world,
                                                  .timeout_s = timeout_s});
    cr_assert_not_null(s, "%s", ct_last_error());
    cr_assert_gt(ct_store_port(s), 0);
    return s;
}

static ct_store *client(int port, int rank, int world, double timeout_s)
{
    return ct_store_new(&(ct_store_config){.host = "127.0.0.1", .port = port, .world_size = world, .rank = rank,
                                           .timeout_s = timeout_s});
}

static void expect_value(ct_store *s, const char *key, const void *want, size_t n)
{
    void *v = NULL;
    size_t len = 0;
    cr_assert_eq(ct_store_get(s, key, 2, &v, &len), CT_OK, "get %s: %s", key, ct_last_error());
    cr_expect_eq(len, n, "get %s: %zu bytes, want %zu", key, len, n);
    if (len == n) cr_expect_eq(memcmp(v, want, n), 0, "get %s: other bytes", key);
    cr_expect_eq(((char *)v)[len], '\0', "the value is followed by a NUL");
    free(v);
}

static void expect_error(ct_status st, ct_status want, const char *frag)
{
    cr_expect_eq(st, want, "status %d (%s), want %d", st, ct_last_error(), want);
    if (frag) cr_expect(strstr(ct_last_error(), frag), "'%s' not in: %s", frag, ct_last_error());
}

/* ---- one process ------------------------------------------------------------------ */

Test(dist_store, set_get_add_wait_across_handles, .timeout = 20)
{
    ct_store *srv = serve(1, 5);
    int port = ct_store_port(srv);
    ct_store *a = client(port, 0, 1, 5), *b = client(port, 0, 1, 5);
    cr_assert(a && b, "%s", ct_last_error());

    const char bin[] = {'x', 0, 'y', 0, (char)0xff};
    cr_assert_eq(ct_store_set(a, "bin", bin, sizeof bin), CT_OK, "%s", ct_last_error());
    expect_value(b, "bin", bin, sizeof bin);
    expect_value(srv, "bin", bin, sizeof bin);
    cr_assert_eq(ct_store_set(b, "bin", "new", 3), CT_OK);
    expect_value(a, "bin", "new", 3);
    cr_assert_eq(ct_store_set(a, "empty", NULL, 0), CT_OK, "%s", ct_last_error());
    expect_value(b, "empty", "", 0);

    /* a large value, every byte distinct from its neighbours */
    size_t big = 3u << 20;
    uint8_t *v = malloc(big);
    cr_assert_not_null(v);
    uint32_t x = 12345;
    for (size_t i = 0; i < big; i++) v[i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
    cr_assert_eq(ct_store_set(a, "big", v, big), CT_OK, "%s", ct_last_error());
    expect_value(b, "big", v, big);
    free(v);

    int64_t r = 0;
    cr_assert_eq(ct_store_add(a, "count", 5, &r), CT_OK, "%s", ct_last_error());
    cr_expect_eq(r, 5);
    cr_assert_eq(ct_store_add(b, "count", -7, &r), CT_OK);
    cr_expect_eq(r, -2);
    cr_assert_eq(ct_store_add(srv, "count", INT64_MAX, NULL), CT_OK);
    expect_value(a, "count", "9223372036854775805", 19);
    expect_error(ct_store_add(a, "count", 10, &r), CT_ERR_INVALID, "overflow");
    expect_error(ct_store_add(a, "bin", 1, &r), CT_ERR_INVALID, "not a decimal integer");
    cr_assert_eq(ct_store_set(a, "text", "41", 2), CT_OK);
    cr_assert_eq(ct_store_add(b, "text", 1, &r), CT_OK, "%s", ct_last_error());
    cr_expect_eq(r, 42);

    const char *keys[] = {"bin", "count", "empty"};
    cr_expect_eq(ct_store_wait(b, keys, 3, 1), CT_OK, "%s", ct_last_error());
    cr_expect_eq(ct_store_wait(b, keys, 0, 1), CT_OK);

    /* the handles stay usable after errors that concern one request */
    expect_value(a, "text", "42", 2);
    ct_store_free(a);
    ct_store_free(b);
    ct_store_free(srv);
}

Test(dist_store, bad_arguments, .timeout = 10)
{
    ct_store *s = serve(1, 5);
    char long_key[CT_STORE_MAX_KEY + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    expect_error(ct_store_set(s, long_key, "v", 1), CT_ERR_INVALID, "1025");
    long_key[CT_STORE_MAX_KEY] = '\0';
    cr_expect_eq(ct_store_set(s, long_key, "v", 1), CT_OK, "a key of exactly the limit: %s", ct_last_error());
    expect_value(s, long_key, "v", 1);
    expect_error(ct_store_set(s, "", "v", 1), CT_ERR_INVALID, "key");
    expect_error(ct_store_set(s, NULL, "v", 1), CT_ERR_INVALID, "NULL");
    char one = 0;
    expect_error(ct_store_set(s, "huge", &one, (size_t)CT_STORE_MAX_VALUE + 1), CT_ERR_INVALID, "67108865");
    void *v;
    size_t n;
    expect_error(ct_store_get(s, "k", 1, NULL, &n), CT_ERR_INVALID, NULL);
    expect_error(ct_store_get(NULL, "k", 1, &v, &n), CT_ERR_INVALID, NULL);
    const char *keys[] = {"a", ""};
    expect_error(ct_store_wait(s, keys, 2, 1), CT_ERR_INVALID, "key");
    expect_error(ct_store_wait(s, keys, CT_STORE_MAX_WAIT_KEYS + 1, 1), CT_ERR_INVALID, "4097");
    expect_error(ct_store_barrier(s, "", 1), CT_ERR_INVALID, "name");

    cr_expect_null(client(0, 0, 1, 1), "port 0 without serving");
    expect_error(ct_last_status(), CT_ERR_INVALID, "port 0");
    cr_expect_null(client(ct_store_port(s), 2, 2, 1));
    expect_error(ct_last_status(), CT_ERR_INVALID, "rank 2 of 2");
    cr_expect_null(client(70000, 0, 1, 1));
    cr_expect_null(ct_store_new(NULL));
    ct_store_free(NULL);
    ct_store_free(s);
}

typedef struct delayed {
    int port, delay_ms;
    const char *keys[2];
    ct_status st;
} delayed;

/* sets its keys one after another, delay_ms apart, from a handle of its own */
static void *set_later(void *arg)
{
    delayed *d = arg;
    ct_store *s = client(d->port, 0, 1, 5);
    d->st = s ? CT_OK : ct_last_status();
    for (int i = 0; i < 2 && s; i++) {
        sleep_ms(d->delay_ms);
        if (d->keys[i] && ct_store_set(s, d->keys[i], "late", 4)) d->st = ct_last_status();
    }
    ct_store_free(s);
    return NULL;
}

Test(dist_store, get_and_wait_wake_on_a_later_set, .timeout = 20)
{
    ct_store *s = serve(1, 5);
    delayed d = {ct_store_port(s), 200, {"later", NULL}, CT_OK};
    pthread_t t;
    double t0 = now_s();
    cr_assert_eq(pthread_create(&t, NULL, set_later, &d), 0);
    void *v;
    size_t n;
    cr_assert_eq(ct_store_get(s, "later", 5, &v, &n), CT_OK, "%s", ct_last_error());
    double waited = now_s() - t0;
    cr_expect(n == 4 && !memcmp(v, "late", 4));
    free(v);
    cr_expect_geq(waited, 0.15, "returned before the set (%.3f s)", waited);
    cr_expect_lt(waited, 3.0, "woke %.3f s after the set", waited);
    pthread_join(t, NULL);
    cr_expect_eq(d.st, CT_OK);

    /* wait for two keys: it returns only after the second */
    delayed d2 = {ct_store_port(s), 150, {"p", "q"}, CT_OK};
    const char *keys[] = {"q", "p", "later"};
    t0 = now_s();
    cr_assert_eq(pthread_create(&t, NULL, set_later, &d2), 0);
    cr_expect_eq(ct_store_wait(s, keys, 3, 5), CT_OK, "%s", ct_last_error());
    waited = now_s() - t0;
    cr_expect_geq(waited, 0.25, "returned before both sets (%.3f s)", waited);
    cr_expect_lt(waited, 3.0);
    pthread_join(t, NULL);
    ct_store_free(s);
}

Test(dist_store, get_and_wait_time_out_naming_the_keys, .timeout = 20)
{
    ct_store *s = serve(1, 5);
    void *v;
    size_t n;
    double t0 = now_s();
    expect_error(ct_store_get(s, "never", 0.3, &v, &n), CT_ERR_TIMEOUT, "'never'");
    double waited = now_s() - t0;
    cr_expect(waited >= 0.29 && waited < 3.0, "timed out after %.3f s", waited);
    cr_expect(strstr(ct_last_error(), "0.3 s"), "%s", ct_last_error());

    cr_assert_eq(ct_store_set(s, "x", "1", 1), CT_OK);
    const char *keys[] = {"x", "y", "z"};
    expect_error(ct_store_wait(s, keys, 3, 0.3), CT_ERR_TIMEOUT, "'y', 'z'");
    cr_expect(!strstr(ct_last_error(), "'x'"), "a present key named: %s", ct_last_error());
    cr_expect(strstr(ct_last_error(), "2 of 3"), "%s", ct_last_error());
    /* the handle is still fine after a timeout */
    expect_value(s, "x", "1", 1);

    /* the default timeout (the handle's) applies to timeout_s <= 0 */
    ct_store *c = client(ct_store_port(s), 0, 1, 0.3);
    cr_assert_not_null(c, "%s", ct_last_error());
    t0 = now_s();
    expect_error(ct_store_get(c, "never", 0, &v, &n), CT_ERR_TIMEOUT, "0.3 s");
    cr_expect_lt(now_s() - t0, 3.0);
    ct_store_free(c);
    ct_store_free(s);
}

typedef struct adder {
    ct_store *s;
    int n;
    ct_status st;
} adder;

static void *add_many(void *arg)
{
    adder *a = arg;
    for (int i = 0; i < a->n; i++)
        if (ct_store_add(a->s, "shared", 1, NULL)) a->st = ct_last_status();
    return NULL;
}

Test(dist_store, one_handle_from_several_threads, .timeout = 20)
{
    ct_store *s = serve(1, 5);
    adder a[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (adder){s, 200, CT_OK};
        cr_assert_eq(pthread_create(&t[i], NULL, add_many, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_expect_eq(a[i].st, CT_OK);
    }
    expect_value(s, "shared", "800", 3);
    ct_store_free(s);
}

Test(dist_store, port_zero_and_a_busy_port, .timeout = 10)
{
    ct_store *s = serve(1, 5);
    int port = ct_store_port(s);
    ct_store *c = client(port, 0, 1, 2);
    cr_assert_not_null(c, "%s", ct_last_error());
    cr_expect_eq(ct_store_port(c), port);
    ct_store_free(c);
    ct_store *again = ct_store_new(&(ct_store_config){.host = "127.0.0.1", .port = port, .serve = true,
                                                      .timeout_s = 1});
    cr_expect_null(again, "a second server on a port in use");
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    expect_error(ct_last_status(), CT_ERR_IO, want);
    ct_store_free(again);
    ct_store_free(s);
}

/* ---- timeouts naming who is missing --------------------------------------------------- */

typedef struct barrier_arg {
    ct_store *s;
    double timeout_s;
    ct_status st;
    char msg[512];
} barrier_arg;

static void *barrier_thread(void *arg)
{
    barrier_arg *b = arg;
    b->st = ct_store_barrier(b->s, "init", b->timeout_s);
    snprintf(b->msg, sizeof b->msg, "%s", ct_last_error());
    return NULL;
}

Test(dist_store, barrier_with_a_missing_rank_times_out_naming_it, .timeout = 20)
{
    ct_store *r0 = serve(3, 5);
    ct_store *r1 = client(ct_store_port(r0), 1, 3, 5);
    cr_assert_not_null(r1, "%s", ct_last_error());
    barrier_arg b = {r1, 0.5, CT_OK, ""};
    pthread_t t;
    double t0 = now_s();
    cr_assert_eq(pthread_create(&t, NULL, barrier_thread, &b), 0);
    ct_status st = ct_store_barrier(r0, "init", 0.5);
    double waited = now_s() - t0;
    pthread_join(t, NULL);
    expect_error(st, CT_ERR_TIMEOUT, "barrier 'init': rank 2 of 3 did not arrive within 0.5 s");
    cr_expect_eq(b.st, CT_ERR_TIMEOUT);
    cr_expect(strstr(b.msg, "rank 2 of 3"), "%s", b.msg);
    cr_expect(waited >= 0.45 && waited < 3.0, "timed out after %.3f s", waited);

    /* alone: both others missing */
    ct_store_free(r1);
    expect_error(ct_store_barrier(r0, "solo", 0.3), CT_ERR_TIMEOUT, "ranks 1, 2 of 3 did not arrive within 0.3 s");
    ct_store_free(r0);
}

Test(dist_store, barrier_in_threads_and_generations, .timeout = 20)
{
    ct_store *r0 = serve(2, 5);
    ct_store *r1 = client(ct_store_port(r0), 1, 2, 5);
    cr_assert_not_null(r1, "%s", ct_last_error());
    for (int round = 0; round < 3; round++) {
        barrier_arg b = {r1, 5, CT_OK, ""};
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, barrier_thread, &b), 0);
        cr_expect_eq(ct_store_barrier(r0, "init", 5), CT_OK, "round %d: %s", round, ct_last_error());
        pthread_join(t, NULL);
        cr_expect_eq(b.st, CT_OK, "round %d: %s", round, b.msg);
    }
    /* a fourth barrier rank 1 does not enter: earlier rounds must not satisfy it */
    expect_error(ct_store_barrier(r0, "init", 0.3), CT_ERR_TIMEOUT, "rank 1 of 2");
    ct_store_free(r1);
    ct_store_free(r0);
}

Test(dist_store, unreachable_master_times_out_naming_it, .timeout = 10)
{
    int port = free_port();
    double t0 = now_s();
    ct_store *s = client(port, 0, 1, 0.5);
    double waited = now_s() - t0;
    cr_expect_null(s);
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    expect_error(ct_last_status(), CT_ERR_TIMEOUT, want);
    cr_expect(strstr(ct_last_error(), "CTRAIN_TIMEOUT"), "%s", ct_last_error());
    cr_expect(waited >= 0.45 && waited < 3.0, "gave up after %.3f s", waited);
    ct_store_free(s);
}

Test(dist_store, client_started_before_the_server_retries, .timeout = 20)
{
    /* the server appears 300 ms after the client starts trying */
    int port = free_port();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(10);
        sleep_ms(300);
        ct_store *s = ct_store_new(&(ct_store_config){.host = "127.0.0.1", .port = port, .serve = true,
                                                      .timeout_s = 5});
        if (!s) _exit(2);
        void *v;
        size_t n;
        /* serve until the client says it is done */
        int rc = ct_store_get(s, "done", 8, &v, &n) ? 3 : 0;
        if (!rc) free(v);
        ct_store_free(s);
        _exit(rc);
    }
    ct_store *c = client(port, 0, 1, 5);
    cr_expect_not_null(c, "%s", ct_last_error());
    if (c) cr_expect_eq(ct_store_set(c, "done", "", 0), CT_OK, "%s", ct_last_error());
    ct_store_free(c);
    int status;
    if (!c) kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "server child status %d", status);
}

/* ---- ranks in processes ---------------------------------------------------------------- */

#define NRANKS 4

/* One rank's part: publish a value, meet, read everyone's, count, meet again. Returns
 * 0 or the number of the step that failed (the child's exit status). */
static int rank_main(int port, int rank, ct_store *s)
{
    if (!s) s = client(port, rank, NRANKS, 10);
    if (!s) return 10;
    char key[32], val[64];
    snprintf(key, sizeof key, "addr/%d", rank);
    snprintf(val, sizeof val, "rank %d listens on %d", rank, 1000 + rank);
    int rc = 0;
    if (ct_store_set(s, key, val, strlen(val))) rc = 11;
    else if (ct_store_barrier(s, "init", 10)) rc = 12;
    for (int j = 0; j < NRANKS && !rc; j++) {
        void *v;
        size_t n;
        snprintf(key, sizeof key, "addr/%d", j);
        snprintf(val, sizeof val, "rank %d listens on %d", j, 1000 + j);
        /* after the barrier every value is there: a short timeout */
        if (ct_store_get(s, key, 0.5, &v, &n)) rc = 13;
        else if (n != strlen(val) || memcmp(v, val, n)) rc = 14;
        if (!rc) free(v);
    }
    if (!rc && ct_store_add(s, "sum", rank + 1, NULL)) rc = 15;
    if (!rc && ct_store_barrier(s, "sum", 10)) rc = 16;
    if (!rc) {
        void *v;
        size_t n;
        /* 1 + 2 + 3 + 4 */
        if (ct_store_get(s, "sum", 1, &v, &n)) rc = 17;
        else if (n != 2 || memcmp(v, "10", 2)) rc = 18;
        if (!rc) free(v);
    }
    if (!rc && ct_store_barrier(s, "init", 10)) rc = 19; /* a second round of a name */
    if (!rc && ct_store_barrier(s, "exit", 10)) rc = 20; /* rank 0 serves until all are done */
    if (rc) fprintf(stderr, "rank %d: step %d: %s\n", rank, rc, ct_last_error());
    ct_store_free(s);
    return rc;
}

Test(dist_store, forked_ranks_barrier_and_exchange, .timeout = 30)
{
    /* the children fork before rank 0 serves (no thread to lose) and learn the port
     * through a pipe */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pids[NRANKS];
    for (int r = 1; r < NRANKS; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0);
        if (pids[r] == 0) {
            alarm(20);
            close(fds[1]);
            int port;
            if (read(fds[0], &port, sizeof port) != sizeof port) _exit(9);
            _exit(rank_main(port, r, NULL));
        }
    }
    close(fds[0]);
    ct_store *s = ct_store_new(&(ct_store_config){.serve = true, .world_size = NRANKS, .timeout_s = 10});
    int port = s ? ct_store_port(s) : -1;
    for (int r = 1; r < NRANKS; r++)
        if (write(fds[1], &port, sizeof port) != sizeof port) kill(pids[r], SIGKILL);
    close(fds[1]);
    int rc0 = s ? rank_main(port, 0, s) : -1;
    for (int r = 1; r < NRANKS; r++) {
        int status;
        cr_assert_eq(waitpid(pids[r], &status, 0), pids[r]);
        cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status %d", r, status);
    }
    cr_expect_eq(rc0, 0, "rank 0 failed at step %d", rc0);
}

/* After the last barrier rank 0 frees its store while a peer's request may still be
 * on the wire: the server keeps answering until its clients hang up (bounded), so
 * the peer gets its reply, not a lost master. */
Test(dist_store, a_stopping_server_answers_until_clients_hang_up, .timeout = 20)
{
    int ports[2], go[2];
    cr_assert_eq(pipe(ports), 0);
    cr_assert_eq(pipe(go), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(15);
        ct_store *s = ct_store_new(&(ct_store_config){.serve = true, .timeout_s = 5});
        if (!s) _exit(3);
        int p = ct_store_port(s);
        char c;
        if (ct_store_set(s, "k", "v", 1) || write(ports[1], &p, sizeof p) != sizeof p ||
            read(go[0], &c, 1) != 1)
            _exit(4);
        ct_store_free(s);
        _exit(0);
    }
    int port;
    cr_assert_eq(read(ports[0], &port, sizeof port), (ssize_t)sizeof port);
    ct_store *c = client(port, 1, 2, 5);
    cr_assert_not_null(c, "%s", ct_last_error());
    cr_assert_eq(write(go[1], "x", 1), 1);
    sleep_ms(200); /* the master is inside ct_store_free by now */
    expect_value(c, "k", "v", 1);
    double t0 = now_s();
    ct_store_free(c);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "master: status %d", status);
    cr_expect_lt(now_s() - t0, 0.5, "the master exits once its last client hangs up");
}

/* ---- a dead master ---------------------------------------------------------------------- */

/* A child that serves on a fresh port, sends the port, then waits to be killed (or
 * dies by itself after die_ms > 0). */
static pid_t spawn_server(int *port, int die_ms)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20);
        close(fds[0]);
        /* no cr_ assertions in a child: its reports would reach the runner as a stranger's */
        ct_store *s = ct_store_new(&(ct_store_config){.serve = true, .timeout_s = 5});
        if (!s) _exit(3);
        int p = ct_store_port(s);
        if (write(fds[1], &p, sizeof p) != sizeof p) _exit(2);
        if (die_ms > 0) {
            sleep_ms(die_ms);
            raise(SIGKILL);
        }
        for (;;) pause();
    }
    close(fds[1]);
    cr_assert_eq(read(fds[0], port, sizeof *port), (ssize_t)sizeof *port);
    close(fds[0]);
    return pid;
}

Test(dist_store, dead_master_gives_peer_error, .timeout = 20)
{
    int port;
    pid_t pid = spawn_server(&port, 0);
    ct_store *c = client(port, 0, 1, 5);
    cr_assert_not_null(c, "%s", ct_last_error());
    cr_assert_eq(ct_store_set(c, "k", "v", 1), CT_OK, "%s", ct_last_error());
    kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, NULL, 0), pid);

    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    void *v;
    size_t n;
    double t0 = now_s();
    expect_error(ct_store_get(c, "k", 5, &v, &n), CT_ERR_PEER, addr);
    cr_expect_lt(now_s() - t0, 3.0);
    /* broken for good: later calls fail at once with the same error */
    t0 = now_s();
    expect_error(ct_store_set(c, "k", "v", 1), CT_ERR_PEER, addr);
    expect_error(ct_store_barrier(c, "b", 5), CT_ERR_PEER, addr);
    cr_expect_lt(now_s() - t0, 1.0);
    ct_store_free(c);
}

Test(dist_store, master_dying_during_a_wait_is_noticed, .timeout = 20)
{
    int port;
    pid_t pid = spawn_server(&port, 400);
    ct_store *c = client(port, 0, 1, 5);
    cr_assert_not_null(c, "%s", ct_last_error());
    void *v;
    size_t n;
    double t0 = now_s();
    ct_status st = ct_store_get(c, "never", 10, &v, &n);
    double waited = now_s() - t0;
    cr_expect(st == CT_ERR_PEER || st == CT_ERR_TIMEOUT, "status %d: %s", st, ct_last_error());
    cr_expect_lt(waited, 3.0, "noticed the death after %.3f s", waited);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    cr_expect(strstr(ct_last_error(), addr), "%s", ct_last_error());
    cr_assert_eq(waitpid(pid, NULL, 0), pid);
    ct_store_free(c);
}

/* a listening socket on the loopback, any port */
static int listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, 8), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* accepts one connection, reads a little, answers like a web server and hangs up */
static void *http_server(void *arg)
{
    int fd = accept(*(int *)arg, NULL, NULL);
    if (fd < 0) return NULL;
    char buf[64];
    if (recv(fd, buf, sizeof buf, 0) > 0) {
        const char *r = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        if (send(fd, r, strlen(r), MSG_NOSIGNAL) < 0) fprintf(stderr, "http_server: send failed\n");
    }
    close(fd);
    return NULL;
}

Test(dist_store, silent_or_foreign_master, .timeout = 20)
{
    /* the kernel completes the handshake from the backlog, but nothing ever answers */
    /* (a new handle's first request is reading the job id: ct_store_new reports it) */
    int port, lfd = listen_any(&port);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    double t0 = now_s();
    ct_store *s = client(port, 0, 1, 0.5);
    double waited = now_s() - t0;
    cr_assert_null(s);
    expect_error(ct_last_status(), CT_ERR_TIMEOUT, addr);
    cr_expect(waited >= 0.45 && waited < 7.0, "gave up after %.3f s", waited);
    cr_expect(strstr(ct_last_error(), "did not answer"), "%s", ct_last_error());
    close(lfd);

    /* another service on the port */
    lfd = listen_any(&port);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, http_server, &lfd), 0);
    s = client(port, 0, 1, 2);
    cr_assert_null(s);
    expect_error(ct_last_status(), CT_ERR_FORMAT, "not a store frame");
    pthread_join(t, NULL);
    close(lfd);
}

/* ---- foreign and malformed connections -------------------------------------------------- */

typedef struct getter {
    int port;
    const char *key;
    ct_status st;
    char msg[512];
} getter;

/* a get from a handle of its own; the value must be "a" */
static void *get_thread(void *arg)
{
    getter *g = arg;
    ct_store *s = client(g->port, 0, 1, 10);
    void *v = NULL;
    size_t n;
    g->st = s ? ct_store_get(s, g->key, 10, &v, &n) : ct_last_status();
    if (!g->st && (n != 1 || memcmp(v, "a", 1))) g->st = CT_ERR_INTERNAL;
    snprintf(g->msg, sizeof g->msg, "%s", ct_last_error());
    free(v);
    ct_store_free(s);
    return NULL;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    return fd;
}

/* Whether the server closes fd within 2 s (reading and discarding anything it sends). */
static bool closed_by_server(int fd)
{
    char buf[256];
    double deadline = now_s() + 2;
    while (now_s() < deadline) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    }
    return false;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* header + body as the maintainers' notes specify */
static size_t frame(uint8_t *out, uint8_t version, uint8_t op, uint16_t nkeys, uint32_t body_len)
{
    memcpy(out, "CTKV", 4);
    out[4] = version;
    out[5] = op;
    out[6] = (uint8_t)nkeys;
    out[7] = (uint8_t)(nkeys >> 8);
    put32(out + 8, body_len);
    return 12;
}

static void send_all(int fd, const void *p, size_t n)
{
    cr_assert_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* A connection past the handshake: a HELLO with the (empty) token, answered OK. */
static int raw_admitted(int port)
{
    int fd = raw_connect(port);
    uint8_t f[12], rep[12];
    send_all(fd, f, frame(f, 1, 5, 0, 0));
    struct pollfd p = {fd, POLLIN, 0};
    cr_assert_eq(poll(&p, 1, 2000), 1);
    cr_assert_eq(recv(fd, rep, sizeof rep, MSG_WAITALL), 12);
    cr_assert(!memcmp(rep, "CTKV", 4) && rep[5] == 0, "the HELLO was not answered OK");
    return fd;
}

Test(dist_store, foreign_and_malformed_connections_are_dropped, .timeout = 30)
{
    ct_store *s = serve(1, 5);
    int port = ct_store_port(s);
    ct_store *good = client(port, 0, 1, 5);
    cr_assert_not_null(good, "%s", ct_last_error());
    cr_assert_eq(ct_store_set(good, "keep", "safe", 4), CT_OK);

    /* a waiter parked across all of it must still be answered */
    getter g = {port, "after", CT_OK, ""};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, get_thread, &g), 0);

    uint8_t f[4096];
    struct {
        const char *what;
    } cases[8];
    int nc = 0;
    int fds[8];

    /* an HTTP request */
    fds[nc] = raw_connect(port);
    send_all(fds[nc], "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    cases[nc++].what = "HTTP request";
    /* random bytes */
    fds[nc] = raw_connect(port);
    uint32_t x = 99;
    for (int i = 0; i < 64; i++) f[i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
    f[0] = 'Q';
    send_all(fds[nc], f, 64);
    cases[nc++].what = "random bytes";
    /* a frame claiming a 4 GiB body */
    fds[nc] = raw_admitted(port);
    send_all(fds[nc], f, frame(f, 1, 1, 1, 0xffffffffu));
    cases[nc++].what = "4 GiB frame";
    /* a value just over the limit */
    fds[nc] = raw_admitted(port);
    send_all(fds[nc], f, frame(f, 1, 1, 1, 4 + 1 + CT_STORE_MAX_VALUE + 4 + CT_STORE_MAX_KEY));
    cases[nc++].what = "oversized value";
    /* a key length past the body */
    fds[nc] = raw_admitted(port);
    size_t h = frame(f, 1, 1, 1, 8);
    put32(f + h, 2000);
    memcpy(f + h + 4, "abcd", 4);
    send_all(fds[nc], f, h + 8);
    cases[nc++].what = "key longer than its frame";
    /* an unknown op */
    fds[nc] = raw_admitted(port);
    h = frame(f, 1, 77, 1, 5);
    put32(f + h, 1);
    f[h + 4] = 'k';
    send_all(fds[nc], f, h + 5);
    cases[nc++].what = "unknown op";
    /* a set with two keys */
    fds[nc] = raw_admitted(port);
    h = frame(f, 1, 1, 2, 10);
    put32(f + h, 1);
    f[h + 4] = 'a';
    put32(f + h + 5, 1);
    f[h + 9] = 'b';
    send_all(fds[nc], f, h + 10);
    cases[nc++].what = "set with two keys";
    /* a get whose timeout field is not 8 bytes */
    fds[nc] = raw_admitted(port);
    h = frame(f, 1, 2, 1, 7);
    put32(f + h, 1);
    f[h + 4] = 'k';
    send_all(fds[nc], f, h + 7);
    cases[nc++].what = "get without its timeout";

    for (int i = 0; i < nc; i++) {
        cr_expect(closed_by_server(fds[i]), "%s: connection not closed", cases[i].what);
        close(fds[i]);
    }

    /* another protocol version is told so, then closed */
    int vfd = raw_connect(port);
    h = frame(f, 9, 1, 1, 5);
    put32(f + h, 1);
    f[h + 4] = 'k';
    send_all(vfd, f, h + 5);
    uint8_t rep[256];
    struct pollfd p = {vfd, POLLIN, 0};
    cr_assert_eq(poll(&p, 1, 2000), 1);
    ssize_t got = recv(vfd, rep, sizeof rep, 0);
    cr_assert_geq(got, 12);
    cr_expect_eq(memcmp(rep, "CTKV", 4), 0);
    cr_expect_eq(rep[5], 2, "an error reply");
    cr_expect(memmem(rep + 12, (size_t)got - 12, "version", 7), "the message names the version");
    close(vfd);

    /* a client that parks a get and hangs up: dropped, and the key's later set is fine */
    int pfd = raw_admitted(port);
    h = frame(f, 1, 2, 1, 4 + 6 + 8);
    put32(f + h, 6);
    memcpy(f + h + 4, "parked", 6);
    memset(f + h + 10, 0, 8);
    f[h + 12] = 0x10; /* about 1000 s */
    send_all(pfd, f, h + 18);
    sleep_ms(50);
    close(pfd);
    sleep_ms(50);
    cr_expect_eq(ct_store_set(good, "parked", "p", 1), CT_OK, "%s", ct_last_error());
    /* clients that ask for a large value and hang up without reading it: the reply in
     * flight meets a reset socket, and the server (a thread of this process) must
     * neither crash nor take SIGPIPE */
    size_t big = 4u << 20;
    char *bigv = calloc(1, big);
    cr_assert_not_null(bigv);
    cr_assert_eq(ct_store_set(good, "big", bigv, big), CT_OK, "%s", ct_last_error());
    free(bigv);
    for (int i = 0; i < 4; i++) {
        int bfd = raw_admitted(port);
        h = frame(f, 1, 2, 1, 4 + 3 + 8);
        put32(f + h, 3);
        memcpy(f + h + 4, "big", 3);
        memset(f + h + 7, 0, 8);
        f[h + 8] = 0x10;
        send_all(bfd, f, h + 15);
        /* reset rather than an orderly close, so the next write fails at once */
        struct linger lin = {1, 0};
        cr_assert_eq(setsockopt(bfd, SOL_SOCKET, SO_LINGER, &lin, sizeof lin), 0);
        if (i % 2) sleep_ms(5);
        close(bfd);
    }
    sleep_ms(100);
    /* a half-sent frame, then a hang-up */
    int hfd = raw_connect(port);
    send_all(hfd, f, 7);
    close(hfd);

    /* nothing disturbed the others */
    cr_expect_eq(ct_store_set(good, "after", "a", 1), CT_OK, "%s", ct_last_error());
    pthread_join(t, NULL);
    cr_expect_eq(g.st, CT_OK, "the parked get: %s", g.msg);
    expect_value(good, "keep", "safe", 4);
    expect_value(s, "parked", "p", 1);
    ct_store *late = client(port, 0, 1, 5);
    cr_assert_not_null(late, "%s", ct_last_error());
    expect_value(late, "keep", "safe", 4);
    ct_store_free(late);
    ct_store_free(good);
    ct_store_free(s);
}

/* Two jobs on one port: a handle of job B refuses job A's store, naming both ids, and
 * job A's data and clients are untouched; the id comes from CTRAIN_JOB_ID by default. */
Test(dist_store, a_store_of_another_job_is_refused, .timeout = 20)
{
    ct_store *a = ct_store_new(&(ct_store_config){.host = "127.0.0.1", .serve = true, .world_size = 2, .timeout_s = 5,
                                                  .job = "job-A"});
    cr_assert_not_null(a, "%s", ct_last_error());
    int port = ct_store_port(a);
    cr_assert_eq(ct_store_set(a, "k", "v", 1), CT_OK);
    ct_store *b = ct_store_new(&(ct_store_config){.host = "127.0.0.1", .port = port, .world_size = 2, .rank = 1,
                                                  .timeout_s = 5, .job = "job-B"});
    cr_assert_null(b);
    cr_assert_eq(ct_last_status(), CT_ERR_PEER);
    cr_assert(strstr(ct_last_error(), "belongs to another job") && strstr(ct_last_error(), "'job-A'") &&
                  strstr(ct_last_error(), "'job-B'"),
              "%s", ct_last_error());
    setenv("CTRAIN_JOB_ID", "job-A", 1);
    ct_store *a1 = ct_store_new(&(ct_store_config){.host = "127.0.0.1", .port = port, .world_size = 2, .rank = 1,
                                                   .timeout_s = 5});
    unsetenv("CTRAIN_JOB_ID");
    cr_assert_not_null(a1, "%s", ct_last_error());
    void *val;
    size_t n;
    cr_assert_eq(ct_store_get(a1, "k", 1, &val, &n), CT_OK);
    cr_assert(n == 1 && !memcmp(val, "v", 1));
    free(val);
    ct_store_free(a1);
    ct_store_free(a);
}
