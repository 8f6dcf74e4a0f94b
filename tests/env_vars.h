/* Helpers for the tests of settings read from the environment: clear a list of
 * variables, and expect a failure whose message names a part. */
#ifndef CT_TESTS_ENV_VARS_H
#define CT_TESTS_ENV_VARS_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static inline void env_vars_clear(const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) unsetenv(names[i]);
}

/* st must be an error, and ct_last_error() must contain part. */
static inline void expect_error_naming(ct_status st, const char *part)
{
    cr_assert_neq(st, CT_OK, "expected an error naming '%s'", part);
    cr_assert(strstr(ct_last_error(), part), "error '%s' should name '%s'", ct_last_error(), part);
}

#endif
