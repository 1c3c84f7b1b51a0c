/* moe-prep.h - the subcommands of the moe-prep tool. Each returns the process
 * exit status: 0 ok, 1 failure, 2 usage error. */
#ifndef MOE_PREP_H
#define MOE_PREP_H

int moe_prep_check(int argc, char **argv);
int moe_prep_quantize(int argc, char **argv);
int moe_prep_inspect(int argc, char **argv);
int moe_prep_eval(int argc, char **argv);
int moe_prep_profile(int argc, char **argv);        /* tools/profile/profile-cmd.c */
int moe_prep_profile_merge(int argc, char **argv);  /* tools/profile/profile-merge-cmd.c */
int moe_prep_profile_report(int argc, char **argv); /* tools/profile/report-cmd.c */
int moe_prep_sensitivity(int argc, char **argv); /* tools/quantize/sensitivity.c */
int moe_prep_bitwidth(int argc, char **argv);    /* tools/quantize/bitwidth.c */
int moe_prep_fit_cache(int argc, char **argv);   /* tools/calibrate/fit-cache.c */
int moe_prep_hw(int argc, char **argv);          /* tools/plan/hw-cmd.c */
int moe_prep_plan(int argc, char **argv);        /* tools/plan/plan-cmd.c */

#endif
