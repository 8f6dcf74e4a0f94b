/* `ctrain env`: the machine, the libraries, which GEMM each dtype takes (checked by
 * running one small product per dtype against the reference kernel), the thread and
 * distributed settings. Everything it reports comes from the same calls the library
 * makes, so it shows what a training run here will do, not what the build assumed. */
#include <cblas.h>
#include <cjson/cJSON.h>
#include <dnnl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <uv.h>

#include "core/convert.h"
#include "core/cuda.h"
#include "core/frame.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "dist/env.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/matmul.h"
#include "tools/env.h"

#define CT_ENV_VERSION "0.1.0"
#define MAX_PROBLEMS 16

typedef struct {
    char text[MAX_PROBLEMS][1024];
    int n;
} problems;

static void problem(problems *p, const char *fmt, const char *a, const char *b)
{
    if (p->n < MAX_PROBLEMS) snprintf(p->text[p->n++], sizeof p->text[0], fmt, a, b);
}

static const char *env_or(const char *var, const char *unset)
{
    const char *v = getenv(var);
    return v && *v ? v : unset;
}

static void row(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void row(const char *key, const char *fmt, ...)
{
    char k[64];
    snprintf(k, sizeof k, "%s:", key);
    printf("  %-22s ", k);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* ---- system ---------------------------------------------------------------------------- */

static void cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v += v[1] == ' ' ? 2 : 1;
        snprintf(out, cap, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

static void system_section(void)
{
    struct utsname u;
    char model[256], flags[512];
    puts("system");
    if (uname(&u) == 0) row("os", "%s %s %s", u.sysname, u.release, u.machine);
    cpu_model(model, sizeof model);
    row("cpu", "%s, %ld online cores", model, sysconf(_SC_NPROCESSORS_ONLN));
    row("cpu features", "%s", cti_cpu_features_str(flags, sizeof flags));
    struct statvfs s;
    if (statvfs("/dev/shm", &s) == 0)
        row("/dev/shm", "%.1f GiB free of %.1f GiB (the shm transport's rings and slots)",
            (double)s.f_bavail * (double)s.f_frsize / 1073741824.0,
            (double)s.f_blocks * (double)s.f_frsize / 1073741824.0);
    else
        row("/dev/shm", "not available: ranks on one host will talk over TCP");
}

/* ---- libraries ------------------------------------------------------------------------- */

static void libraries_section(void)
{
    const dnnl_version_t *v = dnnl_version();
    puts("libraries");
    row("OpenBLAS", "%s (kernels for %s)", openblas_get_config(), openblas_get_corename());
    row("oneDNN", "%d.%d.%d (%s)", v->major, v->minor, v->patch, v->hash);
    row("libuv", "%s", uv_version_string());
    row("cJSON", "%s", cJSON_Version());
}

/* ---- GPUs ------------------------------------------------------------------------------ */

static void gpu_section(void)
{
    puts("gpu");
    if (!ct_cuda_built()) {
        row("CUDA", "not in this build (nvcc was not found, or make CUDA=0): CPU tensors only");
        return;
    }
    int n = ct_cuda_device_count();
    if (n == 0) {
        row("CUDA", "built in, but no GPU can be used: %s", ct_cuda_unavailable_reason());
        row("device", "training runs on the CPU");
        return;
    }
    ct_cuda_device_props p;
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "cuda:%d", i);
        if (ct_cuda_device_props_get(i, &p)) {
            row(key, "unusable: %s", ct_last_error());
            continue;
        }
        row(key, "%s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free)", p.name, p.major, p.minor,
            p.multiprocessors, (double)p.total_memory / 1073741824.0, (double)p.free_memory / 1073741824.0);
    }
    if (ct_cuda_device_props_get(0, &p) == CT_OK)
        row("CUDA", "driver %d.%d, runtime %d.%d; TF32 for f32 matmul %s; CTRAIN_CUDA_SYNC %s", p.driver_version / 1000,
            p.driver_version % 1000 / 10, p.runtime_version / 1000, p.runtime_version % 1000 / 10,
            ct_cuda_allow_tf32() ? "on" : "off (ct_cuda_set_allow_tf32)", getenv("CTRAIN_CUDA_SYNC") ? "set" : "unset");
}

/* ---- matmul per dtype ------------------------------------------------------------------ */

typedef struct {
    ct_dtype dt;
    const char *var; /* the variable that forces a backend, or NULL */
} gemm_dtype;

static const gemm_dtype GEMM_DTYPES[] = {
    {CT_DTYPE_F32, "CTRAIN_SGEMM"},
    {CT_DTYPE_F64, NULL},
    {CT_DTYPE_BF16, "CTRAIN_BF16_GEMM"},
    {CT_DTYPE_F16, "CTRAIN_F16_GEMM"},
};

static const char *backend_text(ct_dtype dt, ct_gemm_backend be)
{
    if (be == CT_GEMM_OPENBLAS) return dt == CT_DTYPE_F64 ? "OpenBLAS cblas_dgemm" : "OpenBLAS cblas_sgemm";
    if (be == CT_GEMM_ONEDNN)
        return dt == CT_DTYPE_F32 ? "oneDNN dnnl_sgemm" : "oneDNN matmul primitive, 16-bit inputs, f32 accumulation";
    if (be == CT_GEMM_CONVERT) return "widen to f32, OpenBLAS sgemm, round once (correct, slower)";
    return "none";
}

static const char *why_default(ct_dtype dt)
{
    if (dt == CT_DTYPE_BF16)
        return cti_cpu_has_bf16_gemm() ? "the CPU has AVX512-BF16 or AMX-BF16" : "no AVX512-BF16 or AMX-BF16 here";
    if (dt == CT_DTYPE_F16)
        return cti_cpu_has_f16_gemm() ? "the CPU has AVX512-FP16 or AMX-FP16" : "no AVX512-FP16 or AMX-FP16 here";
    if (dt == CT_DTYPE_F32)
        return cti_cpu_features_get()->avx512f ? "the CPU has AVX-512: oneDNN's sgemm is the faster there"
                                              : "no AVX-512 here: OpenBLAS's sgemm is the faster there";
    return "the default";
}

/* One 48 x 40 x 56 product through the selected path against the f64 reference;
 * writes "ok (max error ...)" or why it failed into out. false on failure. */
static bool gemm_check(ct_dtype dt, char *out, size_t cap)
{
    bool ok = false;
    ct_frame_push();
    ct_tensor *a = ct_tensor_rand(dt, CT_SHAPE(48, 56), -1, 1), *b = ct_tensor_rand(dt, CT_SHAPE(56, 40), -1, 1);
    ct_tensor *ref = ct_tensor_zeros(CT_DTYPE_F64, CT_SHAPE(48, 40));
    ct_tensor *got = a && b ? ct_kernel_matmul(a, b, false, false) : NULL;
    if (!got || !ref || cti_cpu_matmul_ref(ref, a, b, false, false, 1.0, 0.0)) {
        snprintf(out, cap, "FAILED: %s", ct_last_error());
    } else {
        double worst = 0;
        for (int64_t i = 0; i < 48 * 40; i++) {
            double r = ((const double *)ct_tensor_data(ref))[i];
            double g = ct_scalar_load(dt, (const char *)ct_tensor_data(got) + i * (int64_t)ct_dtype_size(dt));
            double e = fabs(g - r) / fmax(fabs(r), 1.0);
            if (!(e <= worst)) worst = e; /* NaN counts as the worst */
        }
        /* 16-bit outputs are rounded once: half an ulp of bf16 is 2^-8 */
        double tol = dt == CT_DTYPE_BF16 ? 1e-2 : dt == CT_DTYPE_F16 ? 2e-3 : dt == CT_DTYPE_F32 ? 1e-5 : 1e-12;
        ok = worst <= tol;
        snprintf(out, cap, "%s (48x56 @ 56x40 against the f64 reference: max error %.1e, allowed %.0e)",
                 ok ? "checked" : "WRONG", worst, tol);
    }
    ct_frame_pop();
    return ok;
}

static void matmul_section(problems *p)
{
    puts("matmul by dtype");
    for (size_t i = 0; i < sizeof GEMM_DTYPES / sizeof *GEMM_DTYPES; i++) {
        const gemm_dtype *g = &GEMM_DTYPES[i];
        const char *name = ct_dtype_name(g->dt);
        const char *set = g->var ? getenv(g->var) : NULL;
        ct_gemm_backend be = cti_cpu_matmul_backend(g->dt);
        char how[160], check[640];
        if (be == CT_GEMM_DEFAULT) {
            row(name, "%s='%s' is not a backend for %s", g->var, set ? set : "", name);
            problem(p, "%s='%s' is not a GEMM backend: every matmul of this dtype fails (unset it, or see docs/launch.md)",
                    g->var, set ? set : "");
            continue;
        }
        if (set && *set) snprintf(how, sizeof how, "forced by %s=%s", g->var, set);
        else snprintf(how, sizeof how, "%s", why_default(g->dt));
        bool ok = gemm_check(g->dt, check, sizeof check);
        row(name, "%s: %s [%s]; %s", cti_gemm_backend_name(be), backend_text(g->dt, be), how, check);
        if (!ok) problem(p, "%s matmul: %s", name, check);
    }
    row("f8_e4m3, f8_e5m2", "storage only: no matmul takes them; convert to bf16 or f32 first");
}

/* Which attention kernels bf16 takes (kernels/cpu/attention.h). */
static void attention_section(problems *p)
{
    puts("attention by dtype");
    const char *bad = cti_cpu_attention_bf16_env_error();
    const char *set = getenv("CTRAIN_BF16_ATTENTION");
    if (bad) {
        row("bf16", "%s: every bf16 attention fails (unset it, or see docs/launch.md)", bad);
        problem(p, "%s: every bf16 attention fails", bad, NULL);
    } else if (cti_cpu_attention_bf16_dot()) {
        row("bf16", "dot: bf16 dot products (vdpbf16ps) on bf16 tiles, f32 softmax and sums [%s]",
            set && *set ? "forced by CTRAIN_BF16_ATTENTION=dot" : "the CPU has AVX512-BF16");
    } else {
        row("bf16", "widen: bf16 rows widened to f32 as packed, f32 tile products [%s]",
            set && *set ? "forced by CTRAIN_BF16_ATTENTION=widen"
                        : cti_cpu_features_get()->avx512_bf16 ? "this build has no AVX512-BF16 (PORTABLE=1?)"
                                                             : "no AVX512-BF16 here");
    }
    row("f32, f64, f16", "f32 (f64 in f64) tile products on rows packed (f16 widened) per tile");
}

/* ---- threads and distributed ----------------------------------------------------------- */

static void threads_section(void)
{
    const char *omp = getenv("OMP_NUM_THREADS");
    puts("threads");
    row("ctrain threads", "%d (%s)", ct_get_num_threads(),
        omp && *omp ? "from OMP_NUM_THREADS" : "the online cores; OMP_NUM_THREADS sets it");
    row("OMP_NUM_THREADS", "%s", env_or("OMP_NUM_THREADS", "unset"));
    row("OPENBLAS_NUM_THREADS", "%s (ctrain gives OpenBLAS one thread per GEMM panel either way)",
        env_or("OPENBLAS_NUM_THREADS", "unset"));
    row("OMP_WAIT_POLICY", "%s", env_or("OMP_WAIT_POLICY", "unset"));
    row("OPENBLAS_CORETYPE", "%s", env_or("OPENBLAS_CORETYPE", "unset"));
    row("OPENBLAS_L2_SIZE", "%s", env_or("OPENBLAS_L2_SIZE", "unset"));
}

static void dist_section(problems *p)
{
    ct_dist_env e;
    puts("distributed");
    if (ct_dist_env_detect(&e)) {
        row("this process", "cannot tell: %s", ct_last_error());
        problem(p, "%s", ct_last_error(), NULL);
    } else {
        row("this process", "rank %d of %d (local %d of %d), found by rule \"%s\"", e.rank, e.world_size,
            e.local_rank, e.local_world_size, e.source);
        row("master", "%s:%d, timeout %g s", e.master_addr, e.master_port, e.timeout_s);
    }
    static const char *const vars[] = {"CTRAIN_TRANSPORT",      "CTRAIN_SHM_DIRECT",     "CTRAIN_SHM_SLOT_BYTES",
                                       "CTRAIN_SHM_RING_BYTES", "CTRAIN_SHM_SPIN_US",    "CTRAIN_MIXED_PRECISION",
                                       "CTRAIN_GRADIENT_ACCUMULATION_STEPS", "CTRAIN_NODE_ID",
                                       "CTRAIN_PORT_RANGE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) row(vars[i], "%s", env_or(vars[i], "unset"));
}

int ct_env_main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts("usage: ctrain env\n\n"
                 "Prints this machine's CPU and its features, the libraries ctrain runs on, which GEMM\n"
                 "each dtype takes here (each checked with one small product against the reference),\n"
                 "the thread settings and what a distributed run would read from the environment.\n"
                 "Exit status 1 when a setting is invalid or a check fails (listed under \"problems\").");
            return 0;
        }
        fprintf(stderr, "ctrain env: unknown argument '%s' (ctrain env --help)\n", argv[i]);
        return 2;
    }
    problems p = {.n = 0};
    printf("ctrain %s\n", CT_ENV_VERSION);
    system_section();
    libraries_section();
    gpu_section();
    matmul_section(&p);
    attention_section(&p);
    threads_section();
    dist_section(&p);
    if (p.n) {
        puts("problems");
        for (int i = 0; i < p.n; i++) printf("  - %s\n", p.text[i]);
    }
    return p.n ? 1 : 0;
}
