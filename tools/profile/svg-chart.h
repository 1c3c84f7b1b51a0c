/*
 * svg-chart.h - the chart kit of the HTML reports: hand-written inline SVG
 * (axes with nice ticks, multi-series line charts, stacked histograms,
 * grouped bar charts, heat maps with a colour legend) streamed to a FILE,
 * plus the HTML escaping and number formatting every page needs. No
 * JavaScript and nothing fetched: a page that uses it opens from disk.
 *
 * Two rules hold: every string from a file goes through moe_svg_esc(), and
 * every number through moe_svg_num_*() (an en dash for a non-finite value) or,
 * in SVG coordinates, only after isfinite() (charts skip the point), so a
 * page never contains "nan" or "inf". Axis titles and marker labels are
 * trusted markup (fixed text with entities), written as given.
 *
 * Stateless: thread-safe on distinct FILEs. The heat map's colour classes
 * (.h0 .. .h31, .hx) come from moe_svg_heat_css(), which the page's <style>
 * must include.
 */
#ifndef MOE_SVG_CHART_H
#define MOE_SVG_CHART_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_SVG_DASH "&#8211;" /* shown for a missing or non-finite value */
#define MOE_SVG_N_PALETTE 8    /* series colours before they repeat */
#define MOE_SVG_HEAT_STEPS 32  /* colour classes of the heat map */

/* The series colours (colour-blind safe), MOE_SVG_N_PALETTE of them. */
extern const char *const moe_svg_palette[MOE_SVG_N_PALETTE];

/* A formatted number; returned by value so it can be used inside one printf
 * call (C11 keeps the temporary alive until the end of the full expression). */
struct moe_svg_num {
    char s[48];
};

/* A chart: an SVG of w x h pixels whose plot area (inside fixed margins)
 * maps the data range x0..x1, y0..y1. A range with x1 <= x0 (or y1 <= y0) is
 * fitted to the data by the chart helpers. */
struct moe_svg_plot {
    int w, h;
    double x0, x1, y0, y1;
    const char *label;          /* what the chart shows (aria-label; plain text) */
    const char *xlabel, *ylabel;/* axis titles (trusted markup: entities allowed) */
    int y_pct;                  /* y tick labels as percentages of 1 */
    int x_int;                  /* x ticks on integers only */
};

/* A dashed vertical line at x with a label (thresholds, a suggested value). */
struct moe_svg_mark {
    double x;
    const char *label; /* trusted markup */
};

/* One series of a line chart: n points (x[i], y[i]); a point with a
 * non-finite coordinate is skipped and breaks the line. */
struct moe_svg_series {
    const char *name;
    const double *x, *y;
    int n;
};

/* A histogram: n_bars bars between increasing edges, n_series values per
 * bar stacked in series order. */
struct moe_svg_hist {
    int n_bars, n_series;
    const double *edges;      /* [n_bars + 1] */
    const double *v;          /* [n_series x n_bars] bar heights; non-finite = none */
    const int64_t *count;     /* [n_series x n_bars] counts for the tooltips, or NULL */
    const char *const *names; /* [n_series] */
};

/* Grouped bars on a categorical x axis. */
struct moe_svg_bars {
    int n_groups, n_series;
    const char *const *groups; /* [n_groups] axis labels */
    const char *const *names;  /* [n_series] legend */
    const double *v;           /* [n_groups x n_series]; non-finite = no bar */
};

/* A heat map: rows x cols cells coloured by v on a sequential scale. */
struct moe_svg_heat {
    int rows, cols;
    const double *v;          /* [rows x cols] colour values; non-finite = grey */
    double lo, hi;            /* colour scale range (legend shows both) */
    int pct;                  /* legend values as percentages of 1 */
    const int32_t *row_name;  /* [rows] number shown for each row */
    const char *label, *xlabel, *ylabel;
    void (*tip)(FILE *f, int r, int c, const void *user); /* tooltip text of a cell (escaped by it) */
    const void *user;
};

/* moe_svg_num_f: x with `prec` decimals, or an en dash when x is not finite. */
struct moe_svg_num moe_svg_num_f(double x, int prec);

/* moe_svg_num_g: x with 6 significant digits (arrays of unknown meaning). */
struct moe_svg_num moe_svg_num_g(double x);

/* moe_svg_num_pct: share x (0..1) as a percentage with `prec` decimals and " %". */
struct moe_svg_num moe_svg_num_pct(double x, int prec);

/* moe_svg_esc_n: the first n bytes of s, HTML-escaped; control characters (which the
 * page could not show anyway) become '?'. */
void moe_svg_esc_n(FILE *f, const char *s, size_t n);

/* moe_svg_esc: s HTML-escaped (safe in text and in double-quoted attributes). */
void moe_svg_esc(FILE *f, const char *s);

/* moe_svg_clamp: v limited to [lo, hi]; NaN becomes lo (never reaches the page). */
double moe_svg_clamp(double v, double lo, double hi);

/* moe_svg_line_chart: the series on shared axes, with a legend, point tooltips
 * and optional vertical markers (the general x-y plot: accuracy by distance,
 * big-little against gamma, any later metric per setting and policy). Ranges
 * left unset in p are fitted to the finite points (y always includes 0).
 * Colours repeat after MOE_SVG_N_PALETTE series; only the first MOE_SVG_N_PALETTE are in the
 * legend. */
void moe_svg_line_chart(FILE *f, const struct moe_svg_plot *p, const struct moe_svg_series *s, int n_series,
                        const struct moe_svg_mark *m, int n_marks);

/* moe_svg_histogram: the bars of h on a numeric x axis, with tooltips, a legend
 * when there is more than one series, and optional vertical markers. */
void moe_svg_histogram(FILE *f, const struct moe_svg_plot *p, const struct moe_svg_hist *h,
                       const struct moe_svg_mark *m, int n_marks);

/* moe_svg_bar_chart: the groups side by side, one coloured bar per series, with
 * tooltips and a legend. y fitted from 0 unless p sets it. */
void moe_svg_bar_chart(FILE *f, const struct moe_svg_plot *p, const struct moe_svg_bars *b);

/* moe_svg_heat_map: the grid (cells scale with the map's size so a 64 x 256 map
 * stays readable and small: one short unit-square <path> with a <title> per
 * cell inside a scaled group, one group per row), row
 * and column labels thinned to fit, and a colour legend with its min/max. */
void moe_svg_heat_map(FILE *f, const struct moe_svg_heat *h);

/* moe_svg_heat_css: the colour classes of moe_svg_heat_map, interpolated along a light
 * yellow -> dark blue ramp (readable in print and for colour-blind readers). */
void moe_svg_heat_css(FILE *f);

#ifdef __cplusplus
}
#endif

#endif
