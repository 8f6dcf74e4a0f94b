/* `ctrain checkpoint DIR`: what a training-state checkpoint (ct_accelerator_save_state,
 * accel/checkpoint.h) holds, and whether every file in it is intact (docs/launch.md,
 * "ctrain checkpoint"). */
#ifndef CT_TOOLS_CHECKPOINT_CMD_H
#define CT_TOOLS_CHECKPOINT_CMD_H

/* argv[0] is "checkpoint". Prints the manifest's summary and one line per file on
 * stdout. Exit code 0 when every file verifies, 1 when the manifest or a file is
 * missing or wrong (the first problem on stderr, naming the file), 2 for a usage error. */
int ct_checkpoint_main(int argc, char **argv);

#endif
