/* Tests for parallel/pipeline_model.c, pipeline_gpt.c and pipeline_llama.c on fork()ed
 * ranks. The reference is one process training the whole model the ordinary way
 * (ct_gpt_loss / ct_llama_loss on the M micro-batches, each loss / M, ct_backward,
 * ct_clip_grad_norm over every parameter, AdamW), run in a process of its own first,
 * its numbers left in shared memory. Each pipeline rank builds the same model from the
 * same seed, trains its stage on the same batches and checks against it: the loss of
 * every step on every rank, the gradients of the first step (the tied embedding's two
 * copies summed), the global gradient norm the clipping used, and every parameter of
 * its stage after 5 AdamW steps with clipping active (1e-5 relative, in norm, per
 * tensor). Cases: the GPT at pp=2 (GPipe M=1, 1F1B M=4), at pp=4 with 2-step gradient
 * accumulation, and in bf16 (autocast, against the single process in bf16); the Llama
 * at pp=2 (untied, GPipe) and pp=4 (tied, 1F1B); tensor parallelism inside the stages
 * (tp 2 x pp 2 on 4 ranks: the GPT with and without sequence parallelism and with
 * accumulation, the tied Llama with it), each rank's shards against the test's own
 * slices of the single process's tensors. Errors: more stages than layers, a
 * batch not divisible into M micro-batches and a sequence past block_size name the
 * numbers. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/storage.h"
#include "core/threads.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_model.h"
#include "precision/autocast.h"
#include "tests/dist/ranks.h"
#include "tests/nn/tp_check.h"

#define STEPS 5
#define MAXACC 2
#define B 8  /* rows of a GPT batch; the Llama's (its vocabulary is 8 times larger) take B / 2 */
#define T 32
#define LR 3e-3
#define MAXN 0.5 /* below the models' gradient norms: clipping is active */
#define TOL 1e-5
#define MAX_FLOATS (8 << 20) /* room for either model's parameters */
#define TOL_BF16 2e-2 /* bf16 against bf16: other matmul shapes round differently */

typedef struct pcase {
    bool llama, tied; /* tied: the Llama's tie_word_embeddings (the GPT is always tied) */
    int pp, M, accum;
    ct_pipeline_kind kind;
    bool bf16;
    int tp;  /* > 1: tensor parallelism inside the stages (world tp x pp, parallel/mesh.h) */
    bool sp; /* with sequence parallelism */
} pcase;

/* What the single process leaves for the ranks (shared memory). */
typedef struct ref_run {
    double loss[STEPS * MAXACC], norm[STEPS];
    int64_t nfloat; /* parameters of the whole model */
    float *grad0;   /* the first step's gradients (accumulated, before clipping), flat in named order */
    float *final;   /* the parameters after STEPS steps */
} ref_run;

/* ---- the model and the data, the same in every process -------------------------------------- */

static ct_module *model_new(const pcase *k, int64_t *vocab)
{
    ct_set_seed(1234);
    if (k->llama) {
        ct_llama_config c = {.vocab_size = 2048, .hidden_size = 256, .intermediate_size = 688,
                             .num_hidden_layers = 4, .num_attention_heads = 4, .num_key_value_heads = 2,
                             .max_position_embeddings = 256, .tie_word_embeddings = k->tied};
        *vocab = c.vocab_size;
        ct_llama *m = ct_llama_new(&c);
        return m ? &m->base : NULL;
    }
    ct_gpt_config c = {.vocab_size = 256, .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256};
    *vocab = c.vocab_size;
    ct_gpt *m = ct_gpt_new(&c);
    return m ? &m->base : NULL;
}

static int64_t rows_of(const pcase *k) { return k->llama ? B / 2 : B; }

/* Batch `i` (rows, T): tokens and targets from a hash, so every process makes the same. */
static void batch_make(int i, int64_t rows, int64_t vocab, ct_tensor **x, ct_tensor **y)
{
    int64_t tx[B * T], ty[B * T];
    for (int n = 0; n < rows * T; n++) {
        uint64_t h = (uint64_t)(i * 7919 + n) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        tx[n] = (int64_t)(h % (uint64_t)vocab);
        ty[n] = (int64_t)((h >> 17) % (uint64_t)vocab);
    }
    *x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(rows, T), tx);
    *y = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(rows, T), ty);
}

static ct_optimizer *adamw(int n, ct_tensor *const *p)
{
    return ct_adamw_new(n, p, &(ct_adamw_config){.lr = LR, .weight_decay = 0.1});
}

/* ||got - want|| / ||want|| */
static double rel_norm(const float *got, const float *want, int64_t n)
{
    double d = 0, w = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        w += (double)want[i] * want[i];
    }
    return sqrt(d) / fmax(sqrt(w), 1e-30);
}

/* ---- the single process ------------------------------------------------------------------- */

static ct_tensor *whole_loss(const pcase *k, ct_module *m, ct_tensor *x, ct_tensor *y)
{
    return k->llama ? ct_llama_loss((ct_llama *)m, x, y) : ct_gpt_loss((ct_gpt *)m, x, y);
}

static int reference_rank(rank_ctx *c)
{
    ct_set_num_threads(1); /* the tests share the cores: OpenMP threads would wait on each other */
    const pcase *k = c->arg;
    ref_run *ref = (ref_run *)((char *)c->arg + sizeof(pcase));
    int64_t vocab;
    ct_module *m = model_new(k, &vocab);
    ct_param_list all = {0};
    if (!m || ct_module_named_tensors(m, false, &all) || ct_module_num_params(m) > ref->nfloat) {
        bool big = m && ct_module_num_params(m) > ref->nfloat;
        report(c, "model: %s", big ? "more parameters than the room for them" : ct_last_error());
        ct_param_list_free(&all);
        ct_module_free(m);
        return 1;
    }
    ct_optimizer *opt = adamw(all.n, all.tensors);
    int rc = 0;
    for (int s = 0; s < STEPS && !rc; s++) {
        ct_optimizer_zero_grad(opt);
        for (int a = 0; a < k->accum && !rc; a++) CT_FRAME {
                ct_tensor *x, *y, *loss = NULL;
                batch_make(s * MAXACC + a, rows_of(k), vocab, &x, &y);
                /* as gradient accumulation over the M micro-batches, each loss / M */
                double sum = 0;
                int64_t b = rows_of(k) / k->M;
                if (k->bf16) ct_autocast_begin(CT_DTYPE_BF16);
                for (int i = 0; i < k->M && !rc; i++) {
                    loss = whole_loss(k, m, ct_tensor_narrow(x, 0, i * b, b), ct_tensor_narrow(y, 0, i * b, b));
                    if (!loss || ct_backward(ct_mul_scalar(loss, 1.0 / k->M))) rc = 1;
                    if (!rc) sum += ct_tensor_item(loss);
                }
                if (k->bf16) ct_autocast_end();
                ref->loss[s * MAXACC + a] = sum / k->M;
            }
        if (s == 0) {
            int64_t off = 0;
            for (int i = 0; i < all.n; i++) {
                int64_t n = ct_tensor_numel(all.tensors[i]);
                memcpy(ref->grad0 + off, ct_tensor_data(all.tensors[i]->grad), (size_t)n * sizeof(float));
                off += n;
            }
        }
        ref->norm[s] = ct_clip_grad_norm(all.n, all.tensors, MAXN, 2.0);
        if (rc || isnan(ref->norm[s]) || ct_optimizer_step(opt)) rc = 1;
    }
    if (rc) report(c, "reference: %s", ct_last_error());
    int64_t off = 0;
    for (int i = 0; !rc && i < all.n; i++) {
        int64_t n = ct_tensor_numel(all.tensors[i]);
        memcpy(ref->final + off, ct_tensor_data(all.tensors[i]), (size_t)n * sizeof(float));
        off += n;
    }
    ct_optimizer_free(opt);
    ct_param_list_free(&all);
    ct_module_free(m);
    return rc;
}

/* ---- one pipeline stage ------------------------------------------------------------------- */

/* Parameters a stage must hold: per layer 12 (GPT) or 9 (Llama); stage 0 the
 * embeddings (GPT wte, wpe; Llama embed_tokens); the last the final norm (GPT 2,
 * Llama 1) and the head (GPT's wte; the Llama's lm_head or, tied, embed_tokens). */
static int expected_params(const pcase *k, int stage, int layers)
{
    bool first = stage == 0, last = stage == k->pp - 1;
    int n = layers * (k->llama ? 9 : 12);
    if (first) n += k->llama ? 1 : 2;
    if (last) n += k->llama ? 2 : 3;
    if (first && last) n -= k->llama ? (k->tied ? 1 : 0) : 1; /* one copy of the tied weight */
    return n;
}

/* The whole model's names and shapes, in named order (taken before sharding). */
typedef struct whole_list {
    int n;
    char names[64][64];
    int ndim[64];
    int64_t shape[64][CT_MAX_DIMS];
} whole_list;

/* The offset of name's tensor in the flat named order of the whole model and its index,
 * -1 if none. */
static int64_t offset_of(const whole_list *w, const char *name, int *idx)
{
    int64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        if (!strcmp(w->names[i], name)) {
            *idx = i;
            return off;
        }
        int64_t n = 1;
        for (int d = 0; d < w->ndim[i]; d++) n *= w->shape[i][d];
        off += n;
    }
    return -1;
}

/* The part of the whole reference tensor (flat at want) the stage's tensor t holds: all
 * of it, or under tensor parallelism the shard's slice (the test's own slicing: in each
 * of `parts` blocks of full indices along dim, [start, end), zeros past the end). */
static ct_tensor *expected_part(const pcase *k, ct_module *m, const ct_tensor *param, const whole_list *w, int idx,
                                const float *want)
{
    ct_tensor *whole = ct_tensor_from_data(CT_DTYPE_F32, w->ndim[idx], w->shape[idx], want);
    if (!whole || k->tp <= 1) return whole;
    ct_tp_shard s;
    int parts = 1;
    if (k->llama) {
        const ct_tp_shard *r = ct_llama_tp_shard_of((ct_llama *)m, param);
        if (!r || r->dim < 0) return whole;
        s = *r;
    } else {
        const ct_gpt_tp_shard *r = ct_gpt_tp_shard_of((ct_gpt *)m, NULL, param);
        if (!r || r->shard.dim < 0) return whole;
        s = r->shard, parts = r->parts;
    }
    ct_tensor *pieces[4];
    for (int j = 0; j < parts; j++)
        pieces[j] = slice_padded(ct_narrow(whole, s.dim, j * s.full, s.full), s.dim, s.start, s.end);
    return ct_tensor_contiguous(parts == 1 ? pieces[0] : ct_concat(parts, pieces, s.dim));
}

/* Every tensor of the stage (grads or values) against the reference's flat array. */
static int compare(rank_ctx *c, const pcase *k, ct_module *m, const whole_list *w, const ct_param_list *p,
                   const float *want, bool grads, double tol, const char *what)
{
    int bad = 0;
    for (int i = 0; i < p->n; i++) CT_FRAME {
            ct_tensor *t = grads ? p->tensors[i]->grad : p->tensors[i];
            int idx = -1;
            int64_t off = offset_of(w, p->names[i], &idx);
            ct_tensor *e_t = t && off >= 0 ? expected_part(k, m, p->tensors[i], w, idx, want + off) : NULL;
            if (!t || !e_t || !ct_tensor_same_shape(t, e_t)) {
                report(c, "rank %d: %s %s: %s", c->rank, what, p->names[i],
                       !t ? "no gradient" : off < 0 ? "not in the model" : "not the expected part's shape");
                bad = 1;
                continue;
            }
            ct_tensor *tc = ct_tensor_contiguous(t);
            int64_t n = ct_tensor_numel(t), C = n / 3;
            const float *g = ct_tensor_data(tc), *wv = ct_tensor_data(e_t);
            double e = rel_norm(g, wv, n);
            if (!grads && strstr(p->names[i], "attn.c_attn.bias")) {
                /* The key bias [C, 2C) has a zero gradient (q.(k + b) shifts every score of a
                 * row by q.b: softmax ignores it), so what it gets is rounding noise, which
                 * Adam turns into steps of size lr: compare the query and value biases. */
                e = fmax(rel_norm(g, wv, C), rel_norm(g + 2 * C, wv + 2 * C, C));
            }
            /* Parameters after training under tensor parallelism: the tp tests' measure
             * (tests/nn/tp_check.h, rel_rms: why); the gradients above stay in norm. */
            if (!grads && k->tp > 1) e = rel_rms(tc, e_t);
            if (!(e <= tol)) {
                report(c, "rank %d: %s %s: relative error %.3g > %.3g", c->rank, what, p->names[i], e, tol);
                bad = 1;
            }
        }
    return bad;
}

static int stage_rank(rank_ctx *c)
{
    ct_set_num_threads(1); /* pp ranks share the cores */
    const pcase *k = c->arg;
    const ref_run *ref = (const ref_run *)((const char *)c->arg + sizeof(pcase));
    double tol = k->bf16 ? TOL_BF16 : TOL;
    ct_pg *world = rank_pg(c, 200, NULL);
    int64_t vocab;
    ct_module *m = model_new(k, &vocab);
    ct_param_list all = {0};
    static whole_list w;
    ct_mesh *mesh = world ? ct_mesh_new(world, &(ct_mesh_config){.tp = k->tp > 1 ? k->tp : 1, .pp = k->pp}) : NULL;
    ct_status st = !world || !m || !mesh ? CT_ERR_INVALID : ct_module_named_tensors(m, false, &all);
    for (int i = 0; !st && i < all.n && i < 64; i++) {
        snprintf(w.names[i], sizeof w.names[i], "%s", all.names[i]);
        w.ndim[i] = all.tensors[i]->ndim;
        memcpy(w.shape[i], all.tensors[i]->shape, sizeof w.shape[i]);
        w.n = i + 1;
    }
    ct_param_list_free(&all);
    if (!st && k->tp > 1)
        st = k->llama ? ct_llama_tensor_parallel((ct_llama *)m, mesh->tp_group, k->sp)
                      : ct_gpt_tensor_parallel((ct_gpt *)m, mesh->tp_group, k->sp);
    if (!st) st = ct_module_named_tensors(m, false, &all);
    if (st) {
        report(c, "rank %d: setup: %s", c->rank, ct_last_error());
        ct_mesh_free(mesh);
        ct_pg_free(world);
        ct_module_free(m);
        return 1;
    }
    const int stage = mesh->pp_rank;
    ct_pipeline_config pc = {.schedule = k->kind};
    ct_pipeline_model *pm = k->llama ? ct_pipeline_llama_new((ct_llama *)m, mesh->pp_group, stage, &pc)
                                     : ct_pipeline_gpt_new((ct_gpt *)m, mesh->pp_group, stage, &pc);
    int rc = 0;
    if (!pm) {
        report(c, "rank %d: new: %s", c->rank, ct_last_error());
        rc = 1;
    }
    const ct_param_list *p = ct_pipeline_model_params(pm);
    int first = 0, count = 0;
    ct_pipeline_model_layers(pm, &first, &count);
    if (!rc && (p->n != expected_params(k, stage, count) || count != 4 / k->pp || first != stage * count)) {
        report(c, "rank %d: %d parameters, layers [%d, %d); expected %d and %d layers from %d", c->rank, p->n, first,
               first + count, expected_params(k, stage, 4 / k->pp), 4 / k->pp, stage * 4 / k->pp);
        rc = 1;
    }
    /* the parameters of the other stages gave their memory back; reading one is an error */
    int released = 0;
    for (int i = 0; i < all.n && !rc && k->pp > 1; i++) {
        bool mine = false;
        for (int j = 0; j < p->n; j++) mine |= p->tensors[j] == all.tensors[i];
        if (mine) continue;
        released++;
        if (all.tensors[i]->storage->data || ct_tensor_data(all.tensors[i]) ||
            !strstr(ct_last_error(), "belongs to another pipeline stage")) {
            report(c, "rank %d: %s of another stage still has memory, or reads without an error (%s)", c->rank,
                   all.names[i], ct_last_error());
            rc = 1;
        }
    }
    if (!rc && k->pp > 1 && released == 0) {
        report(c, "rank %d: no parameter of another stage was released", c->rank);
        rc = 1;
    }
    ct_optimizer *opt = rc ? NULL : adamw(p->n, p->tensors);
    for (int s = 0; s < STEPS && !rc; s++) {
        ct_optimizer_zero_grad(opt);
        for (int a = 0; a < k->accum && !rc; a++) CT_FRAME {
                ct_tensor *x, *y;
                double loss = NAN;
                batch_make(s * MAXACC + a, rows_of(k), vocab, &x, &y);
                if (k->bf16) ct_autocast_begin(CT_DTYPE_BF16);
                if (ct_pipeline_model_step(pm, x, y, k->M, &loss)) {
                    report(c, "rank %d step %d: %s", c->rank, s, ct_last_error());
                    rc = 1;
                }
                if (k->bf16) ct_autocast_end();
                double want = ref->loss[s * MAXACC + a];
                if (!rc && !(fabs(loss - want) <= tol * fabs(want))) {
                    report(c, "rank %d step %d.%d: loss %.8g, single process %.8g", c->rank, s, a, loss, want);
                    rc = 1;
                }
            }
        if (!rc && ct_pipeline_model_sync_grads(pm)) {
            report(c, "rank %d: sync: %s", c->rank, ct_last_error());
            rc = 1;
        }
        if (!rc && s == 0) rc = compare(c, k, m, &w, p, ref->grad0, true, tol, "gradient of step 0");
        double norm = rc ? NAN : ct_pipeline_model_clip_grad_norm(pm, MAXN);
        if (!rc && !(fabs(norm - ref->norm[s]) <= tol * ref->norm[s])) {
            report(c, "rank %d step %d: global norm %.8g, single process %.8g (%s)", c->rank, s, norm, ref->norm[s],
                   ct_last_error());
            rc = 1;
        }
        if (!rc && ct_optimizer_step(opt)) rc = 1;
    }
    if (!rc) rc = compare(c, k, m, &w, p, ref->final, false, tol, "parameter after 5 steps");
    ct_optimizer_free(opt);
    ct_pipeline_model_free(pm);
    ct_mesh_free(mesh);
    ct_param_list_free(&all);
    ct_module_free(m);
    ct_pg_free(world);
    return rc;
}

/* ---- the cases ---------------------------------------------------------------------------- */

/* The reference for k in a process of its own, then each variant's pipeline ranks. */
static void run_cases(pcase base, const pcase *variants, int n)
{
    /* Nothing here computes: a process that ran OpenMP regions must not fork workers
     * that run them again. The mapping is reserved at the largest size and used lazily. */
    int64_t nfloat = MAX_FLOATS;
    size_t bytes = sizeof(pcase) + sizeof(ref_run) + 2 * (size_t)nfloat * sizeof(float);
    char *shm = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(shm, MAP_FAILED);
    pcase *k = (pcase *)shm;
    ref_run *ref = (ref_run *)(shm + sizeof(pcase));
    ref->nfloat = nfloat;
    ref->grad0 = (float *)(ref + 1);
    ref->final = ref->grad0 + nfloat;
    *k = base;
    rank_result res[MAX_RANKS];
    run_ranks(1, reference_rank, k, res, 90);
    expect_all_ok(res, 1);
    cr_assert_gt(ref->norm[0], MAXN, "clipping must be active: norm %g", ref->norm[0]);
    for (int i = 0; i < n; i++) {
        *k = variants[i];
        int world = k->pp * (k->tp > 1 ? k->tp : 1);
        run_ranks(world, stage_rank, k, res, 90);
        for (int r = 0; r < world; r++)
            cr_expect(res[r].rc == 0 && WIFEXITED(res[r].status) && WEXITSTATUS(res[r].status) == 0,
                      "%s tp=%d%s pp=%d %s M=%d accum %d%s, rank %d (rc %d, status 0x%x):\n%s",
                      k->llama ? "llama" : "gpt", k->tp, k->sp ? " sp" : "", k->pp, ct_pipeline_kind_name(k->kind), k->M,
                      k->accum, k->bf16 ? " bf16" : "", r, res[r].rc, res[r].status, res[r].msg);
    }
    munmap(shm, bytes);
}

Test(pipeline_model, gpt_pp2_gpipe_and_1f1b, .timeout = 120)
{
    pcase v1[] = {{.pp = 2, .M = 1, .accum = 1, .kind = CT_PIPELINE_GPIPE}};
    run_cases((pcase){.pp = 1, .M = 1, .accum = 1}, v1, 1);
    pcase v4[] = {{.pp = 2, .M = 4, .accum = 1, .kind = CT_PIPELINE_1F1B}};
    run_cases((pcase){.pp = 1, .M = 4, .accum = 1}, v4, 1);
}

Test(pipeline_model, gpt_pp4_accumulation, .timeout = 120)
{
    pcase v[] = {{.pp = 4, .M = 2, .accum = 2, .kind = CT_PIPELINE_1F1B}};
    run_cases((pcase){.pp = 1, .M = 2, .accum = 2}, v, 1);
}

Test(pipeline_model, gpt_bf16_tracks_single_process_bf16, .timeout = 120)
{
    pcase v[] = {{.pp = 2, .M = 4, .accum = 1, .kind = CT_PIPELINE_1F1B, .bf16 = true}};
    run_cases((pcase){.pp = 1, .M = 4, .accum = 1, .bf16 = true}, v, 1);
}

Test(pipeline_model, llama_pp2_untied, .timeout = 120)
{
    pcase v[] = {{.llama = true, .pp = 2, .M = 4, .accum = 1, .kind = CT_PIPELINE_GPIPE}};
    run_cases((pcase){.llama = true, .pp = 1, .M = 4, .accum = 1}, v, 1);
}

Test(pipeline_model, llama_pp4_tied, .timeout = 120)
{
    pcase v[] = {{.llama = true, .tied = true, .pp = 4, .M = 4, .accum = 1, .kind = CT_PIPELINE_1F1B}};
    run_cases((pcase){.llama = true, .tied = true, .pp = 1, .M = 4, .accum = 1}, v, 1);
}

/* tensor parallelism inside the stages: tp 2 x pp 2 on 4 ranks */
Test(pipeline_model, gpt_tp2_pp2_with_and_without_sequence_parallelism, .timeout = 180)
{
    pcase v[] = {{.pp = 2, .M = 2, .accum = 2, .kind = CT_PIPELINE_1F1B, .tp = 2},
                 {.pp = 2, .M = 2, .accum = 2, .kind = CT_PIPELINE_1F1B, .tp = 2, .sp = true}};
    run_cases((pcase){.pp = 1, .M = 2, .accum = 2}, v, 2);
}

Test(pipeline_model, llama_tp2_pp2_tied_sequence_parallel, .timeout = 180)
{
    pcase v[] = {{.llama = true, .tied = true, .pp = 2, .M = 2, .accum = 1, .kind = CT_PIPELINE_1F1B, .tp = 2,
                  .sp = true}};
    run_cases((pcase){.llama = true, .tied = true, .pp = 1, .M = 2, .accum = 1}, v, 1);
}

/* ---- errors ------------------------------------------------------------------------------- */

static int too_many_stages_rank(rank_ctx *c)
{
    ct_pg *world = rank_pg(c, 30, NULL);
    ct_set_seed(1);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 16, .block_size = 8, .n_layer = 2, .n_head = 1, .n_embd = 8});
    ct_pipeline_model *pm = world && m ? ct_pipeline_gpt_new(m, world, c->rank, NULL) : NULL;
    const char *e = ct_last_error();
    int rc = 0;
    if (pm || !strstr(e, "2 layers") || !strstr(e, "3 stages")) {
        report(c, "rank %d: expected an error naming 2 layers and 3 stages, got %s", c->rank, pm ? "a handle" : e);
        rc = 1;
    }
    ct_pipeline_model_free(pm);
    ct_module_free(m ? &m->base : NULL);
    ct_pg_free(world);
    return rc;
}

Test(pipeline_model, more_stages_than_layers_is_an_error, .timeout = 60)
{
    rank_result res[3];
    run_ranks(3, too_many_stages_rank, NULL, res, 30);
    expect_all_ok(res, 3);
}

Test(pipeline_model, batch_not_divisible_into_micro_batches_is_an_error)
{
    ct_set_seed(1);
    ct_gpt *m = ct_gpt_new(&(ct_gpt_config){.vocab_size = 16, .block_size = 8, .n_layer = 2, .n_head = 1, .n_embd = 8});
    cr_assert_not_null(m);
    ct_pipeline_model *pm = ct_pipeline_gpt_new(m, NULL, 0, NULL);
    cr_assert_not_null(pm, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *x = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(6, 4));
        double loss = 0;
        cr_expect_neq(ct_pipeline_model_step(pm, x, x, 4, &loss), CT_OK);
        cr_expect(strstr(ct_last_error(), "6 rows") && strstr(ct_last_error(), "4 micro-batches"), "%s",
                  ct_last_error());
        /* 3 micro-batches of 2 rows is fine, and one stage is the whole model */
        cr_expect_eq(ct_pipeline_model_step(pm, x, x, 3, &loss), CT_OK, "%s", ct_last_error());
        cr_expect(fabs(loss - log(16.0)) < 0.1, "loss %g of a fresh model near log(V)", loss);
        ct_tensor *long_x = ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2, 9));
        cr_expect_neq(ct_pipeline_model_step(pm, long_x, long_x, 1, &loss), CT_OK);
        cr_expect(strstr(ct_last_error(), "9 tokens") && strstr(ct_last_error(), "block_size 8"), "%s",
                  ct_last_error());
    }
    ct_pipeline_model_free(pm);
    ct_module_free(&m->base);
}

/* The Llama's public run of layers (the stages' building block): two runs make the
 * whole forward; a range outside the model is an error naming it. */
Test(pipeline_model, llama_forward_layers_compose_the_forward)
{
    ct_set_seed(3);
    ct_llama *m = ct_llama_new(&(ct_llama_config){.vocab_size = 32, .hidden_size = 16, .intermediate_size = 24,
                                                  .num_hidden_layers = 2, .num_attention_heads = 2,
                                                  .max_position_embeddings = 16});
    cr_assert_not_null(m, "%s", ct_last_error());
    CT_FRAME {
        int64_t ids[10] = {1, 5, 9, 3, 31, 0, 7, 7, 2, 30};
        ct_tensor *x = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(2, 5), ids);
        ct_tensor *want = ct_llama_forward(m, x);
        ct_tensor *got = ct_llama_forward_layers(m, ct_llama_forward_layers(m, x, 0, 1, false), 1, 1, true);
        cr_assert(want && got, "%s", ct_last_error());
        cr_assert_eq(ct_tensor_numel(got), 2 * 5 * 32);
        cr_expect_lt(rel_norm(ct_tensor_data(got), ct_tensor_data(want), 2 * 5 * 32), 1e-6);
        cr_expect_null(ct_llama_forward_layers(m, x, 1, 2, false));
        cr_expect(strstr(ct_last_error(), "[1, 3) of 2"), "%s", ct_last_error());
    }
    ct_module_free(&m->base);
}
