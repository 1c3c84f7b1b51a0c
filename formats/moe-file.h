/*
 * moe-file.h - the project's one implementation of the file-safety rules every
 * tool follows (issue 17):
 *
 *   - inputs are regular files: a FIFO, socket, device or directory named where
 *     a file is expected is refused with a message naming the path, without
 *     blocking (opening a FIFO for reading would wait for a writer forever);
 *   - an output is never the same file as an input: files are compared by
 *     device and inode, not by name, so "./a", "a" and a hard link all match;
 *   - outputs are written to a new temporary file in the target's directory,
 *     created with O_CREAT | O_EXCL | O_NOFOLLOW (a symlink or file planted at
 *     the temporary name is never followed or reused), then fsynced, renamed
 *     over the target and the directory fsynced: an interrupted or failed
 *     write leaves the old file intact and no partial output;
 *   - "-" is standard output, and a character device, FIFO or socket named as
 *     an output is written in place (streamed), never replaced; an output
 *     that must be a regular file (a bundle) refuses them by name; a directory
 *     or block device is refused; the output's directory must exist and be
 *     writable, checked before any work (moe_output_check);
 *   - no leftovers: the temporary files a process holds are removed on
 *     SIGINT, SIGTERM, SIGHUP and SIGQUIT (moe_file_cleanup_on_signals), and
 *     those of a process that no longer runs (killed with SIGKILL) are removed
 *     when the next writer of the same target starts (moe_tmp_sweep).
 *
 * Every function logs its failure once through moe_log (naming the path and
 * the reason) and returns an enum moe_status. No global state: thread-safe
 * (two writers racing for one temporary name are separated by O_EXCL).
 */
#ifndef MOE_FILE_H
#define MOE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moe_file_open_read: open `path` read-only and return its descriptor in *fd
 * (O_CLOEXEC, blocking mode). Refuses anything that is not a regular file
 * (after following symlinks) with MOE_ERR_IO and a message naming the path and
 * what it is ("a FIFO", "a directory", ...); a missing file is
 * MOE_ERR_NOT_FOUND. Never blocks on a FIFO. */
enum moe_status moe_file_open_read(const char *path, int *fd);

/* moe_file_open_regular: moe_file_open_read without logging, for readers that
 * report errors their own way: the reason ("cannot open: No such file or
 * directory", "is a FIFO, not a regular file: ...") goes to why[0..cap). */
enum moe_status moe_file_open_regular(const char *path, int *fd, char *why, size_t cap);

/* moe_file_fopen_read: moe_file_open_read as a stdio stream ("rb"); the caller
 * fcloses *out. */
enum moe_status moe_file_fopen_read(const char *path, FILE **out);

/* moe_file_kind: "a regular file", "a directory", "a FIFO", "a socket",
 * "a character device", "a block device", "a symbolic link" or "a special
 * file", for a stat mode (messages). */
const char *moe_file_kind(unsigned mode);

/* moe_file_same: 1 if a and b exist and name the same file (same device and
 * inode, symlinks followed), else 0. */
int moe_file_same(const char *a, const char *b);

/* moe_file_same_target: 1 if a and b name the same output: the same existing
 * file (moe_file_same), or, when they do not exist yet, the same name in the
 * same directory ("x", "./x" and "dir/../x" all match). For refusing two
 * outputs of one command that would replace each other. */
int moe_file_same_target(const char *a, const char *b);

/* moe_file_check_output: MOE_ERR_INVALID (logged: "OUT is the same file as
 * the input IN: refusing to overwrite it") if `output` names the same file as
 * any of inputs[0..n) (NULL entries are skipped), or if moe_output_check(output,
 * 1) refuses it. MOE_OK otherwise, also when output does not exist yet. */
enum moe_status moe_file_check_output(const char *output, const char *const *inputs, size_t n);

/* moe_output_check: the output rule's checks that need no inputs, made before
 * any work: "-" and an existing character device, FIFO or socket are streams,
 * accepted when `streamable` and refused by name otherwise; an existing
 * directory, block device or other special file is refused; an output whose
 * directory does not exist, is not a directory or is not writable is refused
 * naming the directory. MOE_ERR_INVALID (logged) on refusal. */
enum moe_status moe_output_check(const char *output, int streamable);

/* moe_output_resolve: where a regular-file output is really written: for a
 * symlink to a file, *resolved = that file's path (malloc'd; the link stays,
 * the file is replaced), else NULL (a new file, a regular file or a dangling
 * link: the path itself). MOE_ERR_INVALID (logged) when target is or links to
 * something that is not a file; MOE_ERR_IO when the link cannot be resolved. */
enum moe_status moe_output_resolve(const char *target, char **resolved);

/* moe_output_is_stream: 1 if output is "-", a name of an open descriptor
 * (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: appended to when it
 * is a regular file) or an existing character device, FIFO or socket
 * (symlinks followed). */
int moe_output_is_stream(const char *output);

/* moe_file_cleanup_on_signals: install handlers for SIGINT, SIGTERM, SIGHUP
 * and SIGQUIT (each only if it has the default disposition) that remove the
 * process's live temporary outputs and then die of the signal as before. For
 * a CLI's main(), once; a command that handles these signals itself (to
 * cancel cleanly) keeps its own handlers. */
void moe_file_cleanup_on_signals(void);

/* moe_tmp_track / moe_tmp_untrack: add or remove a temporary path from the
 * set the signal handler removes (moe_tmp_create and moe_tmp_name track
 * theirs; writers with their own temporary files, such as the bundle writer,
 * call these). At most 32 at once; thread-safe and lock-free. */
void moe_tmp_track(const char *path);
void moe_tmp_untrack(const char *path);

/* moe_tmp_sweep: remove the temporary files "<target>.tmp.<pid>[.<n>]" next
 * to target that belong to this user and to a process that no longer runs
 * (a writer killed with SIGKILL), each logged; returns how many. Called by
 * moe_tmp_create and moe_tmp_name. */
int moe_tmp_sweep(const char *target);

/* A temporary output file next to its target (or, for a stream, the target). */
struct moe_tmp_file {
    char *path;   /* the temporary name (owned); the target itself for a stream */
    char *target; /* the final path (owned) */
    int fd;       /* -1 once closed */
    FILE *f;      /* set by moe_tmp_stream; owns fd then */
    int stream;   /* 1: written in place ("-", a device, FIFO or socket): no rename */
};

/* moe_tmp_create: create a new, empty temporary file in target's directory,
 * named "<target>.tmp.<pid>" or, if that exists, "<target>.tmp.<pid>.<n>",
 * with O_CREAT | O_EXCL | O_NOFOLLOW and mode 0644 (less the umask), after
 * removing leftovers of dead writers (moe_tmp_sweep); it is tracked for the
 * signal handler. A target that is a symlink to a file: that file is
 * replaced, the link stays. A stream target ("-", a character device, FIFO
 * or socket) is opened for writing in place instead (t->stream). A
 * directory or other special file is refused (MOE_ERR_INVALID). On failure
 * *t is cleared and nothing is left behind. */
enum moe_status moe_tmp_create(const char *target, struct moe_tmp_file *t);

/* moe_tmp_name: only choose a temporary name that does not exist yet, for
 * writers that create the file themselves with an exclusive create (HDF5's
 * H5F_ACC_EXCL): *out is malloc'd "<target>.tmp.<pid>[.<n>]" (tracked until
 * moe_file_commit_path). A stream target is refused (MOE_ERR_INVALID). */
enum moe_status moe_tmp_name(const char *target, char **out);

/* moe_tmp_stream: the temporary file as a stdio stream ("wb"), owned by t
 * (closed by commit / discard); NULL (logged) when out of memory. */
FILE *moe_tmp_stream(struct moe_tmp_file *t);

/* moe_tmp_commit: flush (the stream, if any), fsync, close, rename over the
 * target and fsync the directory (a stream target: flush and close only). On any failure (a full disk shows here) the
 * temporary file is removed, the target is left as it was, and MOE_ERR_IO is
 * returned with a message. *t is cleared in every case. */
enum moe_status moe_tmp_commit(struct moe_tmp_file *t);

/* moe_tmp_discard: close and remove the temporary file; the target is
 * untouched (what was streamed stays written). Safe on a cleared or zeroed
 * struct. */
void moe_tmp_discard(struct moe_tmp_file *t);

/* moe_file_commit_path: for a temporary file written and closed by another
 * library (HDF5): fsync it, rename it over target and fsync the directory;
 * on failure remove it. MOE_ERR_IO (logged) on failure. */
enum moe_status moe_file_commit_path(const char *tmp_path, const char *target);

/* moe_fsync_parent: fsync the directory holding `path` (after a rename);
 * 0 or an errno value. File systems that cannot sync directories count as
 * success. */
int moe_fsync_parent(const char *path);

#ifdef __cplusplus
}
#endif
#endif
