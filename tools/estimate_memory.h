/* `ctrain estimate-memory MODEL [...]`: bytes per rank of training MODEL with AdamW,
 * per strategy, precision and world size (docs/launch.md, "ctrain estimate-memory").
 * The figures come from tools/memory_model.h; `--measure` trains the model instead,
 * as one rank of a job, and prints what the engine measured beside the estimate. */
#ifndef CT_TOOLS_ESTIMATE_MEMORY_H
#define CT_TOOLS_ESTIMATE_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "tools/memory_model.h"

/* argv[0] is "estimate-memory". Exit code 0, 1 when a measurement fails, 2 for a
 * usage error (the message on stderr). */
int ct_estimate_memory_main(int argc, char **argv);

/* One measured configuration: s (world is the job's), `steps` steps. */
typedef struct ct_memory_measure {
    ct_memory_setup setup;
    const char *model_name; /* for the output */
    int steps;
} ct_memory_measure;

/* Trains s->setup's model under the launcher's job (or alone) for s->steps steps and
 * prints, on rank 0, the measured figures beside the estimate (docs/launch.md).
 * Exit code 0, or 1 after printing what failed. */
int ct_memory_measure_run(const ct_memory_measure *m);

#endif
