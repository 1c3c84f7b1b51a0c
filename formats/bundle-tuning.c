/*
 * bundle-tuning.c - crash-safe replacement of a bundle's tuning payload
 * (moe_bundle_replace_tuning). docs/format.md, "Tuning slots", is the
 * specification.
 *
 * Crash safety of moe_bundle_replace_tuning rests on one invariant: bytes that
 * a committed slot ever referenced are never modified or removed. New payloads
 * are only appended, and the only truncation drops bytes past every region a
 * valid slot references (the orphan of a replacement that crashed before its
 * slot write). So a reader that is open, or opening, while a replacement runs
 * always sees a consistent (old or new) payload.
 */
#define _GNU_SOURCE /* flock */
#include "bundle-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------- */
/* crash-safe tuning replacement                                              */

/* Reads and checks one valid slot's payload through fd, as a reader would. */
static bool slot_usable_fd(int fd, const struct slot *s, uint64_t dend, uint64_t size,
                           const char *label, char which) {
    if (bundle_slot_bounds(s, dend, size)) return false;
    if (s->size == 0) return true;
    uint8_t *buf = malloc((size_t)s->size);
    struct moe_bundle_kv *kv = NULL;
    enum moe_status rc;
    bool ok = false;
    if (buf && bundle_pread_all(fd, buf, s->size, s->offset) == 0 &&
        hash(buf, (size_t)s->size) == s->checksum) {
        char what[48];
        snprintf(what, sizeof what, "tuning payload (slot %c)", which);
        rc = bundle_kv_decode(buf, s->size, s->offset, label, what, &kv);
        ok = rc == MOE_OK;
    }
    moe_bundle_kv_free(kv);
    free(buf);
    return ok;
}

/* Decides which slot readers use now, which one to overwrite, the next
 * sequence and the end of everything still referenced. */
static void plan_replace(int fd, const uint8_t *page, const struct hdr *h, uint64_t size,
                         const char *label, int *target, uint64_t *seq, uint64_t *live_end) {
    struct slot s[2];
    bool usable[2];
    uint64_t dend = h->dir_offset + h->dir_size, max_seq = 0;
    *live_end = dend;
    for (int i = 0; i < 2; i++) {
        s[i] = bundle_slot_parse(page + slot_offset[i]);
        usable[i] = s[i].state == SLOT_VALID &&
                    slot_usable_fd(fd, &s[i], dend, size, label, (char)('A' + i));
        if (s[i].state == SLOT_VALID) {
            if (s[i].seq > max_seq) max_seq = s[i].seq;
            if (s[i].size && s[i].offset <= size && s[i].size <= size - s[i].offset &&
                s[i].offset + s[i].size > *live_end)
                *live_end = s[i].offset + s[i].size;
        }
    }
    int active = -1;
    if (usable[0] && usable[1])
        active = s[1].seq > s[0].seq ? 1 : 0;
    else if (usable[0] || usable[1])
        active = usable[0] ? 0 : 1;
    if (active >= 0)
        *target = 1 - active;
    else /* nothing usable: overwrite a slot that is not valid, else the older one */
        *target = s[0].state != SLOT_VALID ? 0 : s[1].state != SLOT_VALID ? 1 : (s[0].seq <= s[1].seq ? 0 : 1);
    *seq = max_seq + 1;
}

/* Replaces the tuning payload of the bundle at path, crash-safely. */
enum moe_status moe_bundle_replace_tuning(const char *path, const struct moe_bundle_kv *tuning) {
    enum moe_status rc = MOE_ERR_IO;
    struct wbuf t = {0};
    uint8_t page[PAGE], slot[SLOT_SIZE];
    struct hdr h;
    struct stat st;
    int err = 0;
    if (!path) return MOE_ERR_INVALID;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        MOE_LOGE("%s: cannot open for update: %s", path, strerror(err));
        return err == ENOENT ? MOE_ERR_NOT_FOUND : MOE_ERR_IO;
    }
    if (flock(fd, LOCK_EX) != 0)
        MOE_LOGW("%s: cannot lock (%s); make sure no other replacement runs", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        MOE_LOGE("%s: not a regular file", path);
        goto done;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < PAGE) {
        MOE_LOGE("%s: file is %llu bytes, shorter than the 4096-byte header page", path,
                 (unsigned long long)size);
        rc = MOE_ERR_FORMAT;
        goto done;
    }
    if ((err = bundle_pread_all(fd, page, PAGE, 0)) != 0) {
        MOE_LOGE("%s: reading the header page: %s", path, strerror(err));
        goto done;
    }
    if ((rc = bundle_header_parse(page, size, path, &h)) != MOE_OK) goto done;
    rc = MOE_ERR_IO;
    int target;
    uint64_t seq, live_end;
    plan_replace(fd, page, &h, size, path, &target, &seq, &live_end);
    if (moe_bundle_kv_count(tuning)) bundle_kv_encode(tuning, &t);
    if (t.oom) {
        MOE_LOGE("%s: out of memory", path);
        rc = MOE_ERR_NOMEM;
        goto done;
    }
    if (t.n > MOE_BUNDLE_MAX_TUNING || seq == 0) {
        MOE_LOGE("%s: tuning payload of %zu bytes exceeds %llu, or the sequence is exhausted", path,
                 t.n, MOE_BUNDLE_MAX_TUNING);
        rc = MOE_ERR_RANGE;
        goto done;
    }
    if (size > live_end) { /* the orphan of a replacement that crashed before its slot write */
        if (ftruncate(fd, (off_t)live_end) != 0) {
            MOE_LOGE("%s: dropping %llu orphaned tail bytes: %s", path,
                     (unsigned long long)(size - live_end), strerror(errno));
            goto done;
        }
        MOE_LOGI("%s: dropped %llu orphaned bytes at the end of the file", path,
                 (unsigned long long)(size - live_end));
    }
    uint64_t off = t.n ? align_up(live_end, PAGE) : 0;
    if (t.n && (err = bundle_pwrite_all(fd, t.p, t.n, off)) != 0) {
        MOE_LOGE("%s: appending the tuning payload at offset %llu: %s", path,
                 (unsigned long long)off, strerror(err));
        goto done;
    }
    if (fsync(fd) != 0) {
        MOE_LOGE("%s: fsync after appending the tuning payload: %s", path, strerror(errno));
        goto done;
    }
    bundle_slot_build(slot, seq, off, t.n, hash(t.p, t.n));
    if ((err = bundle_pwrite_all(fd, slot, SLOT_SIZE, slot_offset[target])) != 0 || fsync(fd) != 0) {
        MOE_LOGE("%s: writing tuning slot %c: %s", path, 'A' + target,
                 strerror(err ? err : errno));
        goto done;
    }
    rc = MOE_OK;
done:
    free(t.p);
    close(fd); /* releases the lock */
    return rc;
}
