/* Checkpoint throughput: ct_accelerator_save_state and ct_accelerator_load_state on
 * GPT-2 124M with AdamW (bench/checkpoint/run.sh sets it beside Accelerate's and the
 * disk's own rate).
 *
 *   checkpoint --dir DIR [--reps R] [--batch B] [--seq T] [--threads N] [--seed X]
 *   ctrain launch --num_processes 2 --use_deepspeed --zero_stage 2 \
 *       checkpoint --dir DIR [...]
 *
 * The model is GPT-2 124M (vocab 50257, block 1024, 12 layers, 12 heads, width 768,
 * lm head tied to wte: 124,439,808 parameters, dropout 0) with gpt_step.h's AdamW
 * (lr 1e-4, betas 0.9/0.95, weight decay 0.1 on the 2-D tensors), prepared by an
 * Accelerator made from the environment: one process, or the launcher's strategy
 * (--use_deepspeed --zero_stage 2: GRAD_OP, each rank holding half of the moments).
 * One optimizer step on a tiny batch (B rows of T random tokens, default 1 x 64) gives
 * AdamW its moments, so the checkpoint holds what a real one holds.
 *
 * Then, before anything is timed, a resume check (the same one that makes a
 * checkpoint worth its bytes): save into DIR/check, two more steps (losses L2, L3),
 * load DIR/check, the same two batches again: the losses must come back bitwise, or
 * the load restored less than it should (parameters: L2; moments and step counts: L3).
 * Its result is reported, not enforced (resume: "exact" or the relative differences).
 *
 * R timed rounds (default 5), each into a new directory DIR/ctrain-<i> as automatic
 * checkpoints are (never replacing one), each measured between barriers as the slowest
 * rank's time:
 *   save   ct_accelerator_save_state(acc, DIR/ctrain-<i>). Its files are fsynced and
 *          the directory renamed into place before it returns, so this is the time to
 *          durable storage, not to the page cache.
 *   cold   ct_accelerator_load_state after rank 0 dropped every file of the checkpoint
 *          from the page cache (posix_fadvise DONTNEED on each file: clean pages after
 *          the fsync, so they go; mincore then counts what stayed, reported as
 *          cold_resident, the largest fraction over the rounds). The reads come from
 *          the block device, or from whatever caches below it (a VM's host).
 *   raw    then rank 0 drops the files again and reads them all with plain read(2)
 *          calls of 16 MiB, no parsing, no copy (raw_read_s: what the device gives
 *          these bytes at this moment); raw_over_load: the round's raw / cold, the
 *          load's rate as a fraction of the device's for the same files moments apart
 *          (median over the rounds): on a shared disk whose rate moves from one second
 *          to the next, a fairer ceiling than a separate dd.
 *   warm   ct_accelerator_load_state again: every file in the page cache (the raw read
 *          left them there).
 * Untimed between rounds: the directory is removed and the file system synced, so no
 * round writes while the previous one's blocks are still being freed.
 * bytes and files: every regular file under DIR/ctrain-0 (manifest included), summed
 * after the first save; rates are bytes / median time, 10^6 bytes per MB.
 *
 * Output: rank 0 prints one JSON line on stdout
 *   {"impl":"ctrain","processes":..,"threads":..,"strategy":..,"files":..,"bytes":..,
 *    "tensors":..,"params":..,"reps":..,"save_all":[..],"load_cold_all":[..],
 *    "load_warm_all":[..],"raw_read_all":[..],"raw_over_load_all":[..],"save_s":..,
 *    "load_cold_s":..,"load_warm_s":..,"raw_read_s":..,"raw_over_load":..,
 *    "cold_resident":..,"peak_rss_mb":..,"loss0":..,"resume":..,"resume_rel_diff":..}
 * (the *_s medians, *_all every round; peak_rss_mb rank 0's ru_maxrss). Errors print a
 * message naming the rank and exit with status 2 (a failed collective fails on every
 * rank).
 */
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "ctrain.h"

#define PROG "checkpoint"
#include "bench/args.h" /* after PROG: its messages name the program */
#include "bench/gpt_accel.h"

/* GPT-2 124M, as HF's GPT2Config() */
enum { VOCAB = 50257, BLOCK = 1024, N_LAYER = 12, N_HEAD = 12, N_EMBD = 768 };
enum { MAX_REPS = 100 };

typedef struct options {
    const char *dir;
    int reps, threads; /* threads 0: as the launcher set (CTRAIN_NUM_THREADS) or the default */
    int64_t batch, seq;
    uint64_t seed;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " --dir DIR [--reps R] [--batch B] [--seq T] [--threads N] [--seed X]\n"
               "  run alone (one process) or under `ctrain launch --num_processes P [--use_deepspeed\n"
               "  --zero_stage S]`; DIR must exist and be on the file system to measure\n"
               "  --reps R      timed save / load rounds (default 5)\n"
               "  --batch B     rows of the one step that creates AdamW's moments (default 1)\n"
               "  --seq T       tokens per row, at most 1024 (default 64)\n"
               "  --threads N   threads per process (default: the launcher's, else ctrain's default)\n"
               "  --seed X      seeds the weights and the random tokens (default 1337)\n"
               "Rank 0 prints one JSON line.\n");
}

/* 0 ok, 1 --help, -1 error (message printed) */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.reps = 5, .batch = 1, .seq = 64, .seed = 1337};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--dir")) {
            if (!v || !*v) {
                fprintf(stderr, PROG ": --dir needs a directory\n");
                return -1;
            }
            o->dir = v;
        } else if (!strcmp(a, "--reps")) {
            if (!parse_int(a, v, 1, MAX_REPS, &x)) return -1;
            o->reps = (int)x;
        } else if (!strcmp(a, "--batch")) {
            if (!parse_int(a, v, 1, 64, &x)) return -1;
            o->batch = x;
        } else if (!strcmp(a, "--seq")) {
            if (!parse_int(a, v, 1, BLOCK, &x)) return -1;
            o->seq = x;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(a, v, 1, 1024, &x)) return -1;
            o->threads = (int)x;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(a, v, 0, (long long)(~0ULL >> 1), &x)) return -1;
            o->seed = (uint64_t)x;
        } else {
            fprintf(stderr, PROG ": unknown argument '%s' (see --help)\n", a);
            return -1;
        }
        i++;
    }
    if (!o->dir) {
        fprintf(stderr, PROG ": --dir DIR is required (see --help)\n");
        return -1;
    }
    return 0;
}

/* ---- the checkpoint's files ------------------------------------------------------- */

/* nftw passes no user pointer: one walk at a time, on rank 0 only */
static struct walk {
    bool evict;              /* posix_fadvise DONTNEED each file */
    int64_t files, bytes;    /* regular files seen, their sizes */
    int64_t pages, resident; /* their pages, and those in the page cache (after evict) */
    const char *failed;      /* the first file that could not be opened, evicted or mapped */
} walk;

/* Pages of the open file fd (size bytes) in the page cache, by mincore; -1 if unknown. */
static int64_t resident_pages(int fd, int64_t size)
{
    if (size == 0) return 0;
    long page = sysconf(_SC_PAGESIZE);
    int64_t n = (size + page - 1) / page;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) return -1;
    unsigned char *vec = malloc((size_t)n);
    int64_t in = -1;
    if (vec && !mincore(map, (size_t)size, vec)) {
        in = 0;
        for (int64_t i = 0; i < n; i++) in += vec[i] & 1;
    }
    free(vec);
    munmap(map, (size_t)size);
    return in;
}

static int walk_file(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || !S_ISREG(st->st_mode)) return 0;
    walk.files++;
    walk.bytes += st->st_size;
    if (!walk.evict) return 0;
    long page = sysconf(_SC_PAGESIZE);
    int fd = open(path, O_RDONLY);
    int64_t in = -1;
    if (fd >= 0 && !posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)) in = resident_pages(fd, st->st_size);
    if (fd >= 0) close(fd);
    if (in < 0) {
        if (!walk.failed) walk.failed = strdup(path);
        return 0;
    }
    walk.pages += (st->st_size + page - 1) / page;
    walk.resident += in;
    return 0;
}

/* Sums the regular files under dir (and, evict, drops them from the page cache).
 * false + message if dir cannot be walked or a file not evicted. */
static bool walk_dir(const char *dir, bool evict)
{
    walk = (struct walk){.evict = evict};
    if (nftw(dir, walk_file, 16, FTW_PHYS)) {
        fprintf(stderr, PROG ": cannot walk %s: %m\n", dir);
        return false;
    }
    if (walk.failed) {
        fprintf(stderr, PROG ": cannot drop %s from the page cache (open, posix_fadvise or mincore failed)\n",
                walk.failed);
        free((void *)walk.failed);
        return false;
    }
    return true;
}

/* read(2) of every file, 16 MiB at a time, on rank 0's walk */
static struct raw {
    char *buf;
    bool failed;
} raw;

static int raw_file(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || !S_ISREG(st->st_mode)) return 0;
    int fd = open(path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : 1;
    while (n > 0) n = read(fd, raw.buf, 16u << 20);
    if (n < 0) raw.failed = true;
    if (fd >= 0) close(fd);
    return 0;
}

/* Seconds to read every file under dir with plain read(2) calls, no parsing, no copy
 * anywhere: what the device gives these files at this moment, against which the load
 * that follows is set. NAN + message on failure. */
static double raw_read(const char *dir)
{
    raw = (struct raw){.buf = malloc(16u << 20)};
    double t0 = now();
    bool ok = raw.buf && !nftw(dir, raw_file, 16, FTW_PHYS) && !raw.failed;
    double dt = now() - t0;
    free(raw.buf);
    if (!ok) fprintf(stderr, PROG ": cannot read the files under %s: %m\n", dir);
    return ok ? dt : NAN;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    return remove(path) ? -1 : 0;
}

/* Removes dir and everything under it; missing is fine. */
static bool remove_tree(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st)) return true;
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS)) {
        fprintf(stderr, PROG ": cannot remove %s: %m\n", dir);
        return false;
    }
    return true;
}

/* Syncs dir's file system after a removal, so that the next round does not write
 * while these blocks are still being freed. */
static void sync_fs_of(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        syncfs(fd);
        close(fd);
    }
}

/* ---- the model ---------------------------------------------------------------------- */

/* GPT-2 124M at its block size 1024 (the position table is part of the 124M), fed
 * o->batch x o->seq tokens. Takes acc. 0, or 2 after printing what failed;
 * accel_gpt_free in either case. */
static int model_init(accel_gpt *g, ct_accelerator *acc, const options *o)
{
    return accel_gpt_init(g, acc,
                          &(ct_gpt_config){.vocab_size = VOCAB, .block_size = BLOCK, .n_layer = N_LAYER,
                                           .n_head = N_HEAD, .n_embd = N_EMBD},
                          o->batch, o->seq, o->seed);
}

/* ---- across ranks --------------------------------------------------------------------- */

/* The largest of v over all ranks (every rank calls it); NAN + error on failure. */
static double max_over_ranks(ct_accelerator *acc, double v)
{
    double out = NAN;
    CT_FRAME {
        ct_tensor *t = ct_tensor_from_data(CT_DTYPE_F64, CT_SHAPE(1), &v);
        ct_tensor *all = t ? ct_accelerator_gather(acc, t) : NULL;
        if (all) {
            const double *d = ct_tensor_data(all);
            out = d[0];
            for (int64_t i = 1; i < ct_tensor_numel(all); i++) out = d[i] > out ? d[i] : out;
        }
    }
    return out;
}

/* A status every rank agrees on: the largest over the ranks (rank 0's file work can
 * fail while the others wait at the barrier). */
static int agree(ct_accelerator *acc, int status)
{
    double s = max_over_ranks(acc, (double)status);
    return isnan(s) ? 2 : (int)s;
}

/* Runs op (save or load of path) between barriers; *dt = the slowest rank's seconds. */
static int timed(ct_accelerator *acc, int rank, bool save, const char *path, double *dt)
{
    if (ct_accelerator_wait_for_everyone(acc)) {
        fprintf(stderr, PROG " (rank %d): barrier: %s\n", rank, ct_last_error());
        return 2;
    }
    double t0 = now();
    ct_status st = save ? ct_accelerator_save_state(acc, path) : ct_accelerator_load_state(acc, path);
    double mine = now() - t0;
    if (st) {
        fprintf(stderr, PROG " (rank %d): %s %s: %s\n", rank, save ? "ct_accelerator_save_state" : "ct_accelerator_load_state",
                path, ct_last_error());
        return 2;
    }
    *dt = max_over_ranks(acc, mine);
    if (isnan(*dt)) {
        fprintf(stderr, PROG " (rank %d): gathering the times: %s\n", rank, ct_last_error());
        return 2;
    }
    return 0;
}

/* ---- the resume check ----------------------------------------------------------------- */

/* Save into dir/check, two steps (losses l[0], l[1]), load, the same two batches again
 * (l[2], l[3]). *rel gets the larger relative difference (0: bitwise). */
static int resume_check(accel_gpt *g, const options *o, double *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/check", o->dir);
    int status = 0;
    if (g->rank == 0 && !remove_tree(path)) status = 2;
    status = agree(g->acc, status);
    if (!status && ct_accelerator_save_state(g->acc, path)) {
        fprintf(stderr, PROG " (rank %d): resume check: save_state %s: %s\n", g->rank, path, ct_last_error());
        status = 2;
    }
    ct_rng at_save = g->rng; /* the batches are the bench's own stream, not the checkpoint's */
    double l[4], dt;
    for (int i = 0; !status && i < 4; i++) {
        if (i == 2) {
            if (ct_accelerator_load_state(g->acc, path)) {
                fprintf(stderr, PROG " (rank %d): resume check: load_state %s: %s\n", g->rank, path,
                        ct_last_error());
                status = 2;
                break;
            }
            g->rng = at_save;
        }
        status = accel_gpt_step(g, i + 1, 0.0, &l[i], &dt);
    }
    if (status) return status;
    double d2 = fabs(l[2] - l[0]) / fabs(l[0]), d3 = fabs(l[3] - l[1]) / fabs(l[1]);
    *rel = max_over_ranks(g->acc, d2 > d3 ? d2 : d3);
    if (g->rank == 0) {
        fprintf(stderr, PROG ": resume check: losses %.9g %.9g, after load %.9g %.9g\n", l[0], l[1], l[2], l[3]);
        if (!remove_tree(path)) status = 2;
        sync_fs_of(o->dir);
    }
    return agree(g->acc, status);
}

/* ---- the run ---------------------------------------------------------------------------- */

static void print_list(const char *key, const double *v, int n)
{
    printf("\"%s\":[", key);
    for (int i = 0; i < n; i++) printf("%s%.4f", i ? "," : "", v[i]);
    printf("],");
}

static int run(const options *o)
{
    struct stat st;
    if (stat(o->dir, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, PROG ": --dir %s is not a directory\n", o->dir);
        return 2;
    }
    ct_accelerator *acc = ct_accelerator_new(NULL);
    if (!acc) {
        fprintf(stderr, PROG ": ct_accelerator_new: %s\n", ct_last_error());
        return 2;
    }
    if (o->threads) ct_set_num_threads(o->threads); /* after ct_accelerator_new, which applies the launcher's */
    accel_gpt g;
    int status = model_init(&g, acc, o);
    double loss0 = NAN, dt, rel = NAN;
    if (!status) status = accel_gpt_step(&g, 0, 0.0, &loss0, &dt); /* AdamW's moments and step count */
    if (!status) status = resume_check(&g, o, &rel);

    double save[MAX_REPS], cold[MAX_REPS], warm[MAX_REPS], rawr[MAX_REPS], ratio[MAX_REPS], resident = 0;
    int64_t files = 0, bytes = 0;
    ct_checkpoint_info info = {0};
    for (int r = 0; !status && r < o->reps; r++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/ctrain-%d", o->dir, r);
        if (g.rank == 0 && !remove_tree(path)) status = 2;
        if ((status = agree(acc, status))) break;
        if ((status = timed(acc, g.rank, true, path, &save[r]))) break;
        if (g.rank == 0) {
            if (!walk_dir(path, true)) status = 2;
            else if (walk.pages) resident = fmax(resident, (double)walk.resident / (double)walk.pages);
            if (!status && r == 0) {
                files = walk.files, bytes = walk.bytes;
                /* one line per file into the log: what the bytes are */
                if (ct_checkpoint_inspect(path, false, &info, stderr)) {
                    fprintf(stderr, PROG ": ct_checkpoint_inspect %s: %s\n", path, ct_last_error());
                    status = 2;
                }
            }
        }
        if ((status = agree(acc, status))) break;
        if ((status = timed(acc, g.rank, false, path, &cold[r]))) break;
        /* after the load, not before: below the guest's page cache a VM's host may
         * cache what was read last, so whichever reads second can be helped; that is the
         * raw read here, which makes the ratio a conservative one */
        if (g.rank == 0 && (!walk_dir(path, true) || isnan(rawr[r] = raw_read(path)))) status = 2;
        ratio[r] = g.rank == 0 && !status ? rawr[r] / cold[r] : 0;
        if ((status = agree(acc, status))) break;
        if ((status = timed(acc, g.rank, false, path, &warm[r]))) break; /* the raw read left them cached */
        if (g.rank == 0) {
            if (!remove_tree(path)) status = 2;
            sync_fs_of(o->dir);
        }
        status = agree(acc, status);
    }
    if (!status && g.rank == 0) {
        printf("{\"impl\":\"ctrain\",\"processes\":%d,\"threads\":%d,\"strategy\":\"%s\",\"files\":%lld,"
               "\"bytes\":%lld,\"tensors\":%lld,\"params\":%lld,\"reps\":%d,",
               ct_accelerator_num_processes(acc), ct_get_num_threads(), info.strategy, (long long)files,
               (long long)bytes, (long long)info.tensors, (long long)ct_module_num_params(&g.model->base), o->reps);
        print_list("save_all", save, o->reps);
        print_list("load_cold_all", cold, o->reps);
        print_list("load_warm_all", warm, o->reps);
        print_list("raw_read_all", rawr, o->reps);
        print_list("raw_over_load_all", ratio, o->reps);
        double ms = median(save, o->reps), mc = median(cold, o->reps), mw = median(warm, o->reps);
        double mr = median(rawr, o->reps), mq = median(ratio, o->reps);
        printf("\"save_s\":%.4f,\"load_cold_s\":%.4f,\"load_warm_s\":%.4f,\"raw_read_s\":%.4f,"
               "\"raw_over_load\":%.4f,\"cold_resident\":%.4f,\"peak_rss_mb\":%.1f,\"loss0\":%.6f,"
               "\"resume\":\"%s\",\"resume_rel_diff\":%.3g}\n",
               ms, mc, mw, mr, mq, resident, peak_rss_mib(), loss0, rel == 0 ? "exact" : "differs", rel);
        fflush(stdout);
    }
    accel_gpt_free(&g);
    ct_frame_reset_root();
    return status;
}

int main(int argc, char **argv)
{
    options o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    return run(&o);
}
