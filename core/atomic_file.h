/* Files written whole or not at all, and small files read whole.
 *
 * Every file ctrain writes (safetensors, config.json, tokenizer.json, token .bin files,
 * checkpoint texts) goes through one writer: the bytes go to PATH.tmp.<pid> beside
 * PATH, and commit fsyncs that file and renames it over PATH, so a reader sees the
 * old file or the new one, never a torn one; a crash leaves at most the .tmp file.
 * A failed write, a failed commit or an abort removes the temporary file. Messages
 * name `what` (the op: "safetensors_save", "bpe", ...) and the file.
 *
 *     cti_atomic_file f;
 *     if (cti_atomic_open(&f, path, "bpe")) return ct_last_status();
 *     st = cti_atomic_write(&f, buf, n);          any number of writes
 *     return cti_atomic_commit(&f, st);           st != CT_OK: abort, keep st
 *
 * Internal to ctrain (cti_): the layers above core share it; it is not in ctrain.h.
 */
#ifndef CT_CORE_ATOMIC_FILE_H
#define CT_CORE_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct cti_atomic_file {
    int fd;           /* the temporary file, -1 once closed */
    const char *path; /* the destination (borrowed: outlives the writer) */
    const char *what; /* the op named in messages (borrowed) */
    char *tmp;        /* PATH.tmp.<pid> (owned) */
} cti_atomic_file;

/* Creates PATH.tmp.<pid> (mode 0644, truncated). CT_ERR_IO naming the temporary
 * file when it cannot be created; nothing to clean up then. */
ct_status cti_atomic_open(cti_atomic_file *f, const char *path, const char *what);

/* Appends n bytes (retrying short writes and EINTR). */
ct_status cti_atomic_write(cti_atomic_file *f, const void *data, size_t n);

/* Writes n bytes at offset (a header whose counts are known only at the end). */
ct_status cti_atomic_pwrite(cti_atomic_file *f, const void *data, size_t n, int64_t offset);

/* st == CT_OK: fsync, close and rename over PATH; then, when sync_dir, fsync PATH's
 * directory so the rename itself survives a crash. st != CT_OK (an earlier failure)
 * or any failure here: the temporary file is closed and removed, and the first
 * failure is returned. Frees the writer's memory either way. */
ct_status cti_atomic_commit(cti_atomic_file *f, ct_status st, int sync_dir);

/* The whole of one write: open, write n bytes, commit (no directory sync). */
ct_status cti_file_write_atomic(const char *path, const void *data, size_t n, const char *what);

/* fsyncs the directory dir, so the names created or renamed in it survive a crash. A
 * filesystem that cannot sync a directory (EINVAL) is not an error. */
ct_status cti_dir_sync(const char *dir);
/* cti_dir_sync of the directory holding path (its parent; "." for a bare name). */
ct_status cti_dir_sync_parent(const char *path);

/* The whole file, NUL-terminated after its *len bytes (len may be NULL); caller
 * frees. NULL + error naming what and the file: CT_ERR_IO when it cannot be opened
 * or read (with errno's text), CT_ERR_FORMAT when it holds more than max bytes,
 * CT_ERR_NOMEM. */
char *cti_file_read_text(const char *path, size_t max, const char *what, size_t *len);

#endif
