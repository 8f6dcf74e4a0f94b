/* CPU feature detection: cpuid leaves 1 and 7 (sub-leaves 0 and 1), gated by the
 * register state the OS enables in XCR0 (a CPU may support AVX-512 while the
 * kernel or hypervisor does not save zmm registers; then it cannot be used). */
#include "kernels/cpu/cpu_features.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(ct_cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c & (1u << 27);
    bool cpu_avx = c & (1u << 28), cpu_fma = c & (1u << 12), cpu_f16c = c & (1u << 29);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6;            /* SSE + AVX state */
    bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;   /* opmask, ZMM_Hi256, Hi16_ZMM */
    bool tiles = (xcr0 & 0x60000) == 0x60000;  /* XTILECFG, XTILEDATA */
    f->avx = cpu_avx && ymm;
    f->fma = cpu_fma && ymm;
    f->f16c = cpu_f16c && ymm;

    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned max_sub = a;
    f->avx2 = (b & (1u << 5)) && ymm;
    f->avx512f = (b & (1u << 16)) && zmm;
    f->avx512bw = (b & (1u << 30)) && zmm;
    f->avx512vl = (b & (1u << 31)) && zmm;
    f->avx512_vnni = (c & (1u << 11)) && zmm;
    f->avx512_fp16 = (d & (1u << 23)) && zmm;
    f->amx_bf16 = (d & (1u << 22)) && tiles;
    f->amx_tile = (d & (1u << 24)) && tiles;
    f->amx_int8 = (d & (1u << 25)) && tiles;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512_bf16 = (a & (1u << 5)) && zmm;
        f->amx_fp16 = (a & (1u << 21)) && tiles;
    }
}
#else
static void detect(ct_cpu_features *f) { (void)f; }
#endif

static ct_cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static void detect_once(void) { detect(&features); }

const ct_cpu_features *cti_cpu_features_get(void)
{
    pthread_once(&features_once, detect_once);
    return &features;
}

bool cti_cpu_has_bf16_gemm(void)
{
    const ct_cpu_features *f = cti_cpu_features_get();
    return f->avx512_bf16 || (f->amx_tile && f->amx_bf16);
}

bool cti_cpu_has_f16_gemm(void)
{
    const ct_cpu_features *f = cti_cpu_features_get();
    return f->avx512_fp16 || (f->amx_tile && f->amx_fp16);
}

const char *cti_cpu_features_str(char *buf, int cap)
{
    const ct_cpu_features *f = cti_cpu_features_get();
    const struct { bool on; const char *name; } flags[] = {
        {f->avx, "avx"},           {f->avx2, "avx2"},         {f->fma, "fma"},
        {f->f16c, "f16c"},         {f->avx512f, "avx512f"},   {f->avx512bw, "avx512bw"},
        {f->avx512vl, "avx512vl"}, {f->avx512_vnni, "avx512_vnni"},
        {f->avx512_bf16, "avx512_bf16"}, {f->avx512_fp16, "avx512_fp16"},
        {f->amx_tile, "amx_tile"}, {f->amx_int8, "amx_int8"}, {f->amx_bf16, "amx_bf16"},
        {f->amx_fp16, "amx_fp16"},
    };
    if (cap <= 0) return buf;
    buf[0] = '\0';
    int len = 0;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!flags[i].on) continue;
        int n = snprintf(buf + len, (size_t)(cap - len), "%s%s", len ? " " : "", flags[i].name);
        if (n < 0 || n >= cap - len) break;
        len += n;
    }
    if (len == 0) snprintf(buf, (size_t)cap, "(none beyond baseline)");
    return buf;
}
