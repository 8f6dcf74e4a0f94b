/* `ctrain config`: the launch configuration file, as `accelerate config` (user
 * documentation: docs/launch.md, "Configuration files").
 *
 *   ctrain config [--config_file PATH]            the questionnaire (a terminal)
 *   ctrain config default [--config_file PATH] [--mixed_precision no|fp16|bf16|fp8]
 *   ctrain config show [FILE]                     the file and what launch does with it
 *   ctrain config update [--config_file PATH]     rewrite an older file in the current form
 */
#ifndef CT_TOOLS_CONFIG_CMD_H
#define CT_TOOLS_CONFIG_CMD_H

/* argv[0] is "config". Exit code 0 on success (and when `config default` leaves an
 * existing file alone, as Accelerate does), 1 when a file cannot be read, checked or
 * written (the error on stderr names it), 2 for a usage error. */
int ct_config_main(int argc, char **argv);

#endif
