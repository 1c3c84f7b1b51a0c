/*
 * svg-chart.c - the chart kit (svg-chart.h): axes, line charts, histograms,
 * bar charts and heat maps as inline SVG, HTML escaping and number formats.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "svg-chart.h"

const char *const moe_svg_palette[MOE_SVG_N_PALETTE] = {"#0072b2", "#e69f00", "#009e73", "#cc79a7",
                                                        "#56b4e9", "#d55e00", "#999933", "#000000"};

/* ------------------------------------------------------------ text output */

/* moe_svg_num_f: x with `prec` decimals, or an en dash when x is not finite. */
struct moe_svg_num moe_svg_num_f(double x, int prec) {
    struct moe_svg_num n;
    if (isfinite(x)) snprintf(n.s, sizeof n.s, "%.*f", prec, x);
    else snprintf(n.s, sizeof n.s, "%s", MOE_SVG_DASH);
    return n;
}

/* moe_svg_num_g: x with 6 significant digits (arrays of unknown meaning). */
struct moe_svg_num moe_svg_num_g(double x) {
    struct moe_svg_num n;
    if (isfinite(x)) snprintf(n.s, sizeof n.s, "%.6g", x);
    else snprintf(n.s, sizeof n.s, "%s", MOE_SVG_DASH);
    return n;
}

/* moe_svg_num_pct: share x (0..1) as a percentage with `prec` decimals and " %". */
struct moe_svg_num moe_svg_num_pct(double x, int prec) {
    struct moe_svg_num n;
    if (isfinite(x)) snprintf(n.s, sizeof n.s, "%.*f %%", prec, 100.0 * x);
    else snprintf(n.s, sizeof n.s, "%s", MOE_SVG_DASH);
    return n;
}

/* moe_svg_esc_n: the first n bytes of s, HTML-escaped; control characters (which the
 * page could not show anyway) become '?'. */
void moe_svg_esc_n(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(c < 0x20 || c == 0x7f ? '?' : c, f);
        }
    }
}

/* moe_svg_esc: s HTML-escaped (safe in text and in double-quoted attributes). */
void moe_svg_esc(FILE *f, const char *s) { moe_svg_esc_n(f, s, (size_t)-1); }

/* --------------------------------------------------------------- SVG: axes */

enum { M_LEFT = 58, M_RIGHT = 16, M_TOP = 30, M_BOTTOM = 42 };

/* moe_svg_clamp: v limited to [lo, hi]; NaN becomes lo (never reaches the page). */
double moe_svg_clamp(double v, double lo, double hi) { return v > hi ? hi : v >= lo ? v : lo; }

/* sx, sy: pixel coordinates of data x, y, kept inside the plot area. */
static double sx(const struct moe_svg_plot *p, double x) {
    double w = p->w - M_LEFT - M_RIGHT;
    return moe_svg_clamp(M_LEFT + (x - p->x0) / (p->x1 - p->x0) * w, M_LEFT, M_LEFT + w);
}

static double sy(const struct moe_svg_plot *p, double y) {
    double h = p->h - M_TOP - M_BOTTOM;
    return moe_svg_clamp(p->h - M_BOTTOM - (y - p->y0) / (p->y1 - p->y0) * h, M_TOP, M_TOP + h);
}

/* nice_step: 1, 2 or 5 times a power of ten, giving about n ticks over span > 0. */
static double nice_step(double span, int n) {
    double raw = span / n, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

/* step_decimals: decimals needed to print multiples of step. */
static int step_decimals(double step) {
    if (step >= 1) return 0;
    int d = (int)ceil(-log10(step) - 1e-9);
    return d > 12 ? 12 : d;
}

/* fit_range: make [*lo, *hi] a usable axis range: finite, non-empty. */
static void fit_range(double *lo, double *hi) {
    if (!isfinite(*lo) || !isfinite(*hi) || *lo > *hi) {
        *lo = 0;
        *hi = 1;
    } else if (*lo == *hi) {
        double d = fabs(*lo) > 0 ? fabs(*lo) * 0.1 : 0.5;
        *lo -= d;
        *hi += d;
    }
}

/* plot_ready: p's ranges made usable whatever the data gave (finite,
 * non-empty, not so narrow that ticks would not advance). */
static void plot_ready(struct moe_svg_plot *p) {
    double *r[2][2] = {{&p->x0, &p->x1}, {&p->y0, &p->y1}};
    for (int i = 0; i < 2; i++) {
        double *lo = r[i][0], *hi = r[i][1];
        if (!isfinite(*hi - *lo) || *lo > *hi) *lo = 0, *hi = 1;
        if (*hi - *lo <= 1e-9 * fmax(fabs(*lo), fabs(*hi))) {
            double d = fmax(fabs(*lo) * 0.1, 0.5);
            *lo -= d, *hi += d;
        }
    }
}

/* svg_open: the <svg> element of a chart, scalable with the page. */
static void svg_open(FILE *f, int w, int h, const char *label) {
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"", w, h, w, h);
    moe_svg_esc(f, label ? label : "chart");
    fputs("\">\n", f);
}

/* svg_close: ends the chart svg_open began. */
static void svg_close(FILE *f) { fputs("</svg>\n", f); }

/* svg_axes: frame, grid and tick labels of p. With n_cat > 0 the x axis has
 * n_cat categories (x0 = 0, x1 = n_cat) labelled cat[i]; otherwise numeric
 * ticks. Axis titles are written as given (the callers pass fixed text). */
static void svg_axes(FILE *f, const struct moe_svg_plot *p, int n_cat, const char *const *cat) {
    const double left = M_LEFT, right = p->w - M_RIGHT, top = M_TOP, bottom = p->h - M_BOTTOM;
    double ys = nice_step(p->y1 - p->y0, 5);
    int yd = step_decimals(p->y_pct ? ys * 100 : ys);
    double y_first = ceil(p->y0 / ys - 1e-9) * ys;
    for (int i = 0; i <= 40 && y_first + i * ys <= p->y1 + ys * 1e-9; i++) {
        double y = y_first + i * ys, v = fabs(y) < ys * 1e-9 ? 0 : y, py = sy(p, v);
        fprintf(f, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", left, right, py, py);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.*f%s</text>\n", left - 4, py + 4, yd,
                p->y_pct ? 100 * v : v, p->y_pct ? "%" : "");
    }
    if (n_cat > 0) {
        for (int i = 0; i < n_cat; i++)
            if (cat && cat[i]) {
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", sx(p, i + 0.5), bottom + 14);
                moe_svg_esc(f, cat[i]);
                fputs("</text>\n", f);
            }
    } else {
        double xs = nice_step(p->x1 - p->x0, 6);
        if (p->x_int && xs < 1) xs = 1;
        int xd = step_decimals(xs);
        double x_first = ceil(p->x0 / xs - 1e-9) * xs;
        for (int i = 0; i <= 40 && x_first + i * xs <= p->x1 + xs * 1e-9; i++) {
            double x = x_first + i * xs, v = fabs(x) < xs * 1e-9 ? 0 : x, px = sx(p, v);
            fprintf(f, "<line class=\"ax\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", px, px, bottom,
                    bottom + 4);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n", px, bottom + 15, xd, v);
        }
    }
    fprintf(f, "<path class=\"ax\" d=\"M%.1f %.1fV%.1fH%.1f\"/>\n", left, top, bottom, right);
    if (p->xlabel)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", (left + right) / 2, p->h - 6,
                p->xlabel);
    if (p->ylabel)
        fprintf(f, "<text transform=\"translate(13 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
                (top + bottom) / 2, p->ylabel);
}

/* svg_legend: one row of coloured keys above the plot area (line or box). */
static void svg_legend(FILE *f, const char *const *names, int n, int boxes) {
    double x = M_LEFT;
    for (int i = 0; i < n; i++) {
        const char *c = moe_svg_palette[i % MOE_SVG_N_PALETTE];
        if (boxes) fprintf(f, "<rect x=\"%.1f\" y=\"8\" width=\"12\" height=\"10\" fill=\"%s\"/>", x, c);
        else fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"13\" y2=\"13\" stroke=\"%s\" stroke-width=\"2.5\"/>", x,
                     x + 14, c);
        fprintf(f, "<text x=\"%.1f\" y=\"17\">", x + 18);
        moe_svg_esc(f, names[i]);
        fputs("</text>\n", f);
        x += 30 + 6.2 * (double)strlen(names[i]);
    }
}

/* svg_marks: the vertical markers inside the plot area; labels are staggered
 * so two close markers stay readable, and anchored towards the middle. */
static void svg_marks(FILE *f, const struct moe_svg_plot *p, const struct moe_svg_mark *m, int n) {
    for (int i = 0; i < n; i++) {
        if (!isfinite(m[i].x) || m[i].x < p->x0 || m[i].x > p->x1) continue;
        double x = sx(p, m[i].x), mid = (M_LEFT + p->w - M_RIGHT) / 2.0;
        fprintf(f, "<line class=\"mark\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>", x, x, M_TOP,
                p->h - M_BOTTOM);
        fprintf(f, "<text class=\"mk\" x=\"%.1f\" y=\"%d\" text-anchor=\"%s\">%s</text>\n", x > mid ? x - 3 : x + 3,
                M_TOP + 11 + 13 * i, x > mid ? "end" : "start", m[i].label ? m[i].label : "");
    }
}

/* ---------------------------------------------------------- SVG: charts */

/* moe_svg_line_chart: the series on shared axes, with a legend, point tooltips
 * and optional vertical markers (the general x-y plot: accuracy by distance,
 * big-little against gamma, any later metric per setting and policy). Ranges
 * left unset in p are fitted to the finite points (y always includes 0).
 * Colours repeat after MOE_SVG_N_PALETTE series; only the first MOE_SVG_N_PALETTE are in the
 * legend. */
void moe_svg_line_chart(FILE *f, const struct moe_svg_plot *p0, const struct moe_svg_series *s, int n_series,
                           const struct moe_svg_mark *m, int n_marks) {
    struct moe_svg_plot p = *p0;
    double xl = INFINITY, xh = -INFINITY, yl = 0, yh = -INFINITY;
    for (int k = 0; k < n_series; k++)
        for (int i = 0; i < s[k].n; i++) {
            double x = s[k].x[i], y = s[k].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            xl = fmin(xl, x), xh = fmax(xh, x), yl = fmin(yl, y), yh = fmax(yh, y);
        }
    if (!(p.x1 > p.x0)) p.x0 = xl, p.x1 = xh, fit_range(&p.x0, &p.x1);
    if (!(p.y1 > p.y0)) p.y0 = yl, p.y1 = yh + 0.05 * (yh - yl), fit_range(&p.y0, &p.y1);
    plot_ready(&p);
    svg_open(f, p.w, p.h, p.label);
    svg_axes(f, &p, 0, NULL);
    svg_marks(f, &p, m, n_marks);
    const char *names[MOE_SVG_N_PALETTE];
    for (int k = 0; k < n_series; k++) {
        const char *c = moe_svg_palette[k % MOE_SVG_N_PALETTE];
        if (k < MOE_SVG_N_PALETTE) names[k] = s[k].name;
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\" d=\"", c);
        int pen = 0;
        for (int i = 0; i < s[k].n; i++) {
            double x = s[k].x[i], y = s[k].y[i];
            if (!isfinite(x) || !isfinite(y)) {
                pen = 0;
                continue;
            }
            fprintf(f, "%c%.1f %.1f", pen ? 'L' : 'M', sx(&p, x), sy(&p, y));
            pen = 1;
        }
        fputs("\"/>\n", f);
        for (int i = 0; i < s[k].n; i++) {
            double x = s[k].x[i], y = s[k].y[i];
            if (!isfinite(x) || !isfinite(y)) continue;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>", sx(&p, x), sy(&p, y), c);
            moe_svg_esc(f, s[k].name);
            fprintf(f, ": %.4g at %.4g</title></circle>\n", y, x);
        }
    }
    svg_legend(f, names, n_series < MOE_SVG_N_PALETTE ? n_series : MOE_SVG_N_PALETTE, 0);
    svg_close(f);
}

/* moe_svg_histogram: the bars of h on a numeric x axis, with tooltips, a legend
 * when there is more than one series, and optional vertical markers. */
void moe_svg_histogram(FILE *f, const struct moe_svg_plot *p0, const struct moe_svg_hist *h, const struct moe_svg_mark *m,
                          int n_marks) {
    struct moe_svg_plot p = *p0;
    double top = 0;
    for (int b = 0; b < h->n_bars; b++) {
        double sum = 0;
        for (int k = 0; k < h->n_series; k++) {
            double v = h->v[(size_t)k * h->n_bars + b];
            if (isfinite(v) && v > 0) sum += v;
        }
        top = fmax(top, sum);
    }
    if (!(p.x1 > p.x0)) p.x0 = h->edges[0], p.x1 = h->edges[h->n_bars], fit_range(&p.x0, &p.x1);
    if (!(p.y1 > p.y0)) p.y0 = 0, p.y1 = top > 0 ? top * 1.08 : 1;
    plot_ready(&p);
    svg_open(f, p.w, p.h, p.label);
    svg_axes(f, &p, 0, NULL);
    for (int b = 0; b < h->n_bars; b++) {
        double base = 0, x0 = sx(&p, h->edges[b]), x1 = sx(&p, h->edges[b + 1]);
        double w = x1 - x0 > 1.5 ? x1 - x0 - 0.5 : x1 - x0;
        for (int k = 0; k < h->n_series; k++) {
            size_t i = (size_t)k * h->n_bars + b;
            double v = h->v[i];
            if (!isfinite(v) || v <= 0) continue;
            double ya = sy(&p, base), yb = sy(&p, base + v);
            base += v;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>", x0, yb,
                    w, ya - yb, moe_svg_palette[k % MOE_SVG_N_PALETTE]);
            if (h->n_series > 1) {
                moe_svg_esc(f, h->names[k]);
                fputs(", ", f);
            }
            fprintf(f, "%.4g to %.4g: ", h->edges[b], h->edges[b + 1]);
            if (h->count) fprintf(f, "%lld (", (long long)h->count[i]);
            fputs(p.y_pct ? moe_svg_num_pct(v, 2).s : moe_svg_num_g(v).s, f);
            fprintf(f, "%s</title></rect>\n", h->count ? ")" : "");
        }
    }
    svg_marks(f, &p, m, n_marks);
    if (h->n_series > 1) svg_legend(f, h->names, h->n_series, 1);
    svg_close(f);
}

/* moe_svg_bar_chart: the groups side by side, one coloured bar per series, with
 * tooltips and a legend. y fitted from 0 unless p sets it. */
void moe_svg_bar_chart(FILE *f, const struct moe_svg_plot *p0, const struct moe_svg_bars *b) {
    struct moe_svg_plot p = *p0;
    double top = 0;
    for (int i = 0; i < b->n_groups * b->n_series; i++)
        if (isfinite(b->v[i])) top = fmax(top, b->v[i]);
    p.x0 = 0, p.x1 = b->n_groups;
    if (!(p.y1 > p.y0)) p.y0 = 0, p.y1 = top > 0 ? top * 1.08 : 1;
    plot_ready(&p);
    svg_open(f, p.w, p.h, p.label);
    svg_axes(f, &p, b->n_groups, b->groups);
    double gw = sx(&p, 1) - sx(&p, 0), bw = gw * 0.8 / (b->n_series > 0 ? b->n_series : 1);
    for (int g = 0; g < b->n_groups; g++)
        for (int k = 0; k < b->n_series; k++) {
            double v = b->v[(size_t)g * b->n_series + k];
            if (!isfinite(v)) continue;
            double x = sx(&p, g) + gw * 0.1 + k * bw, y0 = sy(&p, 0), y1 = sy(&p, v);
            if (y1 > y0) { double t = y0; y0 = y1; y1 = t; }
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>", x, y1,
                    bw - 1, y0 - y1, moe_svg_palette[k % MOE_SVG_N_PALETTE]);
            moe_svg_esc(f, b->groups[g]);
            fputs(", ", f);
            moe_svg_esc(f, b->names[k]);
            fprintf(f, ": %s</title></rect>\n", p.y_pct ? moe_svg_num_pct(v, 1).s : moe_svg_num_g(v).s);
        }
    svg_legend(f, b->names, b->n_series, 1);
    svg_close(f);
}

/* heat_class: colour class 0..MOE_SVG_HEAT_STEPS-1 of v on [lo, hi]. */
static int heat_class(double v, double lo, double hi) {
    if (!(hi > lo)) return MOE_SVG_HEAT_STEPS / 2;
    int c = (int)floor((v - lo) / (hi - lo) * MOE_SVG_HEAT_STEPS);
    return c < 0 ? 0 : c >= MOE_SVG_HEAT_STEPS ? MOE_SVG_HEAT_STEPS - 1 : c;
}

/* label_step: show every n-th label (n from 1, 2, 5 times powers of ten)
 * so that labels `need` pixels apart fit cells `cell` pixels wide. */
static int label_step(double cell, double need) {
    static const int steps[] = {1, 2, 4, 5, 8, 10, 16, 20, 32, 50, 64, 100, 128, 200, 256, 500, 1000,
                                2000, 4096, 5000, 10000, 16384, 32768, 65536};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        if (cell * steps[i] >= need) return steps[i];
    return 65536;
}

/* moe_svg_heat_map: the grid (cells scale with the map's size so a 64 x 256 map
 * stays readable and small: one short unit-square <path> with a <title> per
 * cell inside a scaled group, one group per row), row
 * and column labels thinned to fit, and a colour legend with its min/max. */
void moe_svg_heat_map(FILE *f, const struct moe_svg_heat *h) {
    const int ml = 46, mt = 8, mb = 40, legend = 96;
    double cw = moe_svg_clamp(880.0 / h->cols, 2, 28), ch = moe_svg_clamp(520.0 / h->rows, 3, 22);
    int w = (int)ceil(ml + cw * h->cols + legend), ht = (int)ceil(mt + ch * h->rows + mb);
    if (ht < 136) ht = 136; /* room for the legend */
    svg_open(f, w, ht, h->label);
    fprintf(f, "<g transform=\"translate(%d %d) scale(%.3f %.3f)\" shape-rendering=\"crispEdges\">\n", ml, mt, cw,
            ch);
    for (int r = 0; r < h->rows; r++) {
        fprintf(f, "<g transform=\"translate(0 %d)\">", r);
        for (int c = 0; c < h->cols; c++) {
            double v = h->v[(size_t)r * h->cols + c];
            if (isfinite(v)) fprintf(f, "<path d=\"M%d 0h1v1h-1z\" class=\"h%d\"><title>", c,
                                     heat_class(v, h->lo, h->hi));
            else fprintf(f, "<path d=\"M%d 0h1v1h-1z\" class=\"hx\"><title>", c);
            h->tip(f, r, c, h->user);
            fputs("</title></path>", f);
        }
        fputs("</g>\n", f);
    }
    fputs("</g>\n", f);
    int rs = label_step(ch, 11), cs = label_step(cw, 24);
    for (int r = 0; r < h->rows; r += rs)
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d</text>", ml - 4, mt + ch * (r + 0.5) + 4,
                (int)h->row_name[r]);
    for (int c = 0; c < h->cols; c += cs)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>", ml + cw * (c + 0.5),
                mt + ch * h->rows + 13, c);
    fprintf(f, "\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", ml + cw * h->cols / 2,
            mt + ch * h->rows + 30, h->xlabel);
    fprintf(f, "<text transform=\"translate(12 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            mt + ch * h->rows / 2, h->ylabel);
    /* legend: the MOE_SVG_HEAT_STEPS classes from hi (top) to lo */
    double lx = ml + cw * h->cols + 14, sh = 100.0 / MOE_SVG_HEAT_STEPS;
    for (int i = 0; i < MOE_SVG_HEAT_STEPS; i++)
        fprintf(f, "<rect x=\"%.1f\" y=\"%.2f\" width=\"12\" height=\"%.2f\" class=\"h%d\"/>", lx,
                mt + 12 + sh * (MOE_SVG_HEAT_STEPS - 1 - i), sh + 0.2, i);
    fprintf(f, "\n<text x=\"%.1f\" y=\"%d\">max</text><text x=\"%.1f\" y=\"%d\">%s</text>", lx + 16, mt + 10,
            lx + 16, mt + 22, h->pct ? moe_svg_num_pct(h->hi, 2).s : moe_svg_num_g(h->hi).s);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\">min</text><text x=\"%.1f\" y=\"%d\">%s</text>\n", lx + 16, mt + 104,
            lx + 16, mt + 116, h->pct ? moe_svg_num_pct(h->lo, 2).s : moe_svg_num_g(h->lo).s);
    svg_close(f);
}

/* moe_svg_heat_css: the colour classes of moe_svg_heat_map, interpolated along a light
 * yellow -> dark blue ramp (readable in print and for colour-blind readers). */
void moe_svg_heat_css(FILE *f) {
    static const unsigned char ramp[5][3] = {
        {255, 255, 217}, {199, 233, 180}, {65, 182, 196}, {34, 94, 168}, {8, 29, 88}};
    for (int i = 0; i < MOE_SVG_HEAT_STEPS; i++) {
        double t = (double)i / (MOE_SVG_HEAT_STEPS - 1) * 4;
        int a = (int)t < 4 ? (int)t : 3;
        double u = t - a;
        int c[3];
        for (int j = 0; j < 3; j++) c[j] = (int)lround(ramp[a][j] + u * (ramp[a + 1][j] - ramp[a][j]));
        fprintf(f, ".h%d{fill:#%02x%02x%02x}", i, c[0], c[1], c[2]);
    }
    fputs(".hx{fill:#ddd}\n", f);
}
