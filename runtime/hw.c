/*
 * hw.c - this machine's numbers for the planner (moe-hw.h): measuring storage
 * reads, memory copies and a model's expert and step times, and the JSON
 * table they are kept in.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moe-bundle.h"
#include "moe-base.h"
#include "moe-hw.h"
#include "moe-mmap.h"
#include "moe-session.h"

#define ALIGN 4096

/* fit_line: least squares s = a + b x over n points (b >= 0 kept; a >= 0). */
static void fit_line(const struct moe_hw_point *p, int n, double *a, double *b) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) sx += p[i].x, sy += p[i].s, sxx += p[i].x * p[i].x, sxy += p[i].x * p[i].s;
    const double d = n * sxx - sx * sx;
    *b = n > 1 && d > 0 ? (n * sxy - sx * sy) / d : (n == 1 && p[0].x > 0 ? p[0].s / p[0].x : 0);
    if (*b < 0) *b = 0;
    *a = n > 0 ? (sy - *b * sx) / n : 0;
    if (*a < 0) { /* through the origin instead */
        *a = 0;
        *b = sxx > 0 ? sxy / sxx : 0;
    }
}

/* ---- the table on disk ----------------------------------------------- */

enum moe_status moe_hw_default_path(char *buf, size_t n) {
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int w;
    if (x && *x) w = snprintf(buf, n, "%s/moe/hw.json", x);
    else if (h && *h) w = snprintf(buf, n, "%s/.cache/moe/hw.json", h);
    else return MOE_ERR_NOT_FOUND;
    return w < 0 || (size_t)w >= n ? MOE_ERR_RANGE : MOE_OK;
}

static void put_points(cJSON *o, const struct moe_hw_point *p, int n) {
    cJSON *a = cJSON_AddArrayToObject(o, "points");
    for (int i = 0; i < n; i++) {
        cJSON *q = cJSON_CreateArray();
        cJSON_AddItemToArray(q, cJSON_CreateNumber(p[i].x));
        cJSON_AddItemToArray(q, cJSON_CreateNumber(p[i].s));
        cJSON_AddItemToArray(a, q);
    }
}

/* mkdirs: the directory part of path, and its parents. */
static int mkdirs(const char *path) {
    char d[1024];
    snprintf(d, sizeof d, "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash) return 0;
    *slash = 0;
    for (char *p = d + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(d, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(d, 0755) && errno != EEXIST ? -1 : 0;
}

enum moe_status moe_hw_save(const char *path, const struct moe_hw *hw) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddNumberToObject(root, "mem_bw", hw->mem_bw);
    cJSON *st = cJSON_AddArrayToObject(root, "storage");
    for (int i = 0; i < hw->n_storage; i++) {
        const struct moe_hw_storage *s = &hw->storage[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "device", s->device);
        cJSON_AddStringToObject(o, "path", s->path);
        cJSON_AddBoolToObject(o, "direct", s->direct);
        cJSON_AddNumberToObject(o, "lat_s", s->lat_s);
        cJSON_AddNumberToObject(o, "bw", s->bw);
        cJSON_AddNumberToObject(o, "n_par", s->n_par);
        cJSON_AddNumberToObject(o, "bw_par", s->bw_par);
        put_points(o, s->points, s->n_points);
        cJSON_AddItemToArray(st, o);
    }
    cJSON *ms = cJSON_AddArrayToObject(root, "models");
    for (int i = 0; i < hw->n_models; i++) {
        const struct moe_hw_model *m = &hw->models[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "key", m->key);
        cJSON_AddNumberToObject(o, "threads", m->threads);
        cJSON_AddNumberToObject(o, "k", m->k);
        cJSON_AddNumberToObject(o, "step_s", m->step_s);
        cJSON_AddNumberToObject(o, "fixed_s", m->fixed_s);
        cJSON_AddNumberToObject(o, "store_step_s", m->store_step_s);
        cJSON *pa = cJSON_AddArrayToObject(o, "experts");
        for (int j = 0; j < m->n_prec; j++) {
            const struct moe_hw_expert *e = &m->prec[j];
            cJSON *q = cJSON_CreateObject();
            cJSON_AddStringToObject(q, "precision", e->precision);
            cJSON_AddNumberToObject(q, "bytes", (double)e->bytes);
            cJSON_AddNumberToObject(q, "a_s", e->a_s);
            cJSON_AddNumberToObject(q, "b_s", e->b_s);
            cJSON_AddNumberToObject(q, "decode_s", e->decode_s);
            put_points(q, e->points, e->n_points);
            cJSON_AddItemToArray(pa, q);
        }
        cJSON_AddItemToArray(ms, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return MOE_ERR_NOMEM;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = NULL;
    if (mkdirs(path) || !(f = fopen(tmp, "w"))) {
        MOE_LOGE("%s: cannot write the hardware table: %s", path, strerror(errno));
        free(text);
        return MOE_ERR_IO;
    }
    int bad = fputs(text, f) < 0 || fputc('\n', f) < 0;
    bad |= fclose(f) != 0;
    free(text);
    if (bad || rename(tmp, path)) {
        MOE_LOGE("%s: cannot write the hardware table", path);
        remove(tmp);
        return MOE_ERR_IO;
    }
    return MOE_OK;
}

/* get_num: a finite number member in [lo, hi]; 0 when absent or bad. */
static int get_num(const cJSON *o, const char *k, double lo, double hi, double *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < lo || x->valuedouble > hi) return 0;
    *out = x->valuedouble;
    return 1;
}

static int get_str(const cJSON *o, const char *k, char *dst, size_t n) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(x) || strlen(x->valuestring) >= n) return 0;
    memcpy(dst, x->valuestring, strlen(x->valuestring) + 1);
    return 1;
}

static int get_points(const cJSON *o, struct moe_hw_point *p, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "points"), *q;
    *n = 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > MOE_HW_MAX_POINTS) return 0;
    cJSON_ArrayForEach(q, a) {
        const cJSON *x = cJSON_GetArrayItem(q, 0), *s = cJSON_GetArrayItem(q, 1);
        if (!cJSON_IsArray(q) || cJSON_GetArraySize(q) != 2 || !cJSON_IsNumber(x) || !cJSON_IsNumber(s) ||
            !(x->valuedouble >= 0) || !(s->valuedouble >= 0) || !isfinite(x->valuedouble) || !isfinite(s->valuedouble))
            return 0;
        p[*n].x = x->valuedouble, p[*n].s = s->valuedouble;
        (*n)++;
    }
    return 1;
}

/* parse: the table from its JSON; 0 on the first bad field (*what names it). */
static int parse(const cJSON *root, struct moe_hw *hw, const char **what) {
    double v;
    memset(hw, 0, sizeof *hw);
    *what = "version";
    if (!cJSON_IsObject(root) || !get_num(root, "version", 1, 1, &v)) return 0;
    *what = "mem_bw";
    if (!get_num(root, "mem_bw", 0, 1e15, &hw->mem_bw)) return 0;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "storage"), *o;
    *what = "storage";
    if (!cJSON_IsArray(st) || cJSON_GetArraySize(st) > MOE_HW_MAX_STORAGE) return 0;
    cJSON_ArrayForEach(o, st) {
        struct moe_hw_storage *s = &hw->storage[hw->n_storage++];
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "direct");
        if (!get_str(o, "device", s->device, sizeof s->device) || !get_str(o, "path", s->path, sizeof s->path) ||
            !cJSON_IsBool(d) || !get_num(o, "lat_s", 0, 100, &s->lat_s) || !get_num(o, "bw", 1, 1e15, &s->bw) ||
            !get_num(o, "n_par", 1, 1024, &v) || !get_num(o, "bw_par", 1, 1e15, &s->bw_par) ||
            !get_points(o, s->points, &s->n_points))
            return 0;
        s->direct = cJSON_IsTrue(d), s->n_par = (int)v;
    }
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "models");
    *what = "models";
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) > MOE_HW_MAX_MODELS) return 0;
    cJSON_ArrayForEach(o, ms) {
        struct moe_hw_model *m = &hw->models[hw->n_models++];
        double t, k;
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(o, "experts"), *q;
        if (!get_str(o, "key", m->key, sizeof m->key) || !get_num(o, "threads", 1, 4096, &t) ||
            !get_num(o, "k", 1, 64, &k) || !get_num(o, "step_s", 0, 1e4, &m->step_s) ||
            !get_num(o, "fixed_s", 0, 1e4, &m->fixed_s) || !get_num(o, "store_step_s", 0, 1e4, &m->store_step_s) ||
            !cJSON_IsArray(pa) || cJSON_GetArraySize(pa) > MOE_HW_MAX_PREC)
            return 0;
        m->threads = (int)t, m->k = (int)k;
        cJSON_ArrayForEach(q, pa) {
            struct moe_hw_expert *e = &m->prec[m->n_prec++];
            if (!get_str(q, "precision", e->precision, sizeof e->precision) || !get_num(q, "bytes", 1, 1e15, &v) ||
                !get_num(q, "a_s", 0, 1e4, &e->a_s) || !get_num(q, "b_s", 0, 1e4, &e->b_s) ||
                !get_num(q, "decode_s", 0, 1e4, &e->decode_s) ||
                !get_points(q, e->points, &e->n_points))
                return 0;
            e->bytes = (int64_t)v;
        }
    }
    return 1;
}

enum moe_status moe_hw_load(const char *path, struct moe_hw *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return MOE_ERR_NOT_FOUND;
    char *text = NULL;
    size_t len = 0;
    enum moe_status st = moe_read_file(path, 1 << 22, &text, &len);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const char *what = "JSON";
    int ok = root && parse(root, out, &what);
    cJSON_Delete(root);
    if (!ok) {
        MOE_LOGE("%s: not a hardware table of this version (bad or missing %s); measure again (moe-prep hw)", path,
                 what);
        memset(out, 0, sizeof *out);
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

enum moe_status moe_hw_storage_key(const char *path, char *key, size_t n) {
    struct stat sb;
    if (stat(path, &sb)) {
        MOE_LOGE("%s: %s", path, strerror(errno));
        return MOE_ERR_IO;
    }
    snprintf(key, n, "%u:%u", major(sb.st_dev), minor(sb.st_dev));
    return MOE_OK;
}

enum moe_status moe_hw_model_key(const char *path, char *key, size_t n) {
    struct moe_bundle *b = NULL;
    enum moe_status st = moe_bundle_open(path, &b);
    if (st) return st;
    struct moe_bundle_info info;
    moe_bundle_get_info(b, &info);
    moe_bundle_free(b);
    const char *base = strrchr(path, '/');
    snprintf(key, n, "%s:%llu", base ? base + 1 : path, (unsigned long long)info.data_bytes);
    return MOE_OK;
}

const struct moe_hw_storage *moe_hw_find_storage(const struct moe_hw *hw, const char *device) {
    for (int i = 0; i < hw->n_storage; i++)
        if (!strcmp(hw->storage[i].device, device)) return &hw->storage[i];
    return NULL;
}

const struct moe_hw_model *moe_hw_find_model(const struct moe_hw *hw, const char *key, int threads) {
    for (int i = 0; i < hw->n_models; i++)
        if (!strcmp(hw->models[i].key, key) && hw->models[i].threads == threads) return &hw->models[i];
    return NULL;
}

const struct moe_hw_expert *moe_hw_find_expert(const struct moe_hw_model *m, const char *precision) {
    for (int i = 0; i < m->n_prec; i++)
        if (!strcmp(m->prec[i].precision, precision)) return &m->prec[i];
    return NULL;
}

void moe_hw_put_storage(struct moe_hw *hw, const struct moe_hw_storage *s) {
    int i = 0;
    while (i < hw->n_storage && strcmp(hw->storage[i].device, s->device)) i++;
    if (i == MOE_HW_MAX_STORAGE) { /* full: drop the oldest */
        memmove(hw->storage, hw->storage + 1, sizeof *s * (MOE_HW_MAX_STORAGE - 1));
        i = MOE_HW_MAX_STORAGE - 1;
    } else if (i == hw->n_storage) {
        hw->n_storage++;
    }
    hw->storage[i] = *s;
}

void moe_hw_put_model(struct moe_hw *hw, const struct moe_hw_model *m) {
    int i = 0;
    while (i < hw->n_models && (strcmp(hw->models[i].key, m->key) || hw->models[i].threads != m->threads)) i++;
    if (i == MOE_HW_MAX_MODELS) {
        memmove(hw->models, hw->models + 1, sizeof *m * (MOE_HW_MAX_MODELS - 1));
        i = MOE_HW_MAX_MODELS - 1;
    } else if (i == hw->n_models) {
        hw->n_models++;
    }
    hw->models[i] = *m;
}

double moe_hw_read_s(const struct moe_hw_storage *s, double bytes) { return s->lat_s + bytes / s->bw; }

double moe_hw_expert_s(const struct moe_hw_expert *e, int n) {
    for (int i = 0; i < e->n_points; i++)
        if (e->points[i].x == (double)n) return e->points[i].s;
    return e->a_s + e->b_s * n;
}

/* ---- storage -------------------------------------------------------- */

struct reader {
    int fd;
    char *buf;
    int64_t block;
    const int64_t *offs;
    int n, stride, first;
    int errors;
};

static void *read_blocks(void *arg) {
    struct reader *r = arg;
    for (int i = r->first; i < r->n; i += r->stride) {
        int64_t got = 0;
        while (got < r->block) {
            ssize_t k = pread(r->fd, r->buf + got, (size_t)(r->block - got), (off_t)(r->offs[i] + got));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                r->errors++;
                break;
            }
            got += k;
        }
    }
    return NULL;
}

/* time_reads: n reads of `block` bytes at offs by n_thr readers: seconds. */
static double time_reads(int fd, int64_t block, const int64_t *offs, int n, int n_thr, char **bufs, int *errors) {
    pthread_t th[16];
    struct reader r[16];
    double t0 = moe_now_s();
    for (int i = 0; i < n_thr; i++) {
        r[i] = (struct reader){fd, bufs[i], block, offs, n, n_thr, i, 0};
        if (n_thr > 1) pthread_create(&th[i], NULL, read_blocks, &r[i]);
    }
    if (n_thr == 1) read_blocks(&r[0]);
    else
        for (int i = 0; i < n_thr; i++) pthread_join(th[i], NULL);
    double t = moe_now_s() - t0;
    for (int i = 0; i < n_thr; i++) *errors += r[i].errors;
    return t;
}

/* offsets: n random 4 KiB-aligned offsets with room for a block, each 4 KiB
 * region at most once where the file allows (a tiny LCG: reproducible). */
static void offsets(int64_t size, int64_t block, int n, int64_t *out, uint64_t seed) {
    const int64_t slots = (size - block) / ALIGN + 1;
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        out[i] = (int64_t)((seed >> 17) % (uint64_t)slots) * ALIGN;
    }
}

enum moe_status moe_hw_measure_storage(const char *path, int64_t block_bytes, int64_t max_bytes, int n_par,
                                       struct moe_hw_storage *out) {
    memset(out, 0, sizeof *out);
    enum moe_status rc = moe_hw_storage_key(path, out->device, sizeof out->device);
    if (rc) return rc;
    snprintf(out->path, sizeof out->path, "%s", path);
    if (block_bytes <= 0) block_bytes = 4 << 20;
    block_bytes = (block_bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (max_bytes <= 0) max_bytes = (int64_t)256 << 20;
    if (n_par < 1) n_par = 1;
    if (n_par > 16) n_par = 16;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    out->direct = fd >= 0;
    if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb)) {
        MOE_LOGE("%s: cannot open for reading: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return MOE_ERR_IO;
    }
    const int64_t size = sb.st_size;
    int64_t want[3] = {64 << 10, 1 << 20, block_bytes}, blocks[3];
    int nb = 0;
    if (want[2] < want[1]) want[2] = want[1], want[1] = block_bytes; /* ascending; the expert copy last of all */
    if (want[1] < want[0]) {
        int64_t x = want[0];
        want[0] = want[1], want[1] = x;
    }
    for (int i = 0; i < 3; i++) {
        int64_t b = want[i] < size ? want[i] : size / ALIGN * ALIGN;
        if (b >= ALIGN && (nb == 0 || b > blocks[nb - 1])) blocks[nb++] = b;
    }
    if (nb == 0) {
        MOE_LOGE("%s: %lld bytes: too small to measure reads", path, (long long)size);
        close(fd);
        return MOE_ERR_INVALID;
    }
    char *bufs[16] = {0};
    int64_t *offs = malloc(sizeof *offs * 4096);
    rc = offs ? MOE_OK : MOE_ERR_NOMEM;
    for (int i = 0; !rc && i < n_par; i++)
        if (posix_memalign((void **)&bufs[i], ALIGN, (size_t)blocks[nb - 1])) rc = MOE_ERR_NOMEM;
    int errors = 0;
    for (int i = 0; !rc && i < nb; i++) {
        int n = (int)(max_bytes / blocks[i]);
        n = n < 8 ? 8 : n > 4096 ? 4096 : n;
        if ((int64_t)n * blocks[i] > 4 * max_bytes) n = (int)(4 * max_bytes / blocks[i]) + 1;
        offsets(size, blocks[i], n, offs, 0x9e3779b97f4a7c15ULL + (uint64_t)i);
        if (!out->direct) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        double t = time_reads(fd, blocks[i], offs, n, 1, bufs, &errors);
        out->points[out->n_points++] = (struct moe_hw_point){(double)blocks[i], t / n};
        if (i == nb - 1) {
            offsets(size, blocks[i], n, offs, 0x51ed270b27a9f1ddULL);
            if (!out->direct) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            double tp = time_reads(fd, blocks[i], offs, n, n_par, bufs, &errors);
            out->n_par = n_par;
            out->bw_par = (double)blocks[i] * n / (tp > 0 ? tp : 1e-9);
        }
    }
    if (!rc && errors) {
        MOE_LOGE("%s: %d reads failed", path, errors);
        rc = MOE_ERR_IO;
    }
    if (!rc) {
        double a, b;
        fit_line(out->points, out->n_points, &a, &b);
        out->lat_s = a;
        out->bw = b > 0 ? 1.0 / b : 1e15;
    }
    for (int i = 0; i < n_par; i++) free(bufs[i]);
    free(offs);
    close(fd);
    return rc;
}

enum moe_status moe_hw_measure_memory(double *bw) {
    const size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    *bw = 0;
    if (!a || !b) {
        free(a);
        free(b);
        return MOE_ERR_NOMEM;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = moe_now_s();
        memcpy(r & 1 ? a : b, r & 1 ? b : a, n);
        double t = moe_now_s() - t0;
        if (t < best) best = t;
    }
    *bw = (double)n / (best > 0 ? best : 1e-9);
    volatile char sink = a[n / 2] + b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return MOE_OK;
}

/* ---- a model --------------------------------------------------------- */

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* time_expert: the fastest of 15 runs of one expert FFN for n rows at
 * precision p, rotating over 16 experts of the model. */
static enum moe_status time_expert(struct moe_session *s, const struct moe_model *m, int prec, int n, const float *x,
                                   float *y, double *out) {
    const struct moe_config *c = &m->cfg;
    enum { REPS = 15 };
    double t[REPS];
    int layers[64], n_moe = 0;
    for (int l = 0; l < c->n_layer && n_moe < 64; l++)
        if (c->layer_moe[l]) layers[n_moe++] = l;
    if (n_moe == 0) return MOE_ERR_INVALID;
    for (int j = 0; j < 16; j++) { /* checked (read) before timing: the check would leave them in the caches */
        struct moe_ffn f;
        enum moe_status st = moe_model_expert(m, layers[j % n_moe], j % c->n_expert, prec, &f);
        if (st) return st;
    }
    for (int r = -2; r < REPS; r++) {
        struct moe_ffn f;
        const int j = (r + 2) % 16, l = layers[j % n_moe], e = j % c->n_expert; /* 16 experts in turn */
        enum moe_status st = moe_model_expert(m, l, e, prec, &f);
        if (st) return st;
        double t0 = moe_now_s();
        if ((st = moe_session_ffn(s, &f, x, y, n))) return st;
        if (r >= 0) t[r] = moe_now_s() - t0;
    }
    double best = t[0]; /* the fastest: the ratios between precisions are what is used, and a busy
                         * machine only adds time */
    for (int r = 1; r < REPS; r++) best = t[r] < best ? t[r] : best;
    *out = best;
    return MOE_OK;
}

/* time_steps: decode steps in turn, so a busy machine slows them alike:
 * session a (every expert resident) with top-K, a with top-1, and session b
 * (every expert in a store; NULL: not timed) with top-K; the median of each
 * into step_k, step_1, step_store, after a prompt and a few warm-up steps. */
static enum moe_status time_steps(const struct moe_model *m, const struct moe_session_params *pa,
                                  const struct moe_session_params *pb, double *step_k, double *step_1,
                                  double *step_store) {
    enum { NP = 8, NPB = 64, WARM = 8, N = 40 };
    const int K = m->cfg.n_expert_used;
    struct moe_session *a = NULL, *b = NULL;
    struct moe_session_params qa = *pa;
    qa.n_ctx = NPB + WARM + 2 * N + 8;
    double *t = malloc(sizeof *t * 3 * N);
    float *lg = malloc(sizeof(float) * (size_t)m->cfg.n_vocab);
    int32_t ids[NPB + WARM + 2 * N];
    for (int i = 0; i < NPB + WARM + 2 * N; i++) ids[i] = (int32_t)((97 * i + 13) % m->cfg.n_vocab);
    enum moe_status st = !t || !lg ? MOE_ERR_NOMEM : moe_session_create(m, &qa, &a);
    if (!st && pb) {
        struct moe_session_params qb = *pb;
        qb.n_ctx = qa.n_ctx;
        st = moe_session_create(m, &qb, &b);
    }
    if (!st) st = moe_session_forward(a, ids, NP, NULL, 0);
    /* b: a long prompt batch loads (and waits for) the experts its steps will use */
    if (!st && b) st = moe_session_forward(b, ids, NPB, NULL, 0);
    int pa_pos = NP, pb_pos = NPB;
    for (int i = 0; !st && i < WARM; i++) {
        st = moe_session_forward(a, ids + pa_pos++, 1, lg, 0);
        if (!st && b) st = moe_session_forward(b, ids + pb_pos++, 1, lg, 0);
    }
    int n_b = 0; /* store steps that were all hits (a miss times the storage, not the store) */
    for (int i = 0; !st && i < N; i++) {
        for (int w = 0; !st && w < 3; w++) {
            if (w == 1 && K < 2) continue;
            if (w == 2 && !b) continue;
            if (w < 2) st = moe_session_set_experts(a, w == 0 ? K : 1);
            if (st) break;
            struct moe_store_stats s0, s1;
            if (w == 2) moe_store_get_stats(moe_session_store(b), &s0);
            double t0 = moe_now_s();
            st = w < 2 ? moe_session_forward(a, ids + pa_pos++, 1, lg, 0) : moe_session_forward(b, ids + pb_pos++, 1, lg, 0);
            const double dt = moe_now_s() - t0;
            if (w < 2) t[w * N + i] = dt;
            if (w == 2) moe_store_get_stats(moe_session_store(b), &s1);
            if (w == 2 && s1.loads == s0.loads) t[2 * N + n_b++] = dt;
        }
    }
    if (!st) {
        *step_k = median(t, N);
        *step_1 = K > 1 ? median(t + N, N) : *step_k;
        *step_store = b && n_b > 0 ? median(t + 2 * N, n_b) : 0;
    }
    moe_session_free(a);
    moe_session_free(b);
    free(t);
    free(lg);
    return st;
}

void moe_hw_device_key(char *key, size_t n, const char *device) {
    const size_t len = strlen(key);
    if (device && *device && strcmp(device, "cpu") != 0 && len < n) snprintf(key + len, n - len, "@%s", device);
}

enum moe_status moe_hw_measure_model(const struct moe_model *m, int threads, int64_t store_limit, const char *device,
                                     const void *device_options, struct moe_hw_model *out) {
    memset(out, 0, sizeof *out);
    const struct moe_config *c = &m->cfg;
    if (!m->bundle) {
        MOE_LOGE("%s: measuring a model needs a bundle (moe-prep quantize)", m->path);
        return MOE_ERR_INVALID;
    }
    enum moe_status st = moe_hw_model_key(moe_bundle_path(m->bundle), out->key, sizeof out->key);
    if (st) return st;
    moe_hw_device_key(out->key, sizeof out->key, device);
    struct moe_session_params sp = moe_session_default_params();
    sp.n_threads = threads;
    sp.device = device;
    sp.device_options = device_options;
    sp.n_ctx = 64;
    sp.n_batch = 32;
    struct moe_session *s = NULL;
    if ((st = moe_session_create(m, &sp, &s))) return st;
    out->threads = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    out->k = c->n_expert_used;
    const size_t H = (size_t)c->n_embd;
    float *x = malloc(sizeof(float) * H * 32), *y = malloc(sizeof(float) * H * 32);
    if (!x || !y) st = MOE_ERR_NOMEM;
    for (size_t i = 0; x && i < H * 32; i++) x[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 1000.0f;
    int first_moe = 0;
    while (first_moe < c->n_layer && !c->layer_moe[first_moe]) first_moe++;
    for (int p = 0; !st && p < m->n_expert_prec && out->n_prec < MOE_HW_MAX_PREC; p++) {
        struct moe_hw_expert *e = &out->prec[out->n_prec++];
        const struct moe_bundle_precision *d = moe_bundle_precision_at(m->bundle, (uint32_t)p);
        snprintf(e->precision, sizeof e->precision, "%s", d->name);
        e->bytes = (int64_t)d->raw_size;
        static const int ns[] = {1, 2, 4, 8, 16, 32};
        for (int i = 0; !st && i < 6; i++) {
            double t = 0;
            st = time_expert(s, m, p, ns[i], x, y, &t);
            e->points[e->n_points++] = (struct moe_hw_point){(double)ns[i], t};
        }
        fit_line(e->points, e->n_points, &e->a_s, &e->b_s);
    }
    moe_session_free(s);
    free(x);
    free(y);
    if (st) return st;
    /* decode steps, every expert resident at the model's bound precision, with
     * top-K and top-1 (the expert time in place and the rest of the step), and
     * with every expert in a store (its own work), taken in turn */
    int n_moe = 0;
    for (int l = 0; l < c->n_layer; l++) n_moe += c->layer_moe[l] != 0;
    if (store_limit <= 0) store_limit = (int64_t)1 << 30;
    int64_t biggest = 0;
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; e < c->n_expert && c->layer_moe[l]; e++) {
            struct moe_bundle_blob b;
            int p = moe_model_get_expert_precision(m, l, e);
            if (!moe_bundle_expert(m->bundle, (uint32_t)l, (uint32_t)e, (uint32_t)(p >= 0 ? p : 0), &b)) {
                int64_t r = (int64_t)(b.raw_size > b.stored_size ? b.raw_size : b.stored_size);
                if (r > biggest) biggest = r;
            }
        }
    const int64_t all = ((biggest + ALIGN - 1) / ALIGN * ALIGN) * n_moe * c->n_expert;
    struct moe_store_params stp = moe_store_default_params();
    stp.expert_mem = all, stp.dynamic = 0, stp.policy = MOE_CACHE_LRU;
    stp.warm = 0; /* no reads left in flight when the timing starts: the prompt loads what is used */
    struct moe_session_params sp2 = sp;
    sp2.store = &stp;
    const int K = c->n_expert_used, with_store = all <= store_limit && n_moe > 0;
    double step_k = 0, step_1 = 0, step_st = 0;
    if ((st = time_steps(m, &sp, with_store ? &sp2 : NULL, &step_k, &step_1, &step_st))) return st;
    out->step_s = step_k;
    double iso = 0; /* the bound precisions' time measured alone at one token, mean over the experts */
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; e < c->n_expert && c->layer_moe[l]; e++) {
            int p = moe_model_get_expert_precision(m, l, e);
            iso += moe_hw_expert_s(p >= 0 && p < out->n_prec ? &out->prec[p] : &out->prec[0], 1);
        }
    iso /= (double)n_moe * c->n_expert;
    const double in_place = K > 1 && step_k > step_1 ? (step_k - step_1) / ((double)n_moe * (K - 1)) : iso;
    out->fixed_s = step_k - (double)n_moe * K * in_place;
    if (out->fixed_s < 0) out->fixed_s = 0;
    for (int p = 0; p < out->n_prec; p++) /* one token in a decode step, scaled from the time alone */
        out->prec[p].decode_s = iso > 0 ? moe_hw_expert_s(&out->prec[p], 1) * in_place / iso : in_place;
    if (with_store && step_st > step_k) out->store_step_s = (step_st - step_k) / n_moe;
    (void)first_moe;
    return MOE_OK;
}

enum moe_status moe_hw_measure_bundle(const char *path, int threads, const char *device, const void *device_options,
                                      struct moe_hw *hw) {
    struct moe_model_params mp = moe_model_default_params();
    mp.lazy_experts = 1;
    struct moe_model *m = NULL;
    enum moe_status st = moe_model_load(path, &mp, &m);
    if (st) return st;
    if (!m->bundle) {
        MOE_LOGE("%s: measuring needs a bundle (moe-prep quantize)", path);
        moe_model_free(m);
        return MOE_ERR_INVALID;
    }
    int64_t block = 0; /* the largest stored expert copy: what a miss reads */
    const struct moe_config *c = &m->cfg;
    for (int p = 0; p < m->n_expert_prec; p++)
        for (int l = 0; l < c->n_layer; l++)
            if (c->layer_moe[l]) {
                struct moe_bundle_blob b;
                if (!moe_bundle_expert(m->bundle, (uint32_t)l, 0, (uint32_t)p, &b) && (int64_t)b.stored_size > block)
                    block = (int64_t)b.stored_size;
                break;
            }
    struct moe_hw_storage s;
    struct moe_hw_model mm;
    if (!(st = moe_hw_measure_memory(&hw->mem_bw)) && !(st = moe_hw_measure_storage(path, block, 0, 2, &s)) &&
        !(st = moe_hw_measure_model(m, threads, 0, device, device_options, &mm))) {
        moe_hw_put_storage(hw, &s);
        moe_hw_put_model(hw, &mm);
    }
    moe_model_free(m);
    return st;
}

void moe_hw_print(const struct moe_hw *hw, const char *model_key, int threads, const char *device, FILE *f) {
    fprintf(f, "host memory copy: %.2f GB/s\n", hw->mem_bw / 1e9);
    for (int i = 0; i < hw->n_storage; i++) {
        const struct moe_hw_storage *s = &hw->storage[i];
        if (device && strcmp(device, s->device)) continue;
        fprintf(f, "storage %s (%s, %s reads): latency %.3f ms, %.1f MB/s one reader, %.1f MB/s %d readers\n",
                s->device, s->path, s->direct ? "direct" : "buffered", 1e3 * s->lat_s, s->bw / 1e6, s->bw_par / 1e6,
                s->n_par);
        for (int j = 0; j < s->n_points; j++)
            fprintf(f, "  %10.0f bytes: %8.3f ms per read (%.1f MB/s)\n", s->points[j].x, 1e3 * s->points[j].s,
                    s->points[j].x / s->points[j].s / 1e6);
    }
    for (int i = 0; i < hw->n_models; i++) {
        const struct moe_hw_model *m = &hw->models[i];
        if ((model_key && strcmp(model_key, m->key)) || (threads > 0 && threads != m->threads)) continue;
        fprintf(f, "model %s, %d threads: decode step %.3f ms (top-%d, all resident), of which %.3f ms outside the "
                   "routed experts; store %.1f us per MoE layer step\n",
                m->key, m->threads, 1e3 * m->step_s, m->k, 1e3 * m->fixed_s, 1e6 * m->store_step_s);
        fprintf(f, "  %-8s %12s %10s %10s %12s   alone: ms at 1 2 4 8 16 32 tokens\n", "expert", "bytes", "a (ms)",
                "b (ms/tok)", "decode (ms)");
        for (int j = 0; j < m->n_prec; j++) {
            const struct moe_hw_expert *e = &m->prec[j];
            fprintf(f, "  %-8s %12lld %10.4f %10.4f %12.4f  ", e->precision, (long long)e->bytes, 1e3 * e->a_s,
                    1e3 * e->b_s, 1e3 * e->decode_s);
            for (int q = 0; q < e->n_points; q++) fprintf(f, " %.3f", 1e3 * e->points[q].s);
            fputc('\n', f);
        }
    }
}

