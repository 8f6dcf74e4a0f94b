/* A process and its descendants, for tests that kill a launcher with its ranks: the
 * ranks run in sessions of their own (the launcher's setsid), so a process-group signal
 * would miss them. */
#ifndef CT_TESTS_PROC_TREE_H
#define CT_TESTS_PROC_TREE_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* The children of pid (from /proc/<each>/stat's ppid field) appended to out[*n..cap). */
static inline void proc_children_of(pid_t pid, pid_t *out, int *n, int cap)
{
    DIR *d = opendir("/proc");
    cr_assert_not_null(d, "/proc: %s", strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL && *n < cap) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* gone meanwhile */
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        /* "pid (comm) state ppid ...": comm may hold spaces and parentheses */
        const char *rp = strrchr(buf, ')');
        char state;
        int ppid;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == pid) out[(*n)++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
}

/* SIGKILLs pid and every descendant (up to 128 processes). The tree is listed first,
 * stopping each process found, so nothing reparents or forks meanwhile: a machine
 * that is gone. */
static inline void proc_kill_tree(pid_t pid)
{
    pid_t all[128] = {pid};
    int n = 1;
    kill(pid, SIGSTOP);
    for (int i = 0; i < n; i++) {
        int from = n;
        proc_children_of(all[i], all, &n, 128);
        for (int k = from; k < n; k++) kill(all[k], SIGSTOP);
    }
    for (int i = 0; i < n; i++) kill(all[i], SIGKILL);
}

#endif
