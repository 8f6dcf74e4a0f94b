/* A cluster of network namespaces on this machine for the multi-node tests (driven by
 * tests/cluster/netns.sh), and the processes run on its nodes: started with a node's
 * network and host name, waited for with a deadline, killed with everything else on the
 * nodes when a test ends (or, through netns.sh's watcher, when its process dies). */
#ifndef CT_TESTS_CLUSTER_H
#define CT_TESTS_CLUSTER_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/clock.h"
#include "tests/shell.h"

#define CLUSTER_MAX_PROCS 16

typedef struct cluster_proc {
    pid_t pid;
    int node;
    double started, ended; /* now_s() */
    int status;            /* shell_status once ended */
    bool done;
} cluster_proc;

typedef struct cluster {
    char script[512];
    char id[32], prefix[32], prefix6[48]; /* "ctc<pid>", "10.231.X", "fd00:231:X::" (may be "") */
    int nodes;
    cluster_proc procs[CLUSTER_MAX_PROCS];
    int nprocs;
} cluster;

static cluster the_cluster;

static inline const char *cluster_env_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

/* "10.231.X.(i+1)": node i's address (the last four results stay valid) */
static inline const char *node_addr(int i)
{
    static char a[4][48];
    static int k;
    k = (k + 1) % 4;
    snprintf(a[k], sizeof a[k], "%s.%d", the_cluster.prefix, i + 1);
    return a[k];
}

/* "fd00:231:X::(i+1)": node i's IPv6 address, "" when the nodes have none */
static inline const char *node_addr6(int i)
{
    static char a[4][64];
    static int k;
    k = (k + 1) % 4;
    if (the_cluster.prefix6[0]) snprintf(a[k], sizeof a[k], "%s%d", the_cluster.prefix6, i + 1);
    else a[k][0] = '\0';
    return a[k];
}

/* Makes n nodes owned by this test's process, or skips the test saying why they cannot be
 * made here (not root, no ip, no CAP_NET_ADMIN). */
static inline void cluster_up(int n)
{
    cluster *c = &the_cluster;
    snprintf(c->script, sizeof c->script, "%s/tests/cluster/netns.sh", cluster_env_or_skip("CTRAIN_SRC"));
    char cmd[2048], out[512];
    snprintf(cmd, sizeof cmd, "%s check", c->script);
    int rc = shell_capture(cmd, out, sizeof out);
    out[strcspn(out, "\n")] = '\0';
    if (rc == 77) cr_skip_test("no network namespaces here: %s", out);
    cr_assert_eq(rc, 0, "%s: %s", cmd, out);
    snprintf(cmd, sizeof cmd, "%s up %d %d 2>&1", c->script, (int)getpid(), n);
    rc = shell_capture(cmd, out, sizeof out);
    c->prefix6[0] = '\0';
    cr_assert(rc == 0 && sscanf(out, "%31s %31s %47s", c->id, c->prefix, c->prefix6) >= 2, "%s: status %d: %s", cmd,
              rc, out);
    c->nodes = n;
    c->nprocs = 0;
}

/* Kills everything on the nodes and removes them (idempotent; the tests' fini). */
static inline void cluster_down(void)
{
    cluster *c = &the_cluster;
    if (!c->id[0]) return;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s down %s", c->script, c->id);
    if (system(cmd) != 0) cr_log_warn("%s failed", cmd);
    for (int i = 0; i < c->nprocs; i++)
        if (!c->procs[i].done) waitpid(c->procs[i].pid, NULL, 0);
    c->id[0] = '\0';
}

/* Runs the shell words `cmd` on node i with its output (stdout and stderr) into log;
 * env: "VAR=value ..." put before cmd with env(1) (values without spaces), or "". The
 * pid is cmd's own (every step on the way execs). Returns its index in the_cluster.procs. */
static inline int node_start(int i, const char *env, const char *log, const char *cmd)
{
    cluster *c = &the_cluster;
    cr_assert(c->nprocs < CLUSTER_MAX_PROCS && i < c->nodes);
    /* the launcher variables of whoever runs the tests must not leak into the nodes */
    char line[8192];
    snprintf(line, sizeof line,
             "exec %s exec %s %d env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u GROUP_RANK -u MASTER_ADDR "
             "-u MASTER_PORT -u CTRAIN_STORE_TOKEN -u CTRAIN_JOB_ID -u CTRAIN_TRANSPORT %s %s >%s 2>&1 </dev/null",
             c->script, c->id, i, env, cmd, log);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    cluster_proc *p = &c->procs[c->nprocs];
    *p = (cluster_proc){.pid = pid, .node = i, .started = now_s()};
    return c->nprocs++;
}

/* Collects the processes that have ended; true when proc k (or all, k < 0) has. */
static inline bool cluster_poll(int k)
{
    cluster *c = &the_cluster;
    bool all = true;
    for (int i = 0; i < c->nprocs; i++) {
        cluster_proc *p = &c->procs[i];
        int st;
        if (!p->done && waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->done = true;
            p->ended = now_s();
            p->status = shell_status(st);
        }
        if (!p->done && (k < 0 || k == i)) all = false;
    }
    return all;
}

/* Waits until proc k (every proc when k < 0) has ended, for at most limit_s; false on
 * time out (the test then fails, and its fini kills what is left). */
static inline bool cluster_wait(int k, double limit_s)
{
    double end = now_s() + limit_s;
    while (!cluster_poll(k)) {
        if (now_s() > end) return false;
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    return true;
}

/* Waits until file path holds text, for at most limit_s. */
static inline bool file_has(const char *path, const char *text, double limit_s)
{
    double end = now_s() + limit_s;
    static char buf[1 << 20];
    do {
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
            if (strstr(buf, text)) return true;
        }
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    } while (now_s() < end);
    return false;
}

/* The pids of the processes on node i (ip netns pids), at most cap; how many. */
static inline int node_pids(int i, pid_t *pids, int cap)
{
    char cmd[256], out[4096];
    snprintf(cmd, sizeof cmd, "ip netns pids %sn%d", the_cluster.id, i);
    cr_assert_eq(shell_capture(cmd, out, sizeof out), 0, "%s", cmd);
    int n = 0;
    for (char *s = strtok(out, " \n"); s && n < cap; s = strtok(NULL, " \n")) pids[n++] = (pid_t)atoi(s);
    return n;
}

/* Sends sig to every process on node i; returns how many it reached. */
static inline int node_signal(int i, int sig)
{
    pid_t pids[512];
    int n = node_pids(i, pids, 512), k = 0;
    for (int j = 0; j < n; j++) k += kill(pids[j], sig) == 0;
    return k;
}

#endif
