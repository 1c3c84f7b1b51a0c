/*
 * profile-h5.h - a routing profile (what `moe-prep profile` records over
 * calibration data) and its HDF5 file: model attributes, the routing trace,
 * counts that merge by addition (popularity, per-sequence popularity, HOBBIT
 * score histogram per rank) and a free-form group of derived results (named
 * float64 / int64 / int32 arrays) that other modules add without changing
 * this one. The layout is in docs/format.md, "Profile files (HDF5)"; plain
 * datasets and attributes, so h5py reads it.
 *
 * Ownership: a struct moe_profile owns every array it points to; free it with
 * moe_profile_free(). Not thread-safe per object. moe_profile_write() and
 * moe_profile_read() call the HDF5 library, which (serial build) is not
 * thread-safe: call them from one thread at a time. They switch HDF5's own
 * error printing off while they run and restore it afterwards; every failure
 * is logged once through moe_log and returned.
 */
#ifndef MOE_PROFILE_H5_H
#define MOE_PROFILE_H5_H

#include <stddef.h>
#include <stdint.h>

#include "moe-status.h"
#include "moe-trace.h"

#define MOE_PROFILE_FORMAT "moe-profile"
#define MOE_PROFILE_VERSION 1
#define MOE_PROFILE_MAX_DIMS 8      /* of a derived array */
#define MOE_PROFILE_MAX_NAME 63     /* of a derived array: [A-Za-z0-9_.-], no '/' */
#define MOE_PROFILE_DEFAULT_BINS 1000
#define MOE_PROFILE_MAX_ELEMS ((int64_t)1 << 36) /* per dataset; larger is rejected as damaged */
#define MOE_PROFILE_SUM_PREFIX "sum."       /* derived arrays that merge by addition */
#define MOE_PROFILE_CONFIG_PREFIX "config." /* derived arrays that must be equal to merge */

/* How router logits are kept, if at all. */
enum moe_profile_logits {
    MOE_PROFILE_LOGITS_NONE = 0,
    MOE_PROFILE_LOGITS_F16 = 1, /* IEEE half, stored as raw uint16_t bits */
    MOE_PROFILE_LOGITS_F32 = 2,
};

/* Element type of a derived array. */
enum moe_profile_dtype { MOE_PROFILE_F64 = 0, MOE_PROFILE_I64 = 1, MOE_PROFILE_I32 = 2 };

/* One derived array (e.g. "thresholds" [2]); owned by the profile. */
struct moe_profile_array {
    char name[MOE_PROFILE_MAX_NAME + 1];
    enum moe_profile_dtype dtype;
    int ndims;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    void *data; /* row-major, prod(dims) elements */
};

struct moe_profile {
    /* model attributes (owned strings, never NULL; "" when unknown) */
    char *arch;         /* model architecture, e.g. "mixtral" */
    char *model_path;
    char *dataset;      /* dataset spec the profile was recorded on */
    char *tool_version;
    int n_layers;       /* MoE layers */
    int n_experts;
    int k;              /* experts per token */
    int32_t *moe_layer_index; /* [n_layers] MoE layer -> model layer */

    /* trace */
    int n_seq;
    int64_t *seq_start; /* [n_seq + 1]; seq_start[0] = 0, seq_start[n_seq] = n_tokens */
    int16_t *experts;   /* [n_tokens x n_layers x k] */
    float *weights;     /* [n_tokens x n_layers x k] */
    enum moe_profile_logits logits;
    void *router_logits; /* [n_tokens x n_layers x n_experts] uint16_t (f16 bits) or float; NULL if NONE */

    /* counts (merge by addition) */
    int64_t *popularity;     /* [n_layers x n_experts] */
    int64_t *seq_popularity; /* [n_seq x n_layers x n_experts] */
    int n_bins;              /* HOBBIT histogram bins over [0, 1] */
    int64_t *hobbit_hist;    /* [k x n_bins]; bin of s = min(floor(s * n_bins), n_bins - 1) */

    /* derived results: use moe_profile_put_* / moe_profile_get_* */
    int n_derived;
    struct moe_profile_array *derived;
};

/* moe_profile_new: an empty profile (no sequences, zero counts) of the given
 * shape; moe_layer_index is the identity and the strings are "". n_bins <= 0
 * selects MOE_PROFILE_DEFAULT_BINS. Returns MOE_ERR_INVALID on a bad shape. */
enum moe_status moe_profile_new(int n_layers, int n_experts, int k, int n_bins, enum moe_profile_logits logits,
                                struct moe_profile **out);

/* moe_profile_free: frees p and everything it owns; NULL is a no-op. */
void moe_profile_free(struct moe_profile *p);

/* moe_profile_set_meta: replace the model attribute strings (copied; NULL
 * leaves that string unchanged). */
enum moe_status moe_profile_set_meta(struct moe_profile *p, const char *arch, const char *model_path,
                                     const char *dataset, const char *tool_version);

/* moe_profile_n_tokens: tokens in the trace. */
static inline int64_t moe_profile_n_tokens(const struct moe_profile *p) { return p->seq_start[p->n_seq]; }

/* moe_profile_add_trace: append the sequences of t (same n_layers, n_experts,
 * k) and add its counts: popularity, per-sequence popularity and the HOBBIT
 * score histogram. router_logits [n_tokens(t) x n_layers x n_experts] must be
 * given iff the profile keeps logits (converted to f16 if that is its mode).
 * The trace is checked (moe_trace_check) first; on error p is unchanged. */
enum moe_status moe_profile_add_trace(struct moe_profile *p, const struct moe_trace *t, const float *router_logits);

/* moe_profile_trace: a view of the profile's trace for routing-stats; the
 * pointers are borrowed from p and valid until p is next modified or freed. */
void moe_profile_trace(const struct moe_profile *p, struct moe_trace *out);

/* moe_profile_put_f64 / _i64 / _i32: store a copy of a derived array under
 * `name` (replacing one of that name). ndims in 1..MOE_PROFILE_MAX_DIMS, each
 * dim >= 0. Written to /derived/<name>. */
enum moe_status moe_profile_put_f64(struct moe_profile *p, const char *name, int ndims, const int64_t *dims,
                                    const double *data);
enum moe_status moe_profile_put_i64(struct moe_profile *p, const char *name, int ndims, const int64_t *dims,
                                    const int64_t *data);
enum moe_status moe_profile_put_i32(struct moe_profile *p, const char *name, int ndims, const int64_t *dims,
                                    const int32_t *data);

/* moe_profile_get_f64 / _i64 / _i32: the derived array `name` (data borrowed
 * from p, valid until p is modified or freed). ndims and dims (room for
 * MOE_PROFILE_MAX_DIMS) may be NULL. MOE_ERR_NOT_FOUND if absent,
 * MOE_ERR_SHAPE if it has another element type. */
enum moe_status moe_profile_get_f64(const struct moe_profile *p, const char *name, int *ndims, int64_t *dims,
                                    const double **data);
enum moe_status moe_profile_get_i64(const struct moe_profile *p, const char *name, int *ndims, int64_t *dims,
                                    const int64_t **data);
enum moe_status moe_profile_get_i32(const struct moe_profile *p, const char *name, int *ndims, int64_t *dims,
                                    const int32_t **data);

/* moe_profile_clear_derived: drop every derived array. */
void moe_profile_clear_derived(struct moe_profile *p);

/* moe_profile_write: write p to `path`. The HDF5 file is built in memory
 * (the core driver; HDF5 never writes to disk itself), then written to a new
 * temporary file beside path (moe_tmp_create: exclusive, never through a
 * symlink), fsynced and renamed over path: an interrupted run or a full disk
 * leaves no partial file and the old one intact, and is reported as
 * MOE_ERR_IO. Trace datasets are chunked and deflate-compressed. */
enum moe_status moe_profile_write(const struct moe_profile *p, const char *path);

/* moe_profile_read: load and validate a profile file: HDF5 at all, format
 * "moe-profile", a supported version, every dataset present with the shape the
 * attributes imply, expert ids in range, seq_start from 0 and non-decreasing,
 * sizes within MOE_PROFILE_MAX_ELEMS. Errors: MOE_ERR_IO (cannot open),
 * MOE_ERR_FORMAT (not HDF5 / not a profile / damaged), MOE_ERR_UNSUPPORTED
 * (version), MOE_ERR_NOT_FOUND (missing dataset), MOE_ERR_SHAPE, MOE_ERR_RANGE.
 * On success *out is a new profile owned by the caller. */
enum moe_status moe_profile_read(const char *path, struct moe_profile **out);

/* moe_profile_encode / moe_profile_decode: the stream in which
 * moe_profile_read's child process hands a profile to its parent (libhdf5
 * runs in the child; see docs/format.md, "Containment"). encode writes p to
 * fd (MOE_ERR_IO on a write error); decode reads a stream from fd into a new
 * profile, checking every count and size against the limits above before
 * allocating, and validating the result as moe_profile_read validates a file
 * (MOE_ERR_FORMAT for a short or inconsistent stream; label names it in
 * messages). Public for the round-trip test and the fuzz target. */
enum moe_status moe_profile_encode(int fd, const struct moe_profile *p);
enum moe_status moe_profile_decode(int fd, const char *label, struct moe_profile **out);

/* moe_profile_merge: add shard src into dst. Requires the same arch,
 * model_path, n_layers, n_experts, k, n_bins, logits mode and
 * moe_layer_index (MOE_ERR_INVALID otherwise; dataset and tool_version are not
 * compared, dst keeps its own). Derived arrays named "sum.*" (sums gathered
 * while recording, which only the run itself could compute) must be in both
 * with the same type and shape, and are added; "config.*" arrays (the
 * settings of the run) must be in both and equal, and are kept; every other
 * derived array of dst is dropped (the caller recomputes them). The sequences
 * of src are appended and counts and histograms added. On error dst is
 * unchanged. */
enum moe_status moe_profile_merge(struct moe_profile *dst, const struct moe_profile *src);

#endif
