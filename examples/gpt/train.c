/* Trains a small GPT on text, byte-level, on the CPU.
 *
 * Default data: the English text of Debian's fortunes package (all the
 * fortune files, concatenated); any text file can be given with --data. The
 * text becomes a byte token file (data/tokenizer.h); the last --val_fraction of
 * it is held out for validation. The loop is an ordinary PyTorch-style loop:
 * forward, loss, backward, clip, AdamW step with warmup + cosine schedule.
 *
 * Writes into --out_dir: loss.csv (step, train loss, val loss, lr, tokens/s),
 * loss.png (when gnuplot is installed), model.safetensors (HF GPT-2 names), and
 * prints a text sample at the end. With --save_every N it checkpoints the whole
 * training state every N steps (accel/checkpoint.h) under
 * <project_dir>/checkpoints/checkpoint_<i>; --resume auto continues the latest of
 * them with the same losses, step for step, as a run that never stopped, and starts
 * fresh when there is none yet (so `ctrain launch --max_restarts` can rerun the same
 * command line). --help lists
 * every option.
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
#include "data/loader.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "examples/common/train_util.h"
#include "nn/gpt.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

typedef struct options {
    const char *data, *out_dir, *prompt;
    const char *project_dir, *resume; /* NULL: --out_dir; NULL: a fresh start */
    int64_t save_every, total_limit;
    int64_t seq_warmup, block_size, n_layer, n_head, n_embd, batch_size, steps, warmup, eval_every, eval_batches;
    int64_t sample_tokens, top_k;
    double lr, min_lr, beta1, beta2, weight_decay, grad_clip, dropout, val_fraction, temperature, bucket_mb;
    uint64_t seed;
    int threads;
    bool comm_stats; /* every rank prints its links' peers and bytes after training */
} options;

static const options defaults = {
    .data = NULL, .out_dir = "build/gpt", .prompt = "The ",
    .block_size = 256, .n_layer = 4, .n_head = 4, .n_embd = 256, .batch_size = 8, .steps = 700, .warmup = 30, .seq_warmup = 200,
    .eval_every = 50, .eval_batches = 8, .sample_tokens = 300, .top_k = 40,
    .lr = 2e-3, .min_lr = 2e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1, .grad_clip = 1.0, .dropout = 0.0, .val_fraction = 0.1,
    .temperature = 0.8, .seed = 1337, .threads = 0, .bucket_mb = 2,
};

static void usage(FILE *f)
{
    const options *d = &defaults;
    fprintf(f,
            "usage: gpt_train [options]\n"
            "Trains a byte-level GPT on a text file and samples from it.\n\n"
            "data and output\n"
            "  --data FILE          text to train on (default: the text of Debian's fortunes package)\n"
            "  --out_dir DIR        where loss.csv, loss.png and model.safetensors go (default %s)\n"
            "  --val_fraction F     last fraction of the text held out for validation (default %g)\n"
            "model\n"
            "  --block_size N       context length (default %lld)\n"
            "  --n_layer N          transformer blocks (default %lld)\n"
            "  --n_head N           attention heads (default %lld)\n"
            "  --n_embd N           width, divisible by n_head (default %lld)\n"
            "  --dropout P          dropout probability (default %g)\n"
            "training\n"
            "  --batch_size N       sequences per step (default %lld)\n"
            "  --steps N            optimizer steps (default %lld)\n"
            "  --lr LR              peak learning rate (default %g)\n"
            "  --min_lr LR          cosine floor (default %g)\n"
            "  --warmup N           linear warmup steps (default %lld)\n"
            "  --seq_warmup N       grow the context from block_size/8 (>= 32) to block_size over the first N\n"
            "                       steps, same tokens per step; 0 = off (default %lld)\n"
            "  --beta1 B            AdamW first-moment decay (default %g)\n"
            "  --beta2 B            AdamW second-moment decay (default %g)\n"
            "  --weight_decay W     AdamW decay for matrices; biases, norms and embeddings get none (default %g)\n"
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
            "                       DIR; the other options must match the saved run's. auto starts at\n"
            "                       step 1 when there is no checkpoint yet (the same command line for\n"
            "                       the first run and every restart)\n"
            "sampling\n"
            "  --prompt TEXT        start of the sample (default \"%s\")\n"
            "  --sample_tokens N    bytes to generate at the end, 0 = none (default %lld)\n"
            "  --temperature T      (default %g)\n"
            "  --top_k K            0 = no filter (default %lld)\n"
            "  --comm_stats         after training, every rank prints one line: its shared-memory and TCP\n"
            "                       peers and the payload bytes it sent over each\n"
            "  --help               this text\n",
            d->out_dir, d->val_fraction, (long long)d->block_size, (long long)d->n_layer, (long long)d->n_head,
            (long long)d->n_embd, d->dropout, (long long)d->batch_size, (long long)d->steps, d->lr, d->min_lr,
            (long long)d->warmup, (long long)d->seq_warmup, d->beta1, d->beta2, d->weight_decay, d->grad_clip, (long long)d->eval_every,
            (long long)d->eval_batches, (unsigned long long)d->seed, d->bucket_mb, d->prompt, (long long)d->sample_tokens,
            d->temperature, (long long)d->top_k);
}

/* Sequence-length warmup (curriculum): over the first seq_warmup steps the context
 * grows from the shortest power-of-two fraction of block_size that is >= 32 (and
 * divides it) to block_size, in doublings spaced evenly; each batch of B windows of T
 * tokens is cut into B*T/L windows of L, so every step still sees B*T tokens. */
static int64_t curriculum_len(const options *o, int64_t step)
{
    if (o->seq_warmup <= 0 || step > o->seq_warmup) return o->block_size;
    int K = 0;
    while (o->block_size % ((int64_t)2 << K) == 0 && (o->block_size >> (K + 1)) >= 32) K++;
    /* stage K (shortest) at step 1, stage 0 (full) after seq_warmup steps */
    int k = (int)ceil((double)K * (double)(o->seq_warmup - step + 1) / (double)(o->seq_warmup + 1));
    return o->block_size >> k;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = defaults;
    enum { O_DATA = 256, O_OUT, O_VAL, O_BLOCK, O_LAYER, O_HEAD, O_EMBD, O_DROP, O_BATCH, O_STEPS, O_LR, O_MINLR,
           O_WARM, O_SEQW, O_B1, O_B2, O_WD, O_CLIP, O_EVERY, O_EVALB, O_SEED, O_THREADS, O_BUCKET, O_PROJECT, O_SAVE,
           O_LIMIT, O_RESUME, O_PROMPT, O_SAMPLE, O_TEMP, O_TOPK, O_HELP, O_COMM };
    static const struct option opts[] = {
        {"data", 1, 0, O_DATA}, {"out_dir", 1, 0, O_OUT}, {"val_fraction", 1, 0, O_VAL},
        {"block_size", 1, 0, O_BLOCK}, {"n_layer", 1, 0, O_LAYER}, {"n_head", 1, 0, O_HEAD},
        {"n_embd", 1, 0, O_EMBD}, {"dropout", 1, 0, O_DROP}, {"batch_size", 1, 0, O_BATCH},
        {"steps", 1, 0, O_STEPS}, {"lr", 1, 0, O_LR}, {"min_lr", 1, 0, O_MINLR}, {"warmup", 1, 0, O_WARM},
        {"seq_warmup", 1, 0, O_SEQW}, {"beta1", 1, 0, O_B1}, {"beta2", 1, 0, O_B2},
        {"weight_decay", 1, 0, O_WD}, {"grad_clip", 1, 0, O_CLIP}, {"eval_every", 1, 0, O_EVERY},
        {"eval_batches", 1, 0, O_EVALB}, {"seed", 1, 0, O_SEED}, {"threads", 1, 0, O_THREADS}, {"bucket_mb", 1, 0, O_BUCKET},
        {"project_dir", 1, 0, O_PROJECT}, {"save_every", 1, 0, O_SAVE}, {"total_limit", 1, 0, O_LIMIT},
        {"resume", 1, 0, O_RESUME},
        {"prompt", 1, 0, O_PROMPT}, {"sample_tokens", 1, 0, O_SAMPLE}, {"temperature", 1, 0, O_TEMP},
        {"top_k", 1, 0, O_TOPK}, {"help", 0, 0, O_HELP}, {"comm_stats", 0, 0, O_COMM}, {0, 0, 0, 0}};
    int c;
    int64_t tmp;
    bool ok = true;
    opterr = 0;
    while (ok && (c = getopt_long_only(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_DATA: o->data = optarg; break;
        case O_OUT: o->out_dir = optarg; break;
        case O_VAL: ok = ex_parse_f64("--val_fraction", optarg, 0.001, 0.5, &o->val_fraction); break;
        case O_BLOCK: ok = ex_parse_i64("--block_size", optarg, 1, &o->block_size); break;
        case O_LAYER: ok = ex_parse_i64("--n_layer", optarg, 1, &o->n_layer); break;
        case O_HEAD: ok = ex_parse_i64("--n_head", optarg, 1, &o->n_head); break;
        case O_EMBD: ok = ex_parse_i64("--n_embd", optarg, 1, &o->n_embd); break;
        case O_DROP: ok = ex_parse_f64("--dropout", optarg, 0, 0.99, &o->dropout); break;
        case O_BATCH: ok = ex_parse_i64("--batch_size", optarg, 1, &o->batch_size); break;
        case O_STEPS: ok = ex_parse_i64("--steps", optarg, 0, &o->steps); break;
        case O_LR: ok = ex_parse_f64("--lr", optarg, 0, 10, &o->lr); break;
        case O_MINLR: ok = ex_parse_f64("--min_lr", optarg, 0, 10, &o->min_lr); break;
        case O_WARM: ok = ex_parse_i64("--warmup", optarg, 0, &o->warmup); break;
        case O_SEQW: ok = ex_parse_i64("--seq_warmup", optarg, 0, &o->seq_warmup); break;
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
        case O_COMM: o->comm_stats = true; break;
        default:
            fprintf(stderr, "gpt_train: unknown or incomplete option %s (see --help)\n", argv[optind - 1]);
            return -1;
        }
    }
    if (!ok) return -1;
    if (optind < argc) {
        fprintf(stderr, "gpt_train: unexpected argument %s (see --help)\n", argv[optind]);
        return -1;
    }
    if (o->n_embd % o->n_head) {
        fprintf(stderr, "gpt_train: --n_embd %lld is not divisible by --n_head %lld\n", (long long)o->n_embd,
                (long long)o->n_head);
        return -1;
    }
    if (o->total_limit > 1000000) {
        fprintf(stderr, "gpt_train: --total_limit %lld: expected at most 1000000 (0 keeps every checkpoint)\n",
                (long long)o->total_limit);
        return -1;
    }
    if (o->resume && !*o->resume) {
        fprintf(stderr, "gpt_train: --resume needs 'auto' or a checkpoint directory\n");
        return -1;
    }
    if (o->min_lr > o->lr) {
        fprintf(stderr, "gpt_train: --min_lr %g is above --lr %g\n", o->min_lr, o->lr);
        return -1;
    }
    return 0;
}

/* ---- data ------------------------------------------------------------------------ */

/* Writes the training text as a byte token file into out_dir; returns bytes. */
static int64_t prepare_tokens(const options *o, const char *token_path)
{
    if (o->data) {
        if (ct_tokenizer_encode_file(o->data, token_path)) {
            fprintf(stderr, "gpt_train: %s\n", ct_last_error());
            return -1;
        }
        ct_token_file_info info;
        if (ct_token_file_probe(token_path, CT_TOKENS_LLMC, &info)) {
            fprintf(stderr, "gpt_train: %s\n", ct_last_error());
            return -1;
        }
        return info.ntokens;
    }
    size_t len;
    char *text = ex_read_fortunes(&len);
    if (!text) return -1;
    ct_status st = ct_tokenizer_encode_memory(text, len, token_path);
    free(text);
    if (st) {
        fprintf(stderr, "gpt_train: %s\n", ct_last_error());
        return -1;
    }
    return (int64_t)len;
}

/* ---- main -------------------------------------------------------------------------- */

static ct_tensor *gpt_loss(void *m, ct_tensor *x, ct_tensor *y) { return ct_gpt_loss(m, x, y); }

int main(int argc, char **argv)
{
    ex_set_program("gpt_train");
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    if (o.threads) ct_set_num_threads(o.threads);
    const char *project_dir = o.project_dir ? o.project_dir : o.out_dir;
    const char *bad_dir = !ex_make_dirs(o.out_dir) ? o.out_dir : !ex_make_dirs(project_dir) ? project_dir : NULL;
    if (bad_dir) {
        fprintf(stderr, "gpt_train: cannot create %s: %s\n", bad_dir, strerror(errno));
        return 1;
    }
    char token_path[1200], csv_path[1200], model_path[1200];
    snprintf(token_path, sizeof token_path, "%s/tokens.bin", o.out_dir);
    snprintf(csv_path, sizeof csv_path, "%s/loss.csv", o.out_dir);
    snprintf(model_path, sizeof model_path, "%s/model.safetensors", o.out_dir);
    /* one process or one rank of many (ctrain launch / mpirun / Slurm): the same program */
    /* gradients of W1 total 13 MB: 2 MB buckets (not DDP's usual 25) let most of them
     * reduce while backward still runs */
    ct_accelerator *acc = ct_accelerator_new(&(ct_accelerator_config){
        .ddp = {.bucket_cap_mb = o.bucket_mb},
        .project = {.project_dir = project_dir, .automatic_checkpoint_naming = true,
                    .total_limit = (int)o.total_limit}});
    if (!acc) {
        fprintf(stderr, "gpt_train: %s\n", ct_last_error());
        return 1;
    }
    bool main_rank = ct_accelerator_is_main_process(acc);
    int world = ct_accelerator_num_processes(acc);
    /* rank 0 writes the token file, the others then read it */
    int64_t ntok = -1;
    CT_MAIN_PROCESS_FIRST(acc) {
        ct_token_file_info info;
        if (main_rank) ntok = prepare_tokens(&o, token_path);
        else if (!ct_token_file_probe(token_path, CT_TOKENS_LLMC, &info)) ntok = info.ntokens;
        else fprintf(stderr, "gpt_train: %s\n", ct_last_error());
    }
    if (ntok < 0) {
        ct_accelerator_free(acc);
        return 1;
    }
    int64_t nval = (int64_t)((double)ntok * o.val_fraction), split = ntok - nval;
    if (split < o.block_size + 1 || nval < o.block_size + 1) {
        fprintf(stderr, "gpt_train: %lld bytes of text are too few for --block_size %lld with --val_fraction %g\n",
                (long long)ntok, (long long)o.block_size, o.val_fraction);
        ct_accelerator_free(acc);
        return 1;
    }
    ct_set_seed(o.seed);
    int status = 1;
    ct_gpt *model = NULL;
    ct_dataset *train_ds = NULL, *val_ds = NULL;
    ct_loader *train = NULL, *val = NULL;
    ct_optimizer *opt = NULL;
    ct_scheduler *sched = NULL;
    FILE *csv = NULL;
    model = ct_gpt_new(&(ct_gpt_config){.vocab_size = 256, .block_size = o.block_size, .n_layer = o.n_layer,
                                        .n_head = o.n_head, .n_embd = o.n_embd, .dropout = o.dropout});
    /* training windows overlap (stride T/2) to see more contexts per epoch;
     * validation windows do not */
    train_ds = model ? ct_token_dataset_open(token_path, &(ct_token_dataset_config){
                                                             .block_size = o.block_size, .stride = o.block_size / 2 + 1,
                                                             .end = split, .vocab_size = 256})
                     : NULL;
    val_ds = train_ds ? ct_token_dataset_open(token_path, &(ct_token_dataset_config){.block_size = o.block_size,
                                                                                     .begin = split, .vocab_size = 256})
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
    /* the validation batches go where prepare put the model (a GPU when there is one) */
    /* the whole model's size: under tensor parallelism prepare leaves each rank its shards */
    const int64_t nparams = model ? ct_module_num_params(&model->base) : 0;
    if (!sched || ct_accelerator_prepare(acc, &model->base, opt, train, sched) ||
        ct_loader_set_device(val, ct_accelerator_device(acc))) {
        fprintf(stderr, "gpt_train: %s\n", ct_last_error());
        goto out;
    }
    /* the progress state goes into every checkpoint and comes back with --resume */
    ex_progress_state ps = {NAN, NAN};
    ct_checkpointable progress_ckpt = ex_progress_checkpointable("gpt_train_progress", &ps);
    if (ct_accelerator_register_for_checkpointing(acc, &progress_ckpt)) {
        fprintf(stderr, "gpt_train: %s\n", ct_last_error());
        goto out;
    }
    /* every rank loads (a sharded checkpoint has every rank's files); the loop goes on
     * at the step after the last one the checkpoint holds */
    int64_t first = 1;
    /* no checkpoint_<i> at all: one command line serves the first attempt and every
     * restart; one that is there but incomplete or corrupt is load_state's to refuse */
    bool fresh = o.resume && !strcmp(o.resume, "auto") && ct_checkpoint_count(project_dir) == 0;
    if (fresh)
        ct_accelerator_print(acc, "--resume auto: no checkpoint under %s/checkpoints yet; starting at step 1\n",
                             project_dir);
    if (o.resume && !fresh) {
        if (ct_accelerator_load_state(acc, strcmp(o.resume, "auto") ? o.resume : NULL)) {
            fprintf(stderr, "gpt_train (rank %d): cannot resume from %s: %s\n", ct_accelerator_process_index(acc),
                    strcmp(o.resume, "auto") ? o.resume : "the latest checkpoint", ct_last_error());
            goto out;
        }
        first = ct_optimizer_step_count(opt) + 1;
        ct_accelerator_print(acc, "resumed from %s at step %lld\n", ct_accelerator_last_checkpoint(acc),
                             (long long)first - 1);
    }
    csv = main_rank ? ex_open_csv(csv_path, first) : NULL;
    if (main_rank && !csv) {
        fprintf(stderr, "gpt_train: %s: %s\n", csv_path, strerror(errno));
        goto out;
    }
    char devname[32];
    ct_accelerator_print(acc,
                         "GPT: %lld parameters, %lld layers, %lld heads, width %lld, block %lld; %lld bytes of text "
                         "(%lld train, %lld validation); %d process(es) x %d threads on %s, batch %lld per process\n",
                         (long long)nparams, (long long)o.n_layer, (long long)o.n_head,
                         (long long)o.n_embd, (long long)o.block_size, (long long)ntok, (long long)split,
                         (long long)nval, world, ct_get_num_threads(),
                         ct_device_str(ct_accelerator_device(acc), devname, sizeof devname), (long long)o.batch_size);
    bool tty = main_rank && isatty(STDERR_FILENO) && isatty(STDOUT_FILENO);
    const bool sharded = ct_accelerator_forward_needs_all_ranks(acc);
    double t0 = ex_now();
    int64_t tokens_per_step = o.batch_size * o.block_size * world; /* over all ranks */
    bool failed = false;
    if (first > o.steps)
        ct_accelerator_print(acc, "the checkpoint is at step %lld and --steps is %lld: nothing left to train\n",
                             (long long)first - 1, (long long)o.steps);
    for (int64_t step = first; step <= o.steps && !failed; step++) {
        double loss_v = NAN, ts = ex_now();
        CT_FRAME {
            ct_tensor *x, *y;
            ct_loader_result r = ct_loader_next(train, &x, &y);
            if (r == CT_LOADER_END) r = ct_loader_next(train, &x, &y); /* next epoch */
            int64_t L = curriculum_len(&o, step);
            if (r == CT_LOADER_BATCH && L < o.block_size) {
                /* (B, T) -> (B*T/L, L): the same tokens in shorter contexts */
                int64_t sh[2] = {o.batch_size * o.block_size / L, L};
                x = ct_reshape(x, 2, sh);
                y = ct_reshape(y, 2, sh);
            }
            ct_tensor *loss = r == CT_LOADER_BATCH ? ct_gpt_loss(model, x, y) : NULL;
            failed = !ex_train_step(acc, opt, sched, loss, o.grad_clip, &loss_v); /* loss_v: this rank's batch */
        }
        if (failed) break;
        double tok_s = (double)tokens_per_step / (ex_now() - ts);
        ps.smooth = isnan(ps.smooth) ? loss_v : 0.9 * ps.smooth + 0.1 * loss_v;
        double val_loss = NAN;
        /* replicated, every rank holds the same weights: rank 0 validates, logs and
         * plots; sharded, a forward needs every rank, so all validate */
        if ((main_rank || sharded) && (step % o.eval_every == 0 || step == o.steps)) {
            val_loss = ps.last_val = ex_evaluate(&model->base, gpt_loss, model, val, o.eval_batches);
            if (main_rank && tty) fprintf(stderr, "\n");
            if (main_rank)
                printf("step %lld: train loss %.4f, val loss %.4f nats/byte\n", (long long)step, ps.smooth, val_loss);
        }
        if (main_rank) {
            char vbuf[32] = "";
            if (!isnan(val_loss)) snprintf(vbuf, sizeof vbuf, "%.6f", val_loss);
            fprintf(csv, "%lld,%.6f,%s,%.6g,%.1f\n", (long long)step, loss_v, vbuf, ct_optimizer_lr(opt), tok_s);
            ex_progress(tty, step, o.steps, step - first + 1, loss_v, ps.smooth, tok_s, ex_now() - t0);
        }
        /* on every rank: sharded, each rank writes its own part (a collective) */
        if (o.save_every > 0 && step % o.save_every == 0 && !ex_checkpoint_step(acc, csv, csv_path, tty, step))
            failed = true;
    }
    if (tty) fprintf(stderr, "\n");
    if (failed) {
        fprintf(stderr, "gpt_train (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
        goto out;
    }
    ex_print_strategy_stats(acc);
    if (o.comm_stats) {
        /* one line per rank, parsed by cluster tests: keep the format */
        ct_pg_link_stats ls = {0};
        if (ct_pg_link_stats_get(ct_accelerator_pg(acc), &ls)) ct_error_clear(); /* no group: all zero */
        printf("comm: rank %d: shm peers %d bytes %lld; tcp peers %d bytes %lld\n", ct_accelerator_process_index(acc),
               ls.shm_peers, (long long)ls.shm_bytes, ls.tcp_peers, (long long)ls.tcp_bytes);
        fflush(stdout);
    }
    /* the whole model back on every rank (gathered from the shards), for rank 0's
     * files and sample */
    ct_gpt *whole = (ct_gpt *)ct_accelerator_unwrap_model(acc, &model->base);
    if (!whole) {
        fprintf(stderr, "gpt_train (rank %d): %s\n", ct_accelerator_process_index(acc), ct_last_error());
        goto out;
    }
    if (!main_rank) { /* rank 0 alone writes the results */
        status = 0;
        goto out;
    }
    fclose(csv);
    csv = NULL;
    double total = ex_now() - t0;
    int64_t ran = first <= o.steps ? o.steps - first + 1 : 0;
    char resumed[64] = "";
    if (first > 1) snprintf(resumed, sizeof resumed, " (resumed at step %lld)", (long long)first);
    printf("trained %lld steps%s in %.1f s (%.0f tokens/s); final val loss %.4f nats/byte\n", (long long)ran, resumed,
           total, total > 0 ? (double)(ran * tokens_per_step) / total : 0.0, ps.last_val);
    printf("loss log: %s\n", csv_path);
    ex_plot(o.out_dir, "loss (nats per byte)");
    /* model.safetensors + config.json: transformers' GPT2LMHeadModel.from_pretrained(out_dir) reads them */
    if (ct_gpt_save_hf(whole, o.out_dir)) {
        fprintf(stderr, "gpt_train: %s\n", ct_last_error());
        goto out;
    }
    printf("model: %s (with config.json for HF GPT2LMHeadModel)\n", model_path);
    if (o.sample_tokens > 0) {
        int64_t n = (int64_t)strlen(o.prompt);
        if (n == 0 || n > o.block_size) n = 1;
        int64_t *ids = malloc((size_t)(n + o.sample_tokens) * sizeof *ids);
        char *text = malloc((size_t)(n + o.sample_tokens) + 1);
        for (int64_t i = 0; ids && i < n; i++) ids[i] = (unsigned char)o.prompt[i];
        ct_rng rng;
        ct_rng_init(&rng, o.seed);
        if (!ids || !text ||
            ct_gpt_generate(whole, ids, n, &(ct_generate_config){.max_new_tokens = o.sample_tokens,
                                                                 .temperature = o.temperature, .top_k = o.top_k},
                            &rng, ids)) {
            fprintf(stderr, "gpt_train: sampling failed: %s\n", ct_last_error());
        } else {
            ct_tokenizer_decode(ids, n + o.sample_tokens, text, n + o.sample_tokens + 1);
            printf("\n--- sample ---\n%s\n--------------\n", text);
        }
        free(ids);
        free(text);
    }
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
    ct_frame_reset_root();
    return status;
}
