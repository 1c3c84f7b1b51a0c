/* file.c - regular-file inputs, output-is-not-an-input checks and exclusive
 * temporary outputs (see moe-file.h). */
#define _GNU_SOURCE
#include "moe-file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *moe_file_kind(unsigned mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "a special file";
}

enum moe_status moe_file_open_regular(const char *path, int *fd, char *why, size_t cap) {
    *fd = -1;
    if (cap) why[0] = 0;
    /* O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever;
     * it has no effect on regular files, and is cleared below anyway. */
    int d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (d < 0) {
        int e = errno;
        snprintf(why, cap, "cannot open: %s", strerror(e));
        return e == ENOENT ? MOE_ERR_NOT_FOUND : MOE_ERR_IO;
    }
    struct stat st;
    int fl;
    if (fstat(d, &st) != 0) {
        snprintf(why, cap, "cannot stat: %s", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, cap, "is %s, not a regular file: refusing to read it", moe_file_kind(st.st_mode));
    } else if ((fl = fcntl(d, F_GETFL)) < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        snprintf(why, cap, "fcntl: %s", strerror(errno));
    } else {
        *fd = d;
        return MOE_OK;
    }
    close(d);
    return MOE_ERR_IO;
}

enum moe_status moe_file_open_read(const char *path, int *fd) {
    char why[160];
    enum moe_status st = moe_file_open_regular(path, fd, why, sizeof why);
    if (st) MOE_LOGE("%s: %s", path, why);
    return st;
}

enum moe_status moe_file_fopen_read(const char *path, FILE **out) {
    int fd;
    *out = NULL;
    enum moe_status st = moe_file_open_read(path, &fd);
    if (st) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        MOE_LOGE("%s: fdopen: %s", path, strerror(errno));
        close(fd);
        return MOE_ERR_NOMEM;
    }
    *out = f;
    return MOE_OK;
}

int moe_file_same(const char *a, const char *b) {
    struct stat x, y;
    if (!a || !b || stat(a, &x) != 0 || stat(b, &y) != 0) return 0;
    return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* split_dir: the directory part of path ("." if none) as a malloc'd string,
 * and its final name in *base (borrowed from path). */
static char *split_dir(const char *path, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    return slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
}

int moe_file_same_target(const char *a, const char *b) {
    if (!a || !b) return 0;
    if (moe_file_same(a, b)) return 1;
    const char *ba, *bb;
    char *da = split_dir(a, &ba), *db = split_dir(b, &bb);
    int same = da && db && ba[0] && !strcmp(ba, bb) && moe_file_same(da, db);
    free(da);
    free(db);
    return same;
}

enum moe_status moe_file_check_output(const char *output, const char *const *inputs, size_t n) {
    for (size_t i = 0; output && i < n; i++) {
        if (inputs[i] && moe_file_same(output, inputs[i])) {
            MOE_LOGE("%s is the same file as the input %s: refusing to overwrite an input (choose another output)",
                     output, inputs[i]);
            return MOE_ERR_INVALID;
        }
    }
    return MOE_OK;
}

/* tmp_candidate: "<target>.tmp.<pid>" for attempt 0, "<target>.tmp.<pid>.<n>" after. */
static char *tmp_candidate(const char *target, unsigned attempt) {
    size_t n = strlen(target) + 64;
    char *p = malloc(n);
    if (!p) return NULL;
    if (attempt == 0)
        snprintf(p, n, "%s.tmp.%ld", target, (long)getpid());
    else
        snprintf(p, n, "%s.tmp.%ld.%u", target, (long)getpid(), attempt);
    return p;
}

enum moe_status moe_tmp_create(const char *target, struct moe_tmp_file *t) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    if (!target || !target[0]) {
        MOE_LOGE("empty output path");
        return MOE_ERR_INVALID;
    }
    for (unsigned attempt = 0; attempt < 1000; attempt++) {
        char *p = tmp_candidate(target, attempt);
        if (!p) {
            MOE_LOGE("%s: out of memory", target);
            return MOE_ERR_NOMEM;
        }
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) {
            t->path = p;
            t->fd = fd;
            if (!(t->target = strdup(target))) {
                MOE_LOGE("%s: out of memory", target);
                moe_tmp_discard(t);
                return MOE_ERR_NOMEM;
            }
            return MOE_OK;
        }
        int e = errno;
        if (e != EEXIST) {
            MOE_LOGE("%s: cannot create the temporary output %s: %s", target, p, strerror(e));
            free(p);
            return MOE_ERR_IO;
        }
        free(p); /* taken (a stale file, a link someone planted, or a second writer): next name */
    }
    MOE_LOGE("%s: no free temporary name next to it", target);
    return MOE_ERR_IO;
}

enum moe_status moe_tmp_name(const char *target, char **out) {
    *out = NULL;
    if (!target || !target[0]) {
        MOE_LOGE("empty output path");
        return MOE_ERR_INVALID;
    }
    for (unsigned attempt = 0; attempt < 1000; attempt++) {
        char *p = tmp_candidate(target, attempt);
        if (!p) {
            MOE_LOGE("%s: out of memory", target);
            return MOE_ERR_NOMEM;
        }
        struct stat st;
        if (lstat(p, &st) != 0 && errno == ENOENT) {
            *out = p;
            return MOE_OK;
        }
        free(p);
    }
    MOE_LOGE("%s: no free temporary name next to it", target);
    return MOE_ERR_IO;
}

FILE *moe_tmp_stream(struct moe_tmp_file *t) {
    if (t->f) return t->f;
    if (t->fd < 0) return NULL;
    t->f = fdopen(t->fd, "wb");
    if (!t->f) MOE_LOGE("%s: fdopen: %s", t->path, strerror(errno));
    return t->f;
}

int moe_fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return ENOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
    if (fd < 0 || fsync(fd) != 0) err = errno;
    if (err == EINVAL) err = 0; /* file systems that cannot sync directories */
    if (fd >= 0) close(fd);
    free(dir);
    return err;
}

/* tmp_clear: forget everything (the file is already closed and renamed or removed). */
static void tmp_clear(struct moe_tmp_file *t) {
    free(t->path);
    free(t->target);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

enum moe_status moe_tmp_commit(struct moe_tmp_file *t) {
    if (!t->path) return MOE_ERR_INVALID;
    int err = 0;
    const char *what = "write";
    if (t->f) {
        if (fflush(t->f) != 0 || ferror(t->f)) err = errno ? errno : EIO;
        if (!err && fsync(fileno(t->f)) != 0) err = errno, what = "fsync";
        if (fclose(t->f) != 0 && !err) err = errno, what = "close";
    } else if (t->fd >= 0) {
        if (fsync(t->fd) != 0) err = errno, what = "fsync";
        if (close(t->fd) != 0 && !err) err = errno, what = "close";
    }
    t->f = NULL;
    t->fd = -1;
    if (!err && rename(t->path, t->target) != 0) err = errno, what = "rename";
    if (err) {
        MOE_LOGE("%s: cannot write it (%s of %s failed: %s); the old file, if any, is unchanged", t->target, what,
                 t->path, strerror(err));
        unlink(t->path);
        tmp_clear(t);
        return MOE_ERR_IO;
    }
    if ((err = moe_fsync_parent(t->target)) != 0)
        MOE_LOGW("%s: written, but syncing its directory failed (%s)", t->target, strerror(err));
    tmp_clear(t);
    return MOE_OK;
}

void moe_tmp_discard(struct moe_tmp_file *t) {
    if (!t) return;
    if (t->f)
        fclose(t->f);
    else if (t->fd >= 0)
        close(t->fd);
    if (t->path) unlink(t->path);
    tmp_clear(t);
}

enum moe_status moe_file_commit_path(const char *tmp_path, const char *target) {
    int err = 0;
    const char *what = "open";
    int fd = open(tmp_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) err = errno;
    if (!err && fsync(fd) != 0) err = errno, what = "fsync";
    if (fd >= 0) close(fd);
    if (!err && rename(tmp_path, target) != 0) err = errno, what = "rename";
    if (err) {
        MOE_LOGE("%s: cannot write it (%s of %s failed: %s); the old file, if any, is unchanged", target, what,
                 tmp_path, strerror(err));
        unlink(tmp_path);
        return MOE_ERR_IO;
    }
    if ((err = moe_fsync_parent(target)) != 0)
        MOE_LOGW("%s: written, but syncing its directory failed (%s)", target, strerror(err));
    return MOE_OK;
}
