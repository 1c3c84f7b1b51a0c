/*
 * path-mass - EdgeMoE's path concentration on a recorded profile: how much of
 * the routing mass the most frequent activation paths cover (issue 25, item 3;
 * tests/bench/bench-claims.sh).
 *
 *   path-mass PROFILE.h5 [--top X]
 *
 * A path of order 1 is the pair (top-1 expert at MoE layer l-1, top-1 expert
 * at l), of order 2 the triple (l-2, l-1, l): the keys and targets of the
 * profile's path dictionaries. For each layer, every token's path is counted;
 * the paths are sorted by count and the share of the layer's tokens that the
 * most frequent X (default 0.2) of the E^(order+1) possible paths carry is
 * averaged over the layers (equal weight). Also printed: the same share over
 * the paths that occur at least once, and the share of possible paths that
 * occur. One JSON object on stdout. Exit 0 ok, 1 bad input, 2 usage.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe-trace.h"
#include "profile-h5.h"

static int cmp_desc(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* mass: the mean over layers of the share of tokens on the top `top` of all
 * possible paths (*all), of the occurring paths (*seen), and the occurring
 * share (*occ). Returns -1 when the table would be too large. */
static int mass(const struct moe_trace *t, int order, double top, double *all, double *seen, double *occ) {
    const int L = t->n_layers, E = t->n_experts, K = t->k;
    int64_t n_paths = 1;
    for (int i = 0; i <= order; i++) n_paths *= E;
    if (n_paths > (1 << 26) || L <= order) return -1;
    int64_t *cnt = malloc(sizeof *cnt * (size_t)n_paths);
    if (!cnt) return -1;
    const int64_t T = moe_trace_n_tokens(t);
    *all = *seen = *occ = 0;
    for (int l = order; l < L; l++) {
        memset(cnt, 0, sizeof *cnt * (size_t)n_paths);
        for (int64_t x = 0; x < T; x++) {
            int64_t key = 0;
            for (int j = l - order; j <= l; j++) key = key * E + t->experts[((size_t)x * L + j) * K];
            cnt[key]++;
        }
        qsort(cnt, (size_t)n_paths, sizeof *cnt, cmp_desc);
        int64_t n_occ = 0, sum_all = 0, sum_seen = 0;
        while (n_occ < n_paths && cnt[n_occ] > 0) n_occ++;
        const int64_t k_all = (int64_t)ceil(top * (double)n_paths), k_seen = (int64_t)ceil(top * (double)n_occ);
        for (int64_t i = 0; i < k_all; i++) sum_all += cnt[i];
        for (int64_t i = 0; i < k_seen; i++) sum_seen += cnt[i];
        *all += (double)sum_all / (double)T;
        *seen += (double)sum_seen / (double)T;
        *occ += (double)n_occ / (double)n_paths;
    }
    const int n = L - order;
    *all /= n, *seen /= n, *occ /= n;
    free(cnt);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    double top = 0.2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--top") && i + 1 < argc) {
            char *end;
            top = strtod(argv[++i], &end);
            if (*end || !(top > 0 && top <= 1)) {
                fprintf(stderr, "path-mass: --top needs a share in (0, 1], got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: path-mass PROFILE.h5 [--top X]\n"
                   "Share of the routing mass on the most frequent X (default 0.2) of the possible\n"
                   "activation paths (top-1 experts of layers l-1,l and l-2,l-1,l), as JSON.\n"
                   "example: path-mass profile.h5 --top 0.2\n");
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "path-mass: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "usage: path-mass PROFILE.h5 [--top X]\n");
        return 2;
    }
    struct moe_profile *p = NULL;
    if (moe_profile_read(path, &p) != MOE_OK) return 1;
    struct moe_trace t;
    moe_profile_trace(p, &t);
    if (moe_trace_n_tokens(&t) == 0) {
        fprintf(stderr, "path-mass: %s holds no routing trace\n", path);
        moe_profile_free(p);
        return 1;
    }
    printf("{\"profile\": \"%s\", \"layers\": %d, \"experts\": %d, \"k\": %d, \"tokens\": %lld, \"top\": %g", path,
           t.n_layers, t.n_experts, t.k, (long long)moe_trace_n_tokens(&t), top);
    for (int order = 1; order <= 2; order++) {
        double all, seen, occ;
        if (mass(&t, order, top, &all, &seen, &occ))
            printf(", \"order%d\": null", order);
        else
            printf(", \"order%d\": {\"mass_top_possible\": %.6f, \"mass_top_seen\": %.6f, \"paths_seen\": %.6f}", order,
                   all, seen, occ);
    }
    printf("}\n");
    moe_profile_free(p);
    return 0;
}
