/* libFuzzer target for the comm engine's message header (dist/transport_internal.h):
 * every 56-byte input either decodes, and then encodes back to exactly the same bytes
 * (no field is lost or invented), or is refused with a reason. The transports run
 * every header a peer sends through this decoder before acting on it.
 *
 *   make fuzz   (builds every target with clang, libFuzzer, ASan and UBSan)
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "dist/transport_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < CT_MSG_HEADER) return 0;
    ct_msg m;
    char why[160] = "";
    if (!cti_msg_decode(data, &m, why, sizeof why)) {
        CT_ASSERT(why[0] != '\0');
        return 0;
    }
    uint8_t again[CT_MSG_HEADER];
    cti_msg_encode(again, &m);
    CT_ASSERT(memcmp(again, data, CT_MSG_HEADER) == 0);
    return 0;
}
