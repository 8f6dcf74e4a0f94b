/* What `ctrain bench` reports (tools/bench.h): the markdown table, the checks under
 * it, results.csv and the plot (gnuplot, one row of panels per process count: the
 * memory per rank by kind as stacked bars, and tokens/s by precision).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/bench.h"

#define MIB (1024.0 * 1024.0)

/* The DDP row of r's process count and precision, when it succeeded. */
static const ct_bench_row *ddp_of(const ct_bench_row *rows, int n, const ct_bench_row *r)
{
    for (int i = 0; i < n; i++)
        if (rows[i].ok && rows[i].strategy->shard == CT_SHARD_NO_SHARD &&
            !ct_bench_strategy_is_layout(rows[i].strategy) && rows[i].processes == r->processes &&
            rows[i].precision == r->precision)
            return &rows[i];
    return NULL;
}

static void label_of(const ct_bench_row *r, char *buf, size_t cap)
{
    if (r->ok && r->strategy->shard == CT_SHARD_HYBRID)
        snprintf(buf, cap, "%s (G=%.0f)", r->strategy->name, r->fig[CT_BENCH_GROUP]);
    else snprintf(buf, cap, "%s", r->strategy->name);
}

/* Parameters of the model as bench_gpt_init (a GPT's block size at least T) or
 * bench_llama_init builds it. */
static double params_of(const ct_bench_opts *o)
{
    ct_model_shape m = ct_model_spec_shape(o->model);
    if (m.gpt.block_size < o->seq_len) m.gpt.block_size = o->seq_len;
    return (double)ct_model_shape_params(&m);
}

static long long vocab_of(const ct_bench_opts *o)
{
    ct_model_shape m = ct_model_spec_shape(o->model);
    return (long long)ct_model_shape_vocab(&m);
}

void ct_bench_table_print(FILE *f, const ct_bench_opts *o, const ct_bench_row *rows, int n)
{
    fprintf(f, "\n%s: %.0f parameters, %d x %d tokens per rank per step, %d warm-up + %d timed steps, %d thread%s "
               "per rank\n",
            o->model->name, params_of(o), o->batch_size, o->seq_len, o->warmup_steps, o->steps, o->threads,
            o->threads == 1 ? "" : "s");
    fputs("tokens/s over all ranks and the timed steps; memory, bytes sent and times per rank (the largest), per step\n\n"
          "| processes | precision | strategy | tokens/s | vs DDP | params MiB | grads MiB | optimizer MiB "
          "| activations MiB | peak RSS MiB | MiB sent/step | comm ms/step | exposed ms/step | loss "
          "| tp x pp x dp | MiB sent tp / dp / pp | bubble (1F1B) |\n"
          "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
          f);
    for (int i = 0; i < n; i++) {
        const ct_bench_row *r = &rows[i];
        char label[64];
        label_of(r, label, sizeof label);
        fprintf(f, "| %d | %s | %s | ", r->processes, r->precision, label);
        if (!r->ok) {
            fputs("failed: ", f);
            for (const char *c = r->error; *c; c++) fputc(*c == '|' ? '/' : *c, f);
            fputs(" | - | - | - | - | - | - | - | - | - | - | - | - | - |\n", f);
            continue;
        }
        const double *x = r->fig;
        const ct_bench_row *d = ddp_of(rows, n, r);
        char ratio[16] = "-";
        if (d) snprintf(ratio, sizeof ratio, "%.2f", x[CT_BENCH_TOKENS_PER_S] / d->fig[CT_BENCH_TOKENS_PER_S]);
        char bubble[48] = "-";
        if (x[CT_BENCH_PP] > 1) /* 1F1B's idle fraction: (pp - 1) / (M + pp - 1) */
            snprintf(bubble, sizeof bubble, "%.2f (%.2f)", x[CT_BENCH_BUBBLE],
                     (x[CT_BENCH_PP] - 1) / (x[CT_BENCH_MICRO_BATCHES] + x[CT_BENCH_PP] - 1));
        fprintf(f, "%.0f | %s | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.1f | %.4f | %.0f x %.0f x %.0f "
                   "| %.2f / %.2f / %.2f | %s |\n",
                x[CT_BENCH_TOKENS_PER_S], ratio, x[CT_BENCH_PARAMS_BYTES] / MIB, x[CT_BENCH_GRADS_BYTES] / MIB,
                x[CT_BENCH_OPTIMIZER_BYTES] / MIB, x[CT_BENCH_ACTIVATIONS_BYTES] / MIB,
                x[CT_BENCH_PEAK_RSS_BYTES] / MIB, x[CT_BENCH_SENT_BYTES] / MIB, x[CT_BENCH_COMM_MS],
                x[CT_BENCH_EXPOSED_MS], x[CT_BENCH_LOSS], x[CT_BENCH_TP], x[CT_BENCH_PP], x[CT_BENCH_DP],
                x[CT_BENCH_SENT_TP_BYTES] / MIB, x[CT_BENCH_SENT_DP_BYTES] / MIB, x[CT_BENCH_SENT_PP_BYTES] / MIB,
                bubble);
    }
    fputs("\nparams, grads, optimizer: storage kept between steps (the sharding engine's accounting; optimizer = "
          "the moments and the f32 master slices; DDP: 4, 4 and 8 bytes per parameter). activations: ctrain's "
          "peak live storage during a step minus those three (activations, gathered parameters, gradients "
          "before they are reduced, buckets). MiB sent: as ring algorithms send. comm: collectives in flight; "
          "exposed: the part the training thread waited for. loss: the last step's, mean over ranks.\n"
          "Layouts (tp, pp > 1), through the Accelerator: memory is what a rank trains (its shard of its "
          "stage); MiB sent per axis group; comm and exposed: the data-parallel axis only (a pipeline's "
          "reductions before the step block: exposed = comm); bubble: the time a stage waited on the pipeline "
          "over the pipeline's time, beside 1F1B's (pp - 1) / (M + pp - 1) with M micro-batches.\n",
          f);
}

int ct_bench_checks_print(FILE *f, const ct_bench_opts *o, const ct_bench_row *rows, int n)
{
    const double ln_v = log((double)vocab_of(o));
    int bad = 0, checked = 0;
    for (int i = 0; i < n; i++) {
        const ct_bench_row *r = &rows[i];
        if (!r->ok) continue;
        checked++;
        const double *x = r->fig;
        if (!(fabs(x[CT_BENCH_LOSS0] - ln_v) <= CT_BENCH_LOSS0_TOL))
            fprintf(f, "%s- check failed: %d processes, %s, %s: first loss %.4f is not within %.1f of ln %lld = %.4f\n",
                    bad++ ? "" : "\n", r->processes, r->precision, r->strategy->name, x[CT_BENCH_LOSS0],
                    CT_BENCH_LOSS0_TOL, vocab_of(o), ln_v);
        const ct_bench_row *d = ddp_of(rows, n, r);
        if (!d || d == r || strcmp(r->precision, "no")) continue;
        double rel = fabs(x[CT_BENCH_LOSS] - d->fig[CT_BENCH_LOSS]) / fabs(d->fig[CT_BENCH_LOSS]);
        if (!(rel <= CT_BENCH_LOSS_RTOL))
            fprintf(f, "%s- check failed: %d processes, f32, %s: last loss %.6f differs from DDP's %.6f by %.1e "
                       "relative (more than %.0e; the same tokens and weights)\n",
                    bad++ ? "" : "\n", r->processes, r->strategy->name, x[CT_BENCH_LOSS], d->fig[CT_BENCH_LOSS], rel,
                    CT_BENCH_LOSS_RTOL);
    }
    if (!checked) fputs("\nchecks: none (no run succeeded)\n", f);
    else if (!bad)
        fprintf(f, "\nchecks: every first loss within %.1f of ln %lld = %.4f; in f32 every loss within %.0e "
                   "relative of DDP's\n",
                CT_BENCH_LOSS0_TOL, vocab_of(o), ln_v, CT_BENCH_LOSS_RTOL);
    return bad;
}

/* s as one CSV field (RFC 4180: quoted when it holds a comma, quote or newline). */
static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

ct_status ct_bench_csv_write(const char *path, const ct_bench_opts *o, const ct_bench_row *rows, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) return ct_error_set(CT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    fputs("model,processes,mixed_precision,strategy,batch_size,seq_len,steps,warmup_steps,threads,status", f);
    for (int k = 0; k < CT_BENCH_NFIGURES; k++) fprintf(f, ",%s", ct_bench_figure_keys[k]);
    fputs(",transport,run_s,error\n", f);
    for (int i = 0; i < n; i++) {
        const ct_bench_row *r = &rows[i];
        fprintf(f, "%s,%d,%s,%s,%d,%d,%d,%d,%d,%s", o->model->name, r->processes, r->precision, r->strategy->name,
                o->batch_size, o->seq_len, o->steps, o->warmup_steps, o->threads, r->ok ? "ok" : "failed");
        for (int k = 0; k < CT_BENCH_NFIGURES; k++)
            if (r->ok) fprintf(f, ",%.10g", r->fig[k]);
            else fputc(',', f);
        fprintf(f, ",%s,%.1f,", r->ok ? r->transport : "", r->seconds);
        csv_field(f, r->ok ? "" : r->error);
        fputc('\n', f);
    }
    if (ferror(f) | fclose(f)) return ct_error_set(CT_ERR_IO, "writing %s failed", path);
    return CT_OK;
}

/* A precision as the plot names it: mixed_precision "no" is f32. */
static const char *prec_label(const char *p)
{
    return strcmp(p, "no") ? p : "f32";
}

/* s in a gnuplot single-quoted string ('' is a quote). */
static void gp_string(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* DIR/plot-N.dat per process count: a row per strategy that ran: its name, the four
 * MiB figures at the first precision, then tokens/s per precision ('?': none). */
static ct_status write_data(const char *dir, const ct_bench_opts *o, const ct_bench_row *rows, int n, int procs,
                            const char **prec0)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/plot-%d.dat", dir, procs);
    FILE *f = fopen(path, "w");
    if (!f) return ct_error_set(CT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    *prec0 = NULL;
    for (int i = 0; i < n && !*prec0; i++)
        if (rows[i].ok && rows[i].processes == procs) *prec0 = rows[i].precision;
    fprintf(f, "# strategy, MiB per rank (%s): params grads optimizer activations; tokens/s by precision:",
            *prec0 ? *prec0 : "-");
    for (int p = 0; p < o->nprecisions; p++) fprintf(f, " %s", o->precisions[p]);
    fputc('\n', f);
    for (int s = 0; s < o->nstrategies; s++) {
        const ct_bench_row *by[CT_BENCH_MAX_LIST] = {0}, *mem = NULL;
        bool any = false;
        for (int i = 0; i < n; i++)
            for (int p = 0; p < o->nprecisions; p++)
                if (rows[i].ok && rows[i].processes == procs && rows[i].strategy == o->strategies[s] &&
                    rows[i].precision == o->precisions[p]) {
                    by[p] = &rows[i];
                    any = true;
                    if (rows[i].precision == *prec0) mem = &rows[i];
                }
        if (!any) continue;
        fprintf(f, "\"%s\"", o->strategies[s]->name);
        const ct_bench_figure kinds[4] = {CT_BENCH_PARAMS_BYTES, CT_BENCH_GRADS_BYTES, CT_BENCH_OPTIMIZER_BYTES,
                                          CT_BENCH_ACTIVATIONS_BYTES};
        for (int k = 0; k < 4; k++)
            if (mem) fprintf(f, " %.3f", fmax(0.0, mem->fig[kinds[k]]) / MIB);
            else fputs(" ?", f);
        for (int p = 0; p < o->nprecisions; p++)
            if (by[p]) fprintf(f, " %.2f", by[p]->fig[CT_BENCH_TOKENS_PER_S]);
            else fputs(" ?", f);
        fputc('\n', f);
    }
    if (ferror(f) | fclose(f)) return ct_error_set(CT_ERR_IO, "writing %s failed", path);
    return CT_OK;
}

ct_status ct_bench_plot(const char *dir, const char *png, const ct_bench_opts *o, const ct_bench_row *rows, int n,
                        const char **note)
{
    *note = NULL;
    unlink(png); /* no stale figure when this run draws none */
    int counts[CT_BENCH_MAX_LIST], nc = 0;
    for (int a = 0; a < o->nprocesses; a++)
        for (int i = 0; i < n; i++)
            if (rows[i].ok && rows[i].processes == o->processes[a]) {
                counts[nc++] = o->processes[a];
                break;
            }
    if (!nc) {
        *note = "no run succeeded: nothing to plot";
        return CT_OK;
    }
    char script[4200];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *f = fopen(script, "w");
    if (!f) return ct_error_set(CT_ERR_IO, "cannot write %s: %s", script, strerror(errno));
    /* the paths are as ctrain bench was given them: run it from where ctrain bench ran */
    fprintf(f, "# ctrain bench's figure: gnuplot %s\nset terminal pngcairo noenhanced size 1300, %d font ',10'\nset output ",
            script, 430 * nc);
    gp_string(f, png);
    fputs("\nset datafile missing '?'\nset style data histograms\nset style fill solid 0.85 border -1\n"
          "set boxwidth 0.75\nset grid ytics\nset key outside right top vertical\nset yrange [0:*]\n",
          f);
    fprintf(f, "set multiplot layout %d, 2\n", nc);
    ct_status st = CT_OK;
    for (int c = 0; c < nc && !st; c++) {
        const char *prec0 = "-";
        if ((st = write_data(dir, o, rows, n, counts[c], &prec0))) break;
        char data[4200];
        snprintf(data, sizeof data, "%s/plot-%d.dat", dir, counts[c]);
        fprintf(f, "set title '%s: memory per rank, %d processes, %s'\nset ylabel 'MiB per rank'\n"
                   "set style histogram rowstacked\nplot ",
                o->model->name, counts[c], prec_label(prec0));
        gp_string(f, data);
        fputs(" using 2:xtic(1) title 'params' lc rgb '#4477aa', '' using 3 title 'grads' lc rgb '#66ccee', "
              "'' using 4 title 'optimizer' lc rgb '#228833', '' using 5 title 'activations' lc rgb '#ccbb44'\n",
              f);
        fprintf(f, "set title '%s: tokens/s, %d processes'\nset ylabel 'tokens/s (all ranks)'\n"
                   "set style histogram clustered gap 1\nplot ",
                o->model->name, counts[c]);
        static const char *const colours[] = {"#4477aa", "#ee6677", "#228833"};
        for (int p = 0; p < o->nprecisions; p++) {
            if (p) fputs(", ", f);
            else gp_string(f, data);
            fprintf(f, "%s using %d%s title '%s' lc rgb '%s'", p ? "''" : "", 6 + p, p ? "" : ":xtic(1)",
                    prec_label(o->precisions[p]), colours[p % 3]);
        }
        fputc('\n', f);
    }
    fputs("unset multiplot\n", f);
    if ((ferror(f) | fclose(f)) && !st) st = ct_error_set(CT_ERR_IO, "writing %s failed", script);
    if (st) return st;
    char *argv[] = {"gnuplot", script, NULL};
    ct_bench_exit x;
    st = ct_bench_spawn(argv, 120, NULL, NULL, &x);
    const char *err = x.err;
    if (st == CT_ERR_UNSUPPORTED) {
        *note = "gnuplot not found (Debian: apt-get install gnuplot-nox; tools/setup.sh installs it): no "
                "strategies.png; results.csv has the figures";
        st = CT_OK;
    } else if (!st && (x.status || x.timed_out || access(png, F_OK))) {
        const char *e = err && *err ? err : "no output";
        st = ct_error_set(CT_ERR_IO, "gnuplot %s %s: %.*s", script,
                          x.timed_out ? "timed out" : x.status ? "failed" : "drew no PNG", (int)strcspn(e, "\n"), e);
    }
    free(x.out);
    free(x.err);
    return st;
}
