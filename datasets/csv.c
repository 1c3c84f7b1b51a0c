/*
 * csv.c - CSV and TSV with a header row, read with libcsv in strict RFC 4180
 * mode (quoted fields may hold the delimiter, doubled quotes and newlines;
 * a quote inside an unquoted field, or text after a closing quote, is an
 * error). Spaces are kept as they are.
 *
 * libcsv calls back per field and per row while it parses whatever it is fed,
 * so the rows a feed completes go to a small queue that moe_dataset_next
 * drains. We feed it one physical line at a time: that gives every row the
 * line it starts on, and bounds a row's memory (a quoted field that never
 * closes is cut off at max_record_bytes instead of swallowing the file). Only
 * the selected columns' cells are kept.
 */
#include "dataset-impl.h"

#include <csv.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAMES_MAX 1024 /* header names kept for messages */

struct ds_csv {
    struct moe_dataset *d;
    struct csv_parser p;
    int live;              /* csv_init done (csv_free needed) */
    int header_done;
    int eof;               /* csv_fini done */
    int oom;
    int64_t n_cols;        /* header columns */
    int64_t col;           /* column of the next cell in the current row */
    int64_t *sel_col;      /* per selected field: its column, or -1 */
    size_t *sel_off, *sel_len;
    struct ds_buf row;     /* selected cells of the current row */
    struct ds_buf names;   /* "a, b, c" for messages */
    size_t row_fed;        /* bytes fed since the current row started */
    int row_over;          /* a selected cell pushed the row past the cap */
    int need_start;        /* the next non-empty line starts a row */
    int64_t row_line, feed_line;
    struct ds_csv_row *q;  /* completed rows, q[q_head..q_len) */
    size_t q_len, q_cap, q_head;
};

/* libcsv must not trim spaces: they belong to the field (RFC 4180). */
static int no_space(unsigned char c) {
    (void)c;
    return 0;
}

/* (Re)start libcsv after an error or at open. */
static int parser_init(struct ds_csv *c) {
    if (c->live) csv_free(&c->p);
    c->live = 0;
    if (csv_init(&c->p, CSV_STRICT | CSV_STRICT_FINI) != 0) return -1;
    c->live = 1;
    csv_set_delim(&c->p, c->d->spec->format == MOE_DATASET_TSV ? CSV_TAB : CSV_COMMA);
    csv_set_space_func(&c->p, no_space);
    csv_set_blk_size(&c->p, 4096);
    return 0;
}

/* Forget the row in progress (after a parse error or an over-long row). */
static void row_reset(struct ds_csv *c) {
    c->col = 0;
    c->row.len = 0;
    c->row_over = 0;
    c->row_fed = 0;
    c->need_start = 1;
    for (int i = 0; i < c->d->spec->n_fields; i++) c->sel_len[i] = 0;
}

/* Queue a completed row: its text (ownership taken) or, when bad, its problem. */
static void push(struct ds_csv *c, char *text, size_t len, int bad, int64_t line) {
    if (!text) {
        c->oom = 1;
        return;
    }
    if (c->q_head > 0 && c->q_head == c->q_len) c->q_head = c->q_len = 0;
    if (c->q_len == c->q_cap) {
        size_t cap = c->q_cap ? c->q_cap * 2 : 8;
        struct ds_csv_row *q = realloc(c->q, cap * sizeof *q);
        if (!q) {
            free(text);
            c->oom = 1;
            return;
        }
        c->q = q;
        c->q_cap = cap;
    }
    c->q[c->q_len++] = (struct ds_csv_row){text, len, line, bad};
}

/* Queue a bad row with a formatted problem. */
static void push_bad(struct ds_csv *c, int64_t line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void push_bad(struct ds_csv *c, int64_t line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    push(c, strdup(msg), strlen(msg), 1, line);
}

/* libcsv field callback: match header names, or keep a selected cell. */
static void on_field(void *s, size_t n, void *user) {
    struct ds_csv *c = user;
    const struct moe_dataset_spec *spec = c->d->spec;
    const char *cell = s ? s : "";
    if (!s) n = 0;
    if (c->need_start) { /* a row that began after another ended inside the same line */
        c->row_line = c->feed_line;
        c->need_start = 0;
    }
    if (!c->header_done) {
        size_t a = 0, b = n;
        while (a < b && (cell[a] == ' ' || cell[a] == '\t')) a++;
        while (b > a && (cell[b - 1] == ' ' || cell[b - 1] == '\t')) b--;
        for (int i = 0; i < spec->n_fields; i++)
            if (c->sel_col[i] < 0 && strlen(spec->fields[i]) == b - a && !memcmp(spec->fields[i], cell + a, b - a))
                c->sel_col[i] = c->col;
        if (c->names.len < NAMES_MAX) {
            size_t k = b - a < NAMES_MAX ? b - a : NAMES_MAX;
            if ((c->names.len && ds_buf_append(&c->names, ", ", 2)) || ds_buf_append(&c->names, cell + a, k))
                c->oom = 1;
        }
    } else {
        for (int i = 0; i < spec->n_fields; i++) {
            if (c->sel_col[i] != c->col || c->row_over) continue;
            if (c->row.len + n > c->d->p.max_record_bytes) {
                c->row_over = 1;
                continue;
            }
            c->sel_off[i] = c->row.len;
            c->sel_len[i] = n;
            if (ds_buf_append(&c->row, cell, n)) c->oom = 1;
        }
    }
    c->col++;
}

/* libcsv row callback: the header is done, or a data row is complete. */
static void on_row(int term, void *user) {
    (void)term;
    struct ds_csv *c = user;
    const struct moe_dataset_spec *spec = c->d->spec;
    if (!c->header_done) {
        c->header_done = 1;
        c->n_cols = c->col;
    } else if (c->col != c->n_cols) {
        push_bad(c, c->row_line, "the row has %lld column%s, the header has %lld", (long long)c->col,
                 c->col == 1 ? "" : "s", (long long)c->n_cols);
    } else if (c->row_over) {
        push_bad(c, c->row_line, "record longer than %zu bytes", c->d->p.max_record_bytes);
    } else {
        size_t total = 0;
        for (int i = 0; i < spec->n_fields; i++) total += c->sel_len[i] + 1;
        char *t = malloc(total + 1), *w = t;
        if (t) {
            for (int i = 0; i < spec->n_fields; i++) {
                if (!c->sel_len[i]) continue; /* empty cells (and absent optional columns) add nothing */
                if (w > t) *w++ = '\n';
                memcpy(w, c->row.p + c->sel_off[i], c->sel_len[i]);
                w += c->sel_len[i];
            }
            *w = 0;
        }
        push(c, t, t ? (size_t)(w - t) : 0, 0, c->row_line);
    }
    row_reset(c);
}

/* Feed n bytes to libcsv. 0 = fed (rows may be queued), 1 = a parse error
 * (queued as a bad row; the parser restarts at the next line), -1 = fatal. */
static int feed(struct ds_csv *c, const char *s, size_t n) {
    size_t k = csv_parse(&c->p, s, n, on_field, on_row, c);
    if (c->oom) return -1;
    if (k == n) return 0;
    int e = csv_error(&c->p);
    if (e == CSV_ENOMEM || e == CSV_ETOOBIG) {
        c->oom = 1;
        return -1;
    }
    push_bad(c, c->row_line,
             "malformed CSV quoting on line %lld (a quote inside an unquoted field, or text after a "
             "closing quote)", (long long)c->feed_line);
    row_reset(c);
    if (parser_init(c)) c->oom = 1;
    return c->oom ? -1 : 1;
}

/* Out of memory inside the CSV reader: fatal. */
static int csv_oom(struct moe_dataset *d) {
    DS_LOGE("%s: out of memory", d->src.label);
    d->err = MOE_ERR_NOMEM;
    return -1;
}

/* Read and feed one more physical line (or finish at the end). 1 = progress,
 * 0 = the end was reached, -1 = fatal. */
static int feed_line(struct moe_dataset *d) {
    struct ds_csv *c = d->csv;
    int64_t ln;
    int r = ds_read_line(d, &ln);
    if (r < 0) return -1;
    if (r == 0) {
        c->eof = 1;
        if (d->truncated) {
            if (!c->need_start) push_bad(c, c->row_line, "cut off: the gzip stream ends inside this row");
        } else if (csv_fini(&c->p, on_field, on_row, c) != 0) {
            push_bad(c, c->row_line, "the file ends inside a quoted field (unterminated quote)");
        }
        return c->oom ? csv_oom(d) : 0;
    }
    if (r == 2) {
        push_bad(c, c->need_start ? ln : c->row_line, "line %lld is longer than %zu bytes", (long long)ln,
                 d->p.max_record_bytes);
        row_reset(c);
        if (parser_init(c)) c->oom = 1;
        return c->oom ? csv_oom(d) : 1;
    }
    int blank = (d->work.len == 1 && d->work.p[0] == '\n') || (d->work.len == 2 && !memcmp(d->work.p, "\r\n", 2));
    if (c->need_start && !blank) {
        c->row_line = ln;
        c->need_start = 0;
    }
    c->feed_line = ln;
    if (c->row_fed + d->work.len > d->p.max_record_bytes + 2) {
        push_bad(c, c->row_line, "row longer than %zu bytes (an unterminated quote?)", d->p.max_record_bytes);
        row_reset(c);
        if (parser_init(c)) c->oom = 1;
        return c->oom ? csv_oom(d) : 1;
    }
    c->row_fed += d->work.len;
    return feed(c, d->work.p, d->work.len) < 0 ? csv_oom(d) : 1;
}

/* Open-time half: read the header row and map the selected columns. */
int ds_csv_start(struct moe_dataset *d) {
    const struct moe_dataset_spec *s = d->spec;
    struct ds_csv *c = calloc(1, sizeof *c);
    if (!c) return csv_oom(d);
    d->csv = c;
    c->d = d;
    c->need_start = 1;
    size_t nf = s->n_fields ? (size_t)s->n_fields : 1;
    c->sel_col = malloc(nf * sizeof *c->sel_col);
    c->sel_off = calloc(nf, sizeof *c->sel_off);
    c->sel_len = calloc(nf, sizeof *c->sel_len);
    if (!c->sel_col || !c->sel_off || !c->sel_len || parser_init(c)) return csv_oom(d);
    for (int i = 0; i < s->n_fields; i++) c->sel_col[i] = -1;
    while (!c->header_done) {
        if (c->eof)
            return ds_fatal(d, MOE_ERR_FORMAT, d->line, "%s: no header row",
                            d->truncated ? "the gzip stream is truncated" : "empty CSV file");
        if (feed_line(d) < 0) return -1;
        if (!c->header_done && c->q_len > c->q_head) /* a problem before the header ended */
            return ds_fatal(d, MOE_ERR_FORMAT, c->q[c->q_head].line, "bad header row: %s", c->q[c->q_head].text);
    }
    for (int i = 0; i < s->n_fields; i++) {
        if (c->sel_col[i] >= 0 || s->optional[i]) continue;
        return ds_fatal(d, MOE_ERR_NOT_FOUND, 1, "no column named \"%s\" in the header (columns: %s%s)", s->fields[i],
                        c->names.p ? c->names.p : "none", c->names.len >= NAMES_MAX ? ", ..." : "");
    }
    return 0;
}

/* The next data row as a candidate record (see dataset-impl.h). */
int ds_csv_next(struct moe_dataset *d) {
    struct ds_csv *c = d->csv;
    for (;;) {
        if (c->q_head < c->q_len) {
            struct ds_csv_row row = c->q[c->q_head++];
            d->n_seen++;
            if (row.bad) {
                int r = ds_bad(d, row.line, "%s", row.text);
                free(row.text);
                if (r < 0) return -1;
                continue;
            }
            d->rec.len = 0;
            int r = ds_buf_append(&d->rec, row.text, row.len) ? -1 : 1;
            free(row.text);
            if (r < 0) return csv_oom(d);
            d->cand_line = row.line;
            return 1;
        }
        if (c->eof) return 0;
        if (feed_line(d) < 0) return -1;
    }
}

/* Free the CSV state and any queued rows; NULL is a no-op. */
void ds_csv_free(struct ds_csv *c) {
    if (!c) return;
    if (c->live) csv_free(&c->p);
    for (size_t i = c->q_head; i < c->q_len; i++) free(c->q[i].text);
    free(c->q);
    free(c->sel_col);
    free(c->sel_off);
    free(c->sel_len);
    ds_buf_free(&c->row);
    ds_buf_free(&c->names);
    free(c);
}
