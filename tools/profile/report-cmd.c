/* report-cmd.c - `moe-prep profile report PROFILE.h5 -o REPORT.html`: reads
 * the profile, renders it with moe_profile_report_write (report.h) and says
 * how large the page is. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "moe-file.h"
#include "moe-opt.h"
#include "moe-prep.h"
#include "profile-h5.h"
#include "report.h"

#define CMD "profile report"
#define HELP_PRINTED 1

struct report_args {
    const char *in, *out, *title;
};

enum { O_TITLE = 256 };

static const struct moe_opt k_opts[] = {
    {"output", 'o', MOE_OPT_REQUIRED, "FILE", "HTML file to write"},
    {"title", O_TITLE, MOE_OPT_REQUIRED, "TEXT", "page title (default: from the model and the dataset)"},
    {"help", 'h', MOE_OPT_NONE, NULL, "this text"},
    {NULL, 0, 0, NULL, NULL},
};

/* report_usage: --help, with an example. */
static void report_usage(FILE *f) {
    fprintf(f, "usage: moe-prep profile report PROFILE.h5 -o REPORT.html [--title TEXT]\n"
               "\n"
               "Renders a routing profile written by `moe-prep profile` as one self-contained\n"
               "HTML page (inline CSS and SVG, no JavaScript, nothing fetched): expert\n"
               "popularity heat map and placement hit rate, HOBBIT score histograms with T1/T2,\n"
               "stacked-gate accuracy by distance, path dictionaries, reuse, big-little, and\n"
               "every other derived array. The page is written atomically.\n"
               "\noptions:\n");
    moe_opt_help(f, k_opts);
    fprintf(f, "\nexample:\n"
               "  moe-prep profile report mixtral.h5 -o mixtral.html --title \"Mixtral on wikitext\"\n");
}

static int on_option(void *ctx, const struct moe_opt *o, const char *v) {
    struct report_args *a = ctx;
    switch (o->key) {
    case 'h': report_usage(stdout); return HELP_PRINTED;
    case 'o': a->out = v; return 0;
    case O_TITLE: a->title = v; return 0;
    }
    return 2;
}

/* report_args: 0 ok, 1 help printed, 2 usage error (reported). */
static int report_args(int argc, char **argv, struct report_args *a) {
    memset(a, 0, sizeof *a);
    const struct moe_opt *tables[] = {k_opts};
    int first = argc;
    int rc = moe_opt_parse("moe-prep " CMD, argc, argv, 1, tables, 1, on_option, a, &first);
    if (rc) return rc;
    if (first < argc) a->in = argv[first];
    if (argc - first > 1) {
        fprintf(stderr, "moe-prep profile report: one PROFILE only (\"%s\" and \"%s\")\n", a->in, argv[first + 1]);
        return 2;
    }
    if (!a->in || !a->out || !*a->out) {
        fprintf(stderr, "moe-prep profile report: %s (see moe-prep profile report --help)\n",
                !a->in ? "no PROFILE.h5 given" : "no -o REPORT.html given");
        return 2;
    }
    return 0;
}

/* read_profile: the profile at path, if it has something to show; NULL
 * after a message. */
static struct moe_profile *read_profile(const char *path) {
    struct moe_profile *p = NULL;
    enum moe_status st = moe_profile_read(path, &p);
    if (st) {
        fprintf(stderr, "moe-prep profile report: cannot read %s: %s\n", path, moe_status_str(st));
        return NULL;
    }
    const double *score = NULL;
    if (moe_profile_n_tokens(p) == 0 && moe_profile_get_f64(p, "sensitivity.score", NULL, NULL, &score) != MOE_OK) {
        fprintf(stderr, "moe-prep profile report: %s holds no routing trace and no finished sensitivity results: "
                        "nothing to report\n", path);
        moe_profile_free(p);
        return NULL;
    }
    return p;
}

int moe_prep_profile_report(int argc, char **argv) {
    struct report_args a;
    int rc = report_args(argc, argv, &a);
    if (rc) return rc == HELP_PRINTED ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    if (moe_file_check_output(a.out, &a.in, 1)) { /* -o naming the profile would replace it */
        fprintf(stderr, "moe-prep profile report: refusing to write %s (see the message above)\n", a.out);
        return 2;
    }
    struct moe_profile *p = read_profile(a.in);
    if (!p) return 1;
    enum moe_status st = moe_profile_report_write(p, a.title, a.out);
    moe_profile_free(p);
    if (st) {
        fprintf(stderr, "moe-prep profile report: cannot write %s: %s (see the message above)\n", a.out,
                moe_status_str(st));
        return 1;
    }
    struct stat sb;
    long long kib = stat(a.out, &sb) == 0 ? ((long long)sb.st_size + 1023) / 1024 : 0;
    fprintf(stderr, "wrote %s (%lld KiB)\n", a.out, kib);
    return 0;
}
