/* `ctrain env`: what this machine and build give a training run, for bug reports and
 * for choosing a precision (docs/launch.md, "ctrain env"). */
#ifndef CT_TOOLS_ENV_H
#define CT_TOOLS_ENV_H

/* argv[0] is "env". Prints the report on stdout; exit code 0, 1 when a setting in
 * the environment is invalid (each is named under "problems"), 2 for a usage error. */
int ct_env_main(int argc, char **argv);

#endif
