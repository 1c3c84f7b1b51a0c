/*
 * scheduler.c - the server's engine thread, queue and continuous batching
 * (moe-sched.h).
 *
 * Locking: one mutex (s->mu) guards the queue, the slots' assignment and
 * every request's shared fields (text, progress, cancel flag); the engine
 * thread drops it while it runs the model and decodes text. Each request
 * has its own condition variable its waiter sleeps on.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-base.h"
#include "moe-sampler.h"
#include "moe-sched.h"
#include "moe-tokenizer.h"

struct moe_sched_req {
    struct moe_sched *s;
    int refs;                    /* submitter + engine (queue or slot) */
    int32_t *ids;                /* [n_prompt + max generated] prompt, then sampled tokens */
    int n_prompt, n_gen, cap;
    int max_tokens;
    char **stop;                 /* owned copies */
    int n_stop;
    size_t max_stop;             /* longest stop string */
    int32_t *stop_ids;
    int n_stop_ids;
    int ignore_eos;
    struct moe_sampler *sampler;
    int slot;                    /* -1 while queued */
    /* shared under s->mu */
    char *text;                  /* generated text (malloc'd), text_len bytes of it final */
    size_t text_len;
    enum moe_finish finish;
    enum moe_status error;
    int cancel;
    pthread_cond_t cv;
    struct moe_sched_req *next;  /* queue link */
};

/* The sequences the engine decodes, behind these calls: one session holding
 * every sequence, decoded in one batched call per step (moe_session_n_seq >
 * 1), or, where the backend has no per-sequence KV cache (the session says
 * MOE_ERR_UNSUPPORTED), one session per sequence, stepped one after another
 * (same tokens, experts not shared). */
struct engine {
    struct moe_session **sess;   /* [n_sess]: 1 batched, else one per sequence */
    int n_sess, batched;
};

struct moe_sched {
    const struct moe_model *m;
    struct engine eng;
    int n_par, queue_cap, n_ctx, n_vocab;
    pthread_mutex_t mu;
    pthread_cond_t work;
    pthread_t thread;
    int have_thread, stop;
    struct moe_sched_req *head, *tail;  /* the queue */
    int queue_depth, active;
    struct moe_sched_req **slots;       /* [n_par] */
    float *logits;                      /* [n_par x n_vocab] */
    int32_t *step_tok;
    int *step_seq;
    struct moe_sched_stats st;
};

/* ---- the engine: prefill one sequence, step several ---------------------- */

static enum moe_status eng_create(struct engine *e, const struct moe_model *m, const struct moe_session_params *sp,
                                  int n_seq, int sequential) {
    if (!(e->sess = calloc((size_t)n_seq, sizeof *e->sess))) return MOE_ERR_NOMEM;
    struct moe_session_params p = *sp;
    p.n_seq = n_seq;
    enum moe_status st = n_seq > 1 && !sequential ? moe_session_create(m, &p, &e->sess[0]) : MOE_ERR_UNSUPPORTED;
    if (st == MOE_OK) {
        e->n_sess = 1, e->batched = 1;
        return MOE_OK;
    }
    if (st != MOE_ERR_UNSUPPORTED) return st;
    if (n_seq > 1 && !sequential) MOE_LOGW("this backend has no per-sequence KV cache: %d sessions, decoded one after another", n_seq);
    p.n_seq = 1;
    for (e->n_sess = 0; e->n_sess < n_seq; e->n_sess++)
        if ((st = moe_session_create(m, &p, &e->sess[e->n_sess])) != MOE_OK) return st;
    return MOE_OK;
}

static void eng_free(struct engine *e) {
    for (int i = 0; i < e->n_sess; i++) moe_session_free(e->sess[i]);
    free(e->sess);
}

/* eng_prefill: forget sequence `seq` and run prompt[0..n) on it; logits of
 * the last token into `logits` [n_vocab]. */
static enum moe_status eng_prefill(struct engine *e, int seq, const int32_t *prompt, int n, float *logits) {
    if (e->batched) {
        moe_session_seq_reset(e->sess[0], seq);
        return moe_session_forward_seq(e->sess[0], seq, prompt, n, logits, 0);
    }
    moe_session_reset(e->sess[seq]);
    return moe_session_forward(e->sess[seq], prompt, n, logits, 0);
}

/* eng_step: one token for each of seqs[0..n) (distinct); logits [n x n_vocab]. */
static enum moe_status eng_step(struct engine *e, const int *seqs, const int32_t *tokens, int n, float *logits,
                                size_t n_vocab) {
    if (e->batched) return moe_session_decode_batch(e->sess[0], seqs, tokens, n, logits);
    for (int i = 0; i < n; i++) {
        const enum moe_status st = moe_session_forward(e->sess[seqs[i]], &tokens[i], 1, logits + (size_t)i * n_vocab, 0);
        if (st != MOE_OK) return st;
    }
    return MOE_OK;
}

/* eng_store_stats: the stores' counts summed (0 without a budget). */
static int eng_store_stats(const struct engine *e, struct moe_store_stats *sum) {
    int have = 0;
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < e->n_sess; i++) {
        const struct moe_store *st = moe_session_store(e->sess[i]);
        if (!st || moe_store_in_place(st)) continue;
        struct moe_store_stats x;
        moe_store_get_stats(st, &x);
        if (!have) {
            *sum = x;
        } else {
            sum->tokens += x.tokens, sum->decode_tokens += x.decode_tokens, sum->accesses += x.accesses;
            sum->hits_high += x.hits_high, sum->hits_low += x.hits_low, sum->misses_high += x.misses_high;
            sum->misses_low += x.misses_low, sum->skips += x.skips, sum->loads += x.loads;
            sum->load_bytes += x.load_bytes, sum->loads_decode += x.loads_decode;
            sum->load_bytes_decode += x.load_bytes_decode, sum->prefetch_loads += x.prefetch_loads;
            sum->prefetch_used += x.prefetch_used, sum->stall_s += x.stall_s, sum->stall_s_decode += x.stall_s_decode;
            sum->peak_resident_bytes += x.peak_resident_bytes, sum->slot_bytes += x.slot_bytes;
        }
        have = 1;
    }
    return have;
}

/* eng_big_little_stats: big-little's counts summed over the sessions. */
static void eng_big_little_stats(const struct engine *e, struct moe_big_little_stats *sum) {
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < e->n_sess; i++) {
        struct moe_big_little_stats x;
        moe_session_big_little_stats(e->sess[i], &x);
        sum->tokens += x.tokens, sum->fallbacks += x.fallbacks, sum->little_s += x.little_s, sum->big_s += x.big_s;
    }
}

/* ---- requests ---------------------------------------------------------- */

static void req_free(struct moe_sched_req *r) {
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->ids);
    free(r->text);
    moe_sampler_free(r->sampler);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* unref: drop one reference (s->mu held). */
static void unref(struct moe_sched_req *r) {
    if (--r->refs == 0) req_free(r);
}

/* finish: mark r finished (s->mu held): all its text is final; waiters wake. */
static void finish(struct moe_sched *s, struct moe_sched_req *r, enum moe_finish f, enum moe_status err) {
    if (r->finish != MOE_FINISH_NONE) return;
    r->finish = f, r->error = err;
    switch (f) {
    case MOE_FINISH_STOP: s->st.finished_stop++; break;
    case MOE_FINISH_LENGTH: s->st.finished_length++; break;
    case MOE_FINISH_CANCELLED: s->st.cancelled++; break;
    default: s->st.failed++; break;
    }
    pthread_cond_broadcast(&r->cv);
}

/* free_slot: r leaves its sequence (s->mu held). */
static void free_slot(struct moe_sched *s, struct moe_sched_req *r) {
    s->slots[r->slot] = NULL;
    r->slot = -1;
    s->active--;
    unref(r);
}

static size_t utf8_incomplete_tail(const char *t, size_t n) {
    /* bytes at the end that start a UTF-8 character not yet complete */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = (unsigned char)t[n - back];
        if ((c & 0xC0) == 0x80) continue;            /* a continuation byte: look further back */
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* held_for_stop: how many bytes at the end of t[0..n) may be the start of a
 * stop string (they are not final until the next tokens tell). */
static size_t held_for_stop(const struct moe_sched_req *r, const char *t, size_t n) {
    size_t held = 0;
    for (int i = 0; i < r->n_stop; i++) {
        const size_t L = strlen(r->stop[i]);
        for (size_t k = L - 1 < n ? L - 1 : n; k > held; k--)
            if (memcmp(t + n - k, r->stop[i], k) == 0) {
                held = k;
                break;
            }
    }
    return held;
}

/* find_stop: the earliest occurrence of a stop string in t[0..n) that ends
 * at or after byte `from`; n when none. */
static size_t find_stop(const struct moe_sched_req *r, const char *t, size_t n, size_t from) {
    size_t best = n;
    for (int i = 0; i < r->n_stop; i++) {
        const size_t L = strlen(r->stop[i]);
        const size_t start = from >= L ? from - L + 1 : 0;
        for (size_t p = start; p + L <= n && p < best; p++)
            if (memcmp(t + p, r->stop[i], L) == 0) {
                best = p;
                break;
            }
    }
    return best;
}

/* ---- the engine thread --------------------------------------------------- */

static int is_stop_token(const struct moe_sched *s, const struct moe_sched_req *r, int32_t id) {
    const struct moe_config *c = &s->m->cfg;
    if (r->ignore_eos) return 0;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    if (s->m->tok && moe_tokenizer_eos(s->m->tok) == id) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return 1;
    return 0;
}

/* accept: sample r's next token from `logits` and publish the new text.
 * Returns 1 when r goes on (its token is to be fed back), 0 when it finished. */
static int accept(struct moe_sched *s, struct moe_sched_req *r, const float *logits, int pos_after) {
    if (moe_logits_first_bad(logits, (size_t)s->n_vocab) >= 0) {
        pthread_mutex_lock(&s->mu);
        finish(s, r, MOE_FINISH_ERROR, MOE_ERR_FORMAT);
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    const int32_t tok = moe_sampler_sample(r->sampler, logits);
    r->ids[r->n_prompt + r->n_gen++] = tok;
    enum moe_finish f = MOE_FINISH_NONE;
    int n_text = r->n_gen;
    if (is_stop_token(s, r, tok)) f = MOE_FINISH_STOP, n_text--; /* the end token is not text */
    /* the text of the generated tokens, decoded after the prompt's last token so a
     * decoder that strips a leading space strips it there, not from the answer */
    char *all = NULL, *pre = NULL;
    size_t all_len = 0, pre_len = 0;
    const int32_t *from = r->ids + r->n_prompt - 1;
    const struct moe_tokenizer *tk = s->m->tok;
    if (tk && (moe_tokenizer_decode(tk, from, 1, 1, &pre, &pre_len) != MOE_OK ||
               moe_tokenizer_decode(tk, from, (size_t)n_text + 1, 1, &all, &all_len) != MOE_OK ||
               all_len < pre_len || memcmp(all, pre, pre_len) != 0)) {
        free(all);
        all = NULL, all_len = pre_len = 0;
        if (moe_tokenizer_decode(tk, r->ids + r->n_prompt, (size_t)n_text, 1, &all, &all_len) != MOE_OK)
            all = NULL, all_len = 0;
    }
    free(pre);
    size_t len = all_len - pre_len;
    if (all && pre_len) memmove(all, all + pre_len, len + 1);
    pthread_mutex_lock(&s->mu);
    s->st.gen_tokens++;
    const size_t old = r->text_len;
    const size_t cut = r->n_stop && all ? find_stop(r, all, len, old) : len;
    if (cut < len) len = cut, f = MOE_FINISH_STOP;
    if (f == MOE_FINISH_NONE && (r->n_gen >= r->max_tokens || pos_after >= s->n_ctx)) f = MOE_FINISH_LENGTH;
    if (all) {
        free(r->text);
        r->text = all;
        size_t fin = len;
        if (f == MOE_FINISH_NONE) fin -= held_for_stop(r, all, len), fin -= utf8_incomplete_tail(all, fin);
        r->text_len = fin > r->text_len ? fin : r->text_len; /* what was final stays final */
    }
    if (f != MOE_FINISH_NONE) {
        if (all) r->text_len = len;
        finish(s, r, f, MOE_OK);
    } else if (r->text_len > old) {
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return f == MOE_FINISH_NONE;
}

/* admit: move queued requests into free sequences; returns how many (s->mu held). */
static int admit(struct moe_sched *s, struct moe_sched_req **fresh) {
    int n = 0;
    for (int i = 0; i < s->n_par && s->head; i++) {
        if (s->slots[i]) continue;
        struct moe_sched_req *r = s->head;
        s->head = r->next;
        if (!s->head) s->tail = NULL;
        s->queue_depth--;
        r->next = NULL;
        if (r->cancel || r->finish != MOE_FINISH_NONE) {
            finish(s, r, MOE_FINISH_CANCELLED, MOE_OK);
            unref(r);
            i--;
            continue;
        }
        r->slot = i;
        s->slots[i] = r;
        s->active++;
        fresh[n++] = r;
    }
    return n;
}

/* drop_cancelled: free the sequences of cancelled or finished requests (s->mu held). */
static void drop_done(struct moe_sched *s) {
    for (int i = 0; i < s->n_par; i++) {
        struct moe_sched_req *r = s->slots[i];
        if (!r) continue;
        if (r->cancel) finish(s, r, MOE_FINISH_CANCELLED, MOE_OK);
        if (r->finish != MOE_FINISH_NONE) free_slot(s, r);
    }
}

/* fail_all: every active request ends with error st (s->mu held). */
static void fail_active(struct moe_sched *s, const int *seqs, int n, enum moe_status st) {
    for (int i = 0; i < n; i++)
        if (s->slots[seqs[i]]) finish(s, s->slots[seqs[i]], MOE_FINISH_ERROR, st);
}

static void prefill(struct moe_sched *s, struct moe_sched_req *r) {
    const double t0 = moe_now_s();
    const enum moe_status st = eng_prefill(&s->eng, r->slot, r->ids, r->n_prompt, s->logits);
    pthread_mutex_lock(&s->mu);
    s->st.prefill_s += moe_now_s() - t0;
    s->st.prompt_tokens += r->n_prompt;
    if (st != MOE_OK) finish(s, r, MOE_FINISH_ERROR, st);
    pthread_mutex_unlock(&s->mu);
    if (st == MOE_OK) accept(s, r, s->logits, r->n_prompt);
}

static void step(struct moe_sched *s) {
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_par; i++) {
        struct moe_sched_req *r = s->slots[i];
        if (!r || r->finish != MOE_FINISH_NONE || r->cancel) continue;
        s->step_seq[n] = i;
        s->step_tok[n++] = r->ids[r->n_prompt + r->n_gen - 1];
    }
    pthread_mutex_unlock(&s->mu);
    if (n == 0) return;
    const double t0 = moe_now_s();
    const enum moe_status st = eng_step(&s->eng, s->step_seq, s->step_tok, n, s->logits, (size_t)s->n_vocab);
    pthread_mutex_lock(&s->mu);
    s->st.decode_s += moe_now_s() - t0;
    s->st.steps++, s->st.step_tokens += n;
    if (st != MOE_OK) fail_active(s, s->step_seq, n, st);
    pthread_mutex_unlock(&s->mu);
    if (st != MOE_OK) return;
    for (int i = 0; i < n; i++) {
        struct moe_sched_req *r = s->slots[s->step_seq[i]]; /* only the engine frees slots */
        accept(s, r, s->logits + (size_t)i * (size_t)s->n_vocab, r->n_prompt + r->n_gen);
    }
}

static void *engine_main(void *arg) {
    struct moe_sched *s = arg;
    struct moe_sched_req **fresh = malloc(sizeof *fresh * (size_t)s->n_par);
    pthread_mutex_lock(&s->mu);
    while (fresh) {
        drop_done(s);
        while (!s->stop && !s->head && s->active == 0) pthread_cond_wait(&s->work, &s->mu);
        if (s->stop) break;
        const int n_new = admit(s, fresh);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_new; i++) prefill(s, fresh[i]);
        step(s);
        struct moe_store_stats ss;
        struct moe_big_little_stats bl;
        const int have = eng_store_stats(&s->eng, &ss);
        eng_big_little_stats(&s->eng, &bl);
        pthread_mutex_lock(&s->mu);
        s->st.have_store = have;
        if (have) s->st.store = ss;
        s->st.big_little = bl;
    }
    free(fresh);
    /* shutting down: everything queued or running ends */
    for (int i = 0; i < s->n_par; i++)
        if (s->slots[i]) finish(s, s->slots[i], MOE_FINISH_CANCELLED, MOE_OK), free_slot(s, s->slots[i]);
    while (s->head) {
        struct moe_sched_req *r = s->head;
        s->head = r->next;
        finish(s, r, MOE_FINISH_CANCELLED, MOE_OK);
        unref(r);
    }
    s->tail = NULL, s->queue_depth = 0;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- the public calls ---------------------------------------------------- */

enum moe_status moe_sched_create(const struct moe_model *m, const struct moe_sched_params *p, struct moe_sched **out) {
    *out = NULL;
    if (p->n_parallel < 1 || p->queue < 0) {
        MOE_LOGE("n_parallel must be >= 1 and queue >= 0 (got %d, %d)", p->n_parallel, p->queue);
        return MOE_ERR_INVALID;
    }
    struct moe_sched *s = calloc(1, sizeof *s);
    if (!s) return MOE_ERR_NOMEM;
    s->m = m, s->n_par = p->n_parallel, s->queue_cap = p->queue, s->n_vocab = m->cfg.n_vocab;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    enum moe_status st = eng_create(&s->eng, m, p->session, s->n_par, p->sequential);
    if (st == MOE_OK) {
        s->n_ctx = moe_session_n_ctx(s->eng.sess[0]);
        s->slots = calloc((size_t)s->n_par, sizeof *s->slots);
        s->logits = malloc(sizeof(float) * (size_t)s->n_par * (size_t)s->n_vocab);
        s->step_tok = malloc(sizeof *s->step_tok * (size_t)s->n_par);
        s->step_seq = malloc(sizeof *s->step_seq * (size_t)s->n_par);
        if (!s->slots || !s->logits || !s->step_tok || !s->step_seq) st = MOE_ERR_NOMEM;
    }
    s->st.n_parallel = s->n_par, s->st.queue_cap = s->queue_cap, s->st.batched = s->eng.batched;
    if (st == MOE_OK && pthread_create(&s->thread, NULL, engine_main, s) != 0) st = MOE_ERR_NOMEM;
    if (st != MOE_OK) {
        moe_sched_free(s);
        return st;
    }
    s->have_thread = 1;
    *out = s;
    return MOE_OK;
}

int moe_sched_n_ctx(const struct moe_sched *s) { return s->n_ctx; }

const struct moe_backend *moe_sched_backend(const struct moe_sched *s) { return moe_session_backend(s->eng.sess[0]); }

/* req_new: a request with its copies of the prompt and the settings. */
static enum moe_status req_new(struct moe_sched *s, const int32_t *prompt, int n, const struct moe_gen_params *g,
                               struct moe_sched_req **out) {
    struct moe_sched_req *r = calloc(1, sizeof *r);
    if (!r) return MOE_ERR_NOMEM;
    pthread_cond_init(&r->cv, NULL);
    r->s = s, r->slot = -1, r->n_prompt = n, r->refs = 2;
    const int room = s->n_ctx - n + 1; /* tokens that can be sampled: the last is never fed back */
    r->max_tokens = g->max_tokens < room ? g->max_tokens : room;
    r->cap = n + r->max_tokens;
    struct moe_sampler_params sp = {g->temperature, 0, g->top_p, g->seed};
    enum moe_status st = moe_sampler_create(&sp, s->n_vocab, &r->sampler);
    if (st == MOE_OK && (!(r->ids = malloc(sizeof *r->ids * (size_t)r->cap)) ||
                         (g->n_stop && !(r->stop = calloc((size_t)g->n_stop, sizeof *r->stop))) ||
                         (g->n_stop_ids && !(r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)g->n_stop_ids)))))
        st = MOE_ERR_NOMEM;
    for (int i = 0; st == MOE_OK && i < g->n_stop; i++) {
        const size_t L = strlen(g->stop[i]);
        if (L == 0) st = MOE_ERR_INVALID;
        else if (!(r->stop[r->n_stop] = malloc(L + 1))) st = MOE_ERR_NOMEM;
        else memcpy(r->stop[r->n_stop++], g->stop[i], L + 1), r->max_stop = L > r->max_stop ? L : r->max_stop;
    }
    if (st != MOE_OK) {
        req_free(r);
        return st;
    }
    memcpy(r->ids, prompt, sizeof *prompt * (size_t)n);
    if (g->n_stop_ids) memcpy(r->stop_ids, g->stop_ids, sizeof *r->stop_ids * (size_t)g->n_stop_ids);
    r->n_stop_ids = g->n_stop_ids;
    r->ignore_eos = g->ignore_eos != 0;
    *out = r;
    return MOE_OK;
}

enum moe_status moe_sched_submit(struct moe_sched *s, const int32_t *prompt, int n, const struct moe_gen_params *g,
                                 struct moe_sched_req **out) {
    *out = NULL;
    if (n < 1 || n >= s->n_ctx || g->max_tokens < 1) return MOE_ERR_INVALID;
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= s->n_vocab) return MOE_ERR_INVALID;
    struct moe_sched_req *r;
    enum moe_status st = req_new(s, prompt, n, g, &r);
    if (st != MOE_OK) return st;
    pthread_mutex_lock(&s->mu);
    s->st.submitted++;
    if (s->stop) st = MOE_ERR_CANCELLED;
    else if (s->queue_depth >= s->queue_cap && s->active + s->queue_depth >= s->n_par) st = MOE_ERR_RANGE;
    if (st == MOE_OK) {
        if (s->tail) s->tail->next = r;
        else s->head = r;
        s->tail = r;
        s->queue_depth++;
        pthread_cond_signal(&s->work);
    } else {
        s->st.rejected_full += st == MOE_ERR_RANGE;
    }
    pthread_mutex_unlock(&s->mu);
    if (st != MOE_OK) {
        req_free(r);
        return st;
    }
    *out = r;
    return MOE_OK;
}

static void progress(const struct moe_sched_req *r, struct moe_sched_progress *p) {
    p->text_len = r->text_len, p->n_gen = r->n_gen, p->n_prompt = r->n_prompt;
    p->finish = r->finish, p->error = r->error;
}

int moe_sched_wait(struct moe_sched_req *r, size_t have_len, double timeout_s, struct moe_sched_progress *p) {
    struct moe_sched *s = r->s;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    const double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + timeout_s;
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (!(rc = r->text_len > have_len || r->finish != MOE_FINISH_NONE))
        if (pthread_cond_timedwait(&r->cv, &s->mu, &until) == ETIMEDOUT) break;
    rc = r->text_len > have_len || r->finish != MOE_FINISH_NONE;
    progress(r, p);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void moe_sched_text(struct moe_sched_req *r, size_t from, size_t to, char *dst) {
    pthread_mutex_lock(&r->s->mu);
    MOE_ASSERT(from <= to && to <= r->text_len);
    if (to > from) memcpy(dst, r->text + from, to - from);
    pthread_mutex_unlock(&r->s->mu);
}

void moe_sched_cancel(struct moe_sched_req *r) {
    struct moe_sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    if (r->finish == MOE_FINISH_NONE) {
        r->cancel = 1;
        if (r->slot < 0) finish(s, r, MOE_FINISH_CANCELLED, MOE_OK); /* still queued: admit drops it */
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
}

void moe_sched_release(struct moe_sched_req *r) {
    if (!r) return;
    moe_sched_cancel(r);
    pthread_mutex_lock(&r->s->mu);
    struct moe_sched *s = r->s;
    unref(r);
    pthread_mutex_unlock(&s->mu);
}

void moe_sched_get_stats(struct moe_sched *s, struct moe_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queue_depth = s->queue_depth, out->active = s->active;
    pthread_mutex_unlock(&s->mu);
}

void moe_sched_shutdown(struct moe_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    if (s->have_thread) pthread_join(s->thread, NULL);
    s->have_thread = 0;
}

void moe_sched_free(struct moe_sched *s) {
    if (!s) return;
    moe_sched_shutdown(s);
    eng_free(&s->eng);
    free(s->slots);
    free(s->logits);
    free(s->step_tok);
    free(s->step_seq);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
