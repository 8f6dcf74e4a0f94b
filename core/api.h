/* ctrain — the export marker. libctrain.so is built with -fvisibility=hidden: a
 * function is part of the shared library's interface only when its declaration in
 * a public header (one ctrain.h includes) carries CT_API. Helpers shared between
 * the library's own files are named cti_ and declared in *_internal.h headers
 * without it. */
#ifndef CT_CORE_API_H
#define CT_CORE_API_H

#if defined(__GNUC__) || defined(__clang__)
#define CT_API __attribute__((visibility("default")))
#else
#define CT_API
#endif

#endif
