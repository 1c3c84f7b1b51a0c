/*
 * cache-sim.c - the expert-cache simulator (see cache-sim.h and
 * docs/cache-sim.md).
 *
 * Speed. Every policy ranks the cached copies by a pair (key, last use) and
 * evicts the smallest; the key of an expert changes only when that expert is
 * accessed (or, for the per-sequence records, at a sequence boundary), and
 * the layer-dependent part of a key is the same for every expert of a layer.
 * So each cache keeps, per MoE layer, the list of its cached experts and the
 * layer's smallest (key, last use); a victim is the best of the L layer
 * minima with the layer term applied (O(L) per miss), and a layer is rescanned
 * only when its minimum is accessed or evicted. Nothing is allocated while
 * replaying.
 */
#include "cache-sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NEVER INT32_MAX /* next use of an expert that is not used again */

/* ------------------------------------------------------------------ names */

static const char *const k_names[MOE_CACHE_N_POLICIES] = {"lru", "lfu-seq", "lfu-global", "lhu", "fld",
                                                         "edgemoe", "twiddler", "hobbit", "belady"};

const char *moe_cache_policy_name(enum moe_cache_policy p) {
    return (unsigned)p < MOE_CACHE_N_POLICIES ? k_names[p] : "?";
}

/* -------------------------------------------------------- prepared trace */

struct moe_cache_trace {
    int L, E, n_seq;
    int64_t tokens, n_steps, n_acc, n_pf;
    int64_t need[3];
    int32_t *seq_step;   /* [n_seq + 1] first step of each sequence */
    int32_t *step_acc;   /* [n_steps + 1] first access of each step */
    int32_t *step_pf;    /* [n_steps + 1] first prefetch entry of each step */
    uint16_t *step_layer;/* [n_steps] MoE layer */
    int32_t *step_T;     /* [n_steps] token index in the sequence + 1 (a batch: prompt_len) */
    int32_t *acc_g;      /* [n_acc] layer * E + expert */
    uint8_t *acc_need;   /* [n_acc] enum moe_cache_need */
    int32_t *next_hi;    /* [n_acc] next access of the expert with need >= LOW (NEVER) */
    int32_t *next_lo;    /* [n_acc] next access of the expert with need == LOW (NEVER) */
    int32_t *pf_g;       /* [n_pf] prefetch lists */
};

struct moe_cache_trace_params moe_cache_trace_default_params(void) {
    struct moe_cache_trace_params p = {0, 1.0, 1.0, NULL, 0};
    return p;
}

void moe_cache_trace_free(struct moe_cache_trace *tr) {
    if (!tr) return;
    free(tr->seq_step);
    free(tr->step_acc);
    free(tr->step_pf);
    free(tr->step_layer);
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
    if (!(pp->t1 <= pp->t2) || pp->prefetch < 0 || pp->prefetch > t->n_experts || pp->prompt_len < 0) {
        MOE_LOGE("invalid parameters: T1 %g, T2 %g (T1 <= T2 wanted), prefetch %d (0..%d), prompt_len %d",
                 pp->t1, pp->t2, pp->prefetch, t->n_experts, pp->prompt_len);
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
    const int m = pp->paths ? pp->prefetch : 0;
    int64_t tokens = 0;
    for (int i = 0; i < n_seqs; i++) {
        int s = seqs ? seqs[i] : i;
        tokens += t->seq_start[s + 1] - t->seq_start[s];
    }
    const int64_t max_acc = tokens * L * K, max_steps = tokens * L;
    if (max_acc >= INT32_MAX - 1 || max_steps * (m + 1) >= INT32_MAX - 1) {
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
    tr->step_T = malloc(sizeof(int32_t) * ((size_t)max_steps + 1));
    tr->acc_g = malloc(sizeof(int32_t) * ((size_t)max_acc + 1));
    tr->acc_need = malloc((size_t)max_acc + 1);
    tr->next_hi = malloc(sizeof(int32_t) * ((size_t)max_acc + 1));
    tr->next_lo = malloc(sizeof(int32_t) * ((size_t)max_acc + 1));
    tr->pf_g = malloc(sizeof(int32_t) * ((size_t)max_steps * m + 1));
    if (!tr->seq_step || !tr->step_acc || !tr->step_pf || !tr->step_layer || !tr->step_T || !tr->acc_g ||
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
            tr->step_layer[ns] = (uint16_t)l, tr->step_T[ns] = (int32_t)P;
            ns++;
            for (int e = 0; e < E; e++)
                if (need_e[e] != 0xff) tr->acc_g[na] = l * E + e, tr->acc_need[na++] = need_e[e];
        }
        for (int64_t tok = a + P; tok < a + n; tok++)
            for (int l = 0; l < L; l++) {
                const size_t row = ((size_t)tok * L + l) * K;
                tr->step_acc[ns] = (int32_t)na, tr->step_pf[ns] = (int32_t)np;
                tr->step_layer[ns] = (uint16_t)l, tr->step_T[ns] = (int32_t)(tok - a + 1);
                ns++;
                if (m > 0) np += prefetch_list(pp->paths, t, tok, l, m, prob, tr->pf_g + np);
                needs(t->weights + row, K, pp->t1, pp->t2, nk);
                for (int j = 0; j < K; j++) {
                    int e = t->experts[row + j];
                    if (e < 0 || e >= E) goto bad_expert;
                    tr->acc_g[na] = l * E + e, tr->acc_need[na++] = nk[j];
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

struct moe_cache_config moe_cache_default_config(void) {
    struct moe_cache_config c;
    memset(&c, 0, sizeof c);
    c.low_cost = 0.5;
    for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) c.w[i] = 0.25;
    return c;
}

double moe_cache_hit_ratio(const struct moe_cache_stats *s) {
    return s->accesses > 0 ? (double)(s->hits_high + s->hits_low) / (double)s->accesses : NAN;
}

/* One cache (high or low precision copies). */
struct cache {
    int cap, n;
    int32_t *list; /* [L*E] the cached experts of layer l at [l*E, l*E + cnt[l]) */
    int32_t *cnt;  /* [L] */
    int32_t *at;   /* [LE] index in its layer's list, -1 when not cached */
    double *k;     /* [LE] policy key of the cached copy (smaller = evicted first) */
    int32_t *best; /* [L] the layer's smallest (key, last use, id); -1 when empty */
    double *bk;    /* [L] key of best[l] (+inf when empty): the victim search reads these */
    int64_t *bst;  /* [L] last use of best[l] */
};

/* Replay state. */
struct sim {
    const struct moe_cache_trace *tr;
    const struct moe_cache_config *c;
    enum moe_cache_policy p;
    int L, E;
    int64_t clock;
    int64_t *stamp;  /* [LE] clock of the last demand use (0 = never) */
    int32_t *R, *F, *H; /* [LE] per sequence: last use (token index + 1), uses, high-need uses */
    int64_t *Fg;     /* [LE] uses since the replay began */
    int32_t *prot;   /* [LE] step the high copy is protected for (prefetch), -1 */
    int32_t *pfl;    /* [LE] step whose prefetch loaded the high copy, -1 */
    double *mul, *add; /* [L x L] layer term: score = k * mul[lc][lt] + scale * add[lc][lt] */
    double scale;
    int32_t step;
    int lc;
    struct cache hi, lo;
};

/* before: a ranks before b for eviction in cache c (smaller key, then older
 * last use, then lower id). */
static inline int before(const struct sim *s, const struct cache *c, int32_t a, int32_t b) {
    if (c->k[a] != c->k[b]) return c->k[a] < c->k[b];
    if (s->stamp[a] != s->stamp[b]) return s->stamp[a] < s->stamp[b];
    return a < b;
}

/* set_best: g (-1: none) is now the minimum of layer l. */
static inline void set_best(const struct sim *s, struct cache *c, int l, int32_t g) {
    c->best[l] = g;
    c->bk[l] = g >= 0 ? c->k[g] : INFINITY;
    c->bst[l] = g >= 0 ? s->stamp[g] : 0;
}

/* rescan: recompute the minimum of layer l in cache c. */
static void rescan(const struct sim *s, struct cache *c, int l) {
    const int32_t *x = c->list + (size_t)l * s->E;
    int32_t b = -1;
    for (int i = 0; i < c->cnt[l]; i++)
        if (b < 0 || before(s, c, x[i], b)) b = x[i];
    set_best(s, c, l, b);
}

/* layer_min_unprotected: layer l's minimum over copies not protected now. */
static int32_t layer_min_unprotected(const struct sim *s, const struct cache *c, int l) {
    const int32_t *x = c->list + (size_t)l * s->E;
    int32_t b = -1;
    for (int i = 0; i < c->cnt[l]; i++)
        if (s->prot[x[i]] != s->step && (b < 0 || before(s, c, x[i], b))) b = x[i];
    return b;
}

/* victim: the copy to evict from c (-1: none may go). prot_ok: the cache
 * has protected copies (only the high one, only in layer lc). */
static int32_t victim(const struct sim *s, const struct cache *c, int prot_ok) {
    const double *mul = s->mul + (size_t)s->lc * s->L, *add = s->add + (size_t)s->lc * s->L;
    const double scale = s->scale;
    int v = -1;
    double vs = INFINITY;
    int64_t vst = 0;
    for (int l = 0; l < s->L; l++) { /* the layer minima, read from contiguous arrays */
        if (c->best[l] < 0) continue;
        double sc = c->bk[l] * mul[l] + scale * add[l];
        if (v < 0 || sc < vs || (sc == vs && (c->bst[l] < vst || (c->bst[l] == vst && c->best[l] < c->best[v]))))
            v = l, vs = sc, vst = c->bst[l];
    }
    if (v < 0) return -1;
    if (!prot_ok || s->prot[c->best[v]] != s->step) return c->best[v];
    /* the best copy is protected (layer lc): search again with lc's unprotected minimum */
    int32_t w = -1;
    vs = INFINITY;
    for (int l = 0; l < s->L; l++) {
        int32_t g = c->best[l];
        if (g < 0) continue;
        if (l == s->lc && s->prot[g] == s->step && (g = layer_min_unprotected(s, c, l)) < 0) continue;
        double sc = c->k[g] * mul[l] + scale * add[l];
        if (w < 0 || sc < vs || (sc == vs && (s->stamp[g] < s->stamp[w] || (s->stamp[g] == s->stamp[w] && g < w))))
            w = g, vs = sc;
    }
    return w;
}

/* cache_add / cache_remove: the layer lists and minima. */
static void cache_add(const struct sim *s, struct cache *c, int32_t g) {
    const int l = g / s->E;
    c->at[g] = c->cnt[l];
    c->list[(size_t)l * s->E + c->cnt[l]++] = g;
    c->n++;
    if (c->best[l] < 0 || before(s, c, g, c->best[l])) set_best(s, c, l, g);
}

static void cache_remove(const struct sim *s, struct cache *c, int32_t g) {
    const int l = g / s->E;
    int32_t *x = c->list + (size_t)l * s->E, i = c->at[g], last = x[--c->cnt[l]];
    x[i] = last;
    c->at[last] = i;
    c->at[g] = -1;
    c->n--;
    if (c->best[l] == g) rescan(s, c, l);
}

/* key_of: the policy key of expert g's copy in cache c (hi: 1 for the high
 * cache), from the records; for Belady `next` is its next use. */
static inline double key_of(const struct sim *s, int32_t g, int32_t next) {
    const double *w = s->c->w;
    switch (s->p) {
    case MOE_CACHE_LFU_SEQ: return s->F[g];
    case MOE_CACHE_LFU_GLOBAL: return (double)s->Fg[g];
    case MOE_CACHE_LHU: return s->H[g];
    case MOE_CACHE_EDGEMOE: return s->c->freq ? s->c->freq[g] : 1.0;
    case MOE_CACHE_HOBBIT: return w[0] * s->R[g] + w[1] * s->F[g] + w[2] * s->H[g];
    case MOE_CACHE_BELADY: return -(double)next;
    default: return 0; /* LRU, FLD: last use and layer only */
    }
}

/* rekey: expert g's key (and last use) changed: keep the layer minimum. */
static inline void rekey(const struct sim *s, struct cache *c, int32_t g, double k) {
    const int l = g / s->E;
    c->k[g] = k;
    if (c->best[l] == g) rescan(s, c, l);
    else if (before(s, c, g, c->best[l])) set_best(s, c, l, g);
}

/* put: load g's copy into c for access with next use `next`; returns 1 if it
 * is now cached (0: no room that may be freed, or Belady bypasses it). */
static int put(struct sim *s, struct cache *c, int32_t g, int32_t next, int prot_ok) {
    if (c->cap <= 0) return 0;
    c->k[g] = key_of(s, g, next);
    if (c->n >= c->cap) {
        int32_t v = victim(s, c, prot_ok);
        if (v < 0) return 0;
        if (s->p == MOE_CACHE_BELADY && next >= -c->k[v]) return 0; /* the incoming copy is needed last */
        cache_remove(s, c, v);
        if (c == &s->hi) s->prot[v] = s->pfl[v] = -1;
    }
    cache_add(s, c, g);
    return 1;
}

/* new_sequence: reset the per-sequence records and the keys built on them. */
static void new_sequence(struct sim *s) {
    const size_t LE = (size_t)s->L * s->E;
    memset(s->R, 0, LE * sizeof *s->R);
    memset(s->F, 0, LE * sizeof *s->F);
    memset(s->H, 0, LE * sizeof *s->H);
    if (s->p != MOE_CACHE_LFU_SEQ && s->p != MOE_CACHE_LHU && s->p != MOE_CACHE_HOBBIT) return;
    struct cache *cs[2] = {&s->hi, &s->lo};
    for (int i = 0; i < 2; i++)
        for (int l = 0; l < s->L; l++) {
            const int32_t *x = cs[i]->list + (size_t)l * s->E;
            for (int j = 0; j < cs[i]->cnt[l]; j++) cs[i]->k[x[j]] = 0;
            rescan(s, cs[i], l);
        }
}

/* prefetch: load the step's prefetch list into the high cache (protected
 * until the step has run). At most high_cap - 1 copies are protected so a
 * demand miss always finds room. */
static void prefetch(struct sim *s, struct moe_cache_stats *st) {
    const struct moe_cache_trace *tr = s->tr;
    int n_prot = 0;
    for (int32_t i = tr->step_pf[s->step]; i < tr->step_pf[s->step + 1] && n_prot < s->hi.cap - 1; i++) {
        int32_t g = tr->pf_g[i];
        if (s->hi.at[g] < 0) {
            if (!put(s, &s->hi, g, NEVER, 1)) continue;
            s->pfl[g] = s->step;
            st->prefetch_loads++;
        }
        s->prot[g] = s->step;
        n_prot++;
    }
}

/* replay: the main loop of every policy but STATIC. */
static void replay(struct sim *s, struct moe_cache_stats *st) {
    const struct moe_cache_trace *tr = s->tr;
    const int use_pf = s->c->prefetch && s->p != MOE_CACHE_BELADY && tr->n_pf > 0 && s->hi.cap >= 2;
    const int is_hobbit = s->p == MOE_CACHE_HOBBIT, rekeys = s->p != MOE_CACHE_EDGEMOE && s->p != MOE_CACHE_LRU &&
                                                              s->p != MOE_CACHE_FLD;
    const double wfld = s->c->w[3];
    for (int q = 0; q < tr->n_seq; q++) {
        new_sequence(s);
        for (int32_t step = tr->seq_step[q]; step < tr->seq_step[q + 1]; step++) {
            const int32_t T = tr->step_T[step];
            s->step = step;
            s->lc = tr->step_layer[step];
            s->scale = is_hobbit ? wfld * T : 1.0;
            if (use_pf) prefetch(s, st);
            for (int32_t i = tr->step_acc[step]; i < tr->step_acc[step + 1]; i++) {
                const int32_t g = tr->acc_g[i];
                const int need = tr->acc_need[i];
                int in_hi = s->hi.at[g] >= 0, in_lo = s->lo.at[g] >= 0;
                if (in_hi) {
                    st->hits_high++;
                    st->prefetch_hits += s->pfl[g] == step;
                } else if (in_lo && need != MOE_CACHE_NEED_HIGH) {
                    st->hits_low++;
                } else if (need == MOE_CACHE_NEED_SKIP) {
                    st->skips++;
                    continue;
                } else if (need == MOE_CACHE_NEED_HIGH) {
                    st->misses_high++;
                    in_hi = put(s, &s->hi, g, tr->next_hi[i], use_pf);
                } else {
                    st->misses_low++;
                    in_lo = put(s, &s->lo, g, tr->next_lo[i], 0);
                }
                s->stamp[g] = ++s->clock;
                s->R[g] = T;
                s->F[g]++;
                s->Fg[g]++;
                s->H[g] += need == MOE_CACHE_NEED_HIGH;
                if (in_hi) rekey(s, &s->hi, g, rekeys ? key_of(s, g, tr->next_hi[i]) : s->hi.k[g]);
                if (in_lo) rekey(s, &s->lo, g, rekeys ? key_of(s, g, tr->next_lo[i]) : s->lo.k[g]);
            }
        }
    }
}

/* replay_static: Twiddler's placement: the high_cap most popular experts'
 * high copies and the next low_cap experts' low copies are pinned. A pinned
 * copy is loaded by the first access that needs its precision (every policy
 * starts with empty caches and pays its cold misses) and stays; every other
 * miss goes through a scratch slot: loaded, used and dropped. */
static enum moe_status replay_static(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                                     struct moe_cache_stats *st) {
    const int LE = tr->L * tr->E;
    uint8_t *pin = calloc((size_t)LE, 2), *in = pin + LE; /* pin: 2 high copy, 1 low copy; in: loaded */
    if (!pin) return MOE_ERR_NOMEM;
    for (int i = 0, n = 0; i < LE && n < c->high_cap + c->low_cap; i++) {
        int32_t g = c->order[i];
        if (g < 0 || g >= LE || pin[g]) continue; /* a damaged order: skip, never crash */
        pin[g] = n++ < c->high_cap ? 2 : 1;
    }
    for (int64_t i = 0; i < tr->n_acc; i++) {
        const int32_t g = tr->acc_g[i];
        const int r = in[g] ? pin[g] : 0, need = tr->acc_need[i];
        if (r == 2) st->hits_high++;
        else if (r == 1 && need != MOE_CACHE_NEED_HIGH) st->hits_low++;
        else if (need == MOE_CACHE_NEED_SKIP) st->skips++;
        else if (need == MOE_CACHE_NEED_HIGH) st->misses_high++, in[g] |= pin[g] == 2;
        else st->misses_low++, in[g] |= pin[g] == 1;
    }
    free(pin);
    return MOE_OK;
}

/* check_config: what moe_cache_simulate refuses. */
static enum moe_status check_config(const struct moe_cache_trace *tr, enum moe_cache_policy p,
                                    const struct moe_cache_config *c) {
    if (!tr || !c || (unsigned)p >= MOE_CACHE_N_POLICIES) {
        MOE_LOGE("no trace, no configuration or unknown policy %d", (int)p);
        return MOE_ERR_INVALID;
    }
    if (c->high_cap < 0 || c->low_cap < 0 || !(c->low_cost >= 0) || !isfinite(c->low_cost) ||
        !(c->high_bytes >= 0) || !(c->low_bytes >= 0)) {
        MOE_LOGE("invalid configuration: capacities %d, %d, low cost %g, bytes %g, %g", c->high_cap, c->low_cap,
                 c->low_cost, c->high_bytes, c->low_bytes);
        return MOE_ERR_INVALID;
    }
    if (p == MOE_CACHE_STATIC && !c->order) {
        MOE_LOGE("the static placement needs a popularity order");
        return MOE_ERR_INVALID;
    }
    if (p == MOE_CACHE_HOBBIT) {
        double sum = 0;
        for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) {
            if (!(c->w[i] >= 0) || !isfinite(c->w[i])) goto bad_w;
            sum += c->w[i];
        }
        if (fabs(sum - 1) > 1e-6) goto bad_w;
    }
    return MOE_OK;
bad_w:
    MOE_LOGE("HOBBIT weights %g, %g, %g, %g must be >= 0 and sum to 1", c->w[0], c->w[1], c->w[2], c->w[3]);
    return MOE_ERR_INVALID;
}

/* layer_tables: the layer terms of the policy: FLD -d, EdgeMoE 1/d with the
 * forward distance d = ((lt - lc - 1 + L) mod L) + 1, HOBBIT
 * 1 - ((lt - lc + L) mod L) / L (scaled by w_fld T at each step). */
static void layer_tables(struct sim *s) {
    const int L = s->L;
    for (int lc = 0; lc < L; lc++)
        for (int lt = 0; lt < L; lt++) {
            double d = (double)(((lt - lc - 1 + L) % L) + 1), *m = &s->mul[lc * L + lt], *a = &s->add[lc * L + lt];
            *m = 1, *a = 0;
            if (s->p == MOE_CACHE_FLD) *a = -d;
            else if (s->p == MOE_CACHE_EDGEMOE) *m = 1.0 / d;
            else if (s->p == MOE_CACHE_HOBBIT) *a = 1.0 - (double)((lt - lc + L) % L) / L;
        }
}

/* sim_alloc: the state of one replay (every array in one block). */
static void *sim_alloc(struct sim *s) {
    const size_t LE = (size_t)s->L * s->E, L = (size_t)s->L;
    size_t n = LE * (8 + 8 + 4 * 5) + 2 * L * L * 8 + 2 * (LE * (4 + 4 + 8) + L * (8 + 8 + 8));
    char *b = calloc(1, n), *q = b;
    if (!b) return NULL;
#define TAKE(ptr, count) (ptr = (void *)q, q += sizeof *(ptr) * (count))
    TAKE(s->stamp, LE), TAKE(s->Fg, LE), TAKE(s->mul, L * L), TAKE(s->add, L * L);
    TAKE(s->hi.k, LE), TAKE(s->lo.k, LE), TAKE(s->hi.bk, L), TAKE(s->lo.bk, L), TAKE(s->hi.bst, L), TAKE(s->lo.bst, L);
    TAKE(s->R, LE), TAKE(s->F, LE), TAKE(s->H, LE), TAKE(s->prot, LE), TAKE(s->pfl, LE);
    struct cache *cs[2] = {&s->hi, &s->lo};
    for (int i = 0; i < 2; i++) TAKE(cs[i]->list, LE), TAKE(cs[i]->at, LE), TAKE(cs[i]->cnt, L), TAKE(cs[i]->best, L);
#undef TAKE
    for (size_t i = 0; i < LE; i++) s->prot[i] = s->pfl[i] = s->hi.at[i] = s->lo.at[i] = -1;
    for (size_t i = 0; i < L; i++) s->hi.best[i] = s->lo.best[i] = -1, s->hi.bk[i] = s->lo.bk[i] = INFINITY;
    return b;
}

enum moe_status moe_cache_simulate(const struct moe_cache_trace *tr, enum moe_cache_policy p,
                                   const struct moe_cache_config *c, struct moe_cache_stats *out) {
    enum moe_status st;
    memset(out, 0, sizeof *out);
    if ((st = check_config(tr, p, c))) return st;
    out->tokens = tr->tokens;
    out->accesses = tr->n_acc;
    if (p == MOE_CACHE_STATIC) {
        if ((st = replay_static(tr, c, out))) goto nomem;
    } else {
        struct sim s;
        memset(&s, 0, sizeof s);
        s.tr = tr, s.c = c, s.p = p, s.L = tr->L, s.E = tr->E;
        s.hi.cap = c->high_cap, s.lo.cap = c->low_cap;
        void *block = sim_alloc(&s);
        if (!block) goto nomem;
        layer_tables(&s);
        replay(&s, out);
        free(block);
    }
    out->penalty = (double)out->misses_high + c->low_cost * (double)out->misses_low;
    out->bytes = (double)(out->misses_high + out->prefetch_loads) * c->high_bytes +
                 (double)out->misses_low * c->low_bytes;
    return MOE_OK;
nomem:
    MOE_LOGE("out of memory");
    return MOE_ERR_NOMEM;
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
    struct moe_cache_fit_params p = {10, 4, NULL, NULL};
    return p;
}

/* Fit state: the configuration copy whose weights are tried. */
struct fit {
    const struct moe_cache_trace *tr;
    struct moe_cache_config c;
    const struct moe_cache_fit_params *fp;
    int evals, total;
};

/* try_w: replay with weights w; *pen its penalty. */
static enum moe_status try_w(struct fit *f, const double *w, struct moe_cache_stats *out) {
    memcpy(f->c.w, w, sizeof f->c.w);
    enum moe_status st = moe_cache_simulate(f->tr, MOE_CACHE_HOBBIT, &f->c, out);
    f->evals++;
    if (f->fp->progress) f->fp->progress(f->evals, f->total, f->fp->user);
    return st;
}

enum moe_status moe_cache_fit_hobbit(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                                     const struct moe_cache_fit_params *fp, double w[MOE_CACHE_N_WEIGHTS],
                                     struct moe_cache_stats *best, int *evals) {
    struct moe_cache_fit_params dp = moe_cache_fit_default_params();
    if (!fp) fp = &dp;
    if (!tr || !c || fp->grid < 1 || fp->grid > 1000 || fp->refine_rounds < 0 || fp->refine_rounds > 30) {
        MOE_LOGE("invalid fit parameters (grid %d, refinement rounds %d)", fp->grid, fp->refine_rounds);
        return MOE_ERR_INVALID;
    }
    const int G = fp->grid;
    struct fit f = {tr, *c, fp, 0, (G + 1) * (G + 2) * (G + 3) / 6};
    struct moe_cache_stats cur, bs;
    double bw[4] = {0, 0, 0, 1}, tw[4];
    enum moe_status st;
    int have = 0;
    for (int a = 0; a <= G; a++) /* the simplex grid, w_lru slowest */
        for (int b = 0; a + b <= G; b++)
            for (int d = 0; a + b + d <= G; d++) {
                tw[0] = (double)a / G, tw[1] = (double)b / G, tw[2] = (double)d / G, tw[3] = (double)(G - a - b - d) / G;
                if ((st = try_w(&f, tw, &cur))) return st;
                if (!have || cur.penalty < bs.penalty) memcpy(bw, tw, sizeof bw), bs = cur, have = 1;
            }
    double h = 0.5 / G;
    for (int r = 0; r < fp->refine_rounds; r++, h /= 2) /* local moves of h from weight i to j */
        for (int it = 0; it < 64; it++) {
            double mw[4];
            struct moe_cache_stats ms;
            int moved = 0;
            memset(&ms, 0, sizeof ms);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
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
    double sum = bw[0] + bw[1] + bw[2] + bw[3];
    for (int i = 0; i < 4; i++) w[i] = bw[i] / sum;
    if (best) *best = bs;
    if (evals) *evals = f.evals;
    return MOE_OK;
}
