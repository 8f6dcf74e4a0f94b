/* Between the TCP transport's setup (dist/tcp_setup.c, the caller's thread) and its
 * loop side (dist/tcp.c). */
#ifndef CT_DIST_TCP_INTERNAL_H
#define CT_DIST_TCP_INTERNAL_H

#include "dist/transport_internal.h"

/* A transport over connected sockets: fds[p] is the connection to rank p, fds[rank]
 * is -1. Takes fds (malloc'd) and the sockets, also on failure (NULL, error set). */
ct_transport *ct_tcp_transport_wrap(int rank, int size, int *fds);

#endif
