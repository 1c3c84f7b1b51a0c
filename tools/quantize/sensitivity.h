/*
 * sensitivity.h - EdgeMoE's per-expert sensitivity sweep (ALGORITHMS.md,
 * EdgeMoE 2): for every routed expert (l, e), the loss increase when that
 * expert alone is bound at a low stored precision and every other expert at
 * the base precision, against the all-base model.
 *
 * Sequences run one at a time. For each, one baseline pass records the
 * residual stream entering every layer, the gate inputs and routing of every
 * MoE layer, and the baseline next-token log-probabilities. Then for each
 * expert routed to in the sequence, only what the change touches is
 * recomputed: at layer l the expert's own output changes only for the tokens
 * routed to it, so layer l's output is the cached one plus
 * g * (E_low(x) - E_base(x)) on those rows (attention and the other experts
 * of layer l are not rerun); then layers l+1.. run from that residual stream
 * (moe_session_forward_from), or, after the model's last layer, only the
 * changed rows go through the LM head. An expert not routed to in a sequence
 * adds nothing and costs nothing. The naive method (one full forward pass per
 * expert) is kept as the reference the cached one is tested against.
 *
 * Metrics, all as means over the sweep's scored positions: KL(P_base ||
 * P_low) of the next-token distributions (every position), the increase of
 * the negative log-likelihood of the true next token (all but the last
 * position of each sequence), and the proxy: the squared norm of the
 * gate-weighted output error g * (E_low(x) - E_base(x)) summed over the
 * tokens routed to the expert, which needs no pass beyond the baseline.
 *
 * Sums are accumulated per sequence in a fixed order (double precision), so a
 * sweep split across runs (moe_sens_state saved and restored) gives bit for
 * bit the result of one run. Not thread-safe per model: the sweep rebinds the
 * model's experts while it runs (and restores them to base on return).
 *
 * Sharding (a cluster's job array): a shard i of N sweeps the experts whose
 * flat index (MoE layer * n_expert + expert) is i mod N, over all sequences.
 * Experts, not sequences, are split because an expert's sums depend only on
 * its own recomputation over the sequences and on the baseline pass, which
 * every shard runs identically: each expert's sums are then bit for bit those
 * of a whole run, and a merge only picks each expert's sums from the shard
 * that owns it. Splitting sequences would instead add per-shard partial sums,
 * a different order of floating-point additions than one run's. The price is
 * the baseline pass, repeated by every shard: one pass over the data of the
 * (n_moe * n_expert + 1) a naive sweep costs. Interleaving (i mod N) rather
 * than contiguous ranges balances the work: an expert of a low layer costs
 * more (every layer above it is recomputed) than one of the last layer.
 *
 * Two levels: moe_sens_run adds sequences to in-memory sums (the core, which
 * tests compare against a naive sweep); moe_sensitivity_run is the whole
 * stage - checkpoints, --resume, stop-after, cancellation, the results file -
 * and moe_sensitivity_merge joins shard files into that file.
 */
#ifndef MOE_SENSITIVITY_H
#define MOE_SENSITIVITY_H

#include <stdint.h>

#include "moe-model.h"
#include "moe-status.h"

enum moe_sens_metric { MOE_SENS_KL = 0, MOE_SENS_PPL = 1, MOE_SENS_PROXY = 2 };
enum moe_sens_method { MOE_SENS_CACHED = 0, MOE_SENS_NAIVE = 1 };

struct moe_sens_params {
    int low, base;                /* stored precision indices (moe_bundle_precision_at) */
    enum moe_sens_metric metric;  /* PROXY skips the LM head and every recomputation */
    enum moe_sens_method method;
    int n_threads;                /* 0 = all online CPUs */
    int shard_index, shard_count; /* sweep only experts with flat index % shard_count == shard_index;
                                   * shard_count 0 or 1 = every expert */
    /* optional progress, after each sequence: sequences done (of the whole
     * sweep), in all, seconds spent in this call */
    void (*on_seq)(int done, int total, double seconds, void *user);
    void *user;
    const char *device;           /* the backend to run on (moe_session_params.device; NULL = cpu) */
    const void *device_options;   /* its options (struct moe_gpu_params *; borrowed), or NULL */
};

struct moe_sens_params moe_sens_default_params(void);

/* The running sums of a sweep: what a checkpoint saves. Arrays are
 * [n_moe x n_expert] over MoE layers (dense layers are left out), owned. */
struct moe_sens_state {
    int n_moe, n_expert, n_seq, n_ctx;
    int next_seq;          /* sequences [0, next_seq) are in the sums */
    double *kl;            /* sum over positions of KL(P_base || P_low) */
    double *dnll;          /* sum over scored positions of NLL_low - NLL_base */
    double *proxy;         /* sum of ||g (E_low(x) - E_base(x))||^2 over routed tokens */
    int64_t *routed;       /* token-slots routed to the expert */
    int64_t n_kl, n_nll;   /* positions in the KL and NLL sums */
    double base_nll;       /* sum of the baseline NLL over the scored positions */
    double seconds;        /* time spent in the sweep */
    double base_seconds;   /* of it, in the baseline passes (forward and LM head) */
};

/* moe_sens_state_init: zero sums for a sweep of n_seq sequences of n_ctx
 * tokens over model m (a bundle). Free with moe_sens_state_clear. */
enum moe_status moe_sens_state_init(struct moe_sens_state *s, const struct moe_model *m, int n_seq, int n_ctx);
void moe_sens_state_clear(struct moe_sens_state *s);

/* moe_sens_run: add sequences [s->next_seq, seq_end) of `tokens` (n_seq
 * sequences of n_ctx ids, row-major) to the sums and advance next_seq. The
 * model must be a bundle storing both precisions; every routed expert is
 * bound at p->base on return. Stops early, with MOE_OK, when *stop becomes
 * non-zero between sequences (stop may be NULL). */
enum moe_status moe_sens_run(struct moe_model *m, const int32_t *tokens, const struct moe_sens_params *p,
                             struct moe_sens_state *s, int seq_end, const volatile int *stop);

/* moe_sens_default_pair: the smallest stored expert precision (by bytes of
 * the first MoE layer's expert 0) as *low and the next larger as *base (-1
 * when the bundle stores only one). */
void moe_sens_default_pair(const struct moe_model *m, int *low, int *base);

/* moe_sens_scores: the per-expert score the metric ranks by, [n_moe x
 * n_expert]: mean KL per position, mean NLL increase per scored position, or
 * the proxy per position. */
void moe_sens_scores(const struct moe_sens_state *s, enum moe_sens_metric metric, double *out);

/* moe_sens_order: indices (MoE layer * n_expert + expert) least sensitive
 * first (ties: lower index first). */
void moe_sens_order(const double *score, int n, int32_t *order);

/* moe_spearman: Spearman rank correlation of a and b (average ranks for
 * ties); NAN when n < 2 or either is constant. */
double moe_spearman(const double *a, const double *b, int n);

/* ---- the stage: checkpoints, resume, shards, results file -------------- */

/* What moe_sensitivity_run does besides the sweep. Start from
 * moe_sensitivity_default_params(). Strings are borrowed for the call. */
struct moe_sensitivity_params {
    struct moe_sens_params sweep; /* precisions, metric, method, threads, shard; its on_seq and user are
                                   * not used (see progress) */
    const char *out;              /* the results file (.h5): written when every sequence is done; for a
                                   * shard (shard_count > 1) a shard file for moe_sensitivity_merge */
    const char *checkpoint;       /* progress file; NULL = OUT.partial */
    int resume;                   /* continue from the checkpoint if it exists; its settings (context,
                                   * precisions, metric, method, sequences, token count, shard) must equal
                                   * these, else MOE_ERR_INVALID */
    double checkpoint_every;      /* save progress at most every this many seconds (default 30) */
    int stop_after;               /* sequences in this call at most (0 = to the end) */
    const char *model_name;       /* recorded in the file (the path given); NULL = "" */
    const char *dataset_name;     /* recorded in the file (the dataset spec); NULL = "" */
    int64_t stream_tokens;        /* the token stream's length before cutting into sequences: part of
                                   * the settings a resume and a merge must agree on */
    /* optional: called once before the first sequence (done = sequences already in the sums: > 0
     * after a resume; seconds 0) and after each sequence (seconds spent in this call) */
    void (*progress)(int done, int total, double seconds, void *user);
    void *user;
    const volatile int *cancel;   /* optional: when non-zero (a signal handler may set it), stop after
                                   * the current sequence and save progress */
};

struct moe_sensitivity_params moe_sensitivity_default_params(void);

/* What a run (or a merge) leaves. Free with moe_sensitivity_result_clear. */
struct moe_sensitivity_result {
    struct moe_sens_state state;  /* the sums (owned); state.next_seq < state.n_seq when stopped early */
    int32_t *moe_layer;           /* [state.n_moe] model layer of each MoE layer (owned) */
    char low[32], base[32];       /* precision names */
    enum moe_sens_metric metric;
    enum moe_sens_method method;
    char *model, *dataset;        /* as recorded in the file (owned) */
    int shard_index, shard_count; /* of a shard run; 0 and 1 for a whole run or a merge */
    int complete;                 /* every sequence is in; OUT is written and the checkpoint removed */
    int resumed_at;               /* the sequence a resume continued from; -1 when it started fresh */
    double spearman;              /* proxy vs the metric (complete kl/ppl runs and merges); NAN otherwise */
    int n_shards_merged;          /* moe_sensitivity_merge: files joined; 0 for a run */
};

/* moe_sensitivity_run: the sweep of n_seq sequences of n_ctx tokens
 * (`tokens`, row-major, BOS placed by the caller) over bundle m, expert
 * precisions bound at p->sweep.base on entry and on return. Saves progress
 * to the checkpoint every p->checkpoint_every seconds, when p->cancel is set
 * and when stop_after is reached; on completion writes p->out (atomically)
 * and removes the checkpoint. Returns MOE_OK with r->complete = 0 when it
 * stopped early (cancel or stop_after; continue with resume = 1), MOE_OK with
 * r->complete = 1 when done, or an error (logged with MOE_LOGE: the sweep,
 * an unreadable or mismatched checkpoint, a failed write; for a complete
 * kl/ppl sweep also a non-finite result, MOE_ERR_RANGE). r is filled in every
 * case (cleared on entry). Blocks; not thread-safe per model (see above). */
enum moe_status moe_sensitivity_run(struct moe_model *m, const int32_t *tokens, int n_seq, int n_ctx,
                                    const struct moe_sensitivity_params *p, struct moe_sensitivity_result *r);

/* moe_sensitivity_merge: join the n shard files paths[0..n) (each written by
 * a complete moe_sensitivity_run with shard_count = N) into `out`, which then
 * holds exactly what one run over all experts writes: the same sums, scores,
 * ranking and Spearman agreement, bit for bit when the shards ran the same
 * build with the same thread count on the same kind of CPU (each expert's sums come from the one shard
 * that swept it; the positions and baseline NLL, equal in every shard, are
 * taken from the first). Cost: sensitivity.cost's seconds are the shards'
 * total, its baseline seconds the shards' mean (one baseline pass over the
 * data), so the forward equivalents count every shard's repeated baseline.
 * Refused (MOE_ERR_INVALID, logged naming the files): files of another
 * model, dataset, precisions, metric, method, context or sequence count; an
 * unfinished shard; a file that is no shard file; shards of different N; a
 * shard given twice; a missing shard (every index 0..N-1 exactly once); a
 * baseline NLL that differs by more than 1e-9 relative. Unreadable files:
 * that file's error. r is filled as by moe_sensitivity_run (model and dataset
 * from the files). Not thread-safe (HDF5). */
enum moe_status moe_sensitivity_merge(const char *const *paths, int n, const char *out,
                                      struct moe_sensitivity_result *r);

/* moe_sensitivity_result_clear: free what r owns and zero it. */
void moe_sensitivity_result_clear(struct moe_sensitivity_result *r);

/* moe_sens_metric_name / moe_sens_method_name: "kl", "ppl", "proxy" /
 * "cached", "naive". */
const char *moe_sens_metric_name(enum moe_sens_metric metric);
const char *moe_sens_method_name(enum moe_sens_method method);

#endif
