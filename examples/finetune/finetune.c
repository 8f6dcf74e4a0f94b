/* Fine-tunes a causal LM saved in Hugging Face's layout (GPT-2 or Llama, nn/lm.h) on
 * question/answer pairs, with the loss on the answers only, and saves it back.
 *
 * The data file holds blocks separated by blank lines, each
 *
 *     ### Question: <prompt text, any number of lines>
 *     ### Answer: <answer text, any number of lines>
 *
 * (examples/finetune/sample.txt). The prompt is the block up to and including
 * "### Answer:"; the answer is the rest with its trailing white space removed, then
 * "\n", then the tokenizer's end-of-text token when it has one. Both are encoded
 * separately with the model's tokenizer.json (a 256-token model without one reads
 * bytes) and joined, so the boundary never falls inside a token. Training is causal
 * LM on the joined sequence with the targets of the prompt's positions set to -1
 * (ignored): every counted target is an answer token.
 *
 * The loop runs through the Accelerator, so `ctrain launch` runs it under any strategy
 * and precision; AdamW (no decay on norms and biases), warmup + cosine schedule. The
 * answer loss over the whole file is measured before and after training, and the
 * model is written to --out_dir with config.json and the tokenizer.json, ready for
 * `ctrain generate --model DIR`.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/threads.h"
#include "data/bpe.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "examples/common/train_util.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "nn/lm.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#define PROG "finetune"
#define Q_MARK "### Question:"
#define A_MARK "### Answer:"

typedef struct options {
    const char *model, *data, *out_dir;
    int64_t epochs, batch_size, max_len, warmup, sample_tokens;
    double lr, weight_decay, grad_clip;
    uint64_t seed;
    int threads;
} options;

static const options defaults = {
    .data = "examples/finetune/sample.txt", .out_dir = "build/finetune", .epochs = 20, .batch_size = 4,
    .max_len = 256, .warmup = 5, .sample_tokens = 48, .lr = 1e-3, .weight_decay = 0.01, .grad_clip = 1.0,
    .seed = 1337,
};

static void usage(FILE *f)
{
    const options *d = &defaults;
    fprintf(f,
            "usage: finetune --model DIR [options]\n"
            "Fine-tunes a GPT-2 or Llama saved in Hugging Face's layout on question/answer pairs\n"
            "(loss on the answers only) and saves it in the same layout.\n\n"
            "  --model DIR          config.json + model.safetensors (+ tokenizer.json) to start from\n"
            "  --data FILE          blocks \"" Q_MARK " ...\\n" A_MARK " ...\" separated by blank lines\n"
            "                       (default %s)\n"
            "  --out_dir DIR        where the tuned model goes (default %s)\n"
            "  --epochs N           passes over the pairs (default %lld)\n"
            "  --batch_size N       pairs per step and process (default %lld)\n"
            "  --max_len N          longest sequence in tokens; longer answers are cut (default %lld)\n"
            "  --lr LR              peak learning rate (default %g)\n"
            "  --warmup N           linear warmup steps, then cosine to lr/10 (default %lld)\n"
            "  --weight_decay W     AdamW decay for matrices (default %g)\n"
            "  --grad_clip C        clip the global gradient norm to C, 0 = off (default %g)\n"
            "  --seed S             shuffling (default %llu)\n"
            "  --threads N          threads (default: OMP_NUM_THREADS or all cores)\n"
            "  --sample_tokens N    greedy answer to the first question at the end, 0 = none (default %lld)\n"
            "  --help               this text\n",
            d->data, d->out_dir, (long long)d->epochs, (long long)d->batch_size, (long long)d->max_len, d->lr,
            (long long)d->warmup, d->weight_decay, d->grad_clip, (unsigned long long)d->seed,
            (long long)d->sample_tokens);
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = defaults;
    enum { O_MODEL = 256, O_DATA, O_OUT, O_EPOCHS, O_BATCH, O_MAXLEN, O_LR, O_WARM, O_WD, O_CLIP, O_SEED, O_THREADS,
           O_SAMPLE, O_HELP };
    static const struct option opts[] = {
        {"model", 1, 0, O_MODEL}, {"data", 1, 0, O_DATA}, {"out_dir", 1, 0, O_OUT}, {"epochs", 1, 0, O_EPOCHS},
        {"batch_size", 1, 0, O_BATCH}, {"max_len", 1, 0, O_MAXLEN}, {"lr", 1, 0, O_LR}, {"warmup", 1, 0, O_WARM},
        {"weight_decay", 1, 0, O_WD}, {"grad_clip", 1, 0, O_CLIP}, {"seed", 1, 0, O_SEED},
        {"threads", 1, 0, O_THREADS}, {"sample_tokens", 1, 0, O_SAMPLE}, {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    int c;
    int64_t tmp;
    bool ok = true;
    opterr = 0;
    while (ok && (c = getopt_long_only(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_DATA: o->data = optarg; break;
        case O_OUT: o->out_dir = optarg; break;
        case O_EPOCHS: ok = ex_parse_i64("--epochs", optarg, 1, &o->epochs); break;
        case O_BATCH: ok = ex_parse_i64("--batch_size", optarg, 1, &o->batch_size); break;
        case O_MAXLEN: ok = ex_parse_i64("--max_len", optarg, 2, &o->max_len); break;
        case O_LR: ok = ex_parse_f64("--lr", optarg, 0, 10, &o->lr); break;
        case O_WARM: ok = ex_parse_i64("--warmup", optarg, 0, &o->warmup); break;
        case O_WD: ok = ex_parse_f64("--weight_decay", optarg, 0, 10, &o->weight_decay); break;
        case O_CLIP: ok = ex_parse_f64("--grad_clip", optarg, 0, 1e9, &o->grad_clip); break;
        case O_SEED: ok = ex_parse_i64("--seed", optarg, 0, &tmp); o->seed = (uint64_t)tmp; break;
        case O_THREADS: ok = ex_parse_i64("--threads", optarg, 0, &tmp); o->threads = (int)tmp; break;
        case O_SAMPLE: ok = ex_parse_i64("--sample_tokens", optarg, 0, &o->sample_tokens); break;
        case O_HELP: usage(stdout); return 1;
        default:
            fprintf(stderr, PROG ": unknown or incomplete option %s (see --help)\n", argv[optind - 1]);
            return -1;
        }
    }
    if (!ok) return -1;
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument %s (see --help)\n", argv[optind]);
        return -1;
    }
    if (!o->model) {
        fprintf(stderr, PROG ": --model DIR is required (see --help)\n");
        return -1;
    }
    return 0;
}

/* ---- tokenizer ----------------------------------------------------------------- */

typedef struct tokenizer {
    ct_bpe *bpe; /* NULL: one token per byte (a 256-token model) */
    int64_t eos; /* -1: none */
} tokenizer;

/* Appends the tokens of n bytes of text to *ids (grown with realloc); false + error. */
static bool encode(tokenizer *tk, const char *text, size_t n, uint32_t **ids, size_t *len, size_t *cap)
{
    if (tk->bpe) {
        uint32_t *tmp = NULL;
        size_t tcap = 0;
        int64_t k = ct_bpe_encode(tk->bpe, text, n, &tmp, &tcap);
        if (k < 0) return false;
        if (*len + (size_t)k > *cap) {
            *cap = (*len + (size_t)k) * 2 + 16;
            uint32_t *g = realloc(*ids, *cap * sizeof **ids);
            if (!g) {
                free(tmp);
                ct_error_set(CT_ERR_NOMEM, PROG ": out of memory");
                return false;
            }
            *ids = g;
        }
        if (k) memcpy(*ids + *len, tmp, (size_t)k * sizeof *tmp);
        *len += (size_t)k;
        free(tmp);
        return true;
    }
    if (*len + n > *cap) {
        *cap = (*len + n) * 2 + 16;
        uint32_t *g = realloc(*ids, *cap * sizeof **ids);
        if (!g) {
            ct_error_set(CT_ERR_NOMEM, PROG ": out of memory");
            return false;
        }
        *ids = g;
    }
    for (size_t i = 0; i < n; i++) (*ids)[(*len)++] = (unsigned char)text[i];
    return true;
}

/* ---- the pairs ----------------------------------------------------------------- */

/* One pair as a token sequence: ids[0..len), the first n_prompt of them the prompt. */
typedef struct pair {
    uint32_t *ids;
    size_t len, n_prompt;
} pair;

typedef struct pairs {
    pair *p;
    int64_t n;
} pairs;

static void pairs_free(pairs *ps)
{
    for (int64_t i = 0; i < ps->n; i++) free(ps->p[i].ids);
    free(ps->p);
    ps->p = NULL;
    ps->n = 0;
}

/* Parses the data file into pairs (see the top of the file); false after a message
 * naming the block that does not fit. */
static bool read_pairs(const char *path, tokenizer *tk, pairs *out)
{
    size_t size;
    char *text = ex_read_file(path, &size);
    if (!text) return false;
    *out = (pairs){0};
    int64_t cap = 0, block = 0;
    bool ok = true;
    char *s = text;
    while (ok && *s) {
        while (*s == '\n' || *s == '\r' || *s == ' ' || *s == '\t') s++; /* blank lines between blocks */
        if (!*s) break;
        block++;
        /* the block ends at the first blank line after its answer mark */
        char *a = strstr(s, "\n" A_MARK);
        char *end = a ? strstr(a + 1, "\n\n") : NULL;
        if (!end) end = s + strlen(s);
        if (strncmp(s, Q_MARK, strlen(Q_MARK)) || !a || a > end) {
            fprintf(stderr, PROG ": %s: block %lld does not start with \"" Q_MARK "\" or has no line starting "
                            "with \"" A_MARK "\"\n", path, (long long)block);
            ok = false;
            break;
        }
        size_t n_prompt_bytes = (size_t)(a + 1 + strlen(A_MARK) - s);
        char *ans = s + n_prompt_bytes, *ans_end = end;
        while (ans_end > ans && (ans_end[-1] == '\n' || ans_end[-1] == '\r' || ans_end[-1] == ' ' ||
                                 ans_end[-1] == '\t'))
            ans_end--;
        if (ans_end == ans) {
            fprintf(stderr, PROG ": %s: block %lld has an empty answer\n", path, (long long)block);
            ok = false;
            break;
        }
        pair p = {0};
        size_t pcap = 0;
        ok = encode(tk, s, n_prompt_bytes, &p.ids, &p.len, &pcap);
        p.n_prompt = p.len;
        /* the answer: its text, "\n", then end-of-text when the tokenizer has one */
        if (ok) ok = encode(tk, ans, (size_t)(ans_end - ans), &p.ids, &p.len, &pcap);
        if (ok) ok = encode(tk, "\n", 1, &p.ids, &p.len, &pcap);
        if (ok && tk->eos >= 0) {
            uint32_t e = (uint32_t)tk->eos;
            if (p.len + 1 > pcap) {
                uint32_t *g = realloc(p.ids, (p.len + 1) * sizeof *g);
                if (g) p.ids = g;
                else ok = false;
            }
            if (ok) p.ids[p.len++] = e;
        }
        if (!ok) {
            fprintf(stderr, PROG ": %s: block %lld: %s\n", path, (long long)block, ct_last_error());
            free(p.ids);
            break;
        }
        if (out->n == cap) {
            cap = cap ? cap * 2 : 16;
            pair *g = realloc(out->p, (size_t)cap * sizeof *g);
            if (!g) {
                free(p.ids);
                fprintf(stderr, PROG ": out of memory\n");
                ok = false;
                break;
            }
            out->p = g;
        }
        out->p[out->n++] = p;
        s = end;
    }
    free(text);
    if (ok && out->n == 0) {
        fprintf(stderr, PROG ": %s holds no \"" Q_MARK "\" blocks\n", path);
        ok = false;
    }
    if (!ok) pairs_free(out);
    return ok;
}

/* The pairs as a dataset: item i = x (T,) the sequence without its last token, padded
 * with pad; y (T,) the next tokens, -1 where the next token is the prompt's or padding:
 *   y[t] = ids[t + 1] if n_prompt <= t + 1 < len, else -1. */
typedef struct qa_dataset {
    ct_dataset base;
    const pairs *ps;
    int64_t T, pad;
} qa_dataset;

static int64_t qa_len(const ct_dataset *ds) { return ((const qa_dataset *)ds)->ps->n; }

static ct_status qa_get(const ct_dataset *ds, int64_t i, ct_tensor *const *out, int64_t row)
{
    const qa_dataset *q = (const qa_dataset *)ds;
    const pair *p = &q->ps->p[i];
    int64_t *x = ct_dataset_row(out[0], row), *y = ct_dataset_row(out[1], row);
    int64_t len = (int64_t)p->len < q->T + 1 ? (int64_t)p->len : q->T + 1; /* cut to T + 1 tokens */
    for (int64_t t = 0; t < q->T; t++) {
        x[t] = t < len ? (int64_t)p->ids[t] : q->pad;
        y[t] = t + 1 < len && t + 1 >= (int64_t)p->n_prompt ? (int64_t)p->ids[t + 1] : -1;
    }
    return CT_OK;
}

static void qa_free(ct_dataset *ds) { free(ds); } /* the pairs are main's */

static const ct_dataset_vtable QA_VTABLE = {"question/answer", qa_len, qa_get, qa_free};

/* ---- model ------------------------------------------------------------------------ */

static ct_tensor *lm_loss(void *lm, ct_tensor *x, ct_tensor *y)
{
    return ct_cross_entropy(ct_lm_forward(lm, x, NULL), y, -1);
}

/* The greedy answer to the first pair's prompt. */
static void sample(ct_lm *lm, tokenizer *tk, const pair *p, int64_t max_new)
{
    int64_t n = (int64_t)p->n_prompt;
    if (n + max_new > lm->max_positions) max_new = lm->max_positions - n;
    if (max_new < 1) return;
    int64_t *prompt = malloc((size_t)n * sizeof *prompt), *out = malloc((size_t)(n + max_new) * sizeof *out);
    uint32_t *u = malloc((size_t)(n + max_new) * sizeof *u);
    char *text = NULL;
    ct_sample_config sc = ct_sample_config_default();
    sc.max_new_tokens = max_new;
    sc.greedy = true;
    if (tk->eos >= 0) { /* the answers' end, also where the model's config names no eos */
        sc.stop_ids = &tk->eos;
        sc.n_stop_ids = 1;
    }
    int64_t got = -1;
    for (int64_t i = 0; prompt && i < n; i++) prompt[i] = p->ids[i];
    if (prompt && out && u) got = ct_generate(lm, prompt, n, &sc, NULL, NULL, out);
    if (got >= 0) {
        int64_t k = 0;
        for (int64_t i = 0; i < n + got; i++)
            if (out[i] != tk->eos) u[k++] = (uint32_t)out[i];
        int64_t len = tk->bpe ? ct_bpe_decode(tk->bpe, u, (size_t)k, NULL, 0) : k;
        text = len >= 0 ? malloc((size_t)len + 1) : NULL;
        if (text && tk->bpe) {
            len = ct_bpe_decode(tk->bpe, u, (size_t)k, text, (size_t)len + 1);
        } else if (text) {
            for (int64_t i = 0; i < k; i++) text[i] = (char)u[i];
            text[k] = '\0';
        }
        if (text && len >= 0) printf("\n--- greedy answer to the first question ---\n%s\n--------------\n", text);
        else got = -1;
    }
    if (got < 0) fprintf(stderr, PROG ": sampling failed: %s\n", ct_last_error());
    free(prompt);
    free(out);
    free(u);
    free(text);
}

/* Copies dir/tokenizer.json to out_dir, when there is one. */
static bool copy_tokenizer(const char *from_dir, const char *to_dir)
{
    char from[1200], to[1200];
    snprintf(from, sizeof from, "%s/tokenizer.json", from_dir);
    snprintf(to, sizeof to, "%s/tokenizer.json", to_dir);
    if (access(from, R_OK) != 0) return true;
    size_t len;
    char *json = ex_read_file(from, &len);
    FILE *f = json ? fopen(to, "wb") : NULL;
    bool ok = f && fwrite(json, 1, len, f) == len;
    if (f && fclose(f)) ok = false;
    if (json && !ok) fprintf(stderr, PROG ": cannot write %s: %s\n", to, strerror(errno));
    free(json);
    return ok;
}

/* ---- main -------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    ex_set_program(PROG);
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    if (o.threads) ct_set_num_threads(o.threads);
    ct_accelerator *acc = ct_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        return 1;
    }
    bool main_rank = ct_accelerator_is_main_process(acc);
    int world = ct_accelerator_num_processes(acc);
    int status = 1;
    tokenizer tk = {NULL, -1};
    pairs ps = {0};
    qa_dataset *ds = NULL;
    ct_loader *train = NULL, *all = NULL;
    ct_optimizer *opt = NULL;
    ct_scheduler *sched = NULL;
    ct_lm *lm = ct_lm_from_pretrained(o.model), *whole = NULL;
    if (!lm) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    char tok_path[1200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o.model);
    if (access(tok_path, R_OK) == 0) {
        if (!(tk.bpe = ct_bpe_load(tok_path))) {
            fprintf(stderr, PROG ": %s\n", ct_last_error());
            goto out;
        }
        if (ct_bpe_vocab_size(tk.bpe) > lm->vocab_size) {
            fprintf(stderr, PROG ": %s has %lld tokens, more than the model's vocab_size %lld\n", tok_path,
                    (long long)ct_bpe_vocab_size(tk.bpe), (long long)lm->vocab_size);
            goto out;
        }
        tk.eos = lm->eos_token_id >= 0 ? lm->eos_token_id : ct_bpe_eos_id(tk.bpe);
    } else if (lm->vocab_size != 256) {
        fprintf(stderr, PROG ": %s: no tokenizer.json, and the model's %lld tokens are not bytes\n", o.model,
                (long long)lm->vocab_size);
        goto out;
    }
    if (!read_pairs(o.data, &tk, &ps)) goto out;
    /* T: the longest sequence less one, within --max_len and the model's positions */
    int64_t T = 1, total = 0, counted = 0;
    for (int64_t i = 0; i < ps.n; i++)
        if ((int64_t)ps.p[i].len - 1 > T) T = (int64_t)ps.p[i].len - 1;
    if (T > o.max_len) T = o.max_len;
    if (T > lm->max_positions) T = lm->max_positions;
    for (int64_t i = 0; i < ps.n; i++) {
        int64_t len = (int64_t)ps.p[i].len < T + 1 ? (int64_t)ps.p[i].len : T + 1;
        total += len;
        if (len > (int64_t)ps.p[i].n_prompt) counted += len - (int64_t)ps.p[i].n_prompt;
    }
    if (counted == 0) {
        fprintf(stderr, PROG ": every prompt is longer than %lld tokens: no answer token is left to learn\n",
                (long long)T);
        goto out;
    }
    ds = calloc(1, sizeof *ds);
    if (!ds) goto out;
    *ds = (qa_dataset){.ps = &ps, .T = T, .pad = lm->pad_token_id >= 0 ? lm->pad_token_id : 0};
    ct_dataset_slot slots[2] = {{CT_DTYPE_I64, 1, {T}}, {CT_DTYPE_I64, 1, {T}}};
    if (ct_dataset_init(&ds->base, &QA_VTABLE, 2, slots)) {
        free(ds);
        ds = NULL;
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    train = ct_loader_new(&ds->base, &(ct_loader_config){.batch_size = o.batch_size, .shuffle = true, .seed = o.seed});
    all = train ? ct_loader_new(&ds->base, &(ct_loader_config){.batch_size = o.batch_size, .no_prefetch = true}) : NULL;
    int64_t per_epoch = (ps.n + o.batch_size * world - 1) / (o.batch_size * world);
    int64_t steps = per_epoch * o.epochs;
    opt = all ? ex_make_adamw(lm->module, &(ct_adam_config){.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95,
                                                            .weight_decay = o.weight_decay})
              : NULL;
    sched = opt ? ct_scheduler_new(opt, &(ct_lr_schedule){.decay = CT_LR_COSINE, .max_lr = o.lr, .min_lr = o.lr / 10,
                                                          .warmup_steps = o.warmup,
                                                          .total_steps = steps > o.warmup ? steps : o.warmup + 1})
                : NULL;
    if (!sched || ct_accelerator_prepare(acc, lm->module, opt, train, sched) ||
        ct_loader_set_device(all, ct_accelerator_device(acc))) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    char devname[32];
    ct_accelerator_print(acc,
                         "%s model from %s: %lld parameters, vocabulary %lld; %lld pairs, %lld tokens of which %lld "
                         "answer tokens are counted (prompts excluded), sequences of %lld; %d process(es) on %s, "
                         "batch %lld per process, %lld steps\n",
                         lm->ops->model_type, o.model, (long long)ct_module_num_params(lm->module),
                         (long long)lm->vocab_size, (long long)ps.n, (long long)total, (long long)counted, (long long)T,
                         world, ct_device_str(ct_accelerator_device(acc), devname, sizeof devname),
                         (long long)o.batch_size, (long long)steps);
    /* replicated, rank 0 measures alone; sharded, a forward needs every rank */
    const bool sharded = ct_accelerator_forward_needs_all_ranks(acc);
    double before = NAN, after = NAN, t0 = ex_now();
    if (main_rank || sharded) before = ex_evaluate(lm->module, lm_loss, lm, all, ps.n);
    ct_accelerator_print(acc, "answer loss before: %.4f\n", before);
    bool failed = false;
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < o.epochs && !failed; epoch++) {
        double sum = 0;
        int64_t nb = 0;
        for (;;) {
            bool end = false;
            CT_FRAME {
                ct_tensor *x, *y;
                ct_loader_result r = ct_loader_next(train, &x, &y);
                if (r == CT_LOADER_END) {
                    end = true;
                } else {
                    ct_tensor *loss = r == CT_LOADER_BATCH ? lm_loss(lm, x, y) : NULL;
                    double v = NAN;
                    failed = !ex_train_step(acc, opt, sched, loss, o.grad_clip, &v);
                    /* a batch of prompts cut away entirely has no counted token: NaN, no signal */
                    if (!isnan(v)) sum += v, nb++;
                    step++;
                }
            }
            if (end || failed) break;
        }
        if (!failed)
            ct_accelerator_print(acc, "epoch %lld: mean answer loss %.4f over %lld batches (step %lld)\n",
                                 (long long)epoch + 1, nb ? sum / (double)nb : NAN, (long long)nb, (long long)step);
    }
    if (failed) {
        fprintf(stderr, PROG " (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
        goto out;
    }
    if (main_rank || sharded) after = ex_evaluate(lm->module, lm_loss, lm, all, ps.n);
    ct_accelerator_print(acc, "answer loss after: %.4f (%.4f before; %lld steps in %.1f s)\n", after, before,
                         (long long)step, ex_now() - t0);
    /* the whole model: the prepared one, or under tensor parallelism a copy gathered from
     * the shards (the Accelerator's), wrapped as a causal LM to save and sample */
    ct_module *whole_m = ct_accelerator_unwrap_model(acc, lm->module);
    if (whole_m && whole_m != lm->module)
        whole = !strcmp(whole_m->type, "GPT") ? ct_gpt_as_lm((ct_gpt *)whole_m, false)
                                              : ct_llama_as_lm((ct_llama *)whole_m, false);
    if (!whole_m || (whole_m != lm->module && !whole)) {
        fprintf(stderr, PROG " (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
        goto out;
    }
    ct_lm *out_lm = whole ? whole : lm;
    if (!main_rank) {
        status = 0;
        goto out;
    }
    if (!ex_make_dirs(o.out_dir)) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", o.out_dir, strerror(errno));
        goto out;
    }
    if (ct_lm_save_pretrained(out_lm, o.out_dir)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    if (!copy_tokenizer(o.model, o.out_dir)) goto out;
    printf("model: %s (%s in Hugging Face's layout%s)\n", o.out_dir, lm->ops->model_type,
           tk.bpe ? ", with tokenizer.json" : "");
    if (o.sample_tokens > 0) sample(out_lm, &tk, &ps.p[0], o.sample_tokens);
    status = 0;
out:
    ct_accelerator_free(acc); /* first: it unhooks the optimizer and the parameters */
    ct_scheduler_free(sched);
    ct_optimizer_free(opt);
    ct_loader_free(all);
    ct_loader_free(train);
    ct_dataset_free(ds ? &ds->base : NULL);
    pairs_free(&ps);
    ct_bpe_free(tk.bpe);
    ct_lm_free(whole);
    ct_lm_free(lm);
    ct_frame_reset_root();
    return status;
}
