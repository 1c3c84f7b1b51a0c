/*
 * moe-mmap.h - read-only memory maps of whole files, and small file helpers.
 */
#ifndef MOE_MMAP_H
#define MOE_MMAP_H

#include <stddef.h>

#include "moe-base.h" /* moe_path_join, once declared here */
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_mmap {
    void *data;  /* NULL for an empty file */
    size_t size; /* bytes */
    unsigned long long dev, ino; /* the mapped file's device and inode (0 in a zeroed struct): lets a
                                  * later open of the same path check it still names this file */
};

/* moe_mmap_open: map `path` read-only. Anything but a regular file (a FIFO,
 * device, directory) is refused without blocking (moe-file.h). On error logs
 * the path and reason. */
enum moe_status moe_mmap_open(const char *path, struct moe_mmap *out);

/* moe_mmap_close: unmap; safe on a zeroed struct. */
void moe_mmap_close(struct moe_mmap *m);

/* moe_read_file: read a whole (small) file into a NUL-terminated malloc'd buffer.
 * Files above max_bytes are rejected, and so is anything but a regular file
 * (without blocking). Caller frees *out. */
enum moe_status moe_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len);

/* moe_is_dir: 1 if path is a directory. */
int moe_is_dir(const char *path);

#ifdef __cplusplus
}
#endif
#endif
