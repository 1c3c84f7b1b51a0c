/*
 * report.h - `moe-prep profile report`: a routing profile (profile-h5.h)
 * rendered as one self-contained HTML5 page that any browser opens from disk:
 * inline CSS and hand-written inline SVG, no JavaScript, nothing fetched.
 *
 * Sections, each shown only when its data are in the profile: the header
 * (model, dataset, shape, tokens, config.* arrays), expert popularity as a
 * heat map with the placement hit rate, the HOBBIT score histograms with
 * T1/T2, stacked-gate prediction accuracy by distance, the activation-path
 * dictionaries, expert reuse, big-little (MoBiLE), and every other derived
 * array by name, type and shape (with its values when small), so results
 * added by later stages always appear somewhere.
 *
 * Every string from the file is HTML-escaped and no non-finite number is
 * written (tables show an en dash, charts skip the point). The charts come
 * from the chart kit (svg-chart.h); the CLI is report-cmd.c. Thread-safe on
 * distinct profiles and output files (the page is built from p alone).
 */
#ifndef MOE_PROFILE_REPORT_H
#define MOE_PROFILE_REPORT_H

#include <stdio.h>

#include "moe-status.h"
#include "profile-h5.h"

/* moe_profile_report_render: write the HTML page of profile p to `out` (the
 * caller opens and closes it; nothing is flushed). title NULL derives one from
 * p->model_path (or p->arch) and p->dataset; it is escaped like every other
 * string. p is only read. Returns MOE_ERR_INVALID for a profile whose shape
 * fields are out of range, MOE_ERR_NOMEM, or MOE_ERR_IO when `out` reports a
 * write error; each is logged once. Derived arrays that are missing or have an
 * unexpected shape are never an error: the page says so. */
enum moe_status moe_profile_report_render(const struct moe_profile *p, const char *title, FILE *out);

/* moe_profile_report_write: render p to the file `path` atomically: first to
 * a new `<path>.tmp.<pid>[.<n>]` (moe_tmp_create: exclusive, never through a
 * symlink), flushed and fsynced, then renamed over path. On any
 * failure the temporary file is removed, path is left as it was, the cause is
 * logged and the error returned (MOE_ERR_IO when the file cannot be created,
 * written or renamed, e.g. in a directory that does not exist). */
enum moe_status moe_profile_report_write(const struct moe_profile *p, const char *title, const char *path);

#endif
