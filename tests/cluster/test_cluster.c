/* ctrain's multi-node path on a cluster of network namespaces (tests/cluster/netns.sh):
 * each node has an address of its own on a bridge and a host name of its own, so the
 * ranks of different nodes meet only over the network, as on separate machines. Every
 * test makes its nodes, runs `ctrain launch --num_machines N --machine_rank r` once per
 * node (or the program under Slurm's, Open MPI's or torchrun's variables), waits with a
 * deadline and removes the nodes with everything on them.
 *
 * The program is the GPT example (examples/gpt/train.c), single-threaded: the W1 model
 * where runs are compared, a tiny one where faults interrupt them. Its reference is the
 * same run as one process with the whole batch: DDP, ZeRO-3 and hybrid
 * sharding over 2 nodes x 2 ranks (batch 1 each) must save the same parameters, the model
 * within 1e-5 relative (2-norms; model_diff says why norms, the bounds per tensor and
 * element, and why the keys' biases get a bound of their own), and so must ranks started by hand with Slurm's, Open MPI's or
 * torchrun's variables. Faults (a node killed, its link cut, its packets dropped, its
 * processes frozen) must end every surviving launcher with a non-zero status within
 * CTRAIN_TIMEOUT and a margin, naming a lost rank; a stranger on a third node must be
 * refused and logged while the job forms; behind a firewall that opens only the store's port
 * and CTRAIN_PORT_RANGE, the job forms with the range and not without it.
 *
 * Without root or network namespaces every test reports itself skipped, with the reason. */
#include <arpa/inet.h>
#include <ctype.h>
#include <criterion/criterion.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/frame.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "tests/cluster/cluster.h"
#include "tests/tmpdir.h"

#define PORT 29500      /* each cluster has a network of its own: no test takes another's port */
#define TOKEN "cluster-test-token-0123456789" /* launchers on several machines need one exported */
#define STEPS 5         /* of the runs compared with one process */
#define LR 2e-3         /* the GPT example's default peak learning rate */
#define FAULT_TIMEOUT 8 /* CTRAIN_TIMEOUT of the fault tests, seconds */
#define FAULT_MARGIN 8  /* the launcher's 3 s from SIGTERM to SIGKILL, probes, scheduling */

static void fini(void)
{
    cluster_down();
    remove_tmpdir();
}

static const char *ex_dir(void) { return cluster_env_or_skip("CTRAIN_EXAMPLES"); }
static const char *ctrain_bin(void) { return cluster_env_or_skip("CTRAIN_BIN"); }

/* tmpdir/text.txt: 400 short lines, a tiny GPT's train and validation text */
static void setup(void)
{
    make_tmpdir_with("/tmp/ct_cluster_");
    write_small_text(400);
}

/* The GPT example's arguments for `steps` steps, batch `batch` per rank, into tmpdir/out.
 * The runs compared with one process (STEPS steps) train the W1 model, the example's
 * defaults (4 layers, 4 heads, width 256, block 256); the long runs that a fault or a
 * stranger interrupts train a 2-layer model of width 32, so that they reach step 20 soon. */
static const char *gpt_args(const char *out, int batch, int steps)
{
    static char a[2048];
    snprintf(a, sizeof a,
             "%s/gpt_train --data %s --out_dir %s/%s %s "
             "--batch_size %d --steps %d --warmup 2 --seq_warmup 0 --eval_every %d --eval_batches 1 "
             "--sample_tokens 0 --threads 1",
             ex_dir(), path_of("text.txt"), tmpdir, out,
             steps == STEPS ? "" : "--n_layer 2 --n_head 2 --n_embd 32 --block_size 32", batch, steps, steps);
    return a;
}

/* The one-process reference: the same run with the whole batch in one process, in this
 * (the host's) network; its model at tmpdir/<out>/model.safetensors. */
static void run_reference(const char *out, int batch, int steps)
{
    char cmd[4096], log[1 << 14];
    snprintf(cmd, sizeof cmd,
             "env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID "
             "CTRAIN_USE_CPU=1 OMP_NUM_THREADS=1 timeout 60 %s 2>&1",
             gpt_args(out, batch, steps));
    int rc = shell_capture(cmd, log, sizeof log);
    cr_assert_eq(rc, 0, "one process: %s\n%s", cmd, log);
}

static bool over_ipv6;          /* the master by its IPv6 address */
static const char *job_env = ""; /* more variables for every launcher of a job */
static void (*before_start)(int nodes); /* runs once the nodes are up, before the launchers */

/* The launch command of node `machine` of a job of `nodes` x `local` ranks. */
static const char *launch_cmd(int nodes, int local, int machine, const char *flags, const char *prog)
{
    static char c[4096];
    snprintf(c, sizeof c,
             "%s launch --cpu --num_processes %d --num_machines %d --machine_rank %d --main_process_ip %s "
             "--main_process_port %d --num_cpu_threads_per_process 1 %s %s",
             ctrain_bin(), nodes * local, nodes, machine, over_ipv6 ? node_addr6(0) : node_addr(0), PORT, flags, prog);
    return c;
}

/* Starts machine m's launcher of a job of `nodes` x `local` ranks running prog, with the
 * job's token, CTRAIN_TIMEOUT timeout_s and job_env; its output into tmpdir/node<m>.log. */
static void start_node(int nodes, int local, int m, int timeout_s, const char *flags, const char *prog)
{
    char env[512], log[64];
    snprintf(env, sizeof env, "CTRAIN_STORE_TOKEN=%s CTRAIN_TIMEOUT=%d %s", TOKEN, timeout_s, job_env);
    snprintf(log, sizeof log, "node%d.log", m);
    node_start(m, env, path_of(log), launch_cmd(nodes, local, m, flags, prog));
}

/* start_node for machines 0 .. nodes-1. */
static void start_nodes(int nodes, int local, int timeout_s, const char *flags, const char *prog)
{
    for (int m = 0; m < nodes; m++) start_node(nodes, local, m, timeout_s, flags, prog);
}

/* The whole file's text, NUL-terminated; the caller frees it. */
static char *slurp(const char *path)
{
    size_t n;
    return (char *)read_all(path, &n);
}

/* got's parameters against want's: the relative error of the whole model, ||got - want|| /
 * ||want|| over every element (2-norms), returned; the worst tensor's own relative error
 * into *tensor (its name into worst); the largest element difference into *elem. Names,
 * shapes and count must agree.
 *
 * Why norms and not the largest element: after a few AdamW steps a handful of elements
 * whose gradient is almost zero (2 of 262144 in a W1 c_proj) differ by a few 1e-6, as
 * Adam's m / sqrt(v) scales rounding noise (whose bits depend on the summation order: 3
 * ranks average with a division that rounds) to steps of about lr. Relative to a tensor's
 * largest element that is 1e-4, and a zero-initialised tensor (a LayerNorm bias) is all
 * such steps, while the model as a whole agrees to 1e-7. So: the model within 1e-5, each
 * tensor within 1e-4 (a shard left unsynchronised is off by far more), each element within
 * steps * lr.
 *
 * One more exception: the key third of each c_attn bias. Adding b to every key adds q.b to
 * every score of a query's row, which softmax ignores, so its gradient is 0 in exact
 * arithmetic and only that noise moves it: it is left out of the norms and bounded by
 * *elem alone. */
static double model_diff(const char *got_path, const char *want_path, char *worst, size_t cap, double *tensor,
                         double *elem)
{
    double all_num = 0, all_den = 0;
    *tensor = *elem = 0;
    ct_frame_push();
    ct_safetensors *g = ct_safetensors_open(got_path), *w = ct_safetensors_open(want_path);
    cr_assert(g && w, "%s", ct_last_error());
    int n = ct_safetensors_count(w);
    cr_assert(n > 0 && ct_safetensors_count(g) == n, "%s has %d tensors, %s %d", got_path, ct_safetensors_count(g),
              want_path, n);
    for (int i = 0; i < n; i++) {
        const char *name = ct_safetensors_name(w, i);
        ct_tensor *b = ct_safetensors_get(w, name), *a = ct_safetensors_get(g, name);
        cr_assert(a && b, "%s: %s", name, ct_last_error());
        int64_t k = ct_tensor_numel(b);
        cr_assert(a->dtype == CT_DTYPE_F32 && b->dtype == CT_DTYPE_F32 && ct_tensor_numel(a) == k, "%s: dtype or size",
                  name);
        const float *pa = ct_tensor_data(a), *pb = ct_tensor_data(b);
        /* [key_lo, key_hi): the key third of a c_attn bias (q | k | v), else empty */
        size_t len = strlen(name), sfx = strlen("attn.c_attn.bias");
        bool qkv = len >= sfx && !strcmp(name + len - sfx, "attn.c_attn.bias");
        int64_t key_lo = qkv ? k / 3 : 0, key_hi = qkv ? 2 * k / 3 : 0;
        double num = 0, den = 0;
        for (int64_t j = 0; j < k; j++) {
            double d = (double)pa[j] - pb[j];
            *elem = fmax(*elem, fabs(d));
            if (j >= key_lo && j < key_hi) continue;
            num += d * d;
            den += (double)pb[j] * pb[j];
        }
        all_num += num;
        all_den += den;
        double r = den > 0 ? sqrt(num / den) : sqrt(num);
        if (r >= *tensor) {
            *tensor = r;
            snprintf(worst, cap, "%s", name);
        }
    }
    ct_safetensors_close(g);
    ct_safetensors_close(w);
    ct_frame_pop();
    return sqrt(all_num / all_den);
}

static void expect_same_model(const char *what, const char *out, const char *ref)
{
    char worst[256] = "", got[600], want[600];
    snprintf(got, sizeof got, "%s/%s/model.safetensors", tmpdir, out);
    snprintf(want, sizeof want, "%s/%s/model.safetensors", tmpdir, ref);
    double tensor, elem;
    double e = model_diff(got, want, worst, sizeof worst, &tensor, &elem);
    cr_log_info("%s: relative difference to one process %.3g (2-norm over the model); worst tensor %.3g (%s); "
                "largest element difference %.3g",
                what, e, tensor, worst, elem);
    cr_expect_leq(e, 1e-5, "%s: the model differs from one process's by %g of its norm", what, e);
    cr_expect_leq(tensor, 1e-4, "%s: %s differs from one process's by %g of its norm", what, worst, tensor);
    cr_expect_leq(elem, STEPS * LR, "%s: an element moved %g from one process's, more than steps x lr", what, elem);
}

/* ---- a. the strategies across nodes train as one process ------------------------------ */

/* A job of nodes x local ranks, batch 1 each, under `flags`, against one process with
 * batch nodes x local; want: a line rank 0 must print (the strategy it took), or NULL. */
static void strategy_matches_one_process(int nodes, int local, const char *flags, const char *want)
{
    setup();
    cluster_up(nodes);
    if (over_ipv6 && !node_addr6(0)[0]) cr_skip_test("the nodes have no IPv6 addresses (IPv6 disabled here?)");
    run_reference("one", nodes * local, STEPS);
    if (before_start) before_start(nodes);
    start_nodes(nodes, local, 30, flags, gpt_args("job", 1, STEPS));
    double t0 = now_s();
    cr_assert(cluster_wait(-1, 60), "the job did not end within 60 s");
    for (int m = 0; m < nodes; m++) {
        char log[64];
        snprintf(log, sizeof log, "node%d.log", m);
        char *text = slurp(path_of(log));
        cr_assert_eq(the_cluster.procs[m].status, 0, "node %d's launcher: status %d\n%s", m,
                     the_cluster.procs[m].status, text);
        if (m == 0) {
            cr_assert(strstr(text, "[rank0] trained 5 steps"), "%s", text);
            cr_assert(!want || strstr(text, want), "expected '%s' in\n%s", want, text);
        }
        free(text);
    }
    char what[256];
    snprintf(what, sizeof what, "%d nodes x %d rank(s)%s%s%s", nodes, local, *flags ? " " : "", flags,
             over_ipv6 ? " over IPv6" : "");
    cr_log_info("%s: trained in %.2f s", what, now_s() - t0);
    expect_same_model(what, "job", "one");
}

Test(cluster, ddp_on_2_nodes_of_2_ranks_matches_one_process, .timeout = 90, .fini = fini)
{
    strategy_matches_one_process(2, 2, "", "[rank0] DDP: ");
}

Test(cluster, ddp_on_3_nodes_of_1_rank_matches_one_process, .timeout = 90, .fini = fini)
{
    strategy_matches_one_process(3, 1, "", "[rank0] DDP: ");
}

Test(cluster, zero3_on_2_nodes_matches_one_process, .timeout = 90, .fini = fini)
{
    strategy_matches_one_process(2, 2, "--use_deepspeed --zero_stage 3", "[rank0] sharded (FULL over 4 ranks)");
}

/* the master as an IPv6 literal: the store, the published transport addresses and the
 * refusal lines all carry it */
Test(cluster, ddp_over_ipv6_matches_one_process, .timeout = 90, .fini = fini)
{
    over_ipv6 = true;
    strategy_matches_one_process(2, 2, "", "[rank0] DDP: ");
}

/* hybrid: shard within a node (LOCAL_WORLD_SIZE ranks), replicate across the nodes */
Test(cluster, hybrid_shard_on_2_nodes_matches_one_process, .timeout = 90, .fini = fini)
{
    strategy_matches_one_process(2, 2, "--use_fsdp --fsdp_sharding_strategy HYBRID_SHARD", "[rank0] sharded (HYBRID");
}

/* ---- b. which transport each link takes ------------------------------------------------ */

/* With --comm_stats every rank prints "comm: rank R: shm peers A bytes X; tcp peers B
 * bytes Y": on 2 nodes x 2 ranks, the rank beside it over shared memory, the two on the
 * other node over TCP, and bytes over both. */
Test(cluster, each_rank_talks_shm_within_a_node_and_tcp_across, .timeout = 90, .fini = fini)
{
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s/gpt_train --comm_stats --help 2>&1", ex_dir());
    if (shell_capture(cmd, out, sizeof out) != 0) cr_skip_test("needs gpt_train --comm_stats (it answered: %.200s)", out);
    setup();
    cluster_up(2);
    char args[2100];
    snprintf(args, sizeof args, "%s --comm_stats", gpt_args("job", 1, STEPS));
    start_nodes(2, 2, 30, "", args);
    cr_assert(cluster_wait(-1, 60), "the job did not end within 60 s");
    int seen = 0;
    for (int m = 0; m < 2; m++) {
        char log[64];
        snprintf(log, sizeof log, "node%d.log", m);
        char *text = slurp(path_of(log));
        cr_assert_eq(the_cluster.procs[m].status, 0, "node %d: %s", m, text);
        for (char *p = text; (p = strstr(p, "comm: rank ")) != NULL; p++) {
            int r, shm, tcp;
            long long xs, xt;
            cr_assert_eq(sscanf(p, "comm: rank %d: shm peers %d bytes %lld; tcp peers %d bytes %lld", &r, &shm, &xs,
                                &tcp, &xt),
                         5, "unparsable: %.120s", p);
            cr_log_info("rank %d: shm peers %d (%lld bytes), tcp peers %d (%lld bytes)", r, shm, xs, tcp, xt);
            cr_expect(r / 2 == m && shm == 1 && tcp == 2 && xs > 0 && xt > 0,
                      "node %d, rank %d: shm peers %d bytes %lld, tcp peers %d bytes %lld; want 1 shm and 2 tcp peers, "
                      "bytes over both",
                      m, r, shm, xs, tcp, xt);
            seen |= 1 << r;
        }
        free(text);
    }
    cr_expect_eq(seen, 0xf, "ranks that reported (bit mask): %x", seen);
}

/* ---- c. other launchers' conventions across nodes -------------------------------------- */

/* Four processes, two per node, started by hand with env_of(rank)'s variables (what srun,
 * mpirun or torchrun would give them); the model against one process's. */
static void convention_matches_one_process(const char *name, void (*env_of)(int rank, char *env, size_t cap))
{
    setup();
    cluster_up(2);
    run_reference("one", 4, STEPS);
    for (int r = 0; r < 4; r++) {
        char env[1024], base[1200], log[64];
        env_of(r, env, sizeof env);
        snprintf(base, sizeof base, "CTRAIN_USE_CPU=1 OMP_NUM_THREADS=1 CTRAIN_TIMEOUT=30 %s", env);
        snprintf(log, sizeof log, "rank%d.log", r);
        node_start(r / 2, base, path_of(log), gpt_args("job", 1, STEPS));
    }
    cr_assert(cluster_wait(-1, 60), "%s: the ranks did not end within 60 s", name);
    for (int r = 0; r < 4; r++) {
        char log[64];
        snprintf(log, sizeof log, "rank%d.log", r);
        char *text = slurp(path_of(log));
        cr_assert_eq(the_cluster.procs[r].status, 0, "%s: rank %d: status %d\n%s", name, r, the_cluster.procs[r].status,
                     text);
        if (r == 0) cr_assert(strstr(text, "4 process(es)") && strstr(text, "trained 5 steps"), "%s", text);
        free(text);
    }
    expect_same_model(name, "job", "one");
}

/* srun -N2 --ntasks-per-node 2: the master is the node list's first host (an address,
 * so nothing needs /etc/hosts), the port the default */
static void slurm_env(int r, char *env, size_t cap)
{
    snprintf(env, cap,
             "SLURM_PROCID=%d SLURM_NTASKS=4 SLURM_LOCALID=%d SLURM_NODEID=%d 'SLURM_TASKS_PER_NODE=2(x2)' "
             "SLURM_JOB_NODELIST=%s,%s SLURM_JOB_ID=77 SLURM_STEP_ID=0",
             r, r % 2, r / 2, node_addr(0), node_addr(1));
}

static void mpirun_env(int r, char *env, size_t cap)
{
    snprintf(env, cap,
             "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=%d OMPI_COMM_WORLD_LOCAL_SIZE=2 "
             "MASTER_ADDR=%s MASTER_PORT=%d",
             r, r % 2, node_addr(0), PORT);
}

static void torchrun_env(int r, char *env, size_t cap)
{
    snprintf(env, cap,
             "RANK=%d WORLD_SIZE=4 LOCAL_RANK=%d LOCAL_WORLD_SIZE=2 GROUP_RANK=%d MASTER_ADDR=%s MASTER_PORT=%d", r,
             r % 2, r / 2, node_addr(0), PORT);
}

Test(cluster, slurm_variables_across_nodes_train_as_one_process, .timeout = 90, .fini = fini)
{
    convention_matches_one_process("Slurm (srun) variables", slurm_env);
}

Test(cluster, mpirun_variables_across_nodes_train_as_one_process, .timeout = 90, .fini = fini)
{
    convention_matches_one_process("Open MPI (mpirun) variables", mpirun_env);
}

Test(cluster, torchrun_variables_across_nodes_train_as_one_process, .timeout = 90, .fini = fini)
{
    convention_matches_one_process("torchrun variables", torchrun_env);
}

/* ---- d. faults: a node lost in the middle of training ----------------------------------- */

typedef enum { FAULT_KILL, FAULT_LINK_DOWN, FAULT_DROP, FAULT_FREEZE } fault_kind;

static const char *const fault_names[] = {"node killed (SIGKILL to all its processes)",
                                          "link cut (host side of its veth down)",
                                          "packets dropped (nftables or netem in its namespace)",
                                          "node frozen (SIGSTOP to all its processes)"};

/* Whether a rank's own error line (gpt_train (rank R): ...) in text names one of the
 * ranks lo..hi; *addr: whether it names address addr too; the first such line into first. */
static bool names_lost_rank(const char *text, int lo, int hi, const char *addr, bool *named_addr, char *first,
                            size_t cap)
{
    bool found = false;
    *named_addr = false;
    first[0] = '\0';
    for (const char *p = text; (p = strstr(p, "gpt_train (rank ")) != NULL; p++) {
        const char *msg = strstr(p, "): "), *end = strchr(p, '\n');
        if (!msg || (end && msg > end)) continue;
        size_t n = end ? (size_t)(end - msg) : strlen(msg);
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), msg);
        for (int r = lo; r <= hi; r++) {
            char who[32];
            snprintf(who, sizeof who, "rank %d", r);
            const char *q = strstr(line, who);
            if (q && !isdigit((unsigned char)q[strlen(who)])) found = true;
        }
        if (strstr(line, addr)) *named_addr = true;
        if (!first[0]) snprintf(first, cap, "%s", line + 3);
    }
    return found;
}

/* Cuts node i off the network by dropping its packets inside its namespace: nftables,
 * else netem; false when neither works here. */
static bool drop_packets(int i)
{
    char cmd[1024], out[2048];
    snprintf(cmd, sizeof cmd,
             "ip netns exec %sn%d nft -f - 2>&1 <<'EOF'\n"
             "table inet ctcut {\n"
             "  chain in { type filter hook input priority -300; iifname \"eth0\" drop; }\n"
             "  chain out { type filter hook output priority -300; oifname \"eth0\" drop; }\n"
             "}\nEOF",
             the_cluster.id, i);
    if (shell_capture(cmd, out, sizeof out) == 0) return true;
    cr_log_warn("nft failed (%s); trying tc netem", out);
    snprintf(cmd, sizeof cmd, "ip netns exec %sn%d tc qdisc add dev eth0 root netem loss 100%% 2>&1", the_cluster.id, i);
    return shell_capture(cmd, out, sizeof out) == 0;
}

/* 2 nodes x 2 ranks train (long enough never to finish on their own); after 20 steps node
 * v meets the fault. Every launcher still able to run (the other node's; v's too when only its
 * network is gone) must exit non-zero within FAULT_TIMEOUT + FAULT_MARGIN s, its ranks'
 * errors naming a rank of the other node and that node's address. A hang or a success fails
 * the test. */
static void fault_ends_the_job(fault_kind f, int v, const char *flags)
{
    setup();
    cluster_up(2);
    start_nodes(2, 2, FAULT_TIMEOUT, flags, gpt_args("job", 1, 1000000));
    cr_assert(file_has(path_of("node0.log"), "[rank0] step 20/", 30), "training did not start:\n%s",
              slurp(path_of("node0.log")));
    char cmd[512];
    switch (f) {
    case FAULT_KILL: cr_assert_gt(node_signal(v, SIGKILL), 1, "node %d runs no processes", v); break;
    case FAULT_FREEZE: cr_assert_gt(node_signal(v, SIGSTOP), 1, "node %d runs no processes", v); break;
    case FAULT_LINK_DOWN:
        snprintf(cmd, sizeof cmd, "ip link set %sv%d down", the_cluster.id, v);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        break;
    case FAULT_DROP:
        if (!drop_packets(v)) cr_skip_test("neither nftables nor netem can drop packets here");
        break;
    }
    double t0 = now_s();
    /* v's launcher survives a cut network; a killed or frozen node has none */
    bool cut = f == FAULT_LINK_DOWN || f == FAULT_DROP;
    double limit = FAULT_TIMEOUT + FAULT_MARGIN;
    for (int m = 0; m < 2; m++) {
        if (m == v && !cut) continue;
        bool ended = cluster_wait(m, limit + 20 - (now_s() - t0));
        char log[64];
        snprintf(log, sizeof log, "node%d.log", m);
        char *text = slurp(path_of(log));
        /* the end of the log: the errors, not the thousands of progress lines */
        const char *tail = strlen(text) > 6000 ? text + strlen(text) - 6000 : text;
        cr_assert(ended, "%s: node %d's launcher still runs %.1f s after the fault (a hang)\n...%s", fault_names[f], m,
                  now_s() - t0, tail);
        cluster_proc *p = &the_cluster.procs[m];
        double dt = p->ended - t0;
        bool addr;
        int lo = 2 * (1 - m); /* the other node's ranks */
        char first[2048];
        bool named = names_lost_rank(text, lo, lo + 1, node_addr(1 - m), &addr, first, sizeof first);
        cr_log_info("%s: node %d's launcher exited with status %d after %.2f s (CTRAIN_TIMEOUT %d); its ranks name "
                    "%s, %s the lost node's address; first error: %s",
                    fault_names[f], m, p->status, dt, FAULT_TIMEOUT, named ? "a lost rank" : "no lost rank",
                    addr ? "and" : "not", first);
        const char *last = strstr(text, "ctrain launch: ");
        if (last) cr_log_info("node %d's launcher: %.*s", m, (int)strcspn(last, "\n"), last);
        cr_expect_neq(p->status, 0, "%s: node %d's launcher exited 0 (a silent success)\n...%s", fault_names[f], m, tail);
        cr_expect_leq(dt, limit, "%s: node %d's launcher took %.2f s to give up (CTRAIN_TIMEOUT %d + %d s margin)",
                      fault_names[f], m, dt, FAULT_TIMEOUT, FAULT_MARGIN);
        cr_expect(named, "%s: no error of node %d's ranks names rank %d or %d:\n...%s", fault_names[f], m, lo, lo + 1,
                  tail);
        cr_expect(addr, "%s: no error of node %d's ranks names the lost node's address %s:\n...%s", fault_names[f], m,
                  node_addr(1 - m), tail);
        free(text);
    }
}

Test(cluster, a_killed_node_fails_the_job_in_time, .timeout = 90, .fini = fini) { fault_ends_the_job(FAULT_KILL, 1, ""); }

/* the master's node: its store is gone after the rendezvous, so it is a node like another */
Test(cluster, a_killed_master_node_fails_the_job_in_time, .timeout = 90, .fini = fini)
{
    fault_ends_the_job(FAULT_KILL, 0, "");
}

Test(cluster, a_cut_link_fails_the_job_in_time, .timeout = 90, .fini = fini) { fault_ends_the_job(FAULT_LINK_DOWN, 1, ""); }

Test(cluster, dropped_packets_fail_the_job_in_time, .timeout = 90, .fini = fini) { fault_ends_the_job(FAULT_DROP, 1, ""); }

Test(cluster, a_frozen_node_fails_the_job_in_time, .timeout = 90, .fini = fini) { fault_ends_the_job(FAULT_FREEZE, 1, ""); }

/* hybrid sharding: node 0's ranks wait in their own node's shard group and in the
 * replica group across the nodes; neither may hang when the other node is gone */
Test(cluster, a_killed_node_fails_a_hybrid_sharded_job_in_time, .timeout = 90, .fini = fini)
{
    fault_ends_the_job(FAULT_KILL, 1, "--use_fsdp --fsdp_sharding_strategy HYBRID_SHARD");
}

Test(cluster, a_cut_link_fails_a_hybrid_sharded_job_in_time, .timeout = 90, .fini = fini)
{
    fault_ends_the_job(FAULT_LINK_DOWN, 1, "--use_fsdp --fsdp_sharding_strategy HYBRID_SHARD");
}

/* ---- e. a stranger on a third node ------------------------------------------------------- */

static int connect_to(const char *ip, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (fd < 0 || inet_pton(AF_INET, ip, &a.sin_addr) != 1 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Connects, sends n bytes and waits up to 3 s for the peer to close: 1 when it did, 0
 * when it kept the connection, -1 when nothing listens (or the connection failed). */
static int hit(const char *ip, int port, const void *p, size_t n)
{
    int fd = connect_to(ip, port);
    if (fd < 0) return -1;
    bool closed = false;
    if (send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n) {
        double end = now_s() + 3;
        while (!closed && now_s() < end) {
            struct pollfd q = {fd, POLLIN, 0};
            if (poll(&q, 1, 100) <= 0) continue;
            char buf[512];
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            closed = r == 0 || (r < 0 && errno == ECONNRESET);
        }
    }
    close(fd);
    return closed;
}

static const char http[] = "GET / HTTP/1.1\r\nHost: node0\r\n\r\n";

/* In a child on node i: garbage and a store hello with a wrong token at the store, then
 * garbage and a rank's hello with a wrong token at each transport port in ports (store
 * frames and hellos as in tests/dist/test_token.c). Returns the child's exit status: 0
 * when every connection was closed on it. */
static int stranger(int i, const int *ports, int nports, bool store_must_listen)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        char path[128];
        snprintf(path, sizeof path, "/run/netns/%sn%d", the_cluster.id, i);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET)) _exit(10);
        const char *ip = node_addr(0);
        uint8_t kv[17] = {'C', 'T', 'K', 'V', 1, 5, 0, 0, 5, 0, 0, 0, 'w', 'r', 'o', 'n', 'g'};
        int a = hit(ip, PORT, http, sizeof http - 1);
        if (a < 0 && !store_must_listen) _exit(1); /* no store any more: refused at the door */
        if (a != 1) _exit(11);
        if (hit(ip, PORT, kv, sizeof kv) != 1) _exit(12);
        /* 'CTHI', version 2, token length 5, rank 1 of 4, a nonce of zeros, the token */
        uint8_t h[29] = {'C', 'T', 'H', 'I', 2, 0, 5, 0, 1, 0, 0, 0, 4, 0, 0, 0};
        memcpy(h + 24, "wrong", 5);
        for (int k = 0; k < nports; k++)
            if (hit(ip, ports[k], http, sizeof http - 1) != 1 || hit(ip, ports[k], h, sizeof h) != 1) _exit(20 + k);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return shell_status(st);
}

/* The TCP ports node 0 listens on besides the store's (its ranks' transports). */
static int transport_ports(int *ports, int cap)
{
    char cmd[256], out[8192];
    snprintf(cmd, sizeof cmd, "ip netns exec %sn0 ss -Hltn", the_cluster.id);
    if (shell_capture(cmd, out, sizeof out) != 0) return 0;
    int n = 0;
    for (char *line = strtok(out, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
        char st[32], local[128];
        int rq, sq;
        if (sscanf(line, "%31s %d %d %127s", st, &rq, &sq, local) != 4) continue;
        const char *colon = strrchr(local, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (port > 0 && port != PORT) ports[n++] = port;
    }
    return n;
}

/* How many lines of text hold a, and b after it. */
static int lines_with(const char *text, const char *a, const char *b)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, a)) != NULL; p++) {
        const char *end = strchr(p, '\n');
        const char *q = strstr(p, b);
        n += q && (!end || q < end);
    }
    return n;
}

/* Node 0 starts first and waits for node 1, its store and transport ports open; a
 * stranger on node 2 sends garbage and wrong tokens to them. Then node 1 starts: the job
 * forms and trains as if nothing happened (the store is hit once more mid-training),
 * and node 0's log names each refusal with the stranger's address. */
Test(cluster, strangers_on_a_third_node_are_refused, .timeout = 90, .fini = fini)
{
    setup();
    cluster_up(3);
    start_node(2, 2, 0, 30, "", gpt_args("job", 1, 300));
    /* ranks 0 and 1 listen for the ranks above them: wait for both, or 1 s after the first */
    int ports[8], n = 0;
    double end = now_s() + 20;
    for (; now_s() < end && n < 2; nanosleep(&(struct timespec){.tv_nsec = 50000000}, NULL))
        if ((n = transport_ports(ports, 8)) == 1 && end > now_s() + 1) end = now_s() + 1;
    cr_assert_gt(n, 0, "node 0's ranks opened no transport port within 20 s:\n%s", slurp(path_of("node0.log")));
    int rc = stranger(2, ports, n, true);
    cr_expect_eq(rc, 0, "the stranger's connections were not all closed (child status %d)", rc);
    start_node(2, 2, 1, 30, "", gpt_args("job", 1, 300));
    cr_assert(file_has(path_of("node0.log"), "[rank0] step 100/", 30), "the job did not train:\n%s",
              slurp(path_of("node0.log")));
    /* the store serves the rendezvous only (ct_pg_new frees it): mid-training the port
     * may be closed, else the stranger must be refused again */
    int mid = stranger(2, NULL, 0, false);
    cr_expect(mid == 0 || mid == 1, "mid-training: the stranger's connections to the store were not closed (child "
              "status %d)", mid);
    cr_log_info("mid-training, node 0's store port %s", mid ? "was closed (nothing listens)" : "refused the stranger");
    cr_assert(cluster_wait(-1, 60), "the job did not end within 60 s");
    char *text = slurp(path_of("node0.log"));
    cr_assert(the_cluster.procs[0].status == 0 && the_cluster.procs[1].status == 0, "statuses %d, %d:\n%s",
              the_cluster.procs[0].status, the_cluster.procs[1].status, text);
    cr_assert(strstr(text, "[rank0] trained 300 steps"), "%s", text);
    char store[256], tcp[256];
    snprintf(store, sizeof store, "ctrain: store on port %d: refused a connection from %s:", PORT, node_addr(2));
    snprintf(tcp, sizeof tcp, "ctrain: tcp: rank 0 dropped a connection from %s:", node_addr(2));
    const char *tail = strlen(text) > 6000 ? text + strlen(text) - 6000 : text;
    cr_expect(lines_with(text, store, ": not a store client (bad magic bytes)"), "store garbage not logged:\n%s", tail);
    cr_expect(lines_with(text, store, ": wrong token"), "store wrong token not logged:\n%s", tail);
    cr_expect(lines_with(text, tcp, ": not a ctrain rank (bad magic bytes)"), "transport garbage not logged:\n%s", tail);
    cr_expect(lines_with(text, tcp, ": wrong token"), "transport wrong token not logged:\n%s", tail);
    int garbage = lines_with(text, store, ": not a store client (bad magic bytes)");
    cr_expect_geq(garbage, mid ? 1 : 2, "a store's refusal was not logged (%d garbage refusals)", garbage);
    free(text);
}

/* ---- f. launch flags of several machines ------------------------------------------------- */

Test(cluster, port_0_with_two_machines_is_a_usage_error, .timeout = 30)
{
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd,
             "%s launch --num_processes 2 --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 "
             "--main_process_port 0 true 2>&1",
             ctrain_bin());
    int rc = shell_capture(cmd, out, sizeof out);
    cr_expect_eq(rc, 2, "status %d: %s", rc, out);
    cr_expect(strstr(out, "--main_process_port 0") && strstr(out, "--num_machines 1"), "%s", out);
}

/* Accelerate's --same_network (all machines on one local network) is accepted and the
 * job across the nodes trains as one process. */
Test(cluster, same_network_flag_across_nodes, .timeout = 90, .fini = fini)
{
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "%s launch --same_network --num_processes 1 --main_process_port 0 true 2>&1", ctrain_bin());
    if (shell_capture(cmd, out, sizeof out) != 0)
        cr_skip_test("needs ctrain launch --same_network (it answered: %.200s)", out);
    strategy_matches_one_process(2, 2, "--same_network", "[rank0] DDP: ");
}

/* ---- g. a firewall that opens only the store's port and CTRAIN_PORT_RANGE ---------------- */

#define RANGE_LO 30100
#define RANGE_HI 30103

/* Every node's firewall (nftables in its namespace) accepts new TCP connections only on
 * the store's port and RANGE_LO..RANGE_HI, as a cluster's security group would; replies,
 * loopback and everything else but new TCP connections pass. */
static void firewall_nodes(int nodes)
{
    for (int i = 0; i < nodes; i++) {
        char cmd[1024], out[2048];
        snprintf(cmd, sizeof cmd,
                 "ip netns exec %sn%d nft -f - 2>&1 <<'EOF'\n"
                 "table inet ctfw {\n"
                 "  chain in {\n"
                 "    type filter hook input priority 0; policy accept;\n"
                 "    iifname \"lo\" accept\n"
                 "    ct state established,related accept\n"
                 "    tcp dport { %d, %d-%d } accept\n"
                 "    tcp flags & (syn | ack) == syn reject with tcp reset\n"
                 "  }\n"
                 "}\nEOF",
                 the_cluster.id, i, PORT, RANGE_LO, RANGE_HI);
        if (shell_capture(cmd, out, sizeof out) != 0) cr_skip_test("nftables cannot filter here: %s", out);
    }
}

/* With the firewall, the ranks' ephemeral ports are closed to the other node: a job without
 * CTRAIN_PORT_RANGE cannot form (the check that the firewall bites), and fails in time. */
Test(cluster, a_firewall_stops_ranks_without_a_port_range, .timeout = 90, .fini = fini)
{
    setup();
    cluster_up(2);
    firewall_nodes(2);
    start_nodes(2, 2, FAULT_TIMEOUT, "", gpt_args("job", 1, STEPS));
    double t0 = now_s();
    cr_assert(cluster_wait(-1, FAULT_TIMEOUT + FAULT_MARGIN + 20), "the job still runs %.1f s later (a hang)",
              now_s() - t0);
    char *text = slurp(path_of("node0.log"));
    const char *err = strstr(text, "did not connect");
    while (err && err > text && err[-1] != '\n') err--;
    cr_log_info("without CTRAIN_PORT_RANGE behind the firewall: node 0 exited %d after %.2f s; first error: %.*s",
                the_cluster.procs[0].status, the_cluster.procs[0].ended - t0, err ? (int)strcspn(err, "\n") : 4,
                err ? err : "none");
    cr_expect_neq(the_cluster.procs[0].status, 0, "the job formed through the firewall:\n%s", text);
    cr_expect_neq(the_cluster.procs[1].status, 0, "node 1 succeeded through the firewall");
    free(text);
}

/* The same firewall with CTRAIN_PORT_RANGE set to the open ports: the job forms, trains as
 * one process, and every rank's transport port lies in the range. */
Test(cluster, a_port_range_passes_a_firewall, .timeout = 90, .fini = fini)
{
    char range[64];
    snprintf(range, sizeof range, "CTRAIN_PORT_RANGE=%d-%d", RANGE_LO, RANGE_HI);
    job_env = range;
    before_start = firewall_nodes;
    strategy_matches_one_process(2, 2, "", "[rank0] DDP: ");
}
