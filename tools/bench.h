/* ctrain bench — shard strategies side by side on one model: tokens/s, memory per rank by
 * kind, bytes on the wire, exposed communication; a table, a CSV and a plot.
 *
 *     ctrain bench --model gpt:w1 --num_processes 4 --strategies ddp,zero1,zero2,zero3,hybrid
 *
 * User documentation: docs/launch.md, "ctrain bench". The pieces:
 *   tools/bench_args.c    flags -> ct_bench_opts, the help text, the strategy table;
 *   tools/bench_cmd.c     the runs: one `ctrain launch` per cell (libuv: spawn, capture,
 *                         per-run timeout), the progress line, the RESULT line parsed;
 *   tools/bench_report.c  the table, the checks under it, results.csv, the gnuplot plot;
 *   tools/bench_rank.c    the rank side: the hidden subcommand `ctrain bench-rank` that
 *                         `ctrain launch` starts on every rank (tools/bench_gpt.h's GPT
 *                         or Llama);
 *   tools/bench_layout.c  its model-parallel layouts (tpK, tpKsp, ppK; dp = N / K).
 *
 * These are the `ctrain` command's functions: they print and return exit codes, never
 * exit(). Single-threaded.
 */
#ifndef CT_TOOLS_BENCH_H
#define CT_TOOLS_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ctrain.h"
#include "tools/model_spec.h"

#define CT_BENCH_MAX_LIST 16      /* entries of a list flag */
#define CT_BENCH_ERROR_MAX 512    /* a failed run's message */
#define CT_BENCH_LOSS0_TOL 0.5    /* |first loss - ln vocab| allowed */
#define CT_BENCH_LOSS_RTOL 1e-4   /* f32: |loss - DDP's| / |DDP's| allowed */

/* A strategy as the command line names it. */
typedef struct ct_bench_strategy {
    const char *name;        /* "ddp", "zero1", ..., "zero3_offload" */
    const char *about;       /* one line for --help */
    ct_shard_strategy shard; /* NO_SHARD for ddp */
    bool offload;            /* CPU offload of the optimizer (ZeRO-Offload) */
    /* Model-parallel layouts (tools/bench_layout.c), 0 for the shard strategies: the
     * tensor-parallel degree (Megatron-LM through the Accelerator; sp: with sequence
     * parallelism) or the pipeline degree (parallel/pipeline_model.h); the data-parallel
     * degree is what is left of the processes, dp = N / (tp pp), and dp is the least
     * degree the layout asks for (tp2dp2 needs dp >= 2, so N >= 4). */
    int tp, pp, dp_min;
    bool sp;
} ct_bench_strategy;

/* True for a model-parallel layout (tp or pp above 1). */
static inline bool ct_bench_strategy_is_layout(const ct_bench_strategy *s)
{
    return s->tp > 1 || s->pp > 1;
}

/* The strategy called name, or NULL + CT_ERR_INVALID naming it and the allowed ones. */
const ct_bench_strategy *ct_bench_strategy_find(const char *name);
/* "ddp, zero1, ..." into buf (the allowed names). */
void ct_bench_strategy_names(char *buf, size_t cap);

typedef struct ct_bench_opts {
    const ct_model_spec *model;
    const ct_bench_strategy *strategies[CT_BENCH_MAX_LIST];
    int nstrategies;
    const char *precisions[CT_BENCH_MAX_LIST]; /* "no", "bf16", "fp16" (static strings) */
    int nprecisions;
    int processes[CT_BENCH_MAX_LIST];
    int nprocesses;
    int batch_size, seq_len, steps, warmup_steps, threads;
    int num_micro_batches; /* pipeline layouts: micro-batches per step (default 4) */
    long long seed;
    double timeout_s;
    const char *output_dir; /* borrowed from argv or static */
    bool help;
} ct_bench_opts;

/* Parses `bench [flags]` (argv[0] is "bench"); CT_ERR_INVALID + a message naming the
 * flag, the value and what is allowed. Strings borrow from argv. */
ct_status ct_bench_args_parse(int argc, char **argv, ct_bench_opts *o);
void ct_bench_usage(FILE *f);

/* The figures of one run: the rank's RESULT line (tools/bench_rank.c documents each). */
typedef enum {
    CT_BENCH_TOKENS_PER_S, CT_BENCH_STEP_MS, CT_BENCH_PARAMS_BYTES, CT_BENCH_GRADS_BYTES,
    CT_BENCH_OPTIMIZER_BYTES, CT_BENCH_ACTIVATIONS_BYTES, CT_BENCH_STEP_PEAK_BYTES,
    CT_BENCH_GATHERED_PEAK_BYTES, CT_BENCH_PEAK_RSS_BYTES, CT_BENCH_SENT_BYTES, CT_BENCH_GATHERS,
    CT_BENCH_COMM_MS, CT_BENCH_EXPOSED_MS, CT_BENCH_LOSS0, CT_BENCH_LOSS, CT_BENCH_PARAMS,
    CT_BENCH_GROUP, CT_BENCH_UNITS, CT_BENCH_TP, CT_BENCH_PP, CT_BENCH_DP, CT_BENCH_MICRO_BATCHES,
    CT_BENCH_SENT_TP_BYTES, CT_BENCH_SENT_DP_BYTES, CT_BENCH_SENT_PP_BYTES, CT_BENCH_BUBBLE, CT_BENCH_NFIGURES
} ct_bench_figure;

/* The RESULT keys, in ct_bench_figure order (also the CSV's columns). */
extern const char *const ct_bench_figure_keys[CT_BENCH_NFIGURES];

typedef struct ct_bench_row {
    int processes;
    const char *precision;
    const ct_bench_strategy *strategy;
    bool ok;
    double fig[CT_BENCH_NFIGURES];
    char transport[16];
    double seconds;                 /* wall time of the run */
    char error[CT_BENCH_ERROR_MAX]; /* when !ok: why (the rank's message) */
} ct_bench_row;

/* Fills r->fig and r->transport from a "RESULT key=value ..." line; false when a key is
 * missing or a value is not a number (r->error says which). */
bool ct_bench_result_parse(const char *line, ct_bench_row *r);

/* ---- the report (tools/bench_report.c) ---- */

/* The markdown table of rows[0..n) on f, then the notes and the failed runs. */
void ct_bench_table_print(FILE *f, const ct_bench_opts *o, const ct_bench_row *rows, int n);
/* Appends the check violations under the table to f: f32 losses against DDP's
 * (CT_BENCH_LOSS_RTOL), first losses against ln vocab (CT_BENCH_LOSS0_TOL). Returns
 * how many. */
int ct_bench_checks_print(FILE *f, const ct_bench_opts *o, const ct_bench_row *rows, int n);
/* Writes path: the header and one row per run. CT_ERR_IO naming the file. */
ct_status ct_bench_csv_write(const char *path, const ct_bench_opts *o, const ct_bench_row *rows, int n);
/* Writes the plot's data and script into dir, runs gnuplot into png. CT_OK with
 * *note set when gnuplot is not installed (nothing drawn); an error when it fails. */
ct_status ct_bench_plot(const char *dir, const char *png, const ct_bench_opts *o, const ct_bench_row *rows, int n,
                        const char **note);

/* How a child ran (ct_bench_spawn). */
typedef struct ct_bench_exit {
    int status;     /* its exit status, or 128 + signal */
    bool timed_out; /* stopped at the deadline */
    int interrupt;  /* SIGINT or SIGTERM that we received while it ran (passed on to it), or 0 */
    char *out, *err; /* its stdout and stderr, NUL-terminated (each up to 4 MiB; more is
                      * dropped); malloc'd, the caller frees them (also on error) */
} ct_bench_exit;

/* Runs argv (argv[0] looked up on PATH) with our environment, stdin /dev/null, in a
 * process group of its own, collecting its output; after timeout_s sends SIGTERM to
 * the group and SIGKILL 10 s later. SIGINT and SIGTERM sent to us meanwhile are passed
 * on to the group (SIGKILL 10 s later). tick (may be NULL) is called about once a
 * second with the seconds so far. CT_OK once it has exited, or an error when it could
 * not start (not found on PATH: CT_ERR_UNSUPPORTED). */
ct_status ct_bench_spawn(char *const *argv, double timeout_s, void (*tick)(double s, void *ud), void *ud,
                         ct_bench_exit *res);

/* `ctrain bench ...` and the hidden `ctrain bench-rank ...`; argv[0] is the name. */
int ct_bench_main(int argc, char **argv);
int ct_bench_rank_main(int argc, char **argv);

/* The rank side of a model-parallel layout (tools/bench_layout.c): trains o's model
 * under o->strategies[0] (tp or pp) and fills fig (valid on every rank) and
 * *transport, as bench_rank.c does for the shard strategies. CT_OK or an error naming
 * the rank. */
ct_status ct_bench_layout_train(const ct_bench_opts *o, double *fig, const char **transport);

#endif
