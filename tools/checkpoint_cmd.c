/* `ctrain checkpoint DIR` (tools/checkpoint_cmd.h): the command around
 * ct_checkpoint_inspect (accel/checkpoint.h). */
#include <stdio.h>
#include <string.h>

#include "accel/checkpoint.h"
#include "tools/checkpoint_cmd.h"

static void usage(FILE *f)
{
    fputs("usage: ctrain checkpoint [--help] DIR\n\n"
          "Describes the training-state checkpoint in DIR (a directory ct_accelerator_save_state\n"
          "wrote, e.g. PROJECT/checkpoints/checkpoint_3): its manifest (format, ctrain version,\n"
          "step, world size, shard files, strategy, precision, optimizer, files, tensors, bytes),\n"
          "then checks every file the manifest lists, one line per file: present, of the recorded\n"
          "size and XXH3-64 checksum. The last line says OK, or the first problem follows.\n"
          "Exit status 0 when every file verifies, 1 when the manifest or a file is missing or\n"
          "wrong (the first problem, naming the file), 2 for a usage error.\n",
          f);
}

int ct_checkpoint_main(int argc, char **argv)
{
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ctrain checkpoint: unknown flag '%s' (ctrain checkpoint --help)\n", argv[i]);
            return 2;
        }
        if (dir) {
            fprintf(stderr, "ctrain checkpoint: unexpected argument '%s': expected one DIR\n", argv[i]);
            return 2;
        }
        dir = argv[i];
    }
    if (!dir) {
        fputs("ctrain checkpoint: DIR is missing (usage: ctrain checkpoint DIR)\n", stderr);
        return 2;
    }
    /* the report is the manifest's summary, then one line per file as it verifies, so
     * the files checked before a bad one are on the screen above the error */
    ct_checkpoint_info info;
    ct_status st = ct_checkpoint_inspect(dir, true, &info, stdout);
    fflush(stdout);
    if (st) {
        fprintf(stderr, "ctrain checkpoint: %s\n", ct_last_error());
        return 1;
    }
    printf("OK: every checksum verifies (step %lld, %d files)\n", (long long)info.step, info.nfiles);
    return 0;
}
