/* mmap.c - read-only file maps and small-file helpers. */
#define _GNU_SOURCE
#include "moe-mmap.h"
#include "moe-file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum moe_status moe_mmap_open(const char *path, struct moe_mmap *out) {
    out->data = NULL;
    out->size = 0;
    out->dev = out->ino = 0;
    int fd;
    enum moe_status rs = moe_file_open_read(path, &fd); /* refuses FIFOs, devices, directories */
    if (rs) return rs == MOE_ERR_NOT_FOUND ? MOE_ERR_IO : rs;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        MOE_LOGE("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return MOE_ERR_IO;
    }
    out->dev = (unsigned long long)st.st_dev;
    out->ino = (unsigned long long)st.st_ino;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            MOE_LOGE("%s: mmap failed: %s", path, strerror(errno));
            close(fd);
            return MOE_ERR_IO;
        }
        out->data = p;
        out->size = (size_t)st.st_size;
    }
    close(fd);
    return MOE_OK;
}

void moe_mmap_close(struct moe_mmap *m) {
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
    m->dev = m->ino = 0;
}

enum moe_status moe_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f;
    enum moe_status rs = moe_file_fopen_read(path, &f); /* refuses FIFOs, devices, directories */
    if (rs) return rs == MOE_ERR_NOT_FOUND ? MOE_ERR_IO : rs;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return MOE_ERR_NOMEM;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= max_bytes) {
                MOE_LOGE("%s: file larger than %zu bytes", path, max_bytes);
                free(buf);
                fclose(f);
                return MOE_ERR_FORMAT;
            }
            cap = cap * 2 > max_bytes ? max_bytes : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return MOE_ERR_NOMEM;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        MOE_LOGE("%s: read error", path);
        free(buf);
        return MOE_ERR_IO;
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return MOE_OK;
}

int moe_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
