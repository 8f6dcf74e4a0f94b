/* Tests for `ctrain env` (tools/env.c), run as a program (CTRAIN_BIN, set by
 * `make test`): its CPU features and each 16-bit dtype's GEMM path must agree with
 * the flags the kernel reports in /proc/cpuinfo; settings from the environment show
 * up; invalid ones are listed as problems with exit status 1. */
#include <criterion/criterion.h>
#include <dnnl_version.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs `env -u ... SETTINGS ctrain ARGS`, returns its output (stdout and stderr, then
 * "rc=N"); the caller frees it. */
static char *run_env(const char *settings, const char *args)
{
    const char *bin = getenv("CTRAIN_BIN");
    if (!bin || !*bin) cr_skip_test("CTRAIN_BIN is not set: run through `make test`");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "env -u OMP_NUM_THREADS -u CTRAIN_BF16_GEMM -u CTRAIN_F16_GEMM -u CTRAIN_SGEMM -u RANK -u WORLD_SIZE "
             "-u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS %s '%s' %s 2>&1; "
             "echo \"rc=$?\"",
             settings, bin, args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    size_t k;
    while ((k = fread(out + n, 1, cap - 1 - n, f)) > 0) n += k;
    out[n] = '\0';
    pclose(f);
    return out;
}

static int rc_of(const char *out)
{
    const char *r = strstr(out, "rc=");
    cr_assert_not_null(r, "no exit status in:\n%s", out);
    return atoi(r + 3);
}

/* The report's line that starts (after indentation) with key; "" when absent. */
static void line_of(const char *out, const char *key, char *line, size_t cap)
{
    line[0] = '\0';
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *q = p;
        while (*q == ' ') q++;
        if (!strncmp(q, key, strlen(key))) {
            snprintf(line, cap, "%.*s", (int)strcspn(q, "\n"), q);
            return;
        }
    }
}

/* The kernel's flags for this CPU, from /proc/cpuinfo (" avx2 fma ... " with spaces around). */
static void cpuinfo_flags(char *flags, size_t cap)
{
    snprintf(flags, cap, " ");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            const char *v = strchr(line, ':');
            snprintf(flags, cap, " %.*s ", (int)strcspn(v ? v + 1 : "", "\n"), v ? v + 1 : "");
            break;
        }
    fclose(f);
}

static bool has_flag(const char *flags, const char *name)
{
    char w[64];
    snprintf(w, sizeof w, " %s ", name);
    return strstr(flags, w) != NULL;
}

Test(tools_env, the_report_matches_this_cpu, .timeout = 60)
{
    char *out = run_env("", "env");
    cr_expect_eq(rc_of(out), 0, "%s", out);
    cr_expect(strstr(out, "ctrain 0.1.0") != NULL, "%s", out);
    char flags[8192], line[2048], want[64];
    cpuinfo_flags(flags, sizeof flags);
    line_of(out, "cpu features:", line, sizeof line);
    strcat(line, " ");
    static const char *const checked[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"};
    for (size_t i = 0; i < sizeof checked / sizeof *checked; i++) {
        snprintf(want, sizeof want, " %s ", checked[i]);
        cr_expect_eq(strstr(line, want) != NULL, has_flag(flags, checked[i]), "%s: report '%s', /proc/cpuinfo%s",
                     checked[i], line, has_flag(flags, checked[i]) ? " has it" : " has not");
    }
    bool bf16_hw = has_flag(flags, "avx512_bf16") || has_flag(flags, "amx_bf16");
    bool f16_hw = has_flag(flags, "avx512_fp16") || has_flag(flags, "amx_fp16");
    line_of(out, "bf16:", line, sizeof line);
    cr_expect(strstr(line, bf16_hw ? "bf16:                  onednn" : "bf16:                  convert") != NULL,
              "bf16 path with%s bf16 hardware: %s", bf16_hw ? "" : "out", line);
    line_of(out, "f16:", line, sizeof line);
    cr_expect(strstr(line, f16_hw ? "onednn" : "convert") != NULL, "f16: %s", line);
    /* attention: the first "bf16:" line after the attention heading */
    const char *att = strstr(out, "attention by dtype");
    cr_assert_not_null(att, "%s", out);
    line_of(att, "bf16:", line, sizeof line);
    bool dot_hw = has_flag(flags, "avx512_bf16");
    cr_expect(strstr(line, dot_hw ? "bf16:                  dot:" : "bf16:                  widen:") != NULL,
              "bf16 attention with%s avx512_bf16: %s", dot_hw ? "" : "out", line);
    static const char *const dts[] = {"f32:", "f64:", "bf16:", "f16:"};
    for (int i = 0; i < 4; i++) {
        line_of(out, dts[i], line, sizeof line);
        cr_expect(strstr(line, "; checked (") != NULL, "%s", line);
    }
    snprintf(want, sizeof want, "oneDNN:                %d.%d.", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR);
    cr_expect(strstr(out, want) != NULL, "want '%s' in:\n%s", want, out);
    cr_expect(strstr(out, "rank 0 of 1 (local 0 of 1), found by rule \"single\"") != NULL, "%s", out);
    cr_expect(strstr(out, "problems") == NULL, "%s", out);
    free(out);
}

Test(tools_env, settings_from_the_environment_show, .timeout = 60)
{
    char *out = run_env("OMP_NUM_THREADS=3 CTRAIN_BF16_GEMM=convert CTRAIN_BF16_ATTENTION=widen RANK=2 WORLD_SIZE=4", "env");
    cr_expect_eq(rc_of(out), 0, "%s", out);
    char line[2048];
    line_of(out, "ctrain threads:", line, sizeof line);
    cr_expect(strstr(line, "3 (from OMP_NUM_THREADS)") != NULL, "%s", line);
    line_of(out, "bf16:", line, sizeof line);
    cr_expect(strstr(line, "convert: ") != NULL && strstr(line, "forced by CTRAIN_BF16_GEMM=convert") &&
                  strstr(line, "; checked ("),
              "%s", line);
    cr_expect(strstr(out, "rank 2 of 4") != NULL && strstr(out, "rule \"launcher\""), "%s", out);
    cr_expect(strstr(out, "widen: bf16 rows widened to f32 as packed, f32 tile products [forced by "
                          "CTRAIN_BF16_ATTENTION=widen]") != NULL,
              "%s", out);
    free(out);
}

Test(tools_env, invalid_settings_are_problems, .timeout = 60)
{
    char *out = run_env("CTRAIN_BF16_GEMM=fast CTRAIN_BF16_ATTENTION=fast RANK=1", "env");
    cr_expect_eq(rc_of(out), 1, "%s", out);
    const char *p = strstr(out, "problems");
    cr_assert_not_null(p, "%s", out);
    cr_expect(strstr(p, "CTRAIN_BF16_GEMM='fast' is not a GEMM backend") != NULL, "%s", p);
    cr_expect(strstr(p, "WORLD_SIZE is not set") != NULL, "%s", p);
    cr_expect(strstr(p, "CTRAIN_BF16_ATTENTION='fast': expected dot or widen: every bf16 attention fails") != NULL, "%s",
              p);
    free(out);
}

Test(tools_env, usage, .timeout = 30)
{
    char *out = run_env("", "env --help");
    cr_expect_eq(rc_of(out), 0, "%s", out);
    cr_expect(strstr(out, "usage: ctrain env") != NULL, "%s", out);
    free(out);
    out = run_env("", "env --fast");
    cr_expect_eq(rc_of(out), 2, "%s", out);
    cr_expect(strstr(out, "unknown argument '--fast'") != NULL, "%s", out);
    free(out);
    out = run_env("", "--help");
    cr_expect(strstr(out, "  env ") != NULL, "the command list names env:\n%s", out);
    free(out);
}
