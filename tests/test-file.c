/*
 * test-file.c - formats/file.c, the file-safety rules every tool shares:
 *   - a FIFO, directory or device is refused at once (an alarm turns a hang
 *     into a failure), a regular file is read, a missing one is NOT_FOUND;
 *     moe_read_file and moe_mmap_open refuse the same way;
 *   - "same file" means device and inode: a hard link, another spelling and a
 *     symlink match, a copy does not;
 *   - temporary outputs never follow a symlink planted at their name, commit
 *     renames atomically, discard leaves the target untouched, and a failed
 *     commit removes the temporary file and keeps the old target.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-file.h"
#include "moe-mmap.h"
#include "moe-test.h"
#include "moe-test-log.h"

static char g_dir[256];

/* path_in: g_dir/name in a static rotating buffer (32 live at a time). */
static const char *path_in(const char *name) {
    static char buf[32][512];
    static int k;
    char *p = buf[k++ & 31];
    snprintf(p, sizeof buf[0], "%s/%s", g_dir, name);
    return p;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* has: 1 if path holds exactly text. */
static int has(const char *path, const char *text) {
    char *got = NULL;
    size_t n = 0;
    int ok = moe_read_file(path, 1 << 20, &got, &n) == MOE_OK && n == strlen(text) && !memcmp(got, text, n);
    free(got);
    return ok;
}

/* count_tmp: directory entries whose name contains ".tmp.". */
static int count_tmp(void) {
    char cmd[600], out[64] = "";
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '\\.tmp\\.'", g_dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    if (!fgets(out, sizeof out, p)) out[0] = 0;
    pclose(p);
    return atoi(out);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test-file: an open blocked (FIFO waited on): FAIL\n";
    if (write(2, msg, sizeof msg - 1)) {
    }
    _exit(1);
}

static void test_inputs(void) {
    const char *fifo = path_in("fifo"), *reg = path_in("reg.txt");
    put(reg, "hello");
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo");
    int fd = -1;
    alarm(20); /* an open that waits for a writer ends the test */
    log_reset();
    CHECK(moe_file_open_read(fifo, &fd) == MOE_ERR_IO && fd == -1, "a FIFO is refused");
    CHECK(strstr(g_err, "fifo: is a FIFO, not a regular file"), "the message names the path and the kind: %s", g_err);
    char *text = NULL;
    size_t n;
    CHECK(moe_read_file(fifo, 1 << 20, &text, &n) != MOE_OK && !text, "moe_read_file refuses a FIFO");
    struct moe_mmap m;
    CHECK(moe_mmap_open(fifo, &m) != MOE_OK && !m.data, "moe_mmap_open refuses a FIFO");
    FILE *f = NULL;
    CHECK(moe_file_fopen_read(fifo, &f) == MOE_ERR_IO && !f, "fopen_read refuses a FIFO");
    alarm(0);
    log_reset();
    CHECK(moe_file_open_read(g_dir, &fd) == MOE_ERR_IO && strstr(g_err, "is a directory"), "a directory: %s", g_err);
    log_reset();
    CHECK(moe_file_open_read("/dev/null", &fd) == MOE_ERR_IO && strstr(g_err, "is a character device"),
          "a device: %s", g_err);
    CHECK(moe_file_open_read(path_in("missing"), &fd) == MOE_ERR_NOT_FOUND, "missing file");
    char why[160];
    CHECK(moe_file_open_regular(fifo, &fd, why, sizeof why) == MOE_ERR_IO && strstr(why, "is a FIFO"),
          "the quiet variant says why: %s", why);
    CHECK(moe_file_open_read(reg, &fd) == MOE_OK && fd >= 0, "a regular file opens");
    if (fd >= 0) {
        char b[8] = "";
        CHECK(read(fd, b, sizeof b) == 5 && !memcmp(b, "hello", 5), "and reads (blocking mode restored)");
        CHECK(!(fcntl(fd, F_GETFL) & O_NONBLOCK), "O_NONBLOCK cleared");
        close(fd);
    }
}

static void test_same(void) {
    const char *a = path_in("a.bin"), *copy = path_in("copy.bin"), *hard = path_in("hard.bin"),
               *sym = path_in("sym.bin");
    put(a, "data");
    put(copy, "data");
    CHECK(link(a, hard) == 0 && symlink(a, sym) == 0, "links");
    char other[600];
    snprintf(other, sizeof other, "%s/./../%s/a.bin", g_dir, strrchr(g_dir, '/') + 1);
    CHECK(moe_file_same(a, a) && moe_file_same(a, hard) && moe_file_same(a, sym) && moe_file_same(a, other),
          "hard link, symlink and another spelling are the same file");
    CHECK(!moe_file_same(a, copy), "a copy is another file");
    CHECK(!moe_file_same(a, path_in("missing")), "a missing file is no match");
    const char *ins[3] = {copy, NULL, a};
    log_reset();
    CHECK(moe_file_check_output(hard, ins, 3) == MOE_ERR_INVALID && strstr(g_err, "same file as the input"),
          "an output equal to an input is refused: %s", g_err);
    CHECK(moe_file_check_output(path_in("new.bin"), ins, 3) == MOE_OK, "a new output is fine");
    CHECK(moe_file_check_output(copy, ins + 1, 2) == MOE_OK, "an unrelated existing file is fine");
    /* two outputs of one command: the same name in the same directory, existing or not */
    char new_other[600];
    snprintf(new_other, sizeof new_other, "%s/./../%s/new.bin", g_dir, strrchr(g_dir, '/') + 1);
    CHECK(moe_file_same_target(path_in("new.bin"), new_other), "a file not written yet, spelled two ways");
    CHECK(moe_file_same_target(a, hard) && moe_file_same_target(a, other), "an existing file, spelled two ways");
    CHECK(!moe_file_same_target(path_in("new.bin"), path_in("new2.bin")) && !moe_file_same_target(a, copy),
          "different names are different outputs");
    char elsewhere[600];
    snprintf(elsewhere, sizeof elsewhere, "%s/new.bin", g_dir);
    *strrchr(elsewhere, '/') = 0;
    *strrchr(elsewhere, '/') = 0; /* g_dir's parent */
    strcat(elsewhere, "/new.bin");
    CHECK(!moe_file_same_target(path_in("new.bin"), elsewhere), "the same name in another directory is another output");
}

static void test_tmp(void) {
    const char *target = path_in("out.bin"), *victim = path_in("victim.txt");
    put(victim, "precious");
    put(target, "old");
    /* a symlink planted at the first temporary name must not be followed */
    char planted[600];
    snprintf(planted, sizeof planted, "%s.tmp.%ld", target, (long)getpid());
    CHECK(symlink(victim, planted) == 0, "plant a symlink");
    struct moe_tmp_file t;
    CHECK(moe_tmp_create(target, &t) == MOE_OK && t.fd >= 0, "create beside a planted link");
    CHECK(t.path && strcmp(t.path, planted) != 0, "another name was chosen: %s", t.path ? t.path : "(null)");
    FILE *f = moe_tmp_stream(&t);
    CHECK(f != NULL, "stream");
    if (f) fputs("new", f);
    CHECK(has(target, "old"), "the target is unchanged before commit");
    CHECK(moe_tmp_commit(&t) == MOE_OK && !t.path && t.fd == -1, "commit");
    CHECK(has(target, "new") && has(victim, "precious"), "the target is replaced, the link's target untouched");
    unlink(planted);

    /* discard: the target stays, nothing is left */
    CHECK(moe_tmp_create(target, &t) == MOE_OK, "create again");
    if (t.fd >= 0 && write(t.fd, "xx", 2) != 2) CHECK(0, "write");
    moe_tmp_discard(&t);
    moe_tmp_discard(&t); /* twice is harmless */
    CHECK(has(target, "new") && count_tmp() == 0, "discard keeps the target and leaves no temporary file");

    /* a failed commit (rename onto a non-empty directory) keeps the old target */
    const char *dir = path_in("sub");
    mkdir(dir, 0755);
    put(path_in("sub/keep"), "k");
    CHECK(moe_tmp_create(dir, &t) == MOE_OK, "create beside a directory");
    log_reset();
    CHECK(moe_tmp_commit(&t) == MOE_ERR_IO && strstr(g_err, "unchanged"), "a failed rename is an error: %s", g_err);
    CHECK(has(path_in("sub/keep"), "k") && count_tmp() == 0, "old target intact, temporary file removed");

    /* moe_tmp_name skips taken names; moe_file_commit_path renames */
    char *name = NULL;
    CHECK(symlink(victim, planted) == 0, "plant again");
    CHECK(moe_tmp_name(target, &name) == MOE_OK && name && strcmp(name, planted) != 0, "tmp_name skips a taken name");
    if (name) {
        put(name, "third");
        CHECK(moe_file_commit_path(name, target) == MOE_OK && has(target, "third"), "commit_path");
        free(name);
    }
    unlink(planted);
    CHECK(moe_file_commit_path(path_in("gone.tmp"), target) == MOE_ERR_IO && has(target, "third"),
          "commit_path of a missing file fails and keeps the target");
    CHECK(has(victim, "precious"), "the victim was never written");
}

int main(void) {
    moe_log_set(capture, NULL);
    signal(SIGALRM, on_alarm);
    snprintf(g_dir, sizeof g_dir, "/tmp/moe-test-file-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_inputs();
    test_same();
    test_tmp();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    printf("test-file: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}
