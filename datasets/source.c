/*
 * source.c - the dataset reader's byte source: a file descriptor or a memory
 * buffer, inflated on the fly when it starts with the gzip magic 1f 8b (the
 * name does not matter). Uses zlib's inflate directly rather than gzread so
 * files and memory buffers share one path, buffer sizes are ours (tests shrink
 * them to a byte), and a truncated stream is told apart from a corrupt one.
 *
 * gzip rules: several members in a row are one stream (as gzip -d does);
 * trailing zero bytes after the last member are ignored; anything else after it
 * is an error; a stream that ends inside a member is "truncated".
 */
#include "dataset-impl.h"
#include "moe-file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Record what went wrong; the dataset logs it with the line it had reached. */
static void set_error(struct ds_src *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(struct ds_src *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->error, sizeof s->error, fmt, ap);
    va_end(ap);
}

/* Prepare a source over a file; MOE_ERR_NOT_FOUND / MOE_ERR_IO (s->error says why). */
enum moe_status ds_src_open_file(struct ds_src *s, const char *path, size_t bufsz) {
    memset(s, 0, sizeof *s);
    s->label = path;
    s->bufsz = bufsz;
    /* a FIFO, device or directory is refused without blocking */
    return moe_file_open_regular(path, &s->fd, s->error, sizeof s->error);
}

/* Prepare a source over caller-owned memory. */
void ds_src_open_memory(struct ds_src *s, const void *data, size_t len, const char *label,
                        size_t bufsz) {
    memset(s, 0, sizeof *s);
    s->label = label;
    s->bufsz = bufsz;
    s->fd = -1;
    s->mem = data;
    s->mem_len = data ? len : 0;
}

/* Read up to cap raw (still compressed) bytes: first any peeked magic bytes,
 * then the file or memory. *n = 0 at the end. */
static enum moe_status raw_read(struct ds_src *s, unsigned char *buf, size_t cap, size_t *n) {
    *n = 0;
    if (s->peek_pos < s->peek_len) {
        size_t k = s->peek_len - s->peek_pos < cap ? s->peek_len - s->peek_pos : cap;
        memcpy(buf, s->peek + s->peek_pos, k);
        s->peek_pos += k;
        *n = k;
        return MOE_OK;
    }
    if (s->raw_eof) return MOE_OK;
    if (s->fd < 0) {
        size_t k = s->mem_len - s->mem_pos < cap ? s->mem_len - s->mem_pos : cap;
        if (k) memcpy(buf, s->mem + s->mem_pos, k);
        s->mem_pos += k;
        *n = k;
    } else {
        ssize_t r;
        do r = read(s->fd, buf, cap);
        while (r < 0 && errno == EINTR);
        if (r < 0) {
            set_error(s, "read error: %s", strerror(errno));
            return MOE_ERR_IO;
        }
        *n = (size_t)r;
    }
    if (*n == 0) s->raw_eof = 1;
    s->raw_bytes += *n;
    return MOE_OK;
}

/* Read the first two bytes (looping over short reads) and decide gzip or not. */
static enum moe_status detect(struct ds_src *s) {
    s->started = 1;
    while (s->peek_len < 2 && !s->raw_eof) {
        size_t n;
        enum moe_status st = raw_read(s, s->peek + s->peek_len, 2 - s->peek_len, &n);
        if (st) return st;
        s->peek_len += n;
    }
    if (s->peek_len == 2 && s->peek[0] == 0x1f && s->peek[1] == 0x8b) {
        s->gz = 1;
        s->zin_cap = s->bufsz;
        s->zin = malloc(s->zin_cap);
        if (!s->zin) {
            set_error(s, "out of memory");
            return MOE_ERR_NOMEM;
        }
        if (inflateInit2(&s->zs, 16 + MAX_WBITS) != Z_OK) {
            set_error(s, "cannot start zlib inflate");
            return MOE_ERR_NOMEM;
        }
        s->zs_live = 1;
    }
    return MOE_OK;
}

/* After a gzip member ended: another member follows (1f 8b), or only zero
 * padding, or garbage. Returns 1 = next member ready, 0 = clean end. */
static int next_member(struct ds_src *s, enum moe_status *st) {
    for (;;) {
        if (s->zs.avail_in == 0) {
            size_t n;
            if ((*st = raw_read(s, s->zin, s->zin_cap, &n))) return -1;
            if (n == 0) return 0;
            s->zs.next_in = s->zin;
            s->zs.avail_in = (uInt)n;
        }
        /* skip zero padding */
        while (s->zs.avail_in && *s->zs.next_in == 0) s->zs.next_in++, s->zs.avail_in--;
        if (s->zs.avail_in == 0) continue;
        if (*s->zs.next_in != 0x1f) goto garbage;
        if (s->zs.avail_in < 2) { /* the second magic byte is in the next read */
            unsigned char b;
            size_t n;
            if ((*st = raw_read(s, &b, 1, &n))) return -1;
            if (n == 0 || b != 0x8b) goto garbage;
            /* put 1f 8b back in front of the inflate input */
            s->zin[0] = 0x1f;
            s->zin[1] = 0x8b; /* zin_cap >= 2, see ds_src_read */
            s->zs.next_in = s->zin;
            s->zs.avail_in = 2;
        } else if (s->zs.next_in[1] != 0x8b) {
            goto garbage;
        }
        if (inflateReset(&s->zs) != Z_OK) goto garbage;
        return 1;
    }
garbage:
    set_error(s, "unexpected data after the end of the gzip stream (compressed byte %llu)",
              (unsigned long long)(s->raw_bytes - s->zs.avail_in));
    *st = MOE_ERR_FORMAT;
    return -1;
}

/* Inflate up to cap bytes; the gzip half of ds_src_read. Loops until at least
 * one byte comes out or the stream ends. */
static enum moe_status gz_read(struct ds_src *s, unsigned char *buf, size_t cap, size_t *n) {
    uInt want = cap > (1u << 30) ? (1u << 30) : (uInt)cap;
    s->zs.next_out = buf;
    s->zs.avail_out = want;
    while (s->zs.avail_out == want) {
        if (s->member_end) {
            enum moe_status st = MOE_OK;
            int r = next_member(s, &st);
            if (r < 0) return st;
            if (r == 0) break; /* clean end of the last member */
            s->member_end = 0;
        }
        if (s->zs.avail_in == 0) {
            size_t got;
            enum moe_status st = raw_read(s, s->zin, s->zin_cap, &got);
            if (st) return st;
            if (got == 0) { /* end of input inside a member */
                s->truncated = 1;
                set_error(s, "the gzip stream is truncated (ends after %llu uncompressed bytes)",
                          (unsigned long long)(s->out_bytes + (want - s->zs.avail_out)));
                return MOE_ERR_FORMAT;
            }
            s->zs.next_in = s->zin;
            s->zs.avail_in = (uInt)got;
        }
        int zr = inflate(&s->zs, Z_NO_FLUSH);
        if (zr == Z_STREAM_END) {
            s->member_end = 1;
        } else if (zr == Z_MEM_ERROR) {
            set_error(s, "out of memory (inflate)");
            return MOE_ERR_NOMEM;
        } else if (zr != Z_OK && !(zr == Z_BUF_ERROR && s->zs.avail_in == 0)) {
            set_error(s, "corrupt gzip data at compressed byte %llu (after %llu uncompressed bytes): %s",
                     (unsigned long long)(s->raw_bytes - s->zs.avail_in),
                     (unsigned long long)(s->out_bytes + (want - s->zs.avail_out)),
                     s->zs.msg ? s->zs.msg : "inflate failed");
            s->failed = MOE_ERR_FORMAT;
            break; /* hand out what came before the damage; the error comes next call */
        }
    }
    *n = want - s->zs.avail_out;
    return *n ? MOE_OK : s->failed;
}

/* Decompressed bytes, whatever the source; see dataset-impl.h. */
enum moe_status ds_src_read(struct ds_src *s, void *buf, size_t cap, size_t *n) {
    *n = 0;
    if (s->failed) return s->failed; /* reported once the bytes before it were read */
    if (cap == 0) return MOE_OK;
    if (!s->started) {
        if (s->bufsz < 2) s->bufsz = 2; /* next_member puts two bytes back */
        enum moe_status st = detect(s);
        if (st) return st;
    }
    enum moe_status st = s->gz ? gz_read(s, buf, cap, n) : raw_read(s, buf, cap, n);
    s->out_bytes += *n;
    return st;
}

/* Close the file and release inflate's state. */
void ds_src_close(struct ds_src *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (s->zs_live) inflateEnd(&s->zs);
    s->zs_live = 0;
    free(s->zin);
    s->zin = NULL;
}
