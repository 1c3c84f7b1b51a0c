/* profile-cli.h - the `moe-prep profile` subcommands and what record and
 * merge share. Each command returns the exit status: 0 ok, 1 failure, 2 usage
 * error. */
#ifndef MOE_PROFILE_CLI_H
#define MOE_PROFILE_CLI_H

#include "profile-h5.h"
#include "profile-results.h"

/* moe_prep_profile_merge: `moe-prep profile merge SHARD.h5... -o OUT.h5`. */
int moe_prep_profile_merge(int argc, char **argv);

/* moe_profile_finish: derive the results from p (moe_profile_derive), write
 * the profile to out, the CSV files to csv_dir (NULL = none) and the tuning
 * section of tuning_bundle (NULL = none), and print the summary (JSON with
 * json != 0) to stdout. cmd names the command in messages ("profile").
 * Returns the exit status. */
int moe_profile_finish(struct moe_profile *p, const struct moe_profile_targets *t, const char *out,
                       const char *csv_dir, const char *tuning_bundle, int json,
                       const struct moe_profile_labels *lb, const char *cmd);

#endif
