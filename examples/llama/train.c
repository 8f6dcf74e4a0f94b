/* Pretrains a small Llama-family model (RMSNorm, rotary positions, SwiGLU, grouped-query
 * attention; nn/llama.h) with a byte-level BPE tokenizer of its own.
 *
 * Default data: the English text of Debian's fortunes package (all the fortune files,
 * concatenated); any text file can be given with --data. A BPE tokenizer is trained on
 * that text (data/bpe_train.h, vocabulary --vocab_size, <|endoftext|> its one special
 * token), or --tokenizer FILE reuses a tokenizer.json; the text is encoded into a token
 * file and the last --val_fraction of it is held out for validation. The loop is the
 * GPT example's (examples/gpt/train.c): forward, loss, backward, clip, AdamW step with
 * warmup + cosine schedule, all through the Accelerator, so `ctrain launch` runs it
 * under any strategy (DDP, FSDP with --fsdp_transformer_layer_cls_to_wrap
 * LlamaDecoderLayer, ZeRO) and precision.
 *
 * Writes into --out_dir: tokenizer.json, loss.csv (step, train loss, val loss, lr,
 * tokens/s), loss.png (when gnuplot is installed), config.json + model.safetensors in
 * Hugging Face's LlamaForCausalLM layout (so `ctrain generate --model DIR` and
 * transformers read the directory), and prints a text sample at the end. --save_every N
 * checkpoints the whole training state under <project_dir>/checkpoints/checkpoint_<i>;
 * --resume auto continues the latest. --help lists every option.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "autograd/ops.h"
#include "core/frame.h"
#include "core/threads.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/loader.h"
#include "data/token_dataset.h"
#include "examples/common/train_util.h"
#include "nn/generate.h"
#include "nn/hf_weights.h"
#include "nn/llama.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#define PROG "llama_train"

typedef struct options {
    const char *data, *out_dir, *tokenizer, *prompt;
    const char *project_dir, *resume; /* NULL: --out_dir; NULL: a fresh start */
    int64_t save_every, total_limit;
    int64_t vocab_size, block_size, hidden, n_layer, n_head, n_kv_head, intermediate;
    int64_t batch_size, steps, warmup, eval_every, eval_batches, sample_tokens, top_k;
    double lr, min_lr, beta1, beta2, weight_decay, grad_clip, val_fraction, temperature, bucket_mb, rope_theta;
    uint64_t seed;
    int threads;
    bool tie;
} options;

static const options defaults = {
    .out_dir = "build/llama", .prompt = "The",
    .vocab_size = 2048, .block_size = 256, .hidden = 256, .n_layer = 4, .n_head = 4, .n_kv_head = 2,
    .intermediate = 688, .batch_size = 8, .steps = 300, .warmup = 20, .eval_every = 50, .eval_batches = 8,
    .sample_tokens = 80, .top_k = 40, .lr = 2e-3, .min_lr = 2e-4, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1,
    .grad_clip = 1.0, .val_fraction = 0.1, .temperature = 0.8, .bucket_mb = 4, .rope_theta = 10000, .seed = 1337,
};

static void usage(FILE *f)
{
    const options *d = &defaults;
    fprintf(f,
            "usage: llama_train [options]\n"
            "Trains a BPE tokenizer and a small Llama on a text file, saves both in Hugging Face's layout\n"
            "and samples from the model.\n\n"
            "data and output\n"
            "  --data FILE          text to train on (default: the text of Debian's fortunes package)\n"
            "  --tokenizer FILE     a tokenizer.json to use instead of training one\n"
            "  --vocab_size N       vocabulary of the trained tokenizer, with <|endoftext|> (default %lld)\n"
            "  --out_dir DIR        where tokenizer.json, loss.csv, loss.png and the model go (default %s)\n"
            "  --val_fraction F     last fraction of the tokens held out for validation (default %g)\n"
            "model\n"
            "  --block_size N       context length = max_position_embeddings (default %lld)\n"
            "  --hidden N           hidden_size (default %lld)\n"
            "  --n_layer N          decoder layers (default %lld)\n"
            "  --n_head N           attention heads; hidden / n_head is the head size, even (default %lld)\n"
            "  --n_kv_head N        key/value heads, dividing n_head (default %lld)\n"
            "  --intermediate N     SwiGLU width (default %lld)\n"
            "  --rope_theta T       rotary base (default %g)\n"
            "  --tie                tie lm_head to the embedding (default: separate)\n"
            "training\n"
            "  --batch_size N       sequences per step and process (default %lld)\n"
            "  --steps N            optimizer steps (default %lld)\n"
            "  --lr LR              peak learning rate (default %g)\n"
            "  --min_lr LR          cosine floor (default %g)\n"
            "  --warmup N           linear warmup steps (default %lld)\n"
            "  --beta1 B            AdamW first-moment decay (default %g)\n"
            "  --beta2 B            AdamW second-moment decay (default %g)\n"
            "  --weight_decay W     AdamW decay for matrices; norms get none (default %g)\n"
            "  --grad_clip C        clip the global gradient norm to C, 0 = off (default %g)\n"
            "  --eval_every N       validate every N steps (default %lld)\n"
            "  --eval_batches N     batches per validation (default %lld)\n"
            "  --seed S             seeds weights, shuffling and sampling (default %llu)\n"
            "  --threads N          threads (default: OMP_NUM_THREADS or all cores)\n"
            "  --bucket_mb MB       DDP gradient bucket size under ctrain launch (default %g)\n"
            "checkpoints\n"
            "  --project_dir DIR    checkpoints go to DIR/checkpoints/checkpoint_<i> (default: --out_dir)\n"
            "  --save_every N       save the training state after every N-th step, 0 = never (default 0)\n"
            "  --total_limit K      keep the newest K checkpoints, 0 = all (default 0)\n"
            "  --resume auto|DIR    continue from the latest checkpoint of --project_dir (auto) or from\n"
            "                       DIR; the other options must match the saved run's\n"
            "sampling\n"
            "  --prompt TEXT        start of the sample (default \"%s\")\n"
            "  --sample_tokens N    tokens to generate at the end, 0 = none (default %lld)\n"
            "  --temperature T      (default %g)\n"
            "  --top_k K            0 = no filter (default %lld)\n"
            "  --help               this text\n",
            (long long)d->vocab_size, d->out_dir, d->val_fraction, (long long)d->block_size, (long long)d->hidden,
            (long long)d->n_layer, (long long)d->n_head, (long long)d->n_kv_head, (long long)d->intermediate,
            d->rope_theta, (long long)d->batch_size, (long long)d->steps, d->lr, d->min_lr, (long long)d->warmup,
            d->beta1, d->beta2, d->weight_decay, d->grad_clip, (long long)d->eval_every, (long long)d->eval_batches,
            (unsigned long long)d->seed, d->bucket_mb, d->prompt, (long long)d->sample_tokens, d->temperature,
            (long long)d->top_k);
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = defaults;
    enum { O_DATA = 256, O_TOK, O_VOCAB, O_OUT, O_VAL, O_BLOCK, O_HIDDEN, O_LAYER, O_HEAD, O_KV, O_INTER, O_THETA,
           O_TIE, O_BATCH, O_STEPS, O_LR, O_MINLR, O_WARM, O_B1, O_B2, O_WD, O_CLIP, O_EVERY, O_EVALB, O_SEED,
           O_THREADS, O_BUCKET, O_PROJECT, O_SAVE, O_LIMIT, O_RESUME, O_PROMPT, O_SAMPLE, O_TEMP, O_TOPK, O_HELP };
    static const struct option opts[] = {
        {"data", 1, 0, O_DATA}, {"tokenizer", 1, 0, O_TOK}, {"vocab_size", 1, 0, O_VOCAB},
        {"out_dir", 1, 0, O_OUT}, {"val_fraction", 1, 0, O_VAL}, {"block_size", 1, 0, O_BLOCK},
        {"hidden", 1, 0, O_HIDDEN}, {"n_layer", 1, 0, O_LAYER}, {"n_head", 1, 0, O_HEAD},
        {"n_kv_head", 1, 0, O_KV}, {"intermediate", 1, 0, O_INTER}, {"rope_theta", 1, 0, O_THETA},
        {"tie", 0, 0, O_TIE}, {"batch_size", 1, 0, O_BATCH}, {"steps", 1, 0, O_STEPS}, {"lr", 1, 0, O_LR},
        {"min_lr", 1, 0, O_MINLR}, {"warmup", 1, 0, O_WARM}, {"beta1", 1, 0, O_B1}, {"beta2", 1, 0, O_B2},
        {"weight_decay", 1, 0, O_WD}, {"grad_clip", 1, 0, O_CLIP}, {"eval_every", 1, 0, O_EVERY},
        {"eval_batches", 1, 0, O_EVALB}, {"seed", 1, 0, O_SEED}, {"threads", 1, 0, O_THREADS},
        {"bucket_mb", 1, 0, O_BUCKET}, {"project_dir", 1, 0, O_PROJECT}, {"save_every", 1, 0, O_SAVE},
        {"total_limit", 1, 0, O_LIMIT}, {"resume", 1, 0, O_RESUME}, {"prompt", 1, 0, O_PROMPT},
        {"sample_tokens", 1, 0, O_SAMPLE}, {"temperature", 1, 0, O_TEMP}, {"top_k", 1, 0, O_TOPK},
        {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    int c;
    int64_t tmp;
    bool ok = true;
    opterr = 0;
    while (ok && (c = getopt_long_only(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_DATA: o->data = optarg; break;
        case O_TOK: o->tokenizer = optarg; break;
        case O_VOCAB: ok = ex_parse_i64("--vocab_size", optarg, 257, &o->vocab_size); break;
        case O_OUT: o->out_dir = optarg; break;
        case O_VAL: ok = ex_parse_f64("--val_fraction", optarg, 0.001, 0.5, &o->val_fraction); break;
        case O_BLOCK: ok = ex_parse_i64("--block_size", optarg, 2, &o->block_size); break;
        case O_HIDDEN: ok = ex_parse_i64("--hidden", optarg, 2, &o->hidden); break;
        case O_LAYER: ok = ex_parse_i64("--n_layer", optarg, 1, &o->n_layer); break;
        case O_HEAD: ok = ex_parse_i64("--n_head", optarg, 1, &o->n_head); break;
        case O_KV: ok = ex_parse_i64("--n_kv_head", optarg, 1, &o->n_kv_head); break;
        case O_INTER: ok = ex_parse_i64("--intermediate", optarg, 1, &o->intermediate); break;
        case O_THETA: ok = ex_parse_f64("--rope_theta", optarg, 1, 1e9, &o->rope_theta); break;
        case O_TIE: o->tie = true; break;
        case O_BATCH: ok = ex_parse_i64("--batch_size", optarg, 1, &o->batch_size); break;
        case O_STEPS: ok = ex_parse_i64("--steps", optarg, 0, &o->steps); break;
        case O_LR: ok = ex_parse_f64("--lr", optarg, 0, 10, &o->lr); break;
        case O_MINLR: ok = ex_parse_f64("--min_lr", optarg, 0, 10, &o->min_lr); break;
        case O_WARM: ok = ex_parse_i64("--warmup", optarg, 0, &o->warmup); break;
        case O_B1: ok = ex_parse_f64("--beta1", optarg, 1e-6, 0.999999, &o->beta1); break;
        case O_B2: ok = ex_parse_f64("--beta2", optarg, 1e-6, 0.999999, &o->beta2); break;
        case O_WD: ok = ex_parse_f64("--weight_decay", optarg, 0, 10, &o->weight_decay); break;
        case O_CLIP: ok = ex_parse_f64("--grad_clip", optarg, 0, 1e9, &o->grad_clip); break;
        case O_EVERY: ok = ex_parse_i64("--eval_every", optarg, 1, &o->eval_every); break;
        case O_EVALB: ok = ex_parse_i64("--eval_batches", optarg, 1, &o->eval_batches); break;
        case O_SEED: ok = ex_parse_i64("--seed", optarg, 0, &tmp); o->seed = (uint64_t)tmp; break;
        case O_THREADS: ok = ex_parse_i64("--threads", optarg, 0, &tmp); o->threads = (int)tmp; break;
        case O_BUCKET: ok = ex_parse_f64("--bucket_mb", optarg, 1e-3, 1e4, &o->bucket_mb); break;
        case O_PROJECT: o->project_dir = optarg; break;
        case O_SAVE: ok = ex_parse_i64("--save_every", optarg, 0, &o->save_every); break;
        case O_LIMIT: ok = ex_parse_i64("--total_limit", optarg, 0, &o->total_limit); break;
        case O_RESUME: o->resume = optarg; break;
        case O_PROMPT: o->prompt = optarg; break;
        case O_SAMPLE: ok = ex_parse_i64("--sample_tokens", optarg, 0, &o->sample_tokens); break;
        case O_TEMP: ok = ex_parse_f64("--temperature", optarg, 0.01, 100, &o->temperature); break;
        case O_TOPK: ok = ex_parse_i64("--top_k", optarg, 0, &o->top_k); break;
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
    if (o->hidden % o->n_head || (o->hidden / o->n_head) % 2) {
        fprintf(stderr, PROG ": --hidden %lld / --n_head %lld must be a whole, even head size (rotary pairs)\n",
                (long long)o->hidden, (long long)o->n_head);
        return -1;
    }
    if (o->n_head % o->n_kv_head) {
        fprintf(stderr, PROG ": --n_kv_head %lld does not divide --n_head %lld\n", (long long)o->n_kv_head,
                (long long)o->n_head);
        return -1;
    }
    if (o->total_limit > 1000000) {
        fprintf(stderr, PROG ": --total_limit %lld: expected at most 1000000 (0 keeps every checkpoint)\n",
                (long long)o->total_limit);
        return -1;
    }
    if (o->resume && !*o->resume) {
        fprintf(stderr, PROG ": --resume needs 'auto' or a checkpoint directory\n");
        return -1;
    }
    if (o->min_lr > o->lr) {
        fprintf(stderr, PROG ": --min_lr %g is above --lr %g\n", o->min_lr, o->lr);
        return -1;
    }
    return 0;
}

/* ---- data ------------------------------------------------------------------------ */

static bool write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, n, f) == n;
    if (f && fclose(f)) ok = false;
    if (!ok) fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
    return ok;
}

/* Rank 0: the training text (--data, or the fortunes copied to out_dir/corpus.txt),
 * out_dir/tokenizer.json (trained, copied from --tokenizer, or kept from the run a
 * resume continues), and out_dir/tokens.bin. Returns the number of tokens, -1 after a
 * message. */
static int64_t prepare_data(const options *o, const char *corpus_path, const char *tok_path,
                            const char *token_path)
{
    const char *text_path = o->data;
    if (!text_path) {
        size_t len;
        char *text = ex_read_fortunes(&len);
        bool ok = text && write_file(corpus_path, text, len);
        free(text);
        if (!ok) return -1;
        text_path = corpus_path;
    }
    if (o->tokenizer) {
        size_t len;
        char *json = ex_read_file(o->tokenizer, &len);
        bool ok = json && write_file(tok_path, json, len);
        free(json);
        if (!ok) return -1;
    } else if (!(o->resume && access(tok_path, R_OK) == 0)) {
        /* <|endoftext|> gets id 0; the model's bos and eos */
        static const char *const specials[] = {"<|endoftext|>"};
        double t = ex_now();
        if (ct_bpe_train(&(ct_bpe_train_config){.vocab_size = o->vocab_size, .special_tokens = specials,
                                                 .nspecial = 1},
                         &text_path, 1, tok_path)) {
            fprintf(stderr, PROG ": training the tokenizer: %s\n", ct_last_error());
            return -1;
        }
        printf("tokenizer: trained on %s in %.1f s -> %s\n", text_path, ex_now() - t, tok_path);
    }
    ct_bpe *bpe = ct_bpe_load(tok_path);
    int64_t ntok = -1;
    if (!bpe || ct_bpe_encode_files(bpe, &text_path, 1, -1, token_path, &ntok)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        ntok = -1;
    }
    ct_bpe_free(bpe);
    return ntok;
}

static ct_tensor *llama_loss(void *m, ct_tensor *x, ct_tensor *y) { return ct_llama_loss(m, x, y); }

/* Prints the continuation of prompt as ct_generate produces it. */
static void sample(ct_llama *model, ct_bpe *bpe, const options *o)
{
    uint32_t *ids = NULL;
    size_t cap = 0;
    int64_t n = ct_bpe_encode(bpe, o->prompt, strlen(o->prompt), &ids, &cap);
    if (n < 1) { /* an empty prompt starts from <|endoftext|> */
        n = 1;
        if (!ids) ids = malloc(sizeof *ids);
        if (ids) ids[0] = (uint32_t)(ct_bpe_eos_id(bpe) >= 0 ? ct_bpe_eos_id(bpe) : 0);
    }
    int64_t max_new = o->sample_tokens;
    if (n >= o->block_size) n = o->block_size - 1;
    if (n + max_new > o->block_size) max_new = o->block_size - n;
    int64_t *prompt = malloc((size_t)(n + max_new) * sizeof *prompt), *out = malloc((size_t)(n + max_new) * sizeof *out);
    ct_lm *lm = ct_llama_as_lm(model, false);
    ct_sample_config sc = ct_sample_config_default();
    sc.max_new_tokens = max_new;
    sc.temperature = o->temperature;
    sc.top_k = o->top_k;
    sc.seed = o->seed;
    int64_t got = -1;
    for (int64_t i = 0; ids && prompt && i < n; i++) prompt[i] = ids[i];
    if (ids && prompt && out && lm) got = ct_generate(lm, prompt, n, &sc, NULL, NULL, out);
    if (got < 0) {
        fprintf(stderr, PROG ": sampling failed: %s\n", ct_last_error());
    } else {
        uint32_t *u = malloc((size_t)(n + got) * sizeof *u);
        for (int64_t i = 0; u && i < n + got; i++) u[i] = (uint32_t)out[i];
        int64_t len = u ? ct_bpe_decode(bpe, u, (size_t)(n + got), NULL, 0) : -1;
        char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
        if (text && ct_bpe_decode(bpe, u, (size_t)(n + got), text, (size_t)len + 1) >= 0)
            printf("\n--- sample (%lld tokens) ---\n%s\n--------------\n", (long long)got, text);
        else fprintf(stderr, PROG ": decoding the sample failed: %s\n", ct_last_error());
        free(text);
        free(u);
    }
    ct_lm_free(lm);
    free(prompt);
    free(out);
    free(ids);
}

/* ---- main -------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    ex_set_program(PROG);
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    if (o.threads) ct_set_num_threads(o.threads);
    const char *project_dir = o.project_dir ? o.project_dir : o.out_dir;
    const char *bad_dir = !ex_make_dirs(o.out_dir) ? o.out_dir : !ex_make_dirs(project_dir) ? project_dir : NULL;
    if (bad_dir) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", bad_dir, strerror(errno));
        return 1;
    }
    char token_path[1200], csv_path[1200], tok_path[1200], corpus_path[1200];
    snprintf(token_path, sizeof token_path, "%s/tokens.bin", o.out_dir);
    snprintf(csv_path, sizeof csv_path, "%s/loss.csv", o.out_dir);
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o.out_dir);
    snprintf(corpus_path, sizeof corpus_path, "%s/corpus.txt", o.out_dir);
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){
        .ddp = {.bucket_cap_mb = o.bucket_mb},
        .project = {.project_dir = project_dir, .automatic_checkpoint_naming = true,
                    .total_limit = (int)o.total_limit}});
    if (!acc) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        return 1;
    }
    bool main_rank = ct_accelerator_is_main_process(acc);
    int world = ct_accelerator_num_processes(acc);
    /* rank 0 trains the tokenizer and writes the token file, the others then read them */
    int64_t ntok = -1;
    ct_bpe *bpe = NULL;
    CT_MAIN_PROCESS_FIRST(acc) {
        ct_token_file_info info;
        if (main_rank) ntok = prepare_data(&o, corpus_path, tok_path, token_path);
        else if (!ct_token_file_probe(token_path, CT_TOKENS_LLMC, &info)) ntok = info.ntokens;
        else fprintf(stderr, PROG ": %s\n", ct_last_error());
        if (ntok >= 0 && !(bpe = ct_bpe_load(tok_path))) {
            fprintf(stderr, PROG ": %s\n", ct_last_error());
            ntok = -1;
        }
    }
    if (ntok < 0) {
        ct_accelerator_free(acc);
        return 1;
    }
    int64_t vocab = ct_bpe_vocab_size(bpe), eos = ct_bpe_eos_id(bpe);
    int64_t nval = (int64_t)((double)ntok * o.val_fraction), split = ntok - nval;
    if (split < o.block_size + 1 || nval < o.block_size + 1) {
        fprintf(stderr, PROG ": %lld tokens of text are too few for --block_size %lld with --val_fraction %g\n",
                (long long)ntok, (long long)o.block_size, o.val_fraction);
        ct_bpe_free(bpe);
        ct_accelerator_free(acc);
        return 1;
    }
    ct_set_seed(o.seed);
    int status = 1;
    ct_llama *model = NULL;
    ct_dataset *train_ds = NULL, *val_ds = NULL;
    ct_loader *train = NULL, *val = NULL;
    ct_optimizer *opt = NULL;
    ct_scheduler *sched = NULL;
    FILE *csv = NULL;
    model = ct_llama_new(&(ct_llama_config){
        .vocab_size = vocab, .hidden_size = o.hidden, .intermediate_size = o.intermediate,
        .num_hidden_layers = o.n_layer, .num_attention_heads = o.n_head, .num_key_value_heads = o.n_kv_head,
        .max_position_embeddings = o.block_size, .rope_theta = o.rope_theta, .rms_norm_eps = 1e-5,
        .tie_word_embeddings = o.tie, .token_ids_set = true, .bos_token_id = eos, .eos_token_id = eos,
        .pad_token_id = -1});
    if (!model) fprintf(stderr, PROG ": %s\n", ct_last_error());
    /* training windows overlap (stride T/2) to see more contexts per epoch;
     * validation windows do not */
    train_ds = model ? ct_token_dataset_open(token_path, &(ct_token_dataset_config){
                                                             .block_size = o.block_size, .stride = o.block_size / 2 + 1,
                                                             .end = split, .vocab_size = vocab})
                     : NULL;
    val_ds = train_ds ? ct_token_dataset_open(token_path, &(ct_token_dataset_config){
                                                              .block_size = o.block_size, .begin = split,
                                                              .vocab_size = vocab})
                      : NULL;
    train = val_ds ? ct_loader_new(train_ds, &(ct_loader_config){.batch_size = o.batch_size, .shuffle = true,
                                                                 .seed = o.seed, .drop_last = true})
                   : NULL;
    val = train ? ct_loader_new(val_ds, &(ct_loader_config){.batch_size = o.batch_size, .no_prefetch = true}) : NULL;
    opt = val ? ex_make_adamw(&model->base, &(ct_adam_config){.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2,
                                                              .weight_decay = o.weight_decay})
              : NULL;
    sched = opt ? ct_scheduler_new(opt, &(ct_lr_schedule){.decay = CT_LR_COSINE, .max_lr = o.lr, .min_lr = o.min_lr,
                                                          .warmup_steps = o.warmup,
                                                          .total_steps = o.steps > o.warmup ? o.steps : o.warmup + 1})
                : NULL;
    /* the whole model's size: under tensor parallelism prepare leaves each rank its shards */
    const int64_t nparams = model ? ct_module_num_params(&model->base) : 0;
    if (!sched || ct_accelerator_prepare(acc, &model->base, opt, train, sched) ||
        ct_loader_set_device(val, ct_accelerator_device(acc))) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    ex_progress_state ps = {NAN, NAN};
    ct_checkpointable progress_ckpt = ex_progress_checkpointable("llama_train_progress", &ps);
    if (ct_accelerator_register_for_checkpointing(acc, &progress_ckpt)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    int64_t first = 1;
    if (o.resume) {
        if (ct_accelerator_load_state(acc, strcmp(o.resume, "auto") ? o.resume : NULL)) {
            fprintf(stderr, PROG " (rank %d): cannot resume from %s: %s\n", ct_accelerator_process_index(acc),
                    strcmp(o.resume, "auto") ? o.resume : "the latest checkpoint", ct_last_error());
            goto out;
        }
        first = ct_optimizer_step_count(opt) + 1;
        ct_accelerator_print(acc, "resumed from %s at step %lld\n", ct_accelerator_last_checkpoint(acc),
                             (long long)first - 1);
    }
    csv = main_rank ? ex_open_csv(csv_path, first) : NULL;
    if (main_rank && !csv) {
        fprintf(stderr, PROG ": %s: %s\n", csv_path, strerror(errno));
        goto out;
    }
    char devname[32];
    ct_accelerator_print(acc,
                         "Llama: %lld parameters, %lld layers, %lld heads (%lld key/value), hidden %lld, "
                         "intermediate %lld, block %lld, vocabulary %lld; %lld tokens (%lld train, %lld validation); "
                         "%d process(es) x %d threads on %s, batch %lld per process\n",
                         (long long)nparams, (long long)o.n_layer, (long long)o.n_head,
                         (long long)o.n_kv_head, (long long)o.hidden, (long long)o.intermediate,
                         (long long)o.block_size, (long long)vocab, (long long)ntok, (long long)split, (long long)nval,
                         world, ct_get_num_threads(), ct_device_str(ct_accelerator_device(acc), devname, sizeof devname),
                         (long long)o.batch_size);
    bool tty = main_rank && isatty(STDERR_FILENO) && isatty(STDOUT_FILENO);
    const bool sharded = ct_accelerator_forward_needs_all_ranks(acc);
    double t0 = ex_now();
    int64_t tokens_per_step = o.batch_size * o.block_size * world; /* over all ranks */
    bool failed = false;
    double first_val = NAN;
    if (first > o.steps)
        ct_accelerator_print(acc, "the checkpoint is at step %lld and --steps is %lld: nothing left to train\n",
                             (long long)first - 1, (long long)o.steps);
    for (int64_t step = first; step <= o.steps && !failed; step++) {
        double loss_v = NAN, ts = ex_now();
        CT_FRAME {
            ct_tensor *x, *y;
            ct_loader_result r = ct_loader_next(train, &x, &y);
            if (r == CT_LOADER_END) r = ct_loader_next(train, &x, &y); /* next epoch */
            ct_tensor *loss = r == CT_LOADER_BATCH ? ct_llama_loss(model, x, y) : NULL;
            failed = !ex_train_step(acc, opt, sched, loss, o.grad_clip, &loss_v); /* loss_v: this rank's batch */
        }
        if (failed) break;
        double tok_s = (double)tokens_per_step / (ex_now() - ts);
        ps.smooth = isnan(ps.smooth) ? loss_v : 0.9 * ps.smooth + 0.1 * loss_v;
        double val_loss = NAN;
        /* replicated, rank 0 validates alone; sharded, a forward needs every rank */
        if ((main_rank || sharded) && (step % o.eval_every == 0 || step == o.steps)) {
            val_loss = ps.last_val = ex_evaluate(&model->base, llama_loss, model, val, o.eval_batches);
            if (isnan(first_val)) first_val = val_loss;
            if (main_rank && tty) fprintf(stderr, "\n");
            if (main_rank)
                printf("step %lld: train loss %.4f, val loss %.4f nats/token\n", (long long)step, ps.smooth, val_loss);
        }
        if (main_rank) {
            char vbuf[32] = "";
            if (!isnan(val_loss)) snprintf(vbuf, sizeof vbuf, "%.6f", val_loss);
            fprintf(csv, "%lld,%.6f,%s,%.6g,%.1f\n", (long long)step, loss_v, vbuf, ct_optimizer_lr(opt), tok_s);
            ex_progress(tty, step, o.steps, step - first + 1, loss_v, ps.smooth, tok_s, ex_now() - t0);
        }
        if (o.save_every > 0 && step % o.save_every == 0 && !ex_checkpoint_step(acc, csv, csv_path, tty, step))
            failed = true;
    }
    if (tty) fprintf(stderr, "\n");
    if (failed) {
        fprintf(stderr, PROG " (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
        goto out;
    }
    ex_print_strategy_stats(acc);
    /* the whole model back on every rank, for rank 0's files and sample */
    ct_llama *whole = (ct_llama *)ct_accelerator_unwrap_model(acc, &model->base);
    if (!whole) {
        fprintf(stderr, PROG " (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
        goto out;
    }
    if (!main_rank) {
        status = 0;
        goto out;
    }
    fclose(csv);
    csv = NULL;
    double total = ex_now() - t0;
    int64_t ran = first <= o.steps ? o.steps - first + 1 : 0;
    char resumed[64] = "";
    if (first > 1) snprintf(resumed, sizeof resumed, " (resumed at step %lld)", (long long)first);
    printf("trained %lld steps%s in %.1f s (%.0f tokens/s); val loss %.4f -> %.4f nats/token\n", (long long)ran,
           resumed, total, total > 0 ? (double)(ran * tokens_per_step) / total : 0.0, first_val, ps.last_val);
    printf("loss log: %s\n", csv_path);
    ex_plot(o.out_dir, "loss (nats per token)");
    /* config.json + model.safetensors beside tokenizer.json: a Hugging Face model directory */
    if (ct_llama_save_pretrained(whole, o.out_dir)) {
        fprintf(stderr, PROG ": %s\n", ct_last_error());
        goto out;
    }
    printf("model: %s (LlamaForCausalLM: config.json, model.safetensors, tokenizer.json)\n", o.out_dir);
    if (o.sample_tokens > 0) sample(whole, bpe, &o);
    status = 0;
out:
    if (csv) fclose(csv);
    ct_accelerator_free(acc); /* first: it unhooks the optimizer and the parameters */
    ct_scheduler_free(sched);
    ct_optimizer_free(opt);
    ct_loader_free(val);
    ct_loader_free(train);
    ct_dataset_free(val_ds);
    ct_dataset_free(train_ds);
    ct_module_free(model ? &model->base : NULL);
    ct_bpe_free(bpe);
    ct_frame_reset_root();
    return status;
}
