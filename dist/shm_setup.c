/* Choosing the transport, and the shared-memory transport's setup, on the caller's
 * thread; every step is bounded by the deadline (the group timeout). The loop side is
 * in dist/shm.c, the ring protocol in dist/shm_internal.h, the composite transport
 * in dist/mux.c.
 *
 * Node. Two ranks are on one node when they share the boot id, the host name and the
 * network namespace (the device and inode of /proc/self/ns/net): containers or
 * `ip netns` test clusters on one machine are as many nodes. CTRAIN_NODE_ID, when set
 * and not empty, replaces the boot id and the namespace (ranks with the same value
 * and host name are one node), so that tests on one machine can play several nodes.
 *
 * Choice. Every rank publishes "<want> <job id> <node> <host name>" under
 * <prefix>/host/<rank> (the job id is rank 0's, 16 hex digits of random; the others
 * write 0; node: "<boot id>/<dev>:<inode>" or "id=<CTRAIN_NODE_ID>"), then makes the
 * TCP connections (dist/tcp_setup.c). A peer publishes its entry before its address,
 * so once connected every rank finds every entry and decides the same:
 *   - "tcp" when some rank asked for it (a peer without an entry, not this code, counts
 *     as asking for "tcp"); some asking for "shm" then is an error naming the others;
 *   - "shm" when every rank has rank 0's node and host name;
 *   - else, when some rank asked for "shm", every rank fails naming the ranks not on
 *     rank 0's node;
 *   - else "shm+tcp" when two ranks share a node: rings to the peers on this rank's
 *     node, TCP to the others (a rank alone on its node has no rings; it uses the
 *     composite transport all the same);
 *   - else "tcp".
 *
 * Segments, two rounds of one byte on every connection to a peer on this node:
 *   1. each rank creates, sizes (reserving the pages: a full /dev/shm fails here, not
 *      with SIGBUS later) and maps its segment to each such peer,
 *      /ctrain-<job>-<from>-<to>, and with "shm" its direct-allreduce slot
 *      (dist/shm_direct_internal.h), /ctrain-<job>-<r>-<r>, then sends 'S' (or 'F') and
 *      reads every such peer's byte;
 *   2. if every one said 'S', each opens its peers' segments, unlinks each at once
 *      (its mapping and the producer's keep it alive) and maps it, maps every peer's
 *      slot, then sends 'M' (or 'F') and reads every peer's byte; after 'M' from all,
 *      each rank unlinks its own slot.
 * After round 2 no name is left in /dev/shm. On any failure every rank unlinks both
 * directions' names for every peer on its node (ENOENT is fine), so a rank killed
 * during the setup leaves nothing behind either; with "auto" the ranks of that node
 * then agree on TCP over the same connections (they read exactly the handshake's
 * bytes; the ranks of a node decide together, so every pair agrees on its link, and
 * such a node's ranks report "tcp"), with "shm" they fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/poll_internal.h"
#include "dist/shm_direct_internal.h"
#include "dist/shm_internal.h"
#include "dist/tcp_internal.h"

/* How long to wait for a connected peer's entry: it was published before the
 * connection, so only a peer that never publishes one waits this long. */
#define ENTRY_WAIT_S 0.25

#define NODE_CAP 128

typedef struct entry {
    bool present;
    char want[8], node[NODE_CAP], host[256];
    unsigned long long job;
} entry;

static void no_blanks(char *s)
{
    for (char *c = s; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '\n' || *c == '\r') *c = '_';
}

/* This rank's node (see the header) and host name, without blanks. */
static void node_identity(char *node, size_t ncap, char *host, size_t hcap)
{
    const char *id = getenv("CTRAIN_NODE_ID");
    if (id && *id) {
        snprintf(node, ncap, "id=%s", id);
    } else {
        char boot[64];
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (!f || !fgets(boot, (int)sizeof boot, f)) boot[0] = '\0';
        if (f) fclose(f);
        boot[strcspn(boot, " \t\r\n")] = '\0';
        struct stat ns;
        if (stat("/proc/self/ns/net", &ns)) memset(&ns, 0, sizeof ns); /* no namespaces: one per boot */
        snprintf(node, ncap, "%s/%llx:%llx", boot[0] ? boot : "-", (unsigned long long)ns.st_dev,
                 (unsigned long long)ns.st_ino);
    }
    no_blanks(node);
    if (gethostname(host, hcap)) host[0] = '\0';
    host[hcap - 1] = '\0';
    no_blanks(host);
    if (!host[0]) snprintf(host, hcap, "-");
}

static bool same_node(const entry *a, const entry *b)
{
    return a->present && b->present && !strcmp(a->node, b->node) && !strcmp(a->host, b->host);
}

/* A tuning variable: dflt when unset or empty, else a number in lo .. hi (a multiple
 * of `multiple` when that is not 0); anything else is an error naming the variable. */
static ct_status env_knob(const char *var, double dflt, double lo, double hi, unsigned multiple, const char *what,
                          double *out)
{
    const char *v = getenv(var);
    *out = dflt;
    if (!v || !*v) return CT_OK;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    bool ok = !errno && !*end && x >= lo && x <= hi && (!multiple || fmod(x, multiple) == 0);
    if (!ok) return ct_error_set(CT_ERR_INVALID, "shm: %s='%s' is not %s in %.15g .. %.15g", var, v, what, lo, hi);
    *out = x;
    return CT_OK;
}

/* The rings' bytes (CTRAIN_SHM_RING_BYTES, a test and tuning knob); the direct
 * allreduce's bytes per buffer (CTRAIN_SHM_SLOT_BYTES) and seconds of polling before
 * sleeping (CTRAIN_SHM_SPIN_US; negative: its default). */
static ct_status shm_knobs(uint64_t *ring, uint64_t *slot, double *spin_s)
{
    double r = 0, sl = 0, sp = -1;
    ct_status st = env_knob("CTRAIN_SHM_RING_BYTES", CT_SHM_RING_BYTES, CT_SHM_RING_MIN, CT_SHM_RING_MAX, 1,
                            "a number of bytes", &r);
    if (!st)
        st = env_knob("CTRAIN_SHM_SLOT_BYTES", CT_DIRECT_SLOT_BYTES, CT_DIRECT_SLOT_MIN, CT_DIRECT_SLOT_MAX, 64,
                      "a multiple of 64 bytes", &sl);
    if (!st) st = env_knob("CTRAIN_SHM_SPIN_US", -1, 0, 1e7, 0, "a number of microseconds", &sp);
    *ring = (uint64_t)r;
    *slot = (uint64_t)sl;
    *spin_s = sp < 0 ? -1 : sp * 1e-6;
    return st;
}

static void seg_name(char *out, size_t cap, unsigned long long job, int from, int to)
{
    snprintf(out, cap, "/ctrain-%016llx-%d-%d", job, from, to);
}

/* Creates, reserves and maps the segment from -> to; NULL with the reason in why. */
static ct_shm_ring *seg_create(unsigned long long job, int from, int to, uint64_t cap, char *why, size_t wcap)
{
    char name[96];
    seg_name(name, sizeof name, job, from, to);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, wcap, "shm_open %s: %s", name, strerror(errno));
        return NULL;
    }
    size_t bytes = CT_SHM_CTL_BYTES + cap;
    int rc = posix_fallocate(fd, 0, (off_t)bytes);
    void *m = rc ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!rc && m == MAP_FAILED) rc = errno;
    close(fd);
    if (rc) {
        snprintf(why, wcap, "cannot reserve %zu bytes for %s: %s (is /dev/shm full or too small?)", bytes, name,
                 strerror(rc));
        shm_unlink(name);
        return NULL;
    }
    ct_shm_ring *r = m;
    r->magic = CT_SHM_MAGIC;
    r->version = CT_SHM_VERSION;
    r->capacity = cap;
    atomic_store(&r->head, 0);
    atomic_store(&r->tail, 0);
    atomic_store(&r->rx_sleep, 1); /* the reader has not looked yet: the first bytes ring */
    atomic_store(&r->tx_sleep, 0);
    return r;
}

/* Opens, unlinks (when it has one reader: a ring) and maps the segment from -> to
 * made by from; checks its header. */
static ct_shm_ring *seg_open(unsigned long long job, int from, int to, char *why, size_t wcap)
{
    char name[96];
    seg_name(name, sizeof name, job, from, to);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, wcap, "shm_open %s (made by rank %d): %s (do the ranks share /dev/shm?)", name, from,
                 strerror(errno));
        return NULL;
    }
    if (from != to) shm_unlink(name); /* a slot has several readers: its owner unlinks it */
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= CT_SHM_CTL_BYTES + CT_SHM_RING_MIN)
        m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(why, wcap, "cannot map %s (made by rank %d): %s", name, from, strerror(err));
        return NULL;
    }
    ct_shm_ring *r = m;
    if (r->magic != CT_SHM_MAGIC || r->version != CT_SHM_VERSION ||
        r->capacity + CT_SHM_CTL_BYTES != (uint64_t)st.st_size) {
        snprintf(why, wcap, "%s (made by rank %d) is not a ring of this version (magic %08x, version %u)", name,
                 from, r->magic, r->version);
        munmap(m, (size_t)st.st_size);
        return NULL;
    }
    return r;
}


/* One round: sends mine to every peer, reads every peer's byte. Returns the error
 * (connection lost, no answer, a byte that is not ok or fail); *failed = the lowest
 * rank that said 'F', or -1. */
static ct_status handshake(const ct_transport_setup *s, const int *fds, const bool *local, char mine, char ok,
                           double deadline, int *failed)
{
    *failed = -1;
    for (int q = 0; q < s->size; q++) {
        if (q == s->rank || !local[q]) continue;
        ssize_t k;
        do k = send(fds[q], &mine, 1, MSG_NOSIGNAL); /* an empty socket buffer takes it */
        while (k < 0 && errno == EINTR);
        if (k != 1)
            return ct_error_set(CT_ERR_PEER, "shm: cannot write to rank %d during the setup (%s): did it exit?", q,
                                k < 0 ? strerror(errno) : "short write");
    }
    for (int q = 0; q < s->size; q++) {
        if (q == s->rank || !local[q]) continue;
        char b = 0;
        for (;;) {
            int r = cti_dist_wait_fd(fds[q], POLLIN, deadline);
            if (r == 0)
                return ct_error_set(CT_ERR_TIMEOUT,
                                    "shm: rank %d did not answer during the shared-memory setup within %.3g s; set "
                                    "CTRAIN_TIMEOUT to wait longer",
                                    q, s->timeout_s);
            if (r < 0) return ct_error_set(CT_ERR_IO, "shm: poll: %s", strerror(errno));
            ssize_t k = recv(fds[q], &b, 1, 0);
            if (k == 1) break;
            if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            return ct_error_set(CT_ERR_PEER,
                                "shm: rank %d closed its connection during the shared-memory setup%s%s%s: did the "
                                "process exit or crash?",
                                q, k ? " (" : "", k ? strerror(errno) : "", k ? ")" : "");
        }
        if (b == 'F') {
            if (*failed < 0) *failed = q;
        } else if (b != ok) {
            return ct_error_set(CT_ERR_FORMAT, "shm: rank %d sent 0x%02x during the setup, expected '%c' or 'F'", q,
                                (unsigned char)b, ok);
        }
    }
    return CT_OK;
}

/* The transport over the connected sockets fds (taken) when the peers with local[q]
 * share this rank's node: with all (mixed false) the shm transport and its direct
 * allreduce; with some, rings to those and TCP to the others ("shm+tcp"). With
 * fallback, a failure to make the segments that every local peer sees gives the TCP
 * transport instead. */
static ct_transport *shm_setup(const ct_transport_setup *s, int *fds, const bool *local, bool mixed,
                               unsigned long long job, bool fallback, double deadline)
{
    ct_shm_ring **tx = calloc((size_t)s->size, sizeof *tx), **rx = calloc((size_t)s->size, sizeof *rx);
    /* slots[q]: rank q's direct-allreduce segment, q -> q (this rank's own included); none when mixed */
    ct_shm_ring **slots = mixed ? NULL : calloc((size_t)s->size, sizeof *slots);
    uint64_t cap, slot;
    double spin;
    char why[384] = "";
    ct_status st = CT_OK;
    bool mine = true;
    int failed = -1;
    if (!tx || !rx || (!mixed && !slots)) {
        st = ct_error_set(CT_ERR_NOMEM, "shm: out of memory setting up the transport for %d ranks", s->size);
        goto fail;
    }
    if ((st = shm_knobs(&cap, &slot, &spin))) goto fail;
    for (int q = 0; q < s->size && mine; q++)
        if (q != s->rank && local[q] && !(tx[q] = seg_create(job, s->rank, q, cap, why, sizeof why))) mine = false;
    if (mine && slots && !(slots[s->rank] = seg_create(job, s->rank, s->rank, 2 * slot, why, sizeof why)))
        mine = false;
    if ((st = handshake(s, fds, local, mine ? 'S' : 'F', 'S', deadline, &failed))) goto fail;
    if (mine && failed < 0) {
        for (int q = 0; q < s->size && mine; q++)
            if (q != s->rank && local[q] && !(rx[q] = seg_open(job, q, s->rank, why, sizeof why))) mine = false;
        for (int q = 0; slots && q < s->size && mine; q++) {
            if (q == s->rank) continue;
            if (!(slots[q] = seg_open(job, q, q, why, sizeof why))) mine = false;
            else if (slots[q]->capacity != 2 * slot) {
                snprintf(why, sizeof why,
                         "rank %d's direct-allreduce buffers are %llu bytes, this rank's %llu: every rank must use "
                         "the same CTRAIN_SHM_SLOT_BYTES",
                         q, (unsigned long long)slots[q]->capacity / 2, (unsigned long long)slot);
                mine = false;
            }
        }
        if ((st = handshake(s, fds, local, mine ? 'M' : 'F', 'M', deadline, &failed))) goto fail;
    }
    if (mine && failed < 0 && slots) {
        /* every peer has mapped this rank's slot (it said 'M') */
        char name[96];
        seg_name(name, sizeof name, job, s->rank, s->rank);
        shm_unlink(name);
    }
    if (mine && failed < 0 && !mixed)
        return cti_shm_transport_wrap(s->rank, s->size, fds, tx, rx, slots, (size_t)slot, spin);
    if (mine && failed < 0) {
        /* the sockets split: the local peers' ring the doorbells, the others carry data */
        int *far = malloc((size_t)s->size * sizeof *far);
        if (!far) {
            st = ct_error_set(CT_ERR_NOMEM, "shm+tcp: out of memory setting up the transport for %d ranks", s->size);
            goto fail;
        }
        for (int q = 0; q < s->size; q++) {
            far[q] = local[q] ? -1 : fds[q];
            if (!local[q]) fds[q] = -1;
        }
        ct_transport *near = cti_shm_transport_wrap(s->rank, s->size, fds, tx, rx, NULL, (size_t)slot, spin);
        ct_transport *tcp = cti_tcp_transport_wrap(s->rank, s->size, far);
        return cti_mux_transport_new(s->rank, s->size, near, tcp, local);
    }

fail:
    for (int q = 0; q < s->size; q++) {
        if (q == s->rank || !local[q]) continue;
        char name[96];
        seg_name(name, sizeof name, job, s->rank, q);
        shm_unlink(name);
        seg_name(name, sizeof name, job, q, s->rank);
        shm_unlink(name);
        if (tx && tx[q]) munmap(tx[q], CT_SHM_CTL_BYTES + tx[q]->capacity);
        if (rx && rx[q]) munmap(rx[q], CT_SHM_CTL_BYTES + rx[q]->capacity);
    }
    for (int q = 0; !mixed && q < s->size; q++) {
        char name[96];
        seg_name(name, sizeof name, job, q, q);
        shm_unlink(name); /* ENOENT for the peers' that were opened (and unlinked) */
        if (slots && slots[q]) munmap(slots[q], CT_SHM_CTL_BYTES + slots[q]->capacity);
    }
    free(tx);
    free(rx);
    free(slots);
    if (!st && fallback) return cti_tcp_transport_wrap(s->rank, s->size, fds);
    for (int q = 0; q < s->size; q++)
        if (fds[q] >= 0) close(fds[q]);
    free(fds);
    if (st) return NULL;
    if (!mine)
        ct_error_set(CT_ERR_IO, "shm: %s; use transport \"tcp\" or \"auto\"", why);
    else
        ct_error_set(CT_ERR_PEER,
                     "shm: rank %d could not set up its shared-memory rings (its own error says why); use transport "
                     "\"tcp\" or \"auto\"",
                     failed);
    return NULL;
}

/* "1, 3, 4" from the ranks with bad[q]. */
static void rank_list(const bool *bad, int n, char *out, size_t cap)
{
    size_t k = 0;
    out[0] = '\0';
    for (int q = 0; q < n && k < cap - 16; q++)
        if (bad[q]) k += (size_t)snprintf(out + k, cap - k, "%s%d", k ? ", " : "", q);
}

/* where[q] = "<ip>, host <name>" from q's TCP address and host entry, for messages. */
static char (*peer_places(const ct_transport_setup *s, const entry *e))[CT_PEER_WHERE]
{
    char(*where)[CT_PEER_WHERE] = calloc((size_t)s->size, sizeof *where);
    if (!where) return NULL; /* the messages then name ranks only */
    for (int q = 0; q < s->size; q++) {
        char key[CT_STORE_MAX_KEY], ip[128] = "?";
        char *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "%s/addr/%d", s->prefix, q);
        /* every peer published its address before it connected */
        if (!ct_store_get(s->store, key, ENTRY_WAIT_S, (void **)&v, &len)) {
            if (sscanf(v, "%127s", ip) != 1) snprintf(ip, sizeof ip, "?");
            free(v);
        }
        snprintf(where[q], CT_PEER_WHERE, "%s, host %.255s", ip, e[q].present ? e[q].host : "?");
    }
    ct_error_clear();
    return where;
}

ct_transport *cti_transport_select(const ct_transport_setup *s, const char *want)
{
    double deadline = cti_dist_now() + s->timeout_s;
    entry *e = calloc((size_t)s->size, sizeof *e);
    bool *bad = calloc((size_t)s->size, sizeof *bad), *local = calloc((size_t)s->size, sizeof *local);
    int *fds = NULL;
    char(*where)[CT_PEER_WHERE] = NULL;
    ct_transport *t = NULL;
    char key[CT_STORE_MAX_KEY], val[512];
    if (!e || !bad || !local) {
        ct_error_set(CT_ERR_NOMEM, "transport: out of memory choosing the transport for %d ranks", s->size);
        goto fail;
    }
    unsigned long long job = 0;
    if (s->rank == 0 && getrandom(&job, sizeof job, 0) != (ssize_t)sizeof job)
        job = (unsigned long long)getpid() * 0x9e3779b97f4a7c15u ^ (unsigned long long)(cti_dist_now() * 1e9);
    char node[NODE_CAP], host[256];
    node_identity(node, sizeof node, host, sizeof host);
    snprintf(key, sizeof key, "%s/host/%d", s->prefix, s->rank);
    int n = snprintf(val, sizeof val, "%s %016llx %s %s", want, job, node, host);
    if (ct_store_set(s->store, key, val, (size_t)n)) {
        ct_error_prefix("transport: ");
        goto fail;
    }
    fds = cti_tcp_connect(s);
    if (!fds) goto fail;

    for (int q = 0; q < s->size; q++) {
        char *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "%s/host/%d", s->prefix, q);
        ct_status st = ct_store_get(s->store, key, ENTRY_WAIT_S, (void **)&v, &len);
        if (st == CT_ERR_TIMEOUT) continue;
        if (st) {
            ct_error_prefix("transport: ");
            goto fail;
        }
        entry *x = &e[q];
        x->present = sscanf(v, "%7s %llx %127s %255s", x->want, &x->job, x->node, x->host) == 4;
        free(v);
    }
    ct_error_clear();
    where = peer_places(s, e);
    bool any_shm = false, any_tcp = false, elsewhere = false, pair = false;
    for (int q = 0; q < s->size; q++) {
        bool tcp = !e[q].present || !strcmp(e[q].want, "tcp");
        any_tcp |= tcp;
        any_shm |= e[q].present && !strcmp(e[q].want, "shm");
        bad[q] = e[q].present && !same_node(&e[q], &e[0]);
        elsewhere |= !e[q].present || bad[q];
        local[q] = q != s->rank && same_node(&e[q], &e[s->rank]);
        for (int r = 0; r < q && !pair; r++) pair = same_node(&e[q], &e[r]);
    }
    char list[256];
    if (any_shm && any_tcp) {
        for (int q = 0; q < s->size; q++) bad[q] = !e[q].present || !strcmp(e[q].want, "tcp");
        rank_list(bad, s->size, list, sizeof list);
        ct_error_set(CT_ERR_INVALID,
                     "transport: some ranks asked for \"shm\" but rank(s) %s asked for \"tcp\"; give every rank the "
                     "same transport (ct_pg_config.transport or CTRAIN_TRANSPORT)",
                     list);
        goto fail;
    }
    if (any_shm && elsewhere) {
        int first = -1;
        for (int q = 0; q < s->size; q++)
            if (bad[q] && first < 0) first = q;
        rank_list(bad, s->size, list, sizeof list);
        if (strcmp(e[first].host, e[0].host))
            ct_error_set(CT_ERR_INVALID,
                         "transport: \"shm\" needs every rank on one host, but rank(s) %s run on another host (rank "
                         "%d on '%s', rank 0 on '%s'); use transport \"auto\" or \"tcp\"",
                         list, first, e[first].host, e[0].host);
        else
            ct_error_set(CT_ERR_INVALID,
                         "transport: \"shm\" needs every rank on one node, but rank(s) %s run on another node of host "
                         "'%s' (rank %d's node '%s', rank 0's '%s': another network namespace or CTRAIN_NODE_ID); use "
                         "transport \"auto\" or \"tcp\"",
                         list, e[0].host, first, e[first].node, e[0].node);
        goto fail;
    }
    if (any_tcp || (elsewhere && !pair)) {
        t = cti_tcp_transport_wrap(s->rank, s->size, fds);
    } else {
        job = e[0].job;
        t = shm_setup(s, fds, local, elsewhere, job, !any_shm, deadline);
    }
    fds = NULL; /* taken */
    if (!t) goto fail;
    t->where = where;
    free(e);
    free(bad);
    free(local);
    return t;

fail:
    if (fds)
        for (int q = 0; q < s->size; q++)
            if (fds[q] >= 0) close(fds[q]);
    free(fds);
    free(where);
    free(e);
    free(bad);
    free(local);
    return NULL;
}
