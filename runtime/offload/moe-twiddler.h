/*
 * moe-twiddler.h - Twiddler / Fiddler's CPU-GPU split of the routed experts
 * (docs/architecture.md, "The CUDA backend"; ALGORITHMS.md, Twiddler §3).
 *
 * A GPU backend with only part of the experts in device memory has two ways
 * to run an expert whose copy is not there: copy its weights over and run it
 * on the GPU, or run it on the CPU over the host copy while the GPU works on
 * the rest. This module holds the latency model measured on the machine and
 * the decision; it is plain C (no CUDA), so the decisions are unit-tested on
 * simulated tables (tests/test-twiddler.c) and the CUDA backend only supplies
 * the measurements.
 *
 * Latency model, per stored precision of an expert: transfer_s (its weights
 * host -> device), gpu(s) and cpu(s), the time of the expert for s routed
 * tokens, as piecewise-linear curves through measured points (beyond the last
 * point: extended along the last segment's slope).
 *
 * The rule (Fiddler), per expert with s > 0 tokens: resident on the device ->
 * GPU; else GPU if cpu(s) > transfer + gpu(s), else CPU. The layer's time is
 * modelled as the max of the two sides, which run at the same time, not their
 * sum: the CPU side is the sum of its experts' cpu(s); the GPU side is a
 * two-stage pipeline (copies in order on the copy engine, computation on the
 * compute engine, resident experts first, each copied expert computed once
 * its copy is done). moe_twiddler_plan starts from the rule and then moves
 * single experts between the sides while that lowers the modelled layer time,
 * so its plan is never slower (in the model) than the rule's, all-GPU or
 * all-CPU (tested).
 *
 * Tables are cached per machine as small text files under the user's cache
 * directory ($XDG_CACHE_HOME/moe, else ~/.cache/moe), keyed by a string naming
 * the device, the CPU threads and the expert's shape and types; a file whose
 * key differs is ignored and the table measured again. Files are untrusted:
 * the reader validates every field and returns MOE_ERR_FORMAT with a message.
 *
 * Thread safety: every function is pure or works on caller-owned structs.
 */
#ifndef MOE_TWIDDLER_H
#define MOE_TWIDDLER_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_LAT_MAX_POINTS 16 /* measured token counts per curve */
#define MOE_LAT_MAX_PREC 8    /* precisions per table */
#define MOE_LAT_KEY_MAX 512

/* Seconds for s tokens at points s[0] < s[1] < ... (s[0] >= 1, t[i] > 0). */
struct moe_lat_curve {
    int n;
    int32_t s[MOE_LAT_MAX_POINTS];
    double t[MOE_LAT_MAX_POINTS];
};

/* One stored precision of one expert: what moving and running it costs. */
struct moe_lat_entry {
    int prec;               /* the bundle's precision index */
    int64_t bytes;          /* raw bytes of the copy */
    double transfer_s;      /* host -> device copy of those bytes (0 with unified memory) */
    struct moe_lat_curve gpu, cpu;
};

struct moe_lat_table {
    char key[MOE_LAT_KEY_MAX]; /* what the measurements are valid for */
    int n;
    struct moe_lat_entry e[MOE_LAT_MAX_PREC];
};

/* What --cpu-experts asks for. */
enum moe_cpu_experts {
    MOE_CPU_EXPERTS_AUTO = 0,   /* the latency model decides (moe_twiddler_plan) */
    MOE_CPU_EXPERTS_NEVER = 1,  /* every expert on the GPU: copy the missing ones over */
    MOE_CPU_EXPERTS_ALWAYS = 2, /* every expert not resident on the GPU runs on the CPU */
};

/* moe_cpu_experts_parse: "auto" / "never" / "always". MOE_ERR_INVALID (not logged) otherwise. */
enum moe_status moe_cpu_experts_parse(const char *s, enum moe_cpu_experts *out);
const char *moe_cpu_experts_name(enum moe_cpu_experts m);

/* moe_lat_curve_eval: the curve's time for s >= 1 tokens: linear between
 * points, the first point's time below it, extended along the last segment
 * (slope clamped to >= 0) above the last; a single point is a constant. An
 * empty curve gives +inf (never chosen). */
double moe_lat_curve_eval(const struct moe_lat_curve *c, int s);

/* moe_lat_curve_add: append point (s, t) (s above the last one, t > 0 and
 * finite). MOE_ERR_INVALID otherwise, MOE_ERR_RANGE when full. */
enum moe_status moe_lat_curve_add(struct moe_lat_curve *c, int s, double t);

/* moe_lat_table_find: the entry of precision `prec`, or NULL. */
const struct moe_lat_entry *moe_lat_table_find(const struct moe_lat_table *t, int prec);

/* moe_twiddler_rule: Fiddler's choice for one expert with s >= 1 tokens:
 * 1 = run it on the CPU, 0 = on the GPU (resident, or copy and run). NEVER
 * gives 0; ALWAYS gives 1 unless resident; AUTO: 1 iff not resident and
 * cpu(s) <= transfer + gpu(s). A NULL entry (unmeasured) gives 0. */
int moe_twiddler_rule(const struct moe_lat_entry *lat, int s, int resident, enum moe_cpu_experts mode);

/* The modelled times of one layer step. */
struct moe_twiddler_time {
    double gpu_s;   /* the GPU side: pipeline of copies and computation */
    double cpu_s;   /* the CPU side: sum of its experts */
    double layer_s; /* max(gpu_s, cpu_s) */
    int n_cpu, n_copied;
};

/* One expert of a layer step, for the planner. */
struct moe_twiddler_item {
    int tokens;                      /* s >= 1 */
    int resident;                    /* its copy is on the device (or being put there for this use) */
    const struct moe_lat_entry *lat; /* its precision's entry; NULL = unmeasured (GPU) */
};

/* moe_twiddler_layer_time: the modelled time of n items with host[i] = 1 on
 * the CPU (a resident item on the CPU counts on the CPU side). */
void moe_twiddler_layer_time(int n, const struct moe_twiddler_item *items, const uint8_t *host,
                             struct moe_twiddler_time *out);

/* moe_twiddler_plan: host[i] for n items: the rule, then (AUTO only) single
 * moves between the sides while they lower the modelled layer time. Resident
 * items always stay on the GPU. `out` (may be NULL) gets the plan's times. */
void moe_twiddler_plan(enum moe_cpu_experts mode, int n, const struct moe_twiddler_item *items, uint8_t *host,
                       struct moe_twiddler_time *out);

/* moe_lat_table_write: the table as text to `path`, atomically (a temporary
 * file renamed over it); missing directories are created. */
enum moe_status moe_lat_table_write(const struct moe_lat_table *t, const char *path);

/* moe_lat_table_parse: parse a table's text (as written above); every count,
 * number and ordering is checked. MOE_ERR_FORMAT with a logged message naming
 * `label` and the line otherwise. */
enum moe_status moe_lat_table_parse(const char *text, size_t len, const char *label, struct moe_lat_table *out);

/* moe_lat_table_read: read and parse `path`. MOE_ERR_NOT_FOUND (not logged)
 * when it does not exist. */
enum moe_status moe_lat_table_read(const char *path, struct moe_lat_table *out);

/* moe_lat_cache_path: the cache file for `key` in the user's cache directory
 * ($XDG_CACHE_HOME/moe if XDG_CACHE_HOME is an absolute path, else
 * $HOME/.cache/moe): ".../moe/latency-<16 hex digits of a hash of key>.txt".
 * MOE_ERR_NOT_FOUND when neither variable gives a directory, MOE_ERR_RANGE
 * when buf is too small. */
enum moe_status moe_lat_cache_path(const char *key, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
