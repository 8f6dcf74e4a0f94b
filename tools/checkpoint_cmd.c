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
          "step, world size, strategy, precision, optimizer, files, tensors, bytes), then checks\n"
          "every file the manifest lists: present, of the recorded size and XXH3-64 checksum,\n"
          "with a safetensors header that parses. One line per file is printed as it is checked.\n"
          "Exit status 0 when every file verifies, 1 when the manifest or a file is missing or\n"
          "wrong (the first problem, naming the file), 2 for a usage error.\n",
          f);
}

static void print_summary(const char *dir, const ct_checkpoint_info *in)
{
    printf("checkpoint %s\n", dir);
    printf("  format version:   %d\n", in->format_version);
    printf("  ctrain version:   %s\n", in->ctrain_version);
    printf("  step:             %lld\n", (long long)in->step);
    printf("  world size:       %d\n", in->world_size);
    printf("  shard files:      %d%s\n", in->shard_world, in->shard_world == 1 ? " (replicated)" : " per sharded part");
    printf("  strategy:         %s\n", in->strategy);
    printf("  mixed precision:  %s\n", in->mixed_precision);
    printf("  optimizer:        %s\n", in->optimizer[0] ? in->optimizer : "none");
    printf("  files:            %d\n", in->nfiles);
    printf("  tensors:          %lld\n", (long long)in->tensors);
    printf("  bytes:            %lld\n", (long long)in->bytes);
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
    /* the manifest alone first: its summary is worth seeing even when a file is bad */
    ct_checkpoint_info info;
    if (ct_checkpoint_inspect(dir, false, &info, NULL)) {
        fprintf(stderr, "ctrain checkpoint: %s\n", ct_last_error());
        return 1;
    }
    print_summary(dir, &info);
    printf("files:\n");
    fflush(stdout);
    if (ct_checkpoint_inspect(dir, true, &info, stdout)) {
        fflush(stdout);
        fprintf(stderr, "ctrain checkpoint: %s\n", ct_last_error());
        return 1;
    }
    printf("OK: every checksum verifies\n");
    return 0;
}
