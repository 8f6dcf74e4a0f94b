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
    ct_accelerator_config cfg = {.mixed_precision = r->precision ? r->precision : "no",
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
        ct_gpt *m = acc ? ct_gpt_new(&tiny) : NULL;
        ct_accelerator_set_seed(acc, 100, true); /* dropout masks per rank */
        ct_param_list pl = {0};
        if (m) ct_module_named_tensors(&m->base, false, &pl);
        ct_optimizer *opt = m ? ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 3e-3, .weight_decay = 0.1}) : NULL;
        ct_scheduler *sch = opt ? ct_scheduler_new(opt, &(ct_lr_schedule){.decay = CT_LR_COSINE, .warmup_steps = 2,
                                                                          .total_steps = 20, .min_lr = 1e-4})
                                : NULL;
        ct_status st = sch ? ct_accelerator_prepare(acc, &m->base, opt, ld, sch) : ct_last_status();
        if (st) rc = fail(rank, "setup");
        if (!rc && r->load) {
            char ck[700];
            snprintf(ck, sizeof ck, "%s/%s", dir, r->load);
            if (ct_accelerator_load_state(acc, ck)) rc = fail(rank, "load_state");
        }
        snprintf(path, sizeof path, "%s/%s.loss", dir, r->tag);
        FILE *lf = rank == 0 && !rc ? fopen(path, "ab") : NULL;
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
            if (lf) fwrite(&loss, sizeof loss, 1, lf);
        }
        if (lf) fclose(lf);
        if (!rc && r->save) {
            char ck[700];
            snprintf(ck, sizeof ck, "%s/%s", dir, r->save);
            if (ct_accelerator_save_state(acc, ck)) rc = fail(rank, "save_state");
        }
        ct_state_dict sd = {0};
        if (!rc && ct_accelerator_get_state_dict(acc, &m->base, &sd)) rc = fail(rank, "state dict");
        if (!rc && rank == 0) {
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
                else
                    cr_assert(fabs(u[j] - v[j]) <= rtol * (fabs(v[j]) + 1e-3), "%s: %s[%lld] %.9g vs %.9g", a, n,
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
