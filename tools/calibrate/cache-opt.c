/*
 * cache-opt.c - the offline optimum of the two-precision expert cache (see
 * cache-opt.h and docs/cache-sim.md, "The offline optimum").
 *
 * The integer program. Drop the skip-need accesses (they cost nothing and
 * load nothing); the others are requests 0..R-1. Expert g's requests
 * t_1 < ... < t_m split time into gaps [t_k, t_{k+1}); its state over a gap
 * is which copies it holds (0, H, L or HL: held after request t_k and still
 * there before t_{k+1}; a copy can only come back at one of g's own
 * requests, so "there at both ends" means "there throughout"). At request
 * t_{k+1} with state s before and s' after:
 *   need high: penalty 1 unless H in s; H may be in s' (hit, or the load
 *              kept); L in s' only if L in s;
 *   need low:  penalty c unless s != 0; H in s' only if H in s; L in s' only
 *              if L in s or s = 0 (a low copy is loaded on a low miss only).
 * Before the first request s = 0; after the last one s' = 0 w.l.o.g. A
 * schedule is feasible iff at every request t at most H experts hold a high
 * copy over the gap containing t (the one that starts at t for the expert
 * requested at t), and at most L a low copy. Any policy of the class
 * (cache-opt.h) gives such states with its own penalty; conversely such
 * states are a policy (evict a copy when its gap's state drops it).
 *
 * The bound. Relax both capacity rows with prices p_t, q_t >= 0: for a
 * policy with states sigma, penalty(sigma) >= penalty(sigma) +
 * sum_t p_t (occH_t - H) + q_t (occL_t - L) since each bracket is <= 0; the
 * right side is sum_g [penalty_g + price of g's holdings] - H sum p - L sum q
 * >= sum_g min over g's own state paths (...) - H sum p - L sum q =: D(p, q),
 * because the per-expert rules above do not involve other experts. So
 * D(p, q) <= every policy's penalty, for every p, q >= 0; each minimum is a
 * shortest path over 4 states per request (relax). D is concave; its
 * projected subgradient is (occH_t - H, occL_t - L) of the minimising paths,
 * and Polyak's step towards the best known schedule's penalty raises it
 * (the maximum equals the LP relaxation of the program above, which tiny
 * random instances show to be almost always integral).
 *
 * Cost per iteration O(R) (16 transitions per request, prefix sums of the
 * prices); memory about 100 bytes per request.
 */
#include "cache-opt.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe-base.h"

enum { S_H = 1, S_L = 2 }; /* state bits: a high copy, a low copy */

struct moe_cache_opt_params moe_cache_opt_default_params(void) {
    struct moe_cache_opt_params p = {5000, 20.0, -1.0, 10 * 1000 * 1000};
    return p;
}

const char *moe_cache_opt_stop_name(enum moe_cache_opt_stop s) {
    static const char *const n[] = {"exact", "converged", "iterations", "time", "too large"};
    return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "?";
}

/* -------------------------------------------------------------- requests */

struct opt {
    int64_t R;
    int LE, H, Lc;
    double c;
    int64_t n_high, n_low;
    int32_t *g;      /* [R] layer * E + expert */
    uint8_t *hi;     /* [R] 1: need high; 0: need low */
    int32_t *nxt;    /* [R] next request of the same expert; R: none */
    int32_t *nxl;    /* [R] next low-need request of the same expert; R: none */
    int32_t *prv;    /* [R] previous request of the same expert; -1: none */
    double *p, *q;   /* [R] prices of the high / low capacity at request t */
    double *bp, *bq; /* [R] the prices of the best bound */
    double *P, *Q;   /* [R + 1] prefix sums of p, q */
    int32_t *dh, *dl;/* [R + 1] occupancy differences of the relaxed solution */
    uint8_t *back;   /* [R] per state after the request (2 bits each): the best state before */
    uint8_t *plan;   /* [R] state after the request in the relaxed solution */
    double (*val)[4];/* [LE] shortest path to the current request, by state */
    uint8_t *cur;    /* [LE] backtracking */
    struct hent { int32_t key, g; } *heap[2]; /* [R + 1] each: lazy max-heaps of next uses */
    uint8_t *in[2];  /* [LE] copy cached (high, low) */
    int32_t *key[2]; /* [LE] its next use */
};

static void opt_free(struct opt *o) {
    free(o->g), free(o->hi), free(o->nxt), free(o->nxl), free(o->prv);
    free(o->p), free(o->q), free(o->bp), free(o->bq), free(o->P), free(o->Q), free(o->dh), free(o->dl);
    free(o->back), free(o->plan), free(o->val), free(o->cur);
    for (int k = 0; k < 2; k++) free(o->heap[k]), free(o->in[k]), free(o->key[k]);
}

/* requests: the non-skip accesses of tr and their links. */
static enum moe_status requests(struct opt *o, const struct moe_cache_trace *tr) {
    const int32_t *ag;
    const uint8_t *an;
    const int64_t n = moe_cache_trace_accesses(tr, &ag, &an);
    int64_t R = 0;
    for (int64_t i = 0; i < n; i++) R += an[i] != MOE_CACHE_NEED_SKIP;
    o->R = R;
    const size_t r1 = (size_t)R + 1, LE = (size_t)o->LE;
    o->g = malloc(sizeof *o->g * r1), o->hi = malloc(r1), o->nxt = malloc(sizeof(int32_t) * r1);
    o->nxl = malloc(sizeof(int32_t) * r1), o->prv = malloc(sizeof(int32_t) * r1);
    int32_t *last = malloc(sizeof *last * 2 * LE);
    if (!o->g || !o->hi || !o->nxt || !o->nxl || !o->prv || !last) {
        free(last);
        return MOE_ERR_NOMEM;
    }
    R = 0;
    for (int64_t i = 0; i < n; i++)
        if (an[i] != MOE_CACHE_NEED_SKIP) {
            o->g[R] = ag[i], o->hi[R] = an[i] == MOE_CACHE_NEED_HIGH;
            o->n_high += o->hi[R], o->n_low += !o->hi[R], R++;
        }
    for (size_t i = 0; i < 2 * LE; i++) last[i] = (int32_t)R;
    for (int64_t i = R - 1; i >= 0; i--) {
        const int32_t g = o->g[i];
        o->nxt[i] = last[g], o->nxl[i] = last[LE + g];
        last[g] = (int32_t)i;
        if (!o->hi[i]) last[LE + g] = (int32_t)i;
    }
    for (size_t i = 0; i < LE; i++) last[i] = -1;
    for (int64_t i = 0; i < R; i++) o->prv[i] = last[o->g[i]], last[o->g[i]] = (int32_t)i;
    free(last);
    return MOE_OK;
}

/* ------------------------------------------------------ Belady's MIN */

/* Lazy max-heap of (next use, expert): an entry is current while the copy
 * is cached and its next use is still the entry's (next uses only grow). */
static void heap_push(struct hent *h, int64_t *n, int32_t key, int32_t g) {
    int64_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].key < key) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i].key = key, h[i].g = g;
}

static void heap_pop(struct hent *h, int64_t *n) {
    const struct hent x = h[--*n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key > h[c].key) c++;
        if (h[c].key <= x.key) break;
        h[i] = h[c], i = c;
    }
    if (*n > 0) h[i] = x;
}

/* One cache of the schedules below: capacity, count, its lazy heap. */
struct cache1 {
    int cap, n;
    int64_t hn;
    struct hent *h;
    uint8_t *in;
    int32_t *key;
};

/* cache_top: the cached copy with the furthest next use (-1: none). */
static int32_t cache_top(struct cache1 *c) {
    while (c->hn > 0 && (!c->in[c->h[0].g] || c->key[c->h[0].g] != c->h[0].key)) heap_pop(c->h, &c->hn);
    return c->hn > 0 ? c->h[0].g : -1;
}

/* cache_keep: g's copy was used (has: it was cached) and should stay if
 * want, with next use nx: refresh, drop, insert, or insert by evicting the
 * furthest next use unless g's own is further (bypass). */
static void cache_keep(struct cache1 *c, int32_t g, int has, int want, int32_t nx) {
    if (has && !want) {
        c->in[g] = 0, c->n--;
        return;
    }
    if (!want) return;
    if (!has) {
        if (c->cap <= 0) return;
        if (c->n >= c->cap) {
            int32_t v = cache_top(c);
            if (v < 0 || c->key[v] <= nx) return; /* bypass */
            c->in[v] = 0, c->n--;
        }
        c->in[g] = 1, c->n++;
    }
    c->key[g] = nx;
    heap_push(c->h, &c->hn, nx, g);
}

static void cache_reset(struct cache1 *c, int cap, struct hent *h, uint8_t *in, int32_t *key, int LE) {
    c->cap = cap, c->n = 0, c->hn = 0, c->h = h, c->in = in, c->key = key;
    memset(in, 0, (size_t)LE);
}

/* min_misses: Belady's MIN (with bypass, optimal for one cache of equal
 * costs) over the high-need requests (high_only) or all, with cap copies. */
static int64_t min_misses(struct opt *o, int high_only, int cap, int32_t *nx) {
    const int64_t R = o->R;
    int32_t *last = o->key[1]; /* scratch [LE] */
    for (int i = 0; i < o->LE; i++) last[i] = (int32_t)R;
    for (int64_t i = R - 1; i >= 0; i--)
        if (!high_only || o->hi[i]) nx[i] = last[o->g[i]], last[o->g[i]] = (int32_t)i;
    struct cache1 c;
    cache_reset(&c, cap, o->heap[0], o->in[0], o->key[0], o->LE);
    int64_t miss = 0;
    for (int64_t i = 0; i < R; i++) {
        if (high_only && !o->hi[i]) continue;
        const int32_t g = o->g[i];
        const int has = c.in[g];
        miss += !has;
        cache_keep(&c, g, has, nx[i] < R, nx[i]);
    }
    return miss;
}

/* closed_form: the bound of cache-opt.h. Proof: a policy's high-cache
 * contents, looked at only on high-need requests, are a one-cache schedule
 * with H copies, so its high misses m_h >= A. The experts with any copy form
 * a set of at most H + L that changes only at misses, so the requests it
 * misses, at most m_h + m_l, are >= B; and m_h + m_l >= m_h >= A. Then
 * m_h + c m_l = (1 - c) m_h + c (m_h + m_l) for c <= 1, and >= m_h + m_l
 * for c > 1. */
static double closed_form(struct opt *o, int32_t *scratch) {
    const double A = (double)min_misses(o, 1, o->H, scratch);
    const double B = (double)min_misses(o, 0, o->H + o->Lc, scratch);
    const double AB = A > B ? A : B;
    return o->c <= 1 ? A + o->c * (AB - A) : AB; /* = (1 - c) A + c max(A, B), exact when A >= B */
}

/* schedule: a feasible schedule that follows the relaxed solution `plan`
 * (NULL: keep every copy that is used again) where capacity allows, and
 * Belady's choice (furthest next use of the copy's precision, or bypass)
 * where it does not; returns its penalty. */
static double schedule(struct opt *o, const uint8_t *plan) {
    struct cache1 ch, cl;
    cache_reset(&ch, o->H, o->heap[0], o->in[0], o->key[0], o->LE);
    cache_reset(&cl, o->Lc, o->heap[1], o->in[1], o->key[1], o->LE);
    double pen = 0;
    for (int64_t i = 0; i < o->R; i++) {
        const int32_t g = o->g[i];
        const int hasH = ch.in[g], hasL = cl.in[g], s = plan ? plan[i] : S_H | S_L;
        int availL = hasL;
        if (o->hi[i]) pen += !hasH;
        else if (!hasH && !hasL) pen += o->c, availL = 1;
        cache_keep(&ch, g, hasH, (s & S_H) && (hasH || o->hi[i]) && o->nxt[i] < o->R, o->nxt[i]);
        cache_keep(&cl, g, hasL, (s & S_L) && availL && o->nxl[i] < o->R, o->nxl[i]);
    }
    return pen;
}

/* ----------------------------------------------------- the relaxation */

/* arg2 / arg3: the index (among the given states) of the smallest b, the
 * first on ties (not holding a copy ranks first). */
static inline int arg2(const double *b, int x, int y) { return b[y] < b[x] ? y : x; }
static inline int arg3(const double *b, int x, int y, int z) { return arg2(b, arg2(b, x, y), z); }

/* relax: the per-expert shortest paths under the prices in P, Q (prefix
 * sums): returns the sum of their lengths; fills plan and the occupancy
 * differences dh, dl. */
static double relax(struct opt *o) {
    const int64_t R = o->R;
    const double c = o->c;
    for (int g = 0; g < o->LE; g++) o->val[g][0] = 0, o->val[g][1] = o->val[g][2] = o->val[g][3] = HUGE_VAL;
    for (int64_t i = 0; i < R; i++) {
        double *v = o->val[o->g[i]], b[4];
        const int32_t j = o->nxt[i];
        b[0] = v[0] + (o->hi[i] ? 1.0 : c), b[1] = v[1], b[2] = v[2] + (o->hi[i] ? 1.0 : 0.0), b[3] = v[3];
        const int a = arg2(b, arg2(b, 0, 1), arg2(b, 2, 3));
        if (j >= R) { /* the expert's last request: hold nothing after it */
            v[0] = b[a], v[1] = v[2] = v[3] = HUGE_VAL;
            o->back[i] = (uint8_t)a;
            continue;
        }
        const double ph = o->P[j] - o->P[i], pl = o->Q[j] - o->Q[i];
        int h, l, hl;
        if (o->hi[i]) h = a, l = hl = arg2(b, 2, 3);     /* H after: any before; L after: L before */
        else h = arg2(b, 1, 3), l = arg3(b, 0, 2, 3), hl = 3; /* H after: H before; L: L before or none */
        v[0] = b[a], v[1] = b[h] + ph, v[2] = b[l] + pl, v[3] = b[hl] + ph + pl;
        o->back[i] = (uint8_t)(a | h << 2 | l << 4 | hl << 6);
    }
    double total = 0;
    for (int g = 0; g < o->LE; g++) total += o->val[g][0];
    memset(o->dh, 0, sizeof *o->dh * ((size_t)R + 1));
    memset(o->dl, 0, sizeof *o->dl * ((size_t)R + 1));
    for (int64_t i = R - 1; i >= 0; i--) { /* backtrack every expert from its last request */
        const int32_t g = o->g[i];
        const int s2 = o->nxt[i] >= R ? 0 : o->cur[g], s = (o->back[i] >> (2 * s2)) & 3;
        o->plan[i] = (uint8_t)s2;
        if (o->prv[i] >= 0) {
            if (s & S_H) o->dh[o->prv[i]]++, o->dh[i]--;
            if (s & S_L) o->dl[o->prv[i]]++, o->dl[i]--;
        }
        o->cur[g] = (uint8_t)s;
    }
    return total;
}

/* prefix: P, Q from p, q, summed in long double so that each is within
 * one rounding of the true sum (the error bound of dual_careful). */
static void prefix(struct opt *o, const double *p, const double *q) {
    long double a = 0, b = 0;
    o->P[0] = o->Q[0] = 0;
    for (int64_t t = 0; t < o->R; t++) a += p[t], b += q[t], o->P[t + 1] = (double)a, o->Q[t + 1] = (double)b;
}

/* dual_careful: D at prices p, q evaluated again in long double, minus a
 * bound on its rounding error, so that the result is a bound for certain. */
static double dual_careful(struct opt *o, const double *p, const double *q) {
    const int64_t R = o->R;
    long double sp = 0, sq = 0, tot = 0, mag = 1;
    prefix(o, p, q);
    relax(o); /* the paths; their lengths summed again below */
    long double *vP = malloc(sizeof *vP * ((size_t)R + 1) * 2), *vQ = vP ? vP + R + 1 : NULL;
    if (!vP) return -HUGE_VAL;
    vP[0] = vQ[0] = 0;
    for (int64_t t = 0; t < R; t++) vP[t + 1] = vP[t] + p[t], vQ[t + 1] = vQ[t] + q[t];
    sp = vP[R], sq = vQ[R];
    for (int64_t i = 0; i < R; i++) { /* penalty and holdings of the paths relax chose */
        const int s = o->prv[i] >= 0 ? o->plan[o->prv[i]] : 0;
        tot += o->hi[i] ? !(s & S_H) : (s ? 0.0L : (long double)o->c);
        if (o->nxt[i] < R && (o->plan[i] & S_H)) tot += vP[o->nxt[i]] - vP[i];
        if (o->nxt[i] < R && (o->plan[i] & S_L)) tot += vQ[o->nxt[i]] - vQ[i];
    }
    mag += tot + 3 * (sp + sq);
    free(vP);
    /* relax's paths are shortest under its double arithmetic only. Each
     * path length it computes is within e of the true one, e <= (R + 2)
     * DBL_EPSILON (3 (sum p + sum q) + the length) (prefix sums within one
     * rounding, one rounding per subtraction and addition along the path),
     * so the true minimum is at least the chosen paths' true length - 2e
     * over all experts; the long double sums add much less. */
    const long double err = 8.0L * ((long double)R + 2) * (DBL_EPSILON * 1.0L) * mag;
    return (double)(tot - o->H * sp - o->Lc * sq - err);
}

/* lattice_up: the least a + b c >= x (integers 0 <= a <= n_high, 0 <= b <=
 * n_low; a penalty is always such a value), never below x; x itself when
 * none is found. A tolerance keeps rounding from stepping over a value. */
static double lattice_up(const struct opt *o, double x) {
    if (x <= 0) return 0;
    const double tol = 1e-9 * (1 + x);
    double best = HUGE_VAL;
    for (int64_t b = 0; b <= o->n_low; b++) {
        const double a = fmax(0, ceil(x - (double)b * o->c - tol));
        if (a <= (double)o->n_high && a + (double)b * o->c < best) best = a + (double)b * o->c;
        if (o->c <= 0 || (double)b * o->c > x + 1) break; /* a = 0 from here on: no smaller value */
    }
    return best < HUGE_VAL && best > x ? best : x;
}

/* ----------------------------------------------------------- the ascent */

static enum moe_status check(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                             const struct moe_cache_opt_params *op) {
    if (!tr || !c || !op || c->high_cap < 0 || c->low_cap < 0 || !(c->low_cost >= 0) || !isfinite(c->low_cost) ||
        op->max_iters < 0 || isnan(op->max_seconds) || isnan(op->upper) || op->max_requests < 0) {
        MOE_LOGE("invalid arguments (capacities %d, %d, low cost %g, %d iterations)", c ? c->high_cap : -1,
                 c ? c->low_cap : -1, c ? c->low_cost : NAN, op ? op->max_iters : -1);
        return MOE_ERR_INVALID;
    }
    return MOE_OK;
}

/* alloc_ascent: the arrays of the subgradient ascent. */
static int alloc_ascent(struct opt *o) {
    const size_t r1 = (size_t)o->R + 1;
    o->p = calloc(r1, sizeof(double)), o->q = calloc(r1, sizeof(double));
    o->bp = calloc(r1, sizeof(double)), o->bq = calloc(r1, sizeof(double));
    o->P = malloc(sizeof(double) * r1), o->Q = malloc(sizeof(double) * r1);
    o->dh = malloc(sizeof(int32_t) * r1), o->dl = malloc(sizeof(int32_t) * r1);
    o->back = malloc(r1), o->plan = malloc(r1);
    o->val = malloc(sizeof *o->val * (size_t)o->LE), o->cur = malloc((size_t)o->LE);
    return o->p && o->q && o->bp && o->bq && o->P && o->Q && o->dh && o->dl && o->back && o->plan && o->val && o->cur;
}

/* step: one projected subgradient step of size theta towards target from
 * the relaxed solution's occupancy; returns the squared norm (0: the relaxed
 * solution is feasible and complementary, so optimal). */
static double step(struct opt *o, double D, double target, double theta) {
    const int64_t R = o->R;
    double n2 = 0;
    int32_t oh = 0, ol = 0;
    for (int64_t t = 0; t < R; t++) { /* the projected subgradient, first its norm */
        oh += o->dh[t], ol += o->dl[t];
        double gh = oh - o->H, gl = ol - o->Lc;
        if (o->p[t] <= 0 && gh < 0) gh = 0;
        if (o->q[t] <= 0 && gl < 0) gl = 0;
        n2 += gh * gh + gl * gl;
    }
    if (n2 <= 0) return 0;
    const double s = theta * fmax(target - D, 1e-9 * (1 + fabs(D))) / n2;
    oh = ol = 0;
    for (int64_t t = 0; t < R; t++) {
        oh += o->dh[t], ol += o->dl[t];
        o->p[t] = fmax(0, o->p[t] + s * (oh - o->H));
        o->q[t] = fmax(0, o->q[t] + s * (ol - o->Lc));
    }
    return n2;
}

/* ascend: the subgradient ascent; the best bound's prices end in bp, bq. */
static void ascend(struct opt *o, const struct moe_cache_opt_params *op, struct moe_cache_opt_result *r, double t0) {
    /* Polyak's step towards the best schedule's penalty, theta halved after
     * 50 iterations without a better bound (tried on the demo profile:
     * faster schedules stopped up to 0.3 % lower, slower ones gained < 0.05 %) */
    double theta = 2.0, best = -HUGE_VAL;
    int stale = 0;
    r->stop = MOE_CACHE_OPT_ITERATIONS;
    for (int it = 0; it < op->max_iters; it++) {
        prefix(o, o->p, o->q);
        const double D = relax(o) - o->H * o->P[o->R] - o->Lc * o->Q[o->R];
        r->iters = it + 1;
        if (it % 5 == 0) { /* the relaxed solution repaired into a schedule */
            const double u = schedule(o, o->plan);
            if (u < r->upper) r->upper = u;
        }
        if (it == 0 || D > best + 1e-9 * (1 + fabs(best))) {
            best = D, stale = 0;
            memcpy(o->bp, o->p, sizeof *o->p * (size_t)o->R), memcpy(o->bq, o->q, sizeof *o->q * (size_t)o->R);
            if (r->upper - lattice_up(o, best - 1e-9 * (1 + best)) <= 1e-9 * (1 + r->upper)) {
                r->stop = MOE_CACHE_OPT_EXACT;
                break;
            }
        } else if (++stale >= 50) {
            theta *= 0.5, stale = 0;
            if (theta < 1e-6) {
                r->stop = MOE_CACHE_OPT_CONVERGED;
                break;
            }
        }
        if (op->max_seconds > 0 && moe_now_s() - t0 > op->max_seconds) {
            r->stop = MOE_CACHE_OPT_TIME;
            break;
        }
        if (step(o, D, r->upper, theta) == 0) { /* feasible: the plan is a schedule of cost <= D */
            const double u = schedule(o, o->plan);
            if (u < r->upper) r->upper = u;
            r->stop = MOE_CACHE_OPT_CONVERGED;
            break;
        }
    }
}

enum moe_status moe_cache_opt_solve(const struct moe_cache_trace *tr, const struct moe_cache_config *c,
                                    const struct moe_cache_opt_params *op, struct moe_cache_opt_result *out) {
    struct moe_cache_opt_params dp = moe_cache_opt_default_params();
    if (!op) op = &dp;
    memset(out, 0, sizeof *out);
    enum moe_status st = check(tr, c, op);
    if (st) return st;
    const double t0 = moe_now_s();
    struct moe_cache_trace_info info;
    moe_cache_trace_info(tr, &info);
    struct opt o;
    memset(&o, 0, sizeof o);
    o.LE = info.n_layers * info.n_experts, o.H = c->high_cap, o.Lc = c->low_cap, o.c = c->low_cost;
    if ((st = requests(&o, tr))) goto done;
    st = MOE_ERR_NOMEM;
    for (int k = 0; k < 2; k++) {
        o.heap[k] = malloc(sizeof *o.heap[k] * ((size_t)o.R + 1));
        o.in[k] = malloc((size_t)o.LE), o.key[k] = malloc(sizeof(int32_t) * (size_t)o.LE);
        if (!o.heap[k] || !o.in[k] || !o.key[k]) goto done;
    }
    out->requests = o.R;
    int32_t *scratch = malloc(sizeof *scratch * ((size_t)o.R + 1));
    if (!scratch) goto done;
    out->closed_form = closed_form(&o, scratch);
    free(scratch);
    out->upper = schedule(&o, NULL); /* keep what is used again, Belady's choice when full */
    if (op->upper >= 0 && op->upper < out->upper) out->upper = op->upper;
    out->lower = lattice_up(&o, out->closed_form);
    out->stop = MOE_CACHE_OPT_CONVERGED;
    if (o.R > op->max_requests) out->stop = MOE_CACHE_OPT_TOO_LARGE;
    else if (out->upper - out->lower > 1e-9 * (1 + out->upper) && op->max_iters > 0) {
        if (!alloc_ascent(&o)) goto done;
        ascend(&o, op, out, t0);
        out->lagrangian = dual_careful(&o, o.bp, o.bq);
        const double u = schedule(&o, o.plan); /* the best prices' plan */
        if (u < out->upper) out->upper = u;
        if (out->lagrangian > out->lower) out->lower = lattice_up(&o, out->lagrangian);
    }
    out->exact = out->upper - out->lower <= 1e-9 * (1 + out->upper);
    if (out->exact) out->lower = out->upper, out->stop = MOE_CACHE_OPT_EXACT;
    else if (out->stop == MOE_CACHE_OPT_EXACT) out->stop = MOE_CACHE_OPT_CONVERGED; /* the careful value fell short */
    out->seconds = moe_now_s() - t0;
    st = MOE_OK;
done:
    if (st == MOE_ERR_NOMEM) MOE_LOGE("out of memory for the offline optimum of %lld requests", (long long)o.R);
    opt_free(&o);
    return st;
}
