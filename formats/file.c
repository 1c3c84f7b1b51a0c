/* file.c - regular-file inputs, output-is-not-an-input checks and exclusive
 * temporary outputs (see moe-file.h). */
#define _GNU_SOURCE
#include "moe-file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
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
    if (output && moe_output_check(output, 1)) return MOE_ERR_INVALID;
    for (size_t i = 0; output && i < n; i++) {
        if (inputs[i] && moe_file_same(output, inputs[i])) {
            MOE_LOGE("%s is the same file as the input %s: refusing to overwrite an input (choose another output)",
                     output, inputs[i]);
            return MOE_ERR_INVALID;
        }
    }
    return MOE_OK;
}

/* ---- the output rule ------------------------------------------------------------ */

/* stream_kind: 1 if mode is a file that is written in place, never replaced
 * (character device, FIFO, socket). */
static int stream_kind(mode_t mode) { return S_ISCHR(mode) || S_ISFIFO(mode) || S_ISSOCK(mode); }

/* fd_alias: a name of one of this process's open descriptors (/dev/stdout,
 * /dev/stderr, /dev/fd/N, /proc/self/fd/N): written through the descriptor's
 * file in place (appending when it is a regular file), never replaced. */
static int fd_alias(const char *p) {
    return !strcmp(p, "/dev/stdout") || !strcmp(p, "/dev/stderr") || !strncmp(p, "/dev/fd/", 8) ||
           !strncmp(p, "/proc/self/fd/", 14);
}

int moe_output_is_stream(const char *output) {
    struct stat st;
    return output && (strcmp(output, "-") == 0 || fd_alias(output) ||
                      (stat(output, &st) == 0 && stream_kind(st.st_mode)));
}

enum moe_status moe_output_check(const char *output, int streamable) {
    if (!output) return MOE_OK;
    if (!output[0]) {
        MOE_LOGE("an empty output path");
        return MOE_ERR_INVALID;
    }
    struct stat st;
    const int descriptor = strcmp(output, "-") == 0 || fd_alias(output), exists = stat(output, &st) == 0;
    if (descriptor || (exists && stream_kind(st.st_mode))) {
        if (streamable) return MOE_OK;
        MOE_LOGE("%s is %s: this output is written to a temporary file and renamed into place, so it needs a "
                 "regular file (give a file name)", output,
                 descriptor ? "an open descriptor (standard output)" : moe_file_kind(st.st_mode));
        return MOE_ERR_INVALID;
    }
    if (exists && !S_ISREG(st.st_mode)) {
        MOE_LOGE("%s is %s, not a file: give a file name for the output", output, moe_file_kind(st.st_mode));
        return MOE_ERR_INVALID;
    }
    const char *base = NULL;
    char *dir = split_dir(output, &base);
    if (!dir) return MOE_ERR_NOMEM;
    enum moe_status rc = MOE_OK;
    if (stat(dir, &st) != 0) {
        MOE_LOGE("%s: the directory %s does not exist (create it first)", output, dir);
        rc = MOE_ERR_INVALID;
    } else if (!S_ISDIR(st.st_mode)) {
        MOE_LOGE("%s: %s is %s, not a directory", output, dir, moe_file_kind(st.st_mode));
        rc = MOE_ERR_INVALID;
    } else if (access(dir, W_OK | X_OK) != 0) {
        MOE_LOGE("%s: cannot write in the directory %s: %s", output, dir, strerror(errno));
        rc = MOE_ERR_INVALID;
    }
    free(dir);
    return rc;
}

/* ---- temporary files the process holds: removed on a fatal signal ---------------- */

#define LIVE_MAX 32
static char g_live[LIVE_MAX][PATH_MAX];
static volatile sig_atomic_t g_live_state[LIVE_MAX]; /* 0 free, 1 being filled, 2 live */

void moe_tmp_track(const char *path) {
    if (!path || strlen(path) >= PATH_MAX) return;
    for (int i = 0; i < LIVE_MAX; i++) {
        sig_atomic_t want = 0;
        if (__atomic_compare_exchange_n(&g_live_state[i], &want, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            memcpy(g_live[i], path, strlen(path) + 1);
            __atomic_store_n(&g_live_state[i], 2, __ATOMIC_RELEASE);
            return;
        }
    }
}

void moe_tmp_untrack(const char *path) {
    for (int i = 0; path && i < LIVE_MAX; i++)
        if (__atomic_load_n(&g_live_state[i], __ATOMIC_ACQUIRE) == 2 && strcmp(g_live[i], path) == 0) {
            __atomic_store_n(&g_live_state[i], 0, __ATOMIC_RELEASE);
            return;
        }
}

/* on_fatal: remove the live temporary files, then die of the signal as
 * before (async-signal-safe: unlink, signal, raise). */
static void on_fatal(int sig) {
    for (int i = 0; i < LIVE_MAX; i++)
        if (g_live_state[i] == 2) unlink(g_live[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

void moe_file_cleanup_on_signals(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_fatal;
            sigemptyset(&sa.sa_mask);
            sigaction(sigs[i], &sa, NULL);
        }
    }
}

/* pid_of_tmp: the pid in "<base>.tmp.<pid>[.<n>]" when name is such a name of
 * base, else -1. */
static long pid_of_tmp(const char *name, const char *base) {
    const size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return -1;
    const char *p = name + n + 5;
    char *end = NULL;
    errno = 0;
    const long pid = strtol(p, &end, 10);
    if (errno || end == p || pid <= 0) return -1;
    if (*end == '.') {
        const char *q = end + 1;
        strtoul(q, &end, 10);
        if (end == q) return -1;
    }
    return *end ? -1 : pid;
}

int moe_tmp_sweep(const char *target) {
    const char *base = NULL;
    char *dir = split_dir(target, &base);
    if (!dir || !base || !*base) {
        free(dir);
        return 0;
    }
    DIR *d = opendir(dir);
    int removed = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        const long pid = pid_of_tmp(e->d_name, base);
        if (pid < 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its process runs (or is not ours to ask) */
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
            MOE_LOGW("%s/%s: removed, a temporary file left by process %ld, which no longer runs", dir, e->d_name, pid);
            removed++;
        }
    }
    if (d) closedir(d);
    free(dir);
    return removed;
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

enum moe_status moe_output_resolve(const char *target, char **resolved) {
    *resolved = NULL;
    struct stat lst, st;
    if (lstat(target, &lst) != 0) return MOE_OK; /* a new file */
    if (S_ISLNK(lst.st_mode)) {
        if (stat(target, &st) != 0) return MOE_OK; /* a dangling link: replaced by the file */
        if (!S_ISREG(st.st_mode)) {
            MOE_LOGE("%s links to %s, not a file: give a file name for the output", target, moe_file_kind(st.st_mode));
            return MOE_ERR_INVALID;
        }
        if (!(*resolved = realpath(target, NULL))) {
            MOE_LOGE("%s: cannot resolve the link: %s", target, strerror(errno));
            return MOE_ERR_IO;
        }
    } else if (!S_ISREG(lst.st_mode)) {
        MOE_LOGE("%s is %s, not a file: give a file name for the output", target, moe_file_kind(lst.st_mode));
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* open_stream: t writes straight into target ("-": standard output; a
 * character device, FIFO or socket: opened for writing, never replaced). */
static enum moe_status open_stream(const char *target, struct moe_tmp_file *t) {
    /* a descriptor's alias that is a regular file (stdout redirected to one) is
     * appended to, so what the process wrote there before stays */
    const int fd = strcmp(target, "-") == 0 ? dup(STDOUT_FILENO)
                                            : open(target, O_WRONLY | O_NOCTTY | O_CLOEXEC | (fd_alias(target) ? O_APPEND : 0));
    if (fd < 0) {
        MOE_LOGE("%s: cannot open it for writing: %s", target, strerror(errno));
        return MOE_ERR_IO;
    }
    t->fd = fd;
    t->stream = 1;
    t->path = strdup(target);
    t->target = strdup(target);
    if (!t->path || !t->target) {
        MOE_LOGE("%s: out of memory", target);
        moe_tmp_discard(t);
        return MOE_ERR_NOMEM;
    }
    return MOE_OK;
}

enum moe_status moe_tmp_create(const char *target, struct moe_tmp_file *t) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    if (!target || !target[0]) {
        MOE_LOGE("empty output path");
        return MOE_ERR_INVALID;
    }
    if (moe_output_is_stream(target)) return open_stream(target, t);
    char *resolved = NULL; /* a symlink to a file: that file is replaced, the link stays */
    const enum moe_status rs = moe_output_resolve(target, &resolved);
    if (rs) return rs;
    if (resolved) target = resolved;
    moe_tmp_sweep(target);
    enum moe_status rc = MOE_ERR_IO;
    for (unsigned attempt = 0; attempt < 1000; attempt++) {
        char *p = tmp_candidate(target, attempt);
        if (!p) {
            MOE_LOGE("%s: out of memory", target);
            rc = MOE_ERR_NOMEM;
            break;
        }
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) {
            moe_tmp_track(p);
            t->path = p;
            t->fd = fd;
            if (!(t->target = strdup(target))) {
                MOE_LOGE("%s: out of memory", target);
                moe_tmp_discard(t);
                rc = MOE_ERR_NOMEM;
                break;
            }
            free(resolved);
            return MOE_OK;
        }
        int e = errno;
        if (e != EEXIST) {
            MOE_LOGE("%s: cannot create the temporary output %s: %s", target, p, strerror(e));
            free(p);
            break;
        }
        free(p); /* taken (a stale file, a link someone planted, or a second writer): next name */
        if (attempt == 999) MOE_LOGE("%s: no free temporary name next to it", target);
    }
    free(resolved);
    return rc;
}

enum moe_status moe_tmp_name(const char *target, char **out) {
    *out = NULL;
    if (!target || !target[0]) {
        MOE_LOGE("empty output path");
        return MOE_ERR_INVALID;
    }
    if (moe_output_check(target, 0)) return MOE_ERR_INVALID;
    moe_tmp_sweep(target);
    for (unsigned attempt = 0; attempt < 1000; attempt++) {
        char *p = tmp_candidate(target, attempt);
        if (!p) {
            MOE_LOGE("%s: out of memory", target);
            return MOE_ERR_NOMEM;
        }
        struct stat st;
        if (lstat(p, &st) != 0 && errno == ENOENT) {
            moe_tmp_track(p);
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
    if (!t->stream) moe_tmp_untrack(t->path);
    free(t->path);
    free(t->target);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

enum moe_status moe_tmp_commit(struct moe_tmp_file *t) {
    if (!t->path) return MOE_ERR_INVALID;
    int err = 0;
    const char *what = "write";
    if (t->stream) { /* written in place: flush and close; nothing to rename */
        if (t->f) {
            if (fflush(t->f) != 0 || ferror(t->f)) err = errno ? errno : EIO;
            if (fclose(t->f) != 0 && !err) err = errno, what = "close";
        } else if (t->fd >= 0 && close(t->fd) != 0) {
            err = errno, what = "close";
        }
        t->f = NULL, t->fd = -1;
        if (err) MOE_LOGE("%s: cannot write to it (%s: %s)", t->target, what, strerror(err));
        tmp_clear(t);
        return err ? MOE_ERR_IO : MOE_OK;
    }
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
    if (t->path && !t->stream) unlink(t->path); /* a stream cannot be taken back */
    tmp_clear(t);
}

enum moe_status moe_file_commit_path(const char *tmp_path, const char *target) {
    moe_tmp_untrack(tmp_path);
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
