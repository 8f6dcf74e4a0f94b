/* The elastic rendezvous of `ctrain launch` (tools/launch_rdzv.c; docs/launch.md,
 * "Elastic training"), on one machine: several launchers with different
 * --machine_rank on 127.0.0.1, each a child of the test with its output in a file,
 * killed with all its descendants when a test fails or a machine is to be "lost".
 *
 * The expectations are written out from the flags: the ranks are `sh -c` scripts
 * that print their environment, or examples/gpt/train.c, whose final model after a
 * node is lost must equal, byte for byte, the one that an ordinary one-process run
 * resumed from the same checkpoint writes (accel/checkpoint.h: a checkpoint loads at
 * another world size; the loader continues at the same sample). */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/free_port.h"
#include "tests/tmpdir.h"
#include "tests/tools/launch_jobs.h"

#define CT_TEST_SILENT_S 15 /* tools/launch_rdzv.h: CT_LAUNCH_SILENT_S */

static const char *bin_or_skip(const char *var)
{
    const char *v = getenv(var);
    if (!v || !*v) cr_skip_test("%s is not set (make test sets it)", var);
    return v;
}

static void setup(void)
{
    setenv("CTRAIN_CONFIG_FILE", "/nonexistent/ctrain-test.yaml", 1);
    const char *vars[] = {"RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "CTRAIN_STORE_TOKEN",
                          "CTRAIN_JOB_ID", "GROUP_WORLD_SIZE", "CTRAIN_RDZV_ROUND", "CTRAIN_RESTART_COUNT"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
    make_tmpdir_with("/tmp/ct_launch_elastic_");
}

/* Starts machine rank mr's launcher: `ctrain launch FLAGS --machine_rank mr PROGRAM`. */
static void start_node(job *j, int mr, const char *flags, const char *program)
{
    char cmd[4096], log[600];
    snprintf(cmd, sizeof cmd, "%s launch %s --machine_rank %d %s", getenv("CTRAIN_BIN"), flags, mr, program);
    snprintf(log, sizeof log, "%s/node%d.log", tmpdir, mr);
    job_start(j, cmd, log);
}

static char *node_log(int mr)
{
    char log[600];
    snprintf(log, sizeof log, "%s/node%d.log", tmpdir, mr);
    return job_slurp(log);
}

static void assert_has(const char *hay, const char *needle, const char *what)
{
    cr_assert(strstr(hay, needle), "%s: expected '%s' in:\n%s", what, needle, hay);
}

#define REPORT                                                                                            \
    "sh -c 'echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE G=$GROUP_RANK N=$GROUP_WORLD_SIZE K=$CTRAIN_RDZV_ROUND " \
    "C=$CTRAIN_RESTART_COUNT M=$MASTER_ADDR:$MASTER_PORT'"

Test(launch_elastic, two_launchers_form_one_world, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512];
    int port = free_port();
    snprintf(flags, sizeof flags,
             "--num_processes 4 --min_nodes 1 --max_nodes 2 --main_process_port %d --rdzv_timeout 20", port);
    job n[2];
    start_node(&n[1], 1, flags, REPORT); /* the host may start last */
    usleep(200000);
    start_node(&n[0], 0, flags, REPORT);
    for (int i = 0; i < 2; i++) cr_assert_eq(job_wait(&n[i], 20), 0, "node %d:\n%s", i, node_log(i));
    char *a = node_log(0), *b = node_log(1);
    /* max_nodes joined: the round closes at once, node ranks in machine-rank order */
    assert_has(a, "rendezvous round 0: 2 nodes (machine ranks 0,1); this is node 0, ranks 0..1 of 4", "host");
    assert_has(b, "rendezvous round 0: 2 nodes (machine ranks 0,1); this is node 1, ranks 2..3 of 4", "node 1");
    /* the ranks' store is on a port of its own, the same for all */
    const char *m = strstr(a, "M=127.0.0.1:");
    cr_assert(m, "%s", a);
    int rport = atoi(m + 12);
    cr_assert(rport > 0 && rport != port, "MASTER_PORT %d (the launchers' store is on %d)", rport, port);
    char want[128];
    for (int r = 0; r < 4; r++) {
        snprintf(want, sizeof want, "[rank%d] R=%d L=%d W=4 G=%d N=2 K=0 C=0 M=127.0.0.1:%d", r, r, r % 2, r / 2,
                 rport);
        assert_has(r < 2 ? a : b, want, "a rank's environment");
    }
    free(a);
    free(b);
    remove_tmpdir();
}

/* Machine ranks 0 and 2 of 3 with --min_nodes 3: the host fails the round after
 * --rdzv_timeout and both launchers exit 1 naming who joined and who is missing. */
Test(launch_elastic, too_few_nodes_time_out, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512];
    snprintf(flags, sizeof flags,
             "--num_processes 3 --min_nodes 3 --max_nodes 3 --main_process_port %d --rdzv_timeout 2", free_port());
    job n[2];
    double t0 = now_s();
    start_node(&n[0], 0, flags, "true");
    start_node(&n[1], 2, flags, "true");
    int st0 = job_wait(&n[0], 15), st1 = job_wait(&n[1], 15);
    double took = now_s() - t0;
    char *a = node_log(0), *c = node_log(2);
    cr_assert_eq(st0, 1, "%s", a);
    cr_assert_eq(st1, 1, "%s", c);
    cr_assert(took >= 1.9 && took < 6, "the launchers gave up after %.1f s with --rdzv_timeout 2", took);
    const char *why = "round 0: 2 of --min_nodes 3 node(s) joined within --rdzv_timeout 2 s (machine ranks 0,2 "
                      "joined; missing: 1)";
    assert_has(a, why, "the host's error");
    assert_has(c, "the host failed ", "machine rank 2's error");
    assert_has(c, why, "machine rank 2's error");
    free(a);
    free(c);
    remove_tmpdir();
}

Test(launch_elastic, unreachable_host_is_named, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512], want[200];
    int port = free_port();
    snprintf(flags, sizeof flags, "--num_processes 2 --max_nodes 2 --main_process_port %d --rdzv_timeout 1", port);
    job j;
    start_node(&j, 1, flags, "true");
    int st = job_wait(&j, 15);
    char *b = node_log(1);
    cr_assert_eq(st, 1, "%s", b);
    snprintf(want, sizeof want, "cannot reach the rendezvous host at 127.0.0.1:%d", port);
    assert_has(b, want, "node 1");
    free(b);
    remove_tmpdir();
}

/* Node 1's rank fails once in round 0: node 1 counts a restart and opens round 1;
 * node 0's rank was healthy, so node 0 only sees the newer round and restarts without
 * counting it (torchrun's rule) — with --max_restarts 0 it could not afford one. */
Test(launch_elastic, membership_change_is_not_counted, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char f0[512], f1[512];
    int port = free_port();
    const char *common = "--num_processes 2 --max_nodes 2 --rdzv_backend c10d --rdzv_timeout 20";
    snprintf(f0, sizeof f0, "%s --main_process_port %d --max_restarts 0", common, port);
    snprintf(f1, sizeof f1, "%s --main_process_port %d --max_restarts 1", common, port);
    const char *prog = "sh -c 'if [ $CTRAIN_RDZV_ROUND = 0 ]; then if [ $GROUP_RANK = 1 ]; then sleep 0.3; exit 3; "
                       "fi; sleep 20; fi; echo R=$RANK W=$WORLD_SIZE K=$CTRAIN_RDZV_ROUND C=$CTRAIN_RESTART_COUNT'";
    job n[2];
    start_node(&n[0], 0, f0, prog);
    start_node(&n[1], 1, f1, prog);
    for (int i = 0; i < 2; i++) cr_assert_eq(job_wait(&n[i], 20), 0, "node %d:\n%s", i, node_log(i));
    char *a = node_log(0), *b = node_log(1);
    assert_has(b, "rank 1 (pid ", "node 1");
    assert_has(b, "exited with status 3; joining the next rendezvous round (restart 1 of 1)", "node 1");
    assert_has(a, "rendezvous round 1 was opened (a node failed or joined); stopping the local ranks to join it "
                  "(not counted as a restart)", "node 0");
    assert_has(a, "[rank0] R=0 W=2 K=1 C=0", "node 0's rank in round 1");
    assert_has(b, "[rank1] R=1 W=2 K=1 C=1", "node 1's rank in round 1");
    free(a);
    free(b);
    remove_tmpdir();
}

/* The host's launcher killed while node 1's rank runs: node 1 stops and fails naming it. */
Test(launch_elastic, lost_host_ends_the_job, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512], marker[600], prog[800], want[200];
    int port = free_port();
    snprintf(flags, sizeof flags, "--num_processes 2 --min_nodes 1 --max_nodes 2 --main_process_port %d", port);
    snprintf(marker, sizeof marker, "%s/running", tmpdir);
    snprintf(prog, sizeof prog, "sh -c 'touch %s; sleep 20'", marker);
    job n[2];
    start_node(&n[0], 0, flags, prog);
    start_node(&n[1], 1, flags, prog);
    double end = now_s() + 15;
    while (access(marker, F_OK) != 0) {
        cr_assert_lt(now_s(), end, "no rank started:\n%s\n%s", node_log(0), node_log(1));
        usleep(10000);
    }
    usleep(300000); /* both ranks running */
    job_kill_tree(&n[0]);
    double t0 = now_s();
    int st = job_wait(&n[1], 15);
    char *b = node_log(1);
    cr_assert_eq(st, 1, "%s", b);
    cr_assert_lt(now_s() - t0, 8, "node 1 took %.1f s to stop:\n%s", now_s() - t0, b);
    snprintf(want, sizeof want, "the rendezvous host at 127.0.0.1:%d (machine rank 0's launcher) cannot be asked", port);
    assert_has(b, want, "node 1");
    assert_has(b, "the host, machine rank 0, ends the job when it is lost", "node 1");
    free(b);
    remove_tmpdir();
}

/* Node 1's launcher alone is SIGKILLed while the ranks run; its rank goes on and the job
 * ends. The host's ranks finish, and it waits for node 1's launcher to report only as
 * long as that one still sends heartbeats: it exits 0 about CT_LAUNCH_SILENT_S after
 * its own ranks, naming the silent launcher, instead of serving for --rdzv_timeout. */
Test(launch_elastic, a_dead_launcher_is_not_waited_for, .timeout = 60)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512], prog[800];
    int port = free_port();
    snprintf(flags, sizeof flags,
             "--num_processes 2 --min_nodes 1 --max_nodes 2 --main_process_port %d --rdzv_timeout 300", port);
    snprintf(prog, sizeof prog, "sh -c 'touch %s/running$RANK; sleep 2'", tmpdir);
    job n[2];
    start_node(&n[0], 0, flags, prog);
    start_node(&n[1], 1, flags, prog);
    double end = now_s() + 15;
    char m0[700], m1[700];
    snprintf(m0, sizeof m0, "%s/running0", tmpdir);
    snprintf(m1, sizeof m1, "%s/running1", tmpdir);
    while (access(m0, F_OK) != 0 || access(m1, F_OK) != 0) {
        cr_assert_lt(now_s(), end, "the ranks did not start:\n%s\n%s", node_log(0), node_log(1));
        usleep(10000);
    }
    kill(n[1].pid, SIGKILL); /* the launcher only: its rank is another process group's */
    double t0 = now_s();
    int st = job_wait(&n[0], 40);
    char *a = node_log(0);
    double dt = now_s() - t0;
    cr_log_info("the host ended %.1f s after node 1's launcher was killed (its ranks ran 2 s)", dt);
    cr_assert_eq(st, 0, "%s", a);
    assert_has(a, "the launcher of machine rank(s) 1 has sent no heartbeat for 15 s", "host");
    cr_assert_lt(dt, 2 + CT_TEST_SILENT_S + 5, "the host took %.1f s:\n%s", dt, a);
    free(a);
    job_wait(&n[1], 1);
    remove_tmpdir();
}

/* Node 1's rank fails with no restart left after the host's rank finished: node 1's
 * launcher exits with the rank's status and tells the host, which stops waiting at once
 * and exits 1 naming machine rank 1 (not 0 after a heartbeat timeout, nor after
 * --rdzv_timeout). */
Test(launch_elastic, a_failed_node_ends_the_hosts_wait, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512];
    int port = free_port();
    snprintf(flags, sizeof flags,
             "--num_processes 2 --min_nodes 2 --max_nodes 2 --main_process_port %d --rdzv_timeout 300", port);
    job n[2];
    start_node(&n[0], 0, flags, "true");
    start_node(&n[1], 1, flags, "sh -c 'sleep 1; exit 3'");
    cr_assert_eq(job_wait(&n[1], 20), 3, "node 1:\n%s", node_log(1));
    double t0 = now_s();
    int st = job_wait(&n[0], 10);
    char *a = node_log(0);
    cr_assert_eq(st, 1, "%s", a);
    cr_assert_lt(now_s() - t0, 3, "the host took %.1f s after node 1 ended:\n%s", now_s() - t0, a);
    assert_has(a, "the launcher of machine rank 1 ended with status 3", "host");
    free(a);
    remove_tmpdir();
}

/* Node 0 runs alone (--min_nodes 1); node 1 arrives later, finds round 0 closed
 * without it and opens round 1; node 0 stops its rank to join (not counted), and the
 * job goes on with both. */
Test(launch_elastic, late_node_opens_a_new_round, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512], marker[600], prog[800];
    snprintf(flags, sizeof flags,
             "--num_processes 2 --min_nodes 1 --max_nodes 2 --main_process_port %d --rdzv_last_call 0.2", free_port());
    snprintf(marker, sizeof marker, "%s/alone", tmpdir);
    /* round 0 (node 0 alone) waits to be replaced; round 1 reports */
    snprintf(prog, sizeof prog,
             "sh -c 'if [ $CTRAIN_RDZV_ROUND = 0 ]; then touch %s; sleep 20; fi; echo R=$RANK W=$WORLD_SIZE "
             "K=$CTRAIN_RDZV_ROUND C=$CTRAIN_RESTART_COUNT'",
             marker);
    job n[2];
    start_node(&n[0], 0, flags, prog);
    double end = now_s() + 15;
    while (access(marker, F_OK) != 0) {
        cr_assert_lt(now_s(), end, "node 0 did not start alone:\n%s", node_log(0));
        usleep(10000);
    }
    start_node(&n[1], 1, flags, prog);
    for (int i = 0; i < 2; i++) cr_assert_eq(job_wait(&n[i], 20), 0, "node %d:\n%s", i, node_log(i));
    char *a = node_log(0), *b = node_log(1);
    assert_has(a, "rendezvous round 0: 1 node (machine ranks 0); this is node 0, ranks 0..0 of 1", "node 0");
    assert_has(a, "(not counted as a restart)", "node 0");
    assert_has(a, "[rank0] R=0 W=2 K=1 C=0", "node 0 in round 1");
    assert_has(b, "rendezvous round 1: 2 nodes (machine ranks 0,1); this is node 1, ranks 1..1 of 2", "node 1");
    assert_has(b, "[rank1] R=1 W=2 K=1 C=0", "node 1 in round 1");
    free(a);
    free(b);
    remove_tmpdir();
}

/* rdzv_backend: c10d in a configuration file (Accelerate's key): the elastic
 * rendezvous over num_machines nodes. */
Test(launch_elastic, c10d_from_the_configuration_file, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    FILE *f = fopen(path_of("c10d.yaml"), "w");
    cr_assert_not_null(f);
    fprintf(f, "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nmachine_rank: 0\n"
               "main_process_ip: 127.0.0.1\nmain_process_port: %d\nmixed_precision: 'no'\nnum_machines: 1\n"
               "num_processes: 2\nrdzv_backend: c10d\nsame_network: true\nuse_cpu: true\n",
            free_port());
    fclose(f);
    char cmd[1024], log[600];
    snprintf(cmd, sizeof cmd, "%s launch --config_file %s %s", getenv("CTRAIN_BIN"), path_of("c10d.yaml"), REPORT);
    snprintf(log, sizeof log, "%s/c10d.log", tmpdir);
    job j;
    job_start(&j, cmd, log);
    int st = job_wait(&j, 20);
    char *out = job_slurp(log);
    cr_assert_eq(st, 0, "%s", out);
    assert_has(out, "(--min_nodes 1, --max_nodes 1)", "the launcher");
    assert_has(out, "[rank1] R=1 L=1 W=2 G=0 N=1 K=0 C=0", "rank 1");
    free(out);
    remove_tmpdir();
}

/* The launchers' store admits only the job's token: a launcher with another token is
 * refused (the host logs it and serves on) and gives up after --rdzv_timeout; one with
 * the same token joins. */
Test(launch_elastic, launchers_store_checks_the_token, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    char flags[512];
    snprintf(flags, sizeof flags,
             "--num_processes 2 --min_nodes 2 --max_nodes 2 --main_process_port %d --rdzv_timeout 4", free_port());
    job n[3];
    setenv("CTRAIN_STORE_TOKEN", "the-job-token", 1);
    start_node(&n[0], 0, flags, REPORT);
    usleep(300000);
    char cmd[1024], log[600];
    snprintf(cmd, sizeof cmd, "env CTRAIN_STORE_TOKEN=another-token %s launch %s --machine_rank 1 --rdzv_timeout 1 true",
             getenv("CTRAIN_BIN"), flags);
    snprintf(log, sizeof log, "%s/stranger.log", tmpdir);
    job_start(&n[2], cmd, log);
    int st = job_wait(&n[2], 15);
    char *c = job_slurp(log);
    cr_assert_eq(st, 1, "%s", c);
    assert_has(c, "cannot reach the rendezvous host at 127.0.0.1:", "the stranger");
    start_node(&n[1], 1, flags, REPORT);
    for (int i = 0; i < 2; i++) cr_assert_eq(job_wait(&n[i], 20), 0, "node %d:\n%s", i, node_log(i));
    unsetenv("CTRAIN_STORE_TOKEN");
    char *a = node_log(0), *b = node_log(1);
    assert_has(a, "wrong token", "the host's log of the refusal");
    assert_has(b, "[rank1] R=1 L=0 W=2 G=1 N=2 K=0 C=0", "node 1");
    free(a);
    free(b);
    free(c);
    remove_tmpdir();
}

Test(launch_elastic, bad_node_ranges_are_usage_errors, .timeout = 30)
{
    bin_or_skip("CTRAIN_BIN");
    setup();
    static const struct {
        const char *flags, *error;
    } cases[] = {
        {"--num_processes 2 --min_nodes 3 --max_nodes 2", "--min_nodes 3 is more than --max_nodes 2"},
        {"--num_processes 2 --min_nodes 0 --max_nodes 2", "--min_nodes '0': expected a whole number from 1"},
        {"--num_processes 3 --min_nodes 1 --max_nodes 2", "--num_processes 3 is not a multiple of --max_nodes 2"},
        {"--num_processes 1 --min_nodes 1 --max_nodes 2", "--num_processes 1 is not a multiple of --max_nodes 2"},
        {"--num_processes 4 --num_machines 4 --max_nodes 2", "--num_machines 4 and --max_nodes 2 differ"},
        {"--num_processes 4 --max_nodes 2 --machine_rank 2", "--machine_rank 2 is out of range for --max_nodes 2"},
        {"--num_processes 4 --rdzv_backend static --min_nodes 1 --max_nodes 2",
         "--rdzv_backend static needs a fixed node count, got --min_nodes 1 --max_nodes 2"},
        {"--rdzv_backend etcd", "--rdzv_backend 'etcd': expected static or c10d"},
        {"--max_nodes 2 --num_processes 2 --rdzv_timeout 0", "--rdzv_timeout '0': expected seconds, more than 0"},
        {"--max_nodes 2 --num_processes 2 --rdzv_last_call -1", "--rdzv_last_call '-1': expected seconds, 0 or more"},
        {"--same_network=maybe", "--same_network"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[1024], log[600];
        snprintf(cmd, sizeof cmd, "%s launch %s true", getenv("CTRAIN_BIN"), cases[i].flags);
        snprintf(log, sizeof log, "%s/bad%zu.log", tmpdir, i);
        job j;
        job_start(&j, cmd, log);
        int st = job_wait(&j, 10);
        char *out = job_slurp(log);
        cr_assert_eq(st, 2, "%s: exit %d, expected 2:\n%s", cases[i].flags, st, out);
        assert_has(out, cases[i].error, cases[i].flags);
        free(out);
    }
    remove_tmpdir();
}

/* ---- a node lost in training --------------------------------------------------------- */

/* A tiny GPT, a few milliseconds a step on one thread, dropout on (the generators
 * matter); a checkpoint every 25 of 300 steps. */
#define TINY_GPT                                                                                               \
    "--n_layer 2 --n_head 4 --n_embd 64 --block_size 64 --batch_size 4 --dropout 0.1 --steps 300 --warmup 5 " \
    "--seq_warmup 0 --eval_every 100 --eval_batches 2 --sample_tokens 0 --save_every 25"

/* Two launchers x per_node ranks train under --min_nodes 1; once the first checkpoint
 * exists, machine rank 1 is killed with its ranks. Node 0's ranks fail (their peers
 * are gone), node 0 restarts (1 of 1), round 1 closes with node 0 alone after
 * --rdzv_last_call, and the job resumes at world size per_node from the latest
 * checkpoint (resharded under ZeRO-3) and finishes. Reference: `ctrain launch
 * --num_processes per_node` of the same program, resumed from the same checkpoint
 * directory. */
static void check_node_lost(int per_node, const char *strategy)
{
    const char *ctrain = bin_or_skip("CTRAIN_BIN"), *ex = bin_or_skip("CTRAIN_EXAMPLES");
    setup();
    write_small_text(400);
    char flags[1024], prog[2048], dir[600];
    snprintf(flags, sizeof flags,
             "--num_processes %d --min_nodes 1 --max_nodes 2 --num_cpu_threads_per_process 1 --main_process_port %d "
             "--max_restarts 1 --rdzv_last_call 0.5 --rdzv_timeout 30 %s",
             2 * per_node, free_port(), strategy);
    /* one shared file system: both nodes name the same directories */
    snprintf(prog, sizeof prog, "%s/gpt_train --data %s --out_dir %s/out --project_dir %s/proj " TINY_GPT
             " --resume auto", ex, path_of("text.txt"), tmpdir, tmpdir);
    job n[2];
    start_node(&n[0], 0, flags, prog);
    start_node(&n[1], 1, flags, prog);
    snprintf(dir, sizeof dir, "%s/proj/checkpoints", tmpdir);
    job_wait_entry(&n[0], dir, "checkpoint_", 60);
    job_kill_tree(&n[1]);
    job_wait(&n[1], 10);
    int st = job_wait(&n[0], 90);
    char *a = node_log(0);
    cr_assert_eq(st, 0, "node 0:\n%s", a);
    char want[200];
    snprintf(want, sizeof want, "rendezvous round 0: 2 nodes (machine ranks 0,1); this is node 0, ranks 0..%d of %d",
             per_node - 1, 2 * per_node);
    assert_has(a, want, "node 0");
    assert_has(a, "joining the next rendezvous round (restart 1 of 1)", "node 0");
    snprintf(want, sizeof want, "rendezvous round 1: 1 node (machine ranks 0); this is node 0, ranks 0..%d of %d",
             per_node - 1, per_node);
    assert_has(a, want, "node 0");
    snprintf(want, sizeof want, "%d process(es) x 1 threads", per_node);
    assert_has(a, want, "the world of round 1");
    /* which checkpoint round 1 resumed from, and that it was before the end */
    const char *r = strstr(a, "[rank0] resumed from ");
    cr_assert(r, "round 1 did not resume:\n%s", a);
    char ckpt[600] = "";
    long step = -1;
    cr_assert_eq(sscanf(r, "[rank0] resumed from %599s at step %ld", ckpt, &step), 2, "%s", r);
    cr_assert(step >= 25 && step < 300, "resumed at step %ld:\n%s", step, a);

    /* the reference: one process, resumed from that checkpoint, into another project */
    char cmd[4096], log[600];
    snprintf(cmd, sizeof cmd,
             "%s launch --num_processes %d --num_cpu_threads_per_process 1 --main_process_port 0 %s %s/gpt_train "
             "--data %s --out_dir %s/ref --project_dir %s/refproj " TINY_GPT " --resume %s",
             ctrain, per_node, strategy, ex, path_of("text.txt"), tmpdir, tmpdir, ckpt);
    snprintf(log, sizeof log, "%s/ref.log", tmpdir);
    job ref;
    job_start(&ref, cmd, log);
    st = job_wait(&ref, 60);
    char *b = job_slurp(log);
    cr_assert_eq(st, 0, "%s\n%s", cmd, b);
    char ma[700], mb[700];
    snprintf(ma, sizeof ma, "%s/out/model.safetensors", tmpdir);
    snprintf(mb, sizeof mb, "%s/ref/model.safetensors", tmpdir);
    cr_assert(job_same_file(ma, mb), "after node 1 was lost, the model differs from a one-process run resumed "
                                     "from %s (step %ld)", ckpt, step);
    free(a);
    free(b);
    remove_tmpdir();
}

Test(launch_elastic, gpt_node_lost_ddp, .timeout = 150)
{
    check_node_lost(1, "");
}

Test(launch_elastic, gpt_node_lost_zero3, .timeout = 150)
{
    check_node_lost(1, "--use_deepspeed --zero_stage 3");
}

/* 2 ranks per node: the world goes from 4 to 2, the reference is a 2-rank launch */
Test(launch_elastic, gpt_node_lost_two_ranks_per_node_zero3, .timeout = 150)
{
    check_node_lost(2, "--use_deepspeed --zero_stage 3");
}
