/* ctrain — autocast state the library's own caches read (precision/autocast.h is the
 * public side). */
#ifndef CT_PRECISION_AUTOCAST_INTERNAL_H
#define CT_PRECISION_AUTOCAST_INTERNAL_H

#include "precision/autocast.h"

/* The weight-cast generation, bumped by ct_autocast_weights_changed: a cached
 * low-precision weight copy made in an older generation is stale. */
unsigned long cti_autocast_generation(void);

#endif
