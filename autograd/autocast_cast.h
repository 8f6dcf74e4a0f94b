/* ctrain — the autocast weight cache. Under an autocast scope (precision/autocast.h)
 * autograd's ops use a low-precision copy of each parameter, made once per weight
 * generation; these functions clear and count that cache. */
#ifndef CT_AUTOGRAD_AUTOCAST_CAST_H
#define CT_AUTOGRAD_AUTOCAST_CAST_H

#include "core/api.h"
#include "autograd/ops.h"
#include "precision/autocast.h"

/* Releases every cached weight copy (they go anyway at the next optimizer step). */
CT_API void ct_autocast_clear_cache(void);
/* How many weight copies the cache has made so far in this process. */
CT_API long ct_autocast_cache_casts(void);

#endif
