/* Tests for training-state checkpoints under Megatron-LM tensor parallelism
 * (accel/megatron_checkpoint.c, accel/checkpoint_save.c, accel/checkpoint_load.c) on
 * fork()ed ranks that find each other as launched programs do.
 *
 * Each case trains the GPT or Llama W1 shape (T = 32) 3 AdamW steps, saves the state,
 * takes 2 more steps and writes the whole model (the continuation). A fresh run (a
 * model initialised from another seed, so that only the checkpoint can make it equal)
 * loads the checkpoint at the same or another tp degree, takes the same 2 steps and
 * writes its whole model: at the same layout it must equal the continuation bitwise;
 * at another (tp 2 against one process) within summation-order rounding (rel_rms and
 * rel_err below). A wrong slice of a parameter or moment, a moment not restored or a
 * step count lost moves whole tensors by about lr per step, orders above that. The
 * same under pipeline parallelism (tp 2 x pp 2, pp 2, pp 2 x dp 2). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/optimizer.h"
#include "tests/env_ranks.h"
#include "tests/nn/tp_check.h"
#include "tests/tmpdir.h"

#define T 32
#define B 2
#define LR 1e-3

static const ct_gpt_config GPT_W1 = {.vocab_size = 256, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};
/* vocab 2047: odd, so tp 2 pads the vocabulary (the padding must not reach a checkpoint) */
static const ct_llama_config LLAMA_W1 = {.vocab_size = 2047, .hidden_size = 256, .intermediate_size = 688,
                                         .num_hidden_layers = 4, .num_attention_heads = 4,
                                         .num_key_value_heads = 2, .max_position_embeddings = 64};

typedef struct ck_run {
    bool llama, sp;
    int tp;           /* 1 with pp 1: no Megatron-LM (one process) */
    int pp;           /* pipeline stages (0 = 1), 2 micro-batches each step */
    int world;        /* 0: tp x pp (dp 1); else tp x pp x dp, every dp rank training on the same batches */
    int zero;         /* 1..3: DeepSpeed's zero_stage over dp (tp > 1, world > tp) */
    bool dist_opt;    /* Megatron-LM's use_distributed_optimizer (ZeRO-1 over dp) */
    bool resume;      /* false: 3 steps, save_state(ckpt), 2 steps; true: load_state(ckpt), 2 steps */
    uint64_t seed;    /* the model's initialisation */
    char ckpt[128];   /* the checkpoint directory */
    char out[128];    /* the whole model at the end (ct_accelerator_save_model) */
    char save_after[128]; /* "": none; else save_state there at the end */
    char bad[128];    /* "": none; else a model file of another shape that load_model must
                       * refuse, naming the tensor and both shapes, changing nothing */
    double dropout;   /* the GPT's; its masks under tp come from the model's own generator */
    const char *mp;   /* mixed precision; NULL "no" */
} ck_run;


/* step s's batch: (B, T) tokens and their next tokens, the same on every rank */
static void batch(const ck_run *c, int s, ct_tensor **x, ct_tensor **y)
{
    const int64_t V = c->llama ? LLAMA_W1.vocab_size : GPT_W1.vocab_size;
    *x = ct_tensor_empty(CT_DTYPE_I64, 2, (int64_t[]){B, T});
    *y = ct_tensor_empty(CT_DTYPE_I64, 2, (int64_t[]){B, T});
    int64_t *px = ct_tensor_data(*x), *py = ct_tensor_data(*y);
    uint32_t r = 977u * (uint32_t)(s + 1);
    int64_t prev = 0;
    for (int64_t i = 0; i < B * (T + 1); i++) {
        r = r * 1664525u + 1013904223u;
        int64_t tok = (int64_t)((r >> 8) % (uint32_t)V);
        if (i % (T + 1) != 0) px[(i / (T + 1)) * T + i % (T + 1) - 1] = prev, py[(i / (T + 1)) * T + i % (T + 1) - 1] = tok;
        prev = tok;
    }
}

static int fail(int rank, const char *what)
{
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, ct_last_error());
    return 1;
}

/* n steps from step first; each step's loss into losses[s - first] (NULL: not kept) */
static ct_status train(ct_accelerator *acc, const ck_run *c, ct_module *m, ct_optimizer *opt, int first, int n,
                       double *losses)
{
    ct_status st = CT_OK;
    for (int s = first; s < first + n && !st; s++) CT_FRAME {
            ct_tensor *x, *y;
            batch(c, s, &x, &y);
            CT_ACCUMULATE(acc) {
                ct_tensor *loss = c->llama ? ct_llama_loss((ct_llama *)m, x, y) : ct_gpt_loss((ct_gpt *)m, x, y);
                if (loss && losses) losses[s - first] = ct_tensor_item(loss);
                st = loss ? ct_accelerator_backward(acc, loss) : ct_last_status();
                if (!st) st = ct_optimizer_step(opt);
                ct_optimizer_zero_grad(opt);
            }
        }
    return st;
}

static int ck_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir, (void)world;
    const ck_run *c = ctx;
    setenv("CTRAIN_NUM_THREADS", "1", 1); /* ranks share 2 cores */
    ct_set_num_threads(1);
    int rc = 0;
    CT_FRAME {
        ct_set_seed(c->seed);
        ct_gpt_config gc = GPT_W1;
        gc.dropout = c->dropout;
        ct_module *m = c->llama ? &ct_llama_new(&LLAMA_W1)->base : &ct_gpt_new(&gc)->base;
        ct_param_list pl;
        if (!m || ct_module_named_tensors(m, false, &pl)) {
            rc = fail(rank, "model");
            continue; /* leaves the frame */
        }
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = LR, .weight_decay = 0.1});
        ct_param_list_free(&pl);
        ct_megatron_lm_plugin p = {.tp_degree = c->tp, .pp_degree = c->pp, .num_micro_batches = c->pp > 1 ? 2 : 1,
                                   .sequence_parallelism = c->sp, .use_distributed_optimizer = c->dist_opt};
        ct_deepspeed_plugin ds = {.zero_stage = c->zero};
        bool mlm = c->tp > 1 || c->pp > 1;
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.megatron_lm_plugin = mlm ? &p : NULL,
                                                                          .deepspeed_plugin = c->zero ? &ds : NULL,
                                                                          .mixed_precision = c->mp});
        ct_status st = acc ? ct_accelerator_prepare(acc, m, opt, NULL, NULL) : ct_last_status();
        if (!st && (c->zero || c->dist_opt) && !ct_accelerator_shard(acc))
            st = ct_error_set(CT_ERR_INVALID, "zero_stage %d at tp %d: no sharding engine over dp", c->zero, c->tp);
        if (st) rc = fail(rank, "prepare");
        if (!rc && !c->resume) {
            if (train(acc, c, m, opt, 0, 3, NULL)) rc = fail(rank, "3 steps");
            else if (ct_accelerator_save_state(acc, c->ckpt)) rc = fail(rank, "save_state");
        } else if (!rc && ct_accelerator_load_state(acc, c->ckpt)) {
            rc = fail(rank, "load_state");
        }
        double losses[2] = {0};
        if (!rc && train(acc, c, m, opt, 3, 2, losses)) rc = fail(rank, "2 steps");
        if (!rc && rank == 0) { /* the 2 steps' losses beside the model, as raw doubles */
            char path[160];
            snprintf(path, sizeof path, "%s.losses", c->out);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(losses, sizeof losses, 1, f) != 1) rc = fail(rank, "writing the losses");
            if (f) fclose(f);
        }
        if (!rc && ct_accelerator_save_model(acc, m, c->out)) rc = fail(rank, "save_model");
        if (!rc && c->save_after[0] && ct_accelerator_save_state(acc, c->save_after)) rc = fail(rank, "save_state at the end");
        if (!rc && c->bad[0]) {
            /* wte is the first tensor; at tp 2 each rank holds 128 of its 256 rows */
            const char *want = "'wte.weight' is [256, 128] in";
            char after[160];
            snprintf(after, sizeof after, "%s.after", c->out);
            if (!ct_accelerator_load_model(acc, m, c->bad) || !strstr(ct_last_error(), want) ||
                !strstr(ct_last_error(), "but [256, 256] in the whole model (tp 2)")) {
                fprintf(stderr, "rank %d: load_model of another shape: %s; want an error naming '%s'\n", rank,
                        ct_last_error(), want);
                rc = 1;
            } else if (ct_accelerator_save_model(acc, m, after)) {
                rc = fail(rank, "save_model after the refused load");
            }
        }
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
        ct_module_free(m);
    }
    return rc;
}

/* Every tensor of got's file against want's: rel_rms <= tol, rel_err <= tol_elem
 * (0, 0: bitwise). */
static void compare(const char *got, const char *want, double tol, double tol_elem)
{
    ct_safetensors *g = ct_safetensors_open(got), *w = ct_safetensors_open(want);
    cr_assert(g && w, "%s", ct_last_error());
    cr_assert_eq(ct_safetensors_count(g), ct_safetensors_count(w));
    CT_FRAME {
        for (int i = 0; i < ct_safetensors_count(w); i++) {
            const char *name = ct_safetensors_name(w, i);
            ct_tensor *a = ct_safetensors_get(g, name), *b = ct_safetensors_get(w, name);
            cr_assert(a && b, "%s: %s", name, ct_last_error());
            double e = rel_rms(a, b), ee = rel_err(a, b);
            cr_assert(e <= tol && ee <= tol_elem, "%s: %s against %s: relative error %g (tolerance %g), per element %g (%g)",
                      name, got, want, e, tol, ee, tol_elem);
        }
    }
    ct_safetensors_close(g);
    ct_safetensors_close(w);
}

static ck_run run_of(bool llama, bool sp, int tp, bool resume, uint64_t seed, const char *ckpt, const char *out)
{
    ck_run r = {.llama = llama, .sp = sp, .tp = tp, .resume = resume, .seed = seed};
    snprintf(r.ckpt, sizeof r.ckpt, "%s/%s", tmpdir, ckpt);
    snprintf(r.out, sizeof r.out, "%s/%s", tmpdir, out);
    return r;
}

static void go(ck_run r)
{
    run_env_ranks(r.world ? r.world : r.tp * (r.pp > 1 ? r.pp : 1), ck_rank, NULL, &r, 110);
}

static void setup(void) { make_tmpdir_with("/tmp/ct_tpckpt_"); }
static void teardown(void) { remove_tmpdir(); }

TestSuite(megatron_checkpoint, .init = setup, .fini = teardown);

/* tmpdir/name in one of four rotating buffers */
static const char *at(const char *name)
{
    static char buf[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* summation order differs between tp 2 and one process: rounding only (test_megatron's
 * tolerances over 5 steps) */
#define TOL 1e-5
#define TOL_ELEM 1e-4

Test(megatron_checkpoint, gpt_w1_tp2_resumes_bitwise_at_tp2_and_in_one_process, .timeout = 120)
{
    go(run_of(false, false, 2, false, 7, "ck", "cont.safetensors"));
    /* the checkpoint says what saved it, and every file verifies */
    ct_checkpoint_info info;
    cr_assert_eq(ct_checkpoint_inspect(at("ck"), true, &info, NULL), CT_OK, "%s", ct_last_error());
    cr_assert_str_eq(info.strategy, "MEGATRON_LM");
    cr_assert_eq(info.world_size, 2);
    cr_assert(info.tp_degree == 2 && info.dp_degree == 1, "tp %d, dp %d", info.tp_degree, info.dp_degree);
    cr_assert_eq(info.step, 3);
    /* a GPT of another width, whose tensors load_model at tp 2 must refuse */
    CT_FRAME {
        ct_gpt_config small = GPT_W1;
        small.n_embd = 128;
        ct_gpt *other = ct_gpt_new(&small);
        cr_assert(other && !ct_module_save(&other->base, at("other.safetensors"), 0, NULL, NULL), "%s", ct_last_error());
        ct_module_free(&other->base);
    }
    ck_run r = run_of(false, false, 2, true, 99, "ck", "tp2.safetensors");
    snprintf(r.bad, sizeof r.bad, "%s", at("other.safetensors"));
    go(r);
    compare(at("tp2.safetensors"), at("cont.safetensors"), 0, 0);
    compare(at("tp2.safetensors.after"), at("cont.safetensors"), 0, 0); /* the refused load changed nothing */
    go(run_of(false, false, 1, true, 99, "ck", "tp1.safetensors"));
    compare(at("tp1.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
}

Test(megatron_checkpoint, gpt_w1_one_process_checkpoint_resumes_at_tp2, .timeout = 120)
{
    go(run_of(false, false, 1, false, 7, "ck1", "cont1.safetensors"));
    go(run_of(false, false, 2, true, 99, "ck1", "tp2.safetensors"));
    compare(at("tp2.safetensors"), at("cont1.safetensors"), TOL, TOL_ELEM);
}

Test(megatron_checkpoint, llama_w1_tp2_sequence_parallel_resumes_bitwise_and_at_tp1_and_dp2, .timeout = 120)
{
    go(run_of(true, true, 2, false, 7, "ck", "cont.safetensors"));
    go(run_of(true, true, 2, true, 99, "ck", "tp2.safetensors"));
    compare(at("tp2.safetensors"), at("cont.safetensors"), 0, 0);
    go(run_of(true, false, 1, true, 99, "ck", "tp1.safetensors"));
    compare(at("tp1.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
    /* tp 2 x dp 2 (DDP over dp): the same batches on both dp ranks average to the same
     * gradients, so it continues as tp 2 alone */
    ck_run r = run_of(true, true, 2, true, 99, "ck", "dp2.safetensors");
    r.world = 4;
    snprintf(r.save_after, sizeof r.save_after, "%s", at("ck4"));
    go(r);
    compare(at("dp2.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
    /* its own save (tp 2 x dp 2): the whole model, files that verify, the layout recorded */
    ct_checkpoint_info info;
    cr_assert_eq(ct_checkpoint_inspect(at("ck4"), true, &info, NULL), CT_OK, "%s", ct_last_error());
    cr_assert(info.world_size == 4 && info.step == 5 && !strcmp(info.strategy, "MEGATRON_LM"));
    cr_assert(info.tp_degree == 2 && info.dp_degree == 2, "tp %d, dp %d", info.tp_degree, info.dp_degree);
    compare(at("ck4/model.safetensors"), at("dp2.safetensors"), 0, 0);
    ct_safetensors *f = ct_safetensors_open(at("ck4/optimizer-rank00000-of-00001.safetensors"));
    cr_assert_not_null(f, "%s", ct_last_error());
    /* the padded vocabulary (2047 rows, 2048 sharded) is whole and unpadded */
    const char *part = ct_safetensors_metadata(f, "ctrain.part.model.embed_tokens.weight.exp_avg");
    cr_assert(part && strstr(part, "begin=0 end=524032 shape=[2047,256]"), "%s", part ? part : "(no part)");
    ct_safetensors_close(f);
}

/* Pipeline parallelism: a checkpoint of tp 2 x pp 2 (each stage's shards gathered and
 * sent to rank 0: the whole model and moments, as one process saves them) resumes
 * bitwise at the same layout, in one process and at pp 2 alone; a one-process
 * checkpoint resumes at pp 2 x dp 2. */
Test(megatron_checkpoint, gpt_w1_tp2_pp2_resumes_bitwise_and_in_one_process_and_at_pp2, .timeout = 150)
{
    ck_run r = run_of(false, true, 2, false, 7, "ckp", "cont.safetensors");
    r.pp = 2;
    go(r);
    ct_checkpoint_info info;
    cr_assert_eq(ct_checkpoint_inspect(at("ckp"), true, &info, NULL), CT_OK, "%s", ct_last_error());
    cr_assert(info.world_size == 4 && info.tp_degree == 2 && info.pp_degree == 2 && info.dp_degree == 1,
              "world %d, tp %d, pp %d, dp %d", info.world_size, info.tp_degree, info.pp_degree, info.dp_degree);
    r = run_of(false, true, 2, true, 99, "ckp", "same.safetensors");
    r.pp = 2;
    go(r);
    compare(at("same.safetensors"), at("cont.safetensors"), 0, 0);
    go(run_of(false, false, 1, true, 99, "ckp", "one.safetensors"));
    compare(at("one.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
    r = run_of(false, false, 1, true, 99, "ckp", "pp2.safetensors");
    r.pp = 2;
    go(r);
    compare(at("pp2.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
}

Test(megatron_checkpoint, llama_w1_one_process_checkpoint_resumes_at_pp2_dp2, .timeout = 150)
{
    go(run_of(true, false, 1, false, 7, "ck1", "cont1.safetensors"));
    ck_run r = run_of(true, false, 1, true, 99, "ck1", "pp2dp2.safetensors");
    r.pp = 2, r.world = 4;
    go(r);
    compare(at("pp2dp2.safetensors"), at("cont1.safetensors"), TOL, TOL_ELEM);
}

/* tp 4 over the 2 key/value heads (each on 2 ranks): the checkpoint holds each head
 * once, and loads at tp 4 (bitwise), at tp 2 (heads split) and in one process */
Test(megatron_checkpoint, llama_w1_tp4_replicated_kv_heads_resume_at_tp4_tp2_and_tp1, .timeout = 150)
{
    go(run_of(true, false, 4, false, 7, "ck", "cont.safetensors"));
    go(run_of(true, false, 4, true, 99, "ck", "tp4.safetensors"));
    compare(at("tp4.safetensors"), at("cont.safetensors"), 0, 0);
    go(run_of(true, false, 2, true, 99, "ck", "tp2.safetensors"));
    compare(at("tp2.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
    go(run_of(true, false, 1, true, 99, "ck", "tp1.safetensors"));
    compare(at("tp1.safetensors"), at("cont.safetensors"), TOL, TOL_ELEM);
    ct_safetensors *f = ct_safetensors_open(at("ck/model.safetensors"));
    cr_assert_not_null(f, "%s", ct_last_error());
    int nd;
    int64_t shape[CT_MAX_DIMS];
    ct_dtype dt;
    cr_assert(ct_safetensors_info(f, "model.layers.0.self_attn.k_proj.weight", &dt, &nd, shape), "%s",
              ct_last_error());
    cr_assert(nd == 2 && shape[0] == 128 && shape[1] == 256, "k_proj [%lld, %lld]", (long long)shape[0],
              (long long)shape[1]);
    ct_safetensors_close(f);
}

/* the losses a run wrote beside its model */
static void losses_of(const char *out, double losses[2])
{
    char path[200];
    snprintf(path, sizeof path, "%s.losses", out);
    FILE *f = fopen(path, "rb");
    cr_assert(f && fread(losses, sizeof(double), 2, f) == 2, "%s", path);
    fclose(f);
}

/* dropout 0.1: the GPT's tensor-parallel dropout generator (one stream, or one per tp
 * rank under sequence parallelism) is in the checkpoint, so the resumed run draws the
 * masks the uninterrupted one drew: the losses and the parameters bitwise. The fresh
 * run starts from another seed, so its generators differ until the load. */
Test(megatron_checkpoint, gpt_w1_tp2_dropout_resumes_bitwise_with_and_without_sequence_parallelism, .timeout = 150)
{
    /* tp 2, tp 2 with sequence parallelism, that inside 2 pipeline stages (each stage's
     * ranks draw their own streams), and 2 stages alone (the process generators, which
     * the stages draw from unevenly: each rank's saved) */
    for (int k = 0; k < 4; k++) {
        const int sp = k == 1 || k == 2, pp = k >= 2 ? 2 : 1, tp = k == 3 ? 1 : 2;
        const char *dir = k == 0 ? "ck" : k == 1 ? "cks" : k == 2 ? "ckp" : "ckp1";
        ck_run r = run_of(false, sp, tp, false, 7, dir, "cont.safetensors");
        r.dropout = 0.1, r.pp = pp;
        go(r);
        r = run_of(false, sp, tp, true, 99, dir, "tp2.safetensors");
        r.dropout = 0.1, r.pp = pp;
        go(r);
        compare(at("tp2.safetensors"), at("cont.safetensors"), 0, 0);
        double want[2], got[2];
        losses_of(at("cont.safetensors"), want);
        losses_of(at("tp2.safetensors"), got);
        cr_assert(!memcmp(want, got, sizeof want),
                  "sequence parallel %d, pp %d: losses %.9g %.9g resumed, %.9g %.9g straight", sp, pp, got[0], got[1],
                  want[0], want[1]);
    }
}

/* fp8: the scaling state (the same on every rank: the amaxes are all-reduced) is in the
 * checkpoint, so a resumed tp 2 run quantises with the saved scales: bitwise again */
Test(megatron_checkpoint, gpt_w1_tp2_fp8_resumes_bitwise, .timeout = 120)
{
    ck_run r = run_of(false, true, 2, false, 7, "ck", "cont.safetensors");
    r.mp = "fp8";
    go(r);
    r = run_of(false, true, 2, true, 99, "ck", "tp2.safetensors");
    r.mp = "fp8";
    go(r);
    compare(at("tp2.safetensors"), at("cont.safetensors"), 0, 0);
    ct_checkpoint_info info;
    cr_assert_eq(ct_checkpoint_inspect(at("ck"), true, &info, NULL), CT_OK, "%s", ct_last_error());
    cr_assert_str_eq(info.mixed_precision, "fp8");
}

/* fp8 under a pipeline: the stages' scaling states, one after the other, are one
 * process's (its rows in the order of the forward), so tp 2 x pp 2 resumes bitwise,
 * and one process resumes it with the saved scales (fp8's rounding of other sums:
 * the fp8 tests' bounds) */
Test(megatron_checkpoint, gpt_w1_tp2_pp2_fp8_resumes_bitwise_and_in_one_process, .timeout = 150)
{
    ck_run r = run_of(false, true, 2, false, 7, "ckf", "cont.safetensors");
    r.mp = "fp8", r.pp = 2;
    go(r);
    r = run_of(false, true, 2, true, 99, "ckf", "same.safetensors");
    r.mp = "fp8", r.pp = 2;
    go(r);
    compare(at("same.safetensors"), at("cont.safetensors"), 0, 0);
    r = run_of(false, false, 1, true, 99, "ckf", "one.safetensors");
    r.mp = "fp8";
    go(r);
    compare(at("one.safetensors"), at("cont.safetensors"), 5e-3, 3e-2);
    ct_safetensors *f = ct_safetensors_open(at("ckf/fp8_state.safetensors"));
    cr_assert_not_null(f, "%s", ct_last_error());
    int nd;
    int64_t shape[CT_MAX_DIMS];
    ct_dtype dt;
    cr_assert(ct_safetensors_info(f, "scale", &dt, &nd, shape), "%s", ct_last_error());
    cr_assert(nd == 2 && shape[0] == 16 && shape[1] == 3, "scale [%lld, %lld]: 4 layers x 4 linears", (long long)shape[0],
              (long long)shape[1]);
    ct_safetensors_close(f);
}

/* tp 2 x ZeRO-2 over dp 2: the checkpoint holds the whole model and the whole moments
 * (the slices gathered over dp, then over tp), so one process resumes it, and so does
 * tp 2 x ZeRO-3 (each rank's slices cut from the whole tensors) */
Test(megatron_checkpoint, gpt_w1_tp2_zero2_resumes_in_one_process_and_at_tp2_zero3, .timeout = 150)
{
    ck_run r = run_of(false, true, 2, false, 7, "ckz", "contz.safetensors");
    r.world = 4, r.zero = 2;
    go(r);
    ct_checkpoint_info info;
    cr_assert_eq(ct_checkpoint_inspect(at("ckz"), true, &info, NULL), CT_OK, "%s", ct_last_error());
    cr_assert(info.world_size == 4 && info.tp_degree == 2 && info.dp_degree == 2 && info.step == 3,
              "world %d, tp %d, dp %d, step %lld", info.world_size, info.tp_degree, info.dp_degree, (long long)info.step);
    go(run_of(false, false, 1, true, 99, "ckz", "z1.safetensors"));
    compare(at("z1.safetensors"), at("contz.safetensors"), TOL, TOL_ELEM);
    r = run_of(false, true, 2, true, 99, "ckz", "z3.safetensors");
    r.world = 4, r.zero = 3;
    go(r);
    compare(at("z3.safetensors"), at("contz.safetensors"), TOL, TOL_ELEM);
}

/* pp 2 x dp 2 with the distributed optimizer (ZeRO-1 in each stage): the checkpoint
 * holds the whole model and moments (each stage's slices put together over dp, then
 * sent from the stage that holds them), so it resumes bitwise at the same layout and
 * in one process */
Test(megatron_checkpoint, gpt_w1_pp2_dp2_distributed_optimizer_resumes_bitwise_and_in_one_process, .timeout = 150)
{
    ck_run r = run_of(false, false, 1, false, 7, "ckd", "contd.safetensors");
    r.pp = 2, r.world = 4, r.dist_opt = true;
    go(r);
    ct_checkpoint_info info;
    cr_assert_eq(ct_checkpoint_inspect(at("ckd"), true, &info, NULL), CT_OK, "%s", ct_last_error());
    cr_assert(info.world_size == 4 && info.pp_degree == 2 && info.dp_degree == 2 && info.step == 3,
              "world %d, pp %d, dp %d, step %lld", info.world_size, info.pp_degree, info.dp_degree, (long long)info.step);
    r = run_of(false, false, 1, true, 99, "ckd", "d2.safetensors");
    r.pp = 2, r.world = 4, r.dist_opt = true;
    go(r);
    compare(at("d2.safetensors"), at("contd.safetensors"), 0, 0);
    go(run_of(false, false, 1, true, 99, "ckd", "d1.safetensors"));
    compare(at("d1.safetensors"), at("contd.safetensors"), TOL, TOL_ELEM);
}

/* pp 2 x dp 2 under ZeRO-3 (each stage's parameters and moments sharded over dp): the
 * same whole-model checkpoint, resumed bitwise at the same layout and at pp 2 x dp 2
 * with the distributed optimizer within rounding */
Test(megatron_checkpoint, gpt_w1_pp2_dp2_zero3_resumes_bitwise_and_under_the_distributed_optimizer, .timeout = 150)
{
    ck_run r = run_of(false, false, 1, false, 7, "ck3", "cont3.safetensors");
    r.pp = 2, r.world = 4, r.zero = 3;
    go(r);
    r = run_of(false, false, 1, true, 99, "ck3", "z3.safetensors");
    r.pp = 2, r.world = 4, r.zero = 3;
    go(r);
    compare(at("z3.safetensors"), at("cont3.safetensors"), 0, 0);
    r = run_of(false, false, 1, true, 99, "ck3", "d.safetensors");
    r.pp = 2, r.world = 4, r.dist_opt = true;
    go(r);
    compare(at("d.safetensors"), at("cont3.safetensors"), TOL, TOL_ELEM);
}
