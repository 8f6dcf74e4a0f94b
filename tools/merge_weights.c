/* `ctrain merge-weights DIR OUT` (tools/merge_weights.h): the command around
 * ct_sharded_model_merge (accel/accelerator.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "accel/accelerator.h"
#include "tools/merge_weights.h"

static void usage(FILE *f)
{
    fputs("usage: ctrain merge-weights [--help] DIR OUT\n\n"
          "Merges the sharded checkpoint in DIR (the model-rank*-of-*.safetensors files that\n"
          "ct_accelerator_save_model writes under SHARDED_STATE_DICT) into one safetensors file\n"
          "OUT, loadable by ct_module_load and ct_accelerator_load_model. When OUT is an existing\n"
          "directory the file is OUT/model.safetensors. DIR is checked first: every rank's file,\n"
          "one format, file count and save, every element of every parameter exactly once.\n"
          "Exit status 0 when OUT was written, 1 when a check or the write fails, 2 for a usage error.\n",
          f);
}

int ct_merge_weights_main(int argc, char **argv)
{
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ctrain merge-weights: unknown flag '%s' (ctrain merge-weights --help)\n", argv[i]);
            return 2;
        }
        if (npos == 2) {
            fprintf(stderr, "ctrain merge-weights: unexpected argument '%s': expected DIR OUT\n", argv[i]);
            return 2;
        }
        pos[npos++] = argv[i];
    }
    if (npos < 2) {
        fprintf(stderr, "ctrain merge-weights: %s is missing (usage: ctrain merge-weights DIR OUT)\n",
                npos ? "OUT" : "DIR");
        return 2;
    }
    /* as accelerate merge-weights: an output directory gets model.safetensors */
    char out[4096];
    struct stat sb;
    int n = !stat(pos[1], &sb) && S_ISDIR(sb.st_mode) ? snprintf(out, sizeof out, "%s/model.safetensors", pos[1])
                                                       : snprintf(out, sizeof out, "%s", pos[1]);
    if (n < 0 || (size_t)n >= sizeof out) {
        fprintf(stderr, "ctrain merge-weights: the output path '%s' is too long\n", pos[1]);
        return 2;
    }
    if (ct_sharded_model_merge(pos[0], out)) {
        fprintf(stderr, "ctrain merge-weights: %s\n", ct_last_error());
        return 1;
    }
    printf("merged '%s' into '%s'\n", pos[0], out);
    return 0;
}
