/* Tests for accel/checkpoint_*.c: save_state / load_state, on fork()ed ranks.
 *
 * The backbone is equivalence: a small GPT (dropout on) trained N steps straight
 * from a shuffled loader must equal k steps, save_state, a fresh process that loads
 * and trains N - k steps: the same loss bits at every step after k and the same
 * parameter bytes at the end, under one process, DDP, ZeRO-1/2/3, HYBRID, CPU
 * offload, bf16, fp16 with skipped steps, fp8 and gradient accumulation. A checkpoint
 * saved at one world size and strategy loads at another and trains on as a straight
 * run at the new size does (fp32 tolerance). Crash safety: a save killed after each of
 * its files leaves the previous checkpoint the latest complete one; bad checkpoints
 * (truncated, flipped byte, missing file, another model, a newer format) fail with
 * their own error and change nothing. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "autograd/autograd.h"
#include "autograd/ops_math.h"
#include "core/frame.h"
#include "core/safetensors.h"
#include "data/token_dataset.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "tests/env_ranks.h"
#include "tests/tmpdir.h"

#define SEQ 8
#define NTOK 2400

static const ct_gpt_config tiny = {.vocab_size = 61, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 30,
                                   .dropout = 0.1};

static void setup(void) { make_tmpdir_with("/tmp/ct_ckpt_"); }
static void teardown(void) { remove_tmpdir(); }

/* One run: strategy and settings, then what it does. */
typedef struct run {
    int world;
    int zero;              /* DeepSpeed stage 1..3; 0: replicated (DDP) */
    bool hybrid;           /* FSDP HYBRID_SHARD, shard groups of 2 */
    bool offload;
    const char *precision; /* NULL: "no" */
    int accum;             /* gradient_accumulation_steps; 0 = 1 */
    int64_t global_batch;  /* rows per optimizer micro-step over all ranks */
    double init_scale;     /* fp16: the scaler's start (large: skipped steps) */
    /* the run itself */
    int steps;             /* optimizer steps to train in this process */
    const char *load;      /* load_state from dir/<load> first; NULL: fresh */
    const char *save;      /* save_state into dir/<save> at the end; NULL: none */
    const char *tag;       /* losses -> dir/<tag>.loss, parameters -> dir/<tag>.safetensors */
    bool no_dropout;       /* resharding: the masks depend on the world size */
    bool wide;             /* another model: n_embd 32 */
    bool sgd;              /* another optimizer: SGD with momentum instead of AdamW */
    /* automatic checkpoints: into dir/<project>/checkpoints after every step from the
     * first, keeping total_limit; the save after step kill_step runs with
     * CTRAIN_TEST_CHECKPOINT_KILL_AT = kill_at */
    const char *project;
    int total_limit, kill_step, kill_at;
    bool rank0_only;       /* save_state under `if (is_main_process)` */
    const char *expect;    /* load must fail with this in its message, changing nothing */
} run;

static void write_tokens(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    uint32_t x = 12345;
    for (int i = 0; i < NTOK; i++) {
        x = x * 1664525u + 1013904223u;
        uint16_t t = (uint16_t)((x >> 9) % (uint32_t)tiny.vocab_size);
        fwrite(&t, sizeof t, 1, f);
    }
    fclose(f);
}

/* what a run does after its expected failure: nothing */
static const run done_run;

static int fail(int rank, const char *what)
{
    fprintf(stderr, "rank %d, %s: %s\n", rank, what, ct_last_error());
    return 1;
}

static ct_accelerator *make_acc(int rank, const run *r)
{
    char v[16];
    const int group = r->hybrid ? 2 : r->world;
    snprintf(v, sizeof v, "%d", group), setenv("LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", rank % group), setenv("LOCAL_RANK", v, 1);
    setenv("CTRAIN_NUM_THREADS", "1", 1);
    ct_deepspeed_plugin ds = {.zero_stage = r->zero, .offload_optimizer_device = r->offload ? "cpu" : NULL};
    ct_fsdp_plugin fs = {.sharding_strategy = "HYBRID_SHARD"};
    static char project[700];
    snprintf(project, sizeof project, "%s/%s", tmpdir, r->project ? r->project : "");
    ct_accelerator_config cfg = {.project = {.project_dir = r->project ? project : NULL,
                                             .automatic_checkpoint_naming = r->project != NULL,
                                             .total_limit = r->total_limit},
                                 .mixed_precision = r->precision ? r->precision : "no",
                                 .gradient_accumulation_steps = r->accum,
                                 .loss_scaler = {.init_scale = r->init_scale, .max_scale = r->init_scale * 4},
                                 .deepspeed_plugin = r->zero ? &ds : NULL,
                                 .fsdp_plugin = r->hybrid ? &fs : NULL};
    return ct_accelerator_new(&cfg);
}

/* Trains r->steps optimizer steps of a run (after loading r->load), appending each
 * step's loss (rank 0) to dir/<tag>.loss as raw doubles. */
static int train_rank(int rank, int world, const char *dir, void *ctx)
{
    const run *r = ctx;
    int rc = 0;
    CT_FRAME {
        char path[700];
        snprintf(path, sizeof path, "%s/tokens.bin", dir);
        ct_dataset *ds = ct_token_dataset_open(path, &(ct_token_dataset_config){.block_size = SEQ, .format = CT_TOKENS_RAW_U16});
        ct_loader *ld = ds ? ct_loader_new(ds, &(ct_loader_config){.batch_size = r->global_batch / world,
                                                                     .shuffle = true,
                                                                     .seed = 7,
                                                                     .no_prefetch = rank % 2})
                           : NULL;
        ct_accelerator *acc = ld ? make_acc(rank, r) : NULL;
        ct_accelerator_set_seed(acc, 11, false);
        ct_gpt_config gc = tiny;
        if (r->no_dropout) gc.dropout = 0;
        if (r->wide) gc.n_embd = 32;
        ct_gpt *m = acc ? ct_gpt_new(&gc) : NULL;
        ct_accelerator_set_seed(acc, 100, true); /* dropout masks per rank */
        ct_param_list pl = {0};
        if (m) ct_module_named_tensors(&m->base, false, &pl);
        ct_optimizer *opt = !m      ? NULL
                            : r->sgd ? ct_sgd_new(pl.n, pl.tensors, &(ct_sgd_config){.lr = 3e-3, .momentum = 0.9})
                                     : ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 3e-3, .weight_decay = 0.1});
        ct_scheduler *sch = opt ? ct_scheduler_new(opt, &(ct_lr_schedule){.decay = CT_LR_COSINE, .warmup_steps = 2,
                                                                          .total_steps = 20, .min_lr = 1e-4})
                                : NULL;
        ct_status st = sch ? ct_accelerator_prepare(acc, &m->base, opt, ld, sch) : ct_last_status();
        /* a generator of the program's own, drawn every step: a registered object */
        ct_rng mine;
        ct_rng_init(&mine, 99 + (uint64_t)rank);
        ct_checkpointable obj = ct_rng_checkpointable("program_rng", &mine);
        if (!st) st = ct_accelerator_register_for_checkpointing(acc, &obj);
        if (st) rc = fail(rank, "setup");
        if (!rc && r->load && r->expect) {
            /* a bad checkpoint: the error names the problem and the run is as it was */
            char ck[700];
            snprintf(ck, sizeof ck, "%s/%s", dir, r->load);
            ct_state_dict before = {0}, after = {0};
            const int64_t steps = ct_optimizer_step_count(opt);
            const ct_rng rng = *ct_rng_default();
            if (ct_accelerator_get_state_dict(acc, &m->base, &before)) rc = fail(rank, "state dict");
            else if (!ct_accelerator_load_state(acc, ck)) rc = fail(rank, "a bad checkpoint loaded");
            else if (!strstr(ct_last_error(), r->expect))
                rc = 1, fprintf(stderr, "rank %d: expected '%s' in: %s\n", rank, r->expect, ct_last_error());
            else if (ct_accelerator_get_state_dict(acc, &m->base, &after)) rc = fail(rank, "state dict");
            for (int i = 0; !rc && i < before.n; i++)
                if (memcmp(ct_tensor_data(before.tensors[i]), ct_tensor_data(after.tensors[i]),
                           (size_t)ct_tensor_nbytes(before.tensors[i])))
                    rc = 1, fprintf(stderr, "rank %d: '%s' changed by a failed load\n", rank, before.names[i]);
            if (!rc && (steps != ct_optimizer_step_count(opt) || memcmp(&rng, ct_rng_default(), sizeof rng)))
                rc = 1, fprintf(stderr, "rank %d: the optimizer or the generator changed by a failed load\n", rank);
            ct_state_dict_free(&before), ct_state_dict_free(&after);
            r = &done_run; /* nothing more to do */
        } else if (!rc && r->load) {
            char ck[700];
            snprintf(ck, sizeof ck, "%s/%s", dir, r->load);
            if (ct_accelerator_load_state(acc, strcmp(r->load, "auto") ? ck : NULL)) rc = fail(rank, "load_state");
        }
        snprintf(path, sizeof path, "%s/%s.loss", dir, r->tag ? r->tag : "none");
        FILE *lf = rank == 0 && !rc && r->tag ? fopen(path, "ab") : NULL;
        for (int s = 0; s < r->steps && !rc; s++) {
            double loss = 0;
            for (int k = 0; k < (r->accum ? r->accum : 1) && !rc; k++) CT_FRAME {
                    ct_tensor *x, *y;
                    ct_loader_result lr = ct_loader_next(ld, &x, &y);
                    if (lr == CT_LOADER_END) lr = ct_loader_next(ld, &x, &y);
                    if (lr != CT_LOADER_BATCH) {
                        rc = fail(rank, "loader");
                        break;
                    }
                    CT_ACCUMULATE(acc)
                    {
                        ct_tensor *l = ct_gpt_loss(m, x, y);
                        st = l ? ct_accelerator_backward(acc, l) : ct_last_status();
                        if (!st) loss += ct_tensor_item(l);
                        if (!st) st = ct_optimizer_step(opt);
                        if (!st) st = ct_scheduler_step(sch);
                        ct_optimizer_zero_grad(opt);
                    }
                    if (st) rc = fail(rank, "step");
                }
            uint32_t draw;
            ct_rng_u32(&mine, &draw, 1);
            loss += (double)(draw % 1000) * 1e-3; /* a resume that lost the stream shows here */
            if (lf) fwrite(&loss, sizeof loss, 1, lf);
            if (!rc && r->project) {
                if (s + 1 == r->kill_step) {
                    char v[16];
                    snprintf(v, sizeof v, "%d", r->kill_at);
                    setenv("CTRAIN_TEST_CHECKPOINT_KILL_AT", v, 1);
                }
                if (ct_accelerator_save_state(acc, NULL)) rc = fail(rank, "automatic save_state");
            }
        }
        if (lf) fclose(lf);
        if (!rc && r->save && (!r->rank0_only || rank == 0)) {
            char ck[700];
            snprintf(ck, sizeof ck, "%s/%s", dir, r->save);
            if (!ct_accelerator_save_state(acc, ck)) {
                if (r->rank0_only && r->zero) rc = 1, fprintf(stderr, "a sharded save on rank 0 alone succeeded\n");
            } else if (!r->rank0_only || !r->zero) {
                rc = fail(rank, "save_state");
            } else if (!strstr(ct_last_error(), "every rank must call ct_accelerator_save_state")) {
                rc = fail(rank, "save_state on rank 0 alone: not the expected error");
            } else {
                r = &done_run; /* the expected refusal */
            }
        }
        if (!rc && r->rank0_only && r->zero && rank != 0) {
            /* the next step's collective must fail (a desync), not hang */
            CT_FRAME {
                ct_tensor *x, *y;
                ct_loader_next(ld, &x, &y);
                ct_tensor *l = ct_gpt_loss(m, x, y);
                if (l && !ct_accelerator_backward(acc, l) && !ct_optimizer_step(opt))
                    rc = 1, fprintf(stderr, "rank %d: a step after rank 0 alone saved succeeded\n", rank);
            }
            r = &done_run;
        }
        ct_state_dict sd = {0};
        if (!rc && r->tag && ct_accelerator_get_state_dict(acc, &m->base, &sd)) rc = fail(rank, "state dict");
        if (!rc && rank == 0 && r->tag) {
            snprintf(path, sizeof path, "%s/%s.safetensors", dir, r->tag);
            if (ct_safetensors_save(path, sd.n, (const char *const *)sd.names, sd.tensors, 0, NULL, NULL))
                rc = fail(rank, "write parameters");
        }
        ct_state_dict_free(&sd);
        ct_accelerator_free(acc);
        ct_scheduler_free(sch);
        ct_optimizer_free(opt);
        ct_param_list_free(&pl);
        if (m) ct_module_free(&m->base);
        ct_loader_free(ld);
        ct_dataset_free(ds);
    }
    return rc;
}

static void *slurp(const char *dir, const char *name, long *len)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "no %s", path);
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)*len + 1);
    cr_assert(fread(p, 1, (size_t)*len, f) == (size_t)*len);
    fclose(f);
    return p;
}

/* The parameters of two runs: bit for bit, or within rtol. */
static void compare_params(const char *dir, const char *a, const char *b, double rtol)
{
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/%s.safetensors", dir, a);
    snprintf(pb, sizeof pb, "%s/%s.safetensors", dir, b);
    ct_safetensors *fa = ct_safetensors_open(pa), *fb = ct_safetensors_open(pb);
    cr_assert(fa && fb, "%s", ct_last_error());
    cr_assert_eq(ct_safetensors_count(fa), ct_safetensors_count(fb));
    CT_FRAME {
        for (int i = 0; i < ct_safetensors_count(fa); i++) {
            const char *n = ct_safetensors_name(fa, i);
            ct_tensor *x = ct_tensor_cast(ct_safetensors_get(fa, n), CT_DTYPE_F64);
            ct_tensor *y = ct_tensor_cast(ct_safetensors_get(fb, n), CT_DTYPE_F64);
            cr_assert(x && y && ct_tensor_numel(x) == ct_tensor_numel(y), "%s", n);
            const double *u = ct_tensor_data(x), *v = ct_tensor_data(y);
            for (int64_t j = 0; j < ct_tensor_numel(x); j++) {
                if (rtol == 0)
                    cr_assert(u[j] == v[j], "%s: %s[%lld] %.9g vs %.9g (bitwise)", a, n, (long long)j, u[j], v[j]);
                else /* Adam turns a noise-level gradient (the keys' bias) into lr-sized steps */
                    cr_assert(fabs(u[j] - v[j]) <= rtol * fabs(v[j]) + 1e-4, "%s: %s[%lld] %.9g vs %.9g", a, n,
                              (long long)j, u[j], v[j]);
            }
        }
    }
    ct_safetensors_close(fa);
    ct_safetensors_close(fb);
}

/* N steps straight vs k, save, load in fresh processes, N - k. */
static void resume_case(run r, int n, int k)
{
    const char *dir = tmpdir;
    write_tokens(dir);
    run straight = r, first = r, second = r;
    straight.steps = n, straight.tag = "straight";
    first.steps = k, first.save = "ck", first.tag = "first";
    second.steps = n - k, second.load = "ck", second.tag = "second";
    run_env_ranks(r.world, train_rank, dir, &straight, 240);
    run_env_ranks(r.world, train_rank, dir, &first, 240);
    ct_checkpoint_info info;
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    cr_assert(!ct_checkpoint_inspect(ck, true, &info, NULL), "%s", ct_last_error());
    /* optimizer steps taken: fp16's skipped ones do not count */
    cr_assert(r.precision && !strcmp(r.precision, "fp16") ? info.step < k : info.step == k, "step %lld",
              (long long)info.step);
    cr_assert_eq(info.world_size, r.world);
    run_env_ranks(r.world, train_rank, dir, &second, 240);
    long la, lb, l1;
    double *sa = slurp(dir, "straight.loss", &la), *sb = slurp(dir, "second.loss", &lb);
    double *s1 = slurp(dir, "first.loss", &l1);
    cr_assert_eq(la, (long)(n * sizeof(double)));
    cr_assert_eq(lb, (long)((n - k) * sizeof(double)));
    for (int i = 0; i < k; i++) cr_assert(s1[i] == sa[i], "step %d before the save differs", i + 1);
    for (int i = 0; i < n - k; i++)
        cr_assert(memcmp(&sa[k + i], &sb[i], sizeof(double)) == 0, "step %d: straight %.17g, resumed %.17g", k + i + 1,
                  sa[k + i], sb[i]);
    free(sa), free(sb), free(s1);
    compare_params(dir, "second", "straight", 0);
}

TestSuite(accel_checkpoint, .init = setup, .fini = teardown, .timeout = 600);

Test(accel_checkpoint, one_process_f32) { resume_case((run){.world = 1, .global_batch = 4}, 6, 3); }
Test(accel_checkpoint, ddp_2) { resume_case((run){.world = 2, .global_batch = 4}, 6, 3); }
Test(accel_checkpoint, zero1_2) { resume_case((run){.world = 2, .zero = 1, .global_batch = 4}, 5, 2); }
Test(accel_checkpoint, zero2_2) { resume_case((run){.world = 2, .zero = 2, .global_batch = 4}, 5, 2); }
Test(accel_checkpoint, zero3_2) { resume_case((run){.world = 2, .zero = 3, .global_batch = 4}, 5, 2); }
Test(accel_checkpoint, zero3_4) { resume_case((run){.world = 4, .zero = 3, .global_batch = 4}, 4, 2); }
Test(accel_checkpoint, zero1_4) { resume_case((run){.world = 4, .zero = 1, .global_batch = 4}, 4, 2); }
Test(accel_checkpoint, hybrid_2) { resume_case((run){.world = 2, .hybrid = true, .global_batch = 4}, 4, 2); }
Test(accel_checkpoint, zero2_4) { resume_case((run){.world = 4, .zero = 2, .global_batch = 4}, 4, 2); }
Test(accel_checkpoint, hybrid_4) { resume_case((run){.world = 4, .hybrid = true, .global_batch = 4}, 4, 2); }
Test(accel_checkpoint, offload_2) { resume_case((run){.world = 2, .zero = 2, .offload = true, .global_batch = 4}, 5, 2); }
Test(accel_checkpoint, bf16_zero2) { resume_case((run){.world = 2, .zero = 2, .precision = "bf16", .global_batch = 4}, 5, 2); }
Test(accel_checkpoint, bf16_one_process) { resume_case((run){.world = 1, .precision = "bf16", .global_batch = 4}, 5, 2); }
/* a start of 2^30 overflows f16's gradients: the first steps are skipped and back off */
Test(accel_checkpoint, fp16_skipped_steps)
{
    resume_case((run){.world = 2, .precision = "fp16", .init_scale = 1073741824.0, .global_batch = 4}, 8, 4);
}
Test(accel_checkpoint, fp8_one_process) { resume_case((run){.world = 1, .precision = "fp8", .global_batch = 4}, 5, 2); }
Test(accel_checkpoint, fp8_zero3) { resume_case((run){.world = 2, .zero = 3, .precision = "fp8", .global_batch = 4}, 4, 2); }
Test(accel_checkpoint, accumulation) { resume_case((run){.world = 2, .accum = 3, .global_batch = 4}, 4, 2); }

/* ---- resharding --------------------------------------------------------------------- */

/* Saved by `from` after k steps, loaded by `to` for n - k more: the losses and the
 * parameters of a straight n-step run of `to` (same global batch), within fp32 noise. */
static void reshard_case(run from, run to, int n, int k)
{
    const char *dir = tmpdir;
    write_tokens(dir);
    from.no_dropout = to.no_dropout = true;
    from.global_batch = to.global_batch = 4;
    run straight = to, first = from, second = to;
    straight.steps = n, straight.tag = "straight";
    first.steps = k, first.save = "ck", first.tag = "first";
    second.steps = n - k, second.load = "ck", second.tag = "second";
    run_env_ranks(to.world, train_rank, dir, &straight, 240);
    run_env_ranks(from.world, train_rank, dir, &first, 240);
    run_env_ranks(to.world, train_rank, dir, &second, 240);
    long la, lb;
    double *sa = slurp(dir, "straight.loss", &la), *sb = slurp(dir, "second.loss", &lb);
    cr_assert_eq(lb, (long)((n - k) * sizeof(double)));
    for (int i = 0; i < n - k; i++)
        cr_assert(fabs(sa[k + i] - sb[i]) <= 1e-5 * fabs(sa[k + i]), "step %d: straight %.9g, resharded %.9g",
                  k + i + 1, sa[k + i], sb[i]);
    free(sa), free(sb);
    compare_params(dir, "second", "straight", 1e-3);
}

Test(accel_checkpoint, reshard_zero3_4_to_zero2_2)
{
    reshard_case((run){.world = 4, .zero = 3}, (run){.world = 2, .zero = 2}, 5, 2);
}
Test(accel_checkpoint, reshard_zero3_4_to_one_process) { reshard_case((run){.world = 4, .zero = 3}, (run){.world = 1}, 5, 2); }
Test(accel_checkpoint, reshard_zero3_4_to_ddp_2) { reshard_case((run){.world = 4, .zero = 3}, (run){.world = 2}, 5, 2); }
Test(accel_checkpoint, reshard_ddp_2_to_zero3_4) { reshard_case((run){.world = 2}, (run){.world = 4, .zero = 3}, 5, 2); }
Test(accel_checkpoint, reshard_zero2_2_to_zero3_4)
{
    reshard_case((run){.world = 2, .zero = 2}, (run){.world = 4, .zero = 3}, 5, 2);
}
Test(accel_checkpoint, reshard_one_process_to_zero1_2)
{
    reshard_case((run){.world = 1}, (run){.world = 2, .zero = 1}, 5, 2);
}

/* ---- who calls save_state ------------------------------------------------------------- */

/* DDP: rank 0 holds everything, so Accelerate's `if is_main_process: save_state` works,
 * and the checkpoint resumes bitwise (the ranks' generators run in lockstep). */
Test(accel_checkpoint, ddp_rank0_only_save)
{
    const char *dir = tmpdir;
    write_tokens(dir);
    run r = {.world = 2, .global_batch = 4};
    run straight = r, first = r, second = r;
    straight.steps = 5, straight.tag = "straight";
    first.steps = 2, first.save = "ck", first.rank0_only = true, first.tag = "first";
    second.steps = 3, second.load = "ck", second.tag = "second";
    run_env_ranks(2, train_rank, dir, &straight, 240);
    run_env_ranks(2, train_rank, dir, &first, 240);
    run_env_ranks(2, train_rank, dir, &second, 240);
    compare_params(dir, "second", "straight", 0);
}

/* Sharded: rank 0 alone is refused at once, naming the fix; the others' next step
 * fails too (bounded by the children's alarm: a hang fails the test). */
Test(accel_checkpoint, sharded_rank0_only_save_is_refused)
{
    write_tokens(tmpdir);
    run r = {.world = 2, .zero = 3, .global_batch = 4, .steps = 1, .save = "ck", .rank0_only = true};
    run_env_ranks(2, train_rank, tmpdir, &r, 60);
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck/manifest.json", tmpdir);
    cr_assert(access(ck, F_OK) != 0, "a refused save left a manifest");
}

/* Saving in the middle of an accumulation window is refused. */
Test(accel_checkpoint, mid_window_save_is_refused)
{
    CT_FRAME {
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.gradient_accumulation_steps = 2});
        ct_tensor *w = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(3));
        ct_tensor_set_requires_grad(w, true);
        ct_optimizer *opt = ct_sgd_new(1, &w, NULL);
        cr_assert(!ct_accelerator_prepare(acc, NULL, opt, NULL, NULL), "%s", ct_last_error());
        ct_accelerator_accumulate_begin(acc);
        cr_assert(!ct_accelerator_backward(acc, ct_sum_all(ct_mul(w, w))));
        cr_assert(!ct_optimizer_step(opt));
        char ck[700];
        snprintf(ck, sizeof ck, "%s/mid", tmpdir);
        cr_assert(ct_accelerator_save_state(acc, ck));
        cr_assert(strstr(ct_last_error(), "gradient-accumulation window"), "%s", ct_last_error());
        cr_assert(access(ck, F_OK) != 0);
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
    }
}

/* ---- crash safety ---------------------------------------------------------------------- */

/* Runs r in a child process that SIGKILL ends; returns whether it was killed. */
static bool run_killed(run *r)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        alarm(120);
        _exit(train_rank(0, 1, tmpdir, r));
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

/* The latest complete checkpoint of project p verifies and loads. */
static void expect_latest(const char *p, const char *want)
{
    char proj[700], latest[1024];
    snprintf(proj, sizeof proj, "%s/%s", tmpdir, p);
    cr_assert(!ct_checkpoint_latest(proj, latest, sizeof latest), "%s", ct_last_error());
    cr_assert(strstr(latest, want), "latest is %s, expected %s", latest, want);
    cr_assert(!ct_checkpoint_inspect(latest, true, NULL, NULL), "%s", ct_last_error());
}

/* A save killed after each of its durable points in turn: before the rename the
 * previous checkpoint stays the latest complete one; after it, the new one is. */
Test(accel_checkpoint, kill_at_every_point_of_a_save)
{
    write_tokens(tmpdir);
    /* points of one single-process save: model, optimizer, trainer state, the registered
     * generator, manifest, rename */
    for (int k = 1; k <= 6; k++) {
        char p[32];
        snprintf(p, sizeof p, "p%d", k);
        run r = {.world = 1, .global_batch = 4, .steps = 2, .project = p, .total_limit = 1, .kill_step = 2, .kill_at = k};
        cr_assert(run_killed(&r), "the save was not killed at point %d", k);
        expect_latest(p, k < 6 ? "checkpoint_0" : "checkpoint_1");
        /* and it resumes: the next run continues from it */
        run again = {.world = 1, .global_batch = 4, .steps = 1, .load = "auto", .project = p, .total_limit = 1};
        run_env_ranks(1, train_rank, tmpdir, &again, 120);
        expect_latest(p, k < 6 ? "checkpoint_1" : "checkpoint_2");
    }
    unsetenv("CTRAIN_TEST_CHECKPOINT_KILL_AT");
}

/* Killed at random moments of a loop that saves every step with total_limit 1: the
 * limit never removes the last complete checkpoint. */
Test(accel_checkpoint, kill_at_random_times)
{
    write_tokens(tmpdir);
    /* a first checkpoint, then runs that resume from the latest and are killed */
    run first = {.world = 1, .global_batch = 4, .steps = 1, .project = "rnd", .total_limit = 1};
    run_env_ranks(1, train_rank, tmpdir, &first, 120);
    srand(7);
    for (int t = 0; t < 6; t++) {
        run r = {.world = 1, .global_batch = 4, .steps = 200, .project = "rnd", .total_limit = 1, .load = "auto"};
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0) {
            alarm(120);
            _exit(train_rank(0, 1, tmpdir, &r));
        }
        usleep(150000 + (useconds_t)(rand() % 400000));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        char proj[700], latest[1024];
        snprintf(proj, sizeof proj, "%s/rnd", tmpdir);
        cr_assert(!ct_checkpoint_latest(proj, latest, sizeof latest), "kill %d: %s", t, ct_last_error());
        cr_assert(!ct_checkpoint_inspect(latest, true, NULL, NULL), "kill %d: %s", t, ct_last_error());
    }
}

/* ---- bad checkpoints ---------------------------------------------------------------------- */

static void corrupt(const char *name, long at, int truncate_to)
{
    char path[700];
    snprintf(path, sizeof path, "%s/bad/%s", tmpdir, name);
    if (truncate_to >= 0) {
        cr_assert(!truncate(path, truncate_to));
        return;
    }
    FILE *f = fopen(path, "r+b");
    cr_assert(f, "%s", path);
    fseek(f, at, SEEK_END);
    int c = fgetc(f);
    fseek(f, at, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void bad_case(void (*spoil)(void), const char *expect)
{
    write_tokens(tmpdir);
    run save = {.world = 1, .global_batch = 4, .steps = 2, .save = "bad"};
    run_env_ranks(1, train_rank, tmpdir, &save, 120);
    spoil();
    run load = {.world = 1, .global_batch = 4, .load = "bad", .expect = expect};
    run_env_ranks(1, train_rank, tmpdir, &load, 120);
}

static void flip_model(void) { corrupt("model.safetensors", -5, -1); }
static void cut_optimizer(void) { corrupt("optimizer-rank00000-of-00001.safetensors", 0, 1000); }
static void drop_state(void)
{
    char p[700];
    snprintf(p, sizeof p, "%s/bad/trainer_state.json", tmpdir);
    cr_assert(!unlink(p));
}
static void newer_format(void)
{
    char p[700];
    snprintf(p, sizeof p, "%s/bad/manifest.json", tmpdir);
    long n;
    char *text = slurp(tmpdir, "bad/manifest.json", &n);
    text[n] = '\0';
    char *v = strstr(text, "\"format_version\":");
    cr_assert(v);
    v += strlen("\"format_version\":");
    while (*v == ' ' || *v == '\t') v++;
    *v = '7';
    FILE *f = fopen(p, "wb");
    fwrite(text, 1, (size_t)n, f);
    fclose(f);
    free(text);
}
static void no_manifest(void)
{
    char p[700];
    snprintf(p, sizeof p, "%s/bad/manifest.json", tmpdir);
    cr_assert(!unlink(p));
}

Test(accel_checkpoint, flipped_byte) { bad_case(flip_model, "'model.safetensors' is corrupted"); }
Test(accel_checkpoint, truncated_file) { bad_case(cut_optimizer, "is 1000 bytes, the manifest says"); }
Test(accel_checkpoint, missing_file) { bad_case(drop_state, "'trainer_state.json' is missing"); }
Test(accel_checkpoint, newer_format) { bad_case(newer_format, "written by a newer ctrain"); }
Test(accel_checkpoint, incomplete_save) { bad_case(no_manifest, "its save did not complete"); }

/* A checkpoint of another model (a narrower embedding): the error names the tensor
 * and both shapes. */
Test(accel_checkpoint, another_model)
{
    write_tokens(tmpdir);
    run save = {.world = 1, .global_batch = 4, .steps = 1, .save = "bad"};
    run_env_ranks(1, train_rank, tmpdir, &save, 120);
    run load = {.world = 1, .global_batch = 4, .load = "bad", .wide = true,
                .expect = "'wte.weight.exp_avg' is [61, 30] in the checkpoint but the parameter is [61, 32]"};
    run_env_ranks(1, train_rank, tmpdir, &load, 120);
}

/* A checkpoint of another optimizer: the error names both kinds. */
Test(accel_checkpoint, another_optimizer)
{
    write_tokens(tmpdir);
    run save = {.world = 1, .global_batch = 4, .steps = 1, .save = "bad"};
    run_env_ranks(1, train_rank, tmpdir, &save, 120);
    run load = {.world = 1, .global_batch = 4, .load = "bad", .sgd = true,
                .expect = "the checkpoint's optimizer is adamw, this run's is sgd"};
    run_env_ranks(1, train_rank, tmpdir, &load, 120);
}

/* ct_checkpoint_count: checkpoint_<i> directories, complete or not; nothing else. */
Test(accel_checkpoint, count_is_the_checkpoint_directories)
{
    char proj[700], d[800];
    snprintf(proj, sizeof proj, "%s/count", tmpdir);
    cr_expect_eq(ct_checkpoint_count(proj), 0, "a project without a checkpoints directory");
    const char *names[] = {"", "/checkpoints", "/checkpoints/checkpoint_0.tmp-ab12", "/checkpoints/checkpoint_",
                           "/checkpoints/checkpoint_x1", "/checkpoints/other"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(d, sizeof d, "%s%s", proj, names[i]);
        cr_assert_eq(mkdir(d, 0755), 0, "%s", d);
    }
    cr_expect_eq(ct_checkpoint_count(proj), 0, "only an interrupted save and other names");
    snprintf(d, sizeof d, "%s/checkpoints/checkpoint_3", proj);
    cr_assert_eq(mkdir(d, 0755), 0);
    snprintf(d, sizeof d, "%s/checkpoints/checkpoint_12", proj);
    cr_assert_eq(mkdir(d, 0755), 0);
    cr_expect_eq(ct_checkpoint_count(proj), 2, "checkpoint_3 (empty: incomplete) and checkpoint_12");
}
