/* ctrain — devices. A tensor lives on the CPU or on one CUDA device. */
#ifndef CT_CORE_DEVICE_H
#define CT_CORE_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdbool.h>

#include "core/api.h"

typedef enum ct_device_type { CT_DEVICE_CPU = 0, CT_DEVICE_CUDA, CT_DEVICE_TYPE_COUNT } ct_device_type;

typedef struct ct_device {
    ct_device_type type;
    int index;
} ct_device;

#define CT_CPU ((ct_device){CT_DEVICE_CPU, 0})
#define CT_CUDA(i) ((ct_device){CT_DEVICE_CUDA, (i)})

/* True when a and b are the same device (type and index). */
CT_API bool ct_device_equal(ct_device a, ct_device b);
/* "cpu" or "cuda:N", written into buf (cap >= 16); returns buf. */
CT_API const char *ct_device_str(ct_device d, char *buf, int cap);

#ifdef __cplusplus
}
#endif

#endif
