/* GPT W1 data-parallel training throughput: gpt_cpu.c's training step written for the
 * Accelerator, one rank per process.
 *
 *   ctrain launch --num_processes 2 --num_cpu_threads_per_process 1 \
 *       gpt_ddp [--threads N] [--steps S] [--warmup W] [--seed X]
 *
 * Model, optimizer and step are gpt_cpu.c's W1 (vocab 256, block 256, 4 layers, 4 heads,
 * width 256, batch 8 x 256 per process, dropout 0; AdamW lr 1e-4, betas 0.9/0.95, weight
 * decay 0.1 on the 2-D tensors), converted the Accelerator's way:
 *     ct_accelerator_new(NULL), ct_accelerator_prepare(model, opt),
 *     forward + loss, ct_accelerator_backward, ct_accelerator_clip_grad_norm(1.0),
 *     ct_optimizer_step, ct_optimizer_zero_grad.
 * With several ranks prepare broadcasts rank 0's weights and wraps the model in DDP with
 * its default buckets; backward then averages the gradients over the ranks while it
 * runs. Every rank draws its own random batches (Philox, seeded with the seed and the
 * rank; rank 0's stream is gpt_cpu.c's, so its first loss equals gpt_cpu's), before the
 * clock starts. W warm-up steps (default 3), then S timed steps (default 20), each timed
 * from the forward to the end of zero_grad; a rank's step time is its median, and the
 * step time reported is the largest over the ranks (they wait for each other in every
 * step's reduction, so the medians differ by noise only).
 *
 *     tokens_per_s = num_processes * batch * seq / step time   (global)
 *     comm_ms      = DDP reductions in flight per timed step (ct_ddp_stats_get: the union
 *                    of the buckets' submit-to-done intervals), mean over the timed steps
 *     exposed_ms   = the part of comm_ms after backward ended (the training thread waited)
 *     exposed_share = exposed_ms / comm_ms;  exposed_step_share = exposed_ms / step_ms
 * comm and exposed are rank 0's (both ranks see the same reductions). With one process
 * there is no DDP and they are null.
 *
 * Output: rank 0 prints one JSON line on stdout
 *   {"impl":"ctrain-ddp","config":"w1","processes":..,"threads":..,"transport":..,
 *    "tokens_per_s":..,"step_ms":..,"comm_ms":..,"exposed_ms":..,"exposed_share":..,
 *    "exposed_step_share":..,"buckets":..,"reduced_mb":..,"peak_rss_mb":..,"loss0":..,
 *    "steps":..,"warmup":..,"params":..}
 * peak_rss_mb is rank 0's ru_maxrss. Errors print a message naming the rank on stderr
 * and exit with status 2 (a failed collective fails on every rank).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "accel/accelerator.h"
#include "ctrain.h"

#define PROG "gpt_ddp"
#include "bench/args.h" /* after PROG: its messages name the program */
#include "bench/gpt_accel.h"

/* W1, as in gpt_cpu.c */
enum { VOCAB = 256, BLOCK = 256, N_LAYER = 4, N_HEAD = 4, N_EMBD = 256, BATCH = 8, SEQ = 256 };

typedef struct options {
    int threads, steps, warmup; /* threads 0: as the launcher set (CTRAIN_NUM_THREADS) */
    uint64_t seed;
    long long bucket_kb;        /* DDP bucket size */
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--threads N] [--steps S] [--warmup W] [--seed X] [--bucket_kb K]\n"
               "  run under `ctrain launch --num_processes P` (or alone, as one process)\n"
               "  --threads N   threads per process (default: the launcher's --num_cpu_threads_per_process)\n"
               "  --steps S     timed steps (default 20)\n"
               "  --warmup W    untimed steps first (default 3)\n"
               "  --seed X      seeds the weights and the random tokens (default 1337)\n"
               "  --bucket_kb K DDP gradient bucket size in KiB (default 25600: DDP's usual 25 MiB)\n"
               "Rank 0 prints one JSON line.\n");
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.threads = 0, .steps = 20, .warmup = 3, .seed = 1337, .bucket_kb = 25600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(a, v, 1, 1024, &x)) return -1;
            o->threads = (int)x;
        } else if (!strcmp(a, "--steps")) {
            if (!parse_int(a, v, 1, 1000000, &x)) return -1;
            o->steps = (int)x;
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_int(a, v, 0, 1000000, &x)) return -1;
            o->warmup = (int)x;
        } else if (!strcmp(a, "--bucket_kb")) {
            if (!parse_int(a, v, 1, 1 << 24, &x)) return -1;
            o->bucket_kb = x;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(a, v, 0, (long long)(~0ULL >> 1), &x)) return -1;
            o->seed = (uint64_t)x;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
            return -1;
        }
        i++;
    }
    return 0;
}

/* The largest of v over all ranks (every rank calls it); NAN + error on failure. */
static double max_over_ranks(ct_accelerator *acc, double v)
{
    double out = NAN;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1), &v);
        ct_tensor *all = t ? ct_accelerator_gather(acc, t) : NULL;
        if (all) {
            const double *d = ct_tensor_data(all);
            out = d[0];
            for (int64_t i = 1; i < ct_tensor_numel(all); i++) out = d[i] > out ? d[i] : out;
        }
    }
    return out;
}

static void print_json(const options *o, ct_accelerator *acc, double step_s, const ct_ddp_stats *ds,
                       double comm_s, double exposed_s, double loss0, double params)
{
    int world = ct_accelerator_num_processes(acc);
    ct_pg *pg = ct_accelerator_pg(acc);
    double tokens = (double)world * BATCH * SEQ;
    printf("{\"impl\":\"ctrain-ddp\",\"config\":\"w1\",\"processes\":%d,\"threads\":%d,\"transport\":\"%s\","
           "\"tokens_per_s\":%.2f,\"step_ms\":%.3f,",
           world, ct_get_num_threads(), pg ? ct_pg_transport(pg) : "none", tokens / step_s, 1e3 * step_s);
    if (ds) {
        printf("\"comm_ms\":%.3f,\"exposed_ms\":%.3f,\"exposed_share\":%.4f,\"exposed_step_share\":%.4f,"
               "\"buckets\":%d,\"reduced_mb\":%.3f,",
               1e3 * comm_s, 1e3 * exposed_s, comm_s > 0 ? exposed_s / comm_s : 0.0, exposed_s / step_s,
               ds->buckets, (double)ds->bytes / 1e6);
    } else {
        printf("\"comm_ms\":null,\"exposed_ms\":null,\"exposed_share\":null,\"exposed_step_share\":null,"
               "\"buckets\":0,\"reduced_mb\":0,");
    }
    printf("\"peak_rss_mb\":%.1f,\"loss0\":%.6f,\"steps\":%d,\"warmup\":%d,\"params\":%.0f}\n", peak_rss_mib(), loss0,
           o->steps, o->warmup, params);
    fflush(stdout);
}

static int run(const options *o)
{
    const double mb = (double)o->bucket_kb / 1024.0;
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.ddp = {.bucket_cap_mb = mb}});
    if (!acc) {
        fprintf(stderr, PROG ": ct_accelerator_new: %s\n", ct_last_error());
        return 2;
    }
    if (o->threads) ct_set_num_threads(o->threads);
    accel_gpt g;
    double *times = malloc((size_t)o->steps * sizeof *times);
    int status = accel_gpt_init(&g, acc,
                                &(ct_gpt_config){.vocab_size = VOCAB, .n_layer = N_LAYER, .n_head = N_HEAD,
                                                 .n_embd = N_EMBD},
                                BATCH, SEQ, o->seed);
    if (!times) status = 2;
    ct_ddp *ddp = ct_accelerator_ddp(acc);
    ct_ddp_stats at_warmup = {0};
    double loss0 = NAN;
    for (int step = 0; !status && step < o->warmup + o->steps; step++) {
        if (step == o->warmup && ddp) at_warmup = ct_ddp_stats_get(ddp);
        double loss_v, dt;
        status = accel_gpt_step(&g, step, 1.0, &loss_v, &dt);
        if (step == 0) loss0 = loss_v;
        if (!status && step >= o->warmup) times[step - o->warmup] = dt;
    }
    double step_s = status ? NAN : max_over_ranks(acc, median(times, o->steps));
    if (!status && isnan(step_s)) {
        fprintf(stderr, PROG " (rank %d): gathering the step times: %s\n", g.rank, ct_last_error());
        status = 2;
    }
    if (!status) {
        ct_ddp_stats ds = ddp ? ct_ddp_stats_get(ddp) : (ct_ddp_stats){0};
        double comm_s = (ds.total_comm_s - at_warmup.total_comm_s) / o->steps;
        double exposed_s = (ds.total_exposed_s - at_warmup.total_exposed_s) / o->steps;
        if (ct_accelerator_is_main_process(acc))
            print_json(o, acc, step_s, ddp ? &ds : NULL, comm_s, exposed_s, loss0,
                       (double)ct_module_num_params(&g.model->base));
    }
    accel_gpt_free(&g);
    ct_frame_reset_root();
    free(times);
    return status;
}

int main(int argc, char **argv)
{
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    return run(&o);
}
