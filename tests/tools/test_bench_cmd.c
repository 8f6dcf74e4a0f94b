/* Tests for `ctrain bench` (tools/bench_cmd.c, bench_args.c, bench_rank.c,
 * bench_report.c, bench_spawn.c), run as a program (CTRAIN_BIN; make test sets it) on
 * the smallest job there is: gpt:w1 (and llama:w1), 2 x 16 tokens per rank, one step,
 * 2 processes.
 *
 * The expectations are written out here from docs/launch.md, not taken from the
 * command: the CSV's header, one row per strategy in the order given, f32 losses equal
 * to DDP's within 1e-4 relative (the same tokens and weights), the first loss near
 * ln V (a uniform guess over V tokens; the initial weights are small), the parameter
 * counts worked out by hand from the models' shapes, the PNG
 * signature of the PNG specification. Nothing is timed. Every run is bounded by
 * `timeout` and every test by its Criterion timeout. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/tmpdir.h"
#include "tests/shell.h"

static char out[1 << 16], err[1 << 16];

static const char *ctrain_bin(void)
{
    const char *b = getenv("CTRAIN_BIN");
    if (!b || !*b) cr_skip_test("CTRAIN_BIN is not set: run through `make test`");
    return b;
}

static void slurp(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* Runs `env [VAR=VALUE] ctrain bench ARGS` under a 50 s limit; out and err hold its stdout and
 * stderr; returns its exit status. */
static int bench(const char *env, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout -k 5 50 env %s %s bench %s >%s 2>%s", env, ctrain_bin(), args,
             path_of("stdout"), path_of("stderr"));
    int st = system(cmd);
    slurp(path_of("stdout"), out, sizeof out);
    slurp(path_of("stderr"), err, sizeof err);
    return shell_status(st);
}

#define TINY "--model gpt:w1 --seq_len 16 --batch_size 2 --steps 1 --warmup_steps 0 "

static void assert_has(const char *hay, const char *needle)
{
    cr_assert(strstr(hay, needle), "expected '%s' in:\n%s\nstderr:\n%s", needle, hay, err);
}

/* ---- the CSV ---- */

#define HEADER                                                                                                  \
    "model,processes,mixed_precision,strategy,batch_size,seq_len,steps,warmup_steps,threads,status,"           \
    "tokens_per_s,step_ms,params_bytes,grads_bytes,optimizer_bytes,activations_bytes,step_peak_bytes,"          \
    "gathered_peak_bytes,peak_rss_bytes,sent_bytes,gathers,comm_ms,exposed_ms,loss0,loss,params,group,units,"    \
    "tp,pp,dp,micro_batches,sent_tp_bytes,sent_dp_bytes,sent_pp_bytes,bubble,transport,run_s,error"
#define COL_STRATEGY 3
#define COL_STATUS 9
#define COL_LOSS0 23
#define COL_LOSS 24
#define COL_PARAMS 25
#define COL_TP 28
#define COL_PP 29
#define COL_DP 30
#define COL_MICRO 31
#define COL_SENT_TP 32
#define COL_SENT_DP 33
#define COL_SENT_PP 34
#define COL_BUBBLE 35
#define COL_ERROR 38
#define NCOLS 39
#define MAX_ROWS 8

typedef struct {
    char cells[NCOLS + 1][256];
    int n;
} csv_row;

/* Reads tmpdir/out/results.csv (plain fields; a quoted last field is kept whole). */
static int read_csv(char *header, size_t cap, csv_row *rows)
{
    FILE *f = fopen(path_of("out/results.csv"), "r");
    cr_assert_not_null(f, "no results.csv; stdout:\n%s\nstderr:\n%s", out, err);
    cr_assert_not_null(fgets(header, (int)cap, f));
    header[strcspn(header, "\n")] = 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        cr_assert_lt(n, MAX_ROWS);
        csv_row *r = &rows[n++];
        r->n = 0;
        line[strcspn(line, "\n")] = 0;
        for (char *p = line;;) {
            size_t len = *p == '"' ? strlen(p) : strcspn(p, ",");
            cr_assert_leq(r->n, NCOLS);
            snprintf(r->cells[r->n++], sizeof r->cells[0], "%.*s", (int)len, p);
            if (!p[len]) break;
            p += len + 1;
        }
    }
    fclose(f);
    return n;
}

static void setup(void)
{
    make_tmpdir_with("/tmp/ct_bench_cmd_");
}

/* The rows of a 2-process f32 run of model over the strategies want[0..n) (ddp first):
 * the header, one row each in order, the first loss near ln V (small initial weights:
 * a near-uniform guess), the last loss equal to DDP's (the same tokens and weights),
 * the parameter count, the table's rows and the checks' line. */
static void check_f32_rows(const char *model, int vocab, long long params, const char *const *want, int n_want)
{
    char header[1024];
    csv_row rows[MAX_ROWS];
    int n = read_csv(header, sizeof header, rows);
    cr_assert_str_eq(header, HEADER);
    cr_assert_eq(n, n_want, "one row per strategy");
    const double ln_v = log((double)vocab);
    double ddp_loss = NAN;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(rows[i].n, NCOLS, "row %d has %d fields", i, rows[i].n);
        cr_assert_str_eq(rows[i].cells[0], model);
        cr_assert_str_eq(rows[i].cells[1], "2");
        cr_assert_str_eq(rows[i].cells[2], "no");
        cr_assert_str_eq(rows[i].cells[COL_STRATEGY], want[i]);
        cr_assert_str_eq(rows[i].cells[COL_STATUS], "ok", "%s: %s", want[i], rows[i].cells[COL_ERROR]);
        cr_assert_eq(atoll(rows[i].cells[COL_PARAMS]), params, "%s: %s parameters, by hand %lld", want[i],
                     rows[i].cells[COL_PARAMS], params);
        double loss0 = atof(rows[i].cells[COL_LOSS0]), loss = atof(rows[i].cells[COL_LOSS]);
        cr_assert_lt(fabs(loss0 - ln_v), 0.2, "%s: first loss %g, ln %d = %g", want[i], loss0, vocab, ln_v);
        if (i == 0) ddp_loss = loss;
        cr_assert_leq(fabs(loss - ddp_loss), 1e-4 * fabs(ddp_loss), "%s: loss %.8f, DDP's %.8f", want[i], loss,
                      ddp_loss);
        /* the table has the strategy's row too */
        char cell[64];
        snprintf(cell, sizeof cell, "| 2 | no | %s | ", want[i]);
        assert_has(out, cell);
    }
    char checks[64];
    snprintf(checks, sizeof checks, "checks: every first loss within 0.5 of ln %d", vocab);
    assert_has(out, checks);
}

/* gpt:w1: wte 256 x 256, wpe 256 x 256 (block = max(256, T)), 4 blocks of
 * 12 E^2 + 13 E, ln_f */
Test(bench_cmd, csv_rows_and_f32_losses, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    char args[1024];
    snprintf(args, sizeof args, TINY "--num_processes 2 --strategies ddp,zero1,zero2,zero3 --output_dir %s",
             path_of("out"));
    cr_assert_eq(bench("", args), 0, "stdout:\n%s\nstderr:\n%s", out, err);
    const char *const want[] = {"ddp", "zero1", "zero2", "zero3"};
    const long long E = 256;
    check_f32_rows("gpt:w1", 256, 2 * 256 * E + 4 * (12 * E * E + 13 * E) + 2 * E, want, 4);
}

/* The layouts on 2 processes: tp2 (Megatron-LM tensor parallelism, dp 1) and pp2 (a
 * 2-stage pipeline of 2 micro-batches, dp 1), each replica training on the rows of
 * both ranks: the same f32 loss as DDP's after an update (2 steps), the layout's
 * columns, and the pipeline's
 * bytes worked out by hand. gpt:w1, T = 16, B = 2: a replica trains on 4 rows, a
 * micro-batch is 2 x 16 x 256 f32 = 32 KiB; stage 0 sends the activations of the 2
 * micro-batches, stage 1 their gradients (64 KiB each), and the tied embedding's
 * gradient (256 x 256 f32 = 256 KiB) is all-reduced over the two stages: 2 (2-1)/2 of
 * it, so 320 KiB per rank. The bubble is a fraction. */
Test(bench_cmd, tp2_and_pp2_rows, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    char args[1024];
    snprintf(args, sizeof args,
             "--model gpt:w1 --seq_len 16 --batch_size 2 --steps 2 --warmup_steps 0 --num_processes 2 "
             "--strategies ddp,tp2,pp2 --num_micro_batches 2 --output_dir %s",
             path_of("out"));
    cr_assert_eq(bench("", args), 0, "stdout:\n%s\nstderr:\n%s", out, err);
    const char *const want[] = {"ddp", "tp2", "pp2"};
    const long long E = 256;
    check_f32_rows("gpt:w1", 256, 2 * 256 * E + 4 * (12 * E * E + 13 * E) + 2 * E, want, 3);
    char header[1024];
    csv_row rows[MAX_ROWS];
    cr_assert_eq(read_csv(header, sizeof header, rows), 3);
    /* tp x pp x dp, micro-batches */
    const char *const layout[3][4] = {{"1", "1", "2", "1"}, {"2", "1", "1", "1"}, {"1", "2", "1", "2"}};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            cr_assert_str_eq(rows[i].cells[COL_TP + k], layout[i][k], "%s: column %d", want[i], COL_TP + k);
    /* ddp: only the data-parallel axis sends */
    cr_assert_gt(atof(rows[0].cells[COL_SENT_DP]), 0);
    cr_assert_eq(atof(rows[0].cells[COL_SENT_TP]) + atof(rows[0].cells[COL_SENT_PP]), 0);
    /* tp2: Megatron's 4 allreduces of a replica's (4, 16, 256) activations per block
     * (2 forward, 2 backward) and 2 more around the vocabulary-parallel embedding and
     * head: 4 x 4 + 2 = 18 of 64 KiB, each sent whole on 2 ranks (2 (2-1)/2); the
     * cross-entropy's (4, 16) allreduces add a little */
    const double tp_bytes = atof(rows[1].cells[COL_SENT_TP]), megatron = 18.0 * 64 * 1024;
    cr_assert(tp_bytes >= megatron && tp_bytes < 1.05 * megatron, "tp bytes %g, Megatron's %g", tp_bytes, megatron);
    cr_assert_eq(atof(rows[1].cells[COL_SENT_DP]) + atof(rows[1].cells[COL_SENT_PP]), 0);
    /* pp2: by hand */
    cr_assert_eq(atof(rows[2].cells[COL_SENT_PP]), 320.0 * 1024, "pp bytes %s", rows[2].cells[COL_SENT_PP]);
    cr_assert_eq(atof(rows[2].cells[COL_SENT_TP]) + atof(rows[2].cells[COL_SENT_DP]), 0);
    double bubble = atof(rows[2].cells[COL_BUBBLE]);
    cr_assert(bubble >= 0 && bubble < 1, "bubble %g", bubble);
    /* the table shows 1F1B's (pp - 1) / (M + pp - 1) = 1/3 beside it */
    assert_has(out, " (0.33) |");
}

/* A layout that does not fit the processes fails with a row that says why. */
Test(bench_cmd, a_layout_needs_its_processes, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    char args[1024];
    snprintf(args, sizeof args, TINY "--num_processes 2 --strategies tp2dp2 --output_dir %s", path_of("out"));
    cr_assert_eq(bench("", args), 1, "stdout:\n%s\nstderr:\n%s", out, err);
    assert_has(out, "| 2 | no | tp2dp2 | failed: ");
    assert_has(out, "tp2dp2 needs a multiple of 2 processes, at least 4");
}

/* llama:w1 (nn/llama.h): embed_tokens and the untied lm_head 2048 x 256, the norm;
 * 4 layers of q, o 256 x 256, k, v 128 x 256 (2 key/value heads of 64), gate, up
 * 688 x 256, down 256 x 688, two norms */
Test(bench_cmd, llama_csv_rows_and_f32_losses, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    char args[1024];
    snprintf(args, sizeof args,
             "--model llama:w1 --seq_len 16 --batch_size 2 --steps 1 --warmup_steps 0 --num_processes 2 "
             "--strategies ddp,zero1,zero3 --output_dir %s",
             path_of("out"));
    cr_assert_eq(bench("", args), 0, "stdout:\n%s\nstderr:\n%s", out, err);
    const char *const want[] = {"ddp", "zero1", "zero3"};
    const long long C = 256, layer = 2 * C * C + 2 * 128 * C + 3 * 688 * C + 2 * C;
    check_f32_rows("llama:w1", 2048, 2 * 2048 * C + C + 4 * layer, want, 3);
    assert_has(out, "llama:w1: 3950848 parameters");
}

/* gnuplot on PATH? */
static bool have_gnuplot(void)
{
    return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

Test(bench_cmd, png_plot, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    if (!have_gnuplot()) cr_skip_test("gnuplot is not installed (tools/setup.sh installs gnuplot-nox): no PNG to check");
    char args[1024];
    snprintf(args, sizeof args, TINY "--num_processes 2 --strategies ddp,zero3 --mixed_precision no,bf16 "
                                     "--output_dir %s",
             path_of("out"));
    cr_assert_eq(bench("", args), 0, "stdout:\n%s\nstderr:\n%s", out, err);
    FILE *f = fopen(path_of("out/strategies.png"), "rb");
    cr_assert_not_null(f, "no strategies.png; stdout:\n%s", out);
    unsigned char sig[8] = {0};
    size_t got = fread(sig, 1, 8, f);
    fclose(f);
    /* PNG specification, section 5.2: 137 80 78 71 13 10 26 10 */
    const unsigned char want[8] = {137, 80, 78, 71, 13, 10, 26, 10};
    cr_assert_eq(got, 8);
    cr_assert_arr_eq(sig, want, 8, "strategies.png does not start with the PNG signature");
}

/* A bad name: exit 2, the allowed names listed, nothing run (no output directory). */
static void bad_name(const char *flag, const char *value, const char *bad, const char *allowed)
{
    char args[1024];
    snprintf(args, sizeof args, "%s %s --output_dir %s", flag, value, path_of("out"));
    cr_assert_eq(bench("", args), 2, "%s %s: stdout:\n%s\nstderr:\n%s", flag, value, out, err);
    assert_has(err, bad);
    assert_has(err, allowed);
    cr_assert_str_empty(out);
    struct stat sb;
    cr_assert_neq(stat(path_of("out"), &sb), 0, "%s %s: the output directory was created", flag, value);
}

Test(bench_cmd, bad_names_list_the_allowed_ones, .init = setup, .fini = remove_tmpdir, .timeout = 20)
{
    bad_name("--strategies", "ddp,zero4", "'zero4'",
             "allowed: ddp, zero1, zero2, zero3, hybrid, zero2_offload, zero3_offload, tp2, tp2sp, tp2dp2, tp4, "
             "pp2, pp2dp2, pp4, tp2pp2");
    bad_name("--model", "gpt:w9", "'gpt:w9'", "gpt:w1, gpt:wide, gpt2, gpt2-medium, gpt2-large, gpt2-xl");
    bad_name("--mixed_precision", "no,fp8", "'fp8'", "allowed: no, bf16, fp16");
    bad_name("--num_processes", "2,0", "'0'", "from 1 to");
    bad_name("--steps", "two", "'two'", "expected a whole number");
    bad_name("--bogus", "1", "'--bogus'", "unknown flag");
}

/* hybrid needs an even number of processes: with 3 its run fails, its row says why,
 * the other strategies still run, and the exit status is 1. PATH without gnuplot
 * also shows the note and no PNG (the launcher and the ranks need no PATH: they are
 * this binary, by its full path). */
Test(bench_cmd, a_failed_run_is_a_row, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    char args[1024];
    snprintf(args, sizeof args, TINY "--num_processes 3 --strategies ddp,hybrid,zero1 --output_dir %s",
             path_of("out"));
    cr_assert_eq(bench("PATH=/nonexistent", args), 1, "stdout:\n%s\nstderr:\n%s", out, err);
    assert_has(out, "| 3 | no | hybrid | failed: ");
    assert_has(out, "N must be even, and it is 3");
    assert_has(out, "| 3 | no | ddp | ");
    assert_has(out, "| 3 | no | zero1 | ");
    assert_has(err, "1 of 3 runs failed");
    assert_has(out, "gnuplot not found");
    struct stat sb;
    cr_assert_neq(stat(path_of("out/strategies.png"), &sb), 0, "a PNG without gnuplot");
    char header[1024];
    csv_row rows[MAX_ROWS];
    cr_assert_eq(read_csv(header, sizeof header, rows), 3);
    cr_assert_str_eq(rows[0].cells[COL_STATUS], "ok");
    cr_assert_str_eq(rows[1].cells[COL_STATUS], "failed");
    cr_assert(strstr(rows[1].cells[COL_ERROR], "N must be even"), "error field: %s", rows[1].cells[COL_ERROR]);
    cr_assert_str_eq(rows[2].cells[COL_STATUS], "ok");
}

/* Processes whose command line holds both a and b. */
static int count_procs(const char *a, const char *b)
{
    DIR *d = opendir("/proc");
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300], buf[4096];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < k; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[k] = 0;
        n += strstr(buf, a) && strstr(buf, b);
    }
    closedir(d);
    return n;
}

/* A run past --timeout is stopped, ranks included, and reported. */
Test(bench_cmd, a_run_past_the_timeout_is_stopped, .init = setup, .fini = remove_tmpdir, .timeout = 60)
{
    char args[1024];
    snprintf(args, sizeof args,
             "--model gpt:w1 --seq_len 16 --batch_size 2 --steps 1000000 --num_processes 2 --strategies ddp "
             "--seed 9731 --timeout 2 --output_dir %s",
             path_of("out"));
    cr_assert_eq(bench("", args), 1, "stdout:\n%s\nstderr:\n%s", out, err);
    assert_has(out, "| 2 | no | ddp | failed: timed out after 2 s (--timeout)");
    for (int i = 0; i < 50 && count_procs("bench-rank", "9731"); i++) usleep(100000);
    cr_assert_eq(count_procs("bench-rank", "9731"), 0, "ranks of the stopped run are still running");
}
