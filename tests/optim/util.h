/* Helpers shared by the optimizer tests. */
#ifndef CT_TESTS_OPTIM_UTIL_H
#define CT_TESTS_OPTIM_UTIL_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor.h"

/* ERROR_HAS("op", "name", ...): the last error message holds every string. */
#define ERROR_HAS(...)                                                                                           \
    do {                                                                                                         \
        const char *want_[] = {__VA_ARGS__};                                                                     \
        for (size_t k_ = 0; k_ < sizeof want_ / sizeof *want_; k_++)                                             \
            cr_assert(strstr(ct_last_error(), want_[k_]), "error \"%s\" lacks \"%s\"", ct_last_error(), want_[k_]); \
    } while (0)

/* Same dtype, shape and bytes (false for a NULL tensor). */
static inline bool same_bits(const ct_tensor *a, const ct_tensor *b)
{
    return a && b && a->dtype == b->dtype && ct_tensor_same_shape(a, b) &&
           !memcmp(ct_tensor_data(a), ct_tensor_data(b), ct_tensor_nbytes(a));
}

/* Replaces p's gradient with g (retained; NULL clears it), as backward would leave it. */
static inline void set_grad(ct_tensor *p, ct_tensor *g)
{
    ct_tensor_release(p->grad);
    p->grad = g ? ct_tensor_retain(g) : NULL;
}

#endif
