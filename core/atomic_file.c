/* Files written whole or not at all; small files read whole (core/atomic_file.h). */
#include "core/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ct_status cti_atomic_open(cti_atomic_file *f, const char *path, const char *what)
{
    *f = (cti_atomic_file){.fd = -1, .path = path, .what = what ? what : "write"};
    if (!path || !*path) return ct_error_set(CT_ERR_INVALID, "%s: no file name", f->what);
    size_t len = strlen(path) + 32;
    if (!(f->tmp = malloc(len))) return ct_error_set(CT_ERR_NOMEM, "%s: out of memory writing '%s'", f->what, path);
    snprintf(f->tmp, len, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        ct_status st = ct_error_set(CT_ERR_IO, "%s: cannot create '%s': %s", f->what, f->tmp, strerror(errno));
        free(f->tmp);
        f->tmp = NULL;
        return st;
    }
    return CT_OK;
}

ct_status cti_atomic_write(cti_atomic_file *f, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t r = write(f->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ct_error_set(CT_ERR_IO, "%s: cannot write '%s': %s", f->what, f->tmp, strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return CT_OK;
}

ct_status cti_atomic_pwrite(cti_atomic_file *f, const void *data, size_t n, int64_t offset)
{
    const char *p = data;
    while (n > 0) {
        ssize_t r = pwrite(f->fd, p, n, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return ct_error_set(CT_ERR_IO, "%s: cannot write %zu bytes at offset %lld of '%s': %s", f->what, n,
                                (long long)offset, f->tmp, r < 0 ? strerror(errno) : "nothing written");
        p += r;
        n -= (size_t)r;
        offset += r;
    }
    return CT_OK;
}

ct_status cti_atomic_commit(cti_atomic_file *f, ct_status st, int sync_dir)
{
    if (!f->tmp) return st ? st : ct_error_set(CT_ERR_INVALID, "%s: '%s' was never opened", f->what, f->path);
    if (!st && fsync(f->fd) != 0)
        st = ct_error_set(CT_ERR_IO, "%s: cannot fsync '%s': %s", f->what, f->tmp, strerror(errno));
    if (close(f->fd) != 0 && !st)
        st = ct_error_set(CT_ERR_IO, "%s: cannot close '%s': %s", f->what, f->tmp, strerror(errno));
    f->fd = -1;
    if (!st && rename(f->tmp, f->path) != 0)
        st = ct_error_set(CT_ERR_IO, "%s: cannot rename '%s' to '%s': %s", f->what, f->tmp, f->path, strerror(errno));
    if (st) unlink(f->tmp); /* best effort: the error already says what went wrong */
    else if (sync_dir) st = cti_dir_sync_parent(f->path);
    free(f->tmp);
    f->tmp = NULL;
    return st;
}

ct_status cti_file_write_atomic(const char *path, const void *data, size_t n, const char *what)
{
    cti_atomic_file f;
    ct_status st = cti_atomic_open(&f, path, what);
    if (st) return st;
    return cti_atomic_commit(&f, cti_atomic_write(&f, data, n), 0);
}

ct_status cti_dir_sync(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ct_error_set(CT_ERR_IO, "cannot open directory '%s' to sync it: %s", dir, strerror(errno));
    /* some filesystems cannot sync a directory and say EINVAL: nothing more to do there */
    ct_status st = fsync(fd) != 0 && errno != EINVAL
                       ? ct_error_set(CT_ERR_IO, "cannot fsync directory '%s': %s", dir, strerror(errno))
                       : CT_OK;
    close(fd);
    return st;
}

ct_status cti_dir_sync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return ct_error_set(CT_ERR_NOMEM, "syncing the directory of '%s': out of memory", path);
    ct_status st = cti_dir_sync(dir);
    free(dir);
    return st ? ct_error_prefix("'%s' written: ", path) : CT_OK;
}

char *cti_file_read_text(const char *path, size_t max, const char *what, size_t *len)
{
    if (!what) what = "read";
    if (!path) return ct_error_set(CT_ERR_INVALID, "%s: no file name", what), NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ct_error_set(CT_ERR_IO, "%s: cannot open '%s': %s", what, path, strerror(errno)), NULL;
    /* grow as the file is read: its size is not trusted (a pipe, /proc, a file that grows) */
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    ct_status st = buf ? CT_OK : ct_error_set(CT_ERR_NOMEM, "%s: out of memory reading '%s'", what, path);
    while (!st) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (ferror(f)) {
            st = ct_error_set(CT_ERR_IO, "%s: cannot read '%s': %s", what, path, strerror(errno));
        } else if (n > max) {
            st = ct_error_set(CT_ERR_FORMAT, "%s: '%s' is larger than %zu bytes, the limit for this file", what,
                              path, max);
        } else if (n < cap - 1) {
            break; /* end of file */
        } else {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) st = ct_error_set(CT_ERR_NOMEM, "%s: out of memory reading '%s'", what, path);
            else buf = bigger, cap *= 2;
        }
    }
    fclose(f);
    if (st) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}
