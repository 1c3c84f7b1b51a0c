/*
 * moe-dataset.h - readers for the datasets users bring to calibration, eval and
 * profiling: plain text, JSON Lines, JSON arrays of objects (Alpaca, ShareGPT),
 * CSV/TSV with a header row, each optionally gzip-compressed; named on the
 * command line by one string (a "dataset spec", grammar in docs/cli.md ("Datasets") and
 * moe_dataset_spec_help()), either a dataset card (datasets/cards/<name>.json)
 * or a file with a format and a field selection.
 *
 * A dataset is a stream of records. Each record is one UTF-8 string: the
 * selected fields of one JSON object / CSV row joined with "\n", a paragraph or
 * line of text, or a chunk of a text file. Files are streamed: memory stays
 * bounded by the largest record (capped by params.max_record_bytes, 64 MiB by
 * default), never by the file size.
 *
 * Errors: malformed input (a bad JSON line, a non-object element, a missing
 * field, a CSV row with the wrong number of columns, invalid UTF-8, an
 * over-long record, a JSON array or gzip stream cut off) is logged once with
 * "moe_dataset: FILE:LINE: record N: problem" and returned as MOE_ERR_FORMAT,
 * or, with params.skip_bad, counted (moe_dataset_skipped) and skipped. Problems
 * that make the rest of a file unreadable (a corrupt gzip stream, a JSON array
 * whose structure is broken, an unknown CSV column, a card whose sha256 does
 * not match) are errors even with skip_bad. Never a crash, never an assert.
 *
 * Thread-safety: a handle belongs to one thread at a time; different handles
 * may be used concurrently. Logging goes through moe_log (formats/moe-status.h).
 */
#ifndef MOE_DATASET_H
#define MOE_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest record (or physical line) by default: 64 MiB. */
#define MOE_DATASET_MAX_RECORD ((size_t)64 << 20)
/* Most fields one spec may select. */
#define MOE_DATASET_MAX_FIELDS 64

enum moe_dataset_format {
    MOE_DATASET_TEXT = 0, /* plain UTF-8 text; records per text_mode */
    MOE_DATASET_JSONL = 1, /* one JSON object per line */
    MOE_DATASET_JSON = 2,  /* one JSON array of objects, streamed element by element */
    MOE_DATASET_CSV = 3,   /* comma-separated, RFC 4180 quoting, header row */
    MOE_DATASET_TSV = 4,   /* the same with tabs */
};

/* How a text file is cut into records (the SELECT part of "text:PATH:SELECT"). */
enum moe_dataset_text_mode {
    MOE_TEXT_CHUNK = 0, /* the whole file, in pieces of ~text_chunk_bytes cut after a
                           newline; concatenated they are the file byte for byte */
    MOE_TEXT_PARA = 1,  /* paragraphs: runs of non-blank lines, joined with "\n" */
    MOE_TEXT_LINE = 2,  /* each non-blank line */
};

/*
 * A parsed dataset spec. Plain data, owned by whoever parsed it (or by the
 * dataset handle, for moe_dataset_spec()); read-only for everyone else.
 */
struct moe_dataset_spec {
    enum moe_dataset_format format;
    enum moe_dataset_text_mode text_mode; /* MOE_DATASET_TEXT only */
    char *path;                  /* the data file, resolved (see docs/cli.md) */
    int n_fields;                /* selected fields / columns; 0 for text */
    char **fields;               /* their names, without the trailing '?' */
    unsigned char *optional;     /* optional[i] != 0: fields[i] was written "name?" */
    int fields_defaulted;        /* 1 when no selection was written ("text" assumed) */
    /* Dataset cards only; NULL / -1 for a file spec. */
    char *card_path;             /* the card file */
    char *name;                  /* "name" */
    char *sha256;                /* "sha256", 64 lowercase hex digits, or NULL */
    char *license;               /* "license" */
    char *url;                   /* "url": where to download the file */
    char *description;           /* "description" */
    char *data_path;             /* "data_path": the file relative to $MOE_DATA_DIR */
    int may_commit;              /* "may_commit": 1 / 0, -1 when absent */
    int64_t expected_records;    /* "records", -1 when absent */
    int64_t expected_bytes;      /* "bytes", -1 when absent */
};

/* moe_dataset_spec_parse: parse one dataset spec (the grammar of docs/cli.md, "Datasets"). Card
 * specs read and validate the card (and resolve its file); nothing else touches
 * the file system except the existence checks of bare names and of ".json"
 * paths. Returns MOE_ERR_INVALID (bad grammar, unknown format, unguessable
 * extension), MOE_ERR_NOT_FOUND (card: name that matches no card file),
 * MOE_ERR_FORMAT (a malformed card) or MOE_ERR_IO, with one logged message.
 * Free *out with moe_dataset_spec_free. */
enum moe_status moe_dataset_spec_parse(const char *spec, struct moe_dataset_spec **out);

/* moe_dataset_spec_free: free a parsed spec; NULL is a no-op. */
void moe_dataset_spec_free(struct moe_dataset_spec *spec);

/* moe_dataset_spec_help: the grammar in a few lines, for a CLI's --help. Static
 * string; never NULL. */
const char *moe_dataset_spec_help(void);

/* moe_dataset_format_name: "text", "jsonl", "json", "csv", "tsv" (or "?"). */
const char *moe_dataset_format_name(enum moe_dataset_format f);

struct moe_dataset_params {
    int skip_bad;             /* 1: count and skip malformed records instead of failing */
    int64_t max_records;      /* stop after this many records; 0 = all */
    int64_t max_bytes;        /* stop once the records returned hold this many bytes; the
                                 record that crosses the limit is cut at the last whole
                                 UTF-8 character before it. 0 = no limit */
    size_t max_record_bytes;  /* a longer record or physical line is malformed
                                 (default MOE_DATASET_MAX_RECORD) */
    size_t text_chunk_bytes;  /* MOE_TEXT_CHUNK record size (default 1 MiB, at least 4) */
    size_t buffer_bytes;      /* read (and inflate) buffer size (default 64 KiB; tests use
                                 tiny values to split records across reads) */
    int replace_invalid_utf8; /* 0 (default): invalid UTF-8 makes a record malformed;
                                 1: each offending byte becomes U+FFFD */
    int no_verify;            /* 1: skip a card's sha256 check */
};

/* moe_dataset_default_params: everything off / unlimited, default sizes. */
struct moe_dataset_params moe_dataset_default_params(void);

struct moe_dataset; /* opaque */

/* moe_dataset_open: parse `spec`, check a card's sha256 (the whole file is read
 * once up front, so a mismatch is reported before any record), open the file and
 * read as far as the first record's start (a CSV header, a JSON array's '['), so
 * an unknown column or a file that is no array fails here. params NULL = defaults.
 * On error *out is NULL and one message was logged. */
enum moe_status moe_dataset_open(const char *spec, const struct moe_dataset_params *params,
                                 struct moe_dataset **out);

/* moe_dataset_open_memory: the same over an in-memory buffer (tests, fuzzing).
 * `format` is "FORMAT" or "FORMAT:SELECT" (e.g. "jsonl:question,answer",
 * "csv:Question,Best Answer", "text:para"); gzip data is detected by its magic
 * bytes. `label` names the buffer in messages. data must outlive the handle. */
enum moe_status moe_dataset_open_memory(const char *format, const void *data, size_t len,
                                        const char *label, const struct moe_dataset_params *params,
                                        struct moe_dataset **out);

/* moe_dataset_next: the next record. Returns MOE_OK with *text pointing at a
 * NUL-terminated UTF-8 record of *len bytes (no NUL inside, *len >= 1), or MOE_OK
 * with *text == NULL and *len == 0 at the end of the data (or of max_records /
 * max_bytes). The record is borrowed: valid until the next call or
 * moe_dataset_free. On an error returns it (and returns it again on later calls).
 *
 *     const char *t; size_t n; enum moe_status st;
 *     while ((st = moe_dataset_next(d, &t, &n)) == MOE_OK && t) use(t, n);
 *     if (st != MOE_OK) fail;
 */
enum moe_status moe_dataset_next(struct moe_dataset *d, const char **text, size_t *len);

/* moe_dataset_records: records returned so far. */
int64_t moe_dataset_records(const struct moe_dataset *d);

/* moe_dataset_skipped: malformed records skipped so far (skip_bad). */
int64_t moe_dataset_skipped(const struct moe_dataset *d);

/* moe_dataset_path: the data file (or memory label) being read; owned by d. */
const char *moe_dataset_path(const struct moe_dataset *d);

/* moe_dataset_line: 1-based line where the last returned record starts (in the
 * decompressed text); 0 before the first record. For messages: "%s:%lld". */
int64_t moe_dataset_line(const struct moe_dataset *d);

/* moe_dataset_spec: the spec the dataset was opened with (card name, license...),
 * owned by d. */
const struct moe_dataset_spec *moe_dataset_spec(const struct moe_dataset *d);

/* moe_dataset_free: close and free; NULL is a no-op. */
void moe_dataset_free(struct moe_dataset *d);

/* moe_dataset_read_text: open `spec` and return all its records in one malloc'd,
 * NUL-terminated string (caller frees *text), records joined by a blank line
 * ("\n\n") — except MOE_TEXT_CHUNK pieces, which are concatenated as they are,
 * so a text file comes back byte for byte (minus a leading UTF-8 BOM). No
 * records gives "" (len 0). params NULL = defaults; max_bytes bounds the records'
 * bytes (not the separators). */
enum moe_status moe_dataset_read_text(const char *spec, const struct moe_dataset_params *params,
                                      char **text, size_t *len);

/* ---- SHA-256 (FIPS 180-4), used to verify cards; exposed for tools and tests. ---- */

struct moe_sha256 {
    uint32_t h[8];
    uint64_t n_bytes;
    uint8_t block[64];
    size_t used;
};

/* moe_sha256_init / update / final: incremental hashing; final writes 32 bytes. */
void moe_sha256_init(struct moe_sha256 *s);
void moe_sha256_update(struct moe_sha256 *s, const void *data, size_t len);
void moe_sha256_final(struct moe_sha256 *s, uint8_t out[32]);

/* moe_sha256_hex: 32 bytes -> 64 lowercase hex digits + NUL. */
void moe_sha256_hex(const uint8_t digest[32], char hex[65]);

/* moe_sha256_file: hash a whole file (streamed) into hex; *size gets its byte
 * count when size != NULL. MOE_ERR_IO with a logged message if it cannot be read. */
enum moe_status moe_sha256_file(const char *path, char hex[65], uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif
