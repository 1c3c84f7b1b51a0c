/*
 * sensitivity-impl.h - private to sensitivity.c and sensitivity-merge.c: the
 * sensitivity file (a profile-format HDF5 file without a trace) written and
 * read. Not installed; no other stage includes it.
 *
 * A file holds config.sensitivity (the settings, SENS_CFG_*), the running
 * sums and progress (sensitivity.progress, .times, .sum_kl, .sum_dnll,
 * .sum_proxy, .routed), for a shard sensitivity.shard = {index, count}, and
 * when final the results (sensitivity.kl, .dnll, .proxy, .score, .order,
 * .spearman_proxy, .cost).
 */
#ifndef MOE_SENSITIVITY_IMPL_H
#define MOE_SENSITIVITY_IMPL_H

#include "profile-h5.h"
#include "sensitivity.h"

/* The sweep's settings, stored as config.sensitivity; a checkpoint resumes
 * and shards merge only under equal settings. */
enum { SENS_CFG_CTX, SENS_CFG_LOW, SENS_CFG_BASE, SENS_CFG_METRIC, SENS_CFG_METHOD, SENS_CFG_NSEQ, SENS_CFG_STREAM,
       SENS_CFG_N };

/* What a file records besides the sums (borrowed). */
struct sens_meta {
    int n_moe, n_expert, top_k;
    const int32_t *moe_layer; /* [n_moe] */
    const char *arch, *model, *dataset, *version;
    enum moe_sens_metric metric;
};

/* sens_state_alloc: zero sums of the given shape (moe_sens_state_init without a model). */
enum moe_status sens_state_alloc(struct moe_sens_state *s, int n_moe, int n_expert, int n_seq, int n_ctx);

/* sens_save: write s (and, when final, the results; *rho gets the Spearman
 * agreement) to path atomically; shard_count > 1 adds sensitivity.shard. */
enum moe_status sens_save(const struct sens_meta *meta, const struct moe_sens_state *s, const double *cfg,
                          int shard_index, int shard_count, const char *path, int final, double *rho);

/* sens_state_get: restore the sums of file p (named path) into s, already
 * allocated to the file's shape with n_seq set. The file's settings go to
 * cfg_out[SENS_CFG_N] and its shard to shard[2] ({0, 1} without one). */
enum moe_status sens_state_get(const struct moe_profile *p, const char *path, struct moe_sens_state *s,
                               double *cfg_out, int *shard);

/* sens_result_names: fill r's names (low, base, metric, method) from the
 * file's version string and settings; 0 if the version string is not ours. */
int sens_result_names(struct moe_sensitivity_result *r, const char *version, const double *cfg);

#endif
