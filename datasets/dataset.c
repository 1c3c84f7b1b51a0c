/*
 * dataset.c - the dataset handle: open (card verification, byte source), the
 * read buffer and line reader, the text and JSONL readers, turning JSON values
 * into record text, the UTF-8 check, and moe_dataset_read_text. The JSON array
 * splitter lives in json.c, CSV/TSV in csv.c, specs and cards in spec.c.
 */
#include "dataset-impl.h"
#include "moe-base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DEFAULT_CHUNK ((size_t)1 << 20)
#define DEFAULT_BUFFER ((size_t)1 << 16)
#define MAX_WARNINGS 5 /* skipped records reported one by one, then only counted */

/* ------------------------------------------------------------------------- */
/* buffers                                                                   */

/* Grow b so that `extra` more bytes and a NUL fit. */
enum moe_status ds_buf_reserve(struct ds_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->len) return MOE_ERR_NOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return MOE_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return MOE_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return MOE_OK;
}

/* Append n bytes, keeping a NUL after the last byte. */
enum moe_status ds_buf_append(struct ds_buf *b, const void *s, size_t n) {
    enum moe_status st = ds_buf_reserve(b, n);
    if (st) return st;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return MOE_OK;
}

/* Free a buffer's memory and zero it. */
void ds_buf_free(struct ds_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ------------------------------------------------------------------------- */
/* messages                                                                  */

/* Log "moe_dataset: FILE:LINE: record N: msg" at `level`. */
static void say(struct moe_dataset *d, enum moe_log_level level, int64_t line, int with_record,
                const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (with_record)
        moe_log_func(level, "moe_dataset", "%s:%lld: record %lld: %s", d->src.label, (long long)line,
                     (long long)d->n_seen, msg);
    else
        moe_log_func(level, "moe_dataset", "%s:%lld: %s", d->src.label, (long long)line, msg);
}

/* A malformed record: skipped and counted with skip_bad, else the error. */
int ds_bad(struct moe_dataset *d, int64_t line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (d->p.skip_bad) {
        d->n_skipped++;
        if (d->n_warned < MAX_WARNINGS) {
            say(d, MOE_LOG_WARN, line, 1, fmt, ap);
            if (++d->n_warned == MAX_WARNINGS)
                moe_log_func(MOE_LOG_WARN, "moe_dataset", "%s: further malformed records are skipped silently",
                             d->src.label);
        }
        va_end(ap);
        return 0;
    }
    say(d, MOE_LOG_ERROR, line, 1, fmt, ap);
    va_end(ap);
    d->err = MOE_ERR_FORMAT;
    return -1;
}

/* An error that ends the dataset, whatever skip_bad says. */
int ds_fatal(struct moe_dataset *d, enum moe_status st, int64_t line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(d, MOE_LOG_ERROR, line, 0, fmt, ap);
    va_end(ap);
    d->err = st;
    return -1;
}

/* The data stops inside a record: one bad record (counted with skip_bad). */
int ds_cut_off(struct moe_dataset *d, int64_t line, const char *what) {
    return ds_bad(d, line, "cut off: %s", what);
}

/* ------------------------------------------------------------------------- */
/* reading                                                                   */

/* One read from the source into in[off..off+cap). 1 = bytes (maybe 0 at the
 * end), 0 = the gzip stream was truncated and skip_bad is on, -1 = fatal. */
static int src_read(struct moe_dataset *d, size_t off, size_t cap, size_t *n) {
    enum moe_status st = ds_src_read(&d->src, d->in + off, cap, n);
    if (st == MOE_OK) return 1;
    if (!d->src.truncated || !d->p.skip_bad) return ds_fatal(d, st, d->line, "%s", d->src.error);
    moe_log_func(MOE_LOG_WARN, "moe_dataset", "%s:%lld: %s; reading stops here", d->src.label,
                 (long long)d->line, d->src.error);
    d->truncated = 1;
    return 0;
}

/* Refill the read buffer when it is empty; drops a UTF-8 BOM at the very start. */
int ds_fill(struct moe_dataset *d) {
    while (d->in_pos >= d->in_len) {
        if (d->in_eof) return 0;
        size_t n = 0, want = d->p.buffer_bytes < d->in_cap ? d->p.buffer_bytes : d->in_cap;
        int r = src_read(d, 0, want, &n);
        if (r < 0) return -1;
        d->in_pos = 0;
        d->in_len = n;
        if (r == 0 || n == 0) {
            d->in_eof = 1;
            return 0;
        }
        if (!d->bom_done) { /* in_cap >= 4: gather three bytes to look for EF BB BF */
            d->bom_done = 1;
            while (d->in_len < 3) {
                r = src_read(d, d->in_len, 3 - d->in_len, &n);
                if (r < 0) return -1;
                if (r == 0 || n == 0) break;
                d->in_len += n;
            }
            if (d->in_len >= 3 && !memcmp(d->in, "\xef\xbb\xbf", 3)) d->in_pos = 3;
            if (r == 0) d->in_eof = 1;
        }
    }
    return 1;
}

/* The next physical line into d->work (see dataset-impl.h). */
int ds_read_line(struct moe_dataset *d, int64_t *line_no) {
    d->work.len = 0;
    int any = 0, over = 0;
    *line_no = d->line;
    for (;;) {
        int r = ds_fill(d);
        if (r < 0) return -1;
        if (r == 0) {
            if (!any) return 0;
            break;
        }
        any = 1;
        const unsigned char *s = d->in + d->in_pos;
        size_t avail = d->in_len - d->in_pos;
        const unsigned char *nl = memchr(s, '\n', avail);
        size_t take = nl ? (size_t)(nl - s) + 1 : avail;
        if (!over) {
            if (d->work.len + take - (nl ? 1 : 0) > d->p.max_record_bytes) {
                over = 1;
                d->work.len = 0;
            } else if (ds_buf_append(&d->work, s, take)) {
                DS_LOGE("%s: out of memory", d->src.label);
                d->err = MOE_ERR_NOMEM;
                return -1;
            }
        }
        d->in_pos += take;
        if (nl) {
            d->line++;
            break;
        }
    }
    return over ? 2 : 1;
}

/* Length of the line in d->work without its "\n" / "\r\n"; *had_nl = 1 if it had one. */
static size_t line_len(const struct moe_dataset *d, int *had_nl) {
    size_t n = d->work.len;
    *had_nl = n && d->work.p[n - 1] == '\n';
    if (*had_nl) n--;
    if (n && d->work.p[n - 1] == '\r') n--;
    return n;
}

/* 1 if the n bytes at s are only spaces, tabs and CRs. */
static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return 0;
    return 1;
}

/* ------------------------------------------------------------------------- */
/* record text                                                               */

/* Append one piece of a record; see dataset-impl.h. */
int ds_add_piece(struct moe_dataset *d, const char *s, size_t n) {
    if (n == 0) return 0;
    size_t sep = d->rec.len ? 1 : 0;
    if (d->rec.len + sep + n > d->p.max_record_bytes) return -1;
    if ((sep && ds_buf_append(&d->rec, "\n", 1)) || ds_buf_append(&d->rec, s, n)) return -2;
    return 0;
}

/* A JSON number as text: integers exactly, others with the fewest of 15..17
 * significant digits that read back to the same double. */
static void number_text(double v, char *buf, size_t size) {
    if (isfinite(v) && v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.0f", v);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* The text of one conversation turn (an object): its "value", "content" or "text". */
static const cJSON *turn_text(const cJSON *o) {
    static const char *const keys[] = {"value", "content", "text"};
    for (int i = 0; i < 3; i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
        if (cJSON_IsString(t)) return t;
    }
    return NULL;
}

/* Add one field's value: strings as they are, numbers and booleans as text,
 * null as nothing, an array element by element, an object as a turn. */
static int add_value(struct moe_dataset *d, const cJSON *v, const char *field, int in_array, char *why,
                     size_t wl) {
    char num[64];
    int r = 0;
    if (cJSON_IsString(v)) {
        r = ds_add_piece(d, v->valuestring, strlen(v->valuestring));
    } else if (cJSON_IsNumber(v)) {
        number_text(v->valuedouble, num, sizeof num);
        r = ds_add_piece(d, num, strlen(num));
    } else if (cJSON_IsBool(v)) {
        r = cJSON_IsTrue(v) ? ds_add_piece(d, "true", 4) : ds_add_piece(d, "false", 5);
    } else if (cJSON_IsNull(v)) {
        r = 0;
    } else if (cJSON_IsArray(v)) {
        if (in_array) {
            snprintf(why, wl, "field \"%.100s\": arrays inside arrays are not supported", field);
            return -1;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (add_value(d, e, field, 1, why, wl)) return -1;
        }
    } else if (cJSON_IsObject(v)) {
        const cJSON *t = turn_text(v);
        if (!t) {
            snprintf(why, wl, "field \"%.100s\": %s object without a \"value\", \"content\" or \"text\" string",
                     field, in_array ? "an array element is an" : "an");
            return -1;
        }
        r = ds_add_piece(d, t->valuestring, strlen(t->valuestring));
    } else {
        snprintf(why, wl, "field \"%.100s\": unsupported JSON value", field);
        return -1;
    }
    if (r == -1) {
        snprintf(why, wl, "record longer than %zu bytes", d->p.max_record_bytes);
        return -1;
    }
    if (r < 0) {
        snprintf(why, wl, "out of memory");
        return -1;
    }
    return 0;
}

/* The selected fields of a JSON object, joined with "\n", into d->rec. */
int ds_record_from_json(struct moe_dataset *d, const void *item, char *why, size_t wl) {
    const cJSON *obj = item;
    const struct moe_dataset_spec *s = d->spec;
    d->rec.len = 0;
    for (int i = 0; i < s->n_fields; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, s->fields[i]);
        if (!v || cJSON_IsNull(v)) {
            if (s->optional[i]) continue;
            char keys[200] = "";
            size_t k = 0;
            const cJSON *c;
            cJSON_ArrayForEach(c, obj) {
                if (k + 4 >= sizeof keys) break;
                int w = snprintf(keys + k, sizeof keys - k, "%s%s", k ? ", " : "", c->string ? c->string : "");
                if (w < 0) break;
                k = k + (size_t)w < sizeof keys ? k + (size_t)w : sizeof keys - 1;
            }
            snprintf(why, wl, "missing field \"%.100s\"%s (the object has: %s)", s->fields[i],
                     v ? " (null)" : "", k ? keys : "no fields");
            return -1;
        }
        if (add_value(d, v, s->fields[i], 0, why, wl)) return -1;
    }
    return 0;
}

/* Offset of the first byte that breaks UTF-8 (overlongs, surrogates, > U+10FFFF,
 * truncated sequences and NUL all count), or n if the text is valid. */
static size_t utf8_bad(const unsigned char *s, size_t n) {
    size_t bad = moe_utf8_bad_offset(s, n);
    const unsigned char *nul = memchr(s, 0, bad);
    return nul ? (size_t)(nul - s) : bad;
}

/* Rewrite d->rec with U+FFFD for each byte that does not start a valid sequence. */
static int utf8_repair(struct moe_dataset *d, size_t from) {
    d->fix.len = 0;
    const unsigned char *s = (const unsigned char *)d->rec.p;
    size_t n = d->rec.len, i = from;
    if (ds_buf_append(&d->fix, s, from)) return -1;
    while (i < n) {
        size_t ok = utf8_bad(s + i, n - i);
        if (ds_buf_append(&d->fix, s + i, ok)) return -1;
        i += ok;
        if (i < n) {
            if (ds_buf_append(&d->fix, "\xef\xbf\xbd", 3)) return -1;
            i++;
        }
    }
    struct ds_buf t = d->rec;
    d->rec = d->fix;
    d->fix = t;
    return 0;
}

/* Last checks on a candidate: drop empty records, check (or repair) UTF-8 and
 * the size cap, apply max_bytes. 1 = hand it out, 0 = skip it, -1 = error. */
static int finish(struct moe_dataset *d) {
    if (d->rec.len == 0) return 0;
    size_t bad = utf8_bad((const unsigned char *)d->rec.p, d->rec.len);
    if (bad < d->rec.len) {
        if (!d->p.replace_invalid_utf8) {
            unsigned char c = (unsigned char)d->rec.p[bad];
            if (c == 0) return ds_bad(d, d->cand_line, "NUL byte at byte %zu of the record", bad);
            return ds_bad(d, d->cand_line, "invalid UTF-8 at byte %zu of the record (0x%02x)", bad, c);
        }
        if (utf8_repair(d, bad)) {
            DS_LOGE("%s: out of memory", d->src.label);
            d->err = MOE_ERR_NOMEM;
            return -1;
        }
    }
    if (d->rec.len > d->p.max_record_bytes)
        return ds_bad(d, d->cand_line, "record longer than %zu bytes", d->p.max_record_bytes);
    if (d->p.max_bytes > 0) {
        uint64_t left = (uint64_t)d->p.max_bytes - (uint64_t)d->n_bytes;
        if ((uint64_t)d->rec.len >= left) {
            size_t cut = (size_t)left;
            while (cut > 0 && cut < d->rec.len && ((unsigned char)d->rec.p[cut] & 0xc0) == 0x80) cut--;
            d->rec.len = cut;
            d->rec.p[cut] = 0;
            d->done = 1; /* this is the last record */
            if (cut == 0) return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* text and JSONL readers                                                    */

/* MOE_TEXT_CHUNK: the next piece of about text_chunk_bytes, cut after a newline
 * (or, in a line longer than a chunk, between two UTF-8 characters). */
static int chunk_next(struct moe_dataset *d) {
    size_t chunk = d->p.text_chunk_bytes;
    while (d->work.len < chunk) {
        int r = ds_fill(d);
        if (r < 0) return -1;
        if (r == 0) break;
        size_t take = d->in_len - d->in_pos;
        if (take > chunk - d->work.len) take = chunk - d->work.len;
        if (ds_buf_append(&d->work, d->in + d->in_pos, take)) {
            d->err = MOE_ERR_NOMEM;
            return -1;
        }
        d->in_pos += take;
    }
    if (d->work.len == 0) return 0;
    const char *w = d->work.p;
    size_t cut = d->work.len;
    const char *nl = NULL;
    for (size_t i = d->work.len; i > 0; i--)
        if (w[i - 1] == '\n') {
            nl = w + i - 1;
            break;
        }
    int at_end = d->in_eof && d->in_pos >= d->in_len;
    if (at_end && d->truncated) { /* the tail after the last newline was cut off */
        if (!nl) {
            d->n_seen++;
            d->work.len = 0;
            return ds_cut_off(d, d->line, "the gzip stream ends inside this text") < 0 ? -1 : 0;
        }
        cut = (size_t)(nl - w) + 1;
    } else if (!at_end || d->work.len > chunk) {
        if (nl) {
            cut = (size_t)(nl - w) + 1;
        } else { /* a line longer than a chunk: do not split the last character */
            cut = d->work.len < chunk ? d->work.len : chunk;
            size_t lead = cut;
            while (lead > 0 && cut - lead < 4 && ((unsigned char)w[lead - 1] & 0xc0) == 0x80) lead--;
            if (lead > 1) {
                unsigned char c = (unsigned char)w[lead - 1];
                size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
                if (lead - 1 + need > cut) cut = lead - 1; /* the sequence continues past the cut */
            }
        }
    }
    d->rec.len = 0;
    if (ds_buf_append(&d->rec, w, cut)) {
        d->err = MOE_ERR_NOMEM;
        return -1;
    }
    memmove(d->work.p, w + cut, d->work.len - cut);
    d->work.len -= cut;
    d->cand_line = d->line;
    for (size_t i = 0; i < cut; i++) d->line += d->rec.p[i] == '\n';
    d->n_seen++;
    return 1;
}

/* next_nonblank_line: the next non-blank, complete line in d->work (length in
 * *n, line number in *ln), counting it as seen; over-long lines and a line cut
 * off by a truncated gzip stream are malformed records. 1 = a line, 0 = end,
 * -1 = error. */
static int next_nonblank_line(struct moe_dataset *d, int64_t *ln, size_t *n) {
    for (;;) {
        int had_nl, r = ds_read_line(d, ln);
        if (r <= 0) return r;
        if (r == 2) {
            d->n_seen++;
            if (ds_bad(d, *ln, "line longer than %zu bytes", d->p.max_record_bytes) < 0) return -1;
            continue;
        }
        *n = line_len(d, &had_nl);
        if (is_blank(d->work.p, *n)) continue;
        d->n_seen++;
        if (!had_nl && d->truncated) {
            if (ds_cut_off(d, *ln, "the gzip stream ends inside this line") < 0) return -1;
            continue;
        }
        return 1;
    }
}

/* MOE_TEXT_LINE: the next non-blank line, without its line end. */
static int line_next(struct moe_dataset *d) {
    for (;;) {
        int64_t ln;
        size_t n;
        int r = next_nonblank_line(d, &ln, &n);
        if (r <= 0) return r;
        d->rec.len = 0;
        if (ds_buf_append(&d->rec, d->work.p, n)) {
            d->err = MOE_ERR_NOMEM;
            return -1;
        }
        d->cand_line = ln;
        return 1;
    }
}

/* MOE_TEXT_PARA: the next run of non-blank lines, joined with "\n". */
static int para_next(struct moe_dataset *d) {
    for (;;) {
        int have = 0, over = 0, cut = 0, eof = 0;
        int64_t start = 0;
        d->rec.len = 0;
        for (;;) {
            int64_t ln;
            int had_nl, r = ds_read_line(d, &ln);
            if (r < 0) return -1;
            if (r == 0) {
                eof = 1;
                break;
            }
            if (r == 2) {
                if (!have) start = ln;
                have = over = 1;
                continue;
            }
            size_t n = line_len(d, &had_nl);
            if (is_blank(d->work.p, n)) {
                if (have) break;
                continue;
            }
            if (!have) start = ln;
            have = 1;
            if (!had_nl && d->truncated) cut = 1;
            int a = over ? 0 : ds_add_piece(d, d->work.p, n);
            if (a == -1) over = 1;
            if (a == -2) {
                d->err = MOE_ERR_NOMEM;
                return -1;
            }
        }
        if (!have) return 0;
        d->n_seen++;
        d->cand_line = start;
        if (cut) {
            if (ds_cut_off(d, start, "the gzip stream ends inside this paragraph") < 0) return -1;
        } else if (over) {
            if (ds_bad(d, start, "paragraph longer than %zu bytes", d->p.max_record_bytes) < 0) return -1;
        } else {
            return 1;
        }
        if (eof) return 0;
    }
}

/* JSONL: the next non-blank line, parsed as one JSON object. */
static int jsonl_next(struct moe_dataset *d) {
    for (;;) {
        int64_t ln;
        size_t n;
        int r = next_nonblank_line(d, &ln, &n);
        if (r <= 0) return r;
        char *s = d->work.p;
        s[n] = 0;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
        char why[400];
        why[0] = 0;
        if (!j) {
            size_t col = end && end >= s && end <= s + n ? (size_t)(end - s) + 1 : 1;
            snprintf(why, sizeof why, "invalid JSON at column %zu", col);
        } else {
            const char *t = end ? end : s + n;
            while (t < s + n && (*t == ' ' || *t == '\t' || *t == '\r')) t++;
            if (t < s + n)
                snprintf(why, sizeof why, "unexpected text after the JSON value at column %zu",
                         (size_t)(t - s) + 1);
            else if (!cJSON_IsObject(j))
                snprintf(why, sizeof why, "the line holds a JSON %s, not an object",
                         cJSON_IsArray(j) ? "array" : cJSON_IsString(j) ? "string" : "scalar");
            else
                ds_record_from_json(d, j, why, sizeof why);
        }
        cJSON_Delete(j);
        if (why[0]) {
            if (!strcmp(why, "out of memory")) {
                DS_LOGE("%s: out of memory", d->src.label);
                d->err = MOE_ERR_NOMEM;
                return -1;
            }
            if (ds_bad(d, ln, "%s", why) < 0) return -1;
            continue;
        }
        d->cand_line = ln;
        return 1;
    }
}

/* The reader for d's format. */
static int read_candidate(struct moe_dataset *d) {
    switch (d->spec->format) {
    case MOE_DATASET_TEXT:
        return d->spec->text_mode == MOE_TEXT_PARA   ? para_next(d)
               : d->spec->text_mode == MOE_TEXT_LINE ? line_next(d)
                                                     : chunk_next(d);
    case MOE_DATASET_JSONL: return jsonl_next(d);
    case MOE_DATASET_JSON: return ds_json_next(d);
    case MOE_DATASET_CSV:
    case MOE_DATASET_TSV: return ds_csv_next(d);
    }
    return ds_fatal(d, MOE_ERR_INVALID, 0, "unknown format");
}

/* ------------------------------------------------------------------------- */
/* the public API                                                            */

/* Defaults: no skipping, no limits, 64 MiB records, 1 MiB text chunks, 64 KiB reads. */
struct moe_dataset_params moe_dataset_default_params(void) {
    struct moe_dataset_params p;
    memset(&p, 0, sizeof p);
    p.max_record_bytes = MOE_DATASET_MAX_RECORD;
    p.text_chunk_bytes = DEFAULT_CHUNK;
    p.buffer_bytes = DEFAULT_BUFFER;
    return p;
}

/* Check a card's file against its sha256 (and, for the message, its byte count). */
static enum moe_status verify_card(const struct moe_dataset_spec *s) {
    char hex[65];
    uint64_t size = 0;
    enum moe_status st = moe_sha256_file(s->path, hex, &size);
    if (st) return st;
    if (strcmp(hex, s->sha256) != 0) {
        char sizes[96] = "";
        if (s->expected_bytes >= 0 && (uint64_t)s->expected_bytes != size)
            snprintf(sizes, sizeof sizes, " (the file has %llu bytes, the card says %lld)",
                     (unsigned long long)size, (long long)s->expected_bytes);
        DS_OPEN_LOGE("card '%s' (%s): sha256 mismatch for %s: expected %s, actual %s%s; the file is not the "
                 "one the card describes%s%s",
                 s->name, s->card_path, s->path, s->sha256, hex, sizes,
                 s->url ? "; download it again from " : "", s->url ? s->url : "");
        return MOE_ERR_FORMAT;
    }
    return MOE_OK;
}

/* Shared tail of the open functions: takes ownership of spec in every case. */
static enum moe_status open_common(struct moe_dataset_spec *spec, const void *mem, size_t mem_len, int is_mem,
                                   const struct moe_dataset_params *params, struct moe_dataset **out) {
    enum moe_status st = MOE_ERR_NOMEM;
    struct moe_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        moe_dataset_spec_free(spec);
        return MOE_ERR_NOMEM;
    }
    d->spec = spec;
    d->src.fd = -1;
    d->p = params ? *params : moe_dataset_default_params();
    if (d->p.max_records < 0 || d->p.max_bytes < 0) {
        DS_OPEN_LOGE("%s: max_records and max_bytes must not be negative", spec->path);
        st = MOE_ERR_INVALID;
        goto fail;
    }
    if (!d->p.max_record_bytes) d->p.max_record_bytes = MOE_DATASET_MAX_RECORD;
    if (!d->p.text_chunk_bytes) d->p.text_chunk_bytes = DEFAULT_CHUNK;
    if (d->p.text_chunk_bytes > d->p.max_record_bytes) d->p.text_chunk_bytes = d->p.max_record_bytes;
    if (d->p.text_chunk_bytes < 4) d->p.text_chunk_bytes = 4; /* room for any UTF-8 character */
    if (!d->p.buffer_bytes) d->p.buffer_bytes = DEFAULT_BUFFER;
    d->in_cap = d->p.buffer_bytes < 4 ? 4 : d->p.buffer_bytes;
    d->line = 1;
    if (!(d->in = malloc(d->in_cap))) goto fail;
    if (is_mem) {
        ds_src_open_memory(&d->src, mem, mem_len, spec->path, d->p.buffer_bytes);
    } else {
        struct stat sb;
        if (spec->card_path && stat(spec->path, &sb) != 0) {
            DS_OPEN_LOGE("card '%s' (%s): data file %s not found%s%s%s%s%s", spec->name, spec->card_path, spec->path,
                     spec->data_path ? "; set MOE_DATA_DIR to the directory holding " : "",
                     spec->data_path ? spec->data_path : "", spec->url ? "; download it from " : "",
                     spec->url ? spec->url : "", spec->sha256 ? " (see the card for its sha256)" : "");
            st = MOE_ERR_NOT_FOUND;
            goto fail;
        }
        if (spec->sha256 && !d->p.no_verify && (st = verify_card(spec))) goto fail;
        if ((st = ds_src_open_file(&d->src, spec->path, d->p.buffer_bytes))) {
            moe_log_func(MOE_LOG_ERROR, "moe_dataset", "%s: %s", spec->path, d->src.error);
            goto fail;
        }
    }
    st = MOE_ERR_FORMAT;
    if (spec->format == MOE_DATASET_JSON && ds_json_start(d) < 0) goto fail_err;
    if ((spec->format == MOE_DATASET_CSV || spec->format == MOE_DATASET_TSV) && ds_csv_start(d) < 0)
        goto fail_err;
    *out = d;
    return MOE_OK;
fail_err:
    st = d->err ? d->err : MOE_ERR_FORMAT;
fail:
    if (st == MOE_ERR_NOMEM) DS_OPEN_LOGE("%s: out of memory", spec->path);
    moe_dataset_free(d);
    return st;
}

/* Parse a spec and open it. */
enum moe_status moe_dataset_open(const char *spec, const struct moe_dataset_params *params,
                                 struct moe_dataset **out) {
    *out = NULL;
    struct moe_dataset_spec *s = NULL;
    enum moe_status st = moe_dataset_spec_parse(spec, &s);
    if (st) return st;
    return open_common(s, NULL, 0, 0, params, out);
}

/* Open a memory buffer as a dataset of the given format. */
enum moe_status moe_dataset_open_memory(const char *format, const void *data, size_t len, const char *label,
                                        const struct moe_dataset_params *params, struct moe_dataset **out) {
    *out = NULL;
    struct moe_dataset_spec *s = NULL;
    enum moe_status st = ds_spec_from_format(format, label ? label : "(memory)", &s);
    if (st) return st;
    return open_common(s, data, len, 1, params, out);
}

/* Mark the end; report how many records were skipped, once. */
static void end_of_data(struct moe_dataset *d) {
    if (d->done == 2) return;
    d->done = 2;
    if (d->n_skipped)
        moe_log_func(MOE_LOG_WARN, "moe_dataset", "%s: skipped %lld malformed record%s; read %lld", d->src.label,
                     (long long)d->n_skipped, d->n_skipped == 1 ? "" : "s", (long long)d->n_records);
}

/* The next record, or the end (text NULL), or an error; see moe-dataset.h. */
enum moe_status moe_dataset_next(struct moe_dataset *d, const char **text, size_t *len) {
    MOE_ASSERT(d && text && len);
    *text = NULL;
    *len = 0;
    if (d->err) return d->err;
    if (d->done || (d->p.max_records && d->n_records >= d->p.max_records) ||
        (d->p.max_bytes && d->n_bytes >= d->p.max_bytes)) {
        end_of_data(d);
        return MOE_OK;
    }
    for (;;) {
        int r = read_candidate(d);
        if (r < 0) return d->err ? d->err : MOE_ERR_FORMAT;
        if (r == 0) {
            end_of_data(d);
            return MOE_OK;
        }
        r = finish(d);
        if (r < 0) return d->err ? d->err : MOE_ERR_FORMAT;
        if (r == 0) {
            if (d->done) {
                end_of_data(d);
                return MOE_OK;
            }
            continue;
        }
        d->n_records++;
        d->n_bytes += (int64_t)d->rec.len;
        d->rec_line = d->cand_line;
        *text = d->rec.p;
        *len = d->rec.len;
        return MOE_OK;
    }
}

/* Records handed out so far. */
int64_t moe_dataset_records(const struct moe_dataset *d) { return d ? d->n_records : 0; }

/* Malformed records skipped so far. */
int64_t moe_dataset_skipped(const struct moe_dataset *d) { return d ? d->n_skipped : 0; }

/* The file (or memory label) being read. */
const char *moe_dataset_path(const struct moe_dataset *d) { return d ? d->spec->path : ""; }

/* Line of the last record handed out. */
int64_t moe_dataset_line(const struct moe_dataset *d) { return d && d->n_records ? d->rec_line : 0; }

/* The spec the handle was opened with. */
const struct moe_dataset_spec *moe_dataset_spec(const struct moe_dataset *d) { return d ? d->spec : NULL; }

/* Close the source and free every buffer. */
void moe_dataset_free(struct moe_dataset *d) {
    if (!d) return;
    ds_src_close(&d->src);
    ds_csv_free(d->csv);
    free(d->in);
    ds_buf_free(&d->rec);
    ds_buf_free(&d->work);
    ds_buf_free(&d->fix);
    moe_dataset_spec_free(d->spec);
    free(d);
}

/* All records in one string; see moe-dataset.h. */
enum moe_status moe_dataset_read_text(const char *spec, const struct moe_dataset_params *params, char **text,
                                      size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    struct moe_dataset *d = NULL;
    enum moe_status st = moe_dataset_open(spec, params, &d);
    if (st) return st;
    int joined = !(d->spec->format == MOE_DATASET_TEXT && d->spec->text_mode == MOE_TEXT_CHUNK);
    struct ds_buf all = {0};
    const char *t;
    size_t n;
    while ((st = moe_dataset_next(d, &t, &n)) == MOE_OK && t) {
        if ((joined && all.len && ds_buf_append(&all, "\n\n", 2)) || ds_buf_append(&all, t, n)) {
            DS_LOGE("%s: out of memory joining the records (%zu bytes so far)", moe_dataset_path(d), all.len);
            st = MOE_ERR_NOMEM;
            break;
        }
    }
    moe_dataset_free(d);
    if (st) {
        ds_buf_free(&all);
        return st;
    }
    if (!all.p && !(all.p = calloc(1, 1))) return MOE_ERR_NOMEM;
    *text = all.p;
    if (len) *len = all.len;
    return MOE_OK;
}
