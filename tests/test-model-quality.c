/*
 * test-model-quality.c - the trained demo model meets the project's quality bar,
 * measured by `moe-prep eval` on the held-out text of each training domain:
 *   - perplexity at most 0.35 x that of a unigram model with the same tokenizer
 *     (eval --unigram counts the unigram on the held-out text itself, a harder
 *     baseline than one counted on training text);
 *   - routing neither collapsed nor uniform: per MoE layer, the entropy of the
 *     expert load between 0.5 and 0.97 of its maximum;
 *   - at least one layer whose most-used expert differs between two domains.
 * argv[1] = moe-prep, argv[2] = the model directory (or bundle).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "moe-test.h"

#define MAX_DOMAINS 16
#define MAX_LAYERS 64

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test-model-quality MOE-PREP MODEL\n");
        return 2;
    }
    char held[2048];
    snprintf(held, sizeof held, "%s/heldout", argv[2]);
    DIR *d = opendir(held);
    if (!d) {
        fprintf(stderr, "test-model-quality: no %s\n", held);
        return 1;
    }
    char names[MAX_DOMAINS][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_DOMAINS)
        if (strstr(e->d_name, ".txt")) snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    closedir(d);
    CHECK(n >= 2, "need held-out text of at least two domains, found %d", n);
    int top[MAX_DOMAINS][MAX_LAYERS];
    int n_layers = 0;
    static char out[1 << 20];
    for (int i = 0; i < n; i++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "%s eval %s --dataset %s/%s --ctx 256 --unigram --routing --json 2>/dev/null",
                 argv[1], argv[2], held, names[i]);
        FILE *p = popen(cmd, "r");
        size_t len = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[len] = 0;
        int st = p ? pclose(p) : -1;
        CHECK(p && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: eval failed", names[i]);
        cJSON *j = cJSON_Parse(out);
        if (!j) {
            CHECK(0, "%s: no JSON", names[i]);
            continue;
        }
        double ppl = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "ppl"), "value")->valuedouble;
        double uni = cJSON_GetObjectItem(j, "unigram_ppl")->valuedouble;
        printf("  %-16s PPL %8.2f  unigram %8.2f  ratio %.3f  load entropy/max:", names[i], ppl, uni, ppl / uni);
        CHECK(ppl <= 0.35 * uni, "%s: PPL %.2f > 0.35 x unigram %.2f", names[i], ppl, uni);
        const cJSON *layer;
        int l = 0;
        cJSON_ArrayForEach(layer, cJSON_GetObjectItem(j, "routing")) {
            double h = cJSON_GetObjectItem(layer, "load_entropy_ratio")->valuedouble;
            printf(" %.2f", h);
            CHECK(h >= 0.5 && h <= 0.97, "%s: layer %d load entropy ratio %.3f outside [0.5, 0.97]", names[i], l, h);
            if (l < MAX_LAYERS) top[i][l] = cJSON_GetObjectItem(layer, "top_expert")->valueint;
            l++;
        }
        printf("\n");
        n_layers = l < MAX_LAYERS ? l : MAX_LAYERS;
        cJSON_Delete(j);
    }
    int differs = 0;
    for (int l = 0; l < n_layers; l++)
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++)
                if (top[a][l] != top[b][l]) {
                    if (!differs) printf("  layer %d: most-used expert %d on %s, %d on %s\n", l, top[a][l], names[a],
                                         top[b][l], names[b]);
                    differs = 1;
                }
    CHECK(differs, "no layer's most-used expert differs between domains");
    printf("test-model-quality: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}
