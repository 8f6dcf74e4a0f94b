/* `ctrain bench` flags -> ct_bench_opts, the help text and the strategy names
 * (tools/bench.h; user documentation in docs/launch.md, "ctrain bench").
 *
 * Both `--flag value` and `--flag=value` work, and dashes read as underscores
 * (`--num-processes`), as in `ctrain launch`. List flags take comma-separated values.
 */
#include "tools/bench.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const ct_bench_strategy STRATEGIES[] = {
    {.name = "ddp", .about = "replicated: DDP, gradients all-reduced in buckets", .shard = CT_SHARD_NO_SHARD},
    {.name = "zero1", .about = "ZeRO-1 (OPTIMIZER): optimizer state sharded", .shard = CT_SHARD_OPTIMIZER},
    {.name = "zero2", .about = "ZeRO-2 (GRAD_OP): also gradients sharded", .shard = CT_SHARD_GRAD_OP},
    {.name = "zero3", .about = "ZeRO-3 (FULL): also parameters sharded", .shard = CT_SHARD_FULL},
    {.name = "hybrid", .about = "HYBRID: ZeRO-3 inside 2 groups of N/2 ranks, replicated across them (N even)",
     .shard = CT_SHARD_HYBRID},
    {.name = "zero2_offload", .about = "ZeRO-2 with the optimizer offloaded to the CPU (fp32 masters apart)",
     .shard = CT_SHARD_GRAD_OP, .offload = true},
    {.name = "zero3_offload", .about = "ZeRO-3 with the optimizer offloaded to the CPU (fp32 masters apart)",
     .shard = CT_SHARD_FULL, .offload = true},
    /* model-parallel layouts (tools/bench_layout.c): dp = N / (tp pp) */
    {.name = "tp2", .about = "Megatron-LM tensor parallelism over 2 ranks, DDP across the N/2 replicas", .tp = 2},
    {.name = "tp2sp", .about = "tp2 with sequence parallelism", .tp = 2, .sp = true},
    {.name = "tp2dp2", .about = "tp2 with at least 2 data-parallel replicas (N >= 4)", .tp = 2, .dp_min = 2},
    {.name = "tp4", .about = "tensor parallelism over 4 ranks", .tp = 4},
    {.name = "pp2", .about = "a 2-stage pipeline (1F1B, --num_micro_batches), DDP of each stage over N/2", .pp = 2},
    {.name = "pp2dp2", .about = "pp2 with at least 2 data-parallel replicas (N >= 4)", .pp = 2, .dp_min = 2},
    {.name = "pp4", .about = "a 4-stage pipeline", .pp = 4},
    {.name = "tp2pp2", .about = "tp2 inside each stage of a 2-stage pipeline (N >= 4)", .tp = 2, .pp = 2},
};
#define NSTRATEGIES (sizeof STRATEGIES / sizeof *STRATEGIES)

static const char *const PRECISIONS[] = {"no", "bf16", "fp16"};
#define NPRECISIONS (sizeof PRECISIONS / sizeof *PRECISIONS)

void ct_bench_strategy_names(char *buf, size_t cap)
{
    buf[0] = 0;
    for (size_t i = 0; i < NSTRATEGIES; i++) {
        strncat(buf, i ? ", " : "", cap - strlen(buf) - 1);
        strncat(buf, STRATEGIES[i].name, cap - strlen(buf) - 1);
    }
}

const ct_bench_strategy *ct_bench_strategy_find(const char *name)
{
    for (size_t i = 0; i < NSTRATEGIES; i++)
        if (!strcmp(STRATEGIES[i].name, name)) return &STRATEGIES[i];
    char list[256];
    ct_bench_strategy_names(list, sizeof list);
    ct_error_set(CT_ERR_INVALID, "--strategies: '%s' is not a strategy (allowed: %s)", name, list);
    return NULL;
}

void ct_bench_usage(FILE *f)
{
    fputs("usage: ctrain bench [--model NAME] [--strategies LIST] [--num_processes LIST]\n"
          "                    [--mixed_precision LIST] [--batch_size B] [--seq_len T] [--steps S]\n"
          "                    [--warmup_steps W] [--num_cpu_threads_per_process K] [--seed X]\n"
          "                    [--num_micro_batches M] [--timeout SECONDS] [--output_dir DIR]\n\n"
          "Trains a GPT or a Llama under each shard strategy, one `ctrain launch` run per cell of\n"
          "num_processes x mixed_precision x strategies, and compares them: tokens/s, memory\n"
          "per rank (params, grads, optimizer, activations, peak RSS), bytes sent per step,\n"
          "exposed communication, loss. Prints a table, writes DIR/results.csv and, with\n"
          "gnuplot, DIR/strategies.png. LISTs are comma-separated.\n\n"
          "  --model NAME            a built-in model (default gpt:w1):\n",
          f);
    /* the model list, indented under its flag */
    char *list = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&list, &len);
    if (m) {
        ct_model_spec_list(m);
        fclose(m);
    }
    for (const char *line = list; line && *line;) {
        size_t k = strcspn(line, "\n");
        fprintf(f, "    %.*s\n", (int)k, line);
        line += k + (line[k] == '\n');
    }
    free(list);
    fputs("  --strategies LIST       default ddp,zero1,zero2,zero3,hybrid; allowed:\n", f);
    for (size_t i = 0; i < NSTRATEGIES; i++) fprintf(f, "      %-14s %s\n", STRATEGIES[i].name, STRATEGIES[i].about);
    fputs("  --num_processes LIST    ranks per run, each >= 1 (default 2)\n"
          "  --mixed_precision LIST  no (f32), bf16 or fp16 (default no); sharded strategies keep\n"
          "                          16-bit parameters beside f32 masters, DDP autocasts\n"
          "  --batch_size B          rows per rank per step (default 4)\n"
          "  --seq_len T             tokens per row (default 64)\n"
          "  --steps S               timed steps (default 10)\n"
          "  --warmup_steps W        untimed steps before them (default 2)\n"
          "  --num_cpu_threads_per_process K   threads per rank (default 1)\n"
          "  --num_micro_batches M   micro-batches per step of the pipeline layouts (default 4); M\n"
          "                          divides batch_size x pp, the rows of one replica\n"
          "  --seed X                weights and tokens (default 1337; the same for every strategy)\n"
          "  --timeout SECONDS       per run; the run is stopped and reported failed (default 600)\n"
          "  --output_dir DIR        results.csv, strategies.png, the plot's data, logs/ (default\n"
          "                          ./ctrain_bench)\n"
          "  --help                  this text\n\n"
          "Layouts: tpK and ppK leave dp = N / K replicas; a replica trains on the rows of the K\n"
          "ranks it stands for (K x batch_size rows), so every layout sees DDP's tokens. Their\n"
          "rows add the bytes sent per step on each axis and, for pipelines, the measured bubble\n"
          "beside 1F1B's (pp - 1) / (M + pp - 1).\n\n"
          "Checks: in f32 every strategy's last loss equals DDP's within 1e-4 relative (the same\n"
          "tokens and weights), and every first loss is within 0.5 of ln(vocab).\n"
          "Exit status: 0 when every run succeeded and every check holds; 1 when a run failed\n"
          "(its row says why; the others still run) or a check failed; 2 for a usage error.\n",
          f);
}

static ct_status parse_long(const char *flag, const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || isspace((unsigned char)*v) || *end || errno || x < lo || x > hi)
        return ct_error_set(CT_ERR_INVALID, "--%s '%s': expected a whole number from %lld to %lld", flag, v, lo, hi);
    *out = x;
    return CT_OK;
}

static ct_status parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    long long x = 0;
    if (parse_long(flag, v, lo, hi, &x)) return ct_last_status();
    *out = (int)x;
    return CT_OK;
}

/* Splits v at commas into items[0..*n) (each NUL-terminated in buf). */
static ct_status split_list(const char *flag, const char *v, char *buf, size_t cap, char **items, int *n)
{
    if (strlen(v) >= cap) return ct_error_set(CT_ERR_INVALID, "--%s: the list is too long", flag);
    strcpy(buf, v);
    *n = 0;
    for (char *p = buf;;) {
        char *c = strchr(p, ',');
        if (c) *c = 0;
        if (!*p) return ct_error_set(CT_ERR_INVALID, "--%s '%s': an empty item in the list", flag, v);
        if (*n == CT_BENCH_MAX_LIST)
            return ct_error_set(CT_ERR_INVALID, "--%s '%s': at most %d items", flag, v, CT_BENCH_MAX_LIST);
        items[(*n)++] = p;
        if (!c) return CT_OK;
        p = c + 1;
    }
}

static ct_status set_list(ct_bench_opts *o, const char *flag, const char *v)
{
    char buf[1024], *items[CT_BENCH_MAX_LIST];
    int n = 0;
    if (split_list(flag, v, buf, sizeof buf, items, &n)) return ct_last_status();
    for (int i = 0; i < n; i++) {
        if (!strcmp(flag, "strategies")) {
            if (!(o->strategies[i] = ct_bench_strategy_find(items[i]))) return ct_last_status();
        } else if (!strcmp(flag, "mixed_precision")) {
            o->precisions[i] = NULL;
            for (size_t k = 0; k < NPRECISIONS; k++)
                if (!strcmp(items[i], PRECISIONS[k])) o->precisions[i] = PRECISIONS[k];
            if (!o->precisions[i])
                return ct_error_set(CT_ERR_INVALID, "--mixed_precision: '%s' is not a precision (allowed: no, bf16, fp16)",
                                    items[i]);
        } else if (parse_int(flag, items[i], 1, 1024, &o->processes[i])) {
            return ct_last_status();
        }
        for (int k = 0; k < i; k++) {
            bool same = !strcmp(flag, "strategies")        ? o->strategies[k] == o->strategies[i]
                        : !strcmp(flag, "mixed_precision") ? o->precisions[k] == o->precisions[i]
                                                           : o->processes[k] == o->processes[i];
            if (same) return ct_error_set(CT_ERR_INVALID, "--%s '%s': '%s' is listed twice", flag, v, items[i]);
        }
    }
    if (!strcmp(flag, "strategies")) o->nstrategies = n;
    else if (!strcmp(flag, "mixed_precision")) o->nprecisions = n;
    else o->nprocesses = n;
    return CT_OK;
}

static const char *const FLAGS[] = {"model", "strategies", "num_processes", "mixed_precision", "batch_size",
                                    "seq_len", "steps", "warmup_steps", "num_cpu_threads_per_process", "seed",
                                    "num_micro_batches",
                                    "timeout", "output_dir", "help"};

ct_status ct_bench_args_parse(int argc, char **argv, ct_bench_opts *o)
{
    *o = (ct_bench_opts){.batch_size = 4, .seq_len = 64, .steps = 10, .warmup_steps = 2, .threads = 1,
                         .num_micro_batches = 4,
                         .seed = 1337, .timeout_s = 600, .output_dir = "ctrain_bench"};
    o->model = ct_model_spec_find("gpt:w1");
    CT_ASSERT(o->model);
    if (set_list(o, "strategies", "ddp,zero1,zero2,zero3,hybrid") || set_list(o, "num_processes", "2") ||
        set_list(o, "mixed_precision", "no"))
        return ct_last_status();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2])
            return ct_error_set(CT_ERR_INVALID, "unexpected argument '%s' (ctrain bench --help lists the flags)", a);
        char name[64];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name) return ct_error_set(CT_ERR_INVALID, "unknown flag '%s' (ctrain bench --help)", a);
        for (size_t k = 0; k < len; k++) name[k] = a[2 + k] == '-' ? '_' : a[2 + k];
        name[len] = 0;
        int f = -1;
        for (int k = 0; k < (int)(sizeof FLAGS / sizeof *FLAGS); k++)
            if (!strcmp(name, FLAGS[k])) f = k;
        if (f < 0) return ct_error_set(CT_ERR_INVALID, "unknown flag '%s' (ctrain bench --help lists the flags)", a);
        if (!strcmp(name, "help")) {
            if (eq) return ct_error_set(CT_ERR_INVALID, "--help takes no value");
            o->help = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return ct_error_set(CT_ERR_INVALID, "--%s needs a value (ctrain bench --help)", name);
        long long x;
        ct_status st = CT_OK;
        if (!strcmp(name, "model")) {
            if (!(o->model = ct_model_spec_find(v))) st = ct_error_prefix("--model: ");
        } else if (!strcmp(name, "strategies") || !strcmp(name, "num_processes") || !strcmp(name, "mixed_precision")) {
            st = set_list(o, name, v);
        } else if (!strcmp(name, "batch_size")) {
            st = parse_int(name, v, 1, 1 << 20, &o->batch_size);
        } else if (!strcmp(name, "seq_len")) {
            st = parse_int(name, v, 1, 1 << 20, &o->seq_len);
        } else if (!strcmp(name, "steps")) {
            st = parse_int(name, v, 1, 1000000, &o->steps);
        } else if (!strcmp(name, "warmup_steps")) {
            st = parse_int(name, v, 0, 1000000, &o->warmup_steps);
        } else if (!strcmp(name, "num_cpu_threads_per_process")) {
            st = parse_int(name, v, 1, 1024, &o->threads);
        } else if (!strcmp(name, "num_micro_batches")) {
            st = parse_int(name, v, 1, 1 << 20, &o->num_micro_batches);
        } else if (!strcmp(name, "seed")) {
            st = parse_long(name, v, 0, (long long)(~0ULL >> 1), &o->seed);
        } else if (!strcmp(name, "timeout")) {
            if (!(st = parse_long(name, v, 1, 7 * 24 * 3600, &x))) o->timeout_s = (double)x;
        } else if (!strcmp(name, "output_dir")) {
            if (!*v) st = ct_error_set(CT_ERR_INVALID, "--output_dir: an empty path");
            o->output_dir = v;
        }
        if (st) return st;
    }
    return CT_OK;
}
