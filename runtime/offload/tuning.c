/*
 * tuning.c - typed reading and writing of a bundle's tuning keys, and
 * EdgeMoE's path dictionary rebuilt from them for prefetching (see
 * moe-tuning.h). Uses only formats/ (the KV sets of moe-bundle.h).
 */
#include "moe-tuning.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ names */

static const char *const k_cache_w[MOE_CACHE_N_WEIGHTS] = {MOE_TUNING_CACHE_W_LRU, MOE_TUNING_CACHE_W_LFU,
                                                           MOE_TUNING_CACHE_W_LHU, MOE_TUNING_CACHE_W_FLD,
                                                           MOE_TUNING_CACHE_W_POP};

const char *moe_tuning_cache_weight_key(int i) { return i >= 0 && i < MOE_CACHE_N_WEIGHTS ? k_cache_w[i] : NULL; }

/* The path-dictionary fields, in one order for both orders. */
static const char *const k_path_field[7] = {"key_len", "top", "layer", "keys", "totals", "next", "prob"};
static const char *const k_path_key[2][7] = {
    {MOE_TUNING_PATH1_KEY_LEN, MOE_TUNING_PATH1_TOP, MOE_TUNING_PATH1_LAYER, MOE_TUNING_PATH1_KEYS,
     MOE_TUNING_PATH1_TOTALS, MOE_TUNING_PATH1_NEXT, MOE_TUNING_PATH1_PROB},
    {MOE_TUNING_PATH2_KEY_LEN, MOE_TUNING_PATH2_TOP, MOE_TUNING_PATH2_LAYER, MOE_TUNING_PATH2_KEYS,
     MOE_TUNING_PATH2_TOTALS, MOE_TUNING_PATH2_NEXT, MOE_TUNING_PATH2_PROB},
};

const char *moe_tuning_path_key(int order, const char *field) {
    if (order < 1 || order > 2 || !field) return NULL;
    for (int i = 0; i < 7; i++)
        if (!strcmp(field, k_path_field[i])) return k_path_key[order - 1][i];
    return NULL;
}

/* ---------------------------------------------------------------- reading */

/* get: key's item if it has type `want`: 1; absent: 0; another type: -1
 * (warned). */
static int get(const struct moe_bundle_kv *kv, const char *key, enum moe_bundle_kv_type want,
               struct moe_bundle_kv_item *it) {
    if (!kv || moe_bundle_kv_find(kv, key, it) != MOE_OK) return 0;
    if (it->type == want) return 1;
    MOE_LOGW("tuning key %s has type %d, not %d: ignored", key, (int)it->type, (int)want);
    return -1;
}

/* get_f64s: n f64 keys into v; 1 all present and finite, 0 none present,
 * -1 otherwise (warned). */
static int get_f64s(const struct moe_bundle_kv *kv, const char *const *keys, int n, double *v) {
    struct moe_bundle_kv_item it;
    int found = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        int r = get(kv, keys[i], MOE_KV_F64, &it);
        if (r < 0) bad = 1;
        if (r <= 0) continue;
        found++;
        v[i] = it.f64;
        if (!isfinite(v[i])) {
            MOE_LOGW("tuning key %s is %g: ignored", keys[i], v[i]);
            bad = 1;
        }
    }
    if (found == 0 && !bad) return 0;
    if (!bad && found < n) {
        for (int i = 0; i < n; i++)
            if (!kv || moe_bundle_kv_find(kv, keys[i], &it) != MOE_OK)
                MOE_LOGW("tuning key %s is missing (its group is ignored)", keys[i]);
        bad = 1;
    }
    return bad ? -1 : 1;
}

/* read_thresholds: hobbit.t1/t2 and the target shares. */
static void read_thresholds(const struct moe_bundle_kv *kv, struct moe_tuning *t) {
    const char *const kt[2] = {MOE_TUNING_HOBBIT_T1, MOE_TUNING_HOBBIT_T2};
    const char *const kg[2] = {MOE_TUNING_HOBBIT_TARGET_LOW, MOE_TUNING_HOBBIT_TARGET_SKIP};
    double v[2];
    if (get_f64s(kv, kt, 2, v) == 1) {
        if (v[0] >= 0 && v[0] <= v[1] && v[1] <= 1) t->has_thresholds = 1, t->t1 = v[0], t->t2 = v[1];
        else MOE_LOGW("tuning: HOBBIT thresholds T1 %g, T2 %g are not 0 <= T1 <= T2 <= 1: ignored", v[0], v[1]);
    }
    if (get_f64s(kv, kg, 2, v) == 1) {
        if (v[0] >= 0 && v[1] >= 0 && v[0] + v[1] <= 1 + 1e-9)
            t->has_targets = 1, t->target_low = v[0], t->target_skip = v[1];
        else MOE_LOGW("tuning: HOBBIT target shares %g, %g are not shares: ignored", v[0], v[1]);
    }
}

/* read_cache: hobbit.cache.* (weights, sizes, precisions). */
static void read_cache(const struct moe_bundle_kv *kv, int64_t LE, struct moe_tuning *t) {
    double w[MOE_CACHE_N_WEIGHTS] = {0};
    struct moe_bundle_kv_item wp, ad;
    const int rp = get(kv, MOE_TUNING_CACHE_W_POP, MOE_KV_F64, &wp); /* optional: 0 when absent */
    const int ra0 = get(kv, MOE_TUNING_CACHE_ADMIT, MOE_KV_I64, &ad);  /* optional: 0 when absent */
    if (rp == 1) w[4] = wp.f64;
    if (ra0 == 1 && ad.i64 != 0 && ad.i64 != 1) {
        MOE_LOGW("tuning key %s is %lld, not 0 or 1: the cache weights are ignored", MOE_TUNING_CACHE_ADMIT,
                 (long long)ad.i64);
    } else if (get_f64s(kv, k_cache_w, 4, w) == 1 && rp >= 0 && ra0 >= 0) {
        double sum = 0;
        int ok = 1;
        for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) ok &= w[i] >= 0 && isfinite(w[i]), sum += w[i];
        if (ok && fabs(sum - 1) <= 1e-6) {
            t->has_cache_weights = 1;
            t->cache_admit = ra0 == 1 ? (int)ad.i64 : 0;
            memcpy(t->cache_w, w, sizeof w);
        } else {
            MOE_LOGW("tuning: HOBBIT cache weights must be >= 0 and sum to 1 (sum %g): ignored", sum);
        }
    }
    struct moe_bundle_kv_item a, b;
    int ra = get(kv, MOE_TUNING_CACHE_HIGH_EXPERTS, MOE_KV_I64, &a), rb = get(kv, MOE_TUNING_CACHE_LOW_EXPERTS, MOE_KV_I64, &b);
    if (ra == 1 && rb == 1) {
        if (a.i64 >= 0 && a.i64 <= LE && b.i64 >= 0 && b.i64 <= LE)
            t->has_cache_sizes = 1, t->cache_high_experts = (int)a.i64, t->cache_low_experts = (int)b.i64;
        else MOE_LOGW("tuning: cache sizes %lld, %lld are not in [0, %lld]: ignored", (long long)a.i64,
                      (long long)b.i64, (long long)LE);
    } else if (ra == 1 || rb == 1) {
        MOE_LOGW("tuning: %s without a valid %s: ignored", ra == 1 ? MOE_TUNING_CACHE_HIGH_EXPERTS : MOE_TUNING_CACHE_LOW_EXPERTS,
                 ra == 1 ? MOE_TUNING_CACHE_LOW_EXPERTS : MOE_TUNING_CACHE_HIGH_EXPERTS);
    }
    ra = get(kv, MOE_TUNING_CACHE_HIGH_PRECISION, MOE_KV_STRING, &a);
    rb = get(kv, MOE_TUNING_CACHE_LOW_PRECISION, MOE_KV_STRING, &b);
    if (ra == 1 && rb == 1) {
        if (a.count >= 1 && a.count <= MOE_BUNDLE_MAX_PRECISION_NAME && b.count >= 1 &&
            b.count <= MOE_BUNDLE_MAX_PRECISION_NAME)
            t->has_cache_precisions = 1, t->cache_high_precision = a.str, t->cache_low_precision = b.str;
        else MOE_LOGW("tuning: cache precision names must be 1..%d bytes: ignored", MOE_BUNDLE_MAX_PRECISION_NAME);
    } else if (ra == 1 || rb == 1) {
        MOE_LOGW("tuning: %s without a valid %s: ignored",
                 ra == 1 ? MOE_TUNING_CACHE_HIGH_PRECISION : MOE_TUNING_CACHE_LOW_PRECISION,
                 ra == 1 ? MOE_TUNING_CACHE_LOW_PRECISION : MOE_TUNING_CACHE_HIGH_PRECISION);
    }
}

/* read_popularity: hobbit.cache.freq_high / freq_low / low_cost. */
static void read_popularity(const struct moe_bundle_kv *kv, int64_t LE, struct moe_tuning *t) {
    struct moe_bundle_kv_item h, l, c;
    const int rh = get(kv, MOE_TUNING_CACHE_FREQ_HIGH, MOE_KV_F64_ARRAY, &h),
              rl = get(kv, MOE_TUNING_CACHE_FREQ_LOW, MOE_KV_F64_ARRAY, &l),
              rc = get(kv, MOE_TUNING_CACHE_LOW_COST, MOE_KV_F64, &c);
    if (rh == 0 && rl == 0 && rc == 0) return;
    if (rh != 1 || rl != 1 || rc != 1) {
        MOE_LOGW("tuning: the cache popularity keys (%s, %s, %s) are incomplete: ignored", MOE_TUNING_CACHE_FREQ_HIGH,
                 MOE_TUNING_CACHE_FREQ_LOW, MOE_TUNING_CACHE_LOW_COST);
        return;
    }
    if ((int64_t)h.count != LE || (int64_t)l.count != LE || !(c.f64 >= 0) || !isfinite(c.f64)) {
        MOE_LOGW("tuning: %s / %s have %zu / %zu entries (want %lld) or %s is %g: ignored", MOE_TUNING_CACHE_FREQ_HIGH,
                 MOE_TUNING_CACHE_FREQ_LOW, h.count, l.count, (long long)LE, MOE_TUNING_CACHE_LOW_COST, c.f64);
        return;
    }
    for (int64_t g = 0; g < LE; g++)
        if (!(h.f64s[g] >= 0 && h.f64s[g] <= 1 && l.f64s[g] >= 0 && l.f64s[g] <= 1)) {
            MOE_LOGW("tuning: %s / %s entry %lld is %g / %g, not a share in [0, 1]: ignored", MOE_TUNING_CACHE_FREQ_HIGH,
                     MOE_TUNING_CACHE_FREQ_LOW, (long long)g, h.f64s[g], l.f64s[g]);
            return;
        }
    t->has_cache_popularity = 1;
    t->cache_freq_high = h.f64s, t->cache_freq_low = l.f64s, t->cache_low_cost = c.f64;
}

/* read_order: twiddler.placement_order, a permutation of [0, LE). */
static enum moe_status read_order(const struct moe_bundle_kv *kv, int64_t LE, struct moe_tuning *t) {
    struct moe_bundle_kv_item it;
    if (get(kv, MOE_TUNING_PLACEMENT_ORDER, MOE_KV_I64_ARRAY, &it) != 1) return MOE_OK;
    if ((int64_t)it.count != LE) {
        MOE_LOGW("tuning key %s has %zu entries, not %lld (MoE layers x experts): ignored", MOE_TUNING_PLACEMENT_ORDER,
                 it.count, (long long)LE);
        return MOE_OK;
    }
    unsigned char *seen = calloc((size_t)LE, 1);
    if (!seen) {
        MOE_LOGE("out of memory");
        return MOE_ERR_NOMEM;
    }
    int64_t bad = -1;
    for (int64_t i = 0; i < LE && bad < 0; i++) {
        const int64_t g = it.i64s[i];
        if (g < 0 || g >= LE || seen[g]) bad = i;
        else seen[g] = 1;
    }
    free(seen);
    if (bad >= 0)
        MOE_LOGW("tuning key %s is not a permutation (entry %lld: %lld): ignored", MOE_TUNING_PLACEMENT_ORDER,
                 (long long)bad, (long long)it.i64s[bad]);
    else
        t->has_placement_order = 1, t->placement_order = it.i64s;
    return MOE_OK;
}

/* read_bitwidth: edgemoe.bitwidth.map: per model layer a row of -1 (no
 * experts) or of precision indices, n_layers rows of the latter. */
static void read_bitwidth(const struct moe_bundle_kv *kv, int n_layers, int E, struct moe_tuning *t) {
    struct moe_bundle_kv_item it;
    if (get(kv, MOE_TUNING_BITWIDTH_MAP, MOE_KV_I64_ARRAY, &it) != 1) return;
    if (it.count == 0 || it.count % (size_t)E || it.count / (size_t)E > (size_t)INT32_MAX) {
        MOE_LOGW("tuning key %s has %zu entries, not a multiple of %d experts: ignored", MOE_TUNING_BITWIDTH_MAP,
                 it.count, E);
        return;
    }
    const size_t rows = it.count / (size_t)E;
    size_t expert_rows = 0;
    for (size_t l = 0; l < rows; l++) {
        const int64_t *r = it.i64s + l * (size_t)E;
        const int dense = r[0] == -1;
        for (int e = 0; e < E; e++)
            if (dense ? r[e] != -1 : r[e] < 0 || r[e] >= MOE_BUNDLE_MAX_PRECISIONS) {
                MOE_LOGW("tuning key %s: layer %zu expert %d has %lld (want a precision index 0..%d, or -1 for the "
                         "whole row of a layer without experts): ignored",
                         MOE_TUNING_BITWIDTH_MAP, l, e, (long long)r[e], MOE_BUNDLE_MAX_PRECISIONS - 1);
                return;
            }
        expert_rows += !dense;
    }
    if (expert_rows != (size_t)n_layers) {
        MOE_LOGW("tuning key %s covers %zu layers with experts, the model has %d: ignored", MOE_TUNING_BITWIDTH_MAP,
                 expert_rows, n_layers);
        return;
    }
    t->has_bitwidth_map = 1, t->bitwidth_map = it.i64s, t->bitwidth_layers = (int)rows;
}

/* read_big_little: mobile.gamma and mobile.little_k (and the target). */
static void read_big_little(const struct moe_bundle_kv *kv, int E, struct moe_tuning *t) {
    struct moe_bundle_kv_item g, k, f;
    const int rg = get(kv, MOE_TUNING_MOBILE_GAMMA, MOE_KV_F64, &g), rk = get(kv, MOE_TUNING_MOBILE_LITTLE_K, MOE_KV_I64, &k);
    if (get(kv, MOE_TUNING_MOBILE_TARGET_FALLBACK, MOE_KV_F64, &f) == 1 && f.f64 >= 0 && f.f64 <= 1)
        t->target_fallback = f.f64;
    if (rg == 1 && rk == 1) {
        if (g.f64 >= 0 && g.f64 <= 1 && k.i64 >= 1 && k.i64 <= E)
            t->has_gamma = 1, t->gamma = g.f64, t->little_k = (int)k.i64;
        else MOE_LOGW("tuning: MoBiLE gamma %g (want [0, 1]) or little_k %lld (want 1..%d) out of range: ignored",
                      g.f64, (long long)k.i64, E);
    } else if (rg == 1 || rk == 1) {
        MOE_LOGW("tuning: %s without a valid %s: ignored", rg == 1 ? MOE_TUNING_MOBILE_GAMMA : MOE_TUNING_MOBILE_LITTLE_K,
                 rg == 1 ? MOE_TUNING_MOBILE_LITTLE_K : MOE_TUNING_MOBILE_GAMMA);
    }
}

/* read_route: cache_route.margin (and the target it was fitted for). */
static void read_route(const struct moe_bundle_kv *kv, struct moe_tuning *t) {
    struct moe_bundle_kv_item m, f;
    t->route_target = NAN;
    if (get(kv, MOE_TUNING_ROUTE_TARGET, MOE_KV_F64, &f) == 1 && f.f64 >= 0 && isfinite(f.f64)) t->route_target = f.f64;
    if (get(kv, MOE_TUNING_ROUTE_MARGIN, MOE_KV_F64, &m) != 1) return;
    if (m.f64 >= 0 && m.f64 <= 1) t->has_route_margin = 1, t->route_margin = m.f64;
    else MOE_LOGW("tuning: %s %g out of [0, 1]: ignored", MOE_TUNING_ROUTE_MARGIN, m.f64);
}

/* read_dynamic_until: cache.dynamic_until in (0, 1]. */
static void read_dynamic_until(const struct moe_bundle_kv *kv, struct moe_tuning *t) {
    struct moe_bundle_kv_item d;
    t->dynamic_until = NAN;
    if (get(kv, MOE_TUNING_DYNAMIC_UNTIL, MOE_KV_F64, &d) != 1) return;
    if (d.f64 > 0 && d.f64 <= 1) t->dynamic_until = d.f64;
    else MOE_LOGW("tuning: %s %g out of (0, 1]: ignored", MOE_TUNING_DYNAMIC_UNTIL, d.f64);
}

/* plan_ok: the checks of moe_tuning_read on a plan; NULL or what is wrong. */
static const char *plan_ok(const struct moe_tuning_plan *p, int E) {
    enum moe_cache_policy pol;
    if (p->expert_mem <= 0 || p->mem < 0) return "memory sizes";
    if (!(p->low_share >= 0 && p->low_share < 1) || !(p->t1 >= 0 && p->t1 <= p->t2 && p->t2 <= 1)) return "shares";
    if (p->dynamic != 0 && p->dynamic != 1) return "dynamic";
    if (p->dynamic && !p->low[0]) return "low precision";
    if (moe_cache_policy_parse(p->policy, &pol) != MOE_OK || pol == MOE_CACHE_BELADY) return "policy";
    if (p->prefetch_paths < 0 || p->prefetch_paths > E) return "prefetch";
    if (p->little_k < 0 || p->little_k > E || !(p->gamma >= 0 && p->gamma <= 1)) return "big-little";
    if (p->threads < 0) return "threads";
    return NULL;
}

/* read_str: a string key into dst[n]: 1 ok, 0 absent, -1 bad (too long). */
static int read_str(const struct moe_bundle_kv *kv, const char *key, char *dst, size_t n) {
    struct moe_bundle_kv_item it;
    int r = get(kv, key, MOE_KV_STRING, &it);
    if (r <= 0) return r;
    const char *v = moe_bundle_kv_str(kv, key);
    if (!v || strlen(v) >= n) return -1;
    memcpy(dst, v, strlen(v) + 1);
    return 1;
}

/* read_plan: the plan.* group (all or nothing). */
static void read_plan(const struct moe_bundle_kv *kv, int E, struct moe_tuning *t) {
    struct moe_tuning_plan p;
    memset(&p, 0, sizeof p);
    static const char *const ik[] = {MOE_TUNING_PLAN_MEM, MOE_TUNING_PLAN_EXPERT_MEM, MOE_TUNING_PLAN_DYNAMIC,
                                     MOE_TUNING_PLAN_PREFETCH_PATHS, MOE_TUNING_PLAN_LITTLE_K, MOE_TUNING_PLAN_THREADS};
    static const char *const fk[] = {MOE_TUNING_PLAN_LOW_SHARE, MOE_TUNING_PLAN_T1, MOE_TUNING_PLAN_T2,
                                     MOE_TUNING_PLAN_GAMMA, MOE_TUNING_PLAN_TOK_S, MOE_TUNING_PLAN_BYTES,
                                     MOE_TUNING_PLAN_QUALITY};
    int64_t iv[6];
    double fv[7];
    int found = 0, missing = 0, bad = 0;
    struct moe_bundle_kv_item it;
    for (int i = 0; i < 6; i++) {
        int r = get(kv, ik[i], MOE_KV_I64, &it);
        found += r != 0, missing += r == 0, bad |= r < 0;
        iv[i] = r == 1 ? it.i64 : 0;
    }
    for (int i = 0; i < 7; i++) {
        int r = get(kv, fk[i], MOE_KV_F64, &it);
        found += r != 0, missing += r == 0, bad |= r < 0;
        fv[i] = r == 1 ? it.f64 : NAN;
    }
    const char *sk[] = {MOE_TUNING_PLAN_HIGH, MOE_TUNING_PLAN_LOW, MOE_TUNING_PLAN_POLICY};
    char *sd[] = {p.high, p.low, p.policy};
    const size_t sn[] = {sizeof p.high, sizeof p.low, sizeof p.policy};
    for (int i = 0; i < 3; i++) {
        int r = read_str(kv, sk[i], sd[i], sn[i]);
        found += r != 0, missing += r == 0, bad |= r < 0;
    }
    if (!found) return;
    p.mem = iv[0], p.expert_mem = iv[1], p.dynamic = (int)iv[2], p.prefetch_paths = (int)iv[3];
    p.little_k = (int)iv[4], p.threads = (int)iv[5];
    p.low_share = fv[0], p.t1 = fv[1], p.t2 = fv[2], p.gamma = fv[3], p.tok_s = fv[4], p.bytes_per_token = fv[5];
    p.quality = fv[6];
    const char *why = missing ? "an incomplete group" : bad ? "a key of the wrong type" : plan_ok(&p, E);
    if (why) {
        MOE_LOGW("tuning: the plan.* keys are damaged (%s): ignored", why);
        return;
    }
    t->has_plan = 1, t->plan = p;
}

enum moe_status moe_tuning_set_plan(struct moe_bundle_kv *kv, const struct moe_tuning_plan *p) {
    const char *why = plan_ok(p, 1 << 20);
    if (why) {
        MOE_LOGE("invalid plan (%s)", why);
        return MOE_ERR_INVALID;
    }
    enum moe_status st;
    if ((st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PLAN_MEM, p->mem)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PLAN_EXPERT_MEM, p->expert_mem)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PLAN_DYNAMIC, p->dynamic)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PLAN_PREFETCH_PATHS, p->prefetch_paths)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PLAN_LITTLE_K, p->little_k)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PLAN_THREADS, p->threads)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_LOW_SHARE, p->low_share)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_T1, p->t1)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_T2, p->t2)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_GAMMA, p->gamma)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_TOK_S, p->tok_s)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_BYTES, p->bytes_per_token)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_PLAN_QUALITY, p->quality)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_PLAN_HIGH, p->high)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_PLAN_LOW, p->low)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_PLAN_POLICY, p->policy)))
        return st;
    return MOE_OK;
}

void moe_tuning_remove_plan(struct moe_bundle_kv *kv) {
    static const char *const keys[] = {MOE_TUNING_PLAN_MEM, MOE_TUNING_PLAN_EXPERT_MEM, MOE_TUNING_PLAN_HIGH,
                                       MOE_TUNING_PLAN_LOW, MOE_TUNING_PLAN_DYNAMIC, MOE_TUNING_PLAN_LOW_SHARE,
                                       MOE_TUNING_PLAN_T1, MOE_TUNING_PLAN_T2, MOE_TUNING_PLAN_POLICY,
                                       MOE_TUNING_PLAN_PREFETCH_PATHS, MOE_TUNING_PLAN_LITTLE_K, MOE_TUNING_PLAN_GAMMA,
                                       MOE_TUNING_PLAN_THREADS, MOE_TUNING_PLAN_TOK_S, MOE_TUNING_PLAN_BYTES,
                                       MOE_TUNING_PLAN_QUALITY};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) moe_bundle_kv_remove(kv, keys[i]);
}

enum moe_status moe_tuning_read(const struct moe_bundle_kv *kv, int n_layers, int n_experts,
                                struct moe_tuning *out) {
    if (!out || n_layers < 1 || n_experts < 1 || (int64_t)n_layers * n_experts > INT32_MAX / 4) {
        MOE_LOGE("invalid arguments (%d layers x %d experts)", n_layers, n_experts);
        return MOE_ERR_INVALID;
    }
    memset(out, 0, sizeof *out);
    out->target_fallback = NAN;
    const int64_t LE = (int64_t)n_layers * n_experts;
    read_thresholds(kv, out);
    read_cache(kv, LE, out);
    read_popularity(kv, LE, out);
    read_bitwidth(kv, n_layers, n_experts, out);
    read_big_little(kv, n_experts, out);
    read_plan(kv, n_experts, out);
    read_route(kv, out);
    read_dynamic_until(kv, out);
    return read_order(kv, LE, out);
}

/* check_layer_map: moe_layer maps n_layers MoE layers into n_model_layers. */
static int check_layer_map(int n_layers, const int *moe_layer, int n_model_layers) {
    if (!moe_layer) return n_model_layers == n_layers;
    for (int i = 0; i < n_layers; i++)
        if (moe_layer[i] < 0 || moe_layer[i] >= n_model_layers || (i && moe_layer[i] <= moe_layer[i - 1])) return 0;
    return 1;
}

enum moe_status moe_tuning_order_for_cache(const struct moe_tuning *t, int n_layers, int n_experts,
                                           const int *moe_layer, int n_model_layers, int32_t *out) {
    if (!t || !t->has_placement_order) return MOE_ERR_NOT_FOUND;
    if (!check_layer_map(n_layers, moe_layer, n_model_layers)) {
        MOE_LOGE("invalid layer map: %d MoE layers into %d model layers", n_layers, n_model_layers);
        return MOE_ERR_INVALID;
    }
    const int64_t LE = (int64_t)n_layers * n_experts;
    int64_t n = 0;
    for (int64_t i = 0; i < LE; i++) {
        const int64_t g = t->placement_order[i], l = g / n_experts, e = g % n_experts;
        out[n++] = (int32_t)((moe_layer ? moe_layer[l] : l) * n_experts + e);
    }
    for (int l = 0, i = 0; l < n_model_layers; l++) { /* the layers without experts, at the end */
        if (i < n_layers && (moe_layer ? moe_layer[i] : i) == l) {
            i++;
            continue;
        }
        for (int e = 0; e < n_experts; e++) out[n++] = (int32_t)(l * n_experts + e);
    }
    return MOE_OK;
}

enum moe_status moe_tuning_popularity_for_cache(const struct moe_tuning *t, int n_layers, int n_experts,
                                                const int *moe_layer, int n_model_layers, double *freq_high,
                                                double *freq_low) {
    if (!t || !t->has_cache_popularity) return MOE_ERR_NOT_FOUND;
    if (!check_layer_map(n_layers, moe_layer, n_model_layers)) {
        MOE_LOGE("invalid layer map: %d MoE layers into %d model layers", n_layers, n_model_layers);
        return MOE_ERR_INVALID;
    }
    const size_t ME = (size_t)n_model_layers * n_experts;
    memset(freq_high, 0, sizeof *freq_high * ME);
    memset(freq_low, 0, sizeof *freq_low * ME);
    for (int l = 0; l < n_layers; l++)
        for (int e = 0; e < n_experts; e++) {
            const size_t src = (size_t)l * n_experts + e, dst = (size_t)(moe_layer ? moe_layer[l] : l) * n_experts + e;
            freq_high[dst] = t->cache_freq_high[src], freq_low[dst] = t->cache_freq_low[src];
        }
    return MOE_OK;
}

/* ---------------------------------------------------------------- writing */

enum moe_status moe_tuning_set_profile(struct moe_bundle_kv *kv, const char *dataset, int64_t tokens,
                                       const char *tool_version) {
    enum moe_status st;
    if ((st = moe_bundle_kv_set_str(kv, MOE_TUNING_PROFILE_DATASET, dataset)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_PROFILE_TOKENS, tokens)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_PROFILE_TOOL_VERSION, tool_version)))
        return st;
    return MOE_OK;
}

enum moe_status moe_tuning_set_thresholds(struct moe_bundle_kv *kv, double t1, double t2, double target_low,
                                          double target_skip) {
    enum moe_status st;
    if (!(t1 >= 0 && t1 <= t2 && t2 <= 1)) {
        MOE_LOGE("HOBBIT thresholds T1 %g, T2 %g are not 0 <= T1 <= T2 <= 1", t1, t2);
        return MOE_ERR_INVALID;
    }
    if ((st = moe_bundle_kv_set_f64(kv, MOE_TUNING_HOBBIT_T1, t1)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_HOBBIT_T2, t2)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_HOBBIT_TARGET_LOW, target_low)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_HOBBIT_TARGET_SKIP, target_skip)))
        return st;
    return MOE_OK;
}

enum moe_status moe_tuning_set_placement_order(struct moe_bundle_kv *kv, const int32_t *order, size_t n) {
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) {
        MOE_LOGE("out of memory");
        return MOE_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) v[i] = order[i];
    enum moe_status st = moe_bundle_kv_set_i64_array(kv, MOE_TUNING_PLACEMENT_ORDER, v, n);
    free(v);
    return st;
}

enum moe_status moe_tuning_set_paths(struct moe_bundle_kv *kv, int order, int key_len, int top, size_t n,
                                     const int64_t *layer, const int64_t *keys, const int64_t *totals,
                                     const int64_t *next, const double *prob) {
    enum moe_status st;
    if (order < 1 || order > 2 || key_len < 1 || top < 1 ||
        (n && (!layer || !keys || !totals || !next || !prob))) {
        MOE_LOGE("invalid path dictionary (order %d, key length %d, top %d, %zu entries)", order, key_len, top, n);
        return MOE_ERR_INVALID;
    }
    const char *const *k = k_path_key[order - 1];
    if ((st = moe_bundle_kv_set_i64(kv, k[0], key_len)) || (st = moe_bundle_kv_set_i64(kv, k[1], top)) ||
        (st = moe_bundle_kv_set_i64_array(kv, k[2], layer, n)) ||
        (st = moe_bundle_kv_set_i64_array(kv, k[3], keys, n * (size_t)key_len)) ||
        (st = moe_bundle_kv_set_i64_array(kv, k[4], totals, n)) ||
        (st = moe_bundle_kv_set_i64_array(kv, k[5], next, n * (size_t)top)) ||
        (st = moe_bundle_kv_set_f64_array(kv, k[6], prob, n * (size_t)top)))
        return st;
    return MOE_OK;
}

enum moe_status moe_tuning_set_big_little(struct moe_bundle_kv *kv, double gamma, double target_fallback,
                                          int little_k) {
    enum moe_status st;
    if (!(gamma >= 0 && gamma <= 1) || little_k < 1) {
        MOE_LOGE("MoBiLE gamma %g (want [0, 1]) or little_k %d (want >= 1) out of range", gamma, little_k);
        return MOE_ERR_INVALID;
    }
    if ((st = moe_bundle_kv_set_f64(kv, MOE_TUNING_MOBILE_GAMMA, gamma)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_MOBILE_TARGET_FALLBACK, target_fallback)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_MOBILE_LITTLE_K, little_k)))
        return st;
    return MOE_OK;
}

enum moe_status moe_tuning_set_cache_route(struct moe_bundle_kv *kv, double margin, double target_mass) {
    enum moe_status st;
    if (!(margin >= 0 && margin <= 1) || (!isnan(target_mass) && !(target_mass >= 0 && isfinite(target_mass)))) {
        MOE_LOGE("cache-aware routing margin %g (want [0, 1]) or target mass %g (want >= 0) out of range", margin,
                 target_mass);
        return MOE_ERR_INVALID;
    }
    if ((st = moe_bundle_kv_set_f64(kv, MOE_TUNING_ROUTE_MARGIN, margin))) return st;
    if (!isnan(target_mass)) return moe_bundle_kv_set_f64(kv, MOE_TUNING_ROUTE_TARGET, target_mass);
    moe_bundle_kv_remove(kv, MOE_TUNING_ROUTE_TARGET);
    return MOE_OK;
}

enum moe_status moe_tuning_set_dynamic_until(struct moe_bundle_kv *kv, double share) {
    if (isnan(share)) {
        moe_bundle_kv_remove(kv, MOE_TUNING_DYNAMIC_UNTIL);
        return MOE_OK;
    }
    if (!(share > 0 && share <= 1)) {
        MOE_LOGE("dynamic precision's limit %g: want a share in (0, 1]", share);
        return MOE_ERR_INVALID;
    }
    return moe_bundle_kv_set_f64(kv, MOE_TUNING_DYNAMIC_UNTIL, share);
}

void moe_tuning_remove_big_little(struct moe_bundle_kv *kv) {
    moe_bundle_kv_remove(kv, MOE_TUNING_MOBILE_GAMMA);
    moe_bundle_kv_remove(kv, MOE_TUNING_MOBILE_TARGET_FALLBACK);
    moe_bundle_kv_remove(kv, MOE_TUNING_MOBILE_LITTLE_K);
}

enum moe_status moe_tuning_set_cache(struct moe_bundle_kv *kv, const double w[MOE_CACHE_N_WEIGHTS], int admit,
                                     int high_experts, int low_experts, const char *high_precision,
                                     const char *low_precision) {
    enum moe_status st;
    double sum = 0;
    int ok = high_experts >= 0 && low_experts >= 0 && high_precision && low_precision && (admit == 0 || admit == 1);
    for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) ok &= w[i] >= 0 && isfinite(w[i]), sum += w[i];
    if (!ok || fabs(sum - 1) > 1e-6) {
        MOE_LOGE("invalid cache tuning: weights must be >= 0 and sum to 1 (sum %g), admission 0 or 1 (%d), sizes "
                 "%d, %d >= 0, both precisions named", sum, admit, high_experts, low_experts);
        return MOE_ERR_INVALID;
    }
    for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++)
        if ((st = moe_bundle_kv_set_f64(kv, k_cache_w[i], w[i]))) return st;
    if ((st = moe_bundle_kv_set_i64(kv, MOE_TUNING_CACHE_ADMIT, admit)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_CACHE_HIGH_EXPERTS, high_experts)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_CACHE_LOW_EXPERTS, low_experts)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_CACHE_HIGH_PRECISION, high_precision)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_CACHE_LOW_PRECISION, low_precision)))
        return st;
    return MOE_OK;
}

enum moe_status moe_tuning_set_cache_popularity(struct moe_bundle_kv *kv, const double *freq_high,
                                                const double *freq_low, size_t n, double low_cost) {
    enum moe_status st;
    int ok = (freq_high && freq_low) || n == 0;
    for (size_t g = 0; ok && g < n; g++)
        ok = freq_high[g] >= 0 && freq_high[g] <= 1 && freq_low[g] >= 0 && freq_low[g] <= 1;
    if (!ok || !(low_cost >= 0) || !isfinite(low_cost)) {
        MOE_LOGE("invalid cache popularity: shares must be in [0, 1] and the low cost >= 0 (%g)", low_cost);
        return MOE_ERR_INVALID;
    }
    if ((st = moe_bundle_kv_set_f64_array(kv, MOE_TUNING_CACHE_FREQ_HIGH, freq_high, n)) ||
        (st = moe_bundle_kv_set_f64_array(kv, MOE_TUNING_CACHE_FREQ_LOW, freq_low, n)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_CACHE_LOW_COST, low_cost)))
        return st;
    return MOE_OK;
}

enum moe_status moe_tuning_set_bitwidth(struct moe_bundle_kv *kv, const int64_t *map, size_t n, double loss,
                                        double heldout_loss, double max_loss, int64_t max_bytes,
                                        int64_t expert_bytes, const char *dataset) {
    enum moe_status st;
    if ((st = moe_bundle_kv_set_i64_array(kv, MOE_TUNING_BITWIDTH_MAP, map, n)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_BITWIDTH_LOSS, loss)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_BITWIDTH_HELDOUT_LOSS, heldout_loss)) ||
        (st = moe_bundle_kv_set_f64(kv, MOE_TUNING_BITWIDTH_MAX_LOSS, max_loss)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_BITWIDTH_MAX_BYTES, max_bytes)) ||
        (st = moe_bundle_kv_set_i64(kv, MOE_TUNING_BITWIDTH_EXPERT_BYTES, expert_bytes)) ||
        (st = moe_bundle_kv_set_str(kv, MOE_TUNING_BITWIDTH_DATASET, dataset)))
        return st;
    return MOE_OK;
}

/* ------------------------------------------------------------ path table */

#define MAX_KEY 64 /* order * k, as the profiler's dictionary */

struct moe_path_table {
    int order, L, E, k, key_len, top;
    size_t n, cap;   /* entries; hash slots (a power of two >= 2n) */
    int32_t *slot;   /* [cap] entry index, -1 = empty */
    int32_t *layer;  /* [n] MoE layer */
    int16_t *keys;   /* [n * key_len] each layer's set ascending */
    int16_t *next;   /* [n * top] most probable first */
    double *prob;    /* [n * top] */
};

void moe_path_table_free(struct moe_path_table *t) {
    if (!t) return;
    free(t->slot);
    free(t->layer);
    free(t->keys);
    free(t->next);
    free(t->prob);
    free(t);
}

size_t moe_path_table_entries(const struct moe_path_table *t) { return t ? t->n : 0; }

/* hash_key: FNV-1a over the layer and the key. */
static uint64_t hash_key(int layer, const int16_t *key, int len) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)layer;
    h *= 1099511628211ull;
    for (int i = 0; i < len; i++) {
        h ^= (uint16_t)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* find: the slot holding (layer, key), or the empty slot where it would go. */
static size_t find(const struct moe_path_table *t, int layer, const int16_t *key) {
    size_t i = hash_key(layer, key, t->key_len) & (t->cap - 1);
    while (t->slot[i] >= 0) {
        const int32_t q = t->slot[i];
        if (t->layer[q] == layer && !memcmp(t->keys + (size_t)q * t->key_len, key, sizeof *key * (size_t)t->key_len))
            break;
        i = (i + 1) & (t->cap - 1);
    }
    return i;
}

/* path_arrays: the seven keys of the order's dictionary; 0 none present, 1
 * all present with their types and consistent shapes, -1 malformed (warned). */
static int path_arrays(const struct moe_bundle_kv *kv, int order, struct moe_bundle_kv_item it[7], size_t *n) {
    static const enum moe_bundle_kv_type want[7] = {MOE_KV_I64,       MOE_KV_I64,       MOE_KV_I64_ARRAY,
                                                    MOE_KV_I64_ARRAY, MOE_KV_I64_ARRAY, MOE_KV_I64_ARRAY,
                                                    MOE_KV_F64_ARRAY};
    const char *const *k = k_path_key[order - 1];
    int found = 0, bad = 0;
    for (int i = 0; i < 7; i++) {
        int r = get(kv, k[i], want[i], &it[i]);
        found += r != 0, bad |= r < 0;
    }
    if (found == 0) return 0;
    if (bad) return -1;
    if (found < 7) {
        MOE_LOGW("tuning: the order-%d path dictionary is incomplete (%d of 7 keys)", order, found);
        return -1;
    }
    *n = it[2].count;
    const int64_t kl = it[0].i64, top = it[1].i64;
    if (kl < 1 || kl > MAX_KEY || top < 1 || top > 32767 || it[3].count != *n * (size_t)kl || it[4].count != *n ||
        it[5].count != *n * (size_t)top || it[6].count != *n * (size_t)top) {
        MOE_LOGW("tuning: the order-%d path dictionary's arrays do not match (%zu entries, key length %lld, top "
                 "%lld)", order, *n, (long long)kl, (long long)top);
        return -1;
    }
    return 1;
}

/* check_entry: entry q of the exported arrays is well formed. */
static int check_entry(const struct moe_path_table *t, const struct moe_bundle_kv_item it[7], size_t q) {
    const int64_t l = it[2].i64s[q], *key = it[3].i64s + q * (size_t)t->key_len;
    const int64_t *nx = it[5].i64s + q * (size_t)t->top;
    const double *pr = it[6].f64s + q * (size_t)t->top;
    if (l < t->order || l >= t->L || it[4].i64s[q] < 1) return 0;
    for (int j = 0; j < t->key_len; j++) {
        if (key[j] < 0 || key[j] >= t->E) return 0;
        if (j % t->k && key[j] <= key[j - 1]) return 0; /* each layer's set strictly ascending */
    }
    for (int j = 0; j < t->top; j++) {
        if (nx[j] < 0 || nx[j] >= t->E || !(pr[j] >= 0 && pr[j] <= 1)) return 0;
        if (j && pr[j] > pr[j - 1]) return 0; /* most probable first */
        for (int i = 0; i < j; i++)
            if (nx[i] == nx[j]) return 0;
    }
    return 1;
}

enum moe_status moe_path_table_from_tuning(const struct moe_bundle_kv *kv, int order, int n_layers, int n_experts,
                                           int k, struct moe_path_table **out) {
    struct moe_bundle_kv_item it[7];
    size_t n = 0;
    if (!out || order < 1 || order > 2 || n_layers < 1 || n_experts < 1 || n_experts > 32767 || k < 1 ||
        k > n_experts) {
        MOE_LOGE("invalid arguments: order %d, %d layers x %d experts, top-%d", order, n_layers, n_experts, k);
        return MOE_ERR_INVALID;
    }
    *out = NULL;
    const int r = path_arrays(kv, order, it, &n);
    if (r == 0) return MOE_ERR_NOT_FOUND;
    if (r < 0) return MOE_ERR_FORMAT;
    if (it[0].i64 != (int64_t)order * k || it[1].i64 > n_experts || n > (size_t)INT32_MAX / 2) {
        MOE_LOGW("tuning: the order-%d path dictionary has key length %lld and top %lld; the model wants %d and at "
                 "most %d", order, (long long)it[0].i64, (long long)it[1].i64, order * k, n_experts);
        return MOE_ERR_FORMAT;
    }
    struct moe_path_table *t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    *t = (struct moe_path_table){order, n_layers, n_experts, k, (int)it[0].i64, (int)it[1].i64, n, 16,
                                 NULL, NULL, NULL, NULL, NULL};
    while (t->cap < 2 * n) t->cap *= 2;
    t->slot = malloc(sizeof *t->slot * t->cap);
    t->layer = malloc(sizeof *t->layer * (n ? n : 1));
    t->keys = malloc(sizeof *t->keys * (n ? n : 1) * (size_t)t->key_len);
    t->next = malloc(sizeof *t->next * (n ? n : 1) * (size_t)t->top);
    t->prob = malloc(sizeof *t->prob * (n ? n : 1) * (size_t)t->top);
    if (!t->slot || !t->layer || !t->keys || !t->next || !t->prob) goto nomem;
    for (size_t i = 0; i < t->cap; i++) t->slot[i] = -1;
    for (size_t q = 0; q < n; q++) {
        if (!check_entry(t, it, q)) {
            MOE_LOGW("tuning: entry %zu of the order-%d path dictionary is malformed (layer, expert id, key order "
                     "or probabilities)", q, order);
            moe_path_table_free(t);
            return MOE_ERR_FORMAT;
        }
        t->layer[q] = (int32_t)it[2].i64s[q];
        for (int j = 0; j < t->key_len; j++) t->keys[q * t->key_len + j] = (int16_t)it[3].i64s[q * t->key_len + j];
        for (int j = 0; j < t->top; j++) {
            t->next[q * t->top + j] = (int16_t)it[5].i64s[q * t->top + j];
            t->prob[q * t->top + j] = it[6].f64s[q * t->top + j];
        }
        const size_t s = find(t, t->layer[q], t->keys + q * t->key_len);
        if (t->slot[s] >= 0) {
            MOE_LOGW("tuning: entry %zu of the order-%d path dictionary repeats a key of layer %d", q, order,
                     (int)t->layer[q]);
            moe_path_table_free(t);
            return MOE_ERR_FORMAT;
        }
        t->slot[s] = (int32_t)q;
    }
    *out = t;
    return MOE_OK;
nomem:
    moe_path_table_free(t);
    MOE_LOGE("out of memory");
    return MOE_ERR_NOMEM;
}

int moe_path_table_lookup(const struct moe_path_table *t, int layer, const int32_t *prev, int m, int32_t *out) {
    if (!t || !prev || !out || m < 1 || layer < t->order || layer >= t->L || t->n == 0) return 0;
    int16_t key[MAX_KEY];
    for (int j = 0; j < t->key_len; j++) { /* each layer's set sorted ascending, as stored */
        if (prev[j] < 0 || prev[j] >= t->E) return 0;
        int i = j;
        for (; i % t->k && key[i - 1] > prev[j]; i--) key[i] = key[i - 1];
        key[i] = (int16_t)prev[j];
    }
    const int32_t q = t->slot[find(t, layer, key)];
    if (q < 0) return 0;
    int n = 0;
    for (int j = 0; j < t->top && n < m && t->prob[(size_t)q * t->top + j] > 0; j++)
        out[n++] = t->next[(size_t)q * t->top + j];
    return n;
}
