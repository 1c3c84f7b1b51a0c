/*
 * inspect.h - what a bundle (.moeb) holds, as a struct or as cJSON, and
 * optionally whether every checksum matches and the bundle binds as a model:
 * the library half of `moe-prep inspect` (the command is inspect-cmd.c).
 *
 * Thread safety: moe_inspect_bundle with verify swaps the process-wide log
 * callback (moe_log_set) while it binds the model, to capture the reason of a
 * failure: do not run it concurrently with other code that logs or sets the
 * callback. Without verify, calls on different structs may run concurrently.
 */
#ifndef MOE_INSPECT_H
#define MOE_INSPECT_H

#include <stddef.h>
#include <stdint.h>

#include "moe-bundle.h"
#include "moe-model.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One damaged item found by verification (owned strings). */
struct moe_inspect_damage {
    char *item;    /* e.g. "layer 3 expert 17 precision q4_k", or "model" for a binding failure */
    char *problem; /* e.g. "checksum mismatch" */
};

struct moe_inspect {
    char *path;                   /* a copy of the path given (owned) */
    struct moe_bundle *bundle;    /* the open bundle (owned); the borrowed strings below live in it */
    struct moe_bundle_info info;  /* version, file size, reclaimable bytes, ... */
    int have_config;              /* hf.config.json present and parsed into cfg */
    struct moe_config cfg;        /* owned when have_config */
    uint32_t n_layers, n_moe_layers, n_experts, n_precisions; /* the expert layout */
    size_t n_tensors;             /* non-expert tensors */
    uint64_t dense_bytes;         /* their stored bytes */
    const char *dense_type;       /* quant.dense, or NULL */
    const struct moe_bundle_kv *tuning; /* the tuning section, or NULL */
    size_t n_tuning_keys;
    /* provenance.* strings, NULL when absent */
    const char *source, *tool, *created, *command_line;
    /* Verification (moe_inspect_bundle with verify): every checksum, then,
     * if all match, the model binding. */
    int verified;                 /* verification ran */
    int n_damaged;
    struct moe_inspect_damage *damaged; /* [n_damaged] (owned) */
};

/* moe_inspect_bundle: open the bundle at `path` and fill *out; with verify,
 * also check every checksum (header, directory, tensors, every expert blob,
 * tuning slots) and, when they all match, that the bundle binds as a model
 * (shapes, stored sizes, constants): each problem becomes an entry of
 * out->damaged. Returns MOE_OK (also when items are damaged: see n_damaged),
 * the open's error (logged) if the file is not a readable bundle, or
 * MOE_ERR_NOMEM. Free with moe_inspect_clear (also after an error). */
enum moe_status moe_inspect_bundle(const char *path, int verify, struct moe_inspect *out);

/* moe_inspect_clear: free what *r owns and zero it. */
void moe_inspect_clear(struct moe_inspect *r);

/* moe_inspect_bits_per_weight: bits per weight of a precision's blob: the
 * parts' bytes over their weights (0 for an empty layout). */
double moe_inspect_bits_per_weight(const struct moe_bundle_precision *p);

/* moe_inspect_to_json: *r as the object `moe-prep inspect --json` prints:
 * path, format_version, file_bytes, the config's architecture, hidden, vocab
 * and experts_per_token (when present), layers, moe_layers, experts,
 * precisions [{name, part_types, blob_bytes, total_bytes, bits_per_weight}],
 * dense_tensors, dense_bytes, dense_type, tuning, tuning_keys,
 * reclaimable_bytes, source, tool, created, command_line, and after
 * verification verified and damaged [{item, problem}]. The caller owns the
 * tree (cJSON_Delete); NULL when out of memory. */
struct cJSON *moe_inspect_to_json(const struct moe_inspect *r);

#ifdef __cplusplus
}
#endif

#endif
