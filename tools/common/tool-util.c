/* tool-util.c - small helpers shared by the moe-prep subcommands. */
#include "tool-util.h"

#include "moe-base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <strings.h>

#include "token-stream.h"
#include "moe-dataset.h"
#include "moe-file.h"
#include "moe-model.h"

void moe_tool_json_num(struct cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

void moe_tool_json_str(struct cJSON *o, const char *key, const char *s) {
    if (s) cJSON_AddStringToObject(o, key, s);
    else cJSON_AddNullToObject(o, key);
}

int moe_tool_parse_double(const char *cmd, const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "moe-prep %s: %s wants a number in [%g, %g], not \"%s\"\n", cmd, opt, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int moe_tool_parse_ll(const char *cmd, const char *opt, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "moe-prep %s: %s wants an integer in [%lld, %lld], not \"%s\"\n", cmd, opt, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int moe_tool_parse_size(const char *cmd, const char *opt, const char *v, long long *out) {
    int64_t b = 0;
    if (moe_parse_size(v, &b) == MOE_OK && b >= 1) {
        *out = (long long)b;
        return 1;
    }
    fprintf(stderr, "moe-prep %s: %s wants a size such as 2G (= 2GiB), 512M, 1.5GB (decimal) or 1048576 (bytes), "
                    "not \"%s\"\n", cmd, opt, v);
    return 0;
}

int moe_tool_output_ok(const char *cmd, const char *output, const struct moe_model *m,
                       const char *const *datasets, size_t n_datasets, const char *const *files, size_t n_files) {
    if (!output) return 1;
    enum moe_status st = m ? moe_model_check_output(m, output) : MOE_OK;
    if (!st) st = moe_file_check_output(output, files, n_files);
    for (size_t i = 0; !st && i < n_datasets; i++) {
        struct moe_dataset_spec *spec = NULL;
        if (!datasets[i] || moe_dataset_spec_parse(datasets[i], &spec) != MOE_OK) continue; /* reported when read */
        const char *in[2] = {spec->path, spec->card_path};
        st = moe_file_check_output(output, in, 2);
        moe_dataset_spec_free(spec);
    }
    if (st) fprintf(stderr, "moe-prep %s: refusing to write %s (see the message above)\n", cmd, output);
    return st == MOE_OK;
}

