/* `ctrain config`'s questionnaire: Accelerate's questions, in its order, on a
 * terminal (user documentation: docs/launch.md, "ctrain config").
 *
 * Each question shows its default in brackets; Enter accepts it; an answer outside
 * the allowed set is asked again, naming the allowed values. Only questions that
 * make sense for the machine are asked (no GPU questions where no GPU can be used).
 */
#ifndef CT_TOOLS_CONFIG_ASK_H
#define CT_TOOLS_CONFIG_ASK_H

#include <stdio.h>

#include "tools/config_file.h"

/* What the questionnaire knows of the machine it configures. */
typedef struct ct_config_ask_machine {
    int gpus;  /* GPUs this machine can use (ct_cuda_device_count), 0 = none */
    int cores; /* online CPU cores */
} ct_config_ask_machine;

/* Asks every question on out, reading the answers line by line from in, and fills
 * *c, which holds the defaults offered (ct_cluster_config_defaults, or an existing
 * file's values). CT_ERR_INVALID when in ends before the last answer (nothing is
 * half-filled: *c is only written when every question was answered). */
ct_status ct_config_ask(FILE *in, FILE *out, const ct_config_ask_machine *m, ct_cluster_config *c);

#endif
