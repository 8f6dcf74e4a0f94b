/* libFuzzer target for the launch configuration reader and writer
 * (tools/config_file.h): every input either is refused with a message, or reads,
 * and then what ctrain writes of it reads back to the same configuration (printed
 * the same, byte for byte). `ctrain launch` runs every configuration file through
 * this reader before it starts anything.
 *
 *   make fuzz   (builds every target with clang, libFuzzer, ASan and UBSan)
 *
 * The reader lives with the `ctrain` command, not in the library the fuzz rule
 * links, so its sources are compiled in here.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/config_defaults.c"
#include "tools/config_file.c"
#include "tools/config_write.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *printed(const ct_cluster_config *c)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    CT_ASSERT(f != NULL);
    CT_ASSERT(ct_cluster_config_print(c, f) == CT_OK);
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char in[64], again[64];
    if (!in[0]) {
        snprintf(in, sizeof in, "/tmp/ct_fuzz_config_%d.yaml", (int)getpid());
        snprintf(again, sizeof again, "/tmp/ct_fuzz_config_%d_again.yaml", (int)getpid());
    }
    FILE *f = fopen(in, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    ct_cluster_config c, d;
    bool old;
    if (ct_cluster_config_read(in, &c, &old)) {
        CT_ASSERT(ct_last_error()[0] != '\0');
        return 0;
    }
    if (ct_cluster_config_write(&c, again)) return 0; /* only the disk can refuse */
    CT_ASSERT(ct_cluster_config_read(again, &d, &old) == CT_OK);
    char *a = printed(&c), *b = printed(&d);
    CT_ASSERT(strcmp(a, b) == 0);
    free(a);
    free(b);
    return 0;
}
