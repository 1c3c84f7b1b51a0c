/* tool-util.h - small helpers shared by the moe-prep subcommands. */
#ifndef MOE_TOOL_UTIL_H
#define MOE_TOOL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe-status.h"

struct cJSON;

/* moe_tool_json_num: key = v in object o, or null when v is not finite (JSON
 * has no NaN or infinity). */
void moe_tool_json_num(struct cJSON *o, const char *key, double v);

/* moe_tool_json_str: key = s in object o, or null when s is NULL. */
void moe_tool_json_str(struct cJSON *o, const char *key, const char *s);

/* moe_tool_parse_double / moe_tool_parse_ll: option `opt`'s value v as a
 * number in [lo, hi]; on a bad value print "moe-prep CMD: OPT wants ..." to
 * stderr and return 0 (the caller exits 2), else store it and return 1. */
int moe_tool_parse_double(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out);
int moe_tool_parse_ll(const char *cmd, const char *opt, const char *v, long long lo, long long hi, long long *out);

/* moe_tool_parse_size: option `opt`'s value v as a byte count: a number
 * with an optional unit B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB,
 * TB (powers of 1000), case-insensitive, e.g. "2GiB", "1.5 GB", "1048576";
 * at least 1 byte. On a bad value print "moe-prep CMD: OPT wants a size ..."
 * and return 0, else store the whole bytes and return 1. */
int moe_tool_parse_size(const char *cmd, const char *opt, const char *v, long long *out);

struct moe_model;

/* moe_tool_output_ok: 1 if `output` (NULL = none) is none of the files the
 * command reads: the model's files (m may be NULL; moe_model_check_output),
 * the data files of the dataset specs datasets[0..n_datasets) and the paths
 * files[0..n_files) (NULL entries skipped); compared by device and inode.
 * Otherwise the reason is logged, "moe-prep CMD: refusing to write OUTPUT"
 * printed, and 0 returned (the caller exits 2). */
int moe_tool_output_ok(const char *cmd, const char *output, const struct moe_model *m,
                       const char *const *datasets, size_t n_datasets, const char *const *files, size_t n_files);

#endif
