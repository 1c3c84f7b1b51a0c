/* moe-prep.h - the subcommands of the moe-prep tool, each the CLI half of a
 * stage (a *-cmd.c file beside the stage's library: it parses, calls and
 * prints). Each gets argv with argv[0] = the subcommand's last word and
 * returns the process exit status: 0 ok, 1 failure, 2 usage error. */
#ifndef MOE_PREP_H
#define MOE_PREP_H

int moe_prep_check(int argc, char **argv);             /* tools/quantize/check-cmd.c */
int moe_prep_quantize(int argc, char **argv);          /* tools/quantize/quantize-cmd.c */
int moe_prep_inspect(int argc, char **argv);           /* tools/quantize/inspect-cmd.c */
int moe_prep_eval(int argc, char **argv);              /* tools/quantize/eval-cmd.c */
int moe_prep_profile(int argc, char **argv);           /* tools/profile/profile-cmd.c */
int moe_prep_profile_merge(int argc, char **argv);     /* tools/profile/profile-merge-cmd.c */
int moe_prep_profile_report(int argc, char **argv);    /* tools/profile/report-cmd.c */
int moe_prep_sensitivity(int argc, char **argv);       /* tools/quantize/sensitivity-cmd.c */
int moe_prep_sensitivity_merge(int argc, char **argv); /* tools/quantize/sensitivity-cmd.c */
int moe_prep_bitwidth(int argc, char **argv);          /* tools/quantize/bitwidth-cmd.c */
int moe_prep_fit_cache(int argc, char **argv);         /* tools/calibrate/fit-cache-cmd.c */
int moe_prep_hw(int argc, char **argv);                /* tools/plan/hw-cmd.c */
int moe_prep_plan(int argc, char **argv);              /* tools/plan/plan-cmd.c */

#endif
