/* Helpers of the shared-memory transport's tests (tests/dist/test_shm.c, test_mux.c):
 * the names a group's setup leaves in /dev/shm, the mappings it holds, and a rank that
 * plays the setup by hand. */
#ifndef CT_TESTS_DIST_SHM_NAMES_H
#define CT_TESTS_DIST_SHM_NAMES_H

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ranks.h"

/* Rank 0: the job id of its gen-th group (the second field of its host entry). */
static inline bool job_of(rank_ctx *c, int gen, char job[17])
{
    char key[64];
    void *v = NULL;
    size_t n;
    snprintf(key, sizeof key, "ct/pg/%d/host/0", gen);
    if (!c->store || ct_store_get(c->store, key, 5, &v, &n)) return false;
    bool ok = sscanf(v, "%*s %16s", job) == 1 && strlen(job) == 16;
    free(v);
    return ok;
}

/* Names /dev/shm/ctrain-<job>-* that exist. */
static inline int shm_names(const char *job)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "ctrain-%s-", job);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* This process's mappings of /dev/shm/ctrain-* whose name is gone ("(deleted)"). */
static inline int unlinked_maps(void)
{
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, "/dev/shm/ctrain-") && strstr(line, "(deleted)");
    fclose(f);
    return n;
}

/* The job id rank 0 reported ("job <hex>"), or "" when it did not. */
static inline void reported_job(const rank_result *r, char job[17])
{
    const char *p = strstr(r->msg, "job ");
    job[0] = '\0';
    if (p) sscanf(p + 4, "%16s", job);
}

/* Nothing of rank 0's reported job is left in /dev/shm. */
static inline void expect_no_names(const rank_result *r0)
{
    char job[17];
    reported_job(r0, job);
    cr_expect(job[0], "rank 0 did not report the job id:\n%s", r0->msg);
    if (job[0]) cr_expect_eq(shm_names(job), 0, "/dev/shm/ctrain-%s-* left behind", job);
}

/* Rank `rank` of `size` played by hand: connects to ip:port and sends the TCP
 * transport's version-2 hello (dist/tcp_setup.c: "CTHI" | 2 | 0 | token_len 0 | rank |
 * size | nonce, little-endian) with the group's 8-byte nonce and no token (none is
 * set). The connected socket, or -1. */
static inline int hello_connect(const char *ip, int port, int rank, int size, const void *nonce)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    uint8_t hello[24] = {'C', 'T', 'H', 'I', 2};
    for (int i = 0; i < 4; i++) {
        hello[8 + i] = (uint8_t)((uint32_t)rank >> 8 * i);
        hello[12 + i] = (uint8_t)((uint32_t)size >> 8 * i);
    }
    memcpy(hello + 16, nonce, 8);
    int fd = inet_pton(AF_INET, ip, &a.sin_addr) == 1 ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    if (fd >= 0 && (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
                    send(fd, hello, sizeof hello, 0) != (ssize_t)sizeof hello)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

#endif
