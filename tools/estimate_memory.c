/* `ctrain estimate-memory` (tools/estimate_memory.h): flags, the table, --memory's
 * largest micro-batch, and the hidden --measure mode's options. */
#include "tools/estimate_memory.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/cpu/matmul.h"
#include "tools/model_file.h"
#include "tools/model_spec.h"

#define CMD "ctrain estimate-memory"
#define MAX_LIST 16
/* The process's own footprint beside ctrain's storage: code and libraries (OpenBLAS,
 * oneDNN, libuv, the C runtime), thread stacks, the comm thread, malloc's arenas, and
 * the pages the allocator's size classes round up. Measured with
 * `ctrain estimate-memory --measure` on 1 to 4 ranks of 1 thread each (docs/launch.md);
 * --runtime_overhead replaces it. */
#define DEFAULT_RUNTIME_OVERHEAD ((int64_t)18 << 20)

typedef struct strategy_choice {
    ct_memory_strategy st;
    bool offload;
} strategy_choice;

typedef struct options {
    ct_model_shape shape;
    const char *model;
    int worlds[MAX_LIST], nworlds;
    ct_dtype precisions[MAX_LIST];
    int nprecisions;
    strategy_choice strategies[MAX_LIST];
    int nstrategies;
    int64_t batch, seq, memory, overhead;
    bool csv, measure;
    int steps;
} options;

static void usage(FILE *f)
{
    fputs("usage: ctrain estimate-memory MODEL [--num_processes LIST] [--mixed_precision LIST]\n"
          "                              [--strategies LIST] [--batch_size B] [--seq_len T]\n"
          "                              [--memory SIZE] [--runtime_overhead SIZE] [--csv] [--help]\n\n"
          "Bytes per rank of training MODEL with AdamW under each strategy, precision and number of\n"
          "processes, as ctrain lays them out: parameters, gradients, optimizer state (moments and\n"
          "f32 master slices), activations of one micro-batch, temporaries (DDP buckets, gathered\n"
          "ZeRO-3 units, 16-bit weight copies, the logits' gradient), the total of ctrain's storage at\n"
          "the step's peak, and the process's peak resident set (the total plus the runtime's own\n"
          "footprint).\n\n"
          "MODEL: a built-in name (below), a HuggingFace config.json of a GPT-2 or a Llama (model_type\n"
          "gpt2 or llama; or a directory holding one), a GPT-2 model.safetensors, or another\n"
          "model.safetensors with its config.json beside it.\n\n"
          "  --num_processes LIST   ranks, e.g. 1,2,4,8 (default)\n"
          "  --mixed_precision LIST no, bf16, fp16, fp8 (default: no,bf16,fp16; f32 = no)\n"
          "  --strategies LIST      DDP, ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-1+offload, ZeRO-2+offload,\n"
          "                         ZeRO-3+offload (default: all; case and '-' do not matter: zero3)\n"
          "  --batch_size B         rows per rank per micro-batch (default 1)\n"
          "  --seq_len T            tokens per row (default: the model's block size or\n"
          "                         max_position_embeddings; the built-in Llama 3.2 models: 4096)\n"
          "  --memory SIZE          also print the largest micro-batch whose peak RSS fits in SIZE\n"
          "                         per rank (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB: 80GiB)\n"
          "  --runtime_overhead SIZE  the process's footprint beside ctrain's storage (default 18MiB,\n"
          "                         measured on x86-64 Linux with 1 thread per rank)\n"
          "  --csv                  one CSV row per configuration, sizes in bytes\n"
          "  --measure              train MODEL for a few steps under ONE strategy and precision, as\n"
          "                         the ranks of `ctrain launch` (or alone), and print the measured\n"
          "                         figures beside the estimate (--steps N, default 3)\n\n"
          "built-in models:\n",
          f);
    ct_model_spec_list(f);
}

static bool parse_i64(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, CMD ": %s '%s': expected an integer from %lld to %lld\n", flag, v, (long long)lo,
                (long long)hi);
        return false;
    }
    *out = x;
    return true;
}

/* "80GiB", "1.5 GB", "4096" (bytes) */
static bool parse_size(const char *flag, const char *v, int64_t *out)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},           {"B", 1},          {"KiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                 {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12}};
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (*end == ' ') end++;
    for (size_t i = 0; end != v && !errno && i < sizeof units / sizeof *units; i++)
        if (!strcasecmp(end, units[i].unit) && isfinite(x) && x >= 0 && x * units[i].mult < 9.2e18) {
            *out = (int64_t)llround(x * units[i].mult);
            return true;
        }
    fprintf(stderr, CMD ": %s '%s': expected a size such as 80GiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)\n",
            flag, v);
    return false;
}

/* Splits v at commas into at most MAX_LIST items; item(flag, token, index) parses one. */
static bool parse_list(const char *flag, const char *v, int *n, bool (*item)(const char *, const char *, void *, int),
                       void *out)
{
    char buf[512];
    if (strlen(v) >= sizeof buf) {
        fprintf(stderr, CMD ": %s: the list is too long\n", flag);
        return false;
    }
    strcpy(buf, v);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST) {
            fprintf(stderr, CMD ": %s: at most %d values\n", flag, MAX_LIST);
            return false;
        }
        if (!item(flag, tok, out, (*n)++)) return false;
    }
    if (!*n) {
        fprintf(stderr, CMD ": %s '%s': the list is empty\n", flag, v);
        return false;
    }
    return true;
}

static bool world_item(const char *flag, const char *tok, void *out, int i)
{
    int64_t x;
    if (!parse_i64(flag, tok, 1, 1 << 20, &x)) return false;
    ((int *)out)[i] = (int)x;
    return true;
}

static bool precision_item(const char *flag, const char *tok, void *out, int i)
{
    ct_dtype *d = out;
    if (!strcasecmp(tok, "no") || !strcasecmp(tok, "f32") || !strcasecmp(tok, "fp32")) d[i] = CT_DTYPE_F32;
    else if (!strcasecmp(tok, "bf16")) d[i] = CT_DTYPE_BF16;
    else if (!strcasecmp(tok, "fp16") || !strcasecmp(tok, "f16")) d[i] = CT_DTYPE_F16;
    else if (!strcasecmp(tok, "fp8")) d[i] = CT_DTYPE_F8_E4M3;
    else {
        fprintf(stderr, CMD ": %s '%s': allowed: no (f32), bf16, fp16, fp8\n", flag, tok);
        return false;
    }
    return true;
}

static bool strategy_item(const char *flag, const char *tok, void *out, int i)
{
    /* lower case without '-', '_' and ' ': "ZeRO-3+offload" -> "zero3+offload" */
    char k[64];
    int n = 0;
    for (const char *p = tok; *p && n < (int)sizeof k - 1; p++)
        if (*p != '-' && *p != '_' && *p != ' ') k[n++] = (char)tolower((unsigned char)*p);
    k[n] = 0;
    static const struct {
        const char *key;
        strategy_choice c;
    } names[] = {{"ddp", {CT_MEMORY_DDP, false}},          {"zero1", {CT_MEMORY_ZERO1, false}},
                 {"zero2", {CT_MEMORY_ZERO2, false}},      {"zero3", {CT_MEMORY_ZERO3, false}},
                 {"zero1+offload", {CT_MEMORY_ZERO1, true}}, {"zero2+offload", {CT_MEMORY_ZERO2, true}},
                 {"zero3+offload", {CT_MEMORY_ZERO3, true}}};
    for (size_t j = 0; j < sizeof names / sizeof *names; j++)
        if (!strcmp(k, names[j].key)) {
            ((strategy_choice *)out)[i] = names[j].c;
            return true;
        }
    fprintf(stderr, CMD ": %s '%s': allowed: DDP, ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-1+offload, ZeRO-2+offload, "
            "ZeRO-3+offload\n", flag, tok);
    return false;
}

/* 0 ok, 1 --help printed, 2 usage error printed */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.worlds = {1, 2, 4, 8}, .nworlds = 4,
                   .precisions = {CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_F16}, .nprecisions = 3,
                   .strategies = {{CT_MEMORY_DDP, false}, {CT_MEMORY_ZERO1, false}, {CT_MEMORY_ZERO2, false},
                                  {CT_MEMORY_ZERO3, false}, {CT_MEMORY_ZERO1, true}, {CT_MEMORY_ZERO2, true},
                                  {CT_MEMORY_ZERO3, true}},
                   .nstrategies = 7, .batch = 1, .memory = -1, .overhead = DEFAULT_RUNTIME_OVERHEAD, .steps = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--csv")) {
            o->csv = true;
            continue;
        }
        if (!strcmp(a, "--measure")) {
            o->measure = true;
            continue;
        }
        if (a[0] != '-') {
            if (o->model) {
                fprintf(stderr, CMD ": unexpected argument '%s': MODEL is '%s' already\n", a, o->model);
                return 2;
            }
            o->model = a;
            continue;
        }
        /* --flag=value or --flag value */
        char name[64];
        const char *v = strchr(a, '=');
        if (v) {
            snprintf(name, sizeof name, "%.*s", (int)(v - a), a);
            v++;
        } else {
            snprintf(name, sizeof name, "%s", a);
            v = i + 1 < argc ? argv[++i] : NULL;
        }
        static const char *const known[] = {"--num_processes", "--mixed_precision", "--strategies", "--batch_size",
                                            "--seq_len", "--memory", "--runtime_overhead", "--steps"};
        bool is_known = false;
        for (size_t k = 0; k < sizeof known / sizeof *known; k++) is_known |= !strcmp(name, known[k]);
        if (!is_known) {
            fprintf(stderr, CMD ": unknown flag '%s' (" CMD " --help)\n", name);
            return 2;
        }
        if (!v) {
            fprintf(stderr, CMD ": %s needs a value\n", name);
            return 2;
        }
        bool ok;
        int64_t x = 0;
        if (!strcmp(name, "--num_processes")) ok = parse_list(name, v, &o->nworlds, world_item, o->worlds);
        else if (!strcmp(name, "--mixed_precision"))
            ok = parse_list(name, v, &o->nprecisions, precision_item, o->precisions);
        else if (!strcmp(name, "--strategies")) ok = parse_list(name, v, &o->nstrategies, strategy_item, o->strategies);
        else if (!strcmp(name, "--batch_size")) ok = parse_i64(name, v, 1, (int64_t)1 << 30, &o->batch);
        else if (!strcmp(name, "--seq_len")) ok = parse_i64(name, v, 1, (int64_t)1 << 30, &o->seq);
        else if (!strcmp(name, "--memory")) ok = parse_size(name, v, &o->memory);
        else if (!strcmp(name, "--runtime_overhead")) ok = parse_size(name, v, &o->overhead);
        else ok = parse_i64(name, v, 1, 1000, &x), o->steps = (int)x;
        if (!ok) return 2;
    }
    if (!o->model) {
        fprintf(stderr, CMD ": MODEL is missing (" CMD " --help lists the built-in models)\n");
        return 2;
    }
    return 0;
}

/* "123.4 MiB" / "12.34 GiB" */
static const char *human(int64_t b, char *buf, int cap)
{
    const double x = (double)b;
    if (x >= 1024.0 * 1048576.0) snprintf(buf, (size_t)cap, "%.2f GiB", x / (1024.0 * 1048576.0));
    else snprintf(buf, (size_t)cap, "%.1f MiB", x / 1048576.0);
    return buf;
}

static const char *precision_name(ct_dtype d)
{
    return d == CT_DTYPE_BF16 ? "bf16" : d == CT_DTYPE_F16 ? "fp16" : d == CT_DTYPE_F8_E4M3 ? "fp8" : "no";
}

/* What this machine's CPU fp8 GEMM widens its operands to (precision/fp8.c). */
static ct_dtype fp8_widen(void)
{
    return cti_cpu_matmul_backend(CT_DTYPE_BF16) == CT_GEMM_ONEDNN ? CT_DTYPE_BF16 : CT_DTYPE_F32;
}

/* The largest B (<= 2^30) whose estimate's rss fits in limit; 0 when none does. The
 * estimate grows with B, so a binary search. */
static int64_t max_batch(ct_memory_setup s, int64_t limit)
{
    ct_memory_estimate e;
    s.batch = 1;
    if (ct_memory_estimate_compute(&s, &e) || e.rss > limit) return 0;
    int64_t lo = 1, hi = (int64_t)1 << 30;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        s.batch = mid;
        if (!ct_memory_estimate_compute(&s, &e) && e.rss <= limit) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static int print_table(const options *o)
{
    const bool fit = o->memory >= 0;
    if (o->csv) {
        printf("model,strategy,mixed_precision,num_processes,batch_size,seq_len,parameters,gradients,optimizer,"
               "activations,temporaries,total,peak_rss%s\n", fit ? ",max_batch_size" : "");
    } else {
        char mem[32];
        printf("%s: %.1fM parameters; AdamW; micro-batch %lld x %lld tokens per rank%s%s%s\n", o->model,
               (double)ct_model_shape_params(&o->shape) / 1e6, (long long)o->batch, (long long)o->seq,
               fit ? "; largest micro-batch within " : "", fit ? human(o->memory, mem, sizeof mem) : "",
               fit ? " of peak RSS" : "");
    }
    for (int p = 0; p < o->nprecisions; p++) {
        if (!o->csv)
            printf("\nmixed_precision %s\n%-15s %5s %11s %11s %11s %11s %11s %11s %11s%s\n",
                   precision_name(o->precisions[p]), "strategy", "ranks", "params", "grads", "optimizer",
                   "activations", "temporaries", "total", "peak RSS", fit ? "  max batch" : "");
        for (int w = 0; w < o->nworlds; w++)
            for (int k = 0; k < o->nstrategies; k++) {
                ct_memory_setup s = {.model = o->shape, .strategy = o->strategies[k].st,
                                     .offload = o->strategies[k].offload, .precision = o->precisions[p],
                                     .world = o->worlds[w], .batch = o->batch, .seq = o->seq,
                                     .runtime_bytes = o->overhead, .fp8_widen = fp8_widen()};
                ct_memory_estimate e;
                if (ct_memory_estimate_compute(&s, &e)) {
                    fprintf(stderr, CMD ": %s\n", ct_last_error());
                    return 2;
                }
                char label[32];
                ct_memory_strategy_label(s.strategy, s.offload, label, sizeof label);
                int64_t mb = fit ? max_batch(s, o->memory) : 0;
                if (o->csv) {
                    printf("%s,%s,%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld", o->model, label,
                           precision_name(s.precision), s.world, (long long)s.batch, (long long)s.seq,
                           (long long)e.params, (long long)e.grads, (long long)e.optimizer, (long long)e.activations,
                           (long long)e.temporaries, (long long)e.total, (long long)e.rss);
                    if (fit) printf(",%lld", (long long)mb);
                    printf("\n");
                    continue;
                }
                char b[7][32];
                printf("%-15s %5d %11s %11s %11s %11s %11s %11s %11s", label, s.world, human(e.params, b[0], 32),
                       human(e.grads, b[1], 32), human(e.optimizer, b[2], 32), human(e.activations, b[3], 32),
                       human(e.temporaries, b[4], 32), human(e.total, b[5], 32), human(e.rss, b[6], 32));
                if (fit) printf("  %9lld", (long long)mb);
                printf("\n");
            }
    }
    return 0;
}

int ct_estimate_memory_main(int argc, char **argv)
{
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : 2;
    /* a built-in name, else a file; a name that is neither gets both reasons */
    const ct_model_spec *spec = ct_model_spec_find(o.model);
    if (spec) {
        o.shape = ct_model_spec_shape(spec);
    } else if (!strchr(o.model, '/') && !strchr(o.model, '.')) {
        fprintf(stderr, CMD ": %s; nor is it a file\n", ct_last_error());
        return 2;
    } else if (ct_model_file_load(o.model, &o.shape)) {
        fprintf(stderr, CMD ": %s\n", ct_last_error());
        return 2;
    }
    const int64_t positions = ct_model_shape_positions(&o.shape);
    if (!o.seq) o.seq = spec ? ct_model_spec_default_seq(spec) : positions;
    if (o.seq > positions) {
        fprintf(stderr, CMD ": --seq_len %lld is longer than %s's %s %lld\n", (long long)o.seq, o.model,
                o.shape.kind == CT_MODEL_LLAMA ? "max_position_embeddings" : "block size", (long long)positions);
        return 2;
    }
    if (o.measure) {
        if (o.nprecisions != 1 || o.nstrategies != 1) {
            fprintf(stderr, CMD ": --measure runs one configuration: give one --strategies and one "
                    "--mixed_precision (the ranks are the launcher's)\n");
            return 2;
        }
        ct_memory_measure m = {.setup = {.model = o.shape, .strategy = o.strategies[0].st,
                                         .offload = o.strategies[0].offload, .precision = o.precisions[0],
                                         .world = 1, .batch = o.batch, .seq = o.seq, .runtime_bytes = o.overhead,
                                         .fp8_widen = fp8_widen()},
                               .model_name = o.model, .steps = o.steps};
        return ct_memory_measure_run(&m);
    }
    return print_table(&o);
}
