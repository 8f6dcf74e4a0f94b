/* Tests for `ctrain estimate-memory` (tools/estimate_memory.c, tools/memory_model.c,
 * tools/memory_model_llama.c, tools/model_file.c), run as a program (CTRAIN_BIN, set
 * by `make test`).
 *
 * References, none of them the estimator's own code:
 *   - GPT-2 small's parameter count as HuggingFace publishes it (124,439,808) and the
 *     ZeRO tables of parallel/shard.h, with the units' padding worked out here;
 *   - the Llama presets' parameter counts as HuggingFace's model cards give them;
 *   - the engine itself: the W1 GPT and a wider one (8 layers, width 384) trained in
 *     this process under each strategy (one rank), and as 2 and 4 ranks of
 *     `ctrain launch` running the command's --measure mode: the engine's byte counts
 *     (exact), ctrain's live storage at the step's peak (ct_storage_peak_bytes,
 *     within 10%) and the processes' peak RSS (ru_maxrss, within 10%); the same for
 *     the benchmark Llama (llama:w1) and an odd one read from a config.json (untied
 *     head, one key/value head for six query heads; and tied, with two).
 * Every command runs under `timeout`; the launcher stops its ranks when it is stopped. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "ctrain.h"
#include "tests/tmpdir.h"

#define GPT2_PARAMS 124439808LL /* HuggingFace's GPT2LMHeadModel, tied head */

/* AddressSanitizer's shadow memory and quarantine (and its build turning ctrain's cache
 * off) change the resident set: its peak is compared only in plain builds. */
#if defined(__SANITIZE_ADDRESS__)
#define CHECK_RSS 0
#else
#define CHECK_RSS 1
#endif

/* ---- running the command ------------------------------------------------------------- */

/* Runs `ctrain ARGS` (or with launch = N, `ctrain launch ... ctrain ARGS` on N ranks of
 * one thread) under `timeout`, outside any job of the environment; returns stdout and
 * stderr, then "rc=N" (the caller frees it). glibc's mmap threshold is pinned at its
 * initial 128 KiB: left dynamic, it rises as large blocks are freed, and how much of
 * the communication thread's freed buffers the heap then keeps depends on timing (peak
 * RSS of one configuration varied by up to 20% between identical runs; docs/launch.md). */
static char *run_cmd(int launch, const char *args)
{
    const char *bin = getenv("CTRAIN_BIN");
    if (!bin || !*bin) cr_skip_test("CTRAIN_BIN is not set: run through `make test`");
    char cmd[4096], pre[1024] = "";
    if (launch)
        snprintf(pre, sizeof pre, "'%s' launch --num_processes %d --main_process_port 0 --num_cpu_threads_per_process 1 ",
                 bin, launch);
    snprintf(cmd, sizeof cmd,
             "timeout 100 env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "
             "-u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS -u CTRAIN_MIXED_PRECISION "
             "-u CTRAIN_CPU_CACHE_BYTES CTRAIN_NUM_THREADS=1 OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=131072 %s'%s' %s 2>&1; "
             "echo \"rc=$?\"",
             pre, bin, args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t cap = 1 << 20, n = 0, k;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    while ((k = fread(out + n, 1, cap - 1 - n, f)) > 0) n += k;
    out[n] = '\0';
    pclose(f);
    return out;
}

/* the exit status run_cmd appended (the last "rc=") */
static int rc_of(const char *out)
{
    const char *p = NULL;
    for (const char *q = strstr(out, "rc="); q; q = strstr(q + 1, "rc=")) p = q;
    cr_assert_not_null(p, "no exit status in:\n%s", out);
    return atoi(p + 3);
}

/* The estimate's CSV fields for one configuration. */
typedef struct row {
    long long params, grads, optimizer, activations, temporaries, total, rss, max_batch;
} row;

static row estimate(const char *model, const char *strategy, const char *precision, int world, int batch, int seq,
                    const char *extra)
{
    char args[1024];
    snprintf(args, sizeof args,
             "estimate-memory %s --strategies %s --mixed_precision %s --num_processes %d --batch_size %d --seq_len %d "
             "--csv %s",
             model, strategy, precision, world, batch, seq, extra ? extra : "");
    char *out = run_cmd(0, args);
    cr_assert_eq(rc_of(out), 0, "%s:\n%s", args, out);
    const char *line = strchr(out, '\n');
    cr_assert_not_null(line, "%s", out);
    row r = {0};
    char m[256], s[64], p[16];
    int w, b, t;
    int n = sscanf(line + 1, "%255[^,],%63[^,],%15[^,],%d,%d,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld", m, s, p, &w,
                   &b, &t, &r.params, &r.grads, &r.optimizer, &r.activations, &r.temporaries, &r.total, &r.rss,
                   &r.max_batch);
    cr_assert_geq(n, 13, "unexpected CSV row in:\n%s", out);
    free(out);
    return r;
}

/* ---- hand-computed state: GPT-2 small and the ZeRO tables ---------------------------- */

/* GPT-2 small's units: the root (wte 50257x768, wpe 1024x768, ln_f) and 12 Blocks */
static const long long ROOT = 50257LL * 768 + 1024LL * 768 + 2 * 768, BLOCK = 7087872;

static long long up(long long n, long long s) { return (n + s - 1) / s * s; }

Test(estimate_memory, gpt2_state_follows_the_zero_tables, .timeout = 60)
{
    cr_assert_eq(ROOT + 12 * BLOCK, GPT2_PARAMS);
    const long long P = GPT2_PARAMS;
    row r = estimate("gpt2", "DDP", "no", 8, 1, 1024, NULL);
    cr_expect_eq(r.params, 4 * P);
    cr_expect_eq(r.grads, 4 * P);
    cr_expect_eq(r.optimizer, 8 * P);
    /* ZeRO-1, f32, 2 ranks: params 4P, grads 4P + 4P/2, moments 8P/2 (no padding: even sizes) */
    r = estimate("gpt2", "ZeRO-1", "no", 2, 1, 1024, NULL);
    cr_expect_eq(r.params, 4 * P);
    cr_expect_eq(r.grads, 6 * P);
    cr_expect_eq(r.optimizer, 4 * P);
    /* ZeRO-3, bf16, 8 ranks (8 divides every unit): 2P/8, 2P/8, moments 8P/8 + master 4P/8 */
    r = estimate("gpt2", "zero3", "bf16", 8, 1, 1024, NULL);
    cr_expect_eq(r.params, 2 * P / 8);
    cr_expect_eq(r.grads, 2 * P / 8);
    cr_expect_eq(r.optimizer, 12 * P / 8);
    /* ZeRO-3, f32, 7 ranks: each unit padded to a multiple of 7; rank 0's slices */
    const long long shard = up(ROOT, 7) / 7 + 12 * (up(BLOCK, 7) / 7);
    r = estimate("gpt2", "ZeRO-3", "no", 7, 1, 1024, NULL);
    cr_expect_eq(r.params, 4 * shard);
    cr_expect_eq(r.grads, 4 * shard);
    cr_expect_eq(r.optimizer, 8 * shard);
    /* ZeRO-2 + offload, fp16, 4 ranks: 16-bit full params, no compute-side gradient
     * slice kept, moments + f32 master + its gradient: 16 bytes per slice element */
    r = estimate("gpt2", "ZeRO-2+offload", "fp16", 4, 1, 1024, NULL);
    cr_expect_eq(r.params, 2 * P);
    cr_expect_eq(r.grads, 0);
    cr_expect_eq(r.optimizer, 16 * P / 4);
    /* the total is the sum of the parts; the peak RSS is more */
    cr_expect_eq(r.total, r.params + r.grads + r.optimizer + r.activations + r.temporaries);
    cr_expect_gt(r.rss, r.total);
}

/* Activations grow linearly in the micro-batch (all of the forward is per token), and
 * --memory's answer B is the largest whose peak RSS fits. */
Test(estimate_memory, memory_gives_the_largest_micro_batch, .timeout = 60)
{
    row r = estimate("gpt2", "ZeRO-2", "bf16", 4, 3, 512, "--memory 8GiB");
    cr_assert_gt(r.max_batch, 0);
    const long long limit = 8LL << 30;
    row at = estimate("gpt2", "ZeRO-2", "bf16", 4, (int)r.max_batch, 512, NULL);
    row above = estimate("gpt2", "ZeRO-2", "bf16", 4, (int)r.max_batch + 1, 512, NULL);
    cr_expect_leq(at.rss, limit);
    cr_expect_gt(above.rss, limit);
    row one = estimate("gpt2", "ZeRO-2", "bf16", 4, 1, 512, NULL), two = estimate("gpt2", "ZeRO-2", "bf16", 4, 2, 512, NULL);
    cr_expect_eq(at.activations - one.activations, (r.max_batch - 1) * (two.activations - one.activations));
    /* units: 8GiB = 8589934592 bytes, 8GB = 8e9 */
    row same = estimate("gpt2", "ZeRO-2", "bf16", 4, 1, 512, "--memory 8589934592");
    cr_expect_eq(same.max_batch, r.max_batch);
    row gb = estimate("gpt2", "ZeRO-2", "bf16", 4, 1, 512, "--memory 8GB");
    cr_expect_lt(gb.max_batch, r.max_batch);
    /* too little for one row */
    row none = estimate("gpt2", "DDP", "no", 1, 1, 512, "--memory 1MiB");
    cr_expect_eq(none.max_batch, 0);
}

Test(estimate_memory, bad_input_is_named, .timeout = 60)
{
    static const struct {
        const char *args, *want;
    } cases[] = {
        {"estimate-memory", "MODEL is missing"},
        {"estimate-memory gpt3", "not a built-in model"},
        {"estimate-memory gpt2 --strategies zero4", "'zero4': allowed: DDP"},
        {"estimate-memory gpt2 --mixed_precision fp4", "'fp4': allowed: no (f32), bf16, fp16, fp8"},
        {"estimate-memory gpt2 --num_processes 2,x", "--num_processes 'x'"},
        {"estimate-memory gpt2 --memory 80QB", "--memory '80QB'"},
        {"estimate-memory gpt2 --seq_len 2048", "longer than gpt2's block size 1024"},
        {"estimate-memory gpt2 --batch_size", "--batch_size needs a value"},
        {"estimate-memory gpt2 --bogus 1", "unknown flag '--bogus'"},
        {"estimate-memory gpt2 --measure", "--measure runs one configuration"},
        {"estimate-memory ./no/such/config.json", "no such built-in model or file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = run_cmd(0, cases[i].args);
        cr_expect_eq(rc_of(out), 2, "%s:\n%s", cases[i].args, out);
        cr_expect_not_null(strstr(out, cases[i].want), "%s: expected '%s' in:\n%s", cases[i].args, cases[i].want, out);
        free(out);
    }
    char *out = run_cmd(0, "estimate-memory --help");
    cr_expect_eq(rc_of(out), 0);
    cr_expect_not_null(strstr(out, "gpt2-xl"), "%s", out);
    free(out);
    out = run_cmd(0, "--help");
    cr_expect_not_null(strstr(out, "estimate-memory"), "%s", out);
    free(out);
}

/* A config.json gives the built-in model's figures; a safetensors file its shapes. */
Test(estimate_memory, models_from_files, .timeout = 60)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    FILE *f = fopen(path_of("config.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"model_type\": \"gpt2\", \"vocab_size\": 50257, \"n_positions\": 1024, \"n_ctx\": 1024, "
          "\"n_layer\": 12, \"n_head\": 12, \"n_embd\": 768, \"layer_norm_epsilon\": 1e-05}\n", f);
    fclose(f);
    row a = estimate("gpt2", "ZeRO-3", "bf16", 4, 2, 256, NULL), b = estimate(tmpdir, "ZeRO-3", "bf16", 4, 2, 256, NULL);
    cr_expect_eq(a.params, b.params);
    cr_expect_eq(a.total, b.total);
    /* a safetensors file: wte (V, E), wpe (P, E), layers h.0, h.1, HF's prefix */
    ct_tensor *t[3];
    CT_FRAME {
        t[0] = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(300, 128));
        t[1] = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(64, 128));
        t[2] = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(128));
        ct_tensor *l1 = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(128));
        const char *names[] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                               "transformer.h.1.ln_1.weight"};
        ct_tensor *ts[] = {t[0], t[1], t[2], l1};
        cr_assert_eq(ct_safetensors_save(path_of("model.safetensors"), 4, names, ts, 0, NULL, NULL), CT_OK, "%s",
                     ct_last_error());
    }
    row s = estimate(path_of("model.safetensors"), "DDP", "no", 1, 1, 64, NULL);
    const long long E = 128, psi = 300 * E + 64 * E + 2 * E + 2 * (12 * E * E + 13 * E);
    cr_expect_eq(s.params, 4 * psi);
    f = fopen(path_of("bad.json"), "w");
    fputs("{\"vocab_size\": 256, \"n_layer\": 2, \"n_head\": 3, \"n_embd\": 128}", f);
    fclose(f);
    char args[512];
    snprintf(args, sizeof args, "estimate-memory %s", path_of("bad.json"));
    char *out = run_cmd(0, args);
    cr_expect_eq(rc_of(out), 2);
    cr_expect_not_null(strstr(out, "n_embd 128 is not a multiple of n_head 3"), "%s", out);
    free(out);
    remove_tmpdir();
}

/* ---- against the engine, one rank, in this process ----------------------------------- */

typedef struct config {
    const char *strategy, *precision; /* the command's spelling */
    ct_shard_strategy st;
    bool offload;
} config;

/* Trains model (vocab 256, block 256) for 2 steps of 4 x 64 tokens under c and checks
 * the engine's state bytes (exact) and the second step's live peak (10%) against the
 * command's estimate. */
static void check_in_process_model(const char *model, const ct_gpt_config *shape, const ct_llama_config *llama,
                                   const config *c)
{
    const char *const block[] = {llama ? "LlamaDecoderLayer" : "Block"};
    /* what earlier configurations of this process left (frames, caches) is not this one's */
    ct_frame_reset_root();
    const int64_t base = ct_storage_live_bytes();
    ct_accelerator_config cfg = {.mixed_precision = c->precision,
                                 .shard = {.strategy = c->st,
                                           .wrap = {.policy = CT_WRAP_TRANSFORMER, .classes = block, .nclasses = 1},
                                           .offload_optimizer = c->offload}};
    ct_accelerator *acc = ct_accelerator_new(&cfg);
    cr_assert_not_null(acc, "%s", ct_last_error());
    ct_set_num_threads(1);
    ct_set_seed(7);
    ct_gpt *m = llama ? NULL : ct_gpt_new(shape);
    ct_llama *lm = llama ? ct_llama_new(llama) : NULL;
    cr_assert(m || lm, "%s", ct_last_error());
    ct_module *mod = lm ? &lm->base : &m->base;
    ct_param_list pl;
    cr_assert_eq(ct_module_named_tensors(mod, false, &pl), CT_OK);
    ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-4, .weight_decay = 0.1});
    cr_assert_not_null(opt);
    cr_assert_eq(ct_accelerator_prepare(acc, mod, opt, NULL, NULL), CT_OK, "%s", ct_last_error());
    const int64_t B = 4, T = 64;
    int64_t x[4 * 64], y[4 * 64];
    const int V = (int)(lm ? llama->vocab_size : shape->vocab_size);
    for (int i = 0; i < B * T; i++) x[i] = (i * 7 + 3) % V, y[i] = (i * 13 + 5) % V;
    int64_t grads = 0, peak = 0;
    for (int step = 0; step < 2; step++) {
        ct_storage_peak_reset();
        CT_FRAME {
            ct_tensor *xt = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), x);
            ct_tensor *yt = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), y);
            CT_ACCUMULATE(acc) {
                ct_tensor *l = lm ? ct_llama_loss(lm, xt, yt) : ct_gpt_loss(m, xt, yt);
                cr_assert_not_null(l, "%s", ct_last_error());
                cr_assert_eq(ct_accelerator_backward(acc, l), CT_OK, "%s", ct_last_error());
                grads = 0;
                for (int i = 0; i < pl.n; i++)
                    if (pl.tensors[i]->grad) grads += ct_tensor_nbytes(pl.tensors[i]->grad);
                cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
                ct_optimizer_zero_grad(opt);
            }
        }
        ct_shard *sh = ct_accelerator_shard(acc);
        peak = (sh ? ct_shard_stats_get(sh).memory.step_peak : ct_storage_peak_bytes()) - base;
    }
    int64_t params = 0, optimizer = 0, g = grads;
    ct_shard *sh = ct_accelerator_shard(acc);
    if (sh) {
        ct_shard_stats ss = ct_shard_stats_get(sh);
        params = ss.memory.params, g = ss.memory.grads, optimizer = ss.memory.optimizer + ss.memory.master;
    } else {
        for (int i = 0; i < pl.n; i++) {
            params += ct_tensor_nbytes(pl.tensors[i]);
            optimizer += ct_tensor_nbytes(ct_optimizer_state(opt, i, "exp_avg")) +
                         ct_tensor_nbytes(ct_optimizer_state(opt, i, "exp_avg_sq"));
        }
    }
    ct_accelerator_free(acc);
    ct_param_list_free(&pl);
    ct_optimizer_free(opt);
    ct_module_free(mod);
    row e = estimate(model, c->strategy, c->precision, 1, (int)B, (int)T, NULL);
    cr_expect_eq(e.params, params, "%s %s %s: params estimated %lld, engine %lld", model, c->strategy, c->precision,
                 e.params, (long long)params);
    cr_expect_eq(e.grads, g, "%s %s %s: grads estimated %lld, engine %lld", model, c->strategy, c->precision, e.grads,
                 (long long)g);
    cr_expect_eq(e.optimizer, optimizer, "%s %s %s: optimizer estimated %lld, engine %lld", model, c->strategy,
                 c->precision, e.optimizer, (long long)optimizer);
    const double ratio = (double)e.total / (double)peak;
    cr_expect(ratio > 0.9 && ratio < 1.1, "%s %s %s: step peak estimated %lld, measured %lld (ratio %.3f)", model,
              c->strategy, c->precision, e.total, (long long)peak, ratio);
    printf("in process: %s %s %s: peak estimated %.2f MiB, measured %.2f MiB (%.3f)\n", model, c->strategy,
           c->precision, e.total / 1048576.0, peak / 1048576.0, ratio);
}

static void check_in_process(const char *model, const ct_gpt_config *shape, const config *c)
{
    check_in_process_model(model, shape, NULL, c);
}

static const config ALL[] = {
    {"DDP", "no", CT_SHARD_NO_SHARD, false},        {"ZeRO-1", "bf16", CT_SHARD_OPTIMIZER, false},
    {"ZeRO-2", "no", CT_SHARD_GRAD_OP, false},      {"ZeRO-3", "bf16", CT_SHARD_FULL, false},
    {"ZeRO-3+offload", "no", CT_SHARD_FULL, true},  {"ZeRO-1+offload", "fp16", CT_SHARD_OPTIMIZER, true},
    {"DDP", "bf16", CT_SHARD_NO_SHARD, false},      {"ZeRO-2", "fp16", CT_SHARD_GRAD_OP, false},
    {"DDP", "fp8", CT_SHARD_NO_SHARD, false},       {"ZeRO-3", "fp8", CT_SHARD_FULL, false},
};

Test(estimate_memory, w1_against_the_engine_in_process, .timeout = 120)
{
    const ct_gpt_config w1 = {.vocab_size = 256, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};
    for (size_t i = 0; i < sizeof ALL / sizeof *ALL; i++) check_in_process("gpt:w1", &w1, &ALL[i]);
}

static void write_wide8(void)
{
    FILE *f = fopen(path_of("config.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"vocab_size\": 256, \"n_positions\": 256, \"n_layer\": 8, \"n_head\": 6, \"n_embd\": 384}\n", f);
    fclose(f);
}

Test(estimate_memory, wider_gpt_against_the_engine_in_process, .timeout = 120)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    write_wide8();
    const ct_gpt_config w8 = {.vocab_size = 256, .block_size = 256, .n_layer = 8, .n_head = 6, .n_embd = 384};
    for (size_t i = 0; i < 4; i++) check_in_process(tmpdir, &w8, &ALL[i]);
    remove_tmpdir();
}

/* A large vocabulary against a small body: the peak is in the head's backward (the
 * logits' gradient), not at the end of backward. */
Test(estimate_memory, vocab_heavy_gpt_against_the_engine_in_process, .timeout = 120)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    FILE *f = fopen(path_of("config.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"vocab_size\": 16384, \"n_positions\": 256, \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 128}\n", f);
    fclose(f);
    const ct_gpt_config vh = {.vocab_size = 16384, .block_size = 256, .n_layer = 2, .n_head = 2, .n_embd = 128};
    for (size_t i = 0; i < 4; i++) check_in_process(tmpdir, &vh, &ALL[i]);
    remove_tmpdir();
}

/* ---- against the engine and the kernel: ranks of `ctrain launch` ---------------------- */

/* key=value of the MEASURED line in out, or -1 */
static double measured(const char *out, const char *key)
{
    const char *line = strstr(out, "MEASURED ");
    cr_assert_not_null(line, "no MEASURED line in:\n%s", out);
    char k[80];
    snprintf(k, sizeof k, " %s=", key);
    const char *p = strstr(line, k);
    cr_assert_not_null(p, "no %s in:\n%s", key, out);
    return atof(p + strlen(k));
}

/* Runs the --measure mode on `world` ranks (1: alone) and checks state (exact), live
 * peak and peak RSS (10%) against the plain estimate. */
static void check_ranks(const char *model, const char *strategy, const char *precision, int world)
{
    char args[1024];
    snprintf(args, sizeof args,
             "estimate-memory %s --measure --strategies %s --mixed_precision %s --batch_size 4 --seq_len 64 "
             "--steps 2",
             model, strategy, precision);
    char *out = run_cmd(world > 1 ? world : 0, args);
    cr_assert_eq(rc_of(out), 0, "%s on %d ranks:\n%s", args, world, out);
    row e = estimate(model, strategy, precision, world, 4, 64, NULL);
    const char *what = strstr(model, "/") ? "the model of config.json" : model;
    cr_expect_eq(e.params, (long long)measured(out, "params_bytes"), "%s %s %s x%d: params", what, strategy, precision,
                 world);
    cr_expect_eq(e.grads, (long long)measured(out, "grads_bytes"), "%s %s %s x%d: grads", what, strategy, precision,
                 world);
    cr_expect_eq(e.optimizer, (long long)measured(out, "optimizer_bytes"), "%s %s %s x%d: optimizer", what, strategy,
                 precision, world);
    const double peak = measured(out, "step_peak_bytes"), rss = measured(out, "peak_rss_bytes");
    const double rp = (double)e.total / peak, rr = (double)e.rss / rss;
    cr_expect(rp > 0.9 && rp < 1.1, "%s %s %s x%d: step peak estimated %lld, measured %.0f (ratio %.3f)", what,
              strategy, precision, world, e.total, peak, rp);
    cr_expect(!CHECK_RSS || (rr > 0.9 && rr < 1.1), "%s %s %s x%d: peak RSS estimated %lld, measured %.0f (ratio %.3f)", what,
              strategy, precision, world, e.rss, rss, rr);
    printf("ranks: %s %s %s x%d: peak %.1f/%.1f MiB (%.3f), RSS %.1f/%.1f MiB (%.3f)\n", what, strategy, precision,
           world, e.total / 1048576.0, peak / 1048576.0, rp, e.rss / 1048576.0, rss / 1048576.0, rr);
    free(out);
}

Test(estimate_memory, w1_on_1_2_and_4_ranks, .timeout = 150)
{
    check_ranks("gpt:w1", "DDP", "no", 1);
    check_ranks("gpt:w1", "ZeRO-2", "bf16", 2);
    check_ranks("gpt:w1", "ZeRO-1", "no", 4);
}

Test(estimate_memory, wider_gpt_on_1_2_and_4_ranks, .timeout = 150)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    write_wide8();
    check_ranks(tmpdir, "ZeRO-1", "bf16", 1);
    check_ranks(tmpdir, "ZeRO-3", "bf16", 2);
    check_ranks(tmpdir, "ZeRO-2", "no", 4);
    remove_tmpdir();
}

/* ---- Llama ------------------------------------------------------------------------------ */

/* HuggingFace's parameter counts of the presets (their model cards), and the ZeRO
 * tables on them: Llama 3.2 1B's units (the root: embed_tokens 128256 x 2048 and the
 * norm, the head tied; 16 layers) divide by 8. */
Test(estimate_memory, llama_presets_follow_hf_counts, .timeout = 60)
{
    static const struct {
        const char *name;
        long long params;
        int seq;
    } presets[] = {{"tinyllama-1.1b", 1100048384LL, 2048}, {"llama-3.2-1b", 1235814400LL, 4096},
                   {"llama-3.2-3b", 3212749824LL, 4096}, {"llama-3-8b", 8030261248LL, 8192}};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        row r = estimate(presets[i].name, "DDP", "no", 1, 1, 128, NULL);
        cr_expect_eq(r.params, 4 * presets[i].params, "%s: %lld bytes of parameters, HF counts %lld parameters",
                     presets[i].name, r.params, presets[i].params);
        cr_expect_eq(r.optimizer, 8 * presets[i].params, "%s", presets[i].name);
        /* no --seq_len: the preset's training length (the CSV's seq_len column) */
        char args[256];
        snprintf(args, sizeof args, "estimate-memory %s --strategies ddp --mixed_precision no --num_processes 1 --csv",
                 presets[i].name);
        char *out = run_cmd(0, args), want[64];
        snprintf(want, sizeof want, ",DDP,no,1,1,%d,", presets[i].seq);
        cr_expect_not_null(strstr(out, want), "%s: expected '%s' in:\n%s", presets[i].name, want, out);
        free(out);
    }
    const long long P = 1235814400LL;
    row r = estimate("llama-3.2-1b", "ZeRO-3", "bf16", 8, 1, 1024, NULL);
    cr_expect_eq(r.params, 2 * P / 8);
    cr_expect_eq(r.grads, 2 * P / 8);
    cr_expect_eq(r.optimizer, 12 * P / 8);
    char *out = run_cmd(0, "estimate-memory --help");
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        cr_expect_not_null(strstr(out, presets[i].name), "%s not listed in:\n%s", presets[i].name, out);
    cr_expect_not_null(strstr(out, "llama:w1"), "%s", out);
    free(out);
    /* --memory on a large vocabulary and long rows: the largest micro-batch that fits and
     * the one above it that does not (no figure overflows on the way) */
    const long long limit = 80LL << 30;
    row fit = estimate("llama-3.2-1b", "DDP", "no", 1, 1, 4096, "--memory 80GiB");
    cr_assert(fit.max_batch >= 1 && fit.max_batch < 100, "max batch %lld", fit.max_batch);
    row at = estimate("llama-3.2-1b", "DDP", "no", 1, (int)fit.max_batch, 4096, NULL);
    row above = estimate("llama-3.2-1b", "DDP", "no", 1, (int)fit.max_batch + 1, 4096, NULL);
    cr_expect_leq(at.rss, limit);
    cr_expect_gt(above.rss, limit);
    out = run_cmd(0, "estimate-memory llama-3.2-1b --batch_size 1073741824");
    cr_expect_eq(rc_of(out), 2);
    cr_expect_not_null(strstr(out, "would overflow 64 bits"), "%s", out);
    free(out);
    out = run_cmd(0, "estimate-memory llama-3.2-1b --seq_len 200000");
    cr_expect_eq(rc_of(out), 2);
    cr_expect_not_null(strstr(out, "max_position_embeddings 131072"), "%s", out);
    free(out);
}

/* The benchmark Llama: vocab 2048, width 256, 4 layers, 4 heads (2 key/value heads),
 * MLP 688, untied head, 256 positions. */
static const ct_llama_config LLAMA_W1 = {.vocab_size = 2048, .hidden_size = 256, .intermediate_size = 688,
                                         .num_hidden_layers = 4, .num_attention_heads = 4, .num_key_value_heads = 2,
                                         .max_position_embeddings = 256};

/* An odd Llama: six query heads of 32 sharing one key/value head, an MLP of 500, an
 * untied head, 3 layers. */
static const ct_llama_config LLAMA_ODD = {.vocab_size = 1024, .hidden_size = 192, .intermediate_size = 500,
                                          .num_hidden_layers = 3, .num_attention_heads = 6, .num_key_value_heads = 1,
                                          .max_position_embeddings = 128};

static void write_llama_odd(const char *name)
{
    FILE *f = fopen(path_of(name), "w");
    cr_assert_not_null(f);
    fputs("{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 1024, "
          "\"hidden_size\": 192, \"intermediate_size\": 500, \"num_hidden_layers\": 3, \"num_attention_heads\": 6, "
          "\"num_key_value_heads\": 1, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-05, "
          "\"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}\n",
          f);
    fclose(f);
}

/* Parameters by hand: per layer q 192x192, k and v 32x192, o 192x192, gate and up
 * 500x192, down 192x500, two norms; embed_tokens and lm_head 1024x192, the norm. A
 * config.json names the model type; a safetensors file without GPT-2's tensors takes
 * the config.json beside it; other model types are named in the error. */
Test(estimate_memory, llama_from_config_json, .timeout = 60)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    write_llama_odd("config.json");
    const long long layer = 2 * 192 * 192 + 2 * 32 * 192 + 3 * 192 * 500 + 2 * 192, root = 2 * 1024 * 192 + 192;
    row r = estimate(tmpdir, "DDP", "no", 1, 1, 64, NULL);
    cr_expect_eq(r.params, 4 * (3 * layer + root), "params %lld, by hand %lld", r.params, 4 * (3 * layer + root));
    /* ZeRO-2 on 4 ranks, f32: full (padded) params, the gradient slices of the units
     * (the root and 3 layers, each padded to a multiple of 4) */
    const long long shard = up(root, 4) / 4 + 3 * (up(layer, 4) / 4);
    r = estimate(tmpdir, "ZeRO-2", "no", 4, 1, 64, NULL);
    cr_expect_eq(r.params, 4 * (up(root, 4) + 3 * up(layer, 4)));
    cr_expect_eq(r.grads, 4 * shard);
    /* the same as a file, and the weights file beside it */
    row byfile = estimate(path_of("config.json"), "ZeRO-2", "no", 4, 1, 64, NULL);
    cr_expect_eq(byfile.total, r.total);
    ct_tensor *w;
    CT_FRAME {
        w = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(1024, 192));
        const char *names[] = {"model.embed_tokens.weight"};
        cr_assert_eq(ct_safetensors_save(path_of("model.safetensors"), 1, names, &w, 0, NULL, NULL), CT_OK, "%s",
                     ct_last_error());
    }
    row st = estimate(path_of("model.safetensors"), "ZeRO-2", "no", 4, 1, 64, NULL);
    cr_expect_eq(st.total, r.total);
    /* the llama:w1 built-in equals its config.json */
    FILE *f = fopen(path_of("w1.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 2048, \"hidden_size\": 256, \"intermediate_size\": 688, "
          "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
          "\"max_position_embeddings\": 256}",
          f);
    fclose(f);
    row a = estimate("llama:w1", "ZeRO-3", "bf16", 2, 2, 128, NULL);
    row b = estimate(path_of("w1.json"), "ZeRO-3", "bf16", 2, 2, 128, NULL);
    cr_expect_eq(a.total, b.total);
    cr_expect_eq(a.rss, b.rss);
    static const struct {
        const char *json, *want;
    } bad[] = {
        {"{\"model_type\": \"mistral\", \"vocab_size\": 32000}",
         "model_type \"mistral\" is not supported (supported: \"gpt2\" (or none: GPT-2's keys), \"llama\")"},
        {"{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 96, \"intermediate_size\": 64, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3}",
         "num_key_value_heads 3 must divide num_attention_heads 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        f = fopen(path_of("bad.json"), "w");
        cr_assert_not_null(f);
        fputs(bad[i].json, f);
        fclose(f);
        char args[512];
        snprintf(args, sizeof args, "estimate-memory %s", path_of("bad.json"));
        char *out = run_cmd(0, args);
        cr_expect_eq(rc_of(out), 2, "%s", out);
        cr_expect_not_null(strstr(out, bad[i].want), "expected '%s' in:\n%s", bad[i].want, out);
        free(out);
    }
    remove_tmpdir();
}

static const config LLAMA_ALL[] = {
    {"DDP", "no", CT_SHARD_NO_SHARD, false},
    {"DDP", "bf16", CT_SHARD_NO_SHARD, false},
    {"ZeRO-1", "no", CT_SHARD_OPTIMIZER, false},
    {"ZeRO-1", "bf16", CT_SHARD_OPTIMIZER, false},
    {"ZeRO-2", "no", CT_SHARD_GRAD_OP, false},
    {"ZeRO-2", "bf16", CT_SHARD_GRAD_OP, false},
    {"ZeRO-3", "no", CT_SHARD_FULL, false},
    {"ZeRO-3", "bf16", CT_SHARD_FULL, false},
    {"ZeRO-1+offload", "bf16", CT_SHARD_OPTIMIZER, true},
    {"ZeRO-3+offload", "no", CT_SHARD_FULL, true},
};

Test(estimate_memory, llama_w1_against_the_engine_in_process, .timeout = 120)
{
    for (size_t i = 0; i < sizeof LLAMA_ALL / sizeof *LLAMA_ALL; i++)
        check_in_process_model("llama:w1", NULL, &LLAMA_W1, &LLAMA_ALL[i]);
}

Test(estimate_memory, odd_llama_against_the_engine_in_process, .timeout = 120)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    write_llama_odd("config.json");
    for (size_t i = 0; i < sizeof LLAMA_ALL / sizeof *LLAMA_ALL; i++)
        check_in_process_model(tmpdir, NULL, &LLAMA_ODD, &LLAMA_ALL[i]);
    remove_tmpdir();
}

Test(estimate_memory, llama_w1_on_1_2_and_4_ranks, .timeout = 150)
{
    check_ranks("llama:w1", "ZeRO-1", "bf16", 1);
    check_ranks("llama:w1", "DDP", "no", 2);
    check_ranks("llama:w1", "ZeRO-3+offload", "bf16", 4);
}

Test(estimate_memory, odd_llama_on_1_2_and_4_ranks, .timeout = 150)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    write_llama_odd("config.json");
    check_ranks(tmpdir, "DDP", "bf16", 1);
    check_ranks(tmpdir, "ZeRO-2", "no", 2);
    check_ranks(tmpdir, "ZeRO-3", "no", 4);
    remove_tmpdir();
}

/* A tied head (the head's gradient is the token table's: DDP's dense embedding
 * gradient lands on an existing one) and three query heads per key/value head. */
Test(estimate_memory, tied_llama_against_the_engine_in_process, .timeout = 120)
{
    make_tmpdir_with("/tmp/ct_estmem_");
    FILE *f = fopen(path_of("config.json"), "w");
    cr_assert_not_null(f);
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 1024, \"hidden_size\": 192, \"intermediate_size\": 500, "
          "\"num_hidden_layers\": 3, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, "
          "\"max_position_embeddings\": 128, \"tie_word_embeddings\": true}\n",
          f);
    fclose(f);
    ct_llama_config tied = LLAMA_ODD;
    tied.num_key_value_heads = 2, tied.tie_word_embeddings = true;
    static const size_t which[] = {0, 1, 2, 7}; /* DDP f32 and bf16, ZeRO-1 f32, ZeRO-3 bf16 */
    for (size_t i = 0; i < sizeof which / sizeof *which; i++)
        check_in_process_model(tmpdir, NULL, &tied, &LLAMA_ALL[which[i]]);
    remove_tmpdir();
}
