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
#include <sys/wait.h>
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

    /* a directory is not an output (the output rule, issue 30) */
    const char *dir = path_in("sub");
    mkdir(dir, 0755);
    put(path_in("sub/keep"), "k");
    log_reset();
    CHECK(moe_tmp_create(dir, &t) == MOE_ERR_INVALID && strstr(g_err, "is a directory") && count_tmp() == 0,
          "a directory target is refused before anything is created: %s", g_err);
    /* a failed commit (the target became a non-empty directory meanwhile) keeps the old target */
    char *later = strdup(path_in("later"));
    CHECK(later && moe_tmp_create(later, &t) == MOE_OK, "create beside a future directory");
    mkdir(later, 0755);
    char *keep = malloc(strlen(later) + 8);
    if (keep) sprintf(keep, "%s/keep", later), put(keep, "k");
    log_reset();
    CHECK(moe_tmp_commit(&t) == MOE_ERR_IO && strstr(g_err, "unchanged"), "a failed rename is an error: %s", g_err);
    CHECK(keep && has(keep, "k") && count_tmp() == 0, "old target intact, temporary file removed");
    free(keep);
    free(later);

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

/* test_output_rule: issue 30's output rule: streams written in place, the
 * output's directory checked first, leftovers of dead writers removed, live
 * temporary files removed on a fatal signal. */
static void test_output_rule(void) {
    const char *fifo = path_in("out.fifo"), *dir = path_in("adir");
    mkfifo(fifo, 0600);
    mkdir(dir, 0755);
    CHECK(moe_output_check("-", 1) == MOE_OK && moe_output_check(fifo, 1) == MOE_OK, "streams accepted when streamable");
    log_reset();
    CHECK(moe_output_check(fifo, 0) == MOE_ERR_INVALID && strstr(g_err, "a FIFO") && strstr(g_err, "regular file"),
          "a FIFO refused by name where a regular file is needed: %s", g_err);
    log_reset();
    CHECK(moe_output_check("-", 0) == MOE_ERR_INVALID && strstr(g_err, "standard output"), "- likewise: %s", g_err);
    log_reset();
    CHECK(moe_output_check(dir, 1) == MOE_ERR_INVALID && strstr(g_err, "is a directory"), "a directory: %s", g_err);
    log_reset();
    CHECK(moe_output_check(path_in("nodir/x"), 1) == MOE_ERR_INVALID && strstr(g_err, "does not exist"),
          "a missing directory: %s", g_err);
    log_reset();
    CHECK(moe_output_check(path_in("reg.txt/x"), 1) == MOE_ERR_INVALID && strstr(g_err, "not a directory"),
          "a file as the directory: %s", g_err);
    CHECK(moe_output_check(path_in("new.bin"), 0) == MOE_OK, "a new file in a writable directory");
    CHECK(moe_output_is_stream("-") && moe_output_is_stream(fifo) && !moe_output_is_stream(path_in("new.bin")),
          "what a stream is");

    /* a FIFO with a reader is written in place: the reader gets the bytes, the FIFO stays */
    pid_t r = fork();
    if (r == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "cat '%s' > '%s'", fifo, path_in("got.txt"));
        _exit(system(cmd) == 0 ? 0 : 1);
    }
    struct moe_tmp_file t;
    FILE *f = moe_tmp_create(fifo, &t) == MOE_OK ? moe_tmp_stream(&t) : NULL;
    CHECK(f && t.stream, "a FIFO opens as a stream");
    if (f) fputs("through the pipe", f);
    CHECK(moe_tmp_commit(&t) == MOE_OK, "committed");
    int ws = 0;
    waitpid(r, &ws, 0);
    struct stat st;
    CHECK(has(path_in("got.txt"), "through the pipe") && stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode) &&
              count_tmp() == 0,
          "the reader got it, the FIFO is still a FIFO, no temporary file");

    /* leftovers: a dead writer's temporary file is removed, a live one's and other names kept */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char name[600];
    const char *target = path_in("sweep.bin");
    snprintf(name, sizeof name, "%s.tmp.%ld", target, (long)dead);
    put(name, "dead");
    char name2[600], name3[600], name4[600];
    snprintf(name2, sizeof name2, "%s.tmp.%ld.3", target, (long)dead);
    put(name2, "dead too");
    snprintf(name3, sizeof name3, "%s.tmp.%ld", target, (long)getppid()); /* a process that runs */
    put(name3, "live");
    snprintf(name4, sizeof name4, "%s.tmp.%ldx", target, (long)dead); /* not a temporary name */
    put(name4, "other");
    log_reset();
    CHECK(moe_tmp_sweep(target) == 2 && access(name, F_OK) != 0 && access(name2, F_OK) != 0 &&
              has(name3, "live") && has(name4, "other") && strstr(g_warn, "no longer runs"),
          "sweep: the dead writer's two removed, the rest kept (%s)", g_warn);
    unlink(name3);
    unlink(name4);

    /* a fatal signal removes the live temporary files, then kills as before */
    pid_t c = fork();
    if (c == 0) {
        moe_file_cleanup_on_signals();
        struct moe_tmp_file ct;
        if (moe_tmp_create(path_in("sig.bin"), &ct) != MOE_OK) _exit(3);
        char *tmp = NULL;
        if (moe_tmp_name(path_in("sig2.bin"), &tmp) != MOE_OK) _exit(3);
        put(tmp, "h5");
        raise(SIGTERM);
        _exit(4);
    }
    int cs = 0;
    waitpid(c, &cs, 0);
    CHECK(WIFSIGNALED(cs) && WTERMSIG(cs) == SIGTERM && count_tmp() == 0,
          "SIGTERM: died of it, no temporary file left (status %d, %d left)", cs, count_tmp());
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
    test_output_rule();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    printf("test-file: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}
