/*
 * dataset-impl.h - internals shared by the dataset reader's sources (not
 * installed, not for tools): the byte source (file or memory, gzip detected by
 * magic), the dataset handle, and the helpers the format readers share.
 *
 * Layers, bottom up:
 *   ds_src     raw bytes from a file descriptor or a memory buffer; when they
 *              start with 1f 8b, inflated (zlib, multi-member) on the fly
 *   in buffer  the dataset's read buffer (params.buffer_bytes), UTF-8 BOM dropped
 *   readers    text (chunk/para/line), jsonl (lines), json (array splitter),
 *              csv/tsv (libcsv fed line by line); each yields a candidate record
 *   ds_finish  UTF-8 check / repair, size cap, max_bytes; the record handed out
 */
#ifndef MOE_DATASET_IMPL_H
#define MOE_DATASET_IMPL_H

#include <stdint.h>
#include <zlib.h>

#include "moe-dataset.h"

/* Messages name the public entry point, not the internal function: */
#define DS_LOGE(...) moe_log_func(MOE_LOG_ERROR, "moe_dataset", __VA_ARGS__)
#define DS_OPEN_LOGE(...) moe_log_func(MOE_LOG_ERROR, "moe_dataset_open", __VA_ARGS__)
#define DS_SPEC_LOGE(...) moe_log_func(MOE_LOG_ERROR, "moe_dataset_spec_parse", __VA_ARGS__)
#define DS_SPEC_LOGW(...) moe_log_func(MOE_LOG_WARN, "moe_dataset_spec_parse", __VA_ARGS__)

/* A growable byte buffer; p is NUL-terminated whenever len > 0 (one spare byte). */
struct ds_buf {
    char *p;
    size_t len, cap;
};

/* ds_buf_reserve: room for `extra` more bytes plus a NUL; 0 or MOE_ERR_NOMEM. */
enum moe_status ds_buf_reserve(struct ds_buf *b, size_t extra);
/* ds_buf_append: append n bytes and keep the buffer NUL-terminated. */
enum moe_status ds_buf_append(struct ds_buf *b, const void *s, size_t n);
/* ds_buf_free: release and zero. */
void ds_buf_free(struct ds_buf *b);

/* ---- byte source (source.c) ---- */

struct ds_src {
    const char *label;           /* the file name for messages (borrowed) */
    int fd;                      /* -1 for memory */
    const unsigned char *mem;    /* memory source */
    size_t mem_len, mem_pos;
    size_t bufsz;                /* raw read size */
    unsigned char peek[2];       /* bytes read for magic detection, delivered first */
    size_t peek_len, peek_pos;
    int raw_eof;
    int started;                 /* magic detected */
    int gz;                      /* 1: gzip stream */
    int zs_live;                 /* inflateInit2 done */
    int member_end;              /* a gzip member ended; looking for another */
    z_stream zs;
    unsigned char *zin;          /* raw bytes waiting to be inflated */
    size_t zin_cap;
    int truncated;               /* the gzip stream ended early (recoverable: "cut off") */
    uint64_t raw_bytes, out_bytes;
    char error[256];             /* why the last call failed (not logged here) */
    enum moe_status failed;      /* a corrupt stream: returned after the bytes before it */
};

/* ds_src_open_file / ds_src_open_memory: set up a source; the label must outlive
 * it. Opening a file fails with s->error set (not logged). */
enum moe_status ds_src_open_file(struct ds_src *s, const char *path, size_t bufsz);
void ds_src_open_memory(struct ds_src *s, const void *data, size_t len, const char *label,
                        size_t bufsz);
/* ds_src_read: up to cap decompressed bytes into buf; *n = 0 at the end. On
 * error returns it with s->error set and logs nothing (the dataset logs it with
 * the line reached); a truncated gzip stream also sets s->truncated, which the
 * dataset may treat as a cut-off record (skip_bad). */
enum moe_status ds_src_read(struct ds_src *s, void *buf, size_t cap, size_t *n);
/* ds_src_close: close the descriptor and end inflate; safe twice. */
void ds_src_close(struct ds_src *s);

/* ---- specs (spec.c) ---- */

/* ds_spec_from_format: a spec for moe_dataset_open_memory from "FORMAT[:SELECT]". */
enum moe_status ds_spec_from_format(const char *format, const char *label,
                                    struct moe_dataset_spec **out);

/* ---- the handle ---- */

/* One completed CSV row waiting to be handed out (rows complete inside libcsv
 * callbacks, possibly several per fed line). */
struct ds_csv_row {
    char *text;     /* selected fields joined, or the problem when bad */
    size_t len;
    int64_t line;
    int bad;
};

struct ds_csv; /* csv.c */

/* JSON array splitter state (json.c). */
struct ds_json {
    int phase;      /* JS_* in json.c */
    int kind;       /* element kind: container, string, literal */
    size_t depth;   /* open brackets inside a container element */
    int in_str, esc;
    int overflow;   /* element larger than max_record_bytes: bytes dropped */
    int64_t elem_line;
};

struct moe_dataset {
    struct moe_dataset_spec *spec; /* owned */
    struct moe_dataset_params p;
    struct ds_src src;
    /* read buffer */
    unsigned char *in;
    size_t in_cap, in_len, in_pos;
    int in_eof;
    int bom_done;
    int truncated;        /* the gzip stream was cut off and skip_bad is on */
    int64_t line;         /* 1-based line of the byte at in_pos */
    /* records */
    struct ds_buf rec;    /* the candidate / returned record */
    struct ds_buf work;   /* a line, a JSON element or a pending text chunk */
    struct ds_buf fix;    /* UTF-8 repair scratch */
    int64_t cand_line;    /* line where the candidate starts */
    int64_t rec_line;     /* line of the last returned record */
    int64_t n_seen;       /* candidates so far (record numbers in messages, 1-based) */
    int64_t n_records, n_skipped, n_bytes;
    int n_warned;
    enum moe_status err;  /* sticky */
    int done;
    int para_pending;     /* text para: a line already read that starts the next paragraph */
    struct ds_json js;
    struct ds_csv *csv;
};

/* ds_fill: make sure in[in_pos] is readable. 1 = data, 0 = end (also after a
 * truncated gzip with skip_bad), -1 = fatal error (d->err set, logged). */
int ds_fill(struct moe_dataset *d);

/* ds_read_line: the next physical line into d->work, '\n' included when present.
 * 1 = a line (its first line number in *line_no), 0 = end, -1 = fatal,
 * 2 = the line was longer than max_record_bytes (consumed, dropped). */
int ds_read_line(struct moe_dataset *d, int64_t *line_no);

/* ds_bad: one malformed candidate record (d->n_seen already counts it). With
 * skip_bad counts it, warns for the first few, and returns 0 (carry on);
 * otherwise logs the error, sets d->err and returns -1. */
int ds_bad(struct moe_dataset *d, int64_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ds_fatal: an error that ends the dataset whatever skip_bad says; returns -1. */
int ds_fatal(struct moe_dataset *d, enum moe_status st, int64_t line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ds_cut_off: the data ended in the middle of a record (gzip truncated, JSON
 * array not closed): a bad record if skip_bad (counted), else an error. */
int ds_cut_off(struct moe_dataset *d, int64_t line, const char *what);

/* Readers: 1 = a candidate record in d->rec (line in d->cand_line), 0 = end,
 * -1 = fatal. Malformed records go through ds_bad inside. */
int ds_json_start(struct moe_dataset *d); /* consume up to '['; 0 ok, -1 fatal */
int ds_json_next(struct moe_dataset *d);
int ds_csv_start(struct moe_dataset *d);  /* read the header; 0 ok, -1 fatal */
int ds_csv_next(struct moe_dataset *d);
void ds_csv_free(struct ds_csv *c);

/* ds_record_from_json: the selected fields of one parsed JSON value into d->rec.
 * 0 = ok, -1 = malformed (message in why). */
int ds_record_from_json(struct moe_dataset *d, const void *cjson_item, char *why, size_t why_len);

/* ds_add_piece: append one field's text to d->rec ("\n" between non-empty
 * pieces; empty pieces add nothing). -1 when the record would pass the cap. */
int ds_add_piece(struct moe_dataset *d, const char *s, size_t n);

#endif
