/* `ctrain test`: runs the built-in checks through `ctrain launch` and gives the
 * verdict (tools/test_cmd.h; user documentation: docs/launch.md, "ctrain test").
 *
 * The command line is launch's flags and nothing else; they go to launch as they
 * are, followed by this binary as PROGRAM with the hidden rank subcommand:
 *
 *     ctrain test FLAGS...  ->  ctrain launch FLAGS... -- /path/to/ctrain test --rank --report FILE
 *
 * so whatever launch accepts (a config file included), `ctrain test` accepts, and a
 * bad flag is launch's usage error. Rank 0 writes the report FILE as the checks run
 * (tools/test_rank.h); once launch returns, the verdict comes from it and launch's
 * exit status.
 */
#include "tools/test_cmd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/launch.h"

static void usage(FILE *f)
{
    fputs("usage: ctrain test [--config_file FILE] [ctrain launch flags...]\n"
          "\n"
          "Runs a short built-in job with this launch configuration and says whether it works:\n"
          "the ranks meet; every collective (allreduce sum/avg/max/min, reduce_scatter,\n"
          "allgather, broadcast, barrier) gives the right answer in f32, f64, bf16, f16, i32\n"
          "and i64 on 1, 1027 and more than one transport chunk of elements; and a tiny model\n"
          "trained a few AdamW steps under the configured strategy and precision has the\n"
          "losses of one process training alone. Rank 0 prints PASS or FAIL for each check;\n"
          "the last line is the verdict.\n"
          "\n"
          "Every `ctrain launch` flag is accepted and means what it means there\n"
          "(ctrain launch --help lists them), for example:\n"
          "  --config_file FILE           the launch configuration to test\n"
          "  --num_processes N            processes in total\n"
          "  --use_deepspeed --zero_stage 0|1|2|3   ZeRO\n"
          "  --use_fsdp [--fsdp_* ...]    FSDP\n"
          "  --mixed_precision no|fp16|bf16|fp8\n"
          "  -h, --help                   this text\n"
          "There is no PROGRAM: ctrain test runs its own.\n"
          "\n"
          "CTRAIN_TIMEOUT bounds every collective; it is " CT_TEST_DEFAULT_TIMEOUT " s here unless set.\n"
          "Exit status: 0 when every check passed; 1 when a check failed; 2 for a usage error;\n"
          "the launcher's status when the job stopped early (137: a rank was killed).\n",
          f);
}

/* ---- the report ----------------------------------------------------------------------- */

typedef struct {
    bool setup, ended, stopped;
    int world, checks, failed;
    char strategy[128], precision[16];
    char last_check[128];   /* the last check begun */
    char first_fail[1024];  /* "name: what" of the first failure */
    char failed_names[1024]; /* "a, b, c" */
} report;

/* Splits line at tabs into at most n fields (the newline dropped); returns the count. */
static int fields(char *line, char **f, int n)
{
    line[strcspn(line, "\n")] = 0;
    int k = 0;
    for (char *p = line; k < n;) {
        f[k++] = p;
        char *tab = strchr(p, '\t');
        if (!tab) break;
        *tab = 0;
        p = tab + 1;
    }
    return k;
}

static void report_read(const char *path, report *r)
{
    *r = (report){0};
    FILE *fp = fopen(path, "r");
    if (!fp) return;
    char line[4096];
    while (fgets(line, sizeof line, fp)) {
        char *f[4] = {0};
        int n = fields(line, f, 4);
        if (!strcmp(f[0], "setup") && n == 4) {
            r->setup = true;
            r->world = atoi(f[1]);
            snprintf(r->strategy, sizeof r->strategy, "%s", f[2]);
            snprintf(r->precision, sizeof r->precision, "%s", f[3]);
        } else if (!strcmp(f[0], "check") && n >= 2) {
            snprintf(r->last_check, sizeof r->last_check, "%s", f[1]);
        } else if (!strcmp(f[0], "fail") && n >= 2) {
            if (!r->failed_names[0]) snprintf(r->first_fail, sizeof r->first_fail, "%s: %s", f[1], n > 2 ? f[2] : "");
            size_t used = strlen(r->failed_names);
            if (used + strlen(f[1]) + 8 < sizeof r->failed_names)
                snprintf(r->failed_names + used, sizeof r->failed_names - used, "%s%s", used ? ", " : "", f[1]);
            else if (!strstr(r->failed_names, ", ..."))
                snprintf(r->failed_names + used, sizeof r->failed_names - used, ", ...");
        } else if (!strcmp(f[0], "end") && n == 4) {
            r->ended = true;
            r->checks = atoi(f[1]);
            r->failed = atoi(f[2]);
            r->stopped = !strcmp(f[3], "stopped");
        }
    }
    fclose(fp);
}

/* "launch exit status 137: a rank was killed by signal 9 (Killed)" */
static void describe_status(int code, char *buf, size_t cap)
{
    if (code > 128 && code < 128 + 65)
        snprintf(buf, cap, "launch exit status %d: a rank was killed by signal %d (%s)", code, code - 128,
                 strsignal(code - 128));
    else
        snprintf(buf, cap, "launch exit status %d", code);
}

/* Prints the verdict; returns ctrain test's exit code. */
static int verdict(const report *r, int code)
{
    char setting[200] = "";
    if (r->setup)
        snprintf(setting, sizeof setting, " on %d process%s (%s, mixed precision %s)", r->world,
                 r->world == 1 ? "" : "es",
                 r->strategy, r->precision);
    if (r->ended && !r->stopped && r->failed == 0 && code == 0) {
        printf("ctrain test: all %d checks passed%s\n", r->checks, setting);
        return 0;
    }
    char what[2048];
    if (r->ended && r->failed > 0)
        snprintf(what, sizeof what, "%d of %d checks failed%s: %s%s", r->failed, r->checks, setting, r->failed_names,
                 r->stopped ? "; the checks after it could not run (no working process group)" : "");
    else if (r->ended)
        snprintf(what, sizeof what, "all %d checks passed%s, but the job failed", r->checks, setting);
    else if (r->last_check[0])
        snprintf(what, sizeof what, "the job stopped during check '%s'%s", r->last_check, setting);
    else
        snprintf(what, sizeof what, "the ranks stopped before the checks began%s", setting);
    /* A rank's own status 1 is the failed checks above; any other status says more. */
    char status[256] = "";
    if (code != 0 && code != CT_TEST_EXIT_FAILED) {
        char s[128];
        describe_status(code, s, sizeof s);
        snprintf(status, sizeof status, " (%s; see the launcher's message above)", s);
    }
    fprintf(stderr, "ctrain test: FAILED: %s%s\n", what, status);
    if (r->first_fail[0]) fprintf(stderr, "ctrain test: first failure: %s\n", r->first_fail);
    return code ? code : CT_TEST_EXIT_FAILED;
}

/* ---- the command ------------------------------------------------------------------------ */

static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

/* The report file: empty, in $TMPDIR. Writes its path to buf. */
static int report_create(char *buf, size_t cap)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = P_tmpdir;
    if ((size_t)snprintf(buf, cap, "%s/ctrain-test-XXXXXX", dir) >= cap) {
        fprintf(stderr, "ctrain test: TMPDIR '%s' is too long for the report's path\n", dir);
        return -1;
    }
    int fd = mkstemp(buf);
    if (fd < 0) {
        fprintf(stderr, "ctrain test: cannot create a report file in %s: %s (set TMPDIR to a writable directory)\n",
                dir, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

int ct_test_main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--rank")) return ct_test_rank_main(argc - 1, argv + 1);
    if (wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || (size_t)n >= sizeof self - 1) {
        fprintf(stderr, "ctrain test: cannot find this program's path (/proc/self/exe): %s\n",
                n < 0 ? strerror(errno) : "too long");
        return CT_TEST_EXIT_FAILED;
    }
    self[n] = 0;
    char path[PATH_MAX];
    if (report_create(path, sizeof path)) return CT_TEST_EXIT_FAILED;

    /* launch FLAGS... -- SELF test --rank --report PATH */
    const int nflags = argc - 1, extra = 7;
    char **av = calloc((size_t)(nflags + extra + 1), sizeof *av);
    if (!av) {
        fprintf(stderr, "ctrain test: out of memory\n");
        unlink(path);
        return CT_TEST_EXIT_FAILED;
    }
    int k = 0;
    av[k++] = "launch";
    for (int i = 1; i < argc; i++) av[k++] = argv[i];
    av[k++] = "--";
    const int prog = k;
    av[k++] = self;
    av[k++] = "test";
    av[k++] = "--rank";
    av[k++] = "--report";
    av[k++] = path;
    av[k] = NULL;

    /* A word that is not a flag would become launch's PROGRAM: refuse it. When
     * this parse fails, launch itself reports the error below (or knows a flag
     * this parser does not). */
    ct_launch_opts o;
    if (!ct_launch_args_parse(k, av, &o) && o.program_argv != av + prog) {
        fprintf(stderr, "ctrain test: unexpected argument '%s': ctrain test runs its own program and takes only "
                        "ctrain launch's flags (ctrain test --help)\n",
                o.program_argv[0]);
        free(av);
        unlink(path);
        return CT_TEST_EXIT_USAGE;
    }
    /* A dead or stuck peer must fail a collective soon, not after the default 300 s. */
    if (setenv("CTRAIN_TIMEOUT", CT_TEST_DEFAULT_TIMEOUT, 0) != 0)
        fprintf(stderr, "ctrain test: setenv CTRAIN_TIMEOUT: %s\n", strerror(errno));
    fflush(stdout);
    int code = ct_launch_main(k, av);
    free(av);
    report r;
    report_read(path, &r);
    unlink(path);
    fflush(stdout);
    if (!r.setup && !r.last_check[0]) {
        /* Launch's own usage and setup errors: it has said what is wrong. */
        if (code == CT_LAUNCH_EXIT_USAGE || code == CT_LAUNCH_EXIT_SETUP) return code;
        /* No report, yet every local rank passed: rank 0 is on another machine
         * (--machine_rank > 0), where its lines and the details are. */
        if (code == 0) {
            printf("ctrain test: this machine's ranks passed every check (rank 0, on machine 0, lists them)\n");
            return 0;
        }
    }
    return verdict(&r, code);
}
