/* The shared parts of the training examples; see train_util.h. */
#include "examples/common/train_util.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/frame.h"

static const char *program = "example";

void ex_set_program(const char *name) { program = name; }
const char *ex_program(void) { return program; }

/* ---- options --------------------------------------------------------------------- */

bool ex_parse_i64(const char *flag, const char *s, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo) {
        fprintf(stderr, "%s: %s %s: expected an integer >= %lld\n", program, flag, s, (long long)lo);
        return false;
    }
    *out = v;
    return true;
}

bool ex_parse_f64(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s %s: expected a number in [%g, %g]\n", program, flag, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

/* ---- data ------------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char *ex_read_fortunes(size_t *len)
{
    DIR *dir = opendir(EX_FORTUNES_DIR);
    if (!dir) {
        fprintf(stderr, "%s: cannot open %s: %s (install Debian's fortunes package or pass --data FILE)\n", program,
                EX_FORTUNES_DIR, strerror(errno));
        return NULL;
    }
    char *names[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < 512)
        if (e->d_name[0] != '.' && !strchr(e->d_name, '.')) names[n++] = strdup(e->d_name);
    closedir(dir);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", EX_FORTUNES_DIR, names[i]);
        free(names[i]);
        FILE *f = fopen(path, "rb");
        struct stat st;
        if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
            if (f) fclose(f);
            continue;
        }
        if (*len + (size_t)st.st_size + 1 > cap) {
            cap = (*len + (size_t)st.st_size + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                fclose(f);
                free(buf);
                for (int k = i + 1; k < n; k++) free(names[k]);
                fprintf(stderr, "%s: out of memory reading %s\n", program, path);
                return NULL;
            }
            buf = nb;
        }
        *len += fread(buf + *len, 1, (size_t)st.st_size, f);
        fclose(f);
    }
    if (!*len) {
        fprintf(stderr, "%s: no fortune files in %s\n", program, EX_FORTUNES_DIR);
        free(buf);
        return NULL;
    }
    return buf;
}

char *ex_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    char *buf = NULL;
    if (f && !fstat(fileno(f), &st) && S_ISREG(st.st_mode) && (buf = malloc((size_t)st.st_size + 1))) {
        *len = fread(buf, 1, (size_t)st.st_size, f);
        buf[*len] = '\0';
        if (ferror(f)) {
            free(buf);
            buf = NULL;
        }
    }
    int err = errno;
    if (f) fclose(f);
    if (!buf) fprintf(stderr, "%s: cannot read %s: %s\n", program, path, f ? "not a readable file" : strerror(err));
    return buf;
}

/* ---- progress -------------------------------------------------------------------- */

double ex_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fmt_time(char *buf, size_t cap, double s)
{
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%dh%02dm", t / 3600, t / 60 % 60);
    else snprintf(buf, cap, "%dm%02ds", t / 60, t % 60);
}

void ex_progress(bool tty, int64_t step, int64_t steps, int64_t done, double loss, double smooth, double tok_s,
                 double elapsed)
{
    char eta[32], el[32];
    double per = done > 0 ? elapsed / (double)done : 0;
    fmt_time(eta, sizeof eta, per * (double)(steps - step));
    fmt_time(el, sizeof el, elapsed);
    if (tty) {
        int width = 30, fill = steps ? (int)(width * step / steps) : width;
        fprintf(stderr, "\r[%.*s%*s] step %lld/%lld  loss %.4f  %.0f tok/s  %s elapsed  ETA %s ", fill,
                "==============================", width - fill, "", (long long)step, (long long)steps, smooth, tok_s,
                el, eta);
        fflush(stderr);
    } else {
        printf("step %lld/%lld  loss %.6f  smoothed %.4f  %.0f tok/s  elapsed %s  ETA %s\n", (long long)step,
               (long long)steps, loss, smooth, tok_s, el, eta);
        fflush(stdout);
    }
}

double ex_evaluate(ct_module *m, ex_loss_fn loss_fn, void *model, ct_loader *val, int64_t n)
{
    double sum = 0;
    int64_t count = 0;
    ct_module_train(m, false);
    ct_loader_set_cursor(val, 0, 0);
    CT_NO_GRAD {
        for (int64_t i = 0; i < n; i++) {
            bool stop = false;
            CT_FRAME {
                ct_tensor *x, *y;
                ct_loader_result r = ct_loader_next(val, &x, &y);
                if (r != CT_LOADER_BATCH) {
                    stop = true;
                } else {
                    ct_tensor *loss = loss_fn(model, x, y);
                    if (loss) {
                        sum += ct_tensor_item(loss);
                        count++;
                    }
                }
            }
            if (stop) break;
        }
    }
    ct_module_train(m, true);
    return count ? sum / (double)count : NAN;
}

/* ---- checkpoints ----------------------------------------------------------------- */

static const char *const PROGRESS_KEYS[2] = {"smoothed_loss", "last_val_loss"};

static ct_status progress_state_dict(void *obj, ct_state_dict *out)
{
    const ex_progress_state *ps = obj;
    const double vals[2] = {ps->smooth, ps->last_val};
    *out = (ct_state_dict){.names = calloc(2, sizeof(char *)), .tensors = calloc(2, sizeof(ct_tensor *))};
    ct_status st = out->names && out->tensors ? CT_OK
                                              : ct_error_set(CT_ERR_NOMEM, "%s: progress state: out of memory", program);
    /* the frame's reference goes at the pop; the state dict keeps its own */
    ct_frame_push();
    for (int i = 0; !st && i < 2; i++) {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, 1, (const int64_t[]){1}, &vals[i]);
        out->n = i + 1;
        out->names[i] = strdup(PROGRESS_KEYS[i]);
        out->tensors[i] = t ? ct_tensor_retain(t) : NULL;
        if (!t) st = ct_error_prefix("%s: progress state '%s': ", program, PROGRESS_KEYS[i]);
        else if (!out->names[i]) st = ct_error_set(CT_ERR_NOMEM, "%s: progress state: out of memory", program);
    }
    ct_frame_pop();
    if (st) ct_state_dict_free(out);
    return st;
}

/* Checks both values first: a checkpoint that fails here must leave the progress as it was. */
static ct_status progress_load_state_dict(void *obj, const ct_state_dict *sd)
{
    double vals[2];
    for (int k = 0; k < 2; k++) {
        const ct_tensor *t = NULL;
        for (int i = 0; i < sd->n && !t; i++)
            if (!strcmp(sd->names[i], PROGRESS_KEYS[k])) t = sd->tensors[i];
        if (!t)
            return ct_error_set(CT_ERR_FORMAT, "%s: the checkpoint's progress state has no '%s'", program,
                                PROGRESS_KEYS[k]);
        if (t->dtype != CT_DTYPE_F64 || ct_tensor_numel(t) != 1)
            return ct_error_set(CT_ERR_FORMAT, "%s: the checkpoint's progress state '%s' is %s x %lld, expected "
                                               "one f64", program, PROGRESS_KEYS[k], ct_dtype_name(t->dtype),
                                (long long)ct_tensor_numel(t));
        vals[k] = ct_tensor_item(t);
    }
    ex_progress_state *ps = obj;
    ps->smooth = vals[0];
    ps->last_val = vals[1];
    return CT_OK;
}

ct_checkpointable ex_progress_checkpointable(const char *name, ex_progress_state *ps)
{
    return (ct_checkpointable){.name = name, .state_dict = progress_state_dict,
                               .load_state_dict = progress_load_state_dict, .obj = ps};
}

/* ---- files ----------------------------------------------------------------------- */

FILE *ex_open_csv(const char *path, int64_t first)
{
    char *old = NULL;
    size_t len = 0;
    FILE *f = first > 1 ? fopen(path, "rb") : NULL;
    if (f) {
        struct stat st;
        if (!fstat(fileno(f), &st) && (old = malloc((size_t)st.st_size + 1)))
            old[len = fread(old, 1, (size_t)st.st_size, f)] = '\0';
        fclose(f);
    }
    f = fopen(path, "w");
    if (f) fputs(EX_CSV_HEADER, f);
    for (char *line = old, *next; f && line && *line; line = next) {
        next = strchr(line, '\n');
        next = next ? next + 1 : line + strlen(line);
        char *end;
        long long step = strtoll(line, &end, 10);
        if (end != line && *end == ',' && step < first) fwrite(line, 1, (size_t)(next - line), f);
    }
    free(old);
    return f;
}

bool ex_make_dirs(const char *path)
{
    char p[1024];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) && errno != EEXIST) return false;
        *s = c;
        if (!c) return true;
    }
}

void ex_plot(const char *dir, const char *ylabel)
{
    char cmd[4096];
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("gnuplot not found: skipped %s/loss.png (the CSV has the curve)\n", dir);
        return;
    }
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal pngcairo size 900,500; set output '%s/loss.png'; set datafile separator ',';"
             " set key top right; set xlabel 'step'; set ylabel '%s'; set grid;"
             " plot '%s/loss.csv' using 1:2 with lines title 'train', '' using 1:3 with linespoints title 'val'\""
             " 2>/dev/null",
             dir, ylabel, dir);
    if (system(cmd) == 0) printf("loss curve: %s/loss.png\n", dir);
    else printf("gnuplot failed: no %s/loss.png (the CSV has the curve)\n", dir);
}

/* ---- optimizer ------------------------------------------------------------------- */

ct_optimizer *ex_make_adamw(ct_module *m, const ct_adam_config *cfg)
{
    ct_param_list l;
    if (ct_module_named_tensors(m, false, &l)) return NULL;
    ct_tensor **decay = malloc((size_t)l.n * sizeof *decay), **nodecay = malloc((size_t)l.n * sizeof *nodecay);
    int nd = 0, nn = 0;
    for (int i = 0; decay && nodecay && i < l.n; i++) {
        if (l.tensors[i]->ndim >= 2) decay[nd++] = l.tensors[i];
        else nodecay[nn++] = l.tensors[i];
    }
    /* AdamW without decay is Adam without decay (ct_adamw's 0 means its default) */
    ct_optimizer *opt = !decay || !nodecay      ? NULL
                        : cfg->weight_decay > 0 ? ct_adamw_new(nd, decay, cfg)
                                                : ct_adam_new(nd, decay, cfg);
    if (opt && nn > 0 && ct_optimizer_add_group(opt, nn, nodecay, &(ct_param_group_config){.no_weight_decay = true})) {
        ct_optimizer_free(opt);
        opt = NULL;
    }
    free(decay);
    free(nodecay);
    ct_param_list_free(&l);
    return opt;
}

/* ---- the training step ------------------------------------------------------------ */

bool ex_train_step(ct_accelerator *acc, ct_optimizer *opt, ct_scheduler *sched, ct_tensor *loss, double grad_clip,
                   double *loss_v)
{
    if (!loss || ct_accelerator_backward(acc, loss)) return false;
    *loss_v = ct_tensor_item(loss);
    bool ok = !(grad_clip > 0 && isnan(ct_accelerator_clip_grad_norm(acc, grad_clip, 2.0)));
    if (ok && (ct_optimizer_step(opt) || ct_scheduler_step(sched))) ok = false;
    ct_optimizer_zero_grad(opt);
    return ok;
}

bool ex_checkpoint_step(ct_accelerator *acc, FILE *csv, const char *csv_path, bool tty, int64_t step)
{
    if (csv && fflush(csv)) {
        fprintf(stderr, "%s: %s: %s\n", ex_program(), csv_path, strerror(errno));
        return false;
    }
    if (ct_accelerator_save_state(acc, NULL)) return false;
    if (ct_accelerator_is_main_process(acc)) {
        if (tty) fprintf(stderr, "\n");
        printf("saved checkpoint %s (step %lld)\n", ct_accelerator_last_checkpoint(acc), (long long)step);
        fflush(stdout);
    }
    return true;
}

void ex_print_strategy_stats(ct_accelerator *acc)
{
    if (ct_accelerator_ddp(acc)) {
        ct_ddp_stats ds = ct_ddp_stats_get(ct_accelerator_ddp(acc));
        ct_accelerator_print(acc, "DDP: %d buckets, %.1f MB reduced per step; communication %.1f ms per step, of "
                                  "which %.1f ms (%.0f%%) not hidden under backward\n",
                             ds.buckets, (double)ds.bytes / 1e6, 1e3 * ds.total_comm_s / (double)ds.steps,
                             1e3 * ds.total_exposed_s / (double)ds.steps,
                             ds.total_comm_s > 0 ? 100.0 * ds.total_exposed_s / ds.total_comm_s : 0.0);
    }
    if (ct_accelerator_shard(acc)) {
        ct_shard_stats ss = ct_shard_stats_get(ct_accelerator_shard(acc));
        ct_accelerator_print(acc, "sharded (%s over %d ranks): %.1f MB sent per step; per rank %.1f MB parameters, "
                                  "%.1f MB gradients, %.1f MB optimizer state\n",
                             ct_shard_strategy_name(ss.strategy), ss.shard_world, (double)ss.bytes_sent / 1e6,
                             (double)ss.memory.params / 1e6, (double)ss.memory.grads / 1e6,
                             (double)ss.memory.optimizer / 1e6);
    }
}
