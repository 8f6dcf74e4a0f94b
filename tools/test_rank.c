/* The rank program of `ctrain test`: the driver and the check protocol
 * (tools/test_rank.h). */
#include "tools/test_rank.h"
#include "tools/test_cmd.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/frame.h"
#include "dist/env.h"

/* ---- the check protocol ------------------------------------------------------------ */

static void report_line(ct_test_run *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_line(ct_test_run *t, const char *fmt, ...)
{
    if (!t->report) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->report, fmt, ap);
    va_end(ap);
    fflush(t->report);
}

void ct_test_check_begin(ct_test_run *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->msg[0] = 0;
    t->nfail = t->nshown = 0;
    report_line(t, "check\t%s\n", t->name);
}

/* The count of failures that did not fit is kept out of msg until the end, so that
 * the message can be cut once, at the last failure that fits whole. */
void ct_test_check_fail(ct_test_run *t, const char *fmt, ...)
{
    char one[CT_TEST_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(one, sizeof one, fmt, ap);
    va_end(ap);
    size_t used = strlen(t->msg), n = strlen(one);
    /* room for "; " and for " (and N more)" at the end */
    if (t->nfail == 0 || used + 2 + n + 24 < sizeof t->msg) {
        snprintf(t->msg + used, sizeof t->msg - used, "%s%s", t->nfail ? "; " : "", one);
        t->nshown++;
    }
    t->nfail++;
}

void ct_test_check_error(ct_test_run *t, const char *what, ct_status st)
{
    ct_test_check_fail(t, "%s: %s", what, ct_last_error());
    /* A refused argument leaves the group usable; anything the group reported
     * (peer, timeout, protocol) leaves it broken (dist/pg.h). */
    if (st != CT_ERR_INVALID && st != CT_ERR_UNSUPPORTED && st != CT_ERR_NOMEM) t->broken = true;
}

static void finish_msg(ct_test_run *t)
{
    if (t->nfail > t->nshown) {
        size_t used = strlen(t->msg);
        if (used + 24 > sizeof t->msg) used = sizeof t->msg - 24; /* a first failure that filled it */
        snprintf(t->msg + used, sizeof t->msg - used, " (and %d more)", t->nfail - t->nshown);
    }
}

static void print_verdict(ct_test_run *t, bool pass, const char *text)
{
    printf("%s %s: %s\n", pass ? "PASS" : "FAIL", t->name, text);
    fflush(stdout);
    if (pass) report_line(t, "pass\t%s\n", t->name);
    else report_line(t, "fail\t%s\t%s\n", t->name, text);
}

bool ct_test_check_end(ct_test_run *t, const char *fmt, ...)
{
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    finish_msg(t);
    t->checks++;

    /* Every rank's message, so that every rank knows the verdict (its exit status)
     * and rank 0 can print all of them. */
    char *all = NULL;
    if (!t->broken) {
        ct_frame_push();
        ct_tensor *mine = ct_tensor_zeros(CT_DTYPE_U8, CT_SHAPE(CT_TEST_MSG_MAX));
        ct_tensor *out = ct_tensor_zeros(CT_DTYPE_U8, CT_SHAPE((int64_t)t->world * CT_TEST_MSG_MAX));
        ct_status st = mine && out ? CT_OK : ct_last_status();
        if (!st) {
            memcpy(ct_tensor_data(mine), t->msg, strlen(t->msg) + 1);
            st = ct_work_run(ct_pg_allgather(t->pg, out, mine));
        }
        if (!st && (all = malloc((size_t)t->world * CT_TEST_MSG_MAX)) != NULL)
            memcpy(all, ct_tensor_data(out), (size_t)t->world * CT_TEST_MSG_MAX);
        else if (!st)
            st = ct_error_set(CT_ERR_NOMEM, "out of memory");
        ct_frame_pop();
        if (st) {
            char what[160];
            snprintf(what, sizeof what, "exchanging the verdicts of '%s'", t->name);
            ct_test_check_error(t, what, st);
            t->broken = true;
        }
    }
    if (!all) {
        /* Nothing can be exchanged: each rank speaks for itself. */
        char text[CT_TEST_MSG_MAX + 32];
        snprintf(text, sizeof text, "rank %d: %s", t->rank, t->msg);
        t->failed++;
        print_verdict(t, false, text);
        return false;
    }
    /* "rank 1: what; rank 3: what", as many ranks as fit whole, then a count */
    char text[2048] = "";
    size_t used = 0;
    int failing = 0, shown = 0;
    for (int r = 0; r < t->world; r++) {
        const char *m = all + (size_t)r * CT_TEST_MSG_MAX;
        int len = (int)strnlen(m, CT_TEST_MSG_MAX); /* "" is a pass */
        if (!len) continue;
        failing++;
        if (used + (size_t)len + 40 > sizeof text) continue;
        used += (size_t)snprintf(text + used, sizeof text - used, "%srank %d: %.*s", used ? "; " : "", r, len, m);
        shown++;
    }
    if (failing > shown)
        snprintf(text + used, sizeof text - used, " (and %d more rank%s)", failing - shown,
                 failing - shown == 1 ? "" : "s");
    free(all);
    bool pass = failing == 0;
    if (!pass) t->failed++;
    if (t->rank == 0) print_verdict(t, pass, pass ? detail : text);
    return pass;
}

bool ct_test_inject_here(const ct_test_run *t, const char *kind)
{
    return t->inject && !strcmp(t->inject, kind) && t->rank == t->world - 1;
}

/* ---- the strategy, in words ------------------------------------------------------------ */

/* "DDP", "DeepSpeed ZeRO-3", "FSDP FULL_SHARD + CPU offload", "no parallelism". */
static void strategy_label(int world, char *buf, size_t cap)
{
    ct_sharding_settings s;
    if (ct_sharding_settings_resolve(NULL, NULL, false, &s)) {
        snprintf(buf, cap, "unknown strategy");
        return;
    }
    const bool fsdp = s.source && strstr(s.source, "fsdp");
    const char *name = NULL;
    switch (s.shard.strategy) {
    case CT_SHARD_NO_SHARD: name = world > 1 ? "DDP" : "no parallelism"; break;
    case CT_SHARD_OPTIMIZER: name = "ZeRO-1"; break;
    case CT_SHARD_GRAD_OP: name = fsdp ? "SHARD_GRAD_OP" : "ZeRO-2"; break;
    case CT_SHARD_FULL: name = fsdp ? "FULL_SHARD" : "ZeRO-3"; break;
    case CT_SHARD_HYBRID: name = "HYBRID_SHARD"; break;
    }
    const char *family = s.shard.strategy == CT_SHARD_NO_SHARD || !s.source ? "" : fsdp ? "FSDP " : "DeepSpeed ";
    snprintf(buf, cap, "%s%s%s", family, name ? name : "unknown strategy",
             s.shard.offload_optimizer ? " + CPU offload" : "");
}

/* ---- the rendezvous check ------------------------------------------------------------ */

/* The ranks agree with the launcher's environment and each holds a distinct rank. */
static void check_rendezvous(ct_test_run *t)
{
    ct_test_check_begin(t, "rendezvous");
    ct_dist_env env;
    if (ct_dist_env_detect(&env)) {
        ct_test_check_fail(t, "%s", ct_last_error());
    } else {
        if (env.world_size != t->world)
            ct_test_check_fail(t, "the group has %d ranks, the environment says WORLD_SIZE %d", t->world,
                               env.world_size);
        if (env.rank != t->rank)
            ct_test_check_fail(t, "the group's rank %d, the environment's RANK %d", t->rank, env.rank);
    }
    ct_frame_push();
    ct_tensor *mine = ct_tensor_full(CT_DTYPE_I32, CT_SHAPE(1), t->rank);
    ct_tensor *all = ct_tensor_zeros(CT_DTYPE_I32, CT_SHAPE(t->world));
    ct_status st = mine && all ? ct_work_run(ct_pg_allgather(t->pg, all, mine)) : ct_last_status();
    if (st) {
        ct_test_check_error(t, "allgather of the ranks", st);
    } else {
        const int32_t *r = ct_tensor_data(all);
        for (int k = 0; k < t->world; k++)
            if (r[k] != k) ct_test_check_fail(t, "group member %d reports rank %d", k, (int)r[k]);
    }
    ct_frame_pop();
    ct_test_check_end(t, "%d process%s, rank %d of %d here, transport %s", t->world, t->world == 1 ? "" : "es",
                      t->rank, t->world, ct_pg_transport(t->pg));
}

/* ---- the program -------------------------------------------------------------------- */

static void rank_usage(FILE *f)
{
    fputs("usage: ctrain test --rank [--report FILE]\n"
          "(the program `ctrain test` starts on every rank; run `ctrain test` instead)\n",
          f);
}

int ct_test_rank_main(int argc, char **argv)
{
    const char *report_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--report") && i + 1 < argc) {
            report_path = argv[++i];
        } else {
            fprintf(stderr, "ctrain test --rank: unexpected argument '%s'\n", argv[i]);
            rank_usage(stderr);
            return CT_TEST_EXIT_USAGE;
        }
    }
    ct_test_run t = {.inject = getenv("CTRAIN_TEST_INJECT")};
    if (t.inject && !*t.inject) t.inject = NULL;
    if (t.inject && strcmp(t.inject, "collective") && strcmp(t.inject, "loss") && strcmp(t.inject, "die") &&
        strcmp(t.inject, "hang")) {
        fprintf(stderr, "ctrain test: CTRAIN_TEST_INJECT='%s'; expected collective, loss, die or hang\n", t.inject);
        return CT_TEST_EXIT_USAGE;
    }
    /* Lines must leave as they are made: a rank may be stopped at any moment. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    ct_accelerator *acc = ct_accelerator_new(NULL);
    char text[1024] = "";
    if (!acc) snprintf(text, sizeof text, "%s", ct_last_error());
    ct_dist_env env;
    bool main_rank = acc ? ct_accelerator_is_main_process(acc) : !ct_dist_env_detect(&env) && env.rank == 0;
    if (main_rank && report_path && !(t.report = fopen(report_path, "w")))
        fprintf(stderr, "ctrain test: cannot write the report %s; the verdict will lack the details\n", report_path);
    if (!acc) {
        /* No group: this rank speaks for itself. */
        snprintf(t.name, sizeof t.name, "rendezvous");
        report_line(&t, "check\trendezvous\n");
        t.checks = t.failed = 1;
        print_verdict(&t, false, text);
        report_line(&t, "end\t1\t1\tstopped\n");
        if (t.report) fclose(t.report);
        return CT_TEST_EXIT_FAILED;
    }
    t.pg = ct_accelerator_pg(acc);
    t.rank = ct_pg_rank(t.pg);
    t.world = ct_pg_size(t.pg);
    char strategy[96];
    strategy_label(t.world, strategy, sizeof strategy);
    const char *mp = ct_accelerator_mixed_precision(acc);
    report_line(&t, "setup\t%d\t%s\t%s\n", t.world, strategy, mp);
    if (t.rank == 0)
        printf("ctrain test: %d process%s, %s, mixed precision %s\n", t.world, t.world == 1 ? "" : "es", strategy, mp);

    check_rendezvous(&t);
    if (!t.broken) ct_test_collectives(&t);
    if (!t.broken) ct_test_training(&t, acc);

    if (t.broken && t.rank == 0)
        printf("ctrain test: the process group failed; the checks after '%s' were not run\n", t.name);
    if (t.rank == 0)
        printf("summary: %d checks, %d passed, %d failed on %d process%s (%s, mixed precision %s)\n", t.checks,
               t.checks - t.failed, t.failed, t.world, t.world == 1 ? "" : "es", strategy, mp);
    report_line(&t, "end\t%d\t%d\t%s\n", t.checks, t.failed, t.broken ? "stopped" : "complete");
    if (t.report) fclose(t.report);
    /* Rank 0 has printed and written everything before any rank leaves: a rank that
     * exits non-zero makes the launcher stop the others. */
    if (!t.broken) ct_work_run(ct_pg_barrier(t.pg));
    ct_accelerator_free(acc);
    ct_test_training_free(&t);
    return t.failed || t.broken ? CT_TEST_EXIT_FAILED : 0;
}
