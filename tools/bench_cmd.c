/* `ctrain bench` (tools/bench.h): the runs, one per cell of num_processes x
 * mixed_precision x strategies, each
 *
 *     ctrain launch --num_processes N --main_process_port 0 --num_cpu_threads_per_process K \
 *         CTRAIN bench-rank --model M --strategies S --mixed_precision P ...
 *
 * with CTRAIN this very binary (uv_exepath), run by ct_bench_spawn under --timeout. Its
 * stdout holds rank 0's RESULT line; a run that fails becomes a row with the ranks'
 * first message and the next run starts. Each run's output is kept in
 * DIR/logs/N-P-S.log. Then the table, the checks, DIR/results.csv and the plot.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "tools/bench.h"

bool ct_bench_result_parse(const char *line, ct_bench_row *r)
{
    for (int k = 0; k < CT_BENCH_NFIGURES; k++) {
        char key[48];
        snprintf(key, sizeof key, " %s=", ct_bench_figure_keys[k]);
        const char *p = strstr(line, key);
        char *end = NULL;
        r->fig[k] = p ? strtod(p + strlen(key), &end) : 0;
        if (!p || end == p + strlen(key) || (*end && *end != ' ' && *end != '\n')) {
            snprintf(r->error, sizeof r->error, "the RESULT line lacks a number for %s: %.300s",
                     ct_bench_figure_keys[k], line);
            return false;
        }
    }
    const char *t = strstr(line, " transport=");
    snprintf(r->transport, sizeof r->transport, "%.*s", t ? (int)strcspn(t + 11, " \n") : 1, t ? t + 11 : "-");
    return true;
}

/* mkdir -p dir */
static ct_status make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return ct_error_set(CT_ERR_INVALID, "--output_dir: the path is too long");
    for (size_t i = 1, n = strlen(p); i <= n; i++) {
        if (p[i] != '/' && p[i]) continue;
        char c = p[i];
        p[i] = 0;
        struct stat sb;
        if (mkdir(p, 0777) && (errno != EEXIST || stat(p, &sb) || !S_ISDIR(sb.st_mode)))
            return ct_error_set(CT_ERR_IO, "--output_dir %s: cannot create %s: %s", dir, p,
                                errno == EEXIST ? "exists and is not a directory" : strerror(errno));
        p[i] = c;
    }
    return CT_OK;
}

/* ---- progress --------------------------------------------------------------------- */

typedef struct progress {
    bool tty;
    int interrupt; /* the signal that stopped the last run, 0 if none */
    int i, n;
    const ct_bench_row *row;
} progress;

static void describe(const ct_bench_row *r, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s, %d process%s, mixed_precision %s", r->strategy->name, r->processes,
             r->processes == 1 ? "" : "es", r->precision);
}

/* On a terminal one line, rewritten in place; otherwise a line as each run starts and ends. */
static void on_tick(double s, void *ud)
{
    progress *p = ud;
    if (!p->tty) return;
    char what[128];
    describe(p->row, what, sizeof what);
    printf("\r\033[K[%d/%d] %s: %.0f s", p->i + 1, p->n, what, s);
    fflush(stdout);
}

/* ---- one run ---------------------------------------------------------------------- */

/* The reason a failed run gives: the ranks' first message, else the launcher's, else the
 * first line of stderr. */
static void failure_reason(const char *err, int status, char *buf, size_t cap)
{
    static const char *const marks[] = {"ctrain bench-rank: ", "ctrain launch: "};
    for (int m = 0; m < 2; m++) {
        const char *p = strstr(err, marks[m]);
        if (m == 1) /* the launcher's last line is its summary */
            for (const char *q = p; q && (q = strstr(q + 1, marks[m])) != NULL;) p = q;
        if (p) {
            p += m == 0 ? strlen(marks[m]) : 0;
            snprintf(buf, cap, "%.*s", (int)strcspn(p, "\n"), p);
            return;
        }
    }
    const char *p = err + strspn(err, "\n");
    if (*p) snprintf(buf, cap, "%.*s", (int)strcspn(p, "\n"), p);
    else snprintf(buf, cap, "exit status %d", status);
}

static void write_log(const char *dir, const ct_bench_row *r, char *const *argv, const char *out, const char *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/logs/%d-%s-%s.log", dir, r->processes, r->precision, r->strategy->name);
    FILE *f = fopen(path, "w");
    if (!f) return; /* the log is a convenience; the table has the reason */
    fputs("$", f);
    for (int k = 0; argv[k]; k++) fprintf(f, " %s", argv[k]);
    fprintf(f, "\n== stdout\n%s\n== stderr\n%s", out, err);
    fclose(f);
}

static void run_one(const ct_bench_opts *o, const char *exe, ct_bench_row *r, progress *p)
{
    char n[16], b[16], t[16], s[16], w[16], k[16], mb[16], seed[32];
    snprintf(n, sizeof n, "%d", r->processes);
    snprintf(b, sizeof b, "%d", o->batch_size);
    snprintf(t, sizeof t, "%d", o->seq_len);
    snprintf(s, sizeof s, "%d", o->steps);
    snprintf(w, sizeof w, "%d", o->warmup_steps);
    snprintf(k, sizeof k, "%d", o->threads);
    snprintf(mb, sizeof mb, "%d", o->num_micro_batches);
    snprintf(seed, sizeof seed, "%lld", o->seed);
    char *argv[] = {(char *)exe, "launch", "--num_processes", n, "--main_process_port", "0",
                    "--num_cpu_threads_per_process", k, (char *)exe, "bench-rank", "--model",
                    (char *)o->model->name, "--strategies", (char *)r->strategy->name, "--mixed_precision",
                    (char *)r->precision, "--batch_size", b, "--seq_len", t, "--steps", s, "--warmup_steps", w,
                    "--num_cpu_threads_per_process", k, "--num_micro_batches", mb, "--seed", seed, NULL};
    char what[128];
    describe(r, what, sizeof what);
    if (!p->tty) printf("[%d/%d] %s: running\n", p->i + 1, p->n, what);
    else on_tick(0, p);
    fflush(stdout);
    ct_bench_exit x;
    double t0 = (double)uv_hrtime() * 1e-9;
    if (ct_bench_spawn(argv, o->timeout_s, on_tick, p, &x)) {
        snprintf(r->error, sizeof r->error, "%s", ct_last_error());
    } else if (x.interrupt) {
        snprintf(r->error, sizeof r->error, "interrupted (SIG%s)", sigabbrev_np(x.interrupt));
    } else if (x.timed_out) {
        snprintf(r->error, sizeof r->error, "timed out after %.0f s (--timeout)", o->timeout_s);
    } else if (x.status) {
        failure_reason(x.err, x.status, r->error, sizeof r->error);
    } else {
        const char *line = strstr(x.out, "[rank0] RESULT ");
        if (!line) snprintf(r->error, sizeof r->error, "no RESULT line from rank 0 (see %s/logs/)", o->output_dir);
        else r->ok = ct_bench_result_parse(line + 7, r);
    }
    r->seconds = (double)uv_hrtime() * 1e-9 - t0;
    if (x.out && x.err) write_log(o->output_dir, r, argv, x.out, x.err);
    free(x.out);
    free(x.err);
    p->interrupt = x.interrupt;
    if (!p->tty) {
        if (r->ok) printf("[%d/%d] %s: %.0f tokens/s (%.1f s)\n", p->i + 1, p->n, what, r->fig[CT_BENCH_TOKENS_PER_S],
                          r->seconds);
        else printf("[%d/%d] %s: failed: %s\n", p->i + 1, p->n, what, r->error);
        fflush(stdout);
    }
}

/* ---- the command ------------------------------------------------------------------ */

int ct_bench_main(int argc, char **argv)
{
    ct_bench_opts o;
    if (ct_bench_args_parse(argc, argv, &o)) {
        fprintf(stderr, "ctrain bench: %s\n", ct_last_error());
        return 2;
    }
    if (o.help) {
        ct_bench_usage(stdout);
        return 0;
    }
    char exe[4096], logs[4200];
    size_t exe_len = sizeof exe;
    int rc = uv_exepath(exe, &exe_len);
    if (rc) {
        fprintf(stderr, "ctrain bench: cannot find this program's path (uv_exepath: %s)\n", uv_strerror(rc));
        return 1;
    }
    snprintf(logs, sizeof logs, "%s/logs", o.output_dir);
    if (make_dirs(logs)) {
        fprintf(stderr, "ctrain bench: %s\n", ct_last_error());
        return 1;
    }
    const int n = o.nprocesses * o.nprecisions * o.nstrategies;
    ct_bench_row *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "ctrain bench: out of memory for %d runs\n", n);
        return 1;
    }
    progress p = {.tty = isatty(1), .n = n};
    int failed = 0;
    for (int a = 0, i = 0; a < o.nprocesses; a++)
        for (int b = 0; b < o.nprecisions; b++)
            for (int c = 0; c < o.nstrategies; c++, i++) {
                if (p.interrupt) { /* the rest is not run */
                    rows[i] = (ct_bench_row){.processes = o.processes[a], .precision = o.precisions[b],
                                             .strategy = o.strategies[c]};
                    snprintf(rows[i].error, sizeof rows[i].error, "not run (interrupted)");
                    failed++;
                    continue;
                }
                rows[i] = (ct_bench_row){.processes = o.processes[a], .precision = o.precisions[b],
                                         .strategy = o.strategies[c]};
                p.i = i;
                p.row = &rows[i];
                run_one(&o, exe, &rows[i], &p);
                failed += !rows[i].ok;
            }
    if (p.tty) printf("\r\033[K");
    ct_bench_table_print(stdout, &o, rows, n);
    int violations = ct_bench_checks_print(stdout, &o, rows, n);
    char csv[4200], png[4200];
    snprintf(csv, sizeof csv, "%s/results.csv", o.output_dir);
    snprintf(png, sizeof png, "%s/strategies.png", o.output_dir);
    int code = failed || violations ? 1 : 0;
    if (ct_bench_csv_write(csv, &o, rows, n)) {
        fprintf(stderr, "ctrain bench: %s\n", ct_last_error());
        code = 1;
    } else {
        printf("\nwrote %s\n", csv);
    }
    const char *note = NULL;
    if (ct_bench_plot(o.output_dir, png, &o, rows, n, &note)) {
        fprintf(stderr, "ctrain bench: the plot: %s\n", ct_last_error());
        code = 1;
    } else if (note) {
        printf("%s\n", note);
    } else {
        printf("wrote %s\n", png);
    }
    if (failed) fprintf(stderr, "ctrain bench: %d of %d runs failed (their rows say why; logs in %s)\n", failed, n, logs);
    if (violations) fprintf(stderr, "ctrain bench: %d check%s failed (listed under the table)\n", violations,
                            violations == 1 ? "" : "s");
    free(rows);
    return p.interrupt ? 128 + p.interrupt : code;
}
