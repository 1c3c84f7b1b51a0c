/*
 * report.c - the HTML page of a routing profile (report.h). The page is
 * streamed to a FILE: CSS in one <style> block, charts as inline SVG drawn by
 * the chart kit (svg-chart.h), one section per kind of result.
 *
 * Two rules hold everywhere: every string from the file goes through
 * moe_svg_esc(), and every number through moe_svg_num_*() (tables: an en dash
 * for a non-finite value) or, in SVG coordinates, only after isfinite()
 * (charts skip the point). So the page never contains "nan"/"inf", and the
 * fixed text avoids words that contain them too (the tests search the whole
 * page).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-file.h"
#include "profile-h5.h"
#include "report.h"
#include "svg-chart.h"

#define GAMMA "&#947;"
#define MAX_BARS 50             /* histograms are rebinned to at most this many bars */
#define MAX_RANK_CHARTS 16      /* HOBBIT histograms drawn (ranks 1..16) */
#define MAX_HEAT_CELLS 65536    /* larger popularity maps are not drawn (page size) */
#define MAX_LIST_VALUES 64      /* other arrays: values listed up to this many */
#define MAX_CURVE_POINTS 65536  /* big_little rows (gamma values) drawn */
#define MAX_HIST_BINS (1 << 24) /* bins of sum.big_little_maxprob, as n_bins */

/* ------------------------------------------------------- derived arrays */

/* What the page shows, shared by the sections. */
struct page {
    FILE *f;
    const struct moe_profile *p;
    unsigned char *used; /* [n_derived] shown by a section (not repeated under "other arrays") */
};

/* has_prefix: s starts with prefix (the sum.* and config.* groups). */
static int has_prefix(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* find: the derived array `name` whatever its type and shape, or NULL. */
static const struct moe_profile_array *find(const struct page *g, const char *name) {
    for (int i = 0; i < g->p->n_derived; i++)
        if (strcmp(g->p->derived[i].name, name) == 0) return &g->p->derived[i];
    return NULL;
}

/* take: the derived array `name` if it has ndims dimensions of sizes d0, d1
 * (a negative size matches any size >= 1), marking it as shown; NULL when it
 * is absent or shaped otherwise (then it is listed under "other arrays"). Any
 * element type is accepted: values are read with aval(). */
static const struct moe_profile_array *take(struct page *g, const char *name, int ndims, int64_t d0, int64_t d1) {
    const struct moe_profile_array *a = find(g, name);
    if (!a || a->ndims != ndims) return NULL;
    int64_t want[2] = {d0, d1};
    for (int d = 0; d < ndims && d < 2; d++)
        if (want[d] >= 0 ? a->dims[d] != want[d] : a->dims[d] < 1) return NULL;
    g->used[a - g->p->derived] = 1;
    return a;
}

/* n_elems: elements of a derived array. */
static int64_t n_elems(const struct moe_profile_array *a) {
    int64_t n = 1;
    for (int d = 0; d < a->ndims; d++) n *= a->dims[d];
    return n;
}

/* aval: element i of a derived array of any type, as a double. */
static double aval(const struct moe_profile_array *a, int64_t i) {
    switch (a->dtype) {
    case MOE_PROFILE_F64: return ((const double *)a->data)[i];
    case MOE_PROFILE_I64: return (double)((const int64_t *)a->data)[i];
    default: return (double)((const int32_t *)a->data)[i];
    }
}

/* aint: element i of an integer array (exact, for counts). */
static long long aint(const struct moe_profile_array *a, int64_t i) {
    switch (a->dtype) {
    case MOE_PROFILE_I64: return (long long)((const int64_t *)a->data)[i];
    case MOE_PROFILE_I32: return (long long)((const int32_t *)a->data)[i];
    default: return (long long)((const double *)a->data)[i];
    }
}

/* dtype_name: the element type as the file's reader names it. */
static const char *dtype_name(enum moe_profile_dtype t) {
    return t == MOE_PROFILE_F64 ? "float64" : t == MOE_PROFILE_I64 ? "int64" : "int32";
}

/* put_shape: "[a x b x c]". */
static void put_shape(FILE *f, const struct moe_profile_array *a) {
    fputc('[', f);
    for (int d = 0; d < a->ndims; d++) fprintf(f, "%s%lld", d ? " x " : "", (long long)a->dims[d]);
    fputc(']', f);
}

/* put_values: the elements of a (rows of a 2-D array on separate lines). */
static void put_values(FILE *f, const struct moe_profile_array *a) {
    int64_t n = n_elems(a), row = a->ndims == 2 && a->dims[1] > 0 ? a->dims[1] : n;
    for (int64_t i = 0; i < n; i++) {
        if (i) fputs(i % row ? " " : "<br>", f);
        if (a->dtype == MOE_PROFILE_F64) fputs(moe_svg_num_g(aval(a, i)).s, f);
        else fprintf(f, "%lld", aint(a, i));
    }
}

/* missing: the line shown for a derived array a section needs but cannot
 * use: absent, or present with another shape (then listed under "other"). */
static void missing(const struct page *g, const char *name, const char *expected) {
    const struct moe_profile_array *a = find(g, name);
    fprintf(g->f, "<p class=\"note\"><code>%s</code>: ", name);
    if (!a) {
        fputs("not in this profile.</p>\n", g->f);
        return;
    }
    fputs("has shape ", g->f);
    put_shape(g->f, a);
    fprintf(g->f, " (%s), expected %s; listed under <a href=\"#other\">other arrays</a>.</p>\n",
            dtype_name(a->dtype), expected);
}

/* add_sat: a + b saturated at the int64 limits: counts come from the file,
 * and a crafted one must not overflow a sum (undefined behaviour). */
static int64_t add_sat(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
    return a + b;
}

/* rebin: n bins of counts c (stride 1) summed into nb <= n bars; bar b covers
 * bins [b*n/nb, (b+1)*n/nb), i.e. x from edge[b] to edge[b+1] in [0, 1]. */
static void rebin(const int64_t *c, int64_t n, int nb, int64_t *out, double *edge) {
    for (int b = 0; b <= nb; b++) edge[b] = (double)((int64_t)b * n / nb) / (double)n;
    for (int b = 0; b < nb; b++) {
        int64_t lo = (int64_t)b * n / nb, hi = (int64_t)(b + 1) * n / nb, s = 0;
        for (int64_t i = lo; i < hi; i++) s = add_sat(s, c[i]);
        out[b] = s;
    }
}

/* ---------------------------------------------------------------- sections */

/* Every array a section uses, looked up once (take() marks them shown), so
 * the header knows which sections and whether "other arrays" will appear. */
struct data {
    const struct moe_profile_array *split, *hit, *thr, *pearson;
    const struct moe_profile_array *stack[3]; /* stacked_top1, stacked_recall, layer_similarity */
    const struct moe_profile_array *path1, *path2, *cover, *reuse, *chance, *bl, *bl_sum, *bl_prob;
    int has_stack, has_path, has_reuse, has_bl, has_other;
    /* expert cache (moe-prep fit-cache): cache.sizes [S], cache.penalty [P x S], the rest optional */
    const struct moe_profile_array *c_sizes, *c_low, *c_pen, *c_hit, *c_bytes, *c_w, *c_sw, *c_set;
    int has_cache;
    /* EdgeMoE sensitivity (moe-prep sensitivity): [L x E] matrices, the rest optional */
    const struct moe_profile_array *s_score, *s_kl, *s_dnll, *s_proxy, *s_rho, *s_cost, *s_routed;
    int has_sens, traceless; /* traceless: a sensitivity file (no routing recorded) */
};

static const char *const k_stack_names[3] = {"stacked_top1", "stacked_recall", "layer_similarity"};
static const char *const k_stack_titles[3] = {"stacked top-1", "stacked recall", "gate-input similarity"};

#define MAX_CACHE_POLICIES 64 /* rows of cache.penalty drawn */
#define MAX_CACHE_SIZES 4096  /* columns of cache.penalty drawn */

/* unmark: a taken array goes back to "other arrays" (NULL is a no-op). */
static void unmark(struct page *g, const struct moe_profile_array *a) {
    if (a) g->used[a - g->p->derived] = 0;
}

/* gather_cache: the arrays of `moe-prep fit-cache` (docs/cache-sim.md); the
 * section needs cache.sizes [S] and cache.penalty [P x S], else every cache.*
 * array is listed with the others. */
static void gather_cache(struct page *g, struct data *d) {
    d->c_sizes = take(g, "cache.sizes", 1, -1, 0);
    const int64_t S = d->c_sizes ? d->c_sizes->dims[0] : 0;
    d->c_pen = d->c_sizes ? take(g, "cache.penalty", 2, -1, S) : NULL;
    if (!d->c_sizes || !d->c_pen || S > MAX_CACHE_SIZES || d->c_pen->dims[0] > MAX_CACHE_POLICIES) {
        unmark(g, d->c_sizes), unmark(g, d->c_pen);
        d->c_sizes = d->c_pen = NULL;
        return;
    }
    const int64_t P = d->c_pen->dims[0];
    d->has_cache = 1;
    d->c_low = take(g, "cache.low_sizes", 1, S, 0);
    d->c_hit = take(g, "cache.hit_ratio", 2, P, S);
    d->c_bytes = take(g, "cache.bytes", 2, P, S);
    /* 4 weights (written before the popularity term) or 5 weights and the admission flag */
    d->c_w = take(g, "cache.weights", 1, 6, 0);
    if (!d->c_w) d->c_w = take(g, "cache.weights", 1, 4, 0);
    d->c_sw = take(g, "cache.size_weights", 2, S, 6);
    if (!d->c_sw) d->c_sw = take(g, "cache.size_weights", 2, S, 4);
    d->c_set = take(g, "cache.settings", 1, 8, 0);
}

/* gather: look up the section arrays and which sections are present. */
static void gather(struct page *g, struct data *d) {
    const int64_t L = g->p->n_layers, K = g->p->k;
    memset(d, 0, sizeof *d);
    d->split = take(g, "split_sequences", 1, 2, 0);
    d->hit = take(g, "placement_hit_rate", 2, 3, 3);
    d->thr = take(g, "hobbit_thresholds", 1, 5, 0);
    d->pearson = take(g, "gate_output_pearson", 1, 1, 0);
    for (int i = 0; i < 3; i++) {
        d->stack[i] = take(g, k_stack_names[i], 2, L, -1);
        if (d->stack[i] && d->stack[i]->dims[1] > 64) { /* not distances: list it with the others */
            g->used[d->stack[i] - g->p->derived] = 0;
            d->stack[i] = NULL;
        }
        d->has_stack |= find(g, k_stack_names[i]) != NULL;
    }
    d->path1 = take(g, "path_accuracy_order1", 2, 2, 3);
    d->path2 = take(g, "path_accuracy_order2", 2, 2, 3);
    d->cover = take(g, "path_key_coverage", 1, 2, 0);
    d->has_path = find(g, "path_accuracy_order1") || find(g, "path_accuracy_order2") || find(g, "path_key_coverage");
    d->reuse = take(g, "reuse", 2, L, K);
    d->chance = take(g, "reuse_chance", 1, 1, 0);
    d->has_reuse = find(g, "reuse") || find(g, "reuse_chance");
    d->bl = take(g, "big_little", 2, -1, 3);
    if (d->bl && d->bl->dims[0] > MAX_CURVE_POINTS) { /* not a gamma sweep: list it with the others */
        g->used[d->bl - g->p->derived] = 0;
        d->bl = NULL;
    }
    d->bl_sum = take(g, "big_little_summary", 1, 5, 0);
    d->bl_prob = take(g, "sum.big_little_maxprob", 2, 2, -1);
    if (d->bl_prob && (d->bl_prob->dtype == MOE_PROFILE_F64 || d->bl_prob->dims[1] > MAX_HIST_BINS))
        d->bl_prob = NULL; /* counts only, as many bins as a histogram may have */
    d->has_bl = find(g, "big_little") || find(g, "big_little_summary") || find(g, "sum.big_little_maxprob");
    gather_cache(g, d);
    const int64_t E = g->p->n_experts;
    d->s_score = take(g, "sensitivity.score", 2, L, E);
    d->s_kl = take(g, "sensitivity.kl", 2, L, E);
    d->s_dnll = take(g, "sensitivity.dnll", 2, L, E);
    d->s_proxy = take(g, "sensitivity.proxy", 2, L, E);
    d->s_routed = take(g, "sensitivity.routed", 2, L, E);
    d->s_rho = take(g, "sensitivity.spearman_proxy", 1, 1, 0);
    d->s_cost = take(g, "sensitivity.cost", 1, 4, 0);
    d->has_sens = d->s_score != NULL;
    d->traceless = g->p->n_seq == 0 && d->has_sens;
    for (int i = 0; i < g->p->n_derived; i++) {
        const char *n = g->p->derived[i].name;
        if (has_prefix(n, "config.")) g->used[i] = 1; /* shown in the header */
        else if (!g->used[i] && !has_prefix(n, "sum.")) d->has_other = 1;
    }
}

/* section_open: <section> with its heading. */
static void section_open(FILE *f, const char *id, const char *title) {
    fprintf(f, "<section id=\"%s\">\n<h2>%s</h2>\n", id, title);
}

/* put_title: the page title, given or derived from the model and dataset
 * (last component of model_path, else arch). */
static void put_title(FILE *f, const struct moe_profile *p, const char *title) {
    if (title) {
        moe_svg_esc(f, title);
        return;
    }
    const char *m = p->model_path;
    size_t n = strlen(m);
    while (n > 1 && m[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && m[b - 1] != '/') b--;
    fputs("Routing profile", f);
    if (n > b) {
        fputs(" of ", f);
        moe_svg_esc_n(f, m + b, n - b);
    } else if (p->arch[0]) {
        fputs(" of ", f);
        moe_svg_esc(f, p->arch);
    }
    if (p->dataset[0]) {
        fputs(" on ", f);
        moe_svg_esc(f, p->dataset);
    }
}

static const char k_css[] =
    "body{font:14px/1.45 system-ui,-apple-system,\"Segoe UI\",Roboto,Helvetica,Arial,sans-serif;color:#222;"
    "max-width:1180px;margin:0 auto;padding:0 16px 40px}\n"
    "h1{font-size:22px;margin:18px 0 8px}h2{font-size:18px;margin:30px 0 6px;border-bottom:1px solid #ddd;"
    "padding-bottom:3px}h3{font-size:15px;margin:12px 0 4px}\n"
    "table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{padding:2px 8px;border-bottom:1px solid "
    "#eee;text-align:right;font-variant-numeric:tabular-nums;vertical-align:top}th{background:#f5f5f5}\n"
    ".l{text-align:left}.meta td{text-align:left}.meta td:first-child{color:#666}.note{color:#666}"
    ".scroll{overflow-x:auto;max-width:100%}.charts{display:flex;flex-wrap:wrap;align-items:flex-start;gap:10px 24px}"
    "figure{margin:8px 0}figcaption{color:#555;font-size:13px;max-width:760px}nav a{margin-right:12px}\n"
    "svg{max-width:100%;height:auto;font-size:11px}svg text{fill:#333}.grid{stroke:#eee}"
    ".ax{stroke:#888;fill:none}.mark{stroke:#d55e00;stroke-dasharray:5 3;stroke-width:1.5}.mk{fill:#d55e00}\n"
    ".b{display:inline-block;position:relative;width:60px;height:9px;background:#eee;margin-right:6px}"
    ".b i{position:absolute;left:0;top:0;bottom:0;background:#0072b2}"
    ".b u{position:absolute;top:-2px;bottom:-2px;width:2px;background:#d55e00}td.hi{font-weight:600}\n";

/* put_head: the document head and the header section (section 1). */
static void put_head(struct page *g, const struct data *d, const char *title) {
    FILE *f = g->f;
    const struct moe_profile *p = g->p;
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>", f);
    put_title(f, p, title);
    fprintf(f, "</title>\n<style>\n%s", k_css);
    moe_svg_heat_css(f);
    fputs("</style>\n</head>\n<body>\n<header id=\"summary\">\n<h1>", f);
    put_title(f, p, title);
    fputs("</h1>\n<table class=\"meta\">\n<tr><td>model</td><td>", f);
    moe_svg_esc(f, p->arch[0] ? p->arch : "(architecture not recorded)");
    if (p->model_path[0]) {
        fputs(" &#8212; <code>", f);
        moe_svg_esc(f, p->model_path);
        fputs("</code>", f);
    }
    fputs("</td></tr>\n<tr><td>dataset</td><td>", f);
    moe_svg_esc(f, p->dataset[0] ? p->dataset : "(not recorded)");
    fputs("</td></tr>\n<tr><td>written by</td><td>", f);
    moe_svg_esc(f, p->tool_version[0] ? p->tool_version : "(not recorded)");
    fprintf(f, "</td></tr>\n<tr><td>shape</td><td>%d MoE layers (L), %d experts per layer (E), top-%d routing "
               "(K)</td></tr>\n", p->n_layers, p->n_experts, p->k);
    fprintf(f, "<tr><td>sequences</td><td>%d</td></tr>\n<tr><td>tokens</td><td>%lld</td></tr>\n", p->n_seq,
            (long long)moe_profile_n_tokens(p));
    if (d->split)
        fprintf(f, "<tr><td>split</td><td>%lld sequences counted, %lld held out</td></tr>\n", aint(d->split, 0),
                aint(d->split, 1));
    fputs("</table>\n", f);
    int n_config = 0;
    for (int i = 0; i < p->n_derived; i++) {
        const struct moe_profile_array *a = &p->derived[i];
        if (!has_prefix(a->name, "config.")) continue;
        if (!n_config++) fputs("<table>\n<tr><th class=\"l\">configuration</th><th class=\"l\">shape</th>"
                               "<th class=\"l\">values</th></tr>\n", f);
        fputs("<tr><td class=\"l\"><code>", f);
        moe_svg_esc(f, a->name);
        fputs("</code></td><td class=\"l\">", f);
        put_shape(f, a);
        fputs("</td><td class=\"l\">", f);
        if (n_elems(a) <= MAX_LIST_VALUES) put_values(f, a);
        else fprintf(f, "(%lld values)", (long long)n_elems(a));
        fputs("</td></tr>\n", f);
    }
    if (n_config) fputs("</table>\n", f);
    fputs("<nav>", f);
    if (!d->traceless) fputs("<a href=\"#popularity\">popularity</a><a href=\"#hobbit\">HOBBIT</a>", f);
    if (d->has_stack) fputs("<a href=\"#stacked\">prediction by distance</a>", f);
    if (d->has_path) fputs("<a href=\"#paths\">path dictionaries</a>", f);
    if (d->has_reuse) fputs("<a href=\"#reuse\">reuse</a>", f);
    if (d->has_bl) fputs("<a href=\"#big-little\">big-little</a>", f);
    if (d->has_cache) fputs("<a href=\"#cache\">expert cache</a>", f);
    if (d->has_sens) fputs("<a href=\"#sensitivity\">sensitivity</a>", f);
    if (d->has_other) fputs("<a href=\"#other\">other arrays</a>", f);
    fputs("</nav>\n", f);
    const char *absent[4];
    int n_absent = 0;
    if (!d->has_stack) absent[n_absent++] = "prediction accuracy by distance";
    if (!d->has_path) absent[n_absent++] = "activation-path dictionaries";
    if (!d->has_reuse) absent[n_absent++] = "reuse";
    if (!d->has_bl) absent[n_absent++] = "big-little";
    for (int i = 0; i < n_absent; i++)
        fprintf(f, "%s%s", i ? ", " : "<p class=\"note\">Not in this profile: ", absent[i]);
    if (n_absent) fputs(".</p>\n", f);
    fputs("</header>\n", f);
}

/* Tooltip data of the popularity heat map. */
struct pop_tip {
    const struct moe_profile *p;
    const double *share;
};

/* pop_tip: "layer l expert e: count (x.x %)", l the model layer. */
static void pop_tip(FILE *f, int r, int c, const void *user) {
    const struct pop_tip *t = user;
    size_t i = (size_t)r * t->p->n_experts + c;
    fprintf(f, "layer %d expert %d: %lld (%s)", (int)t->p->moe_layer_index[r], c, (long long)t->p->popularity[i],
            moe_svg_num_pct(t->share[i], 1).s);
}

/* put_hit_rate: placement_hit_rate as a table and bars against random. */
static void put_hit_rate(struct page *g, const struct data *d) {
    FILE *f = g->f;
    fputs("<h3>Placement hit rate</h3>\n", f);
    if (!d->hit) {
        missing(g, "placement_hit_rate", "[3 x 3]");
        return;
    }
    char gname[3][64];
    const char *groups[3];
    double v[6];
    fputs("<div class=\"charts\"><table>\n<tr><th>resident pairs</th><th>hit rate (held-out)</th>"
          "<th>random</th></tr>\n", f);
    for (int r = 0; r < 3; r++) {
        double fr = aval(d->hit, r * 3), hit = aval(d->hit, r * 3 + 1), rnd = aval(d->hit, r * 3 + 2);
        fprintf(f, "<tr><td>%s</td><td>%s</td><td>%s</td></tr>\n", moe_svg_num_pct(fr, 0).s, moe_svg_num_pct(hit, 1).s,
                moe_svg_num_pct(rnd, 1).s);
        snprintf(gname[r], sizeof gname[r], "%s resident", isfinite(fr) ? moe_svg_num_pct(fr, 0).s : "?");
        groups[r] = gname[r];
        v[r * 2] = hit, v[r * 2 + 1] = rnd;
    }
    fputs("</table>\n", f);
    static const char *const names[2] = {"popularity order", "random"};
    struct moe_svg_plot p = {.w = 420, .h = 220, .y0 = 0, .y1 = 1, .y_pct = 1, .label = "placement hit rate",
                     .ylabel = "hit rate"};
    struct moe_svg_bars b = {3, 2, groups, names, v};
    moe_svg_bar_chart(f, &p, &b);
    fputs("</div>\n<p class=\"note\">Share of the held-out token-slots served when the most popular (layer, "
          "expert) pairs, counted on the other sequences, are resident, against a random choice of as many "
          "pairs.</p>\n", f);
}

/* put_popularity: section 2, the popularity heat map and the hit rate. */
static enum moe_status put_popularity(struct page *g, const struct data *d) {
    FILE *f = g->f;
    const struct moe_profile *p = g->p;
    const int L = p->n_layers, E = p->n_experts;
    double *share = NULL;
    section_open(f, "popularity", "Expert popularity");
    int64_t total = 0;
    for (size_t i = 0; i < (size_t)L * E; i++) total = add_sat(total, p->popularity[i]);
    if (total <= 0) {
        fputs("<p class=\"note\">No token-slots recorded: the popularity map is empty.</p>\n", f);
    } else if ((int64_t)L * E > MAX_HEAT_CELLS) {
        fprintf(f, "<p class=\"note\">%d x %d (layer, expert) pairs are more than the %d cells drawn; see "
                   "<code>/counts/popularity</code> in the file.</p>\n", L, E, MAX_HEAT_CELLS);
    } else {
        if (!(share = malloc((size_t)L * E * sizeof *share))) return MOE_ERR_NOMEM;
        double lo = INFINITY, hi = -INFINITY;
        for (int l = 0; l < L; l++) {
            int64_t row = 0;
            for (int e = 0; e < E; e++) row = add_sat(row, p->popularity[(size_t)l * E + e]);
            for (int e = 0; e < E; e++) {
                size_t i = (size_t)l * E + e;
                share[i] = row > 0 ? (double)p->popularity[i] / (double)row : NAN;
                if (isfinite(share[i])) lo = fmin(lo, share[i]), hi = fmax(hi, share[i]);
            }
        }
        fprintf(f, "<figure><div class=\"scroll\">\n");
        struct pop_tip t = {p, share};
        struct moe_svg_heat h = {L, E, share, lo, hi, 1, p->moe_layer_index, "expert popularity per layer",
                         "expert", "layer", pop_tip, &t};
        moe_svg_heat_map(f, &h);
        fprintf(f, "</div><figcaption>Share of each MoE layer's token-slots per expert (rows: model layer of "
                   "each MoE layer; columns: expert). Uniform routing would give 1/E = %s everywhere; the "
                   "scale runs from %s to %s.</figcaption></figure>\n",
                moe_svg_num_pct(1.0 / E, 2).s, moe_svg_num_pct(lo, 2).s, moe_svg_num_pct(hi, 2).s);
        free(share);
    }
    put_hit_rate(g, d);
    fputs("</section>\n", f);
    return MOE_OK;
}

/* sens_tip: "layer l expert e: value", l the model layer. */
struct sens_tip {
    const struct moe_profile *p;
    const struct moe_profile_array *a, *routed;
};

static void sens_tip(FILE *f, int r, int c, const void *user) {
    const struct sens_tip *t = user;
    int64_t i = (int64_t)r * t->p->n_experts + c;
    fprintf(f, "layer %d expert %d: %s", (int)t->p->moe_layer_index[r], c, moe_svg_num_g(aval(t->a, i)).s);
    if (t->routed) fprintf(f, ", %lld token-slots", (long long)aint(t->routed, i));
}

/* sens_map: one L x E heat map of a sensitivity matrix. */
static enum moe_status sens_map(struct page *g, const struct moe_profile_array *a, const struct moe_profile_array *routed,
                                const char *label, const char *caption) {
    FILE *f = g->f;
    const struct moe_profile *p = g->p;
    const int L = p->n_layers, E = p->n_experts;
    if ((int64_t)L * E > MAX_HEAT_CELLS) {
        fprintf(f, "<p class=\"note\">%d x %d experts are more than the %d cells drawn.</p>\n", L, E, MAX_HEAT_CELLS);
        return MOE_OK;
    }
    double *v = malloc((size_t)L * E * sizeof *v);
    if (!v) return MOE_ERR_NOMEM;
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < (int64_t)L * E; i++) {
        v[i] = aval(a, i);
        if (isfinite(v[i])) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
    }
    if (!(lo <= hi)) lo = hi = 0;
    fprintf(f, "<figure><div class=\"scroll\">\n");
    struct sens_tip t = {p, a, routed};
    struct moe_svg_heat h = {L, E, v, lo, hi, 0, p->moe_layer_index, label, "expert", "layer", sens_tip, &t};
    moe_svg_heat_map(f, &h);
    fprintf(f, "</div><figcaption>");
    moe_svg_esc(f, caption);
    fprintf(f, " Scale from %s to %s.</figcaption></figure>\n", moe_svg_num_g(lo).s, moe_svg_num_g(hi).s);
    free(v);
    return MOE_OK;
}

/* put_sensitivity: EdgeMoE's sweep: the ranked metric and the proxy as heat
 * maps, the rank agreement and the cost. */
static enum moe_status put_sensitivity(struct page *g, const struct data *d) {
    FILE *f = g->f;
    enum moe_status st;
    section_open(f, "sensitivity", "Expert sensitivity (EdgeMoE)");
    fputs("<p>Loss increase when one expert alone runs at the low precision and every other at the base one "
          "(<code>moe-prep sensitivity</code>); larger = more important. The bit-width search lowers experts "
          "in the opposite order.</p>\n", f);
    if ((st = sens_map(g, d->s_score, d->s_routed, "sensitivity per layer and expert",
                       "The metric the ranking uses (mean KL per position, mean NLL increase, or the proxy; "
                       "the file's tool_version says which).")))
        return st;
    if (d->s_proxy && d->s_kl && d->s_score != d->s_proxy &&
        (st = sens_map(g, d->s_proxy, d->s_routed, "proxy per layer and expert",
                       "Proxy: squared gate-weighted output error of the expert on its own tokens, per position.")))
        return st;
    fputs("<table><tr><th>figure</th><th>value</th></tr>\n", f);
    if (d->s_rho) fprintf(f, "<tr><td>Spearman rank agreement, proxy vs metric</td><td>%s</td></tr>\n",
                          moe_svg_num_f(aval(d->s_rho, 0), 3).s);
    if (d->s_cost) {
        fprintf(f, "<tr><td>sweep time</td><td>%s s</td></tr>\n", moe_svg_num_f(aval(d->s_cost, 0), 1).s);
        fprintf(f, "<tr><td>cost in baseline passes (a naive sweep: %s)</td><td>%s</td></tr>\n",
                moe_svg_num_f(aval(d->s_cost, 3), 0).s, moe_svg_num_f(aval(d->s_cost, 2), 2).s);
    }
    fputs("</table>\n</section>\n", f);
    return MOE_OK;
}

/* put_hobbit: section 3, the HOBBIT score histogram of each rank >= 1 with
 * T1/T2, the split they give, and the gate/output correlation. */
static enum moe_status put_hobbit(struct page *g, const struct data *d) {
    FILE *f = g->f;
    const struct moe_profile *p = g->p;
    const int K = p->k, nb = p->n_bins < MAX_BARS ? p->n_bins : MAX_BARS;
    enum moe_status st = MOE_OK;
    int64_t *cnt = malloc((size_t)nb * sizeof *cnt);
    double *edge = malloc((size_t)(nb + 1) * sizeof *edge), *v = malloc((size_t)nb * sizeof *v);
    if (!cnt || !edge || !v) {
        st = MOE_ERR_NOMEM;
        goto done;
    }
    section_open(f, "hobbit", "HOBBIT scores");
    int64_t rank0 = 0;
    for (int b = 0; b < p->n_bins; b++) rank0 = add_sat(rank0, p->hobbit_hist[b]);
    fprintf(f, "<p>Score s of the expert at rank r = the sum of the normalised gate weights of the higher "
               "ranks; a large s means the expert matters little. Rank 0 (the top expert) always has s = 0: "
               "%lld slots.", (long long)rank0);
    if (K == 2) fprintf(f, " The histogram shows rank 1 over [0, 1] in %d bars.", nb);
    if (K > 2) fprintf(f, " The histograms show ranks 1 to %d over [0, 1] in %d bars.", K - 1, nb);
    fputs("</p>\n", f);
    double t1 = d->thr ? aval(d->thr, 0) : NAN, t2 = d->thr ? aval(d->thr, 1) : NAN;
    char l1[64], l2[64];
    snprintf(l1, sizeof l1, "T1 = %s", moe_svg_num_f(t1, 4).s);
    snprintf(l2, sizeof l2, "T2 = %s", moe_svg_num_f(t2, 4).s);
    struct moe_svg_mark m[2] = {{t1, l1}, {t2, l2}};
    if (d->thr)
        fprintf(f, "<p>Thresholds <b>T1 = %s</b>, <b>T2 = %s</b>: s &#8804; T1 loads at high precision "
                   "(%s of the selected experts), T1 &lt; s &#8804; T2 at low precision (%s), s &gt; T2 is "
                   "skipped (%s).</p>\n",
                moe_svg_num_f(t1, 4).s, moe_svg_num_f(t2, 4).s, moe_svg_num_pct(aval(d->thr, 2), 1).s, moe_svg_num_pct(aval(d->thr, 3), 1).s,
                moe_svg_num_pct(aval(d->thr, 4), 1).s);
    else missing(g, "hobbit_thresholds", "[5]");
    if (d->pearson)
        fprintf(f, "<p>Pearson r between an expert's gate weight and the norm of its weighted output: "
                   "<b>%s</b>.</p>\n", moe_svg_num_f(aval(d->pearson, 0), 3).s);
    else missing(g, "gate_output_pearson", "[1]");
    if (K > 1) fputs("<div class=\"charts\">\n", f);
    for (int r = 1; r < K && r <= MAX_RANK_CHARTS; r++) {
        rebin(p->hobbit_hist + (size_t)r * p->n_bins, p->n_bins, nb, cnt, edge);
        int64_t tot = 0;
        for (int b = 0; b < nb; b++) tot = add_sat(tot, cnt[b]);
        fprintf(f, "<figure>\n");
        if (tot > 0) {
            for (int b = 0; b < nb; b++) v[b] = (double)cnt[b] / (double)tot;
            char label[64];
            snprintf(label, sizeof label, "HOBBIT score histogram, rank %d", r);
            static const char *const names[1] = {"slots"};
            struct moe_svg_plot pl = {.w = 430, .h = 230, .x0 = 0, .x1 = 1, .y_pct = 1, .label = label,
                              .xlabel = "score s", .ylabel = "share of the rank's slots"};
            struct moe_svg_hist h = {nb, 1, edge, v, cnt, names};
            moe_svg_histogram(f, &pl, &h, m, d->thr ? 2 : 0);
        }
        fprintf(f, "<figcaption>Rank %d: %lld slots", r, (long long)tot);
        if (d->thr) {
            int64_t hi = 0, lo = 0, all = 0; /* the split of this rank, from its histogram */
            for (int b = 0; b < p->n_bins; b++) {
                int64_t c = p->hobbit_hist[(size_t)r * p->n_bins + b];
                double s = (double)b / p->n_bins;
                all = add_sat(all, c);
                if (s < t1) hi = add_sat(hi, c);
                else if (s < t2) lo = add_sat(lo, c);
            }
            if (all > 0)
                fprintf(f, "; about %s high, %s low, %s skipped", moe_svg_num_pct((double)hi / all, 1).s,
                        moe_svg_num_pct((double)lo / all, 1).s, moe_svg_num_pct((double)(all - hi - lo) / all, 1).s);
        }
        fputs(".</figcaption></figure>\n", f);
    }
    if (K > 1) fputs("</div>\n", f);
    if (K - 1 > MAX_RANK_CHARTS)
        fprintf(f, "<p class=\"note\">Ranks %d to %d are not drawn.</p>\n", MAX_RANK_CHARTS + 1, K - 1);
    fputs("</section>\n", f);
done:
    free(cnt);
    free(edge);
    free(v);
    return st;
}

/* put_stacked: section 4, stacked-gate accuracy and gate-input similarity
 * against distance: the mean over layers as lines, then per layer. */
static enum moe_status put_stacked(struct page *g, const struct data *d) {
    FILE *f = g->f;
    const struct moe_profile *p = g->p;
    const int L = p->n_layers;
    double *xs = NULL, *mean[3] = {NULL, NULL, NULL};
    enum moe_status st = MOE_OK;
    section_open(f, "stacked", "Prediction accuracy by distance");
    int D = 0, n = 0;
    for (int i = 0; i < 3; i++)
        if (d->stack[i] && d->stack[i]->dims[1] > D) D = (int)d->stack[i]->dims[1];
    struct moe_svg_series s[3];
    if (D > 0) {
        if (!(xs = malloc((size_t)D * sizeof *xs))) goto nomem;
        for (int j = 0; j < D; j++) xs[j] = j + 1;
    }
    for (int i = 0; i < 3; i++) {
        const struct moe_profile_array *a = d->stack[i];
        if (!a) continue;
        int w = (int)a->dims[1];
        if (!(mean[i] = malloc((size_t)w * sizeof *mean[i]))) goto nomem;
        for (int j = 0; j < w; j++) {
            double sum = 0;
            int c = 0;
            for (int l = 0; l < L; l++) {
                double x = aval(a, (int64_t)l * w + j);
                if (isfinite(x)) sum += x, c++;
            }
            mean[i][j] = c ? sum / c : NAN;
        }
        s[n++] = (struct moe_svg_series){k_stack_titles[i], xs, mean[i], w};
    }
    double lo = 0; /* a negative mean cosine widens the axis below 0 */
    for (int i = 0; i < 3; i++)
        for (int j = 0; mean[i] && j < d->stack[i]->dims[1]; j++)
            if (isfinite(mean[i][j]) && mean[i][j] < lo) lo = floor(mean[i][j] * 10) / 10;
    if (n) {
        struct moe_svg_plot pl = {.w = 560, .h = 280, .x0 = 0.8, .x1 = D + 0.2, .y0 = lo, .y1 = 1, .y_pct = 1,
                          .x_int = 1, .label = "prediction accuracy by distance",
                          .xlabel = "distance j (layers ahead)", .ylabel = "mean over layers"};
        fputs("<figure>\n", f);
        moe_svg_line_chart(f, &pl, s, n, NULL, 0);
        fputs("<figcaption>Stacked gating predicts the experts of layer l+j from the gate input of layer l: "
              "top-1 = share of tokens whose predicted top expert is among the chosen ones, recall = mean share "
              "of the K chosen experts predicted; similarity = mean cosine of the gate inputs of layers l and "
              "l+j. Means skip the layers without a value (dense or past the end).</figcaption></figure>\n", f);
    }
    for (int i = 0; i < 3; i++)
        if (!d->stack[i]) missing(g, k_stack_names[i], "[L x 4] with L = the MoE layers");
    if (n) {
        fputs("<div class=\"scroll\"><table>\n<tr><th rowspan=\"2\">layer</th>", f);
        for (int i = 0; i < 3; i++)
            if (d->stack[i]) fprintf(f, "<th colspan=\"%d\">%s</th>", (int)d->stack[i]->dims[1], k_stack_titles[i]);
        fputs("</tr>\n<tr>", f);
        for (int i = 0; i < 3; i++)
            for (int j = 0; d->stack[i] && j < d->stack[i]->dims[1]; j++) fprintf(f, "<th>j=%d</th>", j + 1);
        fputs("</tr>\n", f);
        for (int l = 0; l < L; l++) {
            fprintf(f, "<tr><td>%d</td>", (int)p->moe_layer_index[l]);
            for (int i = 0; i < 3; i++)
                for (int j = 0; d->stack[i] && j < d->stack[i]->dims[1]; j++)
                    fprintf(f, "<td>%s</td>", moe_svg_num_f(aval(d->stack[i], (int64_t)l * d->stack[i]->dims[1] + j), 3).s);
            fputs("</tr>\n", f);
        }
        fputs("</table></div>\n", f);
    }
    fputs("</section>\n", f);
    goto done;
nomem:
    st = MOE_ERR_NOMEM;
done:
    free(xs);
    for (int i = 0; i < 3; i++) free(mean[i]);
    return st;
}

/* put_paths: section 5, path-dictionary recall against preloading the most
 * popular experts, and how many held-out keys the dictionaries had seen. */
static void put_paths(struct page *g, const struct data *d) {
    FILE *f = g->f;
    section_open(f, "paths", "Activation-path dictionaries");
    const struct moe_profile_array *pop = d->path1 ? d->path1 : d->path2;
    const char *names[3];
    const struct moe_profile_array *src[3];
    int row[3], n = 0;
    if (d->path1) names[n] = "dictionary, order 1", src[n] = d->path1, row[n++] = 0;
    if (d->path2) names[n] = "dictionary, order 2", src[n] = d->path2, row[n++] = 0;
    if (pop) names[n] = "most popular", src[n] = pop, row[n++] = 1;
    if (n) {
        static const char *const groups[3] = {"1 preloaded", "2 preloaded", "3 preloaded"};
        double v[9];
        for (int gi = 0; gi < 3; gi++)
            for (int k = 0; k < n; k++) v[gi * n + k] = aval(src[k], row[k] * 3 + gi);
        struct moe_svg_plot pl = {.w = 520, .h = 260, .y0 = 0, .y1 = 1, .y_pct = 1, .label = "path dictionary recall",
                          .ylabel = "recall (held-out)"};
        struct moe_svg_bars b = {3, n, groups, names, v};
        fputs("<div class=\"charts\"><figure>\n", f);
        moe_svg_bar_chart(f, &pl, &b);
        fputs("<figcaption>Share of the experts actually chosen at layer l that were among the 1, 2 or 3 "
              "preloaded: the most probable ones given the experts at l-1 (order 1) or at l-2 and l-1 "
              "(order 2), against the most popular ones of layer l.</figcaption></figure>\n<table>\n"
              "<tr><th class=\"l\">preloaded</th><th>1</th><th>2</th><th>3</th></tr>\n", f);
        for (int k = 0; k < n; k++) {
            fprintf(f, "<tr><td class=\"l\">%s</td>", names[k]);
            for (int gi = 0; gi < 3; gi++) fprintf(f, "<td>%s</td>", moe_svg_num_pct(v[gi * n + k], 1).s);
            fputs("</tr>\n", f);
        }
        fputs("</table></div>\n", f);
    }
    if (!d->path1) missing(g, "path_accuracy_order1", "[2 x 3]");
    if (!d->path2) missing(g, "path_accuracy_order2", "[2 x 3]");
    if (d->cover)
        fprintf(f, "<p>Held-out (token, layer) keys already in the dictionary: order 1 <b>%s</b>, order 2 "
                   "<b>%s</b>.</p>\n", moe_svg_num_pct(aval(d->cover, 0), 1).s, moe_svg_num_pct(aval(d->cover, 1), 1).s);
    else missing(g, "path_key_coverage", "[2]");
    fputs("</section>\n", f);
}

/* put_reuse: section 6, reuse per layer and rank as bars with the chance
 * level marked (K / E: an expert picked at random would be reused that often). */
static void put_reuse(struct page *g, const struct data *d) {
    FILE *f = g->f;
    const struct moe_profile *p = g->p;
    const int L = p->n_layers, K = p->k;
    double chance = d->chance ? aval(d->chance, 0) : NAN;
    section_open(f, "reuse", "Expert reuse between consecutive tokens");
    if (d->chance)
        fprintf(f, "<p>Share of tokens whose expert at rank r is used again by the next token. Chance level "
                   "K / E = <b>%s</b> (orange tick); values above it are bold.</p>\n", moe_svg_num_f(chance, 3).s);
    else missing(g, "reuse_chance", "[1]");
    if (!d->reuse) {
        missing(g, "reuse", "[L x K]");
        fputs("</section>\n", f);
        return;
    }
    fputs("<div class=\"scroll\"><table>\n<tr><th>layer</th>", f);
    for (int r = 0; r < K; r++) fprintf(f, "<th class=\"l\">rank %d</th>", r);
    fputs("</tr>\n", f);
    for (int l = 0; l <= L; l++) {
        if (l < L) fprintf(f, "<tr><td>%d</td>", (int)p->moe_layer_index[l]);
        else fputs("<tr><th>mean</th>", f);
        for (int r = 0; r < K; r++) {
            double x = 0;
            if (l < L) {
                x = aval(d->reuse, (int64_t)l * K + r);
            } else { /* mean over layers of the finite values */
                int c = 0;
                for (int i = 0; i < L; i++) {
                    double y = aval(d->reuse, (int64_t)i * K + r);
                    if (isfinite(y)) x += y, c++;
                }
                x = c ? x / c : NAN;
            }
            fprintf(f, "<td class=\"l%s\"><span class=\"b\">", isfinite(chance) && x > chance ? " hi" : "");
            if (isfinite(x)) fprintf(f, "<i style=\"width:%.0fpx\"></i>", moe_svg_clamp(x, 0, 1) * 60);
            if (isfinite(chance)) fprintf(f, "<u style=\"left:%.0fpx\"></u>", moe_svg_clamp(chance, 0, 1) * 60 - 1);
            fprintf(f, "</span>%s</td>", moe_svg_num_f(x, 3).s);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table></div>\n</section>\n", f);
}

/* put_big_little: section 7, MoBiLE: fallback ratio and agreement against
 * gamma with the suggested gamma, and the little model's confidence split by
 * agreement with the big model. */
static enum moe_status put_big_little(struct page *g, const struct data *d) {
    FILE *f = g->f;
    enum moe_status st = MOE_OK;
    double *col = NULL, *edge = NULL, *v = NULL;
    int64_t *cnt = NULL, *row = NULL;
    section_open(f, "big-little", "Big-little (MoBiLE)");
    double gs = d->bl_sum ? aval(d->bl_sum, 1) : NAN;
    if (d->bl_sum)
        fprintf(f, "<p>The little model's top token agrees with the big model's on <b>%s</b> of the tokens. "
                   "Suggested " GAMMA " = <b>%s</b>: fallback to the big model on %s of the tokens, agreement "
                   "of the combined output with the K-expert run %s. The little model uses %s experts per "
                   "token.</p>\n",
                moe_svg_num_pct(aval(d->bl_sum, 0), 1).s, moe_svg_num_f(gs, 3).s, moe_svg_num_pct(aval(d->bl_sum, 2), 1).s,
                moe_svg_num_pct(aval(d->bl_sum, 3), 1).s, moe_svg_num_f(aval(d->bl_sum, 4), 2).s);
    else missing(g, "big_little_summary", "[5]");
    if (d->bl) {
        const int G = (int)d->bl->dims[0];
        if (!(col = malloc((size_t)3 * G * sizeof *col))) goto nomem;
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < G; i++) col[(size_t)c * G + i] = aval(d->bl, (int64_t)i * 3 + c);
        struct moe_svg_series s[2] = {{"fallback ratio", col, col + G, G}, {"agreement", col, col + 2 * G, G}};
        char ml[96];
        snprintf(ml, sizeof ml, "suggested " GAMMA " = %s", moe_svg_num_f(gs, 2).s);
        struct moe_svg_mark m = {gs, ml};
        struct moe_svg_plot pl = {.w = 560, .h = 280, .x0 = 0, .x1 = 1, .y0 = 0, .y1 = 1, .y_pct = 1,
                          .label = "big-little fallback ratio and agreement against gamma",
                          .xlabel = "confidence threshold " GAMMA, .ylabel = "share of tokens"};
        fputs("<div class=\"charts\"><figure>\n", f);
        moe_svg_line_chart(f, &pl, s, 2, &m, d->bl_sum ? 1 : 0);
        fputs("<figcaption>Tokens whose little-model top probability is below " GAMMA " fall back to the big "
              "model; agreement is that of the combined output with the K-expert run.</figcaption></figure>\n", f);
        if (G <= MAX_LIST_VALUES) {
            fputs("<table>\n<tr><th>" GAMMA "</th><th>fallback</th><th>agreement</th></tr>\n", f);
            for (int i = 0; i < G; i++)
                fprintf(f, "<tr><td>%s</td><td>%s</td><td>%s</td></tr>\n", moe_svg_num_f(col[i], 3).s,
                        moe_svg_num_pct(col[G + i], 1).s, moe_svg_num_pct(col[2 * G + i], 1).s);
            fputs("</table>", f);
        }
        fputs("</div>\n", f);
    } else {
        missing(g, "big_little", "[G x 3]");
    }
    if (d->bl_prob) {
        const int64_t B = d->bl_prob->dims[1];
        const int nb = B < MAX_BARS ? (int)B : MAX_BARS;
        if (!(row = malloc((size_t)2 * B * sizeof *row)) || !(cnt = malloc((size_t)2 * nb * sizeof *cnt)) ||
            !(edge = malloc((size_t)(nb + 1) * sizeof *edge)) || !(v = malloc((size_t)2 * nb * sizeof *v)))
            goto nomem;
        int64_t tot = 0;
        for (int64_t i = 0; i < 2 * B; i++) row[i] = aint(d->bl_prob, i), tot = add_sat(tot, row[i]);
        rebin(row, B, nb, cnt, edge);
        rebin(row + B, B, nb, cnt + nb, edge);
        for (int i = 0; i < 2 * nb; i++) v[i] = tot > 0 ? (double)cnt[i] / (double)tot : NAN;
        static const char *const names[2] = {"top tokens agree", "top tokens differ"};
        struct moe_svg_plot pl = {.w = 560, .h = 260, .x0 = 0, .x1 = 1, .y_pct = 1,
                          .label = "little model maximum probability by agreement",
                          .xlabel = "little model's maximum output probability", .ylabel = "share of tokens"};
        struct moe_svg_hist h = {nb, 2, edge, v, cnt, names};
        fputs("<figure>\n", f);
        if (tot > 0) moe_svg_histogram(f, &pl, &h, NULL, 0);
        fprintf(f, "<figcaption>%lld tokens, stacked by whether the little and big models' top tokens agree; "
                   "a useful " GAMMA " separates the two.</figcaption></figure>\n", (long long)tot);
    } else {
        missing(g, "sum.big_little_maxprob", "integer [2 x B]");
    }
    fputs("</section>\n", f);
    goto done;
nomem:
    st = MOE_ERR_NOMEM;
done:
    free(col);
    free(row);
    free(cnt);
    free(edge);
    free(v);
    return st;
}

/* The policies of cache.penalty's rows, in the fixed order of
 * tools/common/cache-sim.h (enum moe_cache_policy). */
static const char *const k_cache_policies[] = {"LRU", "LFU (sequence)", "LFU (global)", "LHU", "FLD",
                                               "EdgeMoE", "Twiddler (static)", "HOBBIT", "Belady (MIN)"};
#define N_CACHE_POLICIES 9
#define CACHE_BELADY 8

/* cache_policy_name: row r's name ("policy r" past the known ones). */
static const char *cache_policy_name(int r, char *buf, size_t n) {
    if (r < N_CACHE_POLICIES) return k_cache_policies[r];
    snprintf(buf, n, "policy %d", r);
    return buf;
}

/* put_cache_chart: penalty per token against the high-cache size for the
 * rows in `rows` that exist (x: cache.sizes). */
static void put_cache_chart(struct page *g, const struct data *d, const double *x, const double *pen,
                            const int *rows, int n_rows, const char *label, const char *caption) {
    const int64_t P = d->c_pen->dims[0], S = d->c_sizes->dims[0];
    struct moe_svg_series s[MOE_SVG_N_PALETTE];
    char names[MOE_SVG_N_PALETTE][24];
    int n = 0;
    for (int i = 0; i < n_rows && n < MOE_SVG_N_PALETTE; i++)
        if (rows[i] < P) {
            s[n].name = cache_policy_name(rows[i], names[n], sizeof names[n]);
            s[n].x = x, s[n].y = pen + (size_t)rows[i] * S, s[n].n = (int)S;
            n++;
        }
    struct moe_svg_plot pl = {.w = 520, .h = 300, .x_int = 1, .label = label,
                      .xlabel = "high-precision cache (experts)", .ylabel = "miss penalty per token"};
    fputs("<figure>\n", g->f);
    moe_svg_line_chart(g->f, &pl, s, n, NULL, 0);
    fprintf(g->f, "<figcaption>%s</figcaption></figure>\n", caption);
}

/* put_cache: section "Expert cache": the penalty of every policy against
 * the cache size (two charts, each with LRU and Belady for reference), the
 * values as a table, and HOBBIT's fitted weights. */
__attribute__((noinline)) /* inlined, it makes GCC -O3 warn falsely about put_big_little's buffers */
static enum moe_status put_cache(struct page *g, const struct data *d) {
    FILE *f = g->f;
    const int64_t P = d->c_pen->dims[0], S = d->c_sizes->dims[0];
    double *x = malloc(sizeof *x * (size_t)S), *pen = malloc(sizeof *pen * (size_t)(P * S));
    if (!x || !pen) {
        free(x);
        free(pen);
        return MOE_ERR_NOMEM;
    }
    for (int64_t i = 0; i < S; i++) x[i] = aval(d->c_sizes, i);
    for (int64_t i = 0; i < P * S; i++) pen[i] = aval(d->c_pen, i);
    section_open(f, "cache", "Expert cache");
    fputs("<p>Miss penalty per token of each cache policy replaying the held-out sequences (moe-prep fit-cache): "
          "a miss of a high-precision expert costs 1, of a low-precision one the ratio of their sizes; accesses "
          "HOBBIT's thresholds skip cost nothing. The low-precision cache scales with the high one. "
          "Belady's MIN, which knows the future, is the lower bound.</p>\n", f);
    if (d->c_set) {
        const struct moe_profile_array *c = d->c_set;
        fprintf(f, "<p>T1 = <b>%s</b>, T2 = <b>%s</b>, low-precision miss cost <b>%s</b>, held-out share %s, "
                   "prompt batch %s tokens, prefetch %s experts per layer; HOBBIT's weights fitted with %s high- and "
                   "%s low-precision experts.</p>\n",
                moe_svg_num_f(aval(c, 0), 4).s, moe_svg_num_f(aval(c, 1), 4).s, moe_svg_num_f(aval(c, 2), 4).s, moe_svg_num_pct(aval(c, 3), 0).s,
                moe_svg_num_f(aval(c, 4), 0).s, moe_svg_num_f(aval(c, 5), 0).s, moe_svg_num_f(aval(c, 6), 0).s, moe_svg_num_f(aval(c, 7), 0).s);
    }
    static const int basic[] = {0, 1, 2, 3, 4, CACHE_BELADY}, model[] = {5, 6, 7, 0, CACHE_BELADY};
    fputs("<div class=\"charts\">\n", f);
    put_cache_chart(g, d, x, pen, basic, 6, "cache penalty of the basic policies against the cache size",
                    "LRU, LFU per sequence and global, LHU and forward layer distance, with Belady's bound.");
    put_cache_chart(g, d, x, pen, model, 5, "cache penalty of the papers' policies against the cache size",
                    "EdgeMoE (frequency over layer distance), Twiddler's static popularity placement and HOBBIT's "
                    "fitted priority, with LRU and Belady's bound.");
    fputs("</div>\n<div class=\"scroll\"><table>\n<tr><th class=\"l\">policy</th>", f);
    for (int64_t s = 0; s < S; s++) {
        fprintf(f, "<th>%s", moe_svg_num_f(x[s], 0).s);
        if (d->c_low) fprintf(f, " + %s", moe_svg_num_f(aval(d->c_low, s), 0).s);
        fputs("</th>", f);
    }
    fputs("</tr>\n", f);
    for (int64_t r = 0; r < P; r++) {
        char nb[24];
        fputs("<tr><td class=\"l\">", f);
        moe_svg_esc(f, cache_policy_name((int)r, nb, sizeof nb));
        fputs("</td>", f);
        for (int64_t s = 0; s < S; s++) {
            fprintf(f, "<td>%s", moe_svg_num_f(pen[r * S + s], 4).s);
            if (d->c_hit) fprintf(f, " <span class=\"note\">(%s)</span>", moe_svg_num_pct(aval(d->c_hit, r * S + s), 1).s);
            fputs("</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fprintf(f, "</table></div>\n<p class=\"note\">Columns: high-precision%s cache capacity in experts; cells: "
               "penalty per token%s.</p>\n", d->c_low ? " + low-precision" : "", d->c_hit ? " (hit ratio)" : "");
    if (d->c_w || d->c_sw) {
        static const char *const wn[6] = {"w_lru", "w_lfu", "w_lhu", "w_fld", "w_pop", "admission"};
        const int nw = (int)(d->c_w ? d->c_w->dims[0] : d->c_sw->dims[1]); /* 4 or 6 */
        const int nsw = d->c_sw ? (int)d->c_sw->dims[1] : 0;
        fputs("<h3>HOBBIT's fitted weights</h3>\n<table>\n<tr><th class=\"l\">fitted for</th>", f);
        for (int i = 0; i < nw; i++) fprintf(f, "<th>%s</th>", wn[i]);
        fputs("</tr>\n", f);
        if (d->c_w) {
            fputs("<tr><td class=\"l\">the tuning section</td>", f);
            for (int i = 0; i < nw; i++)
                fprintf(f, "<td>%s</td>", i == 5 ? (aval(d->c_w, i) ? "on" : "off") : moe_svg_num_f(aval(d->c_w, i), 4).s);
            fputs("</tr>\n", f);
        }
        for (int64_t s = 0; d->c_sw && nsw == nw && s < S; s++) {
            fprintf(f, "<tr><td class=\"l\">%s high-precision experts</td>", moe_svg_num_f(x[s], 0).s);
            for (int i = 0; i < nw; i++) {
                const double v = aval(d->c_sw, s * nsw + i);
                fprintf(f, "<td>%s</td>", i == 5 ? (v ? "on" : "off") : moe_svg_num_f(v, 4).s);
            }
            fputs("</tr>\n", f);
        }
        fputs("</table>\n<p class=\"note\">Priority of a cached expert t (the lowest is evicted): w_lru R/T + "
              "w_lfu F/T + w_lhu H/T + w_fld (1 - layer distance / L)", f);
        if (nw == 6)
            fputs(" + w_pop (its popularity on the fit part); with admission, a loaded copy is kept only if it "
                  "outranks the copy it would evict", f);
        fputs(".</p>\n", f);
    }
    fputs("</section>\n", f);
    free(x);
    free(pen);
    return MOE_OK;
}

/* put_other: section 8, every derived array no section showed (except the
 * sum.* inputs and config.* header arrays), so new results always appear. */
static void put_other(const struct page *g) {
    FILE *f = g->f;
    section_open(f, "other", "Other arrays");
    fputs("<div class=\"scroll\"><table>\n<tr><th class=\"l\">name</th><th class=\"l\">type</th>"
          "<th class=\"l\">shape</th><th class=\"l\">values</th></tr>\n", f);
    for (int i = 0; i < g->p->n_derived; i++) {
        const struct moe_profile_array *a = &g->p->derived[i];
        if (g->used[i] || has_prefix(a->name, "sum.") || has_prefix(a->name, "config.")) continue;
        fputs("<tr><td class=\"l\"><code>", f);
        moe_svg_esc(f, a->name);
        fprintf(f, "</code></td><td class=\"l\">%s</td><td class=\"l\">", dtype_name(a->dtype));
        put_shape(f, a);
        fputs("</td><td class=\"l\">", f);
        if (n_elems(a) <= MAX_LIST_VALUES) put_values(f, a);
        else fprintf(f, "(%lld values)", (long long)n_elems(a));
        fputs("</td></tr>\n", f);
    }
    fputs("</table></div>\n</section>\n", f);
}

/* ---------------------------------------------------------------- public */

enum moe_status moe_profile_report_render(const struct moe_profile *p, const char *title, FILE *out) {
    enum moe_status st = MOE_OK;
    struct page g = {out, p, NULL};
    struct data d;
    if (!p || !out || p->n_layers < 1 || p->n_experts < 1 || p->k < 1 || p->k > p->n_experts || p->n_bins < 1 ||
        p->n_seq < 0 || !p->moe_layer_index || !p->seq_start || !p->popularity || !p->hobbit_hist ||
        (p->n_derived > 0 && !p->derived)) {
        MOE_LOGE("not a usable profile (missing, or its shape fields are out of range)");
        return MOE_ERR_INVALID;
    }
    if (!(g.used = calloc((size_t)p->n_derived + 1, 1))) return MOE_ERR_NOMEM;
    gather(&g, &d);
    put_head(&g, &d, title);
    if (!d.traceless && ((st = put_popularity(&g, &d)) || (st = put_hobbit(&g, &d)))) goto done;
    if (d.has_sens && (st = put_sensitivity(&g, &d))) goto done;
    if (d.has_stack && (st = put_stacked(&g, &d))) goto done;
    if (d.has_path) put_paths(&g, &d);
    if (d.has_reuse) put_reuse(&g, &d);
    if (d.has_bl && (st = put_big_little(&g, &d))) goto done;
    if (d.has_cache && (st = put_cache(&g, &d))) goto done;
    if (d.has_other) put_other(&g);
    fputs("<footer class=\"note\"><p>Written by moe-prep profile report; the file format is in docs/format.md, "
          "\"Profile files (HDF5)\".</p></footer>\n</body>\n</html>\n", out);
    if (ferror(out)) {
        MOE_LOGE("write error: %s", strerror(errno));
        st = MOE_ERR_IO;
    }
done:
    if (st == MOE_ERR_NOMEM) MOE_LOGE("out of memory");
    free(g.used);
    return st;
}

enum moe_status moe_profile_report_write(const struct moe_profile *p, const char *title, const char *path) {
    if (!path || !*path) {
        MOE_LOGE("no output path");
        return MOE_ERR_INVALID;
    }
    struct moe_tmp_file t; /* O_EXCL beside path: a planted link at the temporary name is not followed */
    enum moe_status st = moe_tmp_create(path, &t);
    if (st) return st;
    FILE *f = moe_tmp_stream(&t);
    if (!f) {
        moe_tmp_discard(&t);
        return MOE_ERR_NOMEM;
    }
    if ((st = moe_profile_report_render(p, title, f))) {
        moe_tmp_discard(&t);
        return st;
    }
    return moe_tmp_commit(&t); /* flush, fsync, rename; on a full disk the old page stays */
}
