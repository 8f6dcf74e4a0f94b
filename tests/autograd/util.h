/* Helpers shared by the autograd op tests. */
#ifndef CT_TESTS_AUTOGRAD_UTIL_H
#define CT_TESTS_AUTOGRAD_UTIL_H

#include <criterion/criterion.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/tensor.h"

#define F64 CT_DTYPE_F64

/* t, checked and marked as requiring grad */
static inline ct_tensor *leaf(ct_tensor *t)
{
    cr_assert_not_null(t, "%s", ct_last_error());
    cr_assert_eq(ct_tensor_set_requires_grad(t, true), CT_OK, "%s", ct_last_error());
    return t;
}

/* an f64 normal(0, 1) leaf */
static inline ct_tensor *randn(int ndim, const int64_t *shape)
{
    return leaf(ct_tensor_randn(F64, ndim, shape, 0, 1));
}

/* expr returns NULL and the message contains every given string */
#define EXPECT_ERROR(expr, ...)                                                                     \
    do {                                                                                            \
        ct_error_clear();                                                                           \
        cr_assert_null(expr);                                                                       \
        const char *want_[] = {__VA_ARGS__};                                                        \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)                              \
            cr_assert(strstr(ct_last_error(), want_[i_]), "'%s' lacks '%s'", ct_last_error(), want_[i_]); \
    } while (0)

#endif
