/*
 * cache-sim.c - the expert-cache simulator (see cache-sim.h and
 * docs/cache-sim.md): trace preparation (decode order, precision needs,
 * prefetch lists, Belady's next-use chains), the replay driver over the
 * runtime's cache core (runtime/offload/cache.c), and the helpers and weight fit of
 * fit-cache. The driver only counts; every decision is the core's.
 */
#include "cache-sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NEVER MOE_CACHE_NEVER /* next use of an expert that is not used again */

/* -------------------------------------------------------- prepared trace */

struct moe_cache_trace {
    int L, E, n_seq;
    int64_t tokens, n_steps, n_acc, n_pf;
    int64_t need[3];
    int32_t *seq_step;   /* [n_seq + 1] first step of each sequence */
    int32_t *step_acc;   /* [n_steps + 1] first access of each step */
    int32_t *step_pf;    /* [n_steps + 1] first prefetch entry of each step */
    uint16_t *step_layer;/* [n_steps] MoE layer */
    uint8_t *step_pass;  /* [n_steps] 0 plain, 1 little, 2 big (moe_cache_step_event.pass), 3 a prompt batch */
    int32_t *step_T;     /* [n_steps] token index in the sequence + 1 (a batch: prompt_len) */
    int32_t *acc_g;      /* [n_acc] layer * E + expert */
    uint8_t *acc_need;   /* [n_acc] enum moe_cache_need */
    int32_t *next_hi;    /* [n_acc] next access of the expert with need >= LOW (NEVER) */
    int32_t *next_lo;    /* [n_acc] next access of the expert with need == LOW (NEVER) */
    int32_t *pf_g;       /* [n_pf] prefetch lists */
};

struct moe_cache_trace_params moe_cache_trace_default_params(void) {
    struct moe_cache_trace_params p = {0, 1.0, 1.0, NULL, 0, 0, 0.0, 0};
    return p;
}

void moe_cache_trace_free(struct moe_cache_trace *tr) {
    if (!tr) return;
    free(tr->seq_step);
    free(tr->step_acc);
    free(tr->step_pf);
    free(tr->step_layer);
    free(tr->step_pass);
    free(tr->step_T);
    free(tr->acc_g);
    free(tr->acc_need);
    free(tr->next_hi);
    free(tr->next_lo);
    free(tr->pf_g);
    free(tr);
}

void moe_cache_trace_info(const struct moe_cache_trace *tr, struct moe_cache_trace_info *out) {
    memset(out, 0, sizeof *out);
    out->n_layers = tr->L;
    out->n_experts = tr->E;
    out->n_seq = tr->n_seq;
    out->tokens = tr->tokens;
    out->steps = tr->n_steps;
    out->accesses = tr->n_acc;
    for (int i = 0; i < 3; i++) out->need[i] = tr->need[i];
    out->prefetch_slots = tr->n_pf;
}

int64_t moe_cache_trace_accesses(const struct moe_cache_trace *tr, const int32_t **g, const uint8_t **need) {
    *g = tr->acc_g;
    *need = tr->acc_need;
    return tr->n_acc;
}

void moe_cache_trace_need_freq(const struct moe_cache_trace *tr, double *f_high, double *f_low) {
    const size_t LE = (size_t)tr->L * tr->E;
    memset(f_high, 0, sizeof *f_high * LE);
    memset(f_low, 0, sizeof *f_low * LE);
    for (int64_t i = 0; i < tr->n_acc; i++) {
        if (tr->acc_need[i] == MOE_CACHE_NEED_HIGH) f_high[tr->acc_g[i]] += 1;
        else if (tr->acc_need[i] == MOE_CACHE_NEED_LOW) f_low[tr->acc_g[i]] += 1;
    }
    for (size_t g = 0; tr->tokens > 0 && g < LE; g++) f_high[g] /= (double)tr->tokens, f_low[g] /= (double)tr->tokens;
}

/* needs: the precision need of each of the K experts of one (token, layer)
 * row, with s computed exactly as moe_hobbit_scores does (so thresholds chosen
 * among observed scores split the same way). */
static void needs(const float *w, int K, double t1, double t2, uint8_t *out) {
    double sum = 0, acc = 0;
    for (int j = 0; j < K; j++) sum += w[j];
    for (int j = 0; j < K; j++) {
        float s = sum > 0 ? (float)(acc / sum) : 0.0f;
        acc += w[j];
        out[j] = j == 0 || s <= t1 ? MOE_CACHE_NEED_HIGH : s <= t2 ? MOE_CACHE_NEED_LOW : MOE_CACHE_NEED_SKIP;
    }
}

/* prefetch_list: the m most probable experts (p > 0; ties: lower id) of
 * layer l given token tok's key, into out; returns how many. */
static int prefetch_list(const struct moe_path_dict *d, const struct moe_trace *t, int64_t tok, int l, int m,
                         double *prob, int32_t *out) {
    const int E = t->n_experts;
    if (moe_path_dict_prob(d, t, tok, l, 0) < 0) return 0; /* key never seen (or l < order) */
    for (int e = 0; e < E; e++) prob[e] = moe_path_dict_prob(d, t, tok, l, e);
    int n = 0;
    for (; n < m; n++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (prob[e] > 0 && (best < 0 || prob[e] > prob[best])) best = e;
        if (best < 0) break;
        out[n] = l * E + best;
        prob[best] = -1;
    }
    return n;
}

/* check_prep: the arguments of moe_cache_trace_new. */
static enum moe_status check_prep(const struct moe_trace *t, const int32_t *seqs, int n_seqs,
                                  const struct moe_cache_trace_params *pp) {
    if (!t || !pp || t->n_layers < 1 || t->n_experts < 1 || t->k < 1 || t->k > t->n_experts || t->n_seq < 0 ||
        t->n_layers > 65535 || (int64_t)t->n_layers * t->n_experts > INT32_MAX / 4 || n_seqs < 0) {
        MOE_LOGE("invalid trace shape or arguments");
        return MOE_ERR_INVALID;
    }
    if (!(pp->t1 <= pp->t2) || pp->prefetch < 0 || pp->prefetch > t->n_experts || pp->prompt_len < 0 ||
        pp->little_k < 0 || pp->little_k >= t->k + (pp->little_k == 0) || !(pp->fallback >= 0 && pp->fallback <= 1)) {
        MOE_LOGE("invalid parameters: T1 %g, T2 %g (T1 <= T2 wanted), prefetch %d (0..%d), prompt_len %d, little_k %d "
                 "(0..%d), fallback %g", pp->t1, pp->t2, pp->prefetch, t->n_experts, pp->prompt_len, pp->little_k,
                 t->k - 1, pp->fallback);
        return MOE_ERR_INVALID;
    }
    for (int i = 0; seqs && i < n_seqs; i++)
        if (seqs[i] < 0 || seqs[i] >= t->n_seq) {
            MOE_LOGE("sequence index %d out of range [0, %d)", (int)seqs[i], t->n_seq);
            return MOE_ERR_INVALID;
        }
    return MOE_OK;
}

/* next_uses: Belady's next-use chains, one backward pass. */
static enum moe_status next_uses(struct moe_cache_trace *tr) {
    const int LE = tr->L * tr->E;
    int32_t *last = malloc(sizeof *last * 2 * (size_t)LE);
    if (!last) return MOE_ERR_NOMEM;
    for (int i = 0; i < 2 * LE; i++) last[i] = NEVER;
    for (int64_t i = tr->n_acc - 1; i >= 0; i--) {
        int32_t g = tr->acc_g[i];
        tr->next_hi[i] = last[g];
        tr->next_lo[i] = last[LE + g];
        if (tr->acc_need[i] >= MOE_CACHE_NEED_LOW) last[g] = (int32_t)i;
        if (tr->acc_need[i] == MOE_CACHE_NEED_LOW) last[LE + g] = (int32_t)i;
    }
    free(last);
    return MOE_OK;
}

enum moe_status moe_cache_trace_new(const struct moe_trace *t, const int32_t *seqs, int n_seqs,
                                    const struct moe_cache_trace_params *pp, struct moe_cache_trace **out) {
    enum moe_status st;
    *out = NULL;
    if ((st = check_prep(t, seqs, n_seqs, pp))) return st;
    if (!seqs) n_seqs = t->n_seq;
    const int L = t->n_layers, E = t->n_experts, K = t->k;
    const int m = pp->paths ? pp->prefetch : 0, bl = pp->little_k > 0 ? 2 : 1;
    const int per_step_pf = m > K ? m : K;
    int64_t tokens = 0, dec = 0; /* decode tokens so far (big-little's even choice) */
    for (int i = 0; i < n_seqs; i++) {
        int s = seqs ? seqs[i] : i;
        tokens += t->seq_start[s + 1] - t->seq_start[s];
    }
    const int64_t max_acc = tokens * L * K * bl, max_steps = tokens * L * bl;
    if (max_acc >= INT32_MAX - 1 || max_steps * (per_step_pf + 1) >= INT32_MAX - 1) {
        MOE_LOGE("%lld tokens x %d layers x top-%d are more accesses than one replay handles (%d)",
                 (long long)tokens, L, K, INT32_MAX - 2);
        return MOE_ERR_RANGE;
    }
    struct moe_cache_trace *tr = calloc(1, sizeof *tr);
    uint8_t *need_e = malloc((size_t)E + (size_t)K), *nk = need_e ? need_e + E : NULL;
    double *prob = malloc(sizeof *prob * (size_t)E);
    if (!tr || !need_e || !prob) goto nomem;
    tr->L = L, tr->E = E, tr->n_seq = n_seqs, tr->tokens = tokens;
    tr->seq_step = malloc(sizeof(int32_t) * ((size_t)n_seqs + 1));
    tr->step_acc = malloc(sizeof(int32_t) * ((size_t)max_steps + 1));
    tr->step_pf = malloc(sizeof(int32_t) * ((size_t)max_steps + 1));
    tr->step_layer = malloc(sizeof(uint16_t) * ((size_t)max_steps + 1));
    tr->step_pass = malloc((size_t)max_steps + 1);
    tr->step_T = malloc(sizeof(int32_t) * ((size_t)max_steps + 1));
    tr->acc_g = malloc(sizeof(int32_t) * ((size_t)max_acc + 1));
    tr->acc_need = malloc((size_t)max_acc + 1);
    tr->next_hi = malloc(sizeof(int32_t) * ((size_t)max_acc + 1));
    tr->next_lo = malloc(sizeof(int32_t) * ((size_t)max_acc + 1));
    tr->pf_g = malloc(sizeof(int32_t) * ((size_t)max_steps * (size_t)(pp->little_k ? per_step_pf : m) + 1));
    if (!tr->seq_step || !tr->step_acc || !tr->step_pf || !tr->step_layer || !tr->step_pass || !tr->step_T || !tr->acc_g ||
        !tr->acc_need || !tr->next_hi || !tr->next_lo || !tr->pf_g)
        goto nomem;
    int64_t ns = 0, na = 0, np = 0;
    for (int i = 0; i < n_seqs; i++) {
        const int s = seqs ? seqs[i] : i;
        const int64_t a = t->seq_start[s], n = t->seq_start[s + 1] - a;
        const int64_t P = pp->prompt_len >= 2 ? (pp->prompt_len < n ? pp->prompt_len : n) : 0;
        tr->seq_step[i] = (int32_t)ns;
        for (int l = 0; P > 0 && l < L; l++) { /* the prompt: one batch step per layer */
            memset(need_e, 0xff, (size_t)E);
            for (int64_t tok = a; tok < a + P; tok++) {
                const size_t row = ((size_t)tok * L + l) * K;
                needs(t->weights + row, K, pp->t1, pp->t2, nk);
                for (int j = 0; j < K; j++) {
                    int e = t->experts[row + j];
                    if (e < 0 || e >= E) goto bad_expert;
                    if (need_e[e] == 0xff || nk[j] > need_e[e]) need_e[e] = nk[j];
                }
            }
            tr->step_acc[ns] = (int32_t)na, tr->step_pf[ns] = (int32_t)np;
            tr->step_layer[ns] = (uint16_t)l, tr->step_T[ns] = (int32_t)P, tr->step_pass[ns] = 3;
            ns++;
            for (int e = 0; e < E; e++)
                if (need_e[e] != 0xff) tr->acc_g[na] = l * E + e, tr->acc_need[na++] = need_e[e];
        }
        for (int64_t tok = a + P; tok < a + n; tok++) {
            /* passes of this token: plain; or little, and big when it falls back */
            int pass0 = 0, pass1 = 0;
            if (pp->little_k > 0) {
                double f = fmod((double)(++dec) * 0.6180339887498949, 1.0);
                pass0 = 1, pass1 = f < pp->fallback ? 2 : 1;
            }
            for (int pass = pass0; pass <= pass1; pass++)
                for (int l = 0; l < L; l++) {
                    const size_t row = ((size_t)tok * L + l) * K;
                    const int k = pass == 1 ? pp->little_k : K;
                    tr->step_acc[ns] = (int32_t)na, tr->step_pf[ns] = (int32_t)np;
                    tr->step_layer[ns] = (uint16_t)l, tr->step_T[ns] = (int32_t)(tok - a + 1);
                    tr->step_pass[ns] = (uint8_t)pass;
                    ns++;
                    if (pass == 0 && m > 0) np += prefetch_list(pp->paths, t, tok, l, m, prob, tr->pf_g + np);
                    needs(t->weights + row, k, pp->t1, pp->t2, nk);
                    for (int j = 0; j < k; j++) {
                        int e = t->experts[row + j];
                        if (e < 0 || e >= E) goto bad_expert;
                        tr->acc_g[na] = l * E + e, tr->acc_need[na++] = nk[j];
                        if (pass == 2 && pp->bl_prefetch) tr->pf_g[np++] = l * E + e;
                    }
                }
        }
    }
    tr->seq_step[n_seqs] = (int32_t)ns;
    tr->step_acc[ns] = (int32_t)na, tr->step_pf[ns] = (int32_t)np;
    tr->n_steps = ns, tr->n_acc = na, tr->n_pf = np;
    for (int64_t i = 0; i < na; i++) tr->need[tr->acc_need[i]]++;
    if ((st = next_uses(tr))) goto fail;
    free(need_e);
    free(prob);
    *out = tr;
    return MOE_OK;
bad_expert:
    MOE_LOGE("trace: an expert id is out of range [0, %d)", E);
    st = MOE_ERR_INVALID;
    goto fail;
nomem:
    MOE_LOGE("out of memory preparing %lld tokens", (long long)tokens);
    st = MOE_ERR_NOMEM;
fail:
    free(need_e);
    free(prob);
    moe_cache_trace_free(tr);
    return st;
}

/* ----------------------------------------------------------------- replay */

double moe_cache_hit_ratio(const struct moe_cache_stats *s) {
    return s->accesses > 0 ? (double)(s->hits_high + s->hits_low) / (double)s->accesses : NAN;
}

/* replay_steps: replay as below, access by access, reporting each step to fn. */
static enum moe_status replay_steps(const struct moe_cache_trace *tr, struct moe_cache *c, int use_pf,
                                    moe_cache_step_fn fn, void *user, struct moe_cache_stats *st) {
    int64_t n[MOE_CACHE_N_OUTCOMES] = {0, 0, 0, 0, 0};
    int64_t pf_loads = 0, pf_hits = 0;
    int max_n = 1, max_pf = 1;
    for (int64_t s = 0; s < tr->n_steps; s++) {
        if (tr->step_acc[s + 1] - tr->step_acc[s] > max_n) max_n = tr->step_acc[s + 1] - tr->step_acc[s];
        if (tr->step_pf[s + 1] - tr->step_pf[s] > max_pf) max_pf = tr->step_pf[s + 1] - tr->step_pf[s];
    }
    uint8_t *out = malloc((size_t)max_n);
    int32_t *pfl = malloc(sizeof *pfl * (size_t)max_pf);
    if (!out || !pfl) {
        free(out);
        free(pfl);
        MOE_LOGE("out of memory");
        return MOE_ERR_NOMEM;
    }
    struct moe_cache_result r;
    for (int q = 0; q < tr->n_seq; q++) {
        moe_cache_begin_sequence(c);
        for (int32_t step = tr->seq_step[q]; step < tr->seq_step[q + 1]; step++) {
            const int32_t a = tr->step_acc[step], na = tr->step_acc[step + 1] - a;
            int npf = 0;
            moe_cache_begin_step(c, tr->step_layer[step], tr->step_T[step]);
            for (int32_t i = use_pf ? tr->step_pf[step] : 0; use_pf && i < tr->step_pf[step + 1]; i++)
                if (moe_cache_prefetch(c, tr->pf_g[i], 0, &r) && r.outcome == MOE_CACHE_MISS_HIGH)
                    pf_loads++, pfl[npf++] = tr->pf_g[i];
            for (int32_t i = 0; i < na; i++) {
                moe_cache_access(c, tr->acc_g[a + i], (enum moe_cache_need)tr->acc_need[a + i], tr->next_hi[a + i],
                                 tr->next_lo[a + i], &r);
                n[r.outcome]++;
                pf_hits += r.prefetch_hit;
                out[i] = (uint8_t)r.outcome;
            }
            const int pass = tr->step_pass[step];
            struct moe_cache_step_event ev = {q, tr->step_T[step], tr->step_layer[step], pass == 3, pass == 3 ? 0 : pass,
                                              na, tr->acc_g + a, tr->acc_need + a, out, npf, pfl};
            fn(&ev, user);
        }
    }
    free(out);
    free(pfl);
    st->hits_high = n[MOE_CACHE_HIT_HIGH], st->hits_low = n[MOE_CACHE_HIT_LOW];
    st->misses_high = n[MOE_CACHE_MISS_HIGH], st->misses_low = n[MOE_CACHE_MISS_LOW];
    st->skips = n[MOE_CACHE_SKIP];
    st->prefetch_loads = pf_loads, st->prefetch_hits = pf_hits;
    return MOE_OK;
}

/* replay: drive the core c through every step of tr, counting into st. */
static void replay(const struct moe_cache_trace *tr, struct moe_cache *c, int use_pf, struct moe_cache_stats *st) {
    int64_t n[MOE_CACHE_N_OUTCOMES] = {0, 0, 0, 0, 0};
    int64_t pf_loads = 0, pf_hits = 0;
    struct moe_cache_result r;
    for (int q = 0; q < tr->n_seq; q++) {
        moe_cache_begin_sequence(c);
        for (int32_t step = tr->seq_step[q]; step < tr->seq_step[q + 1]; step++) {
            const int32_t a = tr->step_acc[step];
            moe_cache_begin_step(c, tr->step_layer[step], tr->step_T[step]);
            for (int32_t i = use_pf ? tr->step_pf[step] : 0; use_pf && i < tr->step_pf[step + 1]; i++)
                if (moe_cache_prefetch(c, tr->pf_g[i], 0, &r)) pf_loads += r.outcome == MOE_CACHE_MISS_HIGH;
            moe_cache_access_n(c, tr->step_acc[step + 1] - a, tr->acc_g + a, tr->acc_need + a, tr->next_hi + a,
                               tr->next_lo + a, n, &pf_hits);
        }
    }
    st->hits_high = n[MOE_CACHE_HIT_HIGH], st->hits_low = n[MOE_CACHE_HIT_LOW];
    st->misses_high = n[MOE_CACHE_MISS_HIGH], st->misses_low = n[MOE_CACHE_MISS_LOW];
    st->skips = n[MOE_CACHE_SKIP];
    st->prefetch_loads = pf_loads, st->prefetch_hits = pf_hits;
}

enum moe_status moe_cache_simulate_steps(const struct moe_cache_trace *tr, enum moe_cache_policy p,
                                         const struct moe_cache_config *c, moe_cache_step_fn fn, void *user,
                                         struct moe_cache_stats *out) {
    enum moe_status st;
    struct moe_cache *mc = NULL;
    memset(out, 0, sizeof *out);
    if (!tr || !fn) {
        MOE_LOGE("no trace or no step callback");
        return MOE_ERR_INVALID;
    }
    if ((st = moe_cache_new(tr->L, tr->E, p, c, &mc))) return st;
    out->tokens = tr->tokens;
    out->accesses = tr->n_acc;
    st = replay_steps(tr, mc, c->prefetch && tr->n_pf > 0 && p != MOE_CACHE_STATIC && p != MOE_CACHE_BELADY, fn, user,
                      out);
    moe_cache_free(mc);
    out->penalty = (double)out->misses_high + c->low_cost * (double)out->misses_low;
    out->bytes = (double)(out->misses_high + out->prefetch_loads) * c->high_bytes +
                 (double)out->misses_low * c->low_bytes;
    return st;
}

enum moe_status moe_cache_simulate(const struct moe_cache_trace *tr, enum moe_cache_policy p,
                                   const struct moe_cache_config *c, struct moe_cache_stats *out) {
    enum moe_status st;
    struct moe_cache *mc = NULL;
    memset(out, 0, sizeof *out);
    if (!tr) {
        MOE_LOGE("no trace");
        return MOE_ERR_INVALID;
    }
    if ((st = moe_cache_new(tr->L, tr->E, p, c, &mc))) return st;
    out->tokens = tr->tokens;
    out->accesses = tr->n_acc;
    replay(tr, mc, c->prefetch && tr->n_pf > 0 && p != MOE_CACHE_STATIC && p != MOE_CACHE_BELADY, out);
    moe_cache_free(mc);
    out->penalty = (double)out->misses_high + c->low_cost * (double)out->misses_low;
    out->bytes = (double)(out->misses_high + out->prefetch_loads) * c->high_bytes +
                 (double)out->misses_low * c->low_bytes;
    return MOE_OK;
}

/* ------------------------------------------------------------ fit helpers */

int moe_cache_split(int n_seq, double h, unsigned char *heldout) {
    int n = 0;
    for (int i = 0; i < n_seq; i++) {
        heldout[i] = h > 0 && floor((i + 1) * h + 1e-9) > floor(i * h + 1e-9);
        n += heldout[i];
    }
    if (h > 0 && n_seq >= 2 && n == 0) heldout[n_seq - 1] = 1, n = 1;
    if (n_seq >= 2 && n == n_seq) heldout[0] = 0, n--;
    return n;
}

/* seq_view: sequence s of t as a one-sequence trace (arrays borrowed). */
static struct moe_trace seq_view(const struct moe_trace *t, int s, int64_t ss[2]) {
    struct moe_trace v = *t;
    const size_t row = (size_t)t->n_layers * t->k, a = (size_t)t->seq_start[s];
    ss[0] = 0, ss[1] = t->seq_start[s + 1] - t->seq_start[s];
    v.n_seq = 1, v.seq_start = ss, v.experts = t->experts + a * row, v.weights = t->weights + a * row;
    return v;
}

enum moe_status moe_cache_popularity(const struct moe_trace *t, const int32_t *seqs, int n_seqs, double *freq,
                                     int32_t *order) {
    const size_t LE = (size_t)t->n_layers * t->n_experts;
    int64_t *counts = calloc(LE, sizeof *counts), tokens = 0, ss[2];
    if (!counts) return MOE_ERR_NOMEM;
    for (int i = 0; i < n_seqs; i++) {
        struct moe_trace v = seq_view(t, seqs[i], ss);
        moe_popularity_count(&v, counts);
        tokens += ss[1];
    }
    for (size_t g = 0; freq && g < LE; g++) freq[g] = tokens > 0 ? (double)counts[g] / (double)tokens : 0;
    if (order) moe_placement_order(counts, t->n_layers, t->n_experts, order);
    free(counts);
    return MOE_OK;
}

enum moe_status moe_cache_path_dict(const struct moe_trace *t, const int32_t *seqs, int n_seqs, int order,
                                    struct moe_path_dict **out) {
    enum moe_status st;
    int64_t ss[2];
    if ((st = moe_path_dict_new(t->n_layers, t->n_experts, t->k, order, out))) return st;
    for (int i = 0; i < n_seqs; i++) {
        struct moe_trace v = seq_view(t, seqs[i], ss);
        if ((st = moe_path_dict_add(*out, &v))) {
            moe_path_dict_free(*out);
            *out = NULL;
            return st;
        }
    }
    return MOE_OK;
}

/* ------------------------------------------------------------- the fit */

struct moe_cache_fit_params moe_cache_fit_default_params(void) {
    struct moe_cache_fit_params p = {8, 4, MOE_CACHE_N_WEIGHTS, -1, NULL, NULL};
    return p;
}

/* Fit state: the configuration copy whose weights are tried. */
struct fit {
    const struct moe_cache_trace *tr;
    struct moe_cache_config c;
    const struct moe_cache_fit_params *fp;
    int evals, total;
};

/* try_w: replay with weights w into *out. */
static enum moe_status try_w(struct fit *f, const double *w, struct moe_cache_stats *out) {
    memcpy(f->c.w, w, sizeof f->c.w);
    enum moe_status st = moe_cache_simulate(f->tr, MOE_CACHE_HOBBIT, &f->c, out);
    f->evals++;
    if (f->fp->progress) f->fp->progress(f->evals, f->total, f->fp->user);
    return st;
}

/* binom: C(n, k) for the small numbers of the grid. */
static int binom(int n, int k) {
    long long r = 1;
    for (int i = 1; i <= k; i++) r = r * (n - k + i) / i;
    return (int)r;
}

/* grid_next: the next composition of G into n parts in grid order (the
 * first part slowest, the last one the rest); 0 after the last. */
static int grid_next(int *a, int n, int G) {
    for (int i = n - 2; i >= 0; i--) { /* a[n-1] = G - the others */
        int used = 0;
        for (int j = 0; j < i; j++) used += a[j];
        if (used + a[i] < G) {
            a[i]++;
            for (int j = i + 1; j < n - 1; j++) a[j] = 0;
            int rest = G;
            for (int j = 0; j < n - 1; j++) rest -= a[j];
            a[n - 1] = rest;
            return 1;
        }
    }
    return 0;
}

enum moe_status moe_cache_fit_hobbit(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                                     const struct moe_cache_fit_params *fp, double w[MOE_CACHE_N_WEIGHTS],
                                     int *admit, struct moe_cache_stats *best, int *evals) {
    struct moe_cache_fit_params dp = moe_cache_fit_default_params();
    if (!fp) fp = &dp;
    const int N = fp->n_weights;
    if (!tr || !c || fp->grid < 1 || fp->grid > 1000 || fp->refine_rounds < 0 || fp->refine_rounds > 30 ||
        (N != 4 && N != MOE_CACHE_N_WEIGHTS) || fp->admit < -1 || fp->admit > 1 ||
        binom(fp->grid + N - 1, N - 1) > 1000000) {
        MOE_LOGE("invalid fit parameters (grid %d, refinement rounds %d, %d weights, admission %d)", fp->grid,
                 fp->refine_rounds, N, fp->admit);
        return MOE_ERR_INVALID;
    }
    const int G = fp->grid, a0 = fp->admit < 0 ? 0 : fp->admit, a1 = fp->admit < 0 ? 1 : fp->admit;
    struct fit f = {tr, *c, fp, 0, binom(G + N - 1, N - 1) * (a1 - a0 + 1)};
    struct moe_cache_stats cur, bs;
    double bw[MOE_CACHE_N_WEIGHTS], tw[MOE_CACHE_N_WEIGHTS];
    enum moe_status st;
    int have = 0, badmit = a0;
    memset(&bs, 0, sizeof bs);
    for (int adm = a0; adm <= a1; adm++) {
        int a[MOE_CACHE_N_WEIGHTS] = {0};
        a[N - 1] = G;
        f.c.admit = adm;
        do { /* the simplex grid: the first weight slowest */
            memset(tw, 0, sizeof tw);
            for (int i = 0; i < N; i++) tw[i] = (double)a[i] / G;
            if ((st = try_w(&f, tw, &cur))) return st;
            if (!have || cur.penalty < bs.penalty) memcpy(bw, tw, sizeof bw), bs = cur, badmit = adm, have = 1;
        } while (grid_next(a, N, G));
    }
    f.c.admit = badmit;
    double h = 0.5 / G;
    for (int r = 0; r < fp->refine_rounds; r++, h /= 2) /* local moves of h from weight i to j */
        for (int it = 0; it < 64; it++) {
            double mw[MOE_CACHE_N_WEIGHTS];
            struct moe_cache_stats ms;
            int moved = 0;
            memset(&ms, 0, sizeof ms);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < N; j++) {
                    const double amt = fmin(h, bw[i]);
                    if (i == j || amt < h * 0.5) continue; /* nothing (left) to move from weight i */
                    memcpy(tw, bw, sizeof tw);
                    tw[i] -= amt, tw[j] += amt;
                    if ((st = try_w(&f, tw, &cur))) return st;
                    if (cur.penalty < (moved ? ms.penalty : bs.penalty)) memcpy(mw, tw, sizeof mw), ms = cur, moved = 1;
                }
            if (!moved) break;
            memcpy(bw, mw, sizeof bw), bs = ms;
        }
    double sum = 0;
    for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) sum += bw[i];
    for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) w[i] = bw[i] / sum;
    if (admit) *admit = badmit;
    if (best) *best = bs;
    if (evals) *evals = f.evals;
    return MOE_OK;
}
