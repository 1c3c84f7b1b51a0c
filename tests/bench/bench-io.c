/*
 * bench-io - the storage's raw read bandwidth on one file, read the way an
 * expert-offloading runtime reads missed experts: whole blocks at random
 * 4 KiB-aligned offsets, each block once per method (no reuse), so every read
 * goes to the device.
 *
 *   bench-io FILE [--block SIZE[,SIZE...]] [--bytes TOTAL] [--precision NAME] [--rounds R]
 *
 * Methods, each over the same offsets:
 *   direct-tN     O_DIRECT pread, N = 1, 2, 4 threads taking blocks from a shared counter
 *   uring-qdN     io_uring (raw syscalls, no liburing) on an O_DIRECT fd, one thread,
 *                 N = 1, 4, 16 reads in flight
 *   buffered      pread through the page cache after POSIX_FADV_DONTNEED of the file
 *   mmap          memcpy out of a fresh read-only mapping after POSIX_FADV_DONTNEED
 *
 * Default block sizes: one expert blob of the bundle's first precision (FILE a
 * .moeb bundle; --precision picks another) rounded up to 4 KiB, and 1 MiB.
 * --bytes caps the bytes read per method (default 256 MiB, at most the file).
 * --rounds repeats every method and keeps the best round. Prints a table in
 * MB/s (1e6 bytes) and one JSON line. A method the system refuses (O_DIRECT on
 * tmpfs, io_uring disabled) is reported as unavailable, not as a failure.
 * The page cache is dropped for the file only (no root needed); the resident
 * share measured with mincore after the drop is printed, because pages mapped
 * by another process stay cached.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "moe-bundle.h"

#define ALIGN 4096u
#define MAX_BLOCKS 8
#define MAX_METHODS 16

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* parse_size: "123", "64K", "1M", "1.5G", "2MiB" (powers of 1024) -> bytes; 0 on error. */
static uint64_t parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0) return 0;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && (!strcmp(end, "iB") || !strcmp(end, "B"))) end += strlen(end);
    if (*end || v * mul > 1e15) return 0;
    return (uint64_t)(v * mul);
}

/* The work of one method run: which blocks to read, and where to. */
struct job {
    int fd;
    const char *map;        /* mmap method */
    uint64_t block;         /* bytes per read */
    const uint64_t *offs;   /* n offsets */
    size_t n;
    atomic_size_t next;     /* next offset index (threaded pread) */
    atomic_int errors;
    char *bufs[4];          /* per-thread aligned buffers */
};

/* pread_full: read exactly len bytes at off (retrying short reads); 0 on success. */
static int pread_full(int fd, char *buf, uint64_t len, uint64_t off) {
    while (len > 0) {
        ssize_t r = pread(fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        buf += r, off += (uint64_t)r, len -= (uint64_t)r;
    }
    return 0;
}

struct worker {
    struct job *j;
    int tid;
};

/* pread_worker: take blocks from the shared counter until none are left. */
static void *pread_worker(void *arg) {
    struct worker *w = arg;
    struct job *j = w->j;
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        if (pread_full(j->fd, j->bufs[w->tid], j->block, j->offs[i])) atomic_fetch_add(&j->errors, 1);
    }
    return NULL;
}

/* run_pread: n_threads threads of pread over the job; seconds, or -1. */
static double run_pread(struct job *j, int n_threads) {
    pthread_t th[4];
    struct worker w[4];
    atomic_store(&j->next, 0);
    double t0 = now_s();
    int started = 0;
    for (int t = 0; t < n_threads; t++) {
        w[t] = (struct worker){j, t};
        if (pthread_create(&th[t], NULL, pread_worker, &w[t]) != 0) break;
        started++;
    }
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    return started == n_threads ? now_s() - t0 : -1;
}

/* run_mmap: memcpy every block out of the mapping. */
static double run_mmap(struct job *j) {
    double t0 = now_s();
    for (size_t i = 0; i < j->n; i++) memcpy(j->bufs[0], j->map + j->offs[i], j->block);
    double t = now_s() - t0;
    volatile char sink = j->bufs[0][j->block - 1];
    (void)sink;
    return t;
}

/* ---- io_uring by raw system calls --------------------------------------- */

struct ring {
    int fd;
    unsigned entries;
    unsigned *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_len, cq_len, sqe_len;
};

/* ring_free: unmap and close; safe on a partly set-up ring. */
static void ring_free(struct ring *r) {
    if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqe_len);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map) munmap(r->cq_map, r->cq_len);
    if (r->sq_map && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_len);
    if (r->fd >= 0) close(r->fd);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* ring_init: an io_uring of `entries` slots; 0, or -errno (ENOSYS/EPERM when
 * the kernel or a sandbox refuses io_uring). */
static int ring_init(struct ring *r, unsigned entries) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    memset(r, 0, sizeof *r);
    r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0) return -errno;
    r->entries = p.sq_entries;
    r->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) r->sq_len = r->cq_len = r->sq_len > r->cq_len ? r->sq_len : r->cq_len;
    r->sq_map = mmap(NULL, r->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) goto fail;
    r->cq_map = (p.features & IORING_FEAT_SINGLE_MMAP)
                    ? r->sq_map
                    : mmap(NULL, r->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                           IORING_OFF_CQ_RING);
    if (r->cq_map == MAP_FAILED) goto fail;
    r->sqe_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqe_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) goto fail;
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_tail = (unsigned *)(void *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(void *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(void *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(void *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(void *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(void *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(void *)(cq + p.cq_off.cqes);
    return 0;
fail:;
    int e = -errno;
    ring_free(r);
    return e;
}

/* ring_queue_read: put one read into the submission queue (not yet submitted). */
static void ring_queue_read(struct ring *r, int fd, void *buf, uint32_t len, uint64_t off, uint64_t tag) {
    unsigned tail = *r->sq_tail, idx = tail & *r->sq_mask;
    struct io_uring_sqe *e = &r->sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READ;
    e->fd = fd;
    e->addr = (uint64_t)(uintptr_t)buf;
    e->len = len;
    e->off = off;
    e->user_data = tag;
    r->sq_array[idx] = idx;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

/* ring_enter: submit `n` queued entries and wait for `wait` completions. */
static int ring_enter(struct ring *r, unsigned n, unsigned wait) {
    for (;;) {
        long rc = syscall(__NR_io_uring_enter, r->fd, n, wait, wait ? IORING_ENTER_GETEVENTS : 0, NULL, 0);
        if (rc >= 0) return 0;
        if (errno != EINTR) return -errno;
    }
}

/* run_uring: keep qd reads in flight until every block is read. */
static double run_uring(struct job *j, unsigned qd, char **bufs, int *err) {
    struct ring r;
    *err = ring_init(&r, qd);
    if (*err) return -1;
    size_t issued = 0, done = 0;
    unsigned pending = 0;
    double t0 = now_s();
    for (unsigned k = 0; k < qd && issued < j->n; k++, issued++, pending++)
        ring_queue_read(&r, j->fd, bufs[k], (uint32_t)j->block, j->offs[issued], k);
    while (done < j->n) {
        if ((*err = ring_enter(&r, pending, 1))) break;
        pending = 0;
        unsigned head = *r.cq_head, tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++) {
            const struct io_uring_cqe *c = &r.cqes[head & *r.cq_mask];
            uint64_t slot = c->user_data;
            if (c->res != (int32_t)j->block) atomic_fetch_add(&j->errors, 1);
            done++;
            if (issued < j->n) {
                ring_queue_read(&r, j->fd, bufs[slot], (uint32_t)j->block, j->offs[issued++], slot);
                pending++;
            }
        }
        __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
    }
    double t = now_s() - t0;
    ring_free(&r);
    return *err ? -1 : t;
}

/* ---- page cache --------------------------------------------------------- */

/* drop_cache: ask the kernel to drop the file's clean cached pages; returns the
 * resident share afterwards (mincore over a temporary mapping), or -1. */
static double drop_cache(int fd, uint64_t size) {
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return -1;
    long pg = sysconf(_SC_PAGESIZE);
    size_t pages = (size_t)((size + (uint64_t)pg - 1) / (uint64_t)pg), resident = 0;
    unsigned char *vec = malloc(pages);
    if (vec && mincore(m, size, vec) == 0)
        for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
    else
        resident = (size_t)-1;
    free(vec);
    munmap(m, size);
    return resident == (size_t)-1 ? -1 : (double)resident / (double)pages;
}

/* ---- driver ------------------------------------------------------------- */

/* make_offsets: n distinct block-aligned slots of the file in random order
 * (seeded), so no block is read twice by one method. */
static uint64_t *make_offsets(uint64_t file_size, uint64_t block, size_t n) {
    uint64_t stride = (block + ALIGN - 1) / ALIGN * ALIGN, slots = file_size / stride;
    if (slots == 0 || n == 0) return NULL;
    if (n > slots) n = (size_t)slots;
    uint64_t *all = malloc((size_t)slots * sizeof *all);
    if (!all) return NULL;
    for (uint64_t i = 0; i < slots; i++) all[i] = i * stride;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (uint64_t i = slots - 1; i > 0; i--) { /* Fisher-Yates with xorshift64 */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint64_t k = s % (i + 1), t = all[i];
        all[i] = all[k], all[k] = t;
    }
    return all;
}

struct result {
    char name[24];
    double mb_s; /* best over rounds; < 0 = unavailable */
    char why[64];
};

/* expert_blob_bytes: raw size of one expert blob of a bundle's precision
 * (NULL = the first); 0 when the file is not a bundle. */
static uint64_t expert_blob_bytes(const char *path, const char *prec, const char **name) {
    struct moe_bundle *b = NULL;
    uint64_t size = 0;
    moe_log_set_level(MOE_LOG_ERROR + 1); /* a plain file is not an error here */
    if (moe_bundle_open(path, &b) == MOE_OK) {
        uint32_t i = 0;
        if (!prec || moe_bundle_find_precision(b, prec, &i) == MOE_OK) {
            const struct moe_bundle_precision *p = moe_bundle_precision_at(b, i);
            size = p->raw_size;
            static char keep[64];
            snprintf(keep, sizeof keep, "%s", p->name);
            *name = keep;
        }
    }
    moe_bundle_free(b);
    moe_log_set_level(MOE_LOG_INFO);
    return size;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench-io FILE [--block SIZE[,SIZE...]] [--bytes TOTAL] [--precision NAME] [--rounds R]\n"
            "Raw read bandwidth of FILE's storage: O_DIRECT pread (1/2/4 threads), io_uring (QD 1/4/16),\n"
            "buffered pread after POSIX_FADV_DONTNEED, mmap+memcpy; random block-aligned offsets.\n"
            "Default blocks: one expert blob (FILE a bundle) and 1 MiB; --bytes default 256M.\n"
            "example: bench-io /tmp/moe-offload/model.moeb --rounds 3\n");
}

/* bench_block: every method at one block size; fills res, returns the count. */
static int bench_block(const char *path, uint64_t file_size, uint64_t block, uint64_t total, int rounds,
                       struct result *res, size_t *n_reads, double *resident) {
    int nres = 0;
    size_t n = total / block > 0 ? (size_t)(total / block) : 1;
    uint64_t *offs = make_offsets(file_size, block, n);
    uint64_t stride = (block + ALIGN - 1) / ALIGN * ALIGN;
    if (n > file_size / stride) n = (size_t)(file_size / stride);
    *n_reads = n;
    if (!offs || n == 0) {
        free(offs);
        return 0;
    }
    char *bufs[16] = {0};
    for (int k = 0; k < 16; k++)
        if (posix_memalign((void **)&bufs[k], ALIGN, stride)) bufs[k] = NULL;
    static const char *const names[] = {"direct-t1", "direct-t2", "direct-t4", "uring-qd1", "uring-qd4",
                                        "uring-qd16", "buffered", "mmap"};
    *resident = 0;
    for (int m = 0; m < 8; m++) {
        struct result *r = &res[nres++];
        snprintf(r->name, sizeof r->name, "%s", names[m]);
        r->mb_s = -1;
        r->why[0] = 0;
        for (int round = 0; round < rounds; round++) {
            const int direct = m < 6;
            int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
            if (fd < 0) {
                snprintf(r->why, sizeof r->why, "open%s: %s", direct ? " O_DIRECT" : "", strerror(errno));
                break;
            }
            double res_share = drop_cache(fd, file_size);
            if (res_share > *resident) *resident = res_share;
            struct job j = {.fd = fd, .block = block, .offs = offs, .n = n};
            atomic_init(&j.next, 0);
            atomic_init(&j.errors, 0);
            for (int k = 0; k < 4; k++) j.bufs[k] = bufs[k];
            double t = -1;
            int err = 0;
            if (m < 3) {
                t = run_pread(&j, 1 << m);
            } else if (m < 6) {
                static const unsigned qd[] = {1, 4, 16};
                t = run_uring(&j, qd[m - 3], bufs, &err);
                if (err) snprintf(r->why, sizeof r->why, "io_uring: %s", strerror(-err));
            } else if (m == 6) {
                t = run_pread(&j, 1);
            } else {
                void *map = mmap(NULL, file_size, PROT_READ, MAP_SHARED, fd, 0);
                if (map == MAP_FAILED) {
                    snprintf(r->why, sizeof r->why, "mmap: %s", strerror(errno));
                } else {
                    j.map = map;
                    t = run_mmap(&j);
                    munmap(map, file_size);
                }
            }
            close(fd);
            if (atomic_load(&j.errors)) {
                snprintf(r->why, sizeof r->why, "%d reads failed or were short", atomic_load(&j.errors));
                t = -1;
            }
            if (t <= 0) break;
            double mbs = (double)n * (double)block / t / 1e6;
            if (mbs > r->mb_s) r->mb_s = mbs;
        }
        if (r->why[0]) r->mb_s = -1;
    }
    for (int k = 0; k < 16; k++) free(bufs[k]);
    free(offs);
    return nres;
}

int main(int argc, char **argv) {
    const char *path = NULL, *prec = NULL, *blocks_arg = NULL;
    uint64_t total = 256ull << 20;
    int rounds = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--block") && i + 1 < argc) {
            blocks_arg = argv[++i];
        } else if (!strcmp(argv[i], "--bytes") && i + 1 < argc) {
            if (!(total = parse_size(argv[++i]))) {
                fprintf(stderr, "bench-io: bad --bytes '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            prec = argv[++i];
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
            if (rounds < 1 || rounds > 100) {
                fprintf(stderr, "bench-io: --rounds takes 1..100\n");
                return 2;
            }
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "bench-io: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < (off_t)ALIGN) {
        fprintf(stderr, "bench-io: %s: not a readable regular file of at least 4 KiB\n", path);
        return 1;
    }
    const uint64_t file_size = (uint64_t)sb.st_size;
    uint64_t blocks[MAX_BLOCKS];
    int nb = 0;
    const char *blob_prec = NULL;
    if (blocks_arg) {
        char *copy = strdup(blocks_arg), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t && nb < MAX_BLOCKS; t = strtok_r(NULL, ",", &save))
            if (!(blocks[nb++] = parse_size(t))) {
                fprintf(stderr, "bench-io: bad block size '%s'\n", t);
                free(copy);
                return 2;
            }
        free(copy);
    } else {
        uint64_t blob = expert_blob_bytes(path, prec, &blob_prec);
        if (prec && !blob) {
            fprintf(stderr, "bench-io: %s is not a bundle with precision %s\n", path, prec);
            return 1;
        }
        if (blob) blocks[nb++] = (blob + ALIGN - 1) / ALIGN * ALIGN;
        blocks[nb++] = 1u << 20;
    }
    if (total > file_size) total = file_size;

    printf("bench-io: %s, %.1f MB, up to %.1f MB per method, best of %d round%s (indicative: shared machine)\n",
           path, file_size / 1e6, total / 1e6, rounds, rounds > 1 ? "s" : "");
    char json[8192];
    size_t jl = (size_t)snprintf(json, sizeof json, "{\"bench\":\"bench-io\",\"file\":\"%s\",\"file_bytes\":%llu,"
                                 "\"rounds\":%d,\"blocks\":[", path, (unsigned long long)file_size, rounds);
    for (int b = 0; b < nb; b++) {
        struct result res[MAX_METHODS];
        size_t n_reads = 0;
        double resident = 0;
        if (blocks[b] > file_size) {
            fprintf(stderr, "bench-io: block %llu bytes is larger than the file; skipped\n",
                    (unsigned long long)blocks[b]);
            continue;
        }
        int nr = bench_block(path, file_size, blocks[b], total, rounds, res, &n_reads, &resident);
        printf("\nblock %llu bytes (%.2f MiB%s%s), %zu reads; cached after drop: %.1f %%\n",
               (unsigned long long)blocks[b], blocks[b] / 1048576.0, blob_prec && b == 0 ? ", one expert blob at " : "",
               blob_prec && b == 0 ? blob_prec : "", n_reads, resident * 100);
        if (resident > 0.01)
            printf("  warning: %.0f %% of the file stayed in the page cache (mapped elsewhere, or tmpfs); "
                   "buffered and mmap figures are partly cache reads\n", resident * 100);
        printf("  %-12s %10s %12s\n", "method", "MB/s", "ms/read");
        int best = -1;
        jl += (size_t)snprintf(json + jl, sizeof json - jl, "%s{\"block_bytes\":%llu,\"reads\":%zu,\"mb_s\":{",
                               jl && json[jl - 1] == '[' ? "" : ",", (unsigned long long)blocks[b], n_reads);
        for (int i = 0; i < nr; i++) {
            if (res[i].mb_s < 0) {
                printf("  %-12s %10s   (%s)\n", res[i].name, "n/a", res[i].why[0] ? res[i].why : "unavailable");
            } else {
                printf("  %-12s %10.1f %12.3f\n", res[i].name, res[i].mb_s, blocks[b] / res[i].mb_s / 1e3);
                if (best < 0 || res[i].mb_s > res[best].mb_s) best = i;
            }
            if (res[i].mb_s < 0)
                jl += (size_t)snprintf(json + jl, sizeof json - jl, "%s\"%s\":null", i ? "," : "", res[i].name);
            else
                jl += (size_t)snprintf(json + jl, sizeof json - jl, "%s\"%s\":%.1f", i ? "," : "", res[i].name,
                                       res[i].mb_s);
        }
        if (best >= 0) printf("  fastest: %s, %.1f MB/s\n", res[best].name, res[best].mb_s);
        jl += (size_t)snprintf(json + jl, sizeof json - jl, "},\"fastest\":\"%s\"}", best >= 0 ? res[best].name : "");
    }
    snprintf(json + jl, sizeof json - jl, "]}");
    printf("\n%s\n", json);
    return 0;
}
