/* profile-finish.c - the step `moe-prep profile` and `profile merge` share
 * once they hold a profile (profile-results.h, moe_profile_finish): derive,
 * write the profile, CSV files and tuning, print the summary. */
#include <stdio.h>

#include "profile-results.h"

int moe_profile_finish(struct moe_profile *p, const struct moe_profile_targets *t, const struct moe_profile_outputs *o,
                       const struct moe_profile_labels *lb, const char *cmd) {
    struct moe_profile_results r;
    enum moe_status st;
    int n_keys = 0, status = 1;
    if ((st = moe_profile_derive(p, t, &r))) {
        fprintf(stderr, "moe-prep %s: cannot compute the derived results: %s\n", cmd, moe_status_str(st));
        return 1;
    }
    if ((st = moe_profile_write(p, o->out))) {
        fprintf(stderr, "moe-prep %s: cannot write %s: %s\n", cmd, o->out, moe_status_str(st));
        goto done;
    }
    if (o->csv_dir && (st = moe_profile_write_csv(o->csv_dir, p, &r))) {
        fprintf(stderr, "moe-prep %s: cannot write the CSV files into %s: %s\n", cmd, o->csv_dir, moe_status_str(st));
        goto done;
    }
    if (o->tuning_bundle && (st = moe_profile_write_tuning(o->tuning_bundle, p, &r, &n_keys))) {
        fprintf(stderr, "moe-prep %s: %s was written, but the tuning section of %s was not: %s\n", cmd, o->out,
                o->tuning_bundle, moe_status_str(st));
        goto done;
    }
    if (o->json && (st = moe_profile_print_json(stdout, p, &r, lb))) {
        fprintf(stderr, "moe-prep %s: cannot print the summary: %s\n", cmd, moe_status_str(st));
        goto done;
    }
    if (!o->json) moe_profile_print_summary(stdout, p, &r, lb);
    fflush(stdout);
    if (o->tuning_bundle)
        fprintf(stderr, "moe-prep %s: wrote T1/T2, the placement order, the path dictionaries%s into the tuning "
                        "section of %s (%d keys)\n", cmd, r.little_k ? " and gamma" : "", o->tuning_bundle, n_keys);
    if (o->csv_dir) fprintf(stderr, "moe-prep %s: wrote CSV summaries into %s\n", cmd, o->csv_dir);
    status = 0;
done:
    moe_profile_results_free(&r);
    return status;
}
