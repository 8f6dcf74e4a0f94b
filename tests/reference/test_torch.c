/* ctrain against PyTorch: the GPT's logits, loss, every gradient, the clipped
 * gradient norm and every parameter after 3 AdamW steps, compared with an
 * independent PyTorch implementation (tests/reference/gpt_torch.py) that builds
 * the same model from the safetensors file ctrain wrote.
 *
 * ctrain writes, into a fresh temporary directory (tests/tmpdir.h):
 *   model.safetensors    the initial state dict (HF GPT-2 names, [in, out] Conv1D layout)
 *   batch.safetensors    x, y: i64 (B, T)
 *   ctrain.safetensors   logits (B, T, V) and grad.<name> of the first step, before
 *                        clipping; loss.<k> and norm.<k> (the pre-clip global L2 norm)
 *                        of steps k = 0..2; param.<name> after the third step
 * One step = forward, mean cross-entropy, backward, clip_grad_norm(1), AdamW
 * (weight decay on the 2-D tensors only), on the same batch each time.
 *
 * The script exits 0 when everything agrees within 1e-5 relative, 1 (naming
 * each tensor that does not) otherwise, 2 on a usage or file error. The second
 * test perturbs one weight on the PyTorch side by 1e-3 and requires the exit
 * status 1: the comparison can fail. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "nn/gpt.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "tests/spawn_timeout.h"
#include "tests/tmpdir.h"


#define REF_B 3
#define REF_T 20
#define REF_STEPS 3
#define REF_TIMEOUT_S 240

/* An odd vocabulary and T < block_size: the head's shape is not a multiple of
 * anything, and the unused position rows get zero gradients but still decay. */
static const ct_gpt_config ref_cfg = {.vocab_size = 67, .block_size = 24, .n_layer = 2, .n_head = 2, .n_embd = 32};
static const double ref_lr = 1e-3, ref_wd = 0.1, ref_beta2 = 0.95;

static const char *find_python(void)
{
    static const char *cands[3];
    cands[0] = getenv("CT_PYTHON");
    cands[1] = "python3";
    cands[2] = "/usr/bin/python3";
    for (int i = 0; i < 3; i++) {
        if (!cands[i] || !*cands[i]) continue;
        /* find_spec prints nothing when torch is missing, unlike a failing import */
        char *argv[] = {(char *)cands[i], "-c",
                        "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)", NULL};
        int rc = spawn_with_timeout(argv, NULL, 120);
        if (rc == 0) return cands[i];
    }
    return NULL;
}

static ct_tensor *random_tokens(ct_rng *rng)
{
    int64_t shape[2] = {REF_B, REF_T};
    ct_tensor *t = ct_tensor_empty(CT_DTYPE_I64, 2, shape);
    uint32_t u[REF_B * REF_T];
    ct_rng_u32(rng, u, REF_B * REF_T);
    int64_t *p = ct_tensor_data(t);
    for (int i = 0; i < REF_B * REF_T; i++) p[i] = (int64_t)(u[i] % (uint32_t)ref_cfg.vocab_size);
    return t;
}

/* Trains REF_STEPS steps and writes the three files into tmpdir. */
static void write_ctrain_side(void)
{
    ct_set_seed(20240520);
    ct_gpt *m = ct_gpt_new(&ref_cfg);
    cr_assert_not_null(m, "%s", ct_last_error());
    cr_assert_eq(ct_module_save(&m->base, path_of("model.safetensors"), 0, NULL, NULL), CT_OK, "%s", ct_last_error());

    ct_param_list pl;
    cr_assert_eq(ct_module_named_tensors(&m->base, false, &pl), CT_OK);
    /* groups as the example: decay on matrices (and embeddings), none on biases and norms */
    ct_tensor *decay[64], *no_decay[64];
    int nd = 0, nn = 0;
    for (int i = 0; i < pl.n; i++) {
        if (pl.tensors[i]->ndim == 2) decay[nd++] = pl.tensors[i];
        else no_decay[nn++] = pl.tensors[i];
    }
    ct_adamw_config oc = {.lr = ref_lr, .beta1 = 0.9, .beta2 = ref_beta2, .eps = 1e-8, .weight_decay = ref_wd};
    ct_optimizer *opt = ct_adamw_new(nd, decay, &oc);
    cr_assert_not_null(opt, "%s", ct_last_error());
    cr_assert_eq(ct_optimizer_add_group(opt, nn, no_decay, &(ct_param_group_config){.no_weight_decay = true}), CT_OK,
                 "%s", ct_last_error());

    /* names and tensors of ctrain.safetensors; the tensors are kept alive by the frame */
    int cap = 2 * pl.n + 2 * REF_STEPS + 1, n = 0;
    char **names = calloc((size_t)cap, sizeof *names);
    ct_tensor **outs = calloc((size_t)cap, sizeof *outs);
    CT_FRAME {
        ct_rng rng;
        ct_rng_init(&rng, 7);
        ct_tensor *x = random_tokens(&rng), *y = random_tokens(&rng);
        cr_assert_eq(ct_safetensors_save(path_of("batch.safetensors"), 2, (const char *const[]){"x", "y"}, (ct_tensor *const[]){x, y},
                                         0, NULL, NULL),
                     CT_OK, "%s", ct_last_error());

        for (int step = 0; step < REF_STEPS; step++) {
            ct_optimizer_zero_grad(opt);
            ct_tensor *logits = ct_gpt_forward(m, x);
            cr_assert_not_null(logits, "%s", ct_last_error());
            int64_t flat_l[2] = {REF_B * REF_T, ref_cfg.vocab_size}, flat_y[1] = {REF_B * REF_T};
            ct_tensor *loss = ct_cross_entropy(ct_reshape(logits, 2, flat_l), ct_reshape(y, 1, flat_y), -1);
            cr_assert_not_null(loss, "%s", ct_last_error());
            cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());
            if (step == 0) {
                names[n] = strdup("logits"), outs[n++] = ct_detach(logits);
                for (int i = 0; i < pl.n; i++) {
                    char buf[160];
                    snprintf(buf, sizeof buf, "grad.%s", pl.names[i]);
                    cr_assert_not_null(pl.tensors[i]->grad, "no gradient for %s", pl.names[i]);
                    names[n] = strdup(buf), outs[n++] = ct_tensor_clone(pl.tensors[i]->grad);
                }
            }
            double norm = ct_clip_grad_norm(pl.n, pl.tensors, 1.0, 2.0);
            cr_assert(norm >= 0, "%s", ct_last_error());
            cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
            char buf[32];
            snprintf(buf, sizeof buf, "loss.%d", step);
            names[n] = strdup(buf), outs[n++] = ct_detach(loss);
            snprintf(buf, sizeof buf, "norm.%d", step);
            names[n] = strdup(buf), outs[n++] = ct_tensor_scalar(CT_DTYPE_F32, norm);
        }
        for (int i = 0; i < pl.n; i++) {
            char buf[160];
            snprintf(buf, sizeof buf, "param.%s", pl.names[i]);
            names[n] = strdup(buf), outs[n++] = pl.tensors[i];
        }
        cr_assert_leq(n, cap);
        cr_assert_eq(ct_safetensors_save(path_of("ctrain.safetensors"), n, (const char *const *)names, outs, 0, NULL, NULL), CT_OK, "%s",
                     ct_last_error());
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(outs);
    ct_param_list_free(&pl);
    ct_optimizer_free(opt);
    ct_module_free(&m->base);
}

static char script_path[512];

/* The script lives beside this file; tests run from the repository root. */
static const char *torch_script(void)
{
    snprintf(script_path, sizeof script_path, "%s", __FILE__);
    char *slash = strrchr(script_path, '/');
    if (slash) slash[1] = '\0';
    else script_path[0] = '\0';
    strncat(script_path, "gpt_torch.py", sizeof script_path - strlen(script_path) - 1);
    return script_path;
}

/* Writes ctrain's side once per test, then runs the PyTorch side. */
static int compare_with_torch(const char *perturb)
{
    const char *py = find_python();
    cr_assert_not_null(py, "no python3 can import torch: the test setup installs Debian's python3-torch "
                           "(tools/setup.sh); set CT_PYTHON to an interpreter that has it");
    write_ctrain_side();
    char lr[32], wd[32], b2[32];
    snprintf(lr, sizeof lr, "%.17g", ref_lr);
    snprintf(wd, sizeof wd, "%.17g", ref_wd);
    snprintf(b2, sizeof b2, "%.17g", ref_beta2);
    char *argv[16] = {(char *)py, (char *)torch_script(), "--dir", tmpdir, "--lr", lr, "--weight_decay", wd,
                      "--beta2", b2, "--n_head", "2", NULL};
    if (perturb) argv[12] = "--perturb", argv[13] = (char *)perturb, argv[14] = NULL;
    return spawn_with_timeout(argv, NULL, REF_TIMEOUT_S);
}

static void setup(void) { make_tmpdir_with("/tmp/ctrain-ref-"); }
TestSuite(reference, .init = setup, .fini = remove_tmpdir, .timeout = 300);

Test(reference, gpt_matches_pytorch)
{
    int rc = compare_with_torch(NULL);
    cr_assert_eq(rc, 0, "gpt_torch.py exited %d: ctrain and PyTorch disagree (see its output above)", rc);
}

Test(reference, perturbed_weight_is_caught)
{
    int rc = compare_with_torch("h.1.mlp.c_fc.weight");
    cr_assert_eq(rc, 1, "with a perturbed weight gpt_torch.py exited %d, expected 1 (a mismatch)", rc);
}
