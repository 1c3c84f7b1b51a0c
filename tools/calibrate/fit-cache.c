/*
 * fit-cache.c - `moe-prep fit-cache`: replay the routing traces of a profile
 * through every expert-cache policy (cache-sim.h), fit HOBBIT's priority
 * (the paper's four weights, a static popularity weight and admission
 * control) on the fit part of the sequences, and report every
 * policy on the held-out part at several cache sizes with its gap to
 * Belady. Writes the weights and the fitted cache sizes into the bundle's
 * tuning section and the penalty-against-size curves into the profile
 * (cache.* derived arrays) for `moe-prep profile report`. docs/cache-sim.md
 * describes the model, the policies and every output.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cache-sim.h"
#include "moe-bundle.h"
#include "moe-file.h"
#include "moe-prep.h"
#include "moe-tuning.h"
#include "profile-h5.h"
#include "routing-stats.h"
#include "tool-util.h"

#define CMD "fit-cache"
#define MAX_SIZES 64
#define P MOE_CACHE_N_POLICIES

struct fc_args {
    const char *bundle, *profile, *csv, *high, *low;
    double fast_mem;          /* bytes; < 0 = not given */
    long long cache_h, cache_l; /* --cache-experts; < 0 = not given */
    double low_share, heldout, t1, t2, low_cost; /* t1/t2/low_cost < 0: not given */
    long long sizes[MAX_SIZES];
    int n_sizes, prompt_len, prefetch, path_order;
    int json, no_tuning, no_profile_update, fit_per_size, paper;
};

static void fc_usage(FILE *f) {
    fprintf(f,
            "usage: moe-prep fit-cache MODEL.moeb --profile PROFILE.h5 (--fast-mem SIZE | --cache-experts H,L)\n"
            "                          [options]\n"
            "\n"
            "Replays the routing traces that `moe-prep profile` recorded through the\n"
            "expert-cache policies (LRU, LFU per sequence and global, LHU, forward layer\n"
            "distance, EdgeMoE, Twiddler's static placement, HOBBIT, Belady's MIN) with a\n"
            "high- and a low-precision cache and HOBBIT's precision rule (T1/T2), fits\n"
            "HOBBIT's priority (the paper's four weights, a popularity weight and admission\n"
            "control) on the fit part of the sequences and prints,\n"
            "for the held-out part at each cache size: hit ratio, miss penalty per token\n"
            "(a high-precision miss costs 1, a low one B_low/B_high), bytes moved per\n"
            "token and the gap to Belady. Writes the weights and the cache sizes into\n"
            "the bundle's tuning section (hobbit.cache.*) and the curves into the profile\n"
            "(cache.* arrays, shown by `moe-prep profile report`). See docs/cache-sim.md.\n"
            "\n"
            "options:\n"
            "  --profile FILE        the profile of MODEL (from moe-prep profile)\n"
            "  --fast-mem SIZE       fast memory for expert caches: bytes or KiB/MiB/GiB/TiB\n"
            "                        (e.g. 2GiB), split by --low-share using the bundle's\n"
            "                        real expert sizes at the two precisions\n"
            "  --cache-experts H,L   or the capacities directly: H high-, L low-precision experts\n"
            "  --low-share X         share of the --fast-mem bytes for the low cache (default 0.25)\n"
            "  --sizes A,B,...       high-cache capacities (experts) of the table; the low\n"
            "                        cache scales by the same ratio (default: the given size\n"
            "                        and 25, 50, 75 %% of all experts)\n"
            "  --heldout X           share of the sequences held out for the report, every\n"
            "                        k-th one (default 0.3; 0 = report on the fit part)\n"
            "  --high NAME           high precision (default: the stored one with most bytes)\n"
            "  --low NAME            low precision (default: the one with fewest bytes)\n"
            "  --low-cost X          penalty of a low miss (default: low / high blob bytes)\n"
            "  --t1 X, --t2 X        HOBBIT thresholds (default: the profile's, else the bundle's)\n"
            "  --prompt-len N        the first N tokens of each sequence run as one batch\n"
            "                        (default 0: every token decoded one at a time)\n"
            "  --prefetch M          prefetch the M most probable experts of each layer from\n"
            "                        EdgeMoE's path dictionary of the fit part (default 0)\n"
            "  --path-order 1|2      key the dictionary on layer l-1 or l-2 and l-1 (default 2)\n"
            "  --fit-once            fit HOBBIT's weights at the primary size only and use them\n"
            "                        at every size of the table (default: fit again at each\n"
            "                        size, since the best weights move with the cache size;\n"
            "                        the tuning always gets the primary size's weights)\n"
            "  --fit-per-size        the default, accepted for scripts\n"
            "  --paper-hobbit        fit the paper's HOBBIT only: four weights (w_pop = 0, no\n"
            "                        popularity term) and no admission control\n"
            "  --json                everything as JSON on stdout\n"
            "  --csv FILE            also write the table as CSV\n"
            "  --no-tuning           do not write the bundle's tuning section\n"
            "  --no-profile-update   do not add the cache.* arrays to the profile\n"
            "  -h, --help            this text\n"
            "\n"
            "examples:\n"
            "  moe-prep fit-cache mixtral.moeb --profile p.h5 --fast-mem 24GiB\n"
            "  moe-prep fit-cache tiny.moeb --profile p.h5 --cache-experts 8,4 --sizes 4,8,16,24 --json\n");
}


/* parse_list: comma-separated integers in [lo, hi]; n in [n_min, n_max]. */
static int parse_list(const char *opt, const char *v, long long lo, long long hi, int n_min, int n_max,
                      long long *out, int *n) {
    const char *q = v;
    *n = 0;
    for (;;) {
        char *end;
        errno = 0;
        long long x = strtoll(q, &end, 10);
        if (end == q || errno || x < lo || x > hi || *n >= n_max || (*end && *end != ',')) goto bad;
        out[(*n)++] = x;
        if (!*end) break;
        q = end + 1;
    }
    if (*n >= n_min) return 1;
bad:
    fprintf(stderr, "moe-prep " CMD ": %s wants %d to %d comma-separated integers in [%lld, %lld], not \"%s\"\n",
            opt, n_min, n_max, lo, hi, v);
    return 0;
}

/* fc_parse: 0 ok, 1 help printed, 2 usage error (reported). */
static int fc_parse(int argc, char **argv, struct fc_args *a) {
    memset(a, 0, sizeof *a);
    a->fit_per_size = 1;
    a->fast_mem = -1, a->cache_h = a->cache_l = -1;
    a->low_share = 0.25, a->heldout = 0.3, a->t1 = a->t2 = a->low_cost = -1;
    a->path_order = 2;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v;
        long long n, pair[2];
        int np;
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "moe-prep " CMD ": %s needs a value\n", o), (char *)NULL))
#define NUM(lo, hi, dst) (!(v = NEXT()) || !moe_tool_parse_double(CMD, o, v, lo, hi, dst))
#define INT(lo, hi) (!(v = NEXT()) || !moe_tool_parse_ll(CMD, o, v, lo, hi, &n))
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            fc_usage(stdout);
            return 1;
        } else if (!strcmp(o, "--profile")) {
            if (!(a->profile = NEXT())) return 2;
        } else if (!strcmp(o, "--csv")) {
            if (!(a->csv = NEXT())) return 2;
        } else if (!strcmp(o, "--high")) {
            if (!(a->high = NEXT())) return 2;
        } else if (!strcmp(o, "--low")) {
            if (!(a->low = NEXT())) return 2;
        } else if (!strcmp(o, "--fast-mem")) {
            long long bytes;
            if (!(v = NEXT()) || !moe_tool_parse_size(CMD, "--fast-mem", v, &bytes)) return 2;
            a->fast_mem = (double)bytes;
        } else if (!strcmp(o, "--cache-experts")) {
            if (!(v = NEXT()) || !parse_list(o, v, 0, 1 << 30, 2, 2, pair, &np)) return 2;
            a->cache_h = pair[0], a->cache_l = pair[1];
        } else if (!strcmp(o, "--sizes")) {
            if (!(v = NEXT()) || !parse_list(o, v, 1, 1 << 30, 1, MAX_SIZES - 4, a->sizes, &a->n_sizes)) return 2;
        } else if (!strcmp(o, "--low-share")) {
            if (NUM(0, 0.99, &a->low_share)) return 2;
        } else if (!strcmp(o, "--heldout")) {
            if (NUM(0, 0.9, &a->heldout)) return 2;
        } else if (!strcmp(o, "--low-cost")) {
            if (NUM(0, 10, &a->low_cost)) return 2;
        } else if (!strcmp(o, "--t1")) {
            if (NUM(0, 1, &a->t1)) return 2;
        } else if (!strcmp(o, "--t2")) {
            if (NUM(0, 1, &a->t2)) return 2;
        } else if (!strcmp(o, "--prompt-len")) {
            if (INT(0, 1 << 24)) return 2;
            a->prompt_len = (int)n;
        } else if (!strcmp(o, "--prefetch")) {
            if (INT(0, 4096)) return 2;
            a->prefetch = (int)n;
        } else if (!strcmp(o, "--path-order")) {
            if (INT(1, 2)) return 2;
            a->path_order = (int)n;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--no-tuning")) {
            a->no_tuning = 1;
        } else if (!strcmp(o, "--no-profile-update")) {
            a->no_profile_update = 1;
        } else if (!strcmp(o, "--fit-per-size")) {
            a->fit_per_size = 1;
        } else if (!strcmp(o, "--paper-hobbit")) {
            a->paper = 1;
        } else if (!strcmp(o, "--fit-once")) {
            a->fit_per_size = 0;
        } else if (o[0] == '-' && o[1]) {
            fprintf(stderr, "moe-prep " CMD ": unknown option \"%s\" (see moe-prep " CMD " --help)\n", o);
            return 2;
        } else if (!a->bundle) {
            a->bundle = o;
        } else {
            fprintf(stderr, "moe-prep " CMD ": one MODEL.moeb only (\"%s\" and \"%s\")\n", a->bundle, o);
            return 2;
        }
#undef NEXT
#undef NUM
#undef INT
    }
    const char *why = !a->bundle                                ? "no MODEL.moeb given"
                      : !a->profile                             ? "no --profile PROFILE.h5 given"
                      : a->fast_mem < 0 && a->cache_h < 0       ? "give --fast-mem SIZE or --cache-experts H,L"
                      : a->fast_mem >= 0 && a->cache_h >= 0     ? "--fast-mem and --cache-experts exclude each other"
                      : a->t1 >= 0 && a->t2 >= 0 && a->t1 > a->t2 ? "--t1 must not exceed --t2"
                                                                : NULL;
    if (why) {
        fprintf(stderr, "moe-prep " CMD ": %s (see moe-prep " CMD " --help)\n", why);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ the model */

/* What the run works with, gathered from the bundle and the profile. */
struct fc_model {
    int L, E, K, LE;
    uint32_t hi_prec, lo_prec;
    char hi_name[MOE_BUNDLE_MAX_PRECISION_NAME + 1], lo_name[MOE_BUNDLE_MAX_PRECISION_NAME + 1];
    double hi_bytes, lo_bytes;     /* raw blob bytes of one expert */
    double hi_stored, lo_stored;   /* stored (on-disk) bytes, mean over the experts */
    double low_cost;
    double t1, t2;
    const char *t_source;
};

/* check_shape: the bundle has the profile's MoE layers and experts; on a
 * mismatch says what to do. */
static int check_shape(const struct moe_bundle *b, const struct moe_profile *p, const struct fc_args *a) {
    uint32_t nl = 0, ne = 0, np = 0;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    int moe_layers = 0, ok = (int)ne == p->n_experts && np > 0;
    for (uint32_t l = 0; l < nl; l++) moe_layers += moe_bundle_layer_has_experts(b, l);
    ok &= moe_layers == p->n_layers;
    for (int l = 0; ok && l < p->n_layers; l++)
        ok &= p->moe_layer_index[l] >= 0 && moe_bundle_layer_has_experts(b, (uint32_t)p->moe_layer_index[l]);
    if (!ok)
        fprintf(stderr,
                "moe-prep " CMD ": %s was recorded on a model with %d MoE layers x %d experts, but %s has %d MoE "
                "layers x %u experts (or other layer numbers): profile this bundle first (moe-prep profile %s "
                "--dataset TEXT -o PROFILE.h5) or give the bundle the profile was recorded with\n",
                a->profile, p->n_layers, p->n_experts, a->bundle, moe_layers, ne, a->bundle);
    return ok;
}

/* pick_precisions: high = most raw bytes per expert, low = fewest, unless named. */
static int pick_precisions(const struct moe_bundle *b, const struct moe_profile *p, const struct fc_args *a,
                           struct fc_model *m) {
    uint32_t nl, ne, np;
    moe_bundle_expert_layout(b, &nl, &ne, &np);
    m->hi_prec = m->lo_prec = 0;
    for (uint32_t i = 1; i < np; i++) {
        if (moe_bundle_precision_at(b, i)->raw_size > moe_bundle_precision_at(b, m->hi_prec)->raw_size) m->hi_prec = i;
        if (moe_bundle_precision_at(b, i)->raw_size < moe_bundle_precision_at(b, m->lo_prec)->raw_size) m->lo_prec = i;
    }
    const char *names[2] = {a->high, a->low};
    uint32_t *idx[2] = {&m->hi_prec, &m->lo_prec};
    for (int k = 0; k < 2; k++)
        if (names[k] && moe_bundle_find_precision(b, names[k], idx[k]) != MOE_OK) {
            fprintf(stderr, "moe-prep " CMD ": --%s: %s has no precision \"%s\"; it stores:", k ? "low" : "high",
                    a->bundle, names[k]);
            for (uint32_t i = 0; i < np; i++) fprintf(stderr, " %s", moe_bundle_precision_at(b, i)->name);
            fputc('\n', stderr);
            return 2;
        }
    snprintf(m->hi_name, sizeof m->hi_name, "%s", moe_bundle_precision_at(b, m->hi_prec)->name);
    snprintf(m->lo_name, sizeof m->lo_name, "%s", moe_bundle_precision_at(b, m->lo_prec)->name);
    m->hi_stored = m->lo_stored = 0;
    for (int l = 0; l < p->n_layers; l++) /* the real blob sizes (raw in memory, stored on disk) */
        for (int e = 0; e < p->n_experts; e++)
            for (int k = 0; k < 2; k++) {
                struct moe_bundle_blob blob;
                if (moe_bundle_expert(b, (uint32_t)p->moe_layer_index[l], (uint32_t)e, *idx[k], &blob) != MOE_OK) {
                    fprintf(stderr, "moe-prep " CMD ": %s: cannot locate expert %d of layer %d (see above)\n",
                            a->bundle, e, p->moe_layer_index[l]);
                    return 1;
                }
                if (k) m->lo_bytes = (double)blob.raw_size, m->lo_stored += (double)blob.stored_size;
                else m->hi_bytes = (double)blob.raw_size, m->hi_stored += (double)blob.stored_size;
            }
    m->hi_stored /= (double)m->LE, m->lo_stored /= (double)m->LE;
    m->low_cost = a->low_cost >= 0 ? a->low_cost : m->lo_bytes / m->hi_bytes;
    if (np < 2 || m->hi_prec == m->lo_prec)
        fprintf(stderr, "moe-prep " CMD ": note: one precision (%s) for both caches; a low miss costs %.3g\n",
                m->hi_name, m->low_cost);
    return 0;
}

/* pick_thresholds: --t1/--t2, else the profile's hobbit_thresholds, else the
 * bundle's hobbit.t1/t2, else 1 (every load high precision). */
static void pick_thresholds(const struct moe_bundle *b, const struct moe_profile *p, const struct fc_args *a,
                            struct fc_model *m) {
    const double *thr = NULL;
    int nd = 0;
    int64_t dims[MOE_PROFILE_MAX_DIMS];
    struct moe_tuning bt;
    if (moe_profile_get_f64(p, "hobbit_thresholds", &nd, dims, &thr) == MOE_OK && nd == 1 && dims[0] >= 2 &&
        thr[0] >= 0 && thr[0] <= thr[1] && thr[1] <= 1)
        m->t1 = thr[0], m->t2 = thr[1], m->t_source = "profile";
    else if (moe_tuning_read(moe_bundle_tuning(b), p->n_layers, p->n_experts, &bt) == MOE_OK && bt.has_thresholds)
        m->t1 = bt.t1, m->t2 = bt.t2, m->t_source = "bundle";
    else {
        m->t1 = m->t2 = 1, m->t_source = "default";
        if (a->t1 < 0 || a->t2 < 0)
            fprintf(stderr, "moe-prep " CMD ": note: no HOBBIT thresholds in the profile or the bundle; "
                            "T1 = T2 = 1 (every load high precision) unless --t1/--t2 are given\n");
    }
    if (a->t1 >= 0) m->t1 = a->t1, m->t_source = "option";
    if (a->t2 >= 0) m->t2 = a->t2, m->t_source = "option";
}

/* ------------------------------------------------------------ the run */

/* One cache size of the table and its results per policy. */
struct fc_size {
    int hi, lo, primary;
    double w[MOE_CACHE_N_WEIGHTS]; /* HOBBIT weights used at this size */
    int admit;                     /* and its admission control */
    struct moe_cache_stats st[P];
};

/* What the run computed. */
struct fc_result {
    int n_seq, n_fit, n_held, in_sample;
    int64_t fit_tokens, held_tokens;
    double w[MOE_CACHE_N_WEIGHTS];
    int admit;
    double *freq_high, *freq_low; /* [L*E] need shares of the fit part (HOBBIT's w_pop) */
    struct moe_cache_stats fit_best, fit_single[P];
    int evals;
    double fit_seconds;
    int n_sizes;
    struct fc_size sizes[MAX_SIZES];
    int n_tuning_keys, profile_updated;
};

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Progress of the fit on stderr, at most every 2 seconds. */
struct progress {
    double t0, last;
};

static void on_progress(int done, int total, void *user) {
    struct progress *pr = user;
    double t = seconds();
    if (t - pr->last < 2.0) return;
    pr->last = t;
    if (done <= total)
        fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights: grid point %d of %d (%.0f s)\n", done, total,
                t - pr->t0);
    else
        fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights: refining, %d replays (%.0f s)\n", done, t - pr->t0);
}

/* add_size: append (hi, lo) unless that high capacity is already listed. */
static void add_size(struct fc_result *r, int hi, int lo, int primary) {
    for (int i = 0; i < r->n_sizes; i++)
        if (r->sizes[i].hi == hi) {
            if (primary) r->sizes[i].lo = lo, r->sizes[i].primary = 1;
            return;
        }
    if (r->n_sizes >= MAX_SIZES) return;
    struct fc_size *s = &r->sizes[r->n_sizes++];
    memset(s, 0, sizeof *s);
    s->hi = hi, s->lo = lo, s->primary = primary;
}

static int by_high(const void *a, const void *b) {
    const struct fc_size *x = a, *y = b;
    return (x->hi > y->hi) - (x->hi < y->hi);
}

/* plan_sizes: the primary capacities (from --fast-mem or --cache-experts) and
 * the sweep. Returns 0, or 2 after a usage message. */
static int plan_sizes(const struct fc_args *a, const struct fc_model *m, struct fc_result *r, int *H, int *Lc) {
    if (a->fast_mem >= 0) {
        double h = floor((1 - a->low_share) * a->fast_mem / m->hi_bytes);
        double l = floor(a->low_share * a->fast_mem / m->lo_bytes);
        *H = (int)fmin(h, m->LE), *Lc = (int)fmin(l, m->LE);
        if (*H < 1) {
            fprintf(stderr,
                    "moe-prep " CMD ": --fast-mem %.0f bytes hold no high-precision expert (%.0f bytes each at %s, "
                    "%.0f %% of the budget with --low-share %g)\n",
                    a->fast_mem, m->hi_bytes, m->hi_name, 100 * (1 - a->low_share), a->low_share);
            return 2;
        }
    } else {
        if (a->cache_h < 1 || a->cache_h > m->LE || a->cache_l > m->LE) {
            fprintf(stderr, "moe-prep " CMD ": --cache-experts %lld,%lld: the model has %d experts in all; want "
                            "1..%d high and 0..%d low\n", a->cache_h, a->cache_l, m->LE, m->LE, m->LE);
            return 2;
        }
        *H = (int)a->cache_h, *Lc = (int)a->cache_l;
    }
    const double ratio = (double)*Lc / *H;
    add_size(r, *H, *Lc, 1);
    if (a->n_sizes) {
        for (int i = 0; i < a->n_sizes; i++) {
            if (a->sizes[i] > m->LE) {
                fprintf(stderr, "moe-prep " CMD ": --sizes: %lld experts exceed the model's %d\n", a->sizes[i], m->LE);
                return 2;
            }
            add_size(r, (int)a->sizes[i], (int)fmin(m->LE, lround((double)a->sizes[i] * ratio)), 0);
        }
    } else {
        for (int q = 1; q <= 3; q++) {
            int h = (int)lround(m->LE * 0.25 * q);
            h = h < 1 ? 1 : h;
            add_size(r, h, (int)fmin(m->LE, lround(h * ratio)), 0);
        }
    }
    qsort(r->sizes, (size_t)r->n_sizes, sizeof r->sizes[0], by_high);
    return 0;
}

/* run: split, fit and evaluate. Returns 0 or 1 (failure reported). */
static int run(const struct fc_args *a, const struct moe_profile *p, const struct fc_model *m, int H, int Lc,
               struct fc_result *r) {
    struct moe_trace t;
    moe_profile_trace(p, &t);
    int rc = 1;
    const int n = p->n_seq;
    unsigned char *held = calloc((size_t)n + 1, 1);
    int32_t *fit = malloc(sizeof(int32_t) * ((size_t)n + 1)), *hs = malloc(sizeof(int32_t) * ((size_t)n + 1));
    double *freq = malloc(sizeof(double) * (size_t)m->LE), *fh = r->freq_high, *fl = r->freq_low;
    int32_t *order = malloc(sizeof(int32_t) * (size_t)m->LE);
    struct moe_path_dict *dict = NULL;
    struct moe_cache_trace *tf = NULL, *th = NULL;
    if (!held || !fit || !hs || !freq || !order || !fh) {
        fprintf(stderr, "moe-prep " CMD ": out of memory\n");
        goto done;
    }
    r->n_seq = n;
    moe_cache_split(n, a->heldout, held);
    for (int i = 0; i < n; i++) {
        if (held[i]) hs[r->n_held++] = i;
        else fit[r->n_fit++] = i;
    }
    if (r->n_held == 0) { /* nothing held out: report on the fit part */
        r->in_sample = 1;
        memcpy(hs, fit, sizeof(int32_t) * (size_t)r->n_fit);
        r->n_held = r->n_fit;
        if (a->heldout > 0)
            fprintf(stderr, "moe-prep " CMD ": note: %d sequence(s): nothing to hold out; the table is on the fit "
                            "part\n", n);
    }
    if (moe_cache_popularity(&t, fit, r->n_fit, freq, order) != MOE_OK) goto fail_msg;
    struct moe_cache_trace_params pp = moe_cache_trace_default_params();
    pp.t1 = m->t1, pp.t2 = m->t2, pp.prompt_len = a->prompt_len;
    if (a->prefetch > 0) {
        if (a->prefetch > m->E) {
            fprintf(stderr, "moe-prep " CMD ": --prefetch %d exceeds the %d experts of a layer\n", a->prefetch, m->E);
            rc = 2;
            goto done;
        }
        if (moe_cache_path_dict(&t, fit, r->n_fit, a->path_order, &dict) != MOE_OK) goto fail_msg;
        pp.paths = dict, pp.prefetch = a->prefetch;
    }
    if (moe_cache_trace_new(&t, fit, r->n_fit, &pp, &tf) != MOE_OK ||
        moe_cache_trace_new(&t, hs, r->n_held, &pp, &th) != MOE_OK)
        goto fail_msg;
    struct moe_cache_trace_info fi, hi;
    moe_cache_trace_info(tf, &fi);
    moe_cache_trace_info(th, &hi);
    r->fit_tokens = fi.tokens, r->held_tokens = hi.tokens;
    if (fi.accesses == 0 || hi.accesses == 0) {
        fprintf(stderr, "moe-prep " CMD ": %s holds no tokens to replay\n", a->profile);
        goto done;
    }
    struct moe_cache_config c = moe_cache_default_config();
    c.high_cap = H, c.low_cap = Lc, c.low_cost = m->low_cost, c.high_bytes = m->hi_bytes, c.low_bytes = m->lo_bytes;
    c.freq = freq, c.order = order, c.prefetch = a->prefetch > 0;
    moe_cache_trace_need_freq(tf, fh, fl); /* HOBBIT's popularity term, from the fit part */
    if (!a->paper) c.freq_high = fh, c.freq_low = fl;
    fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights on %d sequences (%lld accesses) with %d high + %d "
                    "low experts\n", r->n_fit, (long long)fi.accesses, H, Lc);
    struct progress pr = {seconds(), seconds()};
    struct moe_cache_fit_params fp = moe_cache_fit_default_params();
    fp.progress = on_progress, fp.user = &pr;
    if (a->paper) fp.n_weights = 4, fp.grid = 10, fp.admit = 0; /* as in the paper: 286 grid points */
    if (moe_cache_fit_hobbit(tf, &c, &fp, r->w, &r->admit, &r->fit_best, &r->evals) != MOE_OK) goto fail_msg;
    r->fit_seconds = seconds() - pr.t0;
    for (int q = 0; q < P; q++)
        if (q != MOE_CACHE_HOBBIT && moe_cache_simulate(tf, (enum moe_cache_policy)q, &c, &r->fit_single[q]))
            goto fail_msg;
    r->fit_single[MOE_CACHE_HOBBIT] = r->fit_best;
    for (int s = 0; s < r->n_sizes; s++) {
        struct fc_size *z = &r->sizes[s];
        c.high_cap = z->hi, c.low_cap = z->lo;
        memcpy(z->w, r->w, sizeof z->w);
        z->admit = r->admit;
        if (a->fit_per_size && !z->primary) {
            fprintf(stderr, "moe-prep " CMD ": fitting HOBBIT's weights for %d high + %d low experts\n", z->hi, z->lo);
            pr.last = seconds();
            if (moe_cache_fit_hobbit(tf, &c, &fp, z->w, &z->admit, NULL, NULL) != MOE_OK) goto fail_msg;
        }
        memcpy(c.w, z->w, sizeof c.w);
        c.admit = z->admit;
        for (int q = 0; q < P; q++)
            if (moe_cache_simulate(th, (enum moe_cache_policy)q, &c, &z->st[q])) goto fail_msg;
    }
    rc = 0;
    goto done;
fail_msg:
    fprintf(stderr, "moe-prep " CMD ": the replay failed (see the message above)\n");
done:
    moe_cache_trace_free(tf);
    moe_cache_trace_free(th);
    moe_path_dict_free(dict);
    free(held);
    free(fit);
    free(hs);
    free(freq);
    free(order);
    return rc;
}

/* ------------------------------------------------------------ outputs */

static const char *const k_wnames[MOE_CACHE_N_WEIGHTS] = {"lru", "lfu", "lhu", "fld", "pop"};

/* per_tok: x / tokens. */
static double per_tok(double x, const struct moe_cache_stats *s) { return s->tokens > 0 ? x / (double)s->tokens : NAN; }

/* gap: penalty above Belady's, in percent; NaN when Belady's is 0. */
static double gap(const struct fc_size *z, int q) {
    double b = z->st[MOE_CACHE_BELADY].penalty;
    return b > 0 ? 100.0 * (z->st[q].penalty - b) / b : NAN;
}

/* best_single: the online policy (not HOBBIT, not Belady) with the lowest penalty. */
static int best_single(const struct moe_cache_stats *st) {
    int b = -1;
    for (int q = 0; q < P; q++)
        if (q != MOE_CACHE_HOBBIT && q != MOE_CACHE_BELADY && (b < 0 || st[q].penalty < st[b].penalty)) b = q;
    return b;
}

/* human: bytes with a binary unit. */
static void human(char *buf, size_t n, double x) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (fabs(x) >= 1024 && i < 4) x /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", x, u[i]);
}

static void print_table(const struct fc_args *a, const struct moe_profile *p, const struct fc_model *m,
                        const struct fc_result *r) {
    char b1[32], b2[32];
    printf("fit-cache: %s with %s: %d MoE layers x %d experts, top-%d\n", a->bundle, a->profile, m->L, m->E, m->K);
    printf("sequences: %d fit (%lld tokens), %d %s (%lld tokens)\n", r->n_fit, (long long)r->fit_tokens, r->n_held,
           r->in_sample ? "reported on, the same (nothing held out)" : "held out", (long long)r->held_tokens);
    human(b1, sizeof b1, m->hi_bytes), human(b2, sizeof b2, m->lo_bytes);
    printf("precisions: high %s (%s per expert), low %s (%s); a low miss costs %.4f of a high one\n", m->hi_name, b1,
           m->lo_name, b2, m->low_cost);
    printf("HOBBIT thresholds (%s): T1 %.4f, T2 %.4f; prompt batch %d tokens; prefetch %d", m->t_source, m->t1, m->t2,
           a->prompt_len, a->prefetch);
    if (a->prefetch) printf(" (order-%d paths)", a->path_order);
    printf("\n");
    const int bs = best_single(r->fit_single);
    printf("fitted weights (fit part, %d replays, %.1f s): w_lru %.4f  w_lfu %.4f  w_lhu %.4f  w_fld %.4f  "
           "w_pop %.4f  admission %s\n", r->evals, r->fit_seconds, r->w[0], r->w[1], r->w[2], r->w[3], r->w[4],
           r->admit ? "on" : "off");
    printf("  fit-part penalty per token: hobbit %.4f, best other online policy %s %.4f\n",
           per_tok(r->fit_best.penalty, &r->fit_best), moe_cache_policy_name((enum moe_cache_policy)bs),
           per_tok(r->fit_single[bs].penalty, &r->fit_single[bs]));
    for (int s = 0; s < r->n_sizes; s++) {
        const struct fc_size *z = &r->sizes[s];
        human(b1, sizeof b1, z->hi * m->hi_bytes + z->lo * m->lo_bytes);
        printf("\ncache: %d high + %d low experts (%s, %.0f %% of %d experts at high precision)%s\n", z->hi, z->lo,
               b1, 100.0 * z->hi / m->LE, m->LE, z->primary ? "  [fitted size]" : "");
        if (a->fit_per_size && !z->primary)
            printf("  hobbit weights fitted at this size: w_lru %.4f  w_lfu %.4f  w_lhu %.4f  w_fld %.4f  "
                   "w_pop %.4f  admission %s\n", z->w[0], z->w[1], z->w[2], z->w[3], z->w[4], z->admit ? "on" : "off");
        printf("  %-11s %10s %14s %14s %14s\n", "policy", "hit ratio", "penalty/token", "bytes/token", "gap to Belady");
        for (int q = 0; q < P; q++) {
            const struct moe_cache_stats *st = &z->st[q];
            double g = gap(z, q);
            char gs[24];
            if (isfinite(g)) snprintf(gs, sizeof gs, "%+.1f %%", g);
            else snprintf(gs, sizeof gs, "-");
            human(b2, sizeof b2, per_tok(st->bytes, st));
            printf("  %-11s %8.2f %% %14.4f %14s %14s\n", moe_cache_policy_name((enum moe_cache_policy)q),
                   100 * moe_cache_hit_ratio(st), per_tok(st->penalty, st), b2, gs);
        }
        int b = best_single(z->st);
        double hp = z->st[MOE_CACHE_HOBBIT].penalty, sp = z->st[b].penalty;
        printf("  hobbit against the best other online policy (%s): %+.1f %% penalty\n",
               moe_cache_policy_name((enum moe_cache_policy)b), sp > 0 ? 100 * (hp - sp) / sp : 0.0);
    }
    (void)p;
}

/* jnum: a JSON number, null when not finite. */
static void jnum(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.10g", x);
    else fputs("null", f);
}

static void jstats(FILE *f, const struct moe_cache_stats *st) {
    fprintf(f, "\"hit_ratio\": ");
    jnum(f, moe_cache_hit_ratio(st));
    fprintf(f, ", \"penalty_per_token\": ");
    jnum(f, per_tok(st->penalty, st));
    fprintf(f, ", \"bytes_per_token\": ");
    jnum(f, per_tok(st->bytes, st));
    fprintf(f, ", \"penalty\": ");
    jnum(f, st->penalty);
    fprintf(f, ", \"tokens\": %lld, \"accesses\": %lld, \"hits_high\": %lld, \"hits_low\": %lld, \"misses_high\": %lld, "
               "\"misses_low\": %lld, \"skips\": %lld, \"prefetch_loads\": %lld, \"prefetch_hits\": %lld",
            (long long)st->tokens, (long long)st->accesses, (long long)st->hits_high, (long long)st->hits_low,
            (long long)st->misses_high, (long long)st->misses_low, (long long)st->skips, (long long)st->prefetch_loads,
            (long long)st->prefetch_hits);
}

static void print_json(const struct fc_args *a, const struct fc_model *m, const struct fc_result *r, int H, int Lc) {
    FILE *f = stdout;
    fputs("{\"bundle\": ", f);
    moe_tool_json_string(f, a->bundle);
    fputs(", \"profile\": ", f);
    moe_tool_json_string(f, a->profile);
    fprintf(f, ", \"model\": {\"moe_layers\": %d, \"experts\": %d, \"k\": %d}", m->L, m->E, m->K);
    fprintf(f, ", \"sequences\": {\"total\": %d, \"fit\": %d, \"heldout\": %d, \"heldout_share\": ", r->n_seq,
            r->n_fit, r->in_sample ? 0 : r->n_held);
    jnum(f, a->heldout);
    fprintf(f, ", \"reported_on\": \"%s\"}", r->in_sample ? "fit" : "heldout");
    fprintf(f, ", \"tokens\": {\"fit\": %lld, \"reported\": %lld}", (long long)r->fit_tokens, (long long)r->held_tokens);
    fputs(", \"precision\": {\"high\": {\"name\": ", f);
    moe_tool_json_string(f, m->hi_name);
    fprintf(f, ", \"bytes\": %.0f, \"stored_bytes\": %.0f}, \"low\": {\"name\": ", m->hi_bytes, m->hi_stored);
    moe_tool_json_string(f, m->lo_name);
    fprintf(f, ", \"bytes\": %.0f, \"stored_bytes\": %.0f}, \"low_cost\": ", m->lo_bytes, m->lo_stored);
    jnum(f, m->low_cost);
    fputs("}, \"thresholds\": {\"t1\": ", f);
    jnum(f, m->t1);
    fputs(", \"t2\": ", f);
    jnum(f, m->t2);
    fprintf(f, ", \"source\": \"%s\"}, \"prompt_len\": %d, \"prefetch\": %d, \"path_order\": %d", m->t_source,
            a->prompt_len, a->prefetch, a->path_order);
    fputs(", \"fast_mem_bytes\": ", f);
    if (a->fast_mem >= 0) fprintf(f, "%.0f", a->fast_mem);
    else fputs("null", f);
    fputs(", \"low_share\": ", f);
    jnum(f, a->low_share);
    fprintf(f, ", \"fitted_size\": {\"high_experts\": %d, \"low_experts\": %d}", H, Lc);
    fputs(", \"policies\": [", f);
    for (int q = 0; q < P; q++) fprintf(f, "%s\"%s\"", q ? ", " : "", moe_cache_policy_name((enum moe_cache_policy)q));
    fputs("], \"fit\": {\"weights\": {", f);
    for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) {
        fprintf(f, "%s\"%s\": ", i ? ", " : "", k_wnames[i]);
        jnum(f, r->w[i]);
    }
    fprintf(f, "}, \"admission\": %s, \"replays\": %d, \"seconds\": ", r->admit ? "true" : "false", r->evals);
    jnum(f, r->fit_seconds);
    fputs(", \"results\": [", f);
    for (int q = 0; q < P; q++) {
        fprintf(f, "%s{\"policy\": \"%s\", ", q ? ", " : "", moe_cache_policy_name((enum moe_cache_policy)q));
        jstats(f, &r->fit_single[q]);
        fputc('}', f);
    }
    fputs("]}, \"sizes\": [", f);
    for (int s = 0; s < r->n_sizes; s++) {
        const struct fc_size *z = &r->sizes[s];
        fprintf(f, "%s{\"high_experts\": %d, \"low_experts\": %d, \"bytes\": %.0f, \"fitted\": %s, \"weights\": {",
                s ? ", " : "", z->hi, z->lo, z->hi * m->hi_bytes + z->lo * m->lo_bytes, z->primary ? "true" : "false");
        for (int i = 0; i < MOE_CACHE_N_WEIGHTS; i++) {
            fprintf(f, "%s\"%s\": ", i ? ", " : "", k_wnames[i]);
            jnum(f, z->w[i]);
        }
        fprintf(f, "}, \"admission\": %s, \"results\": [", z->admit ? "true" : "false");
        for (int q = 0; q < P; q++) {
            fprintf(f, "%s{\"policy\": \"%s\", ", q ? ", " : "", moe_cache_policy_name((enum moe_cache_policy)q));
            jstats(f, &z->st[q]);
            fputs(", \"gap_to_belady_pct\": ", f);
            jnum(f, gap(z, q));
            fputc('}', f);
        }
        fputs("]}", f);
    }
    fprintf(f, "], \"tuning_keys\": %d, \"profile_updated\": %s}\n", r->n_tuning_keys,
            r->profile_updated ? "true" : "false");
}

/* write_csv: the table as CSV, via a temporary file renamed over path. */
static int write_csv(const char *path, const struct fc_result *r) {
    struct moe_tmp_file t = {NULL, NULL, -1, NULL}; /* exclusive, beside path: never through a planted link */
    FILE *f = NULL;
    int ok = 0;
    if (moe_tmp_create(path, &t) || !(f = moe_tmp_stream(&t))) goto done;
    fputs("high_experts,low_experts,fitted,policy,hit_ratio,penalty_per_token,bytes_per_token,gap_to_belady_pct,"
          "accesses,hits_high,hits_low,misses_high,misses_low,skips,prefetch_loads,prefetch_hits\n", f);
    for (int s = 0; s < r->n_sizes; s++)
        for (int q = 0; q < P; q++) {
            const struct fc_size *z = &r->sizes[s];
            const struct moe_cache_stats *st = &z->st[q];
            double v[4] = {moe_cache_hit_ratio(st), per_tok(st->penalty, st), per_tok(st->bytes, st), gap(z, q)};
            fprintf(f, "%d,%d,%d,%s", z->hi, z->lo, z->primary, moe_cache_policy_name((enum moe_cache_policy)q));
            for (int i = 0; i < 4; i++) {
                if (isfinite(v[i])) fprintf(f, ",%.10g", v[i]);
                else fputs(",", f);
            }
            fprintf(f, ",%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld\n", (long long)st->accesses, (long long)st->hits_high,
                    (long long)st->hits_low, (long long)st->misses_high, (long long)st->misses_low,
                    (long long)st->skips, (long long)st->prefetch_loads, (long long)st->prefetch_hits);
        }
    ok = moe_tmp_commit(&t) == MOE_OK; /* flush, fsync, rename; removed on failure */
done:
    moe_tmp_discard(&t);
    if (!ok) fprintf(stderr, "moe-prep " CMD ": cannot write %s (see the message above)\n", path);
    return ok;
}

/* update_profile: the cache.* arrays (docs/cache-sim.md), then an atomic rewrite. */
static int update_profile(const struct fc_args *a, struct moe_profile *p, const struct fc_model *m,
                          const struct fc_result *r, int H, int Lc) {
    const int S = r->n_sizes;
    enum { W = MOE_CACHE_N_WEIGHTS + 1 }; /* the weights and the admission flag */
    int64_t hs[MAX_SIZES], ls[MAX_SIZES], d1[1] = {S}, d2[2] = {P, S}, dw[1] = {W}, dset[1] = {8};
    double pen[P * MAX_SIZES], hit[P * MAX_SIZES], byt[P * MAX_SIZES], sw[MAX_SIZES * W], fw[W];
    int64_t dsw[2] = {S, W};
    memcpy(fw, r->w, sizeof r->w);
    fw[W - 1] = r->admit;
    for (int s = 0; s < S; s++) {
        hs[s] = r->sizes[s].hi, ls[s] = r->sizes[s].lo;
        memcpy(sw + W * s, r->sizes[s].w, sizeof r->sizes[s].w);
        sw[W * s + W - 1] = r->sizes[s].admit;
        for (int q = 0; q < P; q++) {
            const struct moe_cache_stats *st = &r->sizes[s].st[q];
            pen[q * S + s] = per_tok(st->penalty, st);
            hit[q * S + s] = moe_cache_hit_ratio(st);
            byt[q * S + s] = per_tok(st->bytes, st);
        }
    }
    const double set[8] = {m->t1, m->t2, m->low_cost, r->in_sample ? 0 : a->heldout, a->prompt_len, a->prefetch, H, Lc};
    if (moe_profile_put_i64(p, "cache.sizes", 1, d1, hs) || moe_profile_put_i64(p, "cache.low_sizes", 1, d1, ls) ||
        moe_profile_put_f64(p, "cache.penalty", 2, d2, pen) || moe_profile_put_f64(p, "cache.hit_ratio", 2, d2, hit) ||
        moe_profile_put_f64(p, "cache.bytes", 2, d2, byt) || moe_profile_put_f64(p, "cache.weights", 1, dw, fw) ||
        moe_profile_put_f64(p, "cache.size_weights", 2, dsw, sw) || moe_profile_put_f64(p, "cache.settings", 1, dset, set) ||
        moe_profile_write(p, a->profile)) {
        fprintf(stderr, "moe-prep " CMD ": cannot update %s (see the message above); it is unchanged\n", a->profile);
        return 0;
    }
    return 1;
}

/* write_tuning: the fitted keys into the bundle's tuning, keeping the others. */
static int write_tuning(const struct fc_args *a, const struct fc_model *m, const double *w, int admit,
                        const double *fh, const double *fl, int H, int Lc, int *n_keys) {
    struct moe_bundle *b = NULL;
    struct moe_bundle_kv *kv = NULL;
    enum moe_status st;
    if ((st = moe_bundle_open(a->bundle, &b)) || (st = moe_bundle_kv_new(&kv))) goto done;
    st = moe_bundle_kv_copy(kv, moe_bundle_tuning(b));
    if (st) goto done;
    moe_bundle_free(b); /* replace_tuning opens the file itself */
    b = NULL;
    if ((st = moe_tuning_set_cache(kv, w, admit, H, Lc, m->hi_name, m->lo_name)) ||
        (st = moe_tuning_set_cache_popularity(kv, fh, fl, (size_t)m->LE, m->low_cost)) ||
        (st = moe_bundle_replace_tuning(a->bundle, kv)))
        goto done;
    *n_keys = (int)moe_bundle_kv_count(kv);
done:
    if (st) fprintf(stderr, "moe-prep " CMD ": cannot write the tuning section of %s: %s (see above)\n", a->bundle,
                    moe_status_str(st));
    moe_bundle_free(b);
    moe_bundle_kv_free(kv);
    return st == MOE_OK;
}

int moe_prep_fit_cache(int argc, char **argv) {
    struct fc_args a;
    int rc = fc_parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct moe_profile *p = NULL;
    struct moe_bundle *b = NULL;
    struct fc_result *r = calloc(1, sizeof *r);
    struct fc_model m;
    int H = 0, Lc = 0;
    memset(&m, 0, sizeof m);
    rc = 1;
    if (!r) goto done;
    const char *inputs[2] = {a.profile, a.bundle};
    if (!moe_tool_output_ok(CMD, a.csv, NULL, NULL, 0, inputs, 2)) { /* --csv naming an input */
        rc = 2;
        goto done;
    }
    if (moe_profile_read(a.profile, &p) != MOE_OK) {
        fprintf(stderr, "moe-prep " CMD ": cannot read the profile %s (see the message above)\n", a.profile);
        goto done;
    }
    if (moe_bundle_open(a.bundle, &b) != MOE_OK) {
        fprintf(stderr, "moe-prep " CMD ": cannot open the bundle %s (see the message above)\n", a.bundle);
        goto done;
    }
    if (!check_shape(b, p, &a)) goto done;
    if (moe_profile_n_tokens(p) == 0) {
        fprintf(stderr, "moe-prep " CMD ": %s holds no tokens: profile more text\n", a.profile);
        goto done;
    }
    m.L = p->n_layers, m.E = p->n_experts, m.K = p->k, m.LE = m.L * m.E;
    if (!(r->freq_high = calloc((size_t)2 * m.LE, sizeof(double)))) {
        fprintf(stderr, "moe-prep " CMD ": out of memory\n");
        goto done;
    }
    r->freq_low = r->freq_high + m.LE;
    if ((rc = pick_precisions(b, p, &a, &m))) goto done;
    pick_thresholds(b, p, &a, &m);
    rc = 1;
    if (m.t1 > m.t2) {
        fprintf(stderr, "moe-prep " CMD ": T1 %.4f exceeds T2 %.4f: give both --t1 and --t2\n", m.t1, m.t2);
        rc = 2;
        goto done;
    }
    if ((rc = plan_sizes(&a, &m, r, &H, &Lc))) goto done;
    if ((rc = run(&a, p, &m, H, Lc, r))) goto done;
    rc = 1;
    moe_bundle_free(b); /* closed before the tuning is replaced */
    b = NULL;
    if (a.csv && !write_csv(a.csv, r)) goto done;
    if (!a.no_profile_update) {
        if (!update_profile(&a, p, &m, r, H, Lc)) goto done;
        r->profile_updated = 1;
    }
    if (!a.no_tuning && !write_tuning(&a, &m, r->w, r->admit, r->freq_high, r->freq_low, H, Lc, &r->n_tuning_keys)) goto done;
    if (a.json) print_json(&a, &m, r, H, Lc);
    else print_table(&a, p, &m, r);
    if (!a.no_tuning)
        fprintf(stderr, "moe-prep " CMD ": wrote the weights and cache sizes into the tuning section of %s (%d keys)\n",
                a.bundle, r->n_tuning_keys);
    if (r->profile_updated) fprintf(stderr, "moe-prep " CMD ": added the cache.* arrays to %s\n", a.profile);
    rc = 0;
done:
    moe_profile_free(p);
    moe_bundle_free(b);
    if (r) free(r->freq_high);
    free(r);
    return rc;
}
