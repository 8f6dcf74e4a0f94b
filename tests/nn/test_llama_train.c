/* The Llama model (nn/llama.c) trained through the Accelerator: the sharded strategies
 * (ZeRO-1, ZeRO-2, FULL_SHARD wrapped per LlamaDecoderLayer, HYBRID) on 2 fork()ed ranks
 * end where DDP ends after the same AdamW steps on the same batches, tied head or not.
 * The model needs nothing of its own for that: it is a module tree like the GPT. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "autograd/autograd.h"
#include "core/frame.h"
#include "core/philox.h"
#include "nn/llama.h"
#include "optim/optimizer.h"
#include "tests/env_ranks.h"
#include "tests/rank_files.h"
#include "tests/tmpdir.h"

#define STEPS 3
#define ROWS 2
#define SEQ 6

static const ct_llama_config model = {.vocab_size = 29, .hidden_size = 16, .intermediate_size = 24,
                                      .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                                      .max_position_embeddings = 16};

typedef struct train_case {
    const char *name;
    ct_shard_strategy strategy;
    bool tied;
} train_case;

static int train_rank(int rank, int world, const char *dir, void *ctx)
{
    const train_case *c = ctx;
    int rc = 0;
    CT_FRAME {
        ct_llama_config mc = model;
        mc.tie_word_embeddings = c->tied;
        ct_set_seed(3 + (uint64_t)rank); /* different weights per rank: prepare broadcasts rank 0's */
        ct_llama *m = ct_llama_new(&mc);
        ct_param_list pl = {0};
        ct_module_named_tensors(&m->base, false, &pl);
        ct_optimizer *opt = ct_adamw_new(pl.n, pl.tensors, &(ct_adamw_config){.lr = 1e-2, .weight_decay = 0.1});
        static const char *const layer[] = {"LlamaDecoderLayer"};
        ct_accelerator_config ac = {.mixed_precision = "no",
                                    .shard = {.strategy = c->strategy,
                                              .wrap = {.policy = CT_WRAP_TRANSFORMER, .classes = layer, .nclasses = 1},
                                              .shard_group_size = 1}};
        ct_accelerator *acc = ct_accelerator_new(&ac);
        ct_status st = acc ? ct_accelerator_prepare(acc, &m->base, opt, NULL, NULL) : ct_last_status();
        for (int s = 0; s < STEPS && !st; s++) CT_FRAME {
                /* one global batch per step, rows split over the ranks */
                ct_rng g;
                ct_rng_init(&g, 100 + (uint64_t)s);
                float u[2 * ROWS * (SEQ + 1)];
                ct_rng_uniform_f32(&g, u, world * ROWS * (SEQ + 1), 0, (float)model.vocab_size);
                int64_t ids[ROWS * (SEQ + 1)];
                for (int i = 0; i < ROWS * (SEQ + 1); i++) ids[i] = (int64_t)u[rank * ROWS * (SEQ + 1) + i] % 29;
                ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(ROWS, SEQ + 1), ids);
                ct_tensor *x = ct_tensor_contiguous(ct_tensor_narrow(t, 1, 0, SEQ));
                ct_tensor *y = ct_tensor_contiguous(ct_tensor_narrow(t, 1, 1, SEQ));
                ct_tensor *l = ct_llama_loss(m, x, y);
                st = l ? ct_accelerator_backward(acc, l) : ct_last_status();
                if (!st) st = ct_optimizer_step(opt);
                ct_optimizer_zero_grad(opt);
            }
        if (st) {
            fprintf(stderr, "rank %d (%s): %s\n", rank, c->name, ct_last_error());
            rc = 1;
        }
        ct_accelerator_free(acc); /* gathers the parameters back into the model */
        if (!rc && rank == 0) {
            int64_t n = ct_module_num_params(&m->base), at = 0;
            float *p = malloc((size_t)n * sizeof *p);
            for (int i = 0; i < pl.n; i++) {
                memcpy(p + at, ct_tensor_data(pl.tensors[i]), ct_tensor_nbytes(pl.tensors[i]));
                at += ct_tensor_numel(pl.tensors[i]);
            }
            write_file(dir, c->name, "params", p, (size_t)n * sizeof *p);
            free(p);
        }
        ct_optimizer_free(opt);
        ct_param_list_free(&pl);
        ct_module_free(&m->base);
    }
    return rc;
}

static void strategies_match_ddp(bool tied)
{
    make_tmpdir_with("/tmp/ct_llama_train_");
    train_case ref = {"ddp", CT_SHARD_NO_SHARD, tied};
    run_env_ranks(2, train_rank, tmpdir, &ref, 120);
    static const ct_shard_strategy sharded[] = {CT_SHARD_OPTIMIZER, CT_SHARD_GRAD_OP, CT_SHARD_FULL, CT_SHARD_HYBRID};
    for (int i = 0; i < 4; i++) {
        train_case c = {ct_shard_strategy_name(sharded[i]), sharded[i], tied};
        run_env_ranks(2, train_rank, tmpdir, &c, 120);
        double mx, d = rel_diff(c.name, "ddp", &mx);
        cr_assert_leq(d, 1e-5, "%s (tied %d): parameters differ by %g relative", c.name, tied, d);
        cr_assert_leq(mx, 1e-4, "%s (tied %d): a parameter differs by %g", c.name, tied, mx);
    }
    remove_tmpdir();
}

Test(llama_train, sharded_strategies_match_ddp_untied, .timeout = 240) { strategies_match_ddp(false); }
Test(llama_train, sharded_strategies_match_ddp_tied, .timeout = 240) { strategies_match_ddp(true); }
