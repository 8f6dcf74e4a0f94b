#include "core/device.h"

#include <stdio.h>

bool ct_device_equal(ct_device a, ct_device b)
{
    return a.type == b.type && (a.type == CT_DEVICE_CPU || a.index == b.index);
}

const char *ct_device_str(ct_device d, char *buf, int cap)
{
    if (d.type == CT_DEVICE_CPU) snprintf(buf, cap, "cpu");
    else if (d.type == CT_DEVICE_CUDA) snprintf(buf, cap, "cuda:%d", d.index);
    else snprintf(buf, cap, "device?%d", (int)d.type);
    return buf;
}
