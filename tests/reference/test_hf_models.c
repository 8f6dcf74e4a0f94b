/* ctrain's causal LMs against Hugging Face transformers, through the generic
 * interface (nn/lm.h, nn/generate.h) only.
 *
 * For each model (gpt2; llama with grouped key/value heads; llama with llama3 rope
 * scaling and a tied head) tests/reference/hf_models.py `make` has transformers build a
 * small random model and save it (config.json + model.safetensors, f32) with what it
 * computes in expect.safetensors (see the script). Then ctrain:
 *   1. loads the directory with ct_lm_from_pretrained: the sizes and token ids of the
 *      ct_lm are config.json's;
 *   2. logits of ids (2, 11) within 1e-5 (max|a - b| / max|b|), without a cache and
 *      through a cache filled in two pieces (6 + 5 positions);
 *   3. the loss, ct_cross_entropy(logits, targets, -1) with targets = ids shifted left
 *      and -1 in the last column (transformers' own shift), within 1e-5, and after one
 *      backward every parameter's gradient within 1e-5, each parameter matched to
 *      transformers' name (as it is, or under "transformer." / "model."); the numbers of
 *      parameters agree;
 *   4. greedy generation of 32 tokens from two prompts, token for token, with the cache
 *      and without (the script picked a seed whose greedy steps have no near-tie);
 *   5. trains 3 SGD steps, ct_lm_save_pretrained into a new directory, and the script's
 *      `check` loads it with AutoModelForCausalLM.from_pretrained, which must log no
 *      warning, and gets ctrain's logits of the trained model within 1e-5; the logits
 *      from before training must not match (the check can fail).
 * The venv (build/tests/venv-transformers, tests/reference/hf_venv.sh) is made once;
 * when it cannot be made the tests are skipped with the reason. Every process runs
 * under a timeout. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/safetensors.h"
#include "nn/generate.h"
#include "nn/lm.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tests/spawn_timeout.h"
#include "tests/tmpdir.h"


#define HF_TOL 1e-5
#define HF_NEW_TOKENS 32
#define HF_PROMPTS 2
#define HF_TRAIN_STEPS 3
#define HF_VENV_TIMEOUT_S 540 /* the first run builds the venv (pip) */
#define HF_SCRIPT_TIMEOUT_S 180


/* What a process wrote (for a failure message); the caller frees it. */
static char *log_text(const char *log)
{
    if (access(log, R_OK) != 0) return strdup("(no output)");
    size_t n;
    return (char *)read_all(log, &n);
}

static char venv_py[512], script[512];

/* Makes (or reuses) the venv; skips the test when it cannot be made. */
static void need_venv(void)
{
    const char *src = getenv("CTRAIN_SRC");
    if (!src || !*src) cr_skip_test("CTRAIN_SRC is not set: run through `make test`");
    char venv[400], sh[512];
    const char *v = getenv("CT_HF_VENV");
    snprintf(venv, sizeof venv, "%s", v && *v ? v : "");
    if (!*venv) snprintf(venv, sizeof venv, "%s/build/tests/venv-transformers", src);
    snprintf(sh, sizeof sh, "%s/tests/reference/hf_venv.sh", src);
    snprintf(script, sizeof script, "%s/tests/reference/hf_models.py", src);
    snprintf(venv_py, sizeof venv_py, "%s/bin/python", venv);
    /* a venv named by CT_HF_VENV is the user's: used as it is, never rebuilt */
    char *argv[] = {"bash", sh, v && *v ? "--external" : venv, v && *v ? venv : NULL, NULL};
    int rc = spawn_with_timeout(argv, path_of("venv.log"), HF_VENV_TIMEOUT_S);
    char *out = log_text(path_of("venv.log"));
    if (rc == 77) cr_skip_test("Hugging Face transformers is not available: %s", out);
    cr_assert_eq(rc, 0, "hf_venv.sh failed (status %d): %s", rc, out);
    free(out);
}

/* Runs hf_models.py with args; returns its exit status, its output in *out (freed by
 * the caller). */
static int run_script(char *const args[], char **out)
{
    char *argv[16] = {venv_py, script};
    int n = 2;
    for (; args[n - 2]; n++) {
        cr_assert_lt(n, 15);
        argv[n] = args[n - 2];
    }
    argv[n] = NULL;
    int rc = spawn_with_timeout(argv, path_of("script.log"), HF_SCRIPT_TIMEOUT_S);
    *out = log_text(path_of("script.log"));
    return rc;
}

/* max|a - b| / max|b| over two tensors of one shape, any float dtype, in f64. */
static double rel_err(ct_tensor *a, ct_tensor *b)
{
    cr_assert(ct_tensor_same_shape(a, b), "shapes differ");
    double num = 0, den = 0;
    CT_FRAME {
        ct_tensor *x = ct_tensor_cast(a, CT_DTYPE_F64), *y = ct_tensor_cast(b, CT_DTYPE_F64);
        cr_assert(x && y, "%s", ct_last_error());
        x = ct_tensor_contiguous(x), y = ct_tensor_contiguous(y);
        const double *p = ct_tensor_data(x), *q = ct_tensor_data(y);
        for (int64_t i = 0, n = ct_tensor_numel(x); i < n; i++) {
            num = fmax(num, fabs(p[i] - q[i]));
            den = fmax(den, fabs(q[i]));
        }
    }
    return den > 0 ? num / den : num;
}

static ct_tensor *get(ct_safetensors *f, const char *name)
{
    ct_tensor *t = ct_safetensors_get(f, name);
    cr_assert_not_null(t, "expect.safetensors: %s", ct_last_error());
    return t;
}

static int64_t meta_int(ct_safetensors *f, const char *key)
{
    const char *v = ct_safetensors_metadata(f, key);
    cr_assert_not_null(v, "expect.safetensors has no metadata %s", key);
    return strtoll(v, NULL, 10);
}

/* 1. what ct_lm_from_pretrained read from config.json */
static void check_sizes(ct_lm *lm, ct_safetensors *f)
{
    const struct {
        const char *key;
        int64_t got;
    } fields[] = {{"vocab_size", lm->vocab_size},     {"max_positions", lm->max_positions},
                  {"n_layer", lm->n_layer},           {"n_kv_head", lm->n_kv_head},
                  {"head_dim", lm->head_dim},         {"bos_token_id", lm->bos_token_id},
                  {"eos_token_id", lm->eos_token_id}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        cr_expect_eq(fields[i].got, meta_int(f, fields[i].key), "ct_lm's %s is %lld, config.json's %lld", fields[i].key,
                     (long long)fields[i].got, (long long)meta_int(f, fields[i].key));
}

/* loss = mean cross-entropy of logits (B, T, V) against targets (B, T), ignore -1 */
static ct_tensor *lm_loss(ct_tensor *logits, ct_tensor *targets)
{
    int64_t B = logits->shape[0], T = logits->shape[1], V = logits->shape[2];
    return ct_cross_entropy(ct_reshape(logits, 2, (int64_t[]){B * T, V}), ct_reshape(targets, 1, (int64_t[]){B * T}),
                            -1);
}

/* 2. the forward pass without a cache (returned, differentiable) and with one */
static ct_tensor *check_logits(ct_lm *lm, ct_tensor *ids, ct_tensor *want)
{
    ct_tensor *logits = ct_lm_forward(lm, ids, NULL);
    cr_assert_not_null(logits, "%s", ct_last_error());
    double e = rel_err(logits, want);
    cr_log_info("logits: %.3g", e);
    cr_expect_leq(e, HF_TOL, "logits differ from transformers' by %.3g (relative)", e);

    int64_t B = ids->shape[0], T = ids->shape[1], first = 6;
    ct_kv_cache *cache = ct_lm_cache_new(lm, B, T);
    cr_assert_not_null(cache, "%s", ct_last_error());
    CT_NO_GRAD {
        ct_tensor *a = ct_lm_forward(lm, ct_tensor_contiguous(ct_tensor_narrow(ids, 1, 0, first)), cache);
        cr_assert_not_null(a, "cached forward of positions 0..%d: %s", (int)first - 1, ct_last_error());
        cr_assert_eq(cache->len, first, "the cache holds %lld positions after %lld tokens", (long long)cache->len,
                     (long long)first);
        ct_tensor *b = ct_lm_forward(lm, ct_tensor_contiguous(ct_tensor_narrow(ids, 1, first, T - first)), cache);
        cr_assert_not_null(b, "cached forward of positions %d..%d: %s", (int)first, (int)T - 1, ct_last_error());
        ct_tensor *both = ct_concat(2, (ct_tensor *[]){a, b}, 1);
        cr_assert_not_null(both, "%s", ct_last_error());
        double ec = rel_err(both, want);
        cr_log_info("logits through the cache: %.3g", ec);
        cr_expect_leq(ec, HF_TOL, "logits through the cache (%d + %d positions) differ by %.3g", (int)first,
                      (int)(T - first), ec);
    }
    ct_kv_cache_free(cache);
    return logits;
}

/* transformers' name of a ctrain parameter: as it is, or under GPT2LMHeadModel's or
 * LlamaForCausalLM's base-model prefix */
static bool hf_grad_name(ct_safetensors *f, const char *name, char *buf, size_t cap)
{
    static const char *const prefixes[] = {"", "transformer.", "model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        snprintf(buf, cap, "grad.%s%s", prefixes[i], name);
        if (ct_safetensors_info(f, buf, NULL, NULL, NULL)) return true;
    }
    ct_error_clear();
    return false;
}

/* 3. loss and gradients */
static void check_grads(ct_lm *lm, ct_safetensors *f, ct_tensor *logits, ct_tensor *targets)
{
    ct_tensor *loss = lm_loss(logits, targets);
    cr_assert_not_null(loss, "%s", ct_last_error());
    double e = rel_err(loss, get(f, "loss"));
    cr_expect_leq(e, HF_TOL, "loss %.9g, transformers' %.9g", ct_tensor_item(loss), ct_tensor_item(get(f, "loss")));
    cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());

    ct_param_list pl;
    cr_assert_eq(ct_module_named_tensors(lm->module, false, &pl), CT_OK, "%s", ct_last_error());
    cr_expect_eq(pl.n, meta_int(f, "n_params"), "ctrain has %d parameters, transformers %lld", pl.n,
                 (long long)meta_int(f, "n_params"));
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < pl.n; i++) {
        char hf[256];
        if (!hf_grad_name(f, pl.names[i], hf, sizeof hf)) {
            cr_expect_fail("ctrain's parameter %s has no counterpart in transformers' model", pl.names[i]);
            continue;
        }
        ct_tensor *want = get(f, hf), *got = pl.tensors[i]->grad;
        if (!got) {
            cr_expect_fail("no gradient for %s", pl.names[i]);
            continue;
        }
        if (!ct_tensor_same_shape(got, want)) {
            char a[64], b[64];
            cr_expect_fail("%s: ctrain's gradient is %s, transformers' %s", pl.names[i], ct_tensor_describe(got, a, 64),
                           ct_tensor_describe(want, b, 64));
            continue;
        }
        double ge = rel_err(got, want);
        cr_expect_leq(ge, HF_TOL, "gradient of %s (%s) differs by %.3g (relative)", pl.names[i], hf + 5, ge);
        if (ge >= worst) worst = ge, worst_name = pl.names[i];
    }
    cr_log_info("loss %.3g, worst gradient %.3g (%s)", e, worst, worst_name);
    ct_param_list_free(&pl);
}

/* 4. greedy generation, with and without the cache */
static void check_generation(ct_lm *lm, ct_safetensors *f)
{
    int64_t stop = meta_int(f, "stop_id");
    for (int k = 0; k < HF_PROMPTS; k++) {
        char name[32];
        snprintf(name, sizeof name, "gen.%d.prompt", k);
        ct_tensor *prompt = get(f, name);
        snprintf(name, sizeof name, "gen.%d.tokens", k);
        ct_tensor *want = get(f, name);
        int64_t n = ct_tensor_numel(prompt);
        cr_assert_eq(ct_tensor_numel(want), n + HF_NEW_TOKENS);
        const int64_t *p = ct_tensor_data(prompt), *w = ct_tensor_data(want);
        for (int cached = 1; cached >= 0; cached--) {
            ct_sample_config cfg = ct_sample_config_default();
            cfg.greedy = true;
            cfg.max_new_tokens = HF_NEW_TOKENS;
            cfg.stop_ids = &stop; /* a token transformers never produced: exactly 32 on both sides */
            cfg.n_stop_ids = 1;
            cfg.use_cache = cached;
            int64_t out[128];
            int64_t got = ct_generate(lm, p, n, &cfg, NULL, NULL, out);
            cr_assert_eq(got, HF_NEW_TOKENS, "prompt %d (%s cache): %lld new tokens: %s", k,
                         cached ? "with" : "without", (long long)got, got < 0 ? ct_last_error() : "");
            for (int64_t i = 0; i < n + HF_NEW_TOKENS; i++)
                cr_assert_eq(out[i], w[i], "prompt %d (%s cache): token %lld is %lld, transformers' %lld", k,
                             cached ? "with" : "without", (long long)i, (long long)out[i], (long long)w[i]);
        }
    }
}

static void save_logits(const char *path, ct_tensor *logits)
{
    cr_assert_eq(ct_safetensors_save(path, 1, (const char *const[]){"logits"}, (ct_tensor *const[]){logits}, 0, NULL,
                                     NULL),
                 CT_OK, "%s", ct_last_error());
}

/* 5. a few SGD steps, then transformers loads what ctrain saves */
static void check_saved(ct_lm *lm, ct_tensor *ids, ct_tensor *targets, ct_tensor *logits_before)
{
    ct_param_list pl;
    cr_assert_eq(ct_module_named_tensors(lm->module, false, &pl), CT_OK, "%s", ct_last_error());
    ct_optimizer *opt = ct_sgd_new(pl.n, pl.tensors, &(ct_sgd_config){.lr = 0.1});
    cr_assert_not_null(opt, "%s", ct_last_error());
    for (int step = 0; step < HF_TRAIN_STEPS; step++) {
        CT_FRAME {
            ct_optimizer_zero_grad(opt);
            ct_tensor *loss = lm_loss(ct_lm_forward(lm, ids, NULL), targets);
            cr_assert_not_null(loss, "%s", ct_last_error());
            cr_assert_eq(ct_backward(loss), CT_OK, "%s", ct_last_error());
            cr_assert_eq(ct_optimizer_step(opt), CT_OK, "%s", ct_last_error());
        }
    }
    ct_optimizer_free(opt);
    ct_param_list_free(&pl);

    const char *dir = path_of("saved");
    cr_assert_eq(ct_lm_save_pretrained(lm, dir), CT_OK, "%s", ct_last_error());
    CT_NO_GRAD {
        ct_tensor *after = ct_lm_forward(lm, ids, NULL);
        cr_assert_not_null(after, "%s", ct_last_error());
        double moved = rel_err(logits_before, after);
        cr_assert_gt(moved, 100 * HF_TOL, "training moved the logits by %.3g only: the stale check is void", moved);
        char path[300];
        snprintf(path, sizeof path, "%s/ctrain_logits.safetensors", dir);
        save_logits(path, after);
        snprintf(path, sizeof path, "%s/input.safetensors", dir);
        cr_assert_eq(
            ct_safetensors_save(path, 1, (const char *const[]){"ids"}, (ct_tensor *const[]){ids}, 0, NULL, NULL), CT_OK,
            "%s", ct_last_error());
        save_logits(path_of("stale_logits.safetensors"), ct_detach(logits_before));
    }
    char *out;
    char *stale = (char *)path_of("stale_logits.safetensors");
    int rc = run_script((char *[]){"check", (char *)dir, "--differs", stale, NULL}, &out);
    cr_log_info("%s", out);
    cr_assert_eq(rc, 0, "hf_models.py check exited %d: transformers disagrees with what ctrain saved:\n%s", rc, out);
    free(out);
}

static void compare_with_transformers(const char *arch, const char *model_type)
{
    need_venv();
    const char *dir = path_of("hf");
    char *out;
    int rc = run_script((char *[]){"make", (char *)dir, "--arch", (char *)arch, "--seed", "1", NULL}, &out);
    cr_assert_eq(rc, 0, "hf_models.py make --arch %s exited %d:\n%s", arch, rc, out);
    cr_log_info("%s", out);
    free(out);

    ct_lm *lm = ct_lm_from_pretrained(dir);
    cr_assert_not_null(lm, "ct_lm_from_pretrained(%s): %s", arch, ct_last_error());
    cr_assert_str_eq(lm->ops->model_type, model_type);
    ct_module_train(lm->module, false); /* no dropout: the configs have none, and transformers ran in eval */
    char path[300];
    snprintf(path, sizeof path, "%s/expect.safetensors", dir);
    ct_safetensors *f = ct_safetensors_open(path);
    cr_assert_not_null(f, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *ids = get(f, "ids"), *targets = get(f, "targets");
        check_sizes(lm, f);
        ct_tensor *logits = check_logits(lm, ids, get(f, "logits"));
        check_grads(lm, f, logits, targets);
        check_generation(lm, f);
        check_saved(lm, ids, targets, logits);
    }
    ct_safetensors_close(f);
    ct_lm_free(lm);
}

static void setup(void) { make_tmpdir_with("/tmp/ctrain-hf-"); }
TestSuite(hf_models, .init = setup, .fini = remove_tmpdir, .timeout = 600);

Test(hf_models, gpt2) { compare_with_transformers("gpt2", "gpt2"); }

/* 6 heads sharing 2 key/value heads, untied head, rope_theta 1e4 */
Test(hf_models, llama_grouped_kv) { compare_with_transformers("llama", "llama"); }

/* rope_scaling llama3 (kept, smoothed and scaled frequencies), tied embeddings */
Test(hf_models, llama3_rope_tied) { compare_with_transformers("llama3", "llama"); }
