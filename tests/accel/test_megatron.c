/* Tests for accel/megatron.c and accel/megatron_plugin.c: Megatron-LM tensor
 * parallelism through the Accelerator's normal loop (prepare, CT_ACCUMULATE,
 * backward, step) on fork()ed ranks that find each other as launched programs do.
 *
 * Each run trains the GPT or Llama W1 shape 5 AdamW steps (2 micro-steps each,
 * clipped by the plugin's gradient_clipping) at tp 2 or tp 2 x dp 2. Rank 0 then puts
 * the whole model back together from every rank's shards (the shard records say which
 * part each holds; put together here) and compares it with the same model trained by
 * a plain one-process loop written here: ct_backward of loss / 2, ct_clip_grad_norm,
 * AdamW, on batches of dp x B rows (the rows the dp ranks see together). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "autograd/autocast_cast.h"
#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/llama.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "precision/autocast.h"
#include "precision/fp8_state.h"
#include "tests/env_ranks.h"
#include "tests/nn/tp_check.h"

#define T 32
#define K 2
#define STEPS 5
#define LR 1e-3
#define CLIP 0.5

static const ct_gpt_config GPT_W1 = {.vocab_size = 256, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};
static const ct_llama_config LLAMA_W1 = {.vocab_size = 2048, .hidden_size = 256, .intermediate_size = 688,
                                         .num_hidden_layers = 4, .num_attention_heads = 4,
                                         .num_key_value_heads = 2, .max_position_embeddings = 64};

typedef struct mcase {
    bool llama;
    int tp;
    bool sp;
    int pp, M;      /* pipeline stages (0 = 1) and micro-batches */
    const char *mp; /* NULL: "no" */
    bool fp8_head;  /* fp8: the recipe's fp8_embedding_and_head (the tied head in fp8) */
    int64_t B;      /* rows per data-parallel rank per micro-step */
    bool from_env;  /* the settings as ctrain launch passes them (CTRAIN_*), no plugin */
    int zero;       /* 1..3: DeepSpeed's zero_stage over dp (deepspeed_plugin, or --use_deepspeed) */
    const char *fsdp; /* an FSDP sharding_strategy over dp (fsdp_plugin) */
    bool dist_opt;  /* use_distributed_optimizer */
    int hybrid;     /* > 0: the engine's HYBRID over dp with shard groups of this many dp ranks */
    ct_shard_strategy want; /* the engine's strategy over dp (NO_SHARD: DDP) */
    double tol;      /* rms(got - want) / max(1, rms(want)) per tensor */
    double tol_elem; /* |got - want| / max(1, |want|) per element (tp_check.h's rel_err) */
} mcase;


static int64_t vocab(const mcase *c) { return c->llama ? LLAMA_W1.vocab_size : GPT_W1.vocab_size; }

/* the token file every rank reads alike: raw uint16 tokens of a fixed sequence */
static uint16_t tokens[8 * STEPS * K * T + 1];

static ct_dataset *dataset(const mcase *c)
{
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof tokens / sizeof *tokens; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (uint16_t)((x >> 8) % (uint32_t)vocab(c));
    }
    return ct_token_dataset_open_memory(tokens, sizeof tokens, "tokens",
                                        &(ct_token_dataset_config){.block_size = T, .format = CT_TOKENS_RAW_U16});
}

static ct_module *model_new(const mcase *c)
{
    ct_set_seed(7);
    return c->llama ? &ct_llama_new(&LLAMA_W1)->base : &ct_gpt_new(&GPT_W1)->base;
}

static ct_tensor *loss_of(const mcase *c, ct_module *m, ct_tensor *x, ct_tensor *y)
{
    return c->llama ? ct_llama_loss((ct_llama *)m, x, y) : ct_gpt_loss((ct_gpt *)m, x, y);
}

static int fail(int rank, const char *what)
{
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, ct_last_error());
    return 1;
}

/* The shard record of a parameter: which part of the full tensor it holds. */
static ct_status record_of(const mcase *c, ct_module *m, const char *name, ct_tensor *p, ct_tp_shard *s, int *parts)
{
    *parts = 1;
    if (c->llama) {
        const ct_tp_shard *r = ct_llama_tp_shard_of((ct_llama *)m, p);
        if (!r) return ct_error_set(CT_ERR_INVALID, "%s has no shard record", name);
        *s = *r;
    } else {
        const ct_gpt_tp_shard *r = ct_gpt_tp_shard_of((ct_gpt *)m, name, NULL);
        if (!r) return ct_error_set(CT_ERR_INVALID, "%s has no shard record", name);
        *s = r->shard;
        *parts = r->parts;
    }
    return CT_OK;
}

/* The full tensor from the tp ranks of data-parallel index 0 (world ranks 0 .. tp-1):
 * every rank's local tensor gathered, then per part the ranks' blocks in rank order,
 * cut to the full size (the vocabulary's padding dropped); a block held by `replicas`
 * consecutive ranks (the Llama's key/value heads at tp 4 over 2) taken once. */
static ct_tensor *full_of(ct_accelerator *acc, int tp, ct_tensor *local, const ct_tp_shard *s, int parts)
{
    ct_tensor *flat = ct_tensor_reshape(ct_tensor_contiguous(local), 2, (int64_t[]){1, ct_tensor_numel(local)});
    ct_tensor *all = ct_accelerator_gather(acc, flat);
    if (!all || s->dim < 0) return all ? ct_tensor_reshape(ct_tensor_narrow(all, 0, 0, 1), local->ndim, local->shape)
                                       : NULL;
    int64_t len = (s->end - s->start);
    ct_tensor *blocks[3];
    for (int j = 0; j < parts; j++) {
        ct_tensor *pieces[8];
        int np = 0, step = s->replicas > 1 ? s->replicas : 1;
        for (int r = 0; r < tp; r += step) {
            ct_tensor *row = ct_tensor_reshape(ct_tensor_narrow(all, 0, r, 1), local->ndim, local->shape);
            pieces[np++] = ct_tensor_narrow(row, s->dim, j * len, len);
        }
        blocks[j] = ct_tensor_narrow(ct_concat(np, pieces, s->dim), s->dim, 0, s->full);
    }
    return parts == 1 ? blocks[0] : ct_concat(parts, blocks, s->dim);
}

/* The reference: one process, a plain loop, batches of dp x B rows. */
static int reference(const mcase *c, int dp, ct_param_list *out, ct_module **mout, ct_tensor **fp8_scales)
{
    ct_module *m = model_new(c);
    ct_param_list pl;
    if (!m || ct_module_named_tensors(m, false, &pl)) return fail(0, "reference model");
    ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = LR, .weight_decay = 0.1});
    ct_dataset *ds = dataset(c);
    ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = dp * c->B, .no_prefetch = true});
    bool bf16 = c->mp && !strcmp(c->mp, "bf16"), fp8 = c->mp && !strcmp(c->mp, "fp8");
    /* fp8: delayed scaling over this process's own amaxes, new scales before each step */
    ct_fp8_state *f8 = fp8 ? ct_fp8_state_new(&(ct_fp8_recipe){.fp8_embedding_and_head = c->fp8_head}) : NULL;
    if (bf16) ct_autocast_set_default(CT_DTYPE_BF16);
    if (f8) ct_autocast_set_default_fp8(f8);
    ct_status st = opt && l && (f8 || !fp8) ? CT_OK : ct_last_status();
    ct_tensor *x, *y;
    for (int i = 0; i < STEPS * K && !st; i++) CT_FRAME {
            if (ct_loader_next(l, &x, &y) != CT_LOADER_BATCH) {
                st = ct_error_set(CT_ERR_INVALID, "reference: the loader ran out at micro-step %d", i);
                continue; /* leaves the frame */
            }
            ct_tensor *loss = loss_of(c, m, x, y);
            st = loss ? ct_backward(ct_mul_scalar(loss, 1.0 / K)) : ct_last_status();
            if (st || i % K != K - 1) continue;
            if (isnan(ct_clip_grad_norm(pl.n, pl.tensors, CLIP, 2.0))) st = ct_last_status();
            if (f8) ct_fp8_state_step(f8);
            if (!st) st = ct_optimizer_step(opt);
            ct_optimizer_zero_grad(opt);
            ct_autocast_clear_cache(); /* the bf16 copies of the old weights */
        }
    if (bf16 || fp8) ct_autocast_set_default(CT_DTYPE_F32);
    ct_tensor *meta[4];
    if (f8 && !st && !(st = ct_fp8_state_export(f8, meta))) *fp8_scales = meta[0];
    ct_fp8_state_free(f8);
    ct_loader_free(l);
    ct_dataset_free(ds);
    ct_optimizer_free(opt);
    *out = pl;
    *mout = m;
    return st ? fail(0, "reference training") : 0;
}

static int train_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir;
    const mcase *c = ctx;
    const int pp = c->pp > 1 ? c->pp : 1, dp = world / (c->tp * pp);
    setenv("CTRAIN_NUM_THREADS", "1", 1); /* 4 ranks on 2 cores */
    int rc = 0;
    CT_FRAME {
        ct_module *m = model_new(c);
        ct_param_list pl;
        if (!m || ct_module_named_tensors(m, false, &pl)) {
            rc = fail(rank, "model");
            continue; /* leaves the frame */
        }
        /* built over the full model before prepare, as every example does */
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = LR, .weight_decay = 0.1});
        ct_param_list_free(&pl);
        ct_dataset *ds = dataset(c);
        ct_loader *l = ct_loader_new(ds, &(ct_loader_config){.batch_size = c->B, .no_prefetch = true});
        ct_megatron_lm_plugin p = {.tp_degree = c->tp, .pp_degree = pp, .num_micro_batches = c->M,
                                   .sequence_parallelism = c->sp, .gradient_clipping = CLIP};
        if (c->from_env) {
            /* `ctrain launch --use_megatron_lm --megatron_lm_tp_degree 2
             *  --megatron_lm_gradient_clipping 0.5 --gradient_accumulation_steps 2` */
            char v[32];
            setenv("CTRAIN_USE_MEGATRON_LM", "1", 1);
            snprintf(v, sizeof v, "%d", c->tp), setenv("CTRAIN_MEGATRON_TP_DEGREE", v, 1);
            snprintf(v, sizeof v, "%d", pp), setenv("CTRAIN_MEGATRON_PP_DEGREE", v, 1);
            snprintf(v, sizeof v, "%d", c->M > 0 ? c->M : 1), setenv("CTRAIN_MEGATRON_NUM_MICRO_BATCHES", v, 1);
            setenv("CTRAIN_MEGATRON_SEQUENCE_PARALLELISM", c->sp ? "true" : "false", 1);
            snprintf(v, sizeof v, "%g", CLIP), setenv("CTRAIN_MEGATRON_GRADIENT_CLIPPING", v, 1);
            snprintf(v, sizeof v, "%d", K), setenv("CTRAIN_GRADIENT_ACCUMULATION_STEPS", v, 1);
            if (c->zero) { /* --use_deepspeed --zero_stage N --offload_optimizer_device cpu */
                setenv("CTRAIN_USE_DEEPSPEED", "1", 1);
                snprintf(v, sizeof v, "%d", c->zero), setenv("CTRAIN_ZERO_STAGE", v, 1);
                setenv("CTRAIN_OFFLOAD_OPTIMIZER_DEVICE", "cpu", 1);
            }
        }
        p.use_distributed_optimizer = c->dist_opt;
        const bool fp16 = c->mp && !strcmp(c->mp, "fp16");
        int overflows = 0;
        ct_deepspeed_plugin dsp = {.zero_stage = c->zero};
        /* one unit per decoder layer: each gathered for its forward and backward only */
        ct_fsdp_plugin fsdp = {.sharding_strategy = c->fsdp,
                               .auto_wrap_policy = "TRANSFORMER_BASED_WRAP",
                               .transformer_cls_names_to_wrap = c->llama ? "LlamaDecoderLayer" : "Block"};
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){
            .megatron_lm_plugin = c->from_env ? NULL : &p,
            .deepspeed_plugin = c->zero && !c->from_env ? &dsp : NULL,
            .fsdp_plugin = c->fsdp ? &fsdp : NULL,
            .shard = {.strategy = c->hybrid ? CT_SHARD_HYBRID : CT_SHARD_NO_SHARD, .shard_group_size = c->hybrid},
            .gradient_accumulation_steps = c->from_env ? 0 : K,
            .mixed_precision = c->mp,
            .fp8 = {.fp8_embedding_and_head = c->fp8_head},
            /* fp16: a scale at f16's edge, so that the first steps overflow in some ranks'
             * gradient slices only (without the agreement the ranks part ways: a desync) */
            .loss_scaler = {.init_scale = fp16 ? 1 << 20 : 0}});
        ct_status st = acc ? CT_OK : ct_last_status();
        if (!st && c->mp && !strcmp(c->mp, "fp8")) CT_FRAME { /* a forward of the full model first: fp8 slots */
                ct_tensor *x = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(c->B, T));
                if (!loss_of(c, m, x, x)) st = ct_last_status();
            }
        if (!st) st = ct_accelerator_prepare(acc, m, opt, l, NULL);
        /* the sharding engine over dp (2 ranks), or DDP: equal results either way, so
         * the strategy that ran is checked */
        const ct_shard *sh = acc ? ct_accelerator_shard(acc) : NULL;
        const int group = c->hybrid ? c->hybrid : dp;
        if (!st && (c->want ? !sh || ct_shard_stats_get(sh).strategy != c->want || ct_shard_stats_get(sh).shard_world != group
                            : sh != NULL))
            st = ct_error_set(CT_ERR_INVALID, "the engine over dp is %s (shard group %d), want %s",
                              sh ? ct_shard_strategy_name(ct_shard_stats_get(sh).strategy) : "absent",
                              sh ? ct_shard_stats_get(sh).shard_world : 0, ct_shard_strategy_name(c->want));
        if (!st && c->from_env && c->zero && !ct_shard_stats_get(sh).memory.master)
            st = ct_error_set(CT_ERR_INVALID, "the optimizer is not offloaded: no master slices");
        if (!st && c->fsdp && ct_shard_stats_get(sh).units < 4 / pp + 1) /* the (stage's) layers and the rest */
            st = ct_error_set(CT_ERR_INVALID, "%d units: the layers are not wrapped", ct_shard_stats_get(sh).units);
        /* the user's loop, unchanged */
        ct_tensor *x, *y;
        for (int i = 0; i < STEPS * K && !st; i++) CT_FRAME {
                if (ct_loader_next(l, &x, &y) != CT_LOADER_BATCH) {
                    st = ct_error_set(CT_ERR_INVALID, "the prepared loader ran out at micro-step %d", i);
                    continue; /* leaves the frame */
                }
                CT_ACCUMULATE(acc) {
                    ct_tensor *loss = loss_of(c, m, x, y);
                    st = loss ? ct_accelerator_backward(acc, loss) : ct_last_status();
                    if (!st) st = ct_optimizer_step(opt);
                    ct_optimizer_zero_grad(opt);
                    overflows += ct_accelerator_sync_gradients(acc) && ct_accelerator_step_overflowed(acc);
                }
            }
        if (st) rc = fail(rank, "training");
        if (!rc && fp16) {
            /* every rank skipped the same steps and holds the same scale: the overflow
             * check is agreed over the world, though each rank sees only its slices */
            ct_tensor *mine = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1, 2),
                                                  (double[]){overflows, ct_accelerator_loss_scale(acc)});
            ct_tensor *all = mine ? ct_accelerator_gather(acc, mine) : NULL;
            const double *v = all ? ct_tensor_data(all) : NULL;
            for (int r = 0; v && r < world && !rc; r++)
                if (v[2 * r] != v[0] || v[2 * r + 1] != v[1]) {
                    fprintf(stderr, "rank %d: %g overflows, scale %g; rank 0: %g, %g\n", r, v[2 * r], v[2 * r + 1],
                            v[0], v[1]);
                    rc = 1;
                }
            if (v && rank == 0 && getenv("CT_DEBUG_REPORTS")) fprintf(stderr, "%g overflows, scale %g\n", v[0], v[1]);
            if (!v) rc = fail(rank, "gather");
            else if (!rc && (v[0] < 1 || v[0] > STEPS - 1)) {
                fprintf(stderr, "rank %d: %g of %d steps overflowed; want some, not all\n", rank, v[0], STEPS);
                rc = 1;
            }
        }
        /* evaluation through the same loss call (no_grad: a forward-only pass under a
         * pipeline), on one fixed batch every rank passes */
        double eval_loss = NAN;
        ct_tensor *ex = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, T), (int64_t[2 * T]){0});
        ct_tensor *ey = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, T), (int64_t[2 * T]){0});
        for (int64_t i = 0; ex && ey && i < 2 * T; i++)
            ((int64_t *)ct_tensor_data(ex))[i] = tokens[i], ((int64_t *)ct_tensor_data(ey))[i] = tokens[i + 1];
        if (!rc) CT_NO_GRAD {
                ct_tensor *el = loss_of(c, m, ex, ey);
                if (el) eval_loss = ct_tensor_item(el);
                else rc = fail(rank, "evaluation");
            }
        /* every rank gathers; rank 0 compares */
        ct_param_list got = {0}, want = {0};
        ct_module *ref = NULL;
        if (!rc && ct_module_named_tensors(m, false, &got)) rc = fail(rank, "parameters");
        ct_tensor **full = calloc((size_t)got.n + 1, sizeof *full);
        /* a pipeline: the stages hold different parameters, so the model is compared
         * whole as get_state_dict gathers it (against the independent reference); so are
         * the engine's 16-bit parameters (copies of its f32 masters, which only the
         * library's gather returns) */
        const bool low = c->want && c->mp;
        for (int i = 0; i < got.n && !rc && !low && pp == 1; i++) {
            ct_tp_shard s = {.dim = -1};
            int parts = 1;
            if (record_of(c, m, got.names[i], got.tensors[i], &s, &parts) ||
                !(full[i] = full_of(acc, c->tp, got.tensors[i], &s, parts)))
                rc = fail(rank, got.names[i]);
        }
        /* the Accelerator's whole model (get_state_dict, unwrap_model: gathered by the
         * library) holds exactly the tensors put together here from the shard records */
        ct_state_dict sd = {0};
        if (!rc && ct_accelerator_get_state_dict(acc, m, &sd)) rc = fail(rank, "get_state_dict");
        for (int i = 0; i < got.n && i < sd.n && !rc && low; i++)
            if (!(full[i] = ct_tensor_clone(sd.tensors[i]))) rc = fail(rank, sd.names[i]);
        for (int i = 0; i < got.n && !rc; i++) {
            if (i >= sd.n || strcmp(sd.names[i], got.names[i])) rc = fail(rank, "get_state_dict: names");
            else if (pp > 1) full[i] = sd.tensors[i];
            else if (rel_err(sd.tensors[i], full[i]) != 0) rc = fail(rank, sd.names[i]);
        }
        int64_t whole_n = 0;
        for (int i = 0; i < got.n && !rc; i++) whole_n += ct_tensor_numel(full[i]);
        ct_module *whole = rc ? NULL : ct_accelerator_unwrap_model(acc, m);
        if (!rc && (!whole || whole == m || ct_module_num_params(whole) != whole_n)) rc = fail(rank, "unwrap_model");
        /* fp8: every rank quantises each weight with the same scales (the amaxes of the
         * whole weight, all-reduced), bitwise */
        ct_tensor *scales = NULL, *ref_scales = NULL, *meta[4];
        if (!rc && c->mp && !strcmp(c->mp, "fp8")) {
            ct_fp8_state *f8 = ct_autocast_fp8_state();
            ct_tensor *all = NULL;
            if (!f8 || ct_fp8_state_export(f8, meta)) rc = fail(rank, "fp8 state");
            /* (a pipeline's stages hold their own layers' weights: rank 0's are the first rows) */
            else if (pp == 1 &&
                     !(all = ct_accelerator_gather(acc, ct_tensor_reshape(meta[0], 2, (int64_t[]){1, ct_tensor_numel(meta[0])}))))
                rc = fail(rank, "gathering the fp8 scales");
            for (int r = 1; all && r < world && !rc; r++)
                if (rel_err(ct_tensor_narrow(all, 0, r, 1), ct_tensor_narrow(all, 0, 0, 1)) != 0) {
                    fprintf(stderr, "rank %d: the fp8 scales of rank %d differ from rank 0's\n", rank, r);
                    rc = 1;
                }
            scales = rc ? NULL : meta[0];
        }
        ct_accelerator_free(acc);
        if (!rc && rank == 0) rc = reference(c, dp, &want, &ref, &ref_scales);
        /* the weights' scales near the single process's: a weight's amax is the largest
         * over its shards, that of the whole weight, which the two runs' parameters
         * (close, see below) share up to their drift. (The inputs' and the output
         * gradients' amaxes differ more: maxima of activations, and under DDP or a
         * replicated key/value head partial gradients, each quantised on its own.) */
        if (!rc && rank == 0 && scales) {
            bool same = ref_scales && (pp > 1 ? scales->shape[0] > 0 && scales->shape[0] < ref_scales->shape[0]
                                                : ct_tensor_same_shape(scales, ref_scales));
            const float *a = same ? ct_tensor_data(ct_tensor_contiguous(scales)) : NULL;
            const float *b = same ? ct_tensor_data(ct_tensor_contiguous(ref_scales)) : NULL;
            double e = same ? 0 : INFINITY;
            for (int64_t k = 1; same && k < ct_tensor_numel(scales); k += 3) {
                double d = fabs(a[k] - b[k]) / b[k];
                if (!(d <= e)) e = d;
            }
            if (getenv("CT_DEBUG_REPORTS")) fprintf(stderr, "fp8 weight scales: largest relative difference %g\n", e);
            if (!(e <= 5e-2)) {
                fprintf(stderr, "fp8 weight scales against the single process's: relative error %g > 5e-2\n", e);
                rc = 1;
            }
        }
        if (!rc && rank == 0) CT_NO_GRAD {
                ct_tensor *el = loss_of(c, ref, ex, ey);
                double e_want = el ? ct_tensor_item(el) : NAN;
                if (!(fabs(eval_loss - e_want) <= 10 * c->tol * fabs(e_want))) {
                    fprintf(stderr, "evaluation loss %.9g, one process %.9g\n", eval_loss, e_want);
                    rc = 1;
                }
            }
        double worst = 0, worst_elem = 0;
        for (int i = 0; i < got.n && !rc && rank == 0; i++) {
            bool same = i < want.n && !strcmp(want.names[i], got.names[i]);
            double e = same ? rel_rms(full[i], want.tensors[i]) : INFINITY;
            double ee = same ? rel_err(full[i], want.tensors[i]) : INFINITY;
            worst = fmax(worst, e), worst_elem = fmax(worst_elem, ee);
            if (!(e <= c->tol) || !(ee <= c->tol_elem)) {
                fprintf(stderr, "%s after %d steps: relative error %g (tolerance %g), per element %g (%g)\n",
                        got.names[i], STEPS, e, c->tol, ee, c->tol_elem);
                if (getenv("CT_DEBUG_REPORTS")) {
                    ct_tensor *a = ct_tensor_contiguous(full[i]), *b = ct_tensor_contiguous(want.tensors[i]);
                    const float *pa = ct_tensor_data(a), *pb = ct_tensor_data(b);
                    int64_t n = ct_tensor_numel(a), bad = 0;
                    for (int64_t k = 0; k < n; k++)
                        if (fabs(pa[k] - pb[k]) > 1e-5 && bad++ < 6)
                            fprintf(stderr, "  [%lld] got %.9g want %.9g\n", (long long)k, pa[k], pb[k]);
                    fprintf(stderr, "  %lld of %lld elements off\n", (long long)bad, (long long)n);
                }
                rc = 1;
            }
        }
        if (getenv("CT_DEBUG_REPORTS") && rank == 0) fprintf(stderr, "worst relative error %g, per element %g\n", worst, worst_elem);
        ct_state_dict_free(&sd);
        free(full);
        ct_param_list_free(&got);
        ct_param_list_free(&want);
        ct_module_free(ref);
        ct_optimizer_free(opt);
        ct_loader_free(l);
        ct_dataset_free(ds);
        ct_module_free(m);
    }
    return rc;
}

static void run(int world, mcase c)
{
    run_env_ranks(world, train_rank, NULL, &c, 170);
}

TestSuite(megatron);

Test(megatron, gpt_w1_tp2_trains_as_one_process, .timeout = 180)
{
    run(2, (mcase){.tp = 2, .B = 4, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_tp2_dp2_sequence_parallel_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .sp = true, .B = 2, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, llama_w1_tp2_sequence_parallel_trains_as_one_process, .timeout = 180)
{
    run(2, (mcase){.llama = true, .tp = 2, .sp = true, .B = 4, .tol = 1e-5, .tol_elem = 1e-4});
}

/* tp 4 over the 2 key/value heads: each replicated on 2 ranks, its gradient summed over them */
Test(megatron, llama_w1_tp4_replicated_kv_heads_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .tp = 4, .B = 4, .tol = 1e-5, .tol_elem = 1e-4});
}

/* the settings from the launcher's variables, as each rank of `ctrain launch` gets them */
Test(megatron, llama_w1_tp2_dp2_from_the_launchers_variables_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .tp = 2, .B = 2, .from_env = true, .tol = 1e-5, .tol_elem = 1e-4});
}

/* bf16 autocast: the sharded model tracks the bf16 single process (rounding differs
 * with the summation order; a wrong slice or a missing sync is off by lr per step) */
Test(megatron, gpt_w1_tp2_bf16_tracks_the_bf16_single_process, .timeout = 180)
{
    run(2, (mcase){.tp = 2, .sp = true, .mp = "bf16", .B = 2, .tol = 5e-3, .tol_elem = 3e-2});
}

/* ---- pipeline parallelism (accel/megatron_pp.c): the loop unchanged ------------- */

Test(megatron, gpt_w1_pp2_trains_as_one_process, .timeout = 180)
{
    run(2, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 4, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_pp2_dp2_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_tp2_pp2_sequence_parallel_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 2, .sp = true, .B = 4, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, llama_w1_pp2_dp2_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .pp = 2, .M = 2, .tp = 1, .B = 2, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, llama_w1_tp2_pp2_from_the_launchers_variables_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .pp = 2, .M = 2, .tp = 2, .sp = true, .B = 4, .from_env = true, .tol = 1e-5,
                   .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_pp2_bf16_tracks_the_bf16_single_process, .timeout = 180)
{
    run(2, (mcase){.pp = 2, .M = 2, .tp = 1, .mp = "bf16", .B = 2, .tol = 5e-3, .tol_elem = 3e-2});
}

Test(megatron, llama_w1_tp2_pp2_bf16_tracks_the_bf16_single_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .pp = 2, .M = 2, .tp = 2, .mp = "bf16", .B = 2, .tol = 5e-3, .tol_elem = 3e-2});
}

/* fp8: every weight's amaxes are all-reduced (MAX) over the world, so the shards of a
 * weight quantise with the whole weight's scale, as the single process does; what
 * differs is the summation order before a rounding to 3 or 2 mantissa bits. At tp 2
 * with the tied head in fp8 too, and at tp 2 x dp 2 with the head in bf16. */
Test(megatron, gpt_w1_tp2_fp8_tracks_the_fp8_single_process, .timeout = 180)
{
    run(2, (mcase){.tp = 2, .mp = "fp8", .fp8_head = true, .B = 4, .tol = 5e-3, .tol_elem = 3e-2});
}

Test(megatron, gpt_w1_tp2_dp2_fp8_tracks_the_fp8_single_process, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .mp = "fp8", .B = 2, .tol = 5e-3, .tol_elem = 3e-2});
}

/* the Llama's untied head (fp8 too) and replicated key/value heads under sequence parallelism */
Test(megatron, llama_w1_tp4_sequence_parallel_fp8_tracks_the_fp8_single_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .tp = 4, .sp = true, .mp = "fp8", .fp8_head = true, .B = 4, .tol = 5e-3,
                   .tol_elem = 3e-2});
}

/* fp8 under a pipeline: each stage's amaxes all-reduced over the stage's ranks */
Test(megatron, gpt_w1_pp2_fp8_tracks_the_fp8_single_process, .timeout = 180)
{
    run(2, (mcase){.pp = 2, .M = 2, .tp = 1, .mp = "fp8", .fp8_head = true, .B = 4, .tol = 5e-3, .tol_elem = 3e-2});
}

Test(megatron, llama_w1_tp2_pp2_fp8_tracks_the_fp8_single_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .pp = 2, .M = 2, .tp = 2, .sp = true, .mp = "fp8", .fp8_head = true, .B = 4,
                   .tol = 5e-3, .tol_elem = 3e-2});
}

/* ---- the sharding engine over dp (accel/megatron_zero.c) --------------------------- *
 * tp 2 x dp 2, the engine's shard group the two dp ranks: reductions, the slices' tp
 * sync (sequence parallelism), the norm over every axis and accumulation must give the
 * one-process run's parameters. A missing tp sync, a replicated slice counted twice in
 * the norm or a wrong reduction moves whole tensors by about lr per step. */

Test(megatron, gpt_w1_tp2_dp2_sequence_parallel_zero1_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .sp = true, .B = 2, .zero = 1, .want = CT_SHARD_OPTIMIZER, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_tp2_dp2_zero2_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .B = 2, .zero = 2, .want = CT_SHARD_GRAD_OP, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_tp2_dp2_sequence_parallel_zero3_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .sp = true, .B = 2, .zero = 3, .want = CT_SHARD_FULL, .tol = 1e-5, .tol_elem = 1e-4});
}

/* bf16: the engine's 16-bit parameters beside f32 masters track the bf16 single process
 * (autocast over f32 parameters: the rounding differs, a wrong slice does not) */
Test(megatron, gpt_w1_tp2_dp2_sequence_parallel_zero2_bf16_tracks_the_bf16_single_process, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .sp = true, .mp = "bf16", .B = 2, .zero = 2, .want = CT_SHARD_GRAD_OP, .tol = 5e-3,
                   .tol_elem = 3e-2});
}

/* tp 2 x dp 4, HYBRID: sharded over pairs of dp ranks, the pairs replicas of each other
 * (the norm counts the first pair's slices only) */
Test(megatron, gpt_w1_tp2_dp4_sequence_parallel_hybrid_trains_as_one_process, .timeout = 180)
{
    run(8, (mcase){.tp = 2, .sp = true, .B = 2, .hybrid = 2, .want = CT_SHARD_HYBRID, .tol = 1e-5, .tol_elem = 1e-4});
}

/* fp16 (16-bit parameters and gradient slices), the loss scale at 2^20: the first steps
 * overflow in some ranks' slices only, and every rank must skip them alike (3 of 5,
 * measured). The parameters stay near the f32 run's (the skipped steps lag it by about
 * lr each) */
Test(megatron, gpt_w1_tp2_dp2_zero2_fp16_ranks_skip_the_same_steps, .timeout = 180)
{
    run(4, (mcase){.tp = 2, .B = 2, .mp = "fp16", .zero = 2, .want = CT_SHARD_GRAD_OP, .tol = 1e-2, .tol_elem = 1e-1});
}

/* Megatron's distributed optimizer: ZeRO-1 over dp */
Test(megatron, llama_w1_tp2_dp2_distributed_optimizer_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .tp = 2, .B = 2, .dist_opt = true, .want = CT_SHARD_OPTIMIZER, .tol = 1e-5,
                   .tol_elem = 1e-4});
}

/* `ctrain launch --num_processes 4 --use_megatron_lm --megatron_lm_tp_degree 2
 *  --megatron_lm_sequence_parallelism true --use_deepspeed --zero_stage 2
 *  --offload_optimizer_device cpu` (the optimizer steps f32 master slices apart) */
Test(megatron, llama_w1_tp2_dp2_sequence_parallel_zero2_offload_from_the_launchers_variables_trains_as_one_process,
     .timeout = 180)
{
    run(4, (mcase){.llama = true, .tp = 2, .sp = true, .B = 2, .from_env = true, .zero = 2, .want = CT_SHARD_GRAD_OP,
                   .tol = 1e-5, .tol_elem = 1e-4});
}

/* FSDP FULL_SHARD wrapping each decoder layer */
Test(megatron, llama_w1_tp2_dp2_sequence_parallel_fsdp_full_shard_per_layer_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .tp = 2, .sp = true, .B = 2, .fsdp = "FULL_SHARD", .want = CT_SHARD_FULL,
                   .tol = 1e-5, .tol_elem = 1e-4});
}

/* ---- bad layouts fail on every rank, naming the numbers -------------------------- */

typedef struct bad_case {
    const char *what;
    int tp, pp;
    int kind; /* 0: GPT with 3 heads, 1: a Linear layer, 2: the W1 GPT */
    const char *want;
    bool at_new; /* refused by ct_accelerator_new, else by prepare */
} bad_case;

static int bad_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir, (void)world;
    const bad_case *b = ctx;
    int rc = 0;
    CT_FRAME {
        ct_megatron_lm_plugin p = {.tp_degree = b->tp, .pp_degree = b->pp};
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.megatron_lm_plugin = &p});
        if (b->at_new) {
            if (acc || !strstr(ct_last_error(), b->want)) {
                fprintf(stderr, "rank %d, %s: %s; want an error naming '%s'\n", rank, b->what,
                        acc ? "accepted" : ct_last_error(), b->want);
                rc = 1;
            }
            ct_accelerator_free(acc);
            continue; /* leaves the frame */
        }
        if (!acc) {
            rc = fail(rank, b->what);
            continue; /* leaves the frame */
        }
        ct_set_seed(3);
        ct_module *m = b->kind == 0   ? &ct_gpt_new(&(ct_gpt_config){.vocab_size = 32, .block_size = 8, .n_layer = 1,
                                                                     .n_head = 3, .n_embd = 24})->base
                       : b->kind == 1 ? &ct_linear_layer_new(4, 4, true, 0.02)->base
                                      : &ct_gpt_new(&GPT_W1)->base;
        ct_status st = ct_accelerator_prepare(acc, m, NULL, NULL, NULL);
        if (!st || !strstr(ct_last_error(), b->want)) {
            fprintf(stderr, "rank %d, %s: %s; want an error naming '%s'\n", rank, b->what,
                    st ? ct_last_error() : "accepted", b->want);
            rc = 1;
        }
        ct_accelerator_free(acc);
        ct_module_free(m);
    }
    return rc;
}

Test(megatron, bad_layouts_fail_on_every_rank_naming_the_numbers, .timeout = 60)
{
    bad_case world3 = {"world 3, tp 2", 2, 1, 2, "world size 3 is not divisible by tp_degree 2 x pp_degree 1 = 2",
                       true};
    run_env_ranks(3, bad_rank, NULL, &world3, 50);
    bad_case heads = {"3 heads over tp 2", 2, 1, 0, "tp 2 does not divide n_head 3", false};
    run_env_ranks(2, bad_rank, NULL, &heads, 50);
    bad_case linear = {"a Linear", 2, 1, 1, "a model of type 'Linear' is not supported; supported: GPT", false};
    run_env_ranks(2, bad_rank, NULL, &linear, 50);
    bad_case pp = {"pp 2 over 1 layer", 1, 2, 0, "pp 2 is larger than the layer count 1", false};
    run_env_ranks(2, bad_rank, NULL, &pp, 50);
}

/* use_distributed_optimizer with tp 1 is ZeRO-1 over every rank (at tp 2 x dp 2 it
 * trains as one process: zero_trains_as_one_process below) */
/* 0 when FSDP's SHARDED_STATE_DICT beside Megatron-LM at tp x pp is refused by
 * ct_accelerator_new with an error naming want; else 1, said on stderr. */
static int sharded_state_dict_refused(int rank, int tp, int pp, const char *want)
{
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){
        .megatron_lm_plugin = &(ct_megatron_lm_plugin){.tp_degree = tp, .pp_degree = pp},
        .fsdp_plugin = &(ct_fsdp_plugin){.state_dict_type = "SHARDED_STATE_DICT"}});
    int rc = 0;
    if (acc || !strstr(ct_last_error(), want)) {
        fprintf(stderr, "rank %d: %s; want an error naming '%s'\n", rank, acc ? "accepted" : ct_last_error(), want);
        rc = 1;
    }
    ct_accelerator_free(acc);
    return rc;
}

static int dist_opt_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir, (void)ctx, (void)world;
    int rc = 0;
    CT_FRAME {
        ct_megatron_lm_plugin p = {.tp_degree = 1, .use_distributed_optimizer = true};
        ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){.megatron_lm_plugin = &p});
        ct_set_seed(3);
        ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 32, .block_size = 8, .n_layer = 1, .n_head = 2,
                                                .n_embd = 16});
        ct_param_list pl;
        ct_module_named_tensors(&m->base, false, &pl);
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, NULL);
        ct_param_list_free(&pl);
        if (!acc || ct_accelerator_prepare(acc, &m->base, opt, NULL, NULL)) rc = fail(rank, "tp 1, distributed optimizer");
        else if (!ct_accelerator_shard(acc) ||
                 ct_shard_stats_get(ct_accelerator_shard(acc)).strategy != CT_SHARD_OPTIMIZER) {
            fprintf(stderr, "rank %d: tp 1 with use_distributed_optimizer is not ZeRO-1\n", rank);
            rc = 1;
        }
        ct_accelerator_free(acc);
        ct_optimizer_free(opt);
        ct_module_free(&m->base);
        /* SHARDED_STATE_DICT under tensor parallelism is refused: checkpoints hold the whole model */
        rc |= sharded_state_dict_refused(rank, 2, 1, "tp_degree 2, pp_degree 1) with fsdp_plugin's SHARDED_STATE_DICT "
                                                     "is not supported");
    }
    return rc;
}

Test(megatron, the_distributed_optimizer_at_tp1_is_zero1_and_sharded_state_dicts_are_refused_at_tp2, .timeout = 60)
{
    run_env_ranks(2, dist_opt_rank, NULL, NULL, 50);
}

/* Checkpoints of a pipeline hold the whole model: FSDP's SHARDED_STATE_DICT is refused
 * on every rank, naming the combination. */
static int pp_sharded_state_rank(int rank, int world, const char *dir, void *ctx)
{
    (void)dir, (void)ctx, (void)world;
    return sharded_state_dict_refused(rank, 1, 2, "pp_degree 2) with fsdp_plugin's SHARDED_STATE_DICT is not supported");
}

Test(megatron, sharded_state_dicts_of_a_pipeline_are_refused, .timeout = 60)
{
    run_env_ranks(4, pp_sharded_state_rank, NULL, NULL, 50);
}

/* ZeRO-2, ZeRO-3, HYBRID and FSDP over the dp axis of a pipeline: the micro-batches
 * accumulate full gradients (engine synchronisation off), reduced once per step after
 * the tied and tp sums; ZeRO-3 gathers each unit for every micro-batch */
Test(megatron, gpt_w1_pp2_dp2_zero2_and_zero3_train_as_one_process, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .zero = 2, .want = CT_SHARD_GRAD_OP, .tol = 1e-5,
                   .tol_elem = 1e-4});
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .zero = 3, .want = CT_SHARD_FULL, .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_pp2_dp4_hybrid_trains_as_one_process, .timeout = 180)
{
    run(8, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .hybrid = 2, .want = CT_SHARD_HYBRID, .tol = 1e-5,
                   .tol_elem = 1e-4});
}

Test(megatron, llama_w1_tp2_pp2_dp2_sequence_parallel_zero3_trains_as_one_process, .timeout = 180)
{
    run(8, (mcase){.llama = true, .pp = 2, .M = 2, .tp = 2, .sp = true, .B = 2, .zero = 3, .want = CT_SHARD_FULL,
                   .tol = 1e-5, .tol_elem = 1e-4});
}

Test(megatron, gpt_w1_pp2_dp2_fsdp_full_shard_bf16_tracks_the_bf16_single_process, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .fsdp = "FULL_SHARD", .want = CT_SHARD_FULL, .mp = "bf16",
                   .tol = 5e-3, .tol_elem = 3e-2});
}

/* ZeRO-1 over the dp axis of a pipeline (accel/megatron_zero.c): each stage's engine
 * shards its own parameters over its dp ranks, reducing once per step */
Test(megatron, gpt_w1_pp2_dp2_distributed_optimizer_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .dist_opt = true, .want = CT_SHARD_OPTIMIZER, .tol = 1e-5,
                   .tol_elem = 1e-4});
}

/* every axis at once: tp 2 x pp 2 x dp 2, sequence parallel (the tied embedding's
 * vocabulary shards counted once over the stages, on every tp rank) */
Test(megatron, gpt_w1_tp2_pp2_dp2_sequence_parallel_distributed_optimizer_trains_as_one_process, .timeout = 180)
{
    run(8, (mcase){.pp = 2, .M = 2, .tp = 2, .sp = true, .B = 2, .dist_opt = true,
                   .want = CT_SHARD_OPTIMIZER, .tol = 1e-5, .tol_elem = 1e-4});
}

/* bf16: the engine's 16-bit parameters (f32 master slices) run through the stages */
Test(megatron, gpt_w1_pp2_dp2_distributed_optimizer_bf16_tracks_the_bf16_single_process, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .mp = "bf16", .dist_opt = true, .want = CT_SHARD_OPTIMIZER, .tol = 5e-3,
                   .tol_elem = 3e-2});
}

/* fp16: each rank sees its slices only; the overflow check is agreed over the world */
Test(megatron, gpt_w1_pp2_dp2_zero1_fp16_ranks_skip_the_same_steps, .timeout = 180)
{
    run(4, (mcase){.pp = 2, .M = 2, .tp = 1, .B = 2, .mp = "fp16", .zero = 1, .want = CT_SHARD_OPTIMIZER, .tol = 1e-2,
                   .tol_elem = 1e-1});
}

Test(megatron, llama_w1_pp2_dp2_zero1_offload_from_the_launchers_variables_trains_as_one_process, .timeout = 180)
{
    run(4, (mcase){.llama = true, .pp = 2, .M = 2, .tp = 1, .B = 2, .from_env = true, .zero = 1,
                   .want = CT_SHARD_OPTIMIZER, .tol = 1e-5, .tol_elem = 1e-4});
}
