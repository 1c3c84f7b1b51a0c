/*
 * test-stages.c - every stage of the demo (scripts/demo.sh) on one committed
 * fixture model, through the CLIs, as a user would run them on a new
 * architecture:
 *   check -> quantize (two expert precisions) -> inspect --verify -> eval
 *   against the checkpoint -> moe-run (all resident, and with an --expert-mem
 *   budget so the expert store loads experts: same logits) -> profile (+ the
 *   bundle's tuning, the HTML report) -> fit-cache -> sensitivity ->
 *   bitwidth -> moe-run on the bit-width map.
 * Each stage must exit 0 and produce what the next one reads; the numbers
 * they print are checked for sanity (finite KL, a store that loaded experts,
 * every cache policy replayed), not against fixed values.
 * argv: moe-prep moe-run MODEL-NAME (a directory under tests/fixtures/models)
 * [ARCH] (the moe_arch_name the check must report).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-mmap.h"
#include "moe-test.h"

static const char *prep, *run;
static char tmp[] = "/tmp/test-stages-XXXXXX";

/* path: a file in the scratch directory. */
static const char *path(const char *name) {
    static char buf[8][512];
    static int i;
    char *b = buf[i++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", tmp, name);
    return b;
}

/* json_num: the number after the first "key": in s; NAN if absent. */
static double json_num(const char *s, const char *key) {
    char k[128];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *q = strstr(s, k);
    return q ? strtod(q + strlen(k), NULL) : NAN;
}

static int file_size_ok(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && sb.st_size > 0;
}

/* same_file: two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = moe_read_file(a, 1u << 30, &x, &nx) == MOE_OK && moe_read_file(b, 1u << 30, &y, &ny) == MOE_OK &&
               nx == ny && nx > 0 && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test-stages MOE-PREP MOE-RUN MODEL-NAME [ARCH]\n");
        return 2;
    }
    prep = argv[1], run = argv[2];
    const char *name = argv[3], *arch = argc > 4 ? argv[4] : NULL;
    char model[1024], text[1024];
    snprintf(model, sizeof model, "%s/models/%s", MOE_FIXTURES, name);
    snprintf(text, sizeof text, "%s/demo/calibration.txt", MOE_FIXTURES);
    if (!mkdtemp(tmp)) return 1;
    static char out[1 << 18];
    char bundle[600];
    snprintf(bundle, sizeof bundle, "%s/model.moeb", tmp);

    /* 1. check */
    CHECK(moe_test_sh_out(out, sizeof out, "%s check %s --json", prep, model) == 0, "check");
    CHECK(!arch || strstr(out, arch), "check reports the architecture %s: %.300s", arch, out);

    /* 2. quantize: two expert precisions side by side */
    CHECK(moe_test_sh_out(NULL, 0, "%s quantize %s -o %s --experts q8_0,q4_0 --dense q8_0 2>/dev/null", prep, model, bundle) == 0,
          "quantize");

    /* 3. inspect --verify */
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --verify", prep, bundle) == 0 && strstr(out, "all checksums match"),
          "inspect --verify: %.400s", out);

    /* 4. eval each precision against the checkpoint: small, finite KL; q8_0 closer than q4_0 */
    double kl[2] = {NAN, NAN};
    const char *precs[2] = {"q8_0", "q4_0"};
    for (int i = 0; i < 2; i++) {
        CHECK(moe_test_sh_out(out, sizeof out,
                 "%s eval %s --expert-precision %s --ref %s --dataset %s --ctx 64 --max-chunks 6 --json 2>/dev/null",
                 prep, bundle, precs[i], model, text) == 0,
              "eval %s", precs[i]);
        const char *k = strstr(out, "\"kld\"");
        kl[i] = k ? json_num(k, "mean") : NAN;
        if (isnan(kl[i])) kl[i] = json_num(out, "mean_kld");
        CHECK(isfinite(kl[i]) && kl[i] >= 0 && kl[i] < 1.0, "eval %s: mean KL %g: %.300s", precs[i], kl[i], out);
    }
    CHECK(kl[0] < kl[1], "q8_0 (KL %g) should be closer to the checkpoint than q4_0 (KL %g)", kl[0], kl[1]);

    /* 5. generate: all experts resident, then a budget of a few expert copies
     * (the store loads experts from the bundle): the same logits */
    const char *ids = "1,17,33,65,129,257,3,5,9";
    char gen_a[4096], gen_b[4096];
    CHECK(moe_test_sh_out(gen_a, sizeof gen_a,
             "%s -m %s --expert-precision q8_0 --tokens %s -n 12 --ids --ignore-eos --logits-out %s 2>/dev/null", run,
             bundle, ids, path("a.f32")) == 0,
          "moe-run resident");
    CHECK(moe_test_sh_out(gen_b, sizeof gen_b,
             "%s -m %s --expert-precision q8_0 --expert-mem 24KiB --stats-json %s --tokens %s -n 12 --ids "
             "--ignore-eos --logits-out %s 2>/dev/null",
             run, bundle, path("stats.json"), ids, path("b.f32")) == 0,
          "moe-run with --expert-mem");
    CHECK(!strcmp(gen_a, gen_b) && same_file(path("a.f32"), path("b.f32")),
          "the expert store changed the output: %s vs %s", gen_a, gen_b);
    char *stats = NULL;
    size_t len = 0;
    if (moe_read_file(path("stats.json"), 1 << 20, &stats, &len) == MOE_OK) {
        CHECK(strstr(stats, "\"store\"") && json_num(stats, "loads") > 0 && json_num(stats, "misses_high") > 0,
              "the store loaded no expert: %.400s", stats);
        free(stats);
    } else {
        CHECK(0, "no stats JSON");
    }

    /* 6. profile (writes the bundle's tuning) and its report */
    CHECK(moe_test_sh_out(NULL, 0, "%s profile %s --dataset %s -o %s --ctx 64 --max-tokens 2048 2>/dev/null", prep, bundle, text,
             path("profile.h5")) == 0,
          "profile");
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s", prep, bundle) == 0 && !strstr(out, "tuning      none"),
          "profile wrote no tuning: %.600s", out);
    CHECK(moe_test_sh_out(NULL, 0, "%s profile report %s -o %s 2>/dev/null", prep, path("profile.h5"), path("profile.html")) == 0 &&
              file_size_ok(path("profile.html")),
          "profile report");

    /* 7. fit-cache: every policy replayed on the profile */
    CHECK(moe_test_sh_out(out, sizeof out, "%s fit-cache %s --profile %s --cache-experts 6,3 --json 2>/dev/null", prep, bundle,
             path("profile.h5")) == 0,
          "fit-cache");
    static const char *const pol[] = {"lru", "lfu", "lhu", "twiddler", "hobbit", "belady"};
    for (size_t i = 0; i < sizeof pol / sizeof pol[0]; i++) {
        char q[64];
        snprintf(q, sizeof q, "\"%s", pol[i]);
        CHECK(strstr(out, q), "fit-cache JSON lacks policy %s", pol[i]);
    }

    /* 8. sensitivity and 9. bitwidth; then the bundle runs on its bit-width map */
    CHECK(moe_test_sh_out(NULL, 0, "%s sensitivity %s --dataset %s --low q4_0 --base q8_0 --ctx 64 --max-tokens 512 -o %s 2>/dev/null",
             prep, bundle, text, path("sens.h5")) == 0,
          "sensitivity");
    CHECK(moe_test_sh_out(out, sizeof out, "%s bitwidth %s --sensitivity %s --dataset %s --ctx 64 --max-loss 5%% 2>/dev/null", prep,
             bundle, path("sens.h5"), text) == 0 &&
              strstr(out, "chosen"),
          "bitwidth: %.400s", out);
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s --tokens %s -n 4 --ids --ignore-eos 2>&1", run, bundle, ids) == 0 &&
              strstr(out, "experts:"),
          "moe-run on the bit-width map: %.400s", out);

    printf("test-stages %s: %d checks, %s (KL q8_0 %.4g, q4_0 %.4g)\n", name, checks, fails ? "FAILED" : "ok", kl[0],
           kl[1]);
    if (!fails) moe_test_sh_out(NULL, 0, "rm -rf %s", tmp);
    return fails != 0;
}
