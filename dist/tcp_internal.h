/* Between the TCP transport's setup (dist/tcp_setup.c, the caller's thread) and its
 * loop side (dist/tcp.c). */
#ifndef CT_DIST_TCP_INTERNAL_H
#define CT_DIST_TCP_INTERNAL_H

#include "dist/transport_internal.h"

/* A transport over connected sockets: fds[p] is the connection to rank p, fds[rank]
 * is -1 (as is fds[p] of a peer that another transport serves). Takes fds (malloc'd)
 * and the sockets, also on failure (NULL, error set). */
ct_transport *cti_tcp_transport_wrap(int rank, int size, int *fds);

/* The setup of cti_tcp_transport_new without the transport: the connected,
 * non-blocking sockets (TCP_NODELAY), fds[p] to rank p, fds[rank] = -1; malloc'd,
 * owned by the caller. NULL with the error set on failure. The shared-memory
 * transport (dist/shm_setup.c) uses them for its handshake and as doorbells. */
int *cti_tcp_connect(const ct_transport_setup *s);

/* CTRAIN_PORT_RANGE: *lo = *hi = 0 when unset or empty, else LO-HI with
 * 1 <= LO <= HI <= 65535; anything else is an error naming the variable. */
ct_status cti_tcp_port_range(int *lo, int *hi);

#endif
