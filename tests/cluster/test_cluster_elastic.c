/* Restarts and the elastic rendezvous of `ctrain launch` (docs/launch.md, "Restarts"
 * and "Elastic training") on a cluster of network namespaces (tests/cluster/netns.sh):
 * one launcher per node, the ranks of different nodes meeting only over the network.
 *
 * The program is the GPT example, tiny, one thread per rank, dropout on (so the ranks'
 * generators matter), with one command line for every attempt: --project_dir (one
 * directory that every node names: the nodes share the file system, as machines share
 * an NFS mount), --save_every and --resume auto. Checkpoints need that shared
 * directory: under DDP rank 0 writes every file, but every rank of a restart loads
 * them; under ZeRO-3 every rank writes its own shards into the directory rank 0 made
 * (accel/checkpoint_save.c).
 *
 * - A rank killed, or all of one node's ranks killed, after the first checkpoint: both
 *   launchers restart (static rendezvous, or a new c10d round of the same 2 nodes), the
 *   job resumes from the latest complete checkpoint, and its final model.safetensors is
 *   byte for byte an uninterrupted 2 x 2 run's (accel/checkpoint.h: resume is bitwise at
 *   the same world size).
 * - A node lost for good (every process of node 2 of 3 killed, its launcher included)
 *   under --min_nodes 2 --max_nodes 3: the other two form a new round and resume at
 *   world size 2 from the checkpoint, resharded under ZeRO-3; the final model is byte for
 *   byte that of a 2-node job resumed from the same checkpoint with --resume DIR.
 *   From a checkpoint at an odd step (504 samples into the epoch, which the global batch
 *   of 2 nodes, 16, does not divide) every rank's load fails naming both batches and the job
 *   ends once the restarts are spent.
 * - The host lost (node 0 killed) under c10d: the survivor exits non-zero in bounded time
 *   naming the host's address and port.
 * - A project directory per node (no shared file system): the restart fails on both
 *   nodes rather than train on with the ranks at different steps.
 *
 * Each test logs, with cr_log_info, the seconds from the fault to the restart (the new
 * round) and to the end of the job. Without root or network namespaces every test
 * reports itself skipped, with the reason. */
#include <criterion/criterion.h>

#include "tests/cluster/cluster.h"
#include "tests/tmpdir.h"

#define PORT 29500 /* the launchers' store (c10d) or the ranks' (static); each cluster has its own network */
#define TOKEN "cluster-elastic-token-0123456789"
#define STEPS 300      /* about 1 s on 2 x 2 ranks: far more than the fault needs to land */
#define SAVE_EVERY 20  /* even: 3 -> 2 nodes resumes (6 s samples consumed are a multiple of 4) */
#define ODD_SAVE_EVERY 21 /* 3 b x 21 samples: not a multiple of 2 b, 3 -> 2 nodes cannot resume */
#define JOB_LIMIT 60   /* seconds for any job of these tests to end */
#define HOST_LOST_LIMIT 10 /* seconds for a survivor to give up on a lost host */

static void fini(void)
{
    cluster_down();
    remove_tmpdir();
}

static const char *ex_dir(void) { return cluster_env_or_skip("CTRAIN_EXAMPLES"); }
static const char *ctrain_bin(void) { return cluster_env_or_skip("CTRAIN_BIN"); }

/* tmpdir/text.txt: 400 short lines, a tiny GPT's train and validation text; then n nodes */
static void setup(int nodes)
{
    ex_dir();
    ctrain_bin();
    make_tmpdir_with("/tmp/ct_cluster_el_");
    write_small_text(400);
    cluster_up(nodes);
}

/* The GPT example: batch `batch` per rank, into tmpdir/<out>, checkpoints every
 * save_every steps under tmpdir/<proj>, resuming from `resume` ("auto" or a checkpoint
 * directory). Under 3 nodes x 1 rank of batch 2 the global batch is 6 and an epoch 192
 * steps; a checkpoint at an even step s has consumed 6 s samples of its epoch, a
 * multiple of the global batch 4 of 2 nodes, so the loader can continue at the same
 * sample after the third node is lost. */
static int save_every = SAVE_EVERY;

static const char *gpt_prog(const char *out, const char *proj, int batch, const char *resume)
{
    static char a[2048];
    snprintf(a, sizeof a,
             "%s/gpt_train --data %s --out_dir %s/%s --project_dir %s/%s --n_layer 2 --n_head 2 --n_embd 32 "
             "--block_size 32 --batch_size %d --dropout 0.1 --steps %d --warmup 2 --seq_warmup 0 --eval_every %d "
             "--eval_batches 1 --sample_tokens 0 --threads 1 --save_every %d --resume %s",
             ex_dir(), path_of("text.txt"), tmpdir, out, tmpdir, proj, batch, STEPS, STEPS, save_every, resume);
    return a;
}

/* The launch command of machine rank m: `nodes` machines of `per_node` ranks, master
 * node 0; flags: the restart and rendezvous flags. */
static const char *launch_cmd(int nodes, int per_node, int m, const char *flags, const char *prog)
{
    static char c[4096];
    snprintf(c, sizeof c,
             "%s launch --cpu --num_processes %d --num_machines %d --machine_rank %d --main_process_ip %s "
             "--main_process_port %d --num_cpu_threads_per_process 1 %s %s",
             ctrain_bin(), nodes * per_node, nodes, m, node_addr(0), PORT, flags, prog);
    return c;
}

static const char *log_of(const char *job, int m)
{
    static char n[64];
    snprintf(n, sizeof n, "%s.node%d.log", job, m);
    return path_of(n);
}

static int rank_timeout = 30; /* the ranks' CTRAIN_TIMEOUT, seconds */

/* Starts machine ranks 0..nodes-1 of job `job` (logs tmpdir/<job>.node<m>.log); returns
 * the index in the_cluster.procs of the first. */
static int start_job(const char *job, int nodes, int per_node, const char *flags, const char *prog)
{
    char env[256];
    snprintf(env, sizeof env, "CTRAIN_STORE_TOKEN=%s CTRAIN_TIMEOUT=%d CTRAIN_CONFIG_FILE=/nonexistent/x.yaml", TOKEN,
             rank_timeout);
    int first = the_cluster.nprocs;
    for (int m = 0; m < nodes; m++) node_start(m, env, log_of(job, m), launch_cmd(nodes, per_node, m, flags, prog));
    return first;
}

static char *slurp(const char *path)
{
    size_t n;
    return (char *)read_all(path, &n);
}

/* The end of a log (the errors, not the hundreds of progress lines). */
static const char *tail_of(const char *text) { return strlen(text) > 5000 ? text + strlen(text) - 5000 : text; }

/* Waits until procs [first, first + n) have all ended; fails the test after limit s. */
static void wait_job(const char *job, int first, int n, double limit)
{
    for (int k = first; k < first + n; k++) {
        if (cluster_wait(k, limit)) continue;
        char *t = slurp(log_of(job, the_cluster.procs[k].node));
        cr_assert_fail("%s: node %d's launcher still runs after %.0f s:\n...%s", job, the_cluster.procs[k].node, limit,
                       tail_of(t));
    }
}

/* A job that must succeed: every launcher exits 0 (else the test fails showing the end
 * of every node's log: a failure on one node often starts on another). */
static void expect_success(const char *job, int first, int n)
{
    for (int k = first; k < first + n; k++) {
        cluster_proc *p = &the_cluster.procs[k];
        if (p->status == 0) continue;
        for (int j = first; j < first + n; j++) {
            char *t = slurp(log_of(job, the_cluster.procs[j].node));
            cr_log_error("%s: node %d's launcher exited with status %d; its log ends:\n...%s", job,
                         the_cluster.procs[j].node, the_cluster.procs[j].status, tail_of(t));
            free(t);
        }
        cr_assert_fail("%s: node %d's launcher exited with status %d", job, p->node, p->status);
    }
}

/* Waits until the first checkpoint of tmpdir/<proj> is complete (renamed into place). */
static void wait_first_checkpoint(const char *proj, const char *job)
{
    char d[300];
    snprintf(d, sizeof d, "%s/%s/checkpoints/checkpoint_0", tmpdir, proj);
    double end = now_s() + 30;
    while (access(d, F_OK) != 0) {
        if (now_s() > end) cr_assert_fail("no checkpoint within 30 s:\n...%s", tail_of(slurp(log_of(job, 0))));
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    }
}

/* The pids of the processes on node i whose name (/proc/PID/comm) is comm. */
static int node_pids_named(int i, const char *comm, pid_t *pids, int cap)
{
    pid_t all[512];
    int m = node_pids(i, all, 512), n = 0;
    for (int j = 0; j < m && n < cap; j++) {
        char path[64], name[64] = "";
        snprintf(path, sizeof path, "/proc/%d/comm", (int)all[j]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = '\0';
        fclose(f);
        if (!strcmp(name, comm)) pids[n++] = all[j];
    }
    return n;
}

/* Kills node i for good the moment the first checkpoint of tmpdir/<proj> is complete:
 * its launcher (procs[launcher]) and its ranks, whose pids are gathered beforehand so
 * that nothing but a kill(2) lies between seeing the checkpoint and the kill (a busy
 * machine could otherwise let the job save another checkpoint in between); then
 * anything else on the node. Returns how many processes the first kills reached. */
static int kill_node_at_first_checkpoint(int i, int launcher, int ranks, const char *proj, const char *job)
{
    pid_t pids[16];
    int n = 0;
    double end = now_s() + 30;
    while ((n = node_pids_named(i, "gpt_train", pids + 1, 15)) < ranks) {
        if (now_s() > end) cr_assert_fail("node %d started %d of %d ranks within 30 s", i, n, ranks);
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    }
    pids[0] = the_cluster.procs[launcher].pid;
    wait_first_checkpoint(proj, job);
    int k = 0;
    for (int j = 0; j <= n; j++) k += kill(pids[j], SIGKILL) == 0;
    node_signal(i, SIGKILL);
    return k;
}

/* SIGKILLs `count` of node i's ranks (every one with count < 0); returns how many. They
 * are all stopped first: a rank that saw its neighbour die could otherwise exit on its
 * own (status 1) between two kills. */
static int kill_ranks(int i, int count)
{
    pid_t pids[16];
    int n = node_pids_named(i, "gpt_train", pids, 16), k = 0;
    if (count >= 0 && n > count) n = count;
    for (int j = 0; j < n; j++) kill(pids[j], SIGSTOP);
    for (int j = 0; j < n; j++) k += kill(pids[j], SIGKILL) == 0;
    return k;
}

/* Polls the job's logs until procs [first, first + n) have ended (or limit s): at[j]
 * becomes the seconds from t0 at which marks[j] first appeared in log_of(job, nodes[j]),
 * -1 when it never did. */
static void follow(const char *job, int first, int n, double t0, int nmarks, const int *nodes, const char *const *marks,
                   double *at, double limit)
{
    for (int j = 0; j < nmarks; j++) at[j] = -1;
    double end = now_s() + limit;
    for (;;) {
        bool over = true;
        for (int k = first; k < first + n; k++) over = cluster_poll(k) && over;
        for (int j = 0; j < nmarks; j++) {
            if (at[j] >= 0) continue;
            size_t len;
            FILE *f = fopen(log_of(job, nodes[j]), "r");
            if (!f) continue;
            fclose(f);
            char *t = (char *)read_all(log_of(job, nodes[j]), &len);
            if (strstr(t, marks[j])) at[j] = now_s() - t0;
            free(t);
        }
        if (over || now_s() > end) break;
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    wait_job(job, first, n, 1);
}

/* The checkpoint and step of "[rank0] resumed from DIR at step N" in the log of job's
 * machine rank 0; the step must lie strictly between the first checkpoint and the end,
 * or the restart tested nothing. */
static long resumed_step(const char *job, char *ckpt, size_t cap)
{
    char *t = slurp(log_of(job, 0));
    const char *r = strstr(t, "[rank0] resumed from ");
    cr_assert(r, "%s: the restart did not resume:\n...%s", job, tail_of(t));
    long step = -1;
    const char *at = strstr(r, " at step ");
    cr_assert(at && sscanf(at, " at step %ld", &step) == 1, "%.200s", r);
    size_t len = (size_t)(at - (r + strlen("[rank0] resumed from ")));
    cr_assert_lt(len, cap);
    memcpy(ckpt, r + strlen("[rank0] resumed from "), len);
    ckpt[len] = '\0';
    cr_assert(step >= SAVE_EVERY && step < STEPS && step % SAVE_EVERY == 0,
              "%s: resumed at step %ld, expected a multiple of %d below %d:\n...%s", job, step, SAVE_EVERY, STEPS,
              tail_of(t));
    free(t);
    return step;
}

/* tmpdir/<a>/model.safetensors and tmpdir/<b>/model.safetensors byte for byte. */
static bool same_model(const char *a, const char *b)
{
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", tmpdir, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", tmpdir, b);
    size_t na, nb;
    uint8_t *x = read_all(pa, &na), *y = read_all(pb, &nb);
    bool same = na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static void expect_in(const char *job, int m, const char *want)
{
    char *t = slurp(log_of(job, m));
    cr_expect(strstr(t, want), "%s: expected '%s' in node %d's log:\n...%s", job, want, m, tail_of(t));
    free(t);
}

/* ---- the same world after a restart: bitwise ------------------------------------------- */

enum fault { ONE_RANK, NODE_RANKS };

/* 2 nodes x 2 ranks with --max_restarts 1 under `flags`; once checkpoint_0 is complete,
 * one rank of node 1 (ONE_RANK) or both (NODE_RANKS, its launcher spared) are SIGKILLed.
 * restart0, restart1: what node 0's and node 1's launchers print when they restart (or
 * join the new round); which rank's exit a launcher reports first is a race. */
static void restart_is_bitwise(const char *what, const char *flags, enum fault f, const char *restart0,
                               const char *restart1)
{
    setup(2);
    char all[512];
    snprintf(all, sizeof all, "--max_restarts 1 %s", flags);
    /* the reference: the same job, uninterrupted */
    int ref = start_job("ref", 2, 2, all, gpt_prog("ref", "refproj", 2, "auto"));
    wait_job("ref", ref, 2, JOB_LIMIT);
    expect_success("ref", ref, 2);

    int job = start_job("job", 2, 2, all, gpt_prog("out", "proj", 2, "auto"));
    double t_start = now_s();
    wait_first_checkpoint("proj", "job");
    int killed = kill_ranks(1, f == ONE_RANK ? 1 : -1);
    double t0 = now_s();
    cr_assert_eq(killed, f == ONE_RANK ? 1 : 2, "killed %d of node 1's ranks", killed);
    const int nodes[] = {0, 1, 0};
    const char *marks[] = {restart0, restart1, "[rank0] resumed from "};
    double at[3];
    follow("job", job, 2, t0, 3, nodes, marks, at, JOB_LIMIT);
    expect_success("job", job, 2);
    char ckpt[600];
    long step = resumed_step("job", ckpt, sizeof ckpt);
    for (int j = 0; j < 3; j++) cr_expect_geq(at[j], 0, "%s: node %d's log lacks '%s'", what, nodes[j], marks[j]);
    cr_log_info("%s: killed at %.2f s into the job; restart %.2f s after the kill, resumed (at step %ld) after %.2f s, "
                "the job ended after %.2f s",
                what, t0 - t_start, at[0], step, at[2], now_s() - t0);
    cr_expect(same_model("out", "ref"), "%s: the model after the restart differs from the uninterrupted run's (resumed "
              "from %s at step %ld)", what, ckpt, step);
}

Test(cluster_elastic, static_restart_after_a_killed_rank_is_bitwise, .timeout = 90, .fini = fini)
{
    const char *restart = "restarting the 2 local ranks (restart 1 of 1)";
    restart_is_bitwise("static, one rank of node 1 killed", "", ONE_RANK, restart, restart);
}

Test(cluster_elastic, c10d_restart_after_a_killed_rank_is_bitwise, .timeout = 90, .fini = fini)
{
    restart_is_bitwise("c10d, one rank of node 1 killed", "--rdzv_backend c10d --rdzv_timeout 30", ONE_RANK,
                       "rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 0, ranks 0..1 of 4",
                       "rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 1, ranks 2..3 of 4");
}

/* a transient whole-node failure: node 1's ranks die, its launcher lives and rejoins */
Test(cluster_elastic, c10d_restart_after_a_node_s_ranks_die_is_bitwise, .timeout = 90, .fini = fini)
{
    restart_is_bitwise("c10d, both ranks of node 1 killed", "--rdzv_backend c10d --rdzv_timeout 30", NODE_RANKS,
                       "rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 0, ranks 0..1 of 4",
                       "rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 1, ranks 2..3 of 4");
}

/* ---- a node lost for good: the others go on at a smaller world --------------------------- */

/* 3 nodes x 1 rank under --min_nodes 2 --max_nodes 3 --max_restarts 2 (`strategy` too);
 * once checkpoint_0 is complete, every process of node 2 is SIGKILLed, its launcher
 * included. Nodes 0 and 1 must form round 1 alone and resume at world size 2 from the
 * latest checkpoint; their final model must equal, byte for byte, that of a static
 * 2-node job started with --resume <that checkpoint> (an independent run: no
 * rendezvous round, no restart, another project directory). */
/* Cuts node i off the network the moment the first checkpoint of tmpdir/<proj> is
 * complete: the host side of its link goes down, its processes live on. */
static void cut_node_at_first_checkpoint(int i, const char *proj, const char *job)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip link set %sv%d down", the_cluster.id, i);
    wait_first_checkpoint(proj, job);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void lost_node_continues_as(const char *what, const char *strategy, bool cut)
{
    setup(3);
    char flags[512];
    snprintf(flags, sizeof flags,
             "--rdzv_backend c10d --min_nodes 2 --max_nodes 3 --max_restarts 2 --rdzv_timeout 30 "
             "--rdzv_last_call 0.5 %s",
             strategy);
    int job = start_job("job", 3, 1, flags, gpt_prog("out", "proj", 2, "auto"));
    double t_start = now_s();
    if (cut) {
        cut_node_at_first_checkpoint(2, "proj", "job");
    } else {
        int killed = kill_node_at_first_checkpoint(2, job + 2, 1, "proj", "job");
        cr_assert_eq(killed, 2, "node 2: %d of its launcher and rank killed", killed);
    }
    double t0 = now_s();
    const int nodes[] = {0, 1, 0};
    const char *marks[] = {"rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 0, ranks 0..0 of 2",
                           "rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 1, ranks 1..1 of 2",
                           "[rank0] resumed from "};
    double at[3];
    follow("job", job, 2, t0, 3, nodes, marks, at, JOB_LIMIT);
    double t_end = now_s() - t0;
    expect_success("job", job, 2);
    for (int j = 0; j < 2; j++) expect_in("job", j, "rendezvous round 0: 3 nodes (machine ranks 0,1,2)");
    for (int j = 0; j < 3; j++) cr_expect_geq(at[j], 0, "%s: node %d's log lacks '%s'", what, nodes[j], marks[j]);
    expect_in("job", 0, "2 process(es) x 1 threads");
    char ckpt[600];
    long step = resumed_step("job", ckpt, sizeof ckpt);
    cr_log_info("%s: node 2 %s at %.2f s into the job; round 1 of 2 nodes %.2f s after it, resumed (at step %ld) after "
                "%.2f s, the job ended after %.2f s (CTRAIN_TIMEOUT %d)",
                what, cut ? "cut off" : "killed", t0 - t_start, at[0], step, at[2], t_end, rank_timeout);

    /* the reference: nodes 0 and 1, static, resumed from that checkpoint */
    char ref_flags[512];
    snprintf(ref_flags, sizeof ref_flags, "%s", strategy);
    int ref = start_job("ref", 2, 1, ref_flags, gpt_prog("ref", "refproj", 2, ckpt));
    wait_job("ref", ref, 2, JOB_LIMIT);
    expect_success("ref", ref, 2);
    char want[700];
    snprintf(want, sizeof want, "[rank0] resumed from %s at step %ld", ckpt, step);
    expect_in("ref", 0, want);
    cr_expect(same_model("out", "ref"), "%s: the model after node 2 was lost differs from a 2-node run resumed from %s "
              "(step %ld)", what, ckpt, step);
}

static void lost_node_continues(const char *what, const char *strategy)
{
    lost_node_continues_as(what, strategy, false);
}

/* Node 2's link cut instead: nothing is closed, so the other ranks learn it only when
 * their collective times out (CTRAIN_TIMEOUT 5 s here); their launchers then meet in
 * round 1 without node 2, whose launcher cannot reach the host any more, and the job
 * resumes on 2 nodes as after a kill. */
Test(cluster_elastic, cut_off_node_ddp_continues_on_2_nodes, .timeout = 90, .fini = fini)
{
    rank_timeout = 5;
    lost_node_continues_as("DDP, node 2 of 3 cut off", "", true);
}

Test(cluster_elastic, lost_node_ddp_continues_on_2_nodes, .timeout = 90, .fini = fini)
{
    lost_node_continues("DDP, node 2 of 3 lost", "");
}

Test(cluster_elastic, lost_node_zero3_continues_on_2_nodes, .timeout = 90, .fini = fini)
{
    lost_node_continues("ZeRO-3, node 2 of 3 lost", "--use_deepspeed --zero_stage 3");
}

/* The same loss with checkpoints every ODD_SAVE_EVERY steps, batch 8 per rank (a 48-step
 * epoch; 21 steps take long enough that no second checkpoint comes before the kill):
 * checkpoint_0 stopped 3 x 8 x 21 = 504 samples into the epoch, which the global batch
 * of 2 nodes (16) does not divide, so every rank's load fails naming both global batches
 * (docs/launch.md, "Elastic training"), each failure counts as a restart, and the job
 * ends non-zero once --max_restarts 2 are spent (never resuming at another sample). */
Test(cluster_elastic, lost_node_with_an_indivisible_checkpoint_ends_the_job, .timeout = 90, .fini = fini)
{
    save_every = ODD_SAVE_EVERY;
    setup(3);
    int job = start_job("job", 3, 1,
                        "--rdzv_backend c10d --min_nodes 2 --max_nodes 3 --max_restarts 2 --rdzv_timeout 10 "
                        "--rdzv_last_call 0.5",
                        gpt_prog("out", "proj", 8, "auto"));
    int killed = kill_node_at_first_checkpoint(2, job + 2, 1, "proj", "job");
    cr_assert_eq(killed, 2, "node 2: %d of its launcher and rank killed", killed);
    double t0 = now_s();
    wait_job("job", job, 2, 30);
    char *a = slurp(log_of("job", 0));
    cr_log_info("3 -> 2 nodes from a checkpoint at step %d: the launchers exited with %d and %d %.2f s after the kill",
                ODD_SAVE_EVERY, the_cluster.procs[job].status, the_cluster.procs[job + 1].status, now_s() - t0);
    for (int m = 0; m < 2; m++)
        cr_expect_neq(the_cluster.procs[job + m].status, 0, "node %d's launcher exited 0", m);
    const char *why = "the checkpoint stopped 504 samples into epoch 0 (batch 8 x 3 ranks); a global batch of 16 "
                      "(batch 8 x 2 ranks) does not divide it: keep batch_size x ranks = 24 to resume at that sample";
    cr_expect(strstr(a, why), "expected '%s' in:\n...%s", why, tail_of(a));
    cr_expect(strstr(a, "joining the next rendezvous round (restart 2 of 2)"),
              "node 0 did not spend its restarts:\n...%s", tail_of(a));
    cr_expect(!strstr(a, "[rank0] resumed from ") && !strstr(a, "trained "), "node 0 resumed:\n...%s", tail_of(a));
    free(a);
}

/* The static rendezvous cannot shrink: 2 nodes x 1 rank with --max_restarts 1, node 1
 * lost for good (every process on it) after the first checkpoint. Node 0's rank fails on
 * the lost peer, its launcher restarts it, and the restarted rank waits at the
 * rendezvous for rank 1 until CTRAIN_TIMEOUT (5 s), then fails naming it; with no
 * restart left the launcher exits non-zero. Never a hang, never a job that "finishes"
 * alone. */
Test(cluster_elastic, static_job_without_a_lost_node_ends_after_the_timeout, .timeout = 90, .fini = fini)
{
    rank_timeout = 5;
    setup(2);
    int job = start_job("job", 2, 1, "--max_restarts 1", gpt_prog("out", "proj", 2, "auto"));
    int killed = kill_node_at_first_checkpoint(1, job + 1, 1, "proj", "job");
    cr_assert_eq(killed, 2, "node 1: %d of its launcher and rank killed", killed);
    double t0 = now_s();
    wait_job("job", job, 1, 30);
    double dt = the_cluster.procs[job].ended - t0;
    char *a = slurp(log_of("job", 0));
    const char *err = strstr(a, "tcp: rank(s) ");
    if (!err) err = strstr(a, "cannot reach");
    if (!err) err = strstr(a, "not set within");
    cr_log_info("static, node 1 of 2 lost: node 0's launcher exited %d after %.2f s (CTRAIN_TIMEOUT %d); %.*s",
                the_cluster.procs[job].status, dt, rank_timeout, err ? (int)strcspn(err, "\n") : 0, err ? err : "");
    cr_expect_neq(the_cluster.procs[job].status, 0, "node 0 finished alone:\n...%s", tail_of(a));
    cr_expect(strstr(a, "restarting the 1 local rank (restart 1 of 1)"), "node 0 did not restart:\n...%s",
              tail_of(a));
    cr_expect(!strstr(a, "trained "), "node 0 trained alone:\n...%s", tail_of(a));
    cr_expect_leq(dt, 2.0 * rank_timeout + 8, "node 0 took %.2f s to give up", dt);
    free(a);
}

/* ---- the host lost --------------------------------------------------------------------- */

/* 2 nodes x 2 ranks under c10d with restarts left; every process of node 0 (the
 * rendezvous host) is SIGKILLed in training. Node 1's launcher must exit non-zero within
 * HOST_LOST_LIMIT s, naming the host's address and port (docs/launch.md: the host's
 * limit). */
Test(cluster_elastic, lost_host_ends_the_job_naming_it, .timeout = 90, .fini = fini)
{
    setup(2);
    int job = start_job("job", 2, 2, "--rdzv_backend c10d --max_restarts 2 --rdzv_timeout 30",
                        gpt_prog("out", "proj", 2, "auto"));
    wait_first_checkpoint("proj", "job");
    int killed = node_signal(0, SIGKILL);
    double t0 = now_s();
    cr_assert_geq(killed, 3, "node 0 ran %d processes (its launcher and 2 ranks expected)", killed);
    bool ended = cluster_wait(job + 1, HOST_LOST_LIMIT + 20);
    double dt = now_s() - t0;
    char *t = slurp(log_of("job", 1));
    cr_assert(ended, "node 1's launcher still runs %.1f s after the host was killed:\n...%s", dt, tail_of(t));
    cluster_proc *p = &the_cluster.procs[job + 1];
    dt = p->ended - t0;
    char host[128];
    snprintf(host, sizeof host, "the rendezvous host at %s:%d (machine rank 0's launcher)", node_addr(0), PORT);
    const char *last = strstr(t, host);
    cr_log_info("host lost: node 1's launcher exited with status %d %.2f s after node 0 was killed: %.*s", p->status,
                dt, last ? (int)strcspn(last, "\n") : 0, last ? last : "");
    cr_expect_neq(p->status, 0, "node 1's launcher exited 0 without its host:\n...%s", tail_of(t));
    cr_expect_leq(dt, HOST_LOST_LIMIT, "node 1's launcher took %.2f s to give up", dt);
    cr_expect(last, "no error names '%s':\n...%s", host, tail_of(t));
    free(t);
}

/* ---- checkpoints outside a shared file system -------------------------------------------- */

/* Each node with a project directory of its own (machines without a shared file system):
 * node 0's rank 0 writes the checkpoints where only node 0 looks, so after the restart
 * node 0's ranks load checkpoint_0 while node 1's start at step 1. That must fail the job
 * (the ranks' first collectives differ: the load's against a training step's: node 0's
 * ranks say they cannot resume), never train on with the ranks at different steps. */
Test(cluster_elastic, restart_without_a_shared_project_dir_fails, .timeout = 90, .fini = fini)
{
    setup(2);
    char env[256];
    snprintf(env, sizeof env, "CTRAIN_STORE_TOKEN=%s CTRAIN_TIMEOUT=%d CTRAIN_CONFIG_FILE=/nonexistent/x.yaml", TOKEN,
             rank_timeout);
    for (int m = 0; m < 2; m++) {
        char proj[32];
        snprintf(proj, sizeof proj, "proj%d", m);
        node_start(m, env, log_of("job", m), launch_cmd(2, 2, m, "--max_restarts 1", gpt_prog("out", proj, 2, "auto")));
    }
    wait_first_checkpoint("proj0", "job");
    cr_assert_eq(kill_ranks(1, 1), 1, "node 1 runs no rank");
    double t0 = now_s();
    wait_job("job", 0, 2, JOB_LIMIT);
    char *a = slurp(log_of("job", 0)), *b = slurp(log_of("job", 1));
    cr_log_info("per-node project directories: the launchers exited with %d and %d %.2f s after the kill",
                the_cluster.procs[0].status, the_cluster.procs[1].status, now_s() - t0);
    cr_expect(strstr(a, "restarting the 2 local ranks (restart 1 of 1)"), "node 0 did not restart:\n...%s", tail_of(a));
    cr_expect(strstr(b, "restarting the 2 local ranks (restart 1 of 1)"), "node 1 did not restart:\n...%s", tail_of(b));
    for (int m = 0; m < 2; m++)
        cr_expect_neq(the_cluster.procs[m].status, 0, "node %d's launcher exited 0:\n...%s", m, tail_of(m ? b : a));
    cr_expect(!strstr(a, "trained "), "node 0 trained to the end:\n...%s", tail_of(a));
    cr_expect(strstr(a, "cannot resume from the latest checkpoint"), "node 0's ranks did not fail their load:\n...%s",
              tail_of(a));
    free(a);
    free(b);
}
