/* `ctrain merge-weights DIR OUT`: a sharded checkpoint (SHARDED_STATE_DICT) merged
 * into one safetensors file, as `accelerate merge-weights` does (docs/launch.md,
 * "ctrain merge-weights"). */
#ifndef CT_TOOLS_MERGE_WEIGHTS_H
#define CT_TOOLS_MERGE_WEIGHTS_H

/* argv[0] is "merge-weights". Exit code 0 when OUT was written, 1 when the directory
 * fails a check or OUT cannot be written (the error on stderr), 2 for a usage error. */
int ct_merge_weights_main(int argc, char **argv);

#endif
