/*
 * test-fit-cache.c - `moe-prep fit-cache` end to end on the trained demo
 * model (datasets/models/tiny-moe-mixtral): quantized to a bundle with three
 * expert precisions and profiled over one held-out text here, then
 *   - --cache-experts 8,4 --json --csv: exit 0; the JSON names every policy
 *     at each of the 3 sizes (8, 16 and 24 of 32 experts), picks q8_0 / q2_k
 *     with low_cost their size ratio, takes T1/T2 from the profile, and
 *     reports on held-out sequences; each size has the offline optimum
 *     (a lower bound no policy is below: every gap to it >= 0, and a best
 *     schedule at or above it); the CSV has a row per policy and size;
 *   - the fit is no worse than HOBBIT's corners (LRU, LFU-seq, LHU) on the
 *     fit part;
 *   - the bundle's tuning section holds hobbit.cache.* (the JSON's five
 *     weights and admission, 8 and 4 experts, the per-need shares and low
 *     cost of the popularity term) and still every key `profile` wrote;
 *   - the profile gained the cache.* arrays with their shapes (penalty
 *     finite, Belady's lowest, every policy better with a larger cache) and
 *     kept its trace; `profile report` shows the section;
 *   - --fast-mem splits the budget by --low-share with the real blob sizes
 *     (with --opt-iters 0: the closed-form bound only); with --prefetch the
 *     policies that do not prefetch stay above the bound;
 *     --paper-hobbit fits the paper's four weights without admission;
 *     --no-tuning and --no-profile-update leave both files as they were;
 *   - usage errors exit 2 naming the option, a missing profile or one of
 *     another model exit 1 saying what to do, --help exits 0 with an example.
 * argv[1] is the moe-prep binary. Exit 77 (skipped) without the model.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "moe-bundle.h"
#include "moe-test.h"
#include "moe-tuning.h"
#include "profile-h5.h"

#define MODEL MOE_FIXTURES "/../../datasets/models/tiny-moe-mixtral"

static const char *moe_prep;
static char dir[64] = "/tmp/test-fit-cache-XXXXXX";

/* path: a file in the scratch directory. */
static const char *path(const char *name) {
    static char buf[8][256];
    static int i;
    char *b = buf[i++ % 8];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

/* sh: run a shell command (printf-style); its exit status. */
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* slurp: a whole file as a string (NULL if unreadable). */
static char *slurp(const char *p, size_t *len) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    size_t got = s ? fread(s, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!s) return NULL;
    s[got] = 0;
    if (len) *len = got;
    return s;
}

/* count: occurrences of needle in s. */
static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *q = s; (q = strstr(q, needle)); q += strlen(needle)) n++;
    return n;
}

/* get: the member `key` of object o (NULL if o is NULL or lacks it). */
static const cJSON *get(const cJSON *o, const char *key) { return o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL; }

/* num: the number o[key]; NAN if absent or not a number. */
static double num(const cJSON *o, const char *key) {
    const cJSON *x = get(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* str_is: o[key] is the string want. */
static int str_is(const cJSON *o, const char *key, const char *want) {
    const cJSON *x = get(o, key);
    return cJSON_IsString(x) && !strcmp(x->valuestring, want);
}

/* policy_entry: the entry of results array r whose "policy" is name. */
static const cJSON *policy_entry(const cJSON *r, const char *name) {
    const cJSON *x;
    cJSON_ArrayForEach(x, r) if (str_is(x, "policy", name)) return x;
    return NULL;
}

/* load_json: a file parsed with cJSON (NULL if unreadable or not JSON). */
static cJSON *load_json(const char *file) {
    char *s = slurp(file, NULL);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    free(s);
    return j;
}

/* same_file: byte-identical files. */
static int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x), free(y);
    return same;
}

/* prepare: the bundle and its profile (ctx 128 for more sequences). */
static int prepare(void) {
    if (sh("%s quantize %s -o %s --experts q8_0,q4_k,q2_k --dense q8_0 -t 2 >%s 2>&1", moe_prep, MODEL,
           path("m.moeb"), path("quantize.log"))) {
        CHECK(0, "quantize (see %s)", path("quantize.log"));
        return 0;
    }
    if (sh("%s profile %s --dataset %s/heldout/wordnet.txt --out %s --ctx 128 --big-little-every 0 >%s 2>&1", moe_prep,
           path("m.moeb"), MODEL, path("p.h5"), path("profile.log"))) {
        CHECK(0, "profile (see %s)", path("profile.log"));
        return 0;
    }
    return 1;
}

/* dynamic_grid: fit-cache's comparison of dynamic precision with every byte
 * as high copies: budgets ascending, the caches of each split as the store
 * splits them, finite penalties, until_share the smallest share from which
 * high copies only never miss more; the bundle's tuning holds it (or not);
 * moe-prep eval's engine follows it under --dynamic auto and not under on. */
static void dynamic_grid(const cJSON *js) {
    const cJSON *d = get(js, "dynamic_precision"), *g = get(d, "grid"), *y;
    const int n = cJSON_GetArraySize(g);
    CHECK(n >= 5, "dynamic precision replayed at %d budgets", n);
    double prev = 0, until = NAN;
    int ok = 1, i = 0;
    double share[32], on[32], off[32];
    cJSON_ArrayForEach(y, g) {
        if (i >= 32) break;
        share[i] = num(y, "share"), on[i] = num(y, "penalty_on"), off[i] = num(y, "penalty_off");
        ok &= share[i] > prev && share[i] <= 1 && on[i] >= 0 && off[i] >= 0 && num(y, "high_off") >= num(y, "high_on");
        prev = share[i++];
    }
    CHECK(ok, "budgets ascending, penalties finite, more high copies without low ones");
    for (int j = i - 1; j >= 0 && off[j] <= on[j]; j--) until = share[j];
    const cJSON *u = get(d, "until_share");
    CHECK(isnan(until) ? cJSON_IsNull(u) : cJSON_IsNumber(u) && u->valuedouble == until,
          "until_share follows the grid (expected %g)", until);
    struct moe_bundle *b = NULL;
    struct moe_tuning t;
    memset(&t, 0, sizeof t);
    CHECK(moe_bundle_open(path("m.moeb"), &b) == MOE_OK && moe_tuning_read(moe_bundle_tuning(b), 4, 8, &t) == MOE_OK &&
              (isnan(until) ? isnan(t.dynamic_until) : t.dynamic_until == until),
          "tuning cache.dynamic_until %g (expected %g)", t.dynamic_until, until);
    moe_bundle_free(b);
    /* the store follows a limit of 5 %: at 50 % of the high bytes --dynamic auto keeps high copies only
     * (LRU), --dynamic on keeps dynamic precision */
    struct moe_bundle_kv *kv = NULL;
    b = NULL;
    int set = moe_bundle_open(path("m.moeb"), &b) == MOE_OK && moe_bundle_kv_new(&kv) == MOE_OK &&
              moe_bundle_kv_copy(kv, moe_bundle_tuning(b)) == MOE_OK;
    moe_bundle_free(b);
    set = set && moe_tuning_set_dynamic_until(kv, 0.05) == MOE_OK && moe_bundle_replace_tuning(path("m.moeb"), kv) == MOE_OK;
    moe_bundle_kv_free(kv);
    CHECK(set, "tuning cache.dynamic_until 0.05 written");
    char out[4096];
    const char *eval = "%s eval %s --dataset %s/heldout/c4.txt --ctx 64 --max-chunks 1 --batch 1 --expert-mem 50%% "
                       "--high q8_0 --low q2_k %s 2>/dev/null";
    int rc = moe_test_sh_out(out, sizeof out, eval, moe_prep, path("m.moeb"), MODEL, "");
    CHECK(rc == 0 && strstr(out, "engine   lru, dynamic precision off"), "auto above the limit: high copies, LRU: %.300s",
          strstr(out, "engine") ? strstr(out, "engine") : out);
    rc = moe_test_sh_out(out, sizeof out, eval, moe_prep, path("m.moeb"), MODEL, "--dynamic on");
    CHECK(rc == 0 && strstr(out, "dynamic precision on"), "--dynamic on is kept: %.300s",
          strstr(out, "engine") ? strstr(out, "engine") : out);
}

/* test_main_run: --cache-experts 8,4 with every output. */
static void test_main_run(void) {
    struct moe_profile *before = NULL, *after = NULL;
    CHECK(moe_profile_read(path("p.h5"), &before) == MOE_OK, "read the profile");
    int rc = sh("%s fit-cache %s --profile %s --cache-experts 8,4 --json --csv %s >%s 2>%s", moe_prep, path("m.moeb"),
                path("p.h5"), path("t.csv"), path("out.json"), path("err.txt"));
    CHECK(rc == 0, "fit-cache exits 0 (%d)", rc);
    char *err = slurp(path("err.txt"), NULL);
    cJSON *js = load_json(path("out.json"));
    CHECK(cJSON_IsObject(js), "the output parses as one JSON object");
    dynamic_grid(js);
    double w[5] = {NAN, NAN, NAN, NAN, NAN}, low_cost = NAN;
    int admission = -1;
    static const char *const pn[9] = {"lru", "lfu-seq", "lfu-global", "lhu", "fld", "edgemoe", "twiddler", "hobbit",
                                      "belady"};
    if (js) {
        const cJSON *pol = get(js, "policies"), *sizes = get(js, "sizes"), *fit = get(js, "fit");
        int order_ok = cJSON_GetArraySize(pol) == 9;
        for (int q = 0; order_ok && q < 9; q++)
            order_ok = cJSON_IsString(cJSON_GetArrayItem(pol, q)) && !strcmp(cJSON_GetArrayItem(pol, q)->valuestring, pn[q]);
        CHECK(order_ok, "the policy order");
        CHECK(str_is(js, "bundle", path("m.moeb")) && str_is(js, "profile", path("p.h5")), "the files named");
        CHECK(num(get(js, "model"), "moe_layers") == 4 && num(get(js, "model"), "experts") == 8 &&
                  num(get(js, "model"), "k") == 2,
              "model shape");
        CHECK(num(get(js, "fitted_size"), "high_experts") == 8 && num(get(js, "fitted_size"), "low_experts") == 4,
              "fitted size 8 + 4");
        int n_fitted = 0, n_belady = 1, hs[3] = {0, 0, 0}, n_gap = 0, neg = 0, bad_opt = 0;
        const cJSON *z;
        CHECK(cJSON_GetArraySize(sizes) == 3, "three sizes (%d)", cJSON_GetArraySize(sizes));
        cJSON_ArrayForEach(z, sizes) {
            int i = n_gap / 9;
            if (i < 3) hs[i] = (int)num(z, "high_experts");
            n_fitted += cJSON_IsTrue(get(z, "fitted"));
            n_belady += policy_entry(get(z, "results"), "belady") != NULL;
            const cJSON *e, *o = get(z, "offline_optimum");
            const double lb = num(o, "lower_bound_per_token"), ub = num(o, "best_schedule_per_token");
            bad_opt += !(lb > 0 && ub >= lb && cJSON_IsBool(get(o, "exact")) && num(o, "requests") > 0 &&
                         num(o, "closed_form") <= num(o, "lower_bound") + 1e-9);
            cJSON_ArrayForEach(e, get(z, "results")) {
                n_gap++;
                neg += !(num(e, "gap_to_bound_pct") >= -1e-9) || !(num(e, "penalty_per_token") >= lb - 1e-12) ||
                       !isfinite(num(e, "gap_to_belady_pct"));
            }
        }
        CHECK(hs[0] == 8 && hs[1] == 16 && hs[2] == 24, "sizes 8, 16, 24 (%d %d %d)", hs[0], hs[1], hs[2]);
        CHECK(n_belady == 4 && policy_entry(get(fit, "results"), "belady"), "every policy at 3 sizes plus the fit part");
        CHECK(n_fitted == 1, "one fitted size");
        const cJSON *prec = get(js, "precision");
        CHECK(str_is(get(prec, "high"), "name", "q8_0") && str_is(get(prec, "low"), "name", "q2_k"), "high q8_0, low q2_k");
        double hb = num(get(prec, "high"), "bytes"), lb = num(get(prec, "low"), "bytes");
        low_cost = num(prec, "low_cost");
        CHECK(fabs(low_cost - lb / hb) < 1e-9, "low cost = low / high bytes");
        CHECK(str_is(get(js, "thresholds"), "source", "profile") && str_is(get(js, "sequences"), "reported_on", "heldout"),
              "thresholds from the profile, held-out report");
        static const char *const wn[5] = {"lru", "lfu", "lhu", "fld", "pop"};
        for (int i = 0; i < 5; i++) w[i] = num(get(fit, "weights"), wn[i]);
        CHECK(fabs(w[0] + w[1] + w[2] + w[3] + w[4] - 1) < 1e-6 && w[0] >= 0 && w[1] >= 0 && w[2] >= 0 && w[3] >= 0 &&
                  w[4] >= 0,
              "weights on the simplex: %g %g %g %g %g", w[0], w[1], w[2], w[3], w[4]);
        const cJSON *ad = get(fit, "admission");
        admission = cJSON_IsBool(ad) ? cJSON_IsTrue(ad) : -1;
        CHECK(admission >= 0, "the fit's admission setting");
        /* HOBBIT's corners are LRU, LFU-seq and LHU: the fit is no worse than any of them on the fit part */
        double pen[9];
        for (int q = 0; q < 9; q++) pen[q] = num(policy_entry(get(fit, "results"), pn[q]), "penalty");
        CHECK(pen[7] <= pen[0] && pen[7] <= pen[1] && pen[7] <= pen[3], "fit part: hobbit %g, lru %g, lfu-seq %g, lhu %g",
              pen[7], pen[0], pen[1], pen[3]);
        const cJSON *h = policy_entry(get(fit, "results"), "hobbit");
        CHECK(num(h, "tokens") > 0 && num(h, "accesses") >= num(h, "tokens") &&
                  fabs(num(h, "penalty_per_token") - num(h, "penalty") / num(h, "tokens")) < 1e-9,
              "per-token values agree with the counts");
        CHECK(n_gap == 27 && neg == 0, "27 gaps to the offline optimum's bound, none negative (%d, %d)", n_gap, neg);
        CHECK(bad_opt == 0, "each size's offline optimum: a positive bound, a schedule at or above it (%d bad)", bad_opt);
        CHECK(num(js, "tuning_keys") > 6 && cJSON_IsTrue(get(js, "profile_updated")), "outputs written");
    }
    cJSON_Delete(js);
    CHECK(err && strstr(err, "fitting HOBBIT"), "progress on stderr");
    char *csv = slurp(path("t.csv"), NULL);
    CHECK(csv && count(csv, "\n") == 1 + 27 && strncmp(csv, "high_experts,low_experts,", 25) == 0 &&
              strstr(csv, ",prefetch_hits,gap_to_bound_pct,bound_per_token,bound_exact\n"),
          "CSV rows, the bound's columns last");
    free(err), free(csv);

    /* the tuning section */
    struct moe_bundle *b = NULL;
    CHECK(moe_bundle_open(path("m.moeb"), &b) == MOE_OK, "open the bundle");
    if (b) {
        const struct moe_bundle_kv *kv = moe_bundle_tuning(b);
        static const char *const keys[5] = {"hobbit.cache.w_lru", "hobbit.cache.w_lfu", "hobbit.cache.w_lhu",
                                            "hobbit.cache.w_fld", "hobbit.cache.w_pop"};
        for (int i = 0; i < 5; i++) {
            double x = NAN;
            CHECK(moe_bundle_kv_f64(kv, keys[i], &x) == MOE_OK && fabs(x - w[i]) < 1e-8, "%s = %g (JSON %g)", keys[i],
                  x, w[i]);
        }
        int64_t h = 0, l = 0, adm = -1;
        size_t nf = 0, nl = 0;
        double lc = NAN;
        CHECK(moe_bundle_kv_i64(kv, "hobbit.cache.admit", &adm) == MOE_OK && adm == admission, "admit %lld",
              (long long)adm);
        CHECK(moe_bundle_kv_f64_array(kv, "hobbit.cache.freq_high", &nf) && nf == 32 &&
                  moe_bundle_kv_f64_array(kv, "hobbit.cache.freq_low", &nl) && nl == 32 &&
                  moe_bundle_kv_f64(kv, "hobbit.cache.low_cost", &lc) == MOE_OK && fabs(lc - low_cost) < 1e-9,
              "the popularity the weights were fitted with (%zu, %zu, low cost %g)", nf, nl, lc);
        CHECK(moe_bundle_kv_i64(kv, "hobbit.cache.high_experts", &h) == MOE_OK && h == 8, "high_experts %lld",
              (long long)h);
        CHECK(moe_bundle_kv_i64(kv, "hobbit.cache.low_experts", &l) == MOE_OK && l == 4, "low_experts %lld",
              (long long)l);
        double t1;
        size_t n = 0;
        CHECK(moe_bundle_kv_f64(kv, "hobbit.t1", &t1) == MOE_OK &&
                  moe_bundle_kv_i64_array(kv, "twiddler.placement_order", &n) && n == 32,
              "the profile's keys are kept");
        moe_bundle_free(b);
    }

    /* the profile's new arrays */
    CHECK(moe_profile_read(path("p.h5"), &after) == MOE_OK, "read the updated profile");
    if (before && after) {
        CHECK(after->n_seq == before->n_seq && moe_profile_n_tokens(after) == moe_profile_n_tokens(before) &&
                  memcmp(after->experts, before->experts, sizeof(int16_t) * (size_t)moe_profile_n_tokens(after) *
                                                             after->n_layers * after->k) == 0,
              "the trace is kept");
        const int64_t *sz = NULL;
        const double *pen = NULL, *hit = NULL, *cw = NULL;
        int nd = 0;
        int64_t dims[MOE_PROFILE_MAX_DIMS];
        CHECK(moe_profile_get_i64(after, "cache.sizes", &nd, dims, &sz) == MOE_OK && nd == 1 && dims[0] == 3 &&
                  sz[0] == 8 && sz[1] == 16 && sz[2] == 24,
              "cache.sizes");
        CHECK(moe_profile_get_f64(after, "cache.penalty", &nd, dims, &pen) == MOE_OK && nd == 2 && dims[0] == 9 &&
                  dims[1] == 3,
              "cache.penalty [9 x 3]");
        CHECK(moe_profile_get_f64(after, "cache.hit_ratio", &nd, dims, &hit) == MOE_OK && dims[0] == 9, "hit ratio");
        CHECK(moe_profile_get_f64(after, "cache.weights", &nd, dims, &cw) == MOE_OK && nd == 1 && dims[0] == 6 &&
                  fabs(cw[0] - w[0]) < 1e-8 && fabs(cw[4] - w[4]) < 1e-8 && cw[5] == admission,
              "cache.weights: five weights and the admission flag");
        CHECK(moe_profile_get_f64(after, "hobbit_thresholds", NULL, NULL, &cw) == MOE_OK, "derived arrays kept");
        if (pen && hit && sz) {
            int bad = 0;
            for (int q = 0; q < 9; q++)
                for (int s = 0; s < 3; s++) {
                    double x = pen[q * 3 + s];
                    bad += !isfinite(x) || x < pen[8 * 3 + s] || !(hit[q * 3 + s] >= 0 && hit[q * 3 + s] <= 1);
                    if (s) bad += x > pen[q * 3 + s - 1];
                }
            CHECK(bad == 0, "penalties finite, Belady's lowest, smaller with a larger cache (%d bad)", bad);
        }
    }
    moe_profile_free(before);
    moe_profile_free(after);
    CHECK(sh("%s profile report %s -o %s 2>/dev/null", moe_prep, path("p.h5"), path("r.html")) == 0, "report");
    char *html = slurp(path("r.html"), NULL);
    CHECK(html && strstr(html, "<section id=\"cache\">") && !strstr(html, "<code>cache."), "report shows the section");
    free(html);
}

/* test_fast_mem: the budget split and the no-write switches. */
static void test_fast_mem(void) {
    struct moe_bundle *b = NULL;
    uint32_t hi = 0, lo = 0;
    double hb = 0, lb = 0;
    if (moe_bundle_open(path("m.moeb"), &b) == MOE_OK && moe_bundle_find_precision(b, "q8_0", &hi) == MOE_OK &&
        moe_bundle_find_precision(b, "q2_k", &lo) == MOE_OK) {
        hb = (double)moe_bundle_precision_at(b, hi)->raw_size, lb = (double)moe_bundle_precision_at(b, lo)->raw_size;
    }
    moe_bundle_free(b);
    CHECK(hb > 0 && lb > 0, "precision sizes");
    const double budget = 3 << 20; /* 3 MiB, low share 0.25 */
    const int want_h = (int)floor(0.75 * budget / hb), want_l = (int)floor(0.25 * budget / lb);
    sh("cp %s %s && cp %s %s", path("m.moeb"), path("m0.moeb"), path("p.h5"), path("p0.h5"));
    int rc = sh("%s fit-cache %s --profile %s --fast-mem 3MiB --no-tuning --no-profile-update --json --heldout 0.5 "
                "--sizes 4,12 --opt-iters 0 >%s 2>/dev/null",
                moe_prep, path("m.moeb"), path("p.h5"), path("fm.json"));
    CHECK(rc == 0, "--fast-mem exits 0 (%d)", rc);
    cJSON *js = load_json(path("fm.json"));
    if (js) {
        const cJSON *fs = get(js, "fitted_size");
        CHECK(num(fs, "high_experts") == want_h && num(fs, "low_experts") == want_l,
              "3 MiB: %d high + %d low experts (got %g + %g)", want_h, want_l, num(fs, "high_experts"),
              num(fs, "low_experts"));
        CHECK(num(js, "fast_mem_bytes") == budget && num(js, "low_share") == 0.25, "the budget echoed");
        CHECK(cJSON_GetArraySize(get(js, "sizes")) == 3, "sizes 4, 12 and the fitted one");
        CHECK(num(js, "tuning_keys") == 0 && cJSON_IsFalse(get(js, "profile_updated")), "nothing written");
        const cJSON *o = get(cJSON_GetArrayItem(get(js, "sizes"), 0), "offline_optimum");
        CHECK(num(o, "iterations") == 0 && num(o, "lower_bound") >= num(o, "closed_form") - 1e-9 &&
                  num(o, "lagrangian") == 0,
              "--opt-iters 0: the closed-form bound only");
    }
    CHECK(js != NULL, "--fast-mem JSON parses");
    cJSON_Delete(js);
    CHECK(same_file(path("m.moeb"), path("m0.moeb")) && same_file(path("p.h5"), path("p0.h5")),
          "--no-tuning and --no-profile-update leave the files alone");
    /* prefetch from the fit part's path dictionary, a prompt batch, weights per size */
    rc = sh("%s fit-cache %s --profile %s --cache-experts 8,4 --prefetch 2 --path-order 1 --prompt-len 16 "
            "--fit-per-size --sizes 12 --no-tuning --no-profile-update --opt-iters 200 --json >%s 2>/dev/null",
            moe_prep, path("m.moeb"), path("p.h5"), path("pf.json"));
    CHECK(rc == 0, "--prefetch exits 0 (%d)", rc);
    js = load_json(path("pf.json"));
    const cJSON *z0 = cJSON_GetArrayItem(get(js, "sizes"), 0);
    const cJSON *h = policy_entry(get(z0, "results"), "hobbit"), *bl = policy_entry(get(z0, "results"), "belady");
    CHECK(num(h, "prefetch_loads") > 0 && num(h, "prefetch_hits") > 0, "hobbit prefetches");
    CHECK(bl && num(bl, "prefetch_loads") == 0, "Belady does not");
    const cJSON *tw = policy_entry(get(z0, "results"), "twiddler");
    CHECK(num(bl, "gap_to_bound_pct") >= -1e-9 && num(tw, "gap_to_bound_pct") >= -1e-9 &&
              num(get(z0, "offline_optimum"), "iterations") <= 200,
          "the policies that do not prefetch are above the bound (%g, %g %%)", num(bl, "gap_to_bound_pct"),
          num(tw, "gap_to_bound_pct"));
    CHECK(num(js, "prompt_len") == 16 && num(js, "prefetch") == 2 && num(js, "path_order") == 1 &&
              cJSON_GetArraySize(get(js, "sizes")) == 2 && get(cJSON_GetArrayItem(get(js, "sizes"), 1), "weights"),
          "settings and weights per size");
    cJSON_Delete(js);
    /* the paper's HOBBIT: no popularity term, no admission control */
    rc = sh("%s fit-cache %s --profile %s --cache-experts 8,4 --paper-hobbit --sizes 12 --no-tuning "
            "--no-profile-update --opt-iters 200 --json >%s 2>/dev/null",
            moe_prep, path("m.moeb"), path("p.h5"), path("pp.json"));
    js = load_json(path("pp.json"));
    int n_pop0 = 0, n_noadmit = 0;
    const cJSON *z;
    cJSON_ArrayForEach(z, get(js, "sizes")) {
        n_pop0 += num(get(z, "weights"), "pop") == 0;
        n_noadmit += cJSON_IsFalse(get(z, "admission"));
    }
    n_pop0 += num(get(get(js, "fit"), "weights"), "pop") == 0;
    n_noadmit += cJSON_IsFalse(get(get(js, "fit"), "admission"));
    CHECK(rc == 0 && js && n_pop0 == 3 && n_noadmit == 3, "--paper-hobbit: w_pop 0 and admission off at every size");
    cJSON_Delete(js);
}

/* test_errors: exit statuses and messages. */
static void test_errors(void) {
    const char *m = path("m.moeb"), *p = path("p.h5"), *e = path("e.txt");
    struct {
        int want;
        const char *args, *msg;
    } cases[] = {
        {2, "", "no MODEL"},
        {2, "%s", "no --profile"},
        {2, "%s --profile %s", "--fast-mem"},
        {2, "%s --profile %s --fast-mem 2XB", "--fast-mem"},
        {2, "%s --profile %s --fast-mem 1MiB --cache-experts 2,2", "exclude"},
        {2, "%s --profile %s --cache-experts 999,0", "--cache-experts"},
        {2, "%s --profile %s --cache-experts 8", "--cache-experts"},
        {2, "%s --profile %s --cache-experts 8,4 --heldout 2", "--heldout"},
        {2, "%s --profile %s --cache-experts 8,4 --t1 0.9 --t2 0.5", "--t1"},
        {2, "%s --profile %s --cache-experts 8,4 --high nosuch", "--high"},
        {2, "%s --profile %s --cache-experts 8,4 --sizes 4,x", "--sizes"},
        {2, "%s --profile %s --cache-experts 8,4 --sizes 40", "--sizes"},
        {2, "%s --profile %s --fast-mem 1KiB", "--fast-mem"},
        {2, "%s --profile %s --cache-experts 8,4 --prefetch 9", "--prefetch"},
        {2, "%s --profile %s --cache-experts 8,4 --bogus", "--bogus"},
        {1, "%s --profile %s.missing --cache-experts 8,4", "cannot read"},
        {1, "%s.missing --profile %s --cache-experts 8,4", "cannot open"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, m, p);
        int rc = sh("%s fit-cache %s --no-tuning --no-profile-update >/dev/null 2>%s", moe_prep, args, e);
        char *msg = slurp(e, NULL);
        CHECK(rc == cases[i].want && msg && strstr(msg, cases[i].msg), "\"%s\": exit %d (want %d), message: %s",
              cases[i].args, rc, cases[i].want, msg ? msg : "");
        free(msg);
    }
    /* a profile of another model: 3 MoE layers x 4 experts */
    struct moe_profile *q = NULL;
    const int16_t ex[3 * 2] = {0, 1, 2, 3, 1, 0};
    const float wt[3 * 2] = {0.6f, 0.4f, 0.7f, 0.3f, 0.5f, 0.5f};
    const int64_t ss[2] = {0, 1};
    struct moe_trace t = {3, 4, 2, 1, ss, ex, wt};
    CHECK(moe_profile_new(3, 4, 2, 10, MOE_PROFILE_LOGITS_NONE, &q) == MOE_OK && moe_profile_add_trace(q, &t, NULL) == MOE_OK &&
              moe_profile_write(q, path("other.h5")) == MOE_OK,
          "write a profile of another model");
    moe_profile_free(q);
    int rc = sh("%s fit-cache %s --profile %s --cache-experts 2,1 >/dev/null 2>%s", moe_prep, m, path("other.h5"), e);
    char *msg = slurp(e, NULL);
    CHECK(rc == 1 && msg && strstr(msg, "3 MoE layers x 4 experts") && strstr(msg, "profile this bundle"),
          "another model's profile: exit %d, %s", rc, msg ? msg : "");
    free(msg);
    rc = sh("%s fit-cache --help >%s 2>/dev/null", moe_prep, e);
    msg = slurp(e, NULL);
    CHECK(rc == 0 && msg && strstr(msg, "example") && strstr(msg, "--fast-mem"), "--help");
    free(msg);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-fit-cache MOE-PREP\n");
        return 2;
    }
    moe_prep = argv[1];
    if (access(MODEL "/model.safetensors", R_OK) != 0) {
        fprintf(stderr, "test-fit-cache: %s not found: skipped\n", MODEL);
        return 77;
    }
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    if (prepare()) {
        test_main_run();
        test_fast_mem();
        test_errors();
    }
    sh("rm -rf %s", dir);
    printf("%d checks, %d failed\n", checks, fails);
    return fails != 0;
}
