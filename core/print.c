/* Readable tensor dumps, PyTorch style: nested brackets, the middle of long
 * dimensions elided as "...", and a trailing line with dtype and shape. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/convert.h"
#include "core/frame.h"
#include "core/tensor_internal.h"

#define EDGE 3 /* elements shown at each end of a dim longer than 2*EDGE */

typedef struct {
    char *buf;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->buf + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)k;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = true;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

static void put_elem(sbuf *b, const ct_tensor *t, int64_t off)
{
    const char *p = (const char *)t->storage->data + off * (int64_t)ct_dtype_size(t->dtype);
    double v = ct_scalar_load(t->dtype, p);
    if (t->dtype == CT_DTYPE_BOOL) sb_printf(b, "%s", v != 0 ? "true" : "false");
    else if (!ct_dtype_is_float(t->dtype)) sb_printf(b, "%lld", (long long)v);
    else sb_printf(b, "%.6g", v);
}

static void put_dim(sbuf *b, const ct_tensor *t, int d, int64_t off, int indent)
{
    if (d == t->ndim) {
        put_elem(b, t, off);
        return;
    }
    sb_printf(b, "[");
    int64_t n = t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        if (n > 2 * EDGE && i == EDGE) {
            sb_printf(b, "...");
            i = n - EDGE - 1;
            sb_printf(b, d + 1 == t->ndim ? ", " : ",\n%*s", d + 1 == t->ndim ? 0 : indent + 1, "");
            continue;
        }
        put_dim(b, t, d + 1, off + i * t->strides[d], indent + 1);
        if (i + 1 < n) sb_printf(b, d + 1 == t->ndim ? ", " : ",\n%*s", d + 1 == t->ndim ? 0 : indent + 1, "");
    }
    sb_printf(b, "]");
}

char *ct_tensor_to_string(const ct_tensor *t)
{
    sbuf b = {malloc(256), 0, 256, false};
    if (!b.buf) return NULL;
    b.buf[0] = '\0';
    char desc[200];
    if (!t) {
        sb_printf(&b, "tensor(NULL)");
    } else {
        /* a GPU tensor's values are copied to the host first (waiting for its work) */
        ct_frame_push();
        const ct_tensor *h = t->device.type == CT_DEVICE_CPU ? t : ct_tensor_to(t, CT_CPU);
        sb_printf(&b, "tensor(");
        if (h) put_dim(&b, h, 0, h->offset, 7);
        else sb_printf(&b, "<values unavailable: %s>", ct_last_error());
        ct_frame_pop();
        sb_printf(&b, ", %s", ct_tensor_describe(t, desc, sizeof desc));
        if (t->dtype == CT_DTYPE_F8_E4M3 || t->dtype == CT_DTYPE_F8_E5M2)
            sb_printf(&b, ", scale=%g, amax=%g", t->scale, t->amax);
        if (t->requires_grad) sb_printf(&b, ", requires_grad");
        if (t->name) sb_printf(&b, ", name=%s", t->name);
        sb_printf(&b, ")");
    }
    if (b.oom) {
        free(b.buf);
        return NULL;
    }
    return b.buf;
}

void ct_tensor_print(const ct_tensor *t, FILE *f)
{
    char *s = ct_tensor_to_string(t);
    fprintf(f ? f : stdout, "%s\n", s ? s : "tensor(<out of memory>)");
    free(s);
}
