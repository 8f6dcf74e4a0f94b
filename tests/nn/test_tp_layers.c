/* Tests for nn/tp_layers.c and tp_vocab.c on fork()ed ranks: every layer's
 * forward, input gradient and parameter gradients against the unsharded layer built
 * from the same full tensors with the plain ct_ ops (ct_linear, ct_gelu,
 * ct_embedding, ct_cross_entropy) on each rank; a rank's parameter gradient must
 * equal its slice of the unsharded gradient (zeros on vocabulary padding). */
#include <criterion/criterion.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "nn/tp_layers.h"
#include "tests/nn/tp_check.h"

typedef struct layers_arg {
    ct_dtype dt;
    double tol;
} layers_arg;

static ct_tensor *leaf(ct_tensor *t)
{
    ct_tensor_set_requires_grad(t, true);
    return t;
}

/* a copy of t that requires grad: the unsharded reference's own leaf */
static ct_tensor *ref_leaf(ct_tensor *t) { return leaf(ct_tensor_clone(t)); }

static int failed(rank_ctx *c, const char *what)
{
    report(c, "rank %d: %s: %s", c->rank, what, ct_last_error());
    return 1;
}

/* y = x W + b, W (in, out) or (out, in) */
static ct_tensor *ref_linear(ct_tensor *x, ct_tensor *w, ct_tensor *b, bool out_in)
{
    return ct_linear(x, out_in ? ct_contiguous(ct_transpose(w, 0, 1)) : w, b);
}

/* column-parallel, both weight layouts, with and without gather_output */
static int check_column(rank_ctx *c, ct_pg *g, ct_dtype dt, double tol, bool out_in, bool gather)
{
    int n = ct_pg_size(g), r = ct_pg_rank(g), rc = 0;
    int64_t in = 4, out = 3 * n, ol = 3;
    ct_tensor *W = out_in ? det_tensor(dt, CT_SHAPE(out, in), 1, 0.5) : det_tensor(dt, CT_SHAPE(in, out), 1, 0.5);
    ct_tensor *b = det_tensor(dt, CT_SHAPE(out), 2, 0.5);
    ct_tensor *X = leaf(det_tensor(dt, CT_SHAPE(2, 3, in), 3, 1.0));
    ct_tensor *G = det_tensor(dt, CT_SHAPE(2, 3, out), 4, 1.0);
    ct_column_linear *m = ct_column_linear_new(g, W, b, &(ct_tp_linear_config){.weight_out_in = out_in,
                                                                                 .gather_output = gather});
    if (!m) return failed(c, "column_linear_new");
    ct_tensor *y = ct_column_linear_forward(m, X);
    ct_tensor *gy = gather ? G : ct_narrow(G, 2, r * ol, ol);
    if (!y || ct_backward_with(y, ct_contiguous(gy), NULL)) rc = failed(c, "column forward/backward");

    ct_tensor *Xr = ref_leaf(X), *Wr = ref_leaf(W), *br = ref_leaf(b);
    ct_tensor *Y = ref_linear(Xr, Wr, br, out_in);
    ct_backward_with(Y, G, NULL);
    int wd = out_in ? 0 : 1;
    rc |= expect_close(c, "column y", y, gather ? Y : ct_narrow(Y, 2, r * ol, ol), tol);
    rc |= expect_close(c, "column dx", X->grad, Xr->grad, tol);
    rc |= expect_close(c, "column dW slice", m->weight->grad, ct_narrow(Wr->grad, wd, r * ol, ol), tol);
    rc |= expect_close(c, "column db slice", m->bias->grad, ct_narrow(br->grad, 0, r * ol, ol), tol);
    const ct_tp_shard *s = ct_tp_shard_of(&m->base, m->weight);
    if (!s || s->dim != wd || s->start != r * ol || s->end != (r + 1) * ol || s->full != out) {
        report(c, "rank %d: column weight shard record wrong", c->rank);
        rc = 1;
    }
    ct_module_free(&m->base);
    return rc;
}

/* row-parallel, both weight layouts, the input whole or already split */
static int check_row(rank_ctx *c, ct_pg *g, ct_dtype dt, double tol, bool out_in, bool parallel_in)
{
    int n = ct_pg_size(g), r = ct_pg_rank(g), rc = 0;
    int64_t il = 2, in = il * n, out = 5;
    ct_tensor *W = out_in ? det_tensor(dt, CT_SHAPE(out, in), 11, 0.5) : det_tensor(dt, CT_SHAPE(in, out), 11, 0.5);
    ct_tensor *b = det_tensor(dt, CT_SHAPE(out), 12, 0.5);
    ct_tensor *Xfull = det_tensor(dt, CT_SHAPE(3, in), 13, 1.0);
    ct_tensor *X = leaf(parallel_in ? ct_tensor_clone(ct_narrow(Xfull, 1, r * il, il)) : Xfull);
    ct_tensor *G = det_tensor(dt, CT_SHAPE(3, out), 14, 1.0);
    ct_row_linear *m = ct_row_linear_new(g, W, b, &(ct_tp_linear_config){.weight_out_in = out_in,
                                                                           .input_is_parallel = parallel_in});
    if (!m) return failed(c, "row_linear_new");
    ct_tensor *y = ct_row_linear_forward(m, X);
    if (!y || ct_backward_with(y, G, NULL)) rc = failed(c, "row forward/backward");

    ct_tensor *Xr = ref_leaf(Xfull), *Wr = ref_leaf(W), *br = ref_leaf(b);
    ct_tensor *Y = ref_linear(Xr, Wr, br, out_in);
    ct_backward_with(Y, G, NULL);
    int wd = out_in ? 1 : 0;
    rc |= expect_close(c, "row y", y, Y, tol);
    rc |= expect_close(c, "row dx", X->grad, parallel_in ? ct_narrow(Xr->grad, 1, r * il, il) : Xr->grad, tol);
    rc |= expect_close(c, "row dW slice", m->weight->grad, ct_narrow(Wr->grad, wd, r * il, il), tol);
    rc |= expect_close(c, "row db", m->bias->grad, br->grad, tol);
    const ct_tp_shard *s = ct_tp_shard_of(&m->base, m->bias);
    if (!s || s->dim != -1 || ct_tp_shard_of(&m->base, X)) {
        report(c, "rank %d: row bias shard record wrong", c->rank);
        rc = 1;
    }
    ct_module_free(&m->base);
    return rc;
}

/* Y = gelu(X W1 + b1) W2 + b2 as column -> GELU -> row; with sequence_parallel the
 * input and output are this rank's chunks of the sequence (dim 1 of (B, T, C)) */
static int check_mlp(rank_ctx *c, ct_pg *g, ct_dtype dt, double tol, bool sp)
{
    int n = ct_pg_size(g), r = ct_pg_rank(g), rc = 0;
    int64_t C = 4, H = 8, B = 2, T = 2 * n, tl = 2;
    ct_tensor *W1 = det_tensor(dt, CT_SHAPE(C, H), 21, 0.5), *b1 = det_tensor(dt, CT_SHAPE(H), 22, 0.5);
    ct_tensor *W2 = det_tensor(dt, CT_SHAPE(H, C), 23, 0.5), *b2 = det_tensor(dt, CT_SHAPE(C), 24, 0.5);
    ct_tensor *Xfull = det_tensor(dt, CT_SHAPE(B, T, C), 25, 1.0), *G = det_tensor(dt, CT_SHAPE(B, T, C), 26, 1.0);
    ct_tensor *X = leaf(sp ? ct_tensor_clone(ct_narrow(Xfull, 1, r * tl, tl)) : Xfull);
    ct_column_linear *fc = ct_column_linear_new(g, W1, b1, &(ct_tp_linear_config){.sequence_parallel = sp,
                                                                                   .sequence_dim = 1});
    ct_row_linear *proj = ct_row_linear_new(
        g, W2, b2, &(ct_tp_linear_config){.input_is_parallel = true, .sequence_parallel = sp, .sequence_dim = -2});
    if (!fc || !proj) {
        ct_module_free(fc ? &fc->base : NULL);
        ct_module_free(proj ? &proj->base : NULL);
        return failed(c, "mlp layers");
    }
    ct_tensor *y = ct_row_linear_forward(proj, ct_gelu(ct_column_linear_forward(fc, X)));
    if (!y || ct_backward_with(y, ct_contiguous(sp ? ct_narrow(G, 1, r * tl, tl) : G), NULL))
        rc = failed(c, "mlp forward/backward");

    ct_tensor *Xr = ref_leaf(Xfull), *W1r = ref_leaf(W1), *b1r = ref_leaf(b1), *W2r = ref_leaf(W2), *b2r = ref_leaf(b2);
    ct_tensor *Y = ct_linear(ct_gelu(ct_linear(Xr, W1r, b1r)), W2r, b2r);
    ct_backward_with(Y, G, NULL);
    int64_t hl = H / n;
    rc |= expect_close(c, "mlp y", y, sp ? ct_narrow(Y, 1, r * tl, tl) : Y, tol);
    rc |= expect_close(c, "mlp dx", X->grad, sp ? ct_narrow(Xr->grad, 1, r * tl, tl) : Xr->grad, tol);
    rc |= expect_close(c, "mlp dW1 slice", fc->weight->grad, ct_narrow(W1r->grad, 1, r * hl, hl), tol);
    rc |= expect_close(c, "mlp db1 slice", fc->bias->grad, ct_narrow(b1r->grad, 0, r * hl, hl), tol);
    rc |= expect_close(c, "mlp dW2 slice", proj->weight->grad, ct_narrow(W2r->grad, 0, r * hl, hl), tol);
    ct_tensor *db2 = proj->bias->grad;
    if (sp && db2) { /* a partial sum over the sequence chunks: the caller allreduces it */
        db2 = ct_tensor_clone(db2);
        ct_work *w = ct_pg_allreduce(g, db2, CT_REDUCE_SUM);
        if (!w || ct_work_wait(w)) rc = failed(c, "allreduce of db2");
        ct_work_free(w);
    }
    rc |= expect_close(c, "mlp db2", db2, b2r->grad, tol);
    ct_module_free(&fc->base);
    ct_module_free(&proj->base);
    return rc;
}

/* ids -> vocabulary-parallel embedding -> column-parallel LM head (padded) ->
 * vocabulary-parallel cross-entropy, against ct_embedding -> ct_linear ->
 * ct_cross_entropy over the unpadded vocabulary, with ignored targets */
static int check_vocab(rank_ctx *c, ct_pg *g, ct_dtype dt, double tol, int64_t V, int64_t pad_multiple, bool sp)
{
    int n = ct_pg_size(g), r = ct_pg_rank(g), rc = 0;
    int64_t C = 3, B = 2, T = 4;
    ct_tensor *E = det_tensor(dt, CT_SHAPE(V, C), 31, 1.0), *W = det_tensor(dt, CT_SHAPE(C, V), 32, 1.0);
    int64_t idv[8], tv[8];
    for (int i = 0; i < 8; i++) idv[i] = (3 * i + 1) % V, tv[i] = (2 * i + 1) % V;
    tv[2] = tv[5] = -100;
    ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), idv);
    ct_tensor *targets = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(B, T), tv);

    ct_vocab_embedding *emb = ct_vocab_embedding_new(
        g, E, &(ct_vocab_embedding_config){.pad_multiple = pad_multiple, .sequence_parallel = sp, .sequence_dim = 1});
    ct_column_linear *head = ct_column_linear_new(
        g, W, NULL, &(ct_tp_linear_config){.pad_output = true, .sequence_parallel = sp, .sequence_dim = 1});
    if (!emb || !head) {
        ct_module_free(emb ? &emb->base : NULL);
        ct_module_free(head ? &head->base : NULL);
        return failed(c, "vocab layers");
    }
    int64_t vp = ct_tp_vocab_padded(V, n, pad_multiple), vl = vp / n, hl = head->out_local;
    if (emb->num_padded != vp || emb->start != r * vl || emb->end != (r + 1) * vl || emb->weight->shape[0] != vl ||
        hl != (V + n - 1) / n) {
        report(c, "rank %d: vocab %lld over %d: embedding rows [%lld, %lld) of %lld, head %lld columns", c->rank,
               (long long)V, n, (long long)emb->start, (long long)emb->end, (long long)emb->num_padded, (long long)hl);
        rc = 1;
    }
    ct_tensor *h = ct_vocab_embedding_forward(emb, ids);
    ct_tensor *loss = ct_vocab_parallel_cross_entropy(g, ct_column_linear_forward(head, h), targets, V, -100);
    if (!loss || ct_backward(loss)) rc = failed(c, "vocab forward/backward");

    ct_tensor *Er = ref_leaf(E), *Wr = ref_leaf(W);
    ct_tensor *hr = ct_embedding(Er, ids);
    ct_tensor *L = ct_cross_entropy(ct_linear(hr, Wr, NULL), targets, -100);
    ct_backward(L);
    int64_t tl = T / n; /* sequence parallel: the embedding gives this rank's chunk of T */
    rc |= expect_close(c, "embedding output", h, sp ? ct_narrow(hr, 1, r * tl, tl) : hr, tol);
    rc |= expect_close(c, "vocab-parallel loss", loss, L, tol);
    rc |= expect_close(c, "embedding dE slice", emb->weight->grad, slice_padded(Er->grad, 0, r * vl, (r + 1) * vl),
                       tol);
    rc |= expect_close(c, "head dW slice", head->weight->grad, slice_padded(Wr->grad, 1, r * hl, (r + 1) * hl), tol);
    const ct_tp_shard *s = ct_tp_shard_of(&emb->base, emb->weight);
    if (!s || s->dim != 0 || s->start != r * vl || s->end != (r + 1) * vl || s->full != V) {
        report(c, "rank %d: embedding shard record wrong", c->rank);
        rc = 1;
    }
    ct_param_list pl = {0};
    if (ct_module_named_tensors(&emb->base, false, &pl) || pl.n != 1 || strcmp(pl.names[0], "weight")) {
        report(c, "rank %d: embedding parameter names: want just \"weight\"", c->rank);
        rc = 1;
    }
    ct_param_list_free(&pl);
    ct_module_free(&emb->base);
    ct_module_free(&head->base);
    return rc;
}

static int layers_rank(rank_ctx *c)
{
    const layers_arg *a = c->arg;
    ct_pg *g = rank_pg(c, 30, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        for (int k = 0; k < 4; k++) rc |= check_column(c, g, a->dt, a->tol, k & 1, k & 2);
        for (int k = 0; k < 4; k++) rc |= check_row(c, g, a->dt, a->tol, k & 1, k & 2);
        rc |= check_mlp(c, g, a->dt, a->tol, false);
        rc |= check_mlp(c, g, a->dt, a->tol, true);
        rc |= check_vocab(c, g, a->dt, a->tol, 5, 1, false); /* 5 over 2 or 4 ranks: padded to 6 or 8 */
        rc |= check_vocab(c, g, a->dt, a->tol, 8, 1, false); /* no padding */
        rc |= check_vocab(c, g, a->dt, a->tol, 5, 3, false); /* padded to a multiple of 3 n */
        rc |= check_vocab(c, g, a->dt, a->tol, 5, 1, true);  /* sequence parallel embedding and head */
    }
    ct_pg_free(g);
    return rc;
}

static void run_layers(int world, layers_arg a)
{
    rank_result res[MAX_RANKS];
    run_ranks(world, layers_rank, &a, res, 60);
    expect_all_ok(res, world);
}

Test(tp_layers, f32_on_2_ranks_equals_the_unsharded_layers, .timeout = 60)
{
    run_layers(2, (layers_arg){.dt = CT_DTYPE_F32, .tol = 1e-6});
}
Test(tp_layers, f32_on_4_ranks_equals_the_unsharded_layers, .timeout = 60)
{
    run_layers(4, (layers_arg){.dt = CT_DTYPE_F32, .tol = 1e-6});
}
/* bf16 parameters and inputs: each side rounds its own partial results to 8 bits */
Test(tp_layers, bf16_on_2_ranks_is_close, .timeout = 60)
{
    run_layers(2, (layers_arg){.dt = CT_DTYPE_BF16, .tol = 3e-2});
}

/* bad layouts and inputs fail on every rank with the numbers named, and nothing hangs */
static int errors_rank(rank_ctx *c)
{
    ct_pg *g = rank_pg(c, 20, NULL);
    if (!g) return 1;
    int rc = 0;
    CT_FRAME {
        ct_tensor *W = det_tensor(CT_DTYPE_F32, CT_SHAPE(3, 3), 1, 1.0);
        ct_column_linear *col = ct_column_linear_new(g, W, NULL, NULL);
        rc |= expect_error(c, "column 3 over 2", !col, "tp 2 does not divide the output size 3");
        ct_module_free(col ? &col->base : NULL);
        ct_row_linear *row = ct_row_linear_new(g, W, NULL, NULL);
        rc |= expect_error(c, "row 3 over 2", !row, "tp 2 does not divide the input size 3");
        ct_module_free(row ? &row->base : NULL);
        ct_tensor *b = det_tensor(CT_DTYPE_F32, CT_SHAPE(4), 2, 1.0);
        col = ct_column_linear_new(g, det_tensor(CT_DTYPE_F32, CT_SHAPE(3, 2), 1, 1.0), b, NULL);
        rc |= expect_error(c, "bias of the wrong size", !col, "bias f32[4]");
        ct_module_free(col ? &col->base : NULL);

        ct_vocab_embedding *emb = ct_vocab_embedding_new(g, det_tensor(CT_DTYPE_F32, CT_SHAPE(5, 2), 3, 1.0), NULL);
        ct_tensor *ids = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), (const int64_t[]){0, 5, 1});
        if (!emb)
            rc = failed(c, "embedding");
        else
            rc |= expect_error(c, "id 5 of 5", !ct_vocab_embedding_forward(emb, ids), "id 5 at flat index 1");
        ct_module_free(emb ? &emb->base : NULL);

        ct_tensor *logits = det_tensor(CT_DTYPE_F32, CT_SHAPE(3, 4), 4, 1.0);
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), (const int64_t[]){0, 7, 1});
        rc |= expect_error(c, "target 7 of 7", !ct_vocab_parallel_cross_entropy(g, logits, t, 7, -100), "id 7");
        rc |= expect_error(c, "vocab 9 over 2 x 4", !ct_vocab_parallel_cross_entropy(g, logits, t, 9, -100),
                           "vocab_size 9; want 1 .. 2 ranks x 4 columns = 8");
        rc |= expect_error(c, "targets of the wrong shape",
                           !ct_vocab_parallel_cross_entropy(g, logits, ct_tensor_zeros(CT_DTYPE_I64, CT_SHAPE(2)), 7,
                                                            -100),
                           "targets i64[2]");
        rc |= expect_error(c, "vocab 0", ct_tp_vocab_padded(0, 2, 1) < 0, "vocabulary 0 over 2 ranks");
        /* the group still works */
        t = ct_tensor_from_data(CT_DTYPE_I64, CT_SHAPE(3), (const int64_t[]){0, 6, -100});
        ct_tensor *loss = ct_vocab_parallel_cross_entropy(g, logits, t, 7, -100);
        if (!loss || !isfinite(ct_tensor_item(loss))) rc = failed(c, "cross-entropy after the errors");
    }
    ct_pg_free(g);
    return rc;
}

Test(tp_layers, bad_layouts_and_inputs_name_the_numbers, .timeout = 30)
{
    rank_result res[MAX_RANKS];
    run_ranks(2, errors_rank, NULL, res, 20);
    expect_all_ok(res, 2);
}
