/*
 * cache.c - the expert-cache policy core (see moe-cache.h and
 * docs/cache-sim.md): the state machine that both the runtime's expert store
 * and fit-cache's simulator drive, access by access.
 *
 * Speed. Every policy ranks the cached copies by a pair (key, last use) and
 * evicts the smallest; the key of an expert changes only when that expert is
 * accessed (or, for the per-sequence records, at a sequence boundary), and
 * the layer-dependent part of a score is the same for every expert of a
 * layer: score = key * mul(lc, lt) + scale * add(lc, lt), where lc is the
 * current layer and lt the cached expert's. So each cache keeps, per layer,
 * the list of its cached experts and the layer's smallest (key, last use,
 * id); a victim is the best of the L layer minima with the layer term
 * applied (O(L) per miss), and a layer is rescanned only when its minimum is
 * accessed or evicted. mul and add depend only on (lt - lc) mod L, so one
 * table of 2L entries, read from offset L - lc, serves every current layer.
 * Nothing is allocated after moe_cache_new.
 */
#include "moe-cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ names */

static const char *const k_names[MOE_CACHE_N_POLICIES] = {"lru", "lfu-seq", "lfu-global", "lhu", "fld",
                                                         "edgemoe", "twiddler", "hobbit", "belady"};

const char *moe_cache_policy_name(enum moe_cache_policy p) {
    return (unsigned)p < MOE_CACHE_N_POLICIES ? k_names[p] : "?";
}

enum moe_status moe_cache_policy_parse(const char *name, enum moe_cache_policy *out) {
    for (int i = 0; name && i < MOE_CACHE_N_POLICIES; i++)
        if (!strcmp(name, k_names[i])) {
            *out = (enum moe_cache_policy)i;
            return MOE_OK;
        }
    return MOE_ERR_INVALID;
}

/* ---------------------------------------------------------- configuration */

struct moe_cache_config moe_cache_default_config(void) {
    struct moe_cache_config c;
    memset(&c, 0, sizeof c);
    c.low_cost = 0.5;
    for (int i = 0; i < 4; i++) c.w[i] = 0.25; /* w_pop stays 0 */
    return c;
}

enum moe_status moe_cache_check_config(enum moe_cache_policy p, const struct moe_cache_config *c) {
    if (!c || (unsigned)p >= MOE_CACHE_N_POLICIES) {
        MOE_LOGE("no configuration or unknown policy %d", (int)p);
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
    if ((c->admit != 0 && c->admit != 1) || !c->freq_high != !c->freq_low) {
        MOE_LOGE("invalid configuration: admit %d (0 or 1), per-need frequencies %s", c->admit,
                 !c->freq_high != !c->freq_low ? "given one without the other" : "fine");
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
    MOE_LOGE("HOBBIT weights %g, %g, %g, %g, %g must be >= 0 and sum to 1", c->w[0], c->w[1], c->w[2], c->w[3],
             c->w[4]);
    return MOE_ERR_INVALID;
}

/* ------------------------------------------------------------------ state */

/* One cache (high or low precision copies). */
struct cache {
    int cap, n;
    int ext;       /* the effective key is not k: HOBBIT's popularity term, or its admission
                    * rule for low copies (the low cache) */
    double *k;     /* [LE] policy key of the cached copy (smaller = evicted first), without
                    * HOBBIT's popularity term */
    double *bk;    /* [L] effective key of best[l] (+inf when empty): the victim search reads these */
    double *btp;   /* [L] the popularity scale tp best[l] was found under (HOBBIT with w_pop) */
    double *pop;   /* [LE] HOBBIT's popularity of a copy in this cache (see popularity) */
    int64_t *bst;  /* [L] last use of best[l] */
    int32_t *list; /* [L*E] the cached experts of layer l at [l*E, l*E + cnt[l]) */
    int32_t *cnt;  /* [L] */
    int32_t *at;   /* [LE] index in its layer's list, -1 when not cached */
    int32_t *best; /* [L] the layer's smallest (key, last use, id); -1 when empty */
};

struct moe_cache {
    struct moe_cache_config c; /* copied; freq and order borrowed */
    enum moe_cache_policy p;
    int L, E;
    int rekeys;       /* the key depends on records that a use changes */
    int pop_on;       /* HOBBIT with w_pop > 0: effective key = k + tp * freq */
    int admit;        /* HOBBIT with admission: a demand load must outrank its victim */
    double tp;        /* w_pop * T of the current step (0 without the term) */
    int64_t clock;    /* demand uses so far */
    int64_t *stamp;   /* [LE] clock of the last demand use (0 = never) */
    int64_t *Fg;      /* [LE] uses since the start */
    int32_t *R, *F, *H; /* [LE] per sequence: last use (token index + 1), uses, high-need uses */
    int32_t *prot;    /* [LE] last step the high copy is protected for (prefetch), -1 */
    int32_t *pfl;     /* [LE] step a prefetch loaded the high copy for, -1 */
    int32_t *plist;   /* [LE] the copies that may still be protected (pruned at each step) */
    int n_plist;      /* entries of plist; all protected now between two begin_step calls */
    double *mul_t, *add_t; /* [2L] layer terms by (lt - lc + L): score = k * mul + scale * add */
    const double *mul, *add; /* the current layer's view: mul[lt], add[lt] */
    double scale;
    int32_t step, T;
    int lc;
    struct cache hi, lo;
    uint8_t *pin, *in; /* STATIC: [LE] 2 high copy pinned, 1 low copy pinned; loaded */
    int n_in[2];       /* STATIC: pinned copies loaded (low, high) */
};

/* ekey: the effective key of g's copy in c. HOBBIT's popularity term
 * w_pop * f (times T, like the other terms of p * T) grows with T, so it is
 * added here rather than stored: a layer minimum found under another T is
 * stale (see fresh). */
static inline double ekey(const struct moe_cache *s, const struct cache *c, int32_t g) {
    if (!c->ext) return c->k[g]; /* every policy but the extended HOBBIT */
    if (c == &s->lo && s->admit && s->hi.at[g] >= 0) return -INFINITY; /* the high copy serves every need */
    return s->pop_on ? c->k[g] + s->tp * c->pop[g] : c->k[g];
}

/* before: a ranks before b for eviction in cache c (smaller key, then older
 * last use, then lower id). */
static inline int before(const struct moe_cache *s, const struct cache *c, int32_t a, int32_t b) {
    const double ka = ekey(s, c, a), kb = ekey(s, c, b);
    if (ka != kb) return ka < kb;
    if (s->stamp[a] != s->stamp[b]) return s->stamp[a] < s->stamp[b];
    return a < b;
}

/* set_best: g (-1: none) is now the minimum of layer l. */
static inline void set_best(const struct moe_cache *s, struct cache *c, int l, int32_t g) {
    c->best[l] = g;
    c->bk[l] = g >= 0 ? ekey(s, c, g) : INFINITY;
    c->bst[l] = g >= 0 ? s->stamp[g] : 0;
    c->btp[l] = s->tp;
}

/* rescan: recompute the minimum of layer l in cache c. */
static void rescan(const struct moe_cache *s, struct cache *c, int l) {
    const int32_t *x = c->list + (size_t)l * s->E;
    int32_t b = -1;
    for (int i = 0; i < c->cnt[l]; i++)
        if (b < 0 || before(s, c, x[i], b)) b = x[i];
    set_best(s, c, l, b);
}

/* fresh: make layer l's minimum valid for the current step (with a
 * popularity term the order of a layer's copies can change with T: rescan
 * once per layer and T, when the layer is next looked at). */
static inline void fresh(const struct moe_cache *s, struct cache *c, int l) {
    if (s->pop_on && c->btp[l] != s->tp) rescan(s, c, l);
}

/* is_prot: g's high copy is protected now. */
static inline int is_prot(const struct moe_cache *s, int32_t g) { return s->prot[g] >= s->step; }

/* layer_min_unprotected: layer l's minimum over copies not protected now. */
static int32_t layer_min_unprotected(const struct moe_cache *s, const struct cache *c, int l) {
    const int32_t *x = c->list + (size_t)l * s->E;
    int32_t b = -1;
    for (int i = 0; i < c->cnt[l]; i++)
        if (!is_prot(s, x[i]) && (b < 0 || before(s, c, x[i], b))) b = x[i];
    return b;
}

/* victim: the copy to evict from c (-1: none may go). prot_ok: c may hold
 * protected copies (the high cache while some are). */
static int32_t victim(const struct moe_cache *s, struct cache *c, int prot_ok) {
    const double *mul = s->mul, *add = s->add;
    const double scale = s->scale;
    int v = -1;
    double vs = INFINITY;
    int64_t vst = 0;
    for (int l = 0; s->pop_on && l < s->L; l++) fresh(s, c, l);
    for (int l = 0; l < s->L; l++) { /* the layer minima, read from contiguous arrays */
        if (c->best[l] < 0) continue;
        double sc = c->bk[l] * mul[l] + scale * add[l];
        if (v < 0 || sc < vs || (sc == vs && (c->bst[l] < vst || (c->bst[l] == vst && c->best[l] < c->best[v]))))
            v = l, vs = sc, vst = c->bst[l];
    }
    if (v < 0) return -1;
    if (!prot_ok || !is_prot(s, c->best[v])) return c->best[v];
    /* the best copy is protected: search again with each layer's unprotected minimum */
    int32_t w = -1;
    vs = INFINITY;
    for (int l = 0; l < s->L; l++) {
        int32_t g = c->best[l];
        if (g < 0) continue;
        if (is_prot(s, g) && (g = layer_min_unprotected(s, c, l)) < 0) continue;
        double sc = ekey(s, c, g) * mul[l] + scale * add[l];
        if (w < 0 || sc < vs || (sc == vs && (s->stamp[g] < s->stamp[w] || (s->stamp[g] == s->stamp[w] && g < w))))
            w = g, vs = sc;
    }
    return w;
}

/* cache_add / cache_remove: the layer lists and minima. */
static void cache_add(const struct moe_cache *s, struct cache *c, int32_t g) {
    const int l = g / s->E;
    fresh(s, c, l);
    c->at[g] = c->cnt[l];
    c->list[(size_t)l * s->E + c->cnt[l]++] = g;
    c->n++;
    if (c->best[l] < 0 || before(s, c, g, c->best[l])) set_best(s, c, l, g);
}

static void cache_remove(const struct moe_cache *s, struct cache *c, int32_t g) {
    const int l = g / s->E;
    int32_t *x = c->list + (size_t)l * s->E, i = c->at[g], last = x[--c->cnt[l]];
    x[i] = last;
    c->at[last] = i;
    c->at[g] = -1;
    c->n--;
    if (c->best[l] == g) rescan(s, c, l);
}

/* key_of: the policy key of expert g's copy from the records; for Belady
 * `next` is its next use (of the precision of the cache it is in). */
static inline double key_of(const struct moe_cache *s, int32_t g, int32_t next) {
    const double *w = s->c.w;
    switch (s->p) {
    case MOE_CACHE_LFU_SEQ: return s->F[g];
    case MOE_CACHE_LFU_GLOBAL: return (double)s->Fg[g];
    case MOE_CACHE_LHU: return s->H[g];
    case MOE_CACHE_EDGEMOE: return s->c.freq ? s->c.freq[g] : 1.0;
    case MOE_CACHE_HOBBIT: return w[0] * s->R[g] + w[1] * s->F[g] + w[2] * s->H[g];
    case MOE_CACHE_BELADY: return -(double)next;
    default: return 0; /* LRU, FLD: last use and layer only */
    }
}

/* rekey: expert g's key (and last use) changed: keep the layer minimum. */
static inline void rekey(const struct moe_cache *s, struct cache *c, int32_t g, double k) {
    const int l = g / s->E;
    c->k[g] = k;
    if (c->best[l] == g || (s->pop_on && c->btp[l] != s->tp)) rescan(s, c, l);
    else if (before(s, c, g, c->best[l])) set_best(s, c, l, g);
}

/* put: load g's copy into c for an access whose next use is `next`; returns
 * 1 if it is now cached (0: no room that may be freed, or Belady bypasses
 * it); *ev receives the evicted copy or -1. */
static int put(struct moe_cache *s, struct cache *c, int32_t g, int32_t next, int need, int32_t *ev) {
    *ev = -1;
    if (c->cap <= 0) return 0;
    c->k[g] = key_of(s, g, next);
    if (c->n >= c->cap) {
        int32_t v = victim(s, c, c == &s->hi && s->n_plist > 0);
        if (v < 0) return 0;
        if (s->p == MOE_CACHE_BELADY && next >= -c->k[v]) return 0; /* the incoming copy is needed last */
        if (s->admit && need >= 0) { /* HOBBIT: keep it only if it outranks the victim after this use */
            const double *w = s->c.w;
            const int lg = g / s->E, lv = v / s->E;
            const double kin = w[0] * s->T + w[1] * (s->F[g] + 1) + w[2] * (s->H[g] + (need == MOE_CACHE_NEED_HIGH)) +
                               (s->pop_on ? s->tp * c->pop[g] : 0.0);
            if (kin + s->scale * s->add[lg] < ekey(s, c, v) * s->mul[lv] + s->scale * s->add[lv]) return 0;
        }
        cache_remove(s, c, v);
        if (c == &s->hi) s->prot[v] = s->pfl[v] = -1;
        if (c == &s->hi && s->admit && s->lo.at[v] >= 0) rekey(s, &s->lo, v, s->lo.k[v]); /* useful again */
        *ev = v;
    }
    cache_add(s, c, g);
    if (c == &s->hi && s->admit && s->lo.at[g] >= 0) rekey(s, &s->lo, g, s->lo.k[g]); /* now worthless */
    return 1;
}

/* ------------------------------------------------------------- lifecycle */

/* layer_tables: the layer terms of the policy by j = (lt - lc) mod L: FLD
 * -d, EdgeMoE 1/d with the forward distance d = ((j - 1 + L) mod L) + 1,
 * HOBBIT 1 - j / L (scaled by w_fld T at each step); stored twice so that
 * the view from offset L - lc is indexed by lt directly. */
static void layer_tables(struct moe_cache *s) {
    const int L = s->L;
    for (int i = 0; i < 2 * L; i++) {
        const int j = i % L;
        const double d = (double)(((j - 1 + L) % L) + 1);
        double m = 1, a = 0;
        if (s->p == MOE_CACHE_FLD) a = -d;
        else if (s->p == MOE_CACHE_EDGEMOE) m = 1.0 / d;
        else if (s->p == MOE_CACHE_HOBBIT) a = 1.0 - (double)j / L;
        s->mul_t[i] = m, s->add_t[i] = a;
    }
}

/* popularity: HOBBIT's static popularity of each copy, the penalty keeping
 * it avoids per token in units of its own miss: a high copy serves high
 * needs (a miss costs 1) and low ones (low_cost), so f_high + low_cost f_low;
 * a low copy serves low needs only, f_low. Without the per-need shares
 * both caches use freq (all 1 without it). */
static void popularity(struct moe_cache *s) {
    const struct moe_cache_config *c = &s->c;
    const size_t LE = (size_t)s->L * s->E;
    for (size_t g = 0; g < LE; g++) {
        if (c->freq_high && c->freq_low) {
            s->hi.pop[g] = c->freq_high[g] + c->low_cost * c->freq_low[g];
            s->lo.pop[g] = c->freq_low[g];
        } else {
            s->hi.pop[g] = s->lo.pop[g] = c->freq ? c->freq[g] : 1.0;
        }
    }
}

/* pin_static: Twiddler's placement: the high_cap most popular experts' high
 * copies and the next low_cap experts' low copies are pinned. */
static void pin_static(struct moe_cache *s) {
    const int LE = s->L * s->E;
    const int64_t want = (int64_t)s->c.high_cap + s->c.low_cap;
    for (int i = 0, n = 0; i < LE && n < want; i++) {
        int32_t g = s->c.order[i];
        if (g < 0 || g >= LE || s->pin[g]) continue; /* a damaged order: skip, never crash */
        s->pin[g] = n++ < s->c.high_cap ? 2 : 1;
    }
}

enum moe_status moe_cache_new(int n_layers, int n_experts, enum moe_cache_policy p,
                              const struct moe_cache_config *c, struct moe_cache **out) {
    enum moe_status st;
    *out = NULL;
    if (n_layers < 1 || n_experts < 1 || (int64_t)n_layers * n_experts > INT32_MAX / 4) {
        MOE_LOGE("invalid cache shape: %d layers x %d experts", n_layers, n_experts);
        return MOE_ERR_INVALID;
    }
    if ((st = moe_cache_check_config(p, c))) return st;
    const size_t LE = (size_t)n_layers * n_experts, L = (size_t)n_layers;
    /* every array in one block: 8-byte items first, then 4-byte, then bytes */
    const size_t n8 = LE * 2 + 2 * L * 2 + 2 * (2 * LE + 3 * L);
    const size_t n4 = LE * 6 + 2 * (LE * 2 + L * 2);
    const size_t n1 = p == MOE_CACHE_STATIC ? 2 * LE : 0;
    struct moe_cache *s = calloc(1, sizeof *s);
    char *b = calloc(1, n8 * 8 + n4 * 4 + n1), *q = b;
    if (!s || !b) {
        free(s);
        free(b);
        MOE_LOGE("out of memory for a cache of %d x %d experts", n_layers, n_experts);
        return MOE_ERR_NOMEM;
    }
#define TAKE(ptr, count) (ptr = (void *)q, q += sizeof *(ptr) * (count))
    TAKE(s->stamp, LE), TAKE(s->Fg, LE), TAKE(s->mul_t, 2 * L), TAKE(s->add_t, 2 * L);
    struct cache *cs[2] = {&s->hi, &s->lo};
    for (int i = 0; i < 2; i++)
        TAKE(cs[i]->k, LE), TAKE(cs[i]->bk, L), TAKE(cs[i]->bst, L), TAKE(cs[i]->btp, L), TAKE(cs[i]->pop, LE);
    TAKE(s->R, LE), TAKE(s->F, LE), TAKE(s->H, LE), TAKE(s->prot, LE), TAKE(s->pfl, LE), TAKE(s->plist, LE);
    for (int i = 0; i < 2; i++) TAKE(cs[i]->list, LE), TAKE(cs[i]->at, LE), TAKE(cs[i]->cnt, L), TAKE(cs[i]->best, L);
    if (n1) TAKE(s->pin, LE), TAKE(s->in, LE);
#undef TAKE
    s->c = *c, s->p = p, s->L = n_layers, s->E = n_experts;
    s->hi.cap = c->high_cap, s->lo.cap = c->low_cap;
    s->rekeys = p != MOE_CACHE_EDGEMOE && p != MOE_CACHE_LRU && p != MOE_CACHE_FLD;
    s->pop_on = p == MOE_CACHE_HOBBIT && c->w[4] > 0;
    s->admit = p == MOE_CACHE_HOBBIT && c->admit;
    s->hi.ext = s->pop_on, s->lo.ext = s->pop_on || s->admit;
    for (size_t i = 0; i < LE; i++) s->prot[i] = s->pfl[i] = s->hi.at[i] = s->lo.at[i] = -1;
    for (size_t i = 0; i < L; i++) s->hi.best[i] = s->lo.best[i] = -1, s->hi.bk[i] = s->lo.bk[i] = INFINITY;
    layer_tables(s);
    popularity(s);
    s->step = -1, s->T = 1, s->lc = 0, s->scale = 1;
    s->mul = s->mul_t + L, s->add = s->add_t + L;
    if (p == MOE_CACHE_STATIC) pin_static(s);
    *out = s;
    return MOE_OK;
}

int moe_cache_guard_switch(double policy_penalty, double shadow_penalty) {
    const double r = policy_penalty, s = shadow_penalty;
    return s >= 0 && s < 0.9 * r && r - s >= 2.0 * sqrt(r + s);
}

enum moe_status moe_cache_set_policy(struct moe_cache *s, enum moe_cache_policy p) {
    if ((int)p < 0 || p >= MOE_CACHE_N_POLICIES || p == MOE_CACHE_STATIC || p == MOE_CACHE_BELADY ||
        s->p == MOE_CACHE_STATIC || s->p == MOE_CACHE_BELADY) {
        MOE_LOGE("a cache cannot switch from %s to %s", moe_cache_policy_name(s->p), moe_cache_policy_name(p));
        return MOE_ERR_INVALID;
    }
    s->p = p;
    s->rekeys = p != MOE_CACHE_EDGEMOE && p != MOE_CACHE_LRU && p != MOE_CACHE_FLD;
    s->pop_on = p == MOE_CACHE_HOBBIT && s->c.w[4] > 0;
    s->admit = p == MOE_CACHE_HOBBIT && s->c.admit;
    s->hi.ext = s->pop_on, s->lo.ext = s->pop_on || s->admit;
    layer_tables(s);
    s->scale = p == MOE_CACHE_HOBBIT ? s->c.w[3] * s->T : 1.0;
    s->tp = s->pop_on ? s->c.w[4] * s->T : 0.0;
    struct cache *cs[2] = {&s->hi, &s->lo};
    for (int i = 0; i < 2; i++)
        for (int l = 0; l < s->L; l++) {
            const int32_t *x = cs[i]->list + (size_t)l * s->E;
            for (int j = 0; j < cs[i]->cnt[l]; j++) cs[i]->k[x[j]] = key_of(s, x[j], MOE_CACHE_NEVER);
            rescan(s, cs[i], l);
        }
    return MOE_OK;
}

void moe_cache_free(struct moe_cache *c) {
    if (!c) return;
    free(c->stamp); /* the start of the block */
    free(c);
}

void moe_cache_begin_sequence(struct moe_cache *s) {
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

void moe_cache_begin_step(struct moe_cache *s, int layer, int32_t T) {
    s->step++;
    s->lc = layer >= 0 && layer < s->L ? layer : 0;
    s->T = T;
    s->mul = s->mul_t + (s->L - s->lc), s->add = s->add_t + (s->L - s->lc);
    s->scale = s->p == MOE_CACHE_HOBBIT ? s->c.w[3] * T : 1.0;
    s->tp = s->pop_on ? s->c.w[4] * T : 0.0;
    int n = 0; /* drop the protections that have run out */
    for (int i = 0; i < s->n_plist; i++)
        if (is_prot(s, s->plist[i])) s->plist[n++] = s->plist[i];
    s->n_plist = n;
}

/* ---------------------------------------------------------------- access */

/* access_static: Twiddler: a pinned copy is loaded by the first access that
 * needs its precision and stays; every other miss goes through a scratch
 * slot (kept = 0). */
static void access_static(struct moe_cache *s, int32_t g, enum moe_cache_need need, struct moe_cache_result *r) {
    const int pin = s->pin[g], have = s->in[g] ? pin : 0;
    r->kept = 0;
    if (have == 2) r->outcome = MOE_CACHE_HIT_HIGH;
    else if (have == 1 && need != MOE_CACHE_NEED_HIGH) r->outcome = MOE_CACHE_HIT_LOW;
    else if (need == MOE_CACHE_NEED_SKIP) r->outcome = MOE_CACHE_SKIP;
    else {
        const int want = need == MOE_CACHE_NEED_HIGH ? 2 : 1;
        r->outcome = want == 2 ? MOE_CACHE_MISS_HIGH : MOE_CACHE_MISS_LOW;
        if (pin == want) s->in[g] = 1, s->n_in[want - 1]++, r->kept = 1;
    }
}

/* access_one: moe_cache_access, inlined into the batch entry point too. */
static inline void access_one(struct moe_cache *s, int32_t g, enum moe_cache_need need, int32_t next_high,
                              int32_t next_low, struct moe_cache_result *r) {
    r->evicted = -1;
    r->prefetch_hit = 0;
    if (g < 0 || g >= s->L * s->E) { /* a programmer error: count it as a scratch load */
        r->outcome = need == MOE_CACHE_NEED_SKIP  ? MOE_CACHE_SKIP
                     : need == MOE_CACHE_NEED_LOW ? MOE_CACHE_MISS_LOW
                                                  : MOE_CACHE_MISS_HIGH;
        r->kept = 0;
        return;
    }
    if (s->p == MOE_CACHE_STATIC) {
        access_static(s, g, need, r);
        return;
    }
    int in_hi = s->hi.at[g] >= 0, in_lo = s->lo.at[g] >= 0;
    r->kept = 0;
    if (in_hi) {
        r->outcome = MOE_CACHE_HIT_HIGH;
        r->prefetch_hit = s->pfl[g] == s->step;
    } else if (in_lo && need != MOE_CACHE_NEED_HIGH) {
        r->outcome = MOE_CACHE_HIT_LOW;
    } else if (need == MOE_CACHE_NEED_SKIP) {
        r->outcome = MOE_CACHE_SKIP;
        return; /* nothing used: no record changes */
    } else if (need == MOE_CACHE_NEED_HIGH) {
        r->outcome = MOE_CACHE_MISS_HIGH;
        r->kept = in_hi = put(s, &s->hi, g, next_high, need, &r->evicted);
    } else {
        r->outcome = MOE_CACHE_MISS_LOW;
        r->kept = in_lo = put(s, &s->lo, g, next_low, need, &r->evicted);
    }
    s->stamp[g] = ++s->clock;
    s->R[g] = s->T;
    s->F[g]++;
    s->Fg[g]++;
    s->H[g] += need == MOE_CACHE_NEED_HIGH;
    if (in_hi) rekey(s, &s->hi, g, s->rekeys ? key_of(s, g, next_high) : s->hi.k[g]);
    if (in_lo) rekey(s, &s->lo, g, s->rekeys ? key_of(s, g, next_low) : s->lo.k[g]);
}

void moe_cache_access(struct moe_cache *s, int32_t g, enum moe_cache_need need, int32_t next_high,
                      int32_t next_low, struct moe_cache_result *r) {
    access_one(s, g, need, next_high, next_low, r);
}

void moe_cache_access_n(struct moe_cache *s, int n, const int32_t *g, const uint8_t *need, const int32_t *next_high,
                        const int32_t *next_low, int64_t counts[MOE_CACHE_N_OUTCOMES], int64_t *prefetch_hits) {
    struct moe_cache_result r;
    int64_t hits = 0;
    if (s->p == MOE_CACHE_STATIC) { /* no records, no prefetch: the short loop */
        for (int i = 0; i < n; i++) {
            if (g[i] < 0 || g[i] >= s->L * s->E) access_one(s, g[i], (enum moe_cache_need)need[i], 0, 0, &r);
            else access_static(s, g[i], (enum moe_cache_need)need[i], &r);
            counts[r.outcome]++;
        }
        return;
    }
    for (int i = 0; i < n; i++) {
        access_one(s, g[i], (enum moe_cache_need)need[i], next_high ? next_high[i] : MOE_CACHE_NEVER,
                   next_low ? next_low[i] : MOE_CACHE_NEVER, &r);
        counts[r.outcome]++;
        hits += r.prefetch_hit;
    }
    if (prefetch_hits) *prefetch_hits += hits;
}

int moe_cache_prefetch(struct moe_cache *s, int32_t g, int ahead, struct moe_cache_result *r) {
    if (s->p == MOE_CACHE_STATIC || s->p == MOE_CACHE_BELADY || g < 0 || g >= s->L * s->E || ahead < 0 ||
        s->step < 0 || ahead > INT32_MAX - 1 - s->step)
        return 0;
    const int32_t until = s->step + ahead;
    r->evicted = -1, r->prefetch_hit = 0, r->kept = 0;
    if (s->hi.at[g] >= 0 && is_prot(s, g)) { /* protected already: extend, no new slot */
        if (s->prot[g] < until) s->prot[g] = until;
        r->outcome = MOE_CACHE_HIT_HIGH;
        return 1;
    }
    if (s->n_plist >= s->hi.cap - 1) return 0; /* a demand miss must always find room */
    if (s->hi.at[g] < 0) {
        if (!put(s, &s->hi, g, MOE_CACHE_NEVER, -1, &r->evicted)) return 0;
        s->pfl[g] = until;
        r->outcome = MOE_CACHE_MISS_HIGH, r->kept = 1;
    } else {
        r->outcome = MOE_CACHE_HIT_HIGH;
    }
    s->prot[g] = until;
    s->plist[s->n_plist++] = g;
    return 1;
}

int moe_cache_contains(const struct moe_cache *s, int32_t g, int high) {
    if (g < 0 || g >= s->L * s->E) return 0;
    if (s->p == MOE_CACHE_STATIC) return s->in[g] && s->pin[g] == (high ? 2 : 1);
    return (high ? s->hi.at[g] : s->lo.at[g]) >= 0;
}

int moe_cache_count(const struct moe_cache *s, int high) {
    if (s->p == MOE_CACHE_STATIC) return s->n_in[high ? 1 : 0];
    return high ? s->hi.n : s->lo.n;
}

int moe_cache_route_pick(const float *probs, int E, int32_t *sel, int k, double margin,
                         int (*served)(int expert, int rank, void *user), void *user, double *mass) {
    int n = 0;
    double moved = 0;
    if (!(margin > 0)) goto out;
    for (int j = 1; j < k; j++) { /* never the top-1: replacing it costs the most quality */
        const int32_t e = sel[j];
        if (e < 0 || e >= E || served(e, j, user)) continue;
        int best = -1;
        for (int o = 0; o < E; o++) {
            int taken = 0;
            for (int q = 0; q < k; q++) taken |= sel[q] == o;
            if (taken || (best >= 0 && !(probs[o] > probs[best])) || !served(o, j, user)) continue;
            best = o;
        }
        if (best < 0 || !((double)probs[e] - (double)probs[best] <= margin)) continue;
        moved += (double)probs[e] - (double)probs[best];
        sel[j] = best;
        n++;
    }
out:
    if (mass) *mass = moved;
    return n;
}
