/*
 * twiddler.c - Twiddler / Fiddler's latency model and CPU-GPU decision
 * (moe-twiddler.h). Plain C: the CUDA backend measures, this decides.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-mmap.h"
#include "moe-twiddler.h"

enum moe_status moe_cpu_experts_parse(const char *s, enum moe_cpu_experts *out) {
    if (!s) return MOE_ERR_INVALID;
    if (!strcmp(s, "auto")) *out = MOE_CPU_EXPERTS_AUTO;
    else if (!strcmp(s, "never")) *out = MOE_CPU_EXPERTS_NEVER;
    else if (!strcmp(s, "always")) *out = MOE_CPU_EXPERTS_ALWAYS;
    else return MOE_ERR_INVALID;
    return MOE_OK;
}

const char *moe_cpu_experts_name(enum moe_cpu_experts m) {
    switch (m) {
    case MOE_CPU_EXPERTS_AUTO: return "auto";
    case MOE_CPU_EXPERTS_NEVER: return "never";
    case MOE_CPU_EXPERTS_ALWAYS: return "always";
    }
    return "?";
}

/* ---- curves ----------------------------------------------------------- */

double moe_lat_curve_eval(const struct moe_lat_curve *c, int s) {
    if (!c || c->n <= 0) return INFINITY;
    if (c->n == 1 || s <= c->s[0]) return c->t[0];
    for (int i = 1; i < c->n; i++) {
        if (s <= c->s[i]) {
            double f = (double)(s - c->s[i - 1]) / (double)(c->s[i] - c->s[i - 1]);
            return c->t[i - 1] + f * (c->t[i] - c->t[i - 1]);
        }
    }
    const int a = c->n - 2, b = c->n - 1;
    double slope = (c->t[b] - c->t[a]) / (double)(c->s[b] - c->s[a]);
    if (slope < 0) slope = 0;
    return c->t[b] + slope * (double)(s - c->s[b]);
}

enum moe_status moe_lat_curve_add(struct moe_lat_curve *c, int s, double t) {
    if (s < 1 || !(t > 0) || !isfinite(t) || (c->n > 0 && s <= c->s[c->n - 1])) return MOE_ERR_INVALID;
    if (c->n >= MOE_LAT_MAX_POINTS) return MOE_ERR_RANGE;
    c->s[c->n] = s;
    c->t[c->n] = t;
    c->n++;
    return MOE_OK;
}

const struct moe_lat_entry *moe_lat_table_find(const struct moe_lat_table *t, int prec) {
    for (int i = 0; t && i < t->n; i++)
        if (t->e[i].prec == prec) return &t->e[i];
    return NULL;
}

/* ---- decisions -------------------------------------------------------- */

int moe_twiddler_rule(const struct moe_lat_entry *lat, int s, int resident, enum moe_cpu_experts mode) {
    if (resident || mode == MOE_CPU_EXPERTS_NEVER) return 0;
    if (mode == MOE_CPU_EXPERTS_ALWAYS) return 1;
    if (!lat || lat->cpu.n == 0) return 0;
    const double cpu = moe_lat_curve_eval(&lat->cpu, s);
    const double gpu = lat->transfer_s + moe_lat_curve_eval(&lat->gpu, s);
    return !(cpu > gpu);
}

/* item_gpu, item_cpu: an item's modelled times (0 when unmeasured: it adds nothing we know of). */
static double item_gpu(const struct moe_twiddler_item *it) {
    return it->lat && it->lat->gpu.n > 0 ? moe_lat_curve_eval(&it->lat->gpu, it->tokens) : 0.0;
}
static double item_cpu(const struct moe_twiddler_item *it) {
    return it->lat && it->lat->cpu.n > 0 ? moe_lat_curve_eval(&it->lat->cpu, it->tokens) : 0.0;
}

void moe_twiddler_layer_time(int n, const struct moe_twiddler_item *items, const uint8_t *host,
                             struct moe_twiddler_time *out) {
    memset(out, 0, sizeof *out);
    double compute = 0, copied = 0;
    for (int i = 0; i < n; i++) { /* resident experts start at once */
        if (host[i]) {
            out->cpu_s += item_cpu(&items[i]);
            out->n_cpu++;
        } else if (items[i].resident) {
            compute += item_gpu(&items[i]);
        }
    }
    for (int i = 0; i < n; i++) { /* copies in order; each computed once its copy is done */
        if (host[i] || items[i].resident) continue;
        copied += items[i].lat ? items[i].lat->transfer_s : 0.0;
        compute = (compute > copied ? compute : copied) + item_gpu(&items[i]);
        out->n_copied++;
    }
    out->gpu_s = compute;
    out->layer_s = out->gpu_s > out->cpu_s ? out->gpu_s : out->cpu_s;
}

void moe_twiddler_plan(enum moe_cpu_experts mode, int n, const struct moe_twiddler_item *items, uint8_t *host,
                       struct moe_twiddler_time *out) {
    for (int i = 0; i < n; i++) host[i] = (uint8_t)moe_twiddler_rule(items[i].lat, items[i].tokens, items[i].resident, mode);
    struct moe_twiddler_time cur;
    moe_twiddler_layer_time(n, items, host, &cur);
    if (mode == MOE_CPU_EXPERTS_AUTO) {
        /* local search: the single move that lowers the layer time most, while one does.
         * Every accepted move strictly lowers it, so this ends; 4n rounds bound it anyway. */
        for (int round = 0; round < 4 * n; round++) {
            int best = -1;
            double best_t = cur.layer_s;
            for (int i = 0; i < n; i++) {
                if (items[i].resident || !items[i].lat || items[i].lat->cpu.n == 0) continue;
                host[i] ^= 1;
                struct moe_twiddler_time t;
                moe_twiddler_layer_time(n, items, host, &t);
                host[i] ^= 1;
                if (t.layer_s < best_t * (1 - 1e-12)) best = i, best_t = t.layer_s;
            }
            if (best < 0) break;
            host[best] ^= 1;
            moe_twiddler_layer_time(n, items, host, &cur);
        }
    }
    if (out) *out = cur;
}

/* ---- the cache file ----------------------------------------------------- */

/* mkdirs: create every missing directory of path's parent. */
static enum moe_status mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof buf) return MOE_ERR_RANGE;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            MOE_LOGE("cannot create %s: %s", buf, strerror(errno));
            return MOE_ERR_IO;
        }
        *p = '/';
    }
    return MOE_OK;
}

static void write_curve(FILE *f, const char *name, const struct moe_lat_curve *c) {
    fprintf(f, "%s %d", name, c->n);
    for (int i = 0; i < c->n; i++) fprintf(f, " %d %.9g", (int)c->s[i], c->t[i]);
    fputc('\n', f);
}

enum moe_status moe_lat_table_write(const struct moe_lat_table *t, const char *path) {
    enum moe_status rc = mkdirs(path);
    if (rc) return rc;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        MOE_LOGE("cannot write %s: %s", tmp, strerror(errno));
        return MOE_ERR_IO;
    }
    fprintf(f, "moe-latency 1\nkey ");
    for (const char *k = t->key; *k; k++) fputc(*k == '\n' || *k == '\r' ? ' ' : *k, f);
    fprintf(f, "\nentries %d\n", t->n);
    for (int i = 0; i < t->n; i++) {
        const struct moe_lat_entry *e = &t->e[i];
        fprintf(f, "entry %d %lld %.9g\n", e->prec, (long long)e->bytes, e->transfer_s);
        write_curve(f, "gpu", &e->gpu);
        write_curve(f, "cpu", &e->cpu);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        MOE_LOGE("cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        return MOE_ERR_IO;
    }
    return MOE_OK;
}

/* The parser walks lines; `ln` counts them for messages. */
struct lines {
    const char *p, *end, *label;
    int ln;
    char line[8192];
};

/* next_line: the next line into L->line (without its newline); 0 at the end or for an overlong line. */
static int next_line(struct lines *L) {
    if (L->p >= L->end) return 0;
    const char *e = memchr(L->p, '\n', (size_t)(L->end - L->p));
    size_t n = e ? (size_t)(e - L->p) : (size_t)(L->end - L->p);
    L->ln++;
    if (n >= sizeof L->line || memchr(L->p, 0, n)) return 0;
    memcpy(L->line, L->p, n);
    L->line[n] = 0;
    L->p += n + (e ? 1 : 0);
    return 1;
}

/* read_ll, read_num: an integer in [lo, hi] / a finite number >= lo, followed by a
 * blank or the end of the line; 0 when it is not one. */
static int read_ll(const char **s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(*s, &end, 10);
    if (end == *s || errno || v < lo || v > hi || (*end && *end != ' ')) return 0;
    *out = v;
    *s = end;
    return 1;
}

static int read_num(const char **s, double lo, double *out) {
    char *end;
    errno = 0;
    double v = strtod(*s, &end);
    if (end == *s || errno || !isfinite(v) || v < lo || (*end && *end != ' ')) return 0;
    *out = v;
    *s = end;
    return 1;
}

static int prefix(const char **s, const char *word) {
    size_t n = strlen(word);
    if (strncmp(*s, word, n) != 0 || (*s)[n] != ' ') return 0;
    *s += n + 1;
    return 1;
}

static enum moe_status bad(const struct lines *L, const char *what) {
    MOE_LOGE("%s: line %d: %s", L->label, L->ln, what);
    return MOE_ERR_FORMAT;
}

static enum moe_status parse_curve(struct lines *L, const char *name, struct moe_lat_curve *c) {
    if (!next_line(L)) return bad(L, "missing curve line");
    const char *s = L->line;
    long long n, x;
    if (!prefix(&s, name) || !read_ll(&s, 1, MOE_LAT_MAX_POINTS, &n)) return bad(L, "expected '<curve> N' with 1 <= N <= 16");
    memset(c, 0, sizeof *c);
    for (long long i = 0; i < n; i++) {
        double t;
        if (!read_ll(&s, 1, 1 << 30, &x) || !read_num(&s, 0, &t)) return bad(L, "expected N pairs 'tokens seconds'");
        if (moe_lat_curve_add(c, (int)x, t) != MOE_OK) return bad(L, "token counts must rise and times be > 0");
    }
    if (*s) return bad(L, "trailing text after the curve");
    return MOE_OK;
}

enum moe_status moe_lat_table_parse(const char *text, size_t len, const char *label, struct moe_lat_table *out) {
    struct lines L = {text, text + len, label ? label : "latency table", 0, {0}};
    memset(out, 0, sizeof *out);
    if (!next_line(&L) || strcmp(L.line, "moe-latency 1") != 0) return bad(&L, "not a moe-latency 1 file");
    if (!next_line(&L) || strncmp(L.line, "key ", 4) != 0) return bad(&L, "expected 'key ...'");
    if (strlen(L.line + 4) >= sizeof out->key) return bad(&L, "key too long");
    strcpy(out->key, L.line + 4);
    const char *s;
    long long n, v;
    if (!next_line(&L) || (s = L.line, !prefix(&s, "entries")) || !read_ll(&s, 0, MOE_LAT_MAX_PREC, &n) || *s)
        return bad(&L, "expected 'entries N' with N <= 8");
    for (int i = 0; i < (int)n; i++) {
        struct moe_lat_entry *e = &out->e[i];
        if (!next_line(&L)) return bad(&L, "missing entry");
        s = L.line;
        if (!prefix(&s, "entry") || !read_ll(&s, 0, 1 << 20, &v)) return bad(&L, "expected 'entry PREC BYTES SECONDS'");
        e->prec = (int)v;
        if (moe_lat_table_find(out, e->prec)) return bad(&L, "precision listed twice");
        if (!read_ll(&s, 1, (long long)1 << 46, &v) || !read_num(&s, 0, &e->transfer_s) || *s)
            return bad(&L, "expected 'entry PREC BYTES SECONDS'");
        e->bytes = (int64_t)v;
        enum moe_status rc;
        if ((rc = parse_curve(&L, "gpu", &e->gpu)) || (rc = parse_curve(&L, "cpu", &e->cpu))) return rc;
        out->n = i + 1;
    }
    while (next_line(&L))
        if (L.line[0]) return bad(&L, "trailing text");
    if (L.p < L.end) return bad(&L, "line too long or NUL byte");
    return MOE_OK;
}

enum moe_status moe_lat_table_read(const char *path, struct moe_lat_table *out) {
    if (access(path, F_OK) != 0) return MOE_ERR_NOT_FOUND;
    char *text = NULL;
    size_t len = 0;
    enum moe_status rc = moe_read_file(path, 1 << 20, &text, &len);
    if (rc) return rc;
    rc = moe_lat_table_parse(text, len, path, out);
    free(text);
    return rc;
}

enum moe_status moe_lat_cache_path(const char *key, char *buf, size_t size) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *k = (const unsigned char *)key; *k; k++) h = (h ^ *k) * 1099511628211ull;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/') n = snprintf(buf, size, "%s/moe/latency-%016llx.txt", xdg, (unsigned long long)h);
    else if (home && home[0]) n = snprintf(buf, size, "%s/.cache/moe/latency-%016llx.txt", home, (unsigned long long)h);
    else return MOE_ERR_NOT_FOUND;
    return n < 0 || (size_t)n >= size ? MOE_ERR_RANGE : MOE_OK;
}
