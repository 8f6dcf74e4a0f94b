#include "core/error.h"

#include <stdarg.h>
#include <string.h>

#define CT_ERROR_CAP 2048

static _Thread_local char err_msg[CT_ERROR_CAP];
static _Thread_local ct_status err_status;

const char *ct_last_error(void) { return err_msg; }

ct_status ct_last_status(void) { return err_status; }

void ct_error_clear(void)
{
    err_msg[0] = '\0';
    err_status = CT_OK;
}

const char *ct_status_str(ct_status st)
{
    switch (st) {
    case CT_OK: return "ok";
    case CT_ERR_INVALID: return "invalid argument";
    case CT_ERR_NOMEM: return "out of memory";
    case CT_ERR_IO: return "i/o error";
    case CT_ERR_FORMAT: return "bad format";
    case CT_ERR_UNSUPPORTED: return "unsupported";
    case CT_ERR_INTERNAL: return "internal error";
    case CT_ERR_TIMEOUT: return "timed out";
    case CT_ERR_PEER: return "peer failure";
    case CT_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

ct_status ct_error_set(ct_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    err_status = st;
    return st;
}

ct_status ct_error_prefix(const char *fmt, ...)
{
    char prefix[512], old[CT_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    /* the result is cut at the buffer's end: the prefix (the outer context) survives whole */
    if (snprintf(err_msg, sizeof err_msg, "%s%s", prefix, old) >= (int)sizeof err_msg)
        err_msg[sizeof err_msg - 1] = '\0';
    return err_status;
}
