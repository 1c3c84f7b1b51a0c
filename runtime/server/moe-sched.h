/*
 * moe-sched.h - the server's engine: one thread that owns the model's
 * session(s) and decodes every admitted request together (continuous
 * batching), fed by a bounded queue.
 *
 * A request is a prompt (token ids) and its generation settings. It waits in
 * the queue until one of the n_parallel sequences is free; it is then
 * prefilled (its prompt run on its own sequence between two steps) and from
 * then on takes part in every step: a step collects the next token of every
 * active sequence and runs them in one batched call, so an expert loaded for
 * one request serves every request routed to it in that step. Each request
 * samples with its own sampler (moe-sampler.h), and stops at an end-of-
 * sequence token, a stop token, a stop string (the text is cut before it),
 * max_tokens or the end of its sequence's context.
 *
 * Thread-safety: every function may be called from any thread; the engine
 * thread is the only one that touches the session. A request handle is held
 * by its submitter until moe_sched_release.
 */
#ifndef MOE_SCHED_H
#define MOE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "moe-model.h"
#include "moe-session.h"
#include "moe-status.h"
#include "moe-store.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_sched_params {
    int n_parallel;       /* sequences decoded together (each its own KV cache); >= 1 */
    int queue;            /* requests that may wait for a sequence; >= 0 */
    const struct moe_session_params *session; /* n_ctx is per sequence (borrowed for the call) */
    int sequential;       /* 1: one session per sequence, stepped one after another (the
                           * fallback where the backend has no per-sequence KV cache;
                           * for comparisons); 0: one session, batched decode */
};

/* One request's generation settings (copied by submit). */
struct moe_gen_params {
    int max_tokens;              /* >= 1; INT32_MAX: until the context ends */
    float temperature, top_p;    /* moe-sampler.h's meaning */
    uint64_t seed;
    const char *const *stop;     /* stop strings (n_stop of them) */
    int n_stop;
    const int32_t *stop_ids;     /* token ids that end the request (the template's end-of-turn) */
    int n_stop_ids;
    int ignore_eos;              /* 1: no token ends the request (neither the model's
                                  * end-of-sequence ids nor stop_ids); stop strings,
                                  * max_tokens and the context still do */
};

enum moe_finish { MOE_FINISH_NONE = 0, MOE_FINISH_STOP, MOE_FINISH_LENGTH, MOE_FINISH_CANCELLED, MOE_FINISH_ERROR };

/* What a request has produced so far (moe_sched_poll). */
struct moe_sched_progress {
    size_t text_len;        /* bytes of text that are final (safe to send): no
                             * partial UTF-8 character, no text that may be the
                             * start of a stop string */
    int n_gen;              /* tokens sampled */
    int n_prompt;
    enum moe_finish finish; /* NONE while running */
    enum moe_status error;  /* with MOE_FINISH_ERROR */
};

struct moe_sched_stats {
    int n_parallel, queue_cap;
    int queue_depth, active;
    int64_t submitted, rejected_full, finished_stop, finished_length, cancelled, failed;
    int64_t prompt_tokens, gen_tokens;  /* prefilled and sampled tokens */
    int64_t steps, step_tokens;         /* batched decode steps and the tokens they ran */
    double prefill_s, decode_s;         /* engine time in each */
    int batched;                        /* 1: one session, batched decode; 0: one session per sequence */
    int have_store;                     /* an expert budget: store holds the counts summed over sessions */
    struct moe_store_stats store;
    struct moe_big_little_stats big_little; /* summed over sessions (all 0 when it is off) */
};

struct moe_sched;
struct moe_sched_req;

/* moe_sched_create: the sessions (model borrowed: it must outlive the
 * scheduler) and the engine thread. */
enum moe_status moe_sched_create(const struct moe_model *m, const struct moe_sched_params *p, struct moe_sched **out);

/* moe_sched_n_ctx: each sequence's context length. */
int moe_sched_n_ctx(const struct moe_sched *s);

/* moe_sched_backend: the backend of the (first) session, for repacking. */
const struct moe_backend *moe_sched_backend(const struct moe_sched *s);

/* moe_sched_submit: queue a request for prompt[0..n) (copied). MOE_ERR_RANGE:
 * the queue is full (nothing queued); MOE_ERR_INVALID: an empty prompt, a
 * prompt of n_ctx tokens or more, or bad sampling settings; MOE_ERR_CANCELLED:
 * the scheduler is shutting down. */
enum moe_status moe_sched_submit(struct moe_sched *s, const int32_t *prompt, int n, const struct moe_gen_params *g,
                                 struct moe_sched_req **out);

/* moe_sched_wait: wait up to timeout_s seconds for progress beyond
 * (text_len, finish) = (have_len, not finished), then fill *p. Returns 1 when
 * there is new final text or the request finished, 0 on timeout. */
int moe_sched_wait(struct moe_sched_req *r, size_t have_len, double timeout_s, struct moe_sched_progress *p);

/* moe_sched_text: copy final text bytes [from, to) (to <= progress.text_len)
 * into dst. */
void moe_sched_text(struct moe_sched_req *r, size_t from, size_t to, char *dst);

/* moe_sched_cancel: stop the request; its sequence is freed before the next
 * step. No-op when it has finished. */
void moe_sched_cancel(struct moe_sched_req *r);

/* moe_sched_release: the submitter's handle given back (cancels it first if
 * it is still running). NULL is a no-op. */
void moe_sched_release(struct moe_sched_req *r);

/* moe_sched_get_stats: the counts so far (the store's as of the last step). */
void moe_sched_get_stats(struct moe_sched *s, struct moe_sched_stats *out);

/* moe_sched_shutdown: finish every request (MOE_FINISH_CANCELLED), refuse new
 * ones and join the engine thread. Waiters wake. Idempotent. */
void moe_sched_shutdown(struct moe_sched *s);

/* moe_sched_free: shutdown, then free. Every request must have been
 * released. NULL is a no-op. */
void moe_sched_free(struct moe_sched *s);

#ifdef __cplusplus
}
#endif
#endif
