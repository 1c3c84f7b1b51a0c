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
 *
 * With --full (issue 25: the fine-grained trained model, many small experts)
 * the stages go further, each a small run so the test stays within a minute:
 * quantize at q8_0,q4_k,q2_k (a k-quant that does not fit the expert's down
 * rows falls back to a 32-element type, with a note, and inspect shows it),
 * eval, moe-run with a 25 % budget, profile (T1 <= T2 and the three shares,
 * stacked-gate accuracy 1..4 layers ahead, the path dictionaries, Twiddler's
 * placement, big-little with K/2 experts and gamma), big-little through eval
 * (gamma 0: no fallback; gamma 1: every token falls back and equals top-K) and
 * moe-run, fit-cache (every policy and the offline bound), sensitivity and
 * bitwidth at a 2 % budget, moe-prep hw and plan --apply, then moe-run on the
 * plan.
 *
 * argv: [--full] moe-prep moe-run MODEL [ARCH]. MODEL is a directory under
 * tests/fixtures/models, or a checkpoint directory when it contains a '/'
 * (then a MODEL without model.safetensors is skipped: exit 77, and the
 * environment variable MOE_STAGES_MODEL, when set, replaces it: a scratch
 * checkpoint of the same shape while the real one trains). ARCH: the
 * moe_arch_name the check must report.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

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

/* jget: the item at a dotted path of a JSON object ("a.b"); NULL if absent. */
static const cJSON *jget(const cJSON *o, const char *dotted) {
    char key[128];
    while (o && *dotted) {
        size_t n = strcspn(dotted, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, dotted);
        o = cJSON_GetObjectItemCaseSensitive(o, key);
        dotted += n + (dotted[n] == '.');
    }
    return o;
}

/* jnum: the number at a dotted path; NAN if absent or not a number. */
static double jnum(const cJSON *o, const char *dotted) {
    const cJSON *v = jget(o, dotted);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* jparse: the JSON object that begins at the first '{' of s (NULL if none). */
static cJSON *jparse(const char *s) {
    const char *b = strchr(s, '{');
    return b ? cJSON_Parse(b) : NULL;
}

/* jfile: a JSON file parsed (NULL if unreadable). */
static cJSON *jfile(const char *p) {
    char *text = NULL;
    size_t len = 0;
    cJSON *j = moe_read_file(p, 1 << 24, &text, &len) == MOE_OK ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static int in01(double x) { return x >= 0 && x <= 1; }

static char out[1 << 20];

/* full_stages: the stages of a fine-grained model (see the head comment),
 * each with small limits. */
static void full_stages(const char *model, const char *text, const char *arch) {
    static char bundle[600]; /* path()'s buffers rotate */
    snprintf(bundle, sizeof bundle, "%s", path("model.moeb"));
    const char *ids = "1,17,33,65,129,257,3,5,9";

    /* 1. check: the shape the later checks need */
    CHECK(moe_test_sh_out(out, sizeof out, "%s check %s --json", prep, model) == 0, "check");
    cJSON *ck = jparse(out);
    const int K = (int)jnum(ck, "experts_per_token"), E = (int)jnum(ck, "experts"), F = (int)jnum(ck, "expert_ffn");
    CHECK(!arch || (cJSON_IsString(jget(ck, "arch")) && !strcmp(jget(ck, "arch")->valuestring, arch)),
          "check reports the architecture %s: %.300s", arch, out);
    cJSON_Delete(ck);
    CHECK(K >= 2 && E > K && F > 0, "check: K %d, E %d, F %d", K, E, F);
    if (K < 2 || E <= K || F <= 0) return;

    /* 2. quantize at three precisions; a k-quant (256-element blocks) that
     * does not fit the down matrix's rows of F falls back to q4_0, said once
     * per precision, and inspect shows each part's type */
    CHECK(moe_test_sh_out(out, sizeof out, "%s quantize %s -o %s --experts q8_0,q4_k,q2_k --dense q8_0 2>&1 >/dev/null",
             prep, model, bundle) == 0,
          "quantize: %.600s", out);
    const int kq_fits = F % 256 == 0;
    for (int i = 0; i < 2; i++) {
        const char *p = i ? "q2_k" : "q4_k";
        char note[128];
        snprintf(note, sizeof note, "experts down (%s): %s -> q4_0 (rows of %d)", p, p, F);
        CHECK((strstr(out, note) == NULL) == kq_fits, "quantize %s a fallback note \"%s\": %.600s", kq_fits ? "gave" : "lacks",
              note, out);
    }
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --json", prep, bundle) == 0, "inspect --json");
    cJSON *in = jparse(out);
    const cJSON *precs = jget(in, "precisions"), *pr;
    int seen = 0;
    cJSON_ArrayForEach(pr, precs) {
        const cJSON *name = jget(pr, "name"), *parts = jget(pr, "part_types");
        if (!cJSON_IsString(name) || cJSON_GetArraySize(parts) != 3) continue;
        const int kq = !strcmp(name->valuestring, "q4_k") || !strcmp(name->valuestring, "q2_k");
        const char *want_down = kq && !kq_fits ? "q4_0" : name->valuestring;
        const cJSON *g = cJSON_GetArrayItem(parts, 0), *d = cJSON_GetArrayItem(parts, 2);
        CHECK(cJSON_IsString(g) && !strcmp(g->valuestring, name->valuestring) && cJSON_IsString(d) &&
                  !strcmp(d->valuestring, want_down),
              "precision %s: gate %s, down %s (expected %s, %s)", name->valuestring,
              cJSON_IsString(g) ? g->valuestring : "?", cJSON_IsString(d) ? d->valuestring : "?", name->valuestring,
              want_down);
        seen++;
    }
    cJSON_Delete(in);
    CHECK(seen == 3, "inspect lists %d precisions with their part types, expected 3", seen);

    /* 3. inspect --verify */
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --verify", prep, bundle) == 0 && strstr(out, "all checksums match"),
          "inspect --verify: %.400s", out);

    /* 4. eval the largest and the smallest precision against the checkpoint */
    double kl[2] = {NAN, NAN};
    const char *ev[2] = {"q8_0", "q2_k"};
    for (int i = 0; i < 2; i++) {
        CHECK(moe_test_sh_out(out, sizeof out,
                 "%s eval %s --expert-precision %s --ref %s --dataset %s --ctx 64 --max-chunks 4 --json 2>/dev/null", prep,
                 bundle, ev[i], model, text) == 0,
              "eval %s", ev[i]);
        cJSON *j = jparse(out);
        kl[i] = jnum(j, "kld.mean");
        cJSON_Delete(j);
        CHECK(isfinite(kl[i]) && kl[i] >= 0 && kl[i] < 1.0, "eval %s: mean KL %g", ev[i], kl[i]);
    }
    CHECK(kl[0] < kl[1], "q8_0 (KL %g) should be closer to the checkpoint than q2_k (KL %g)", kl[0], kl[1]);

    /* 5. moe-run all resident and with a quarter of the expert bytes: the same logits */
    char gen_a[4096], gen_b[4096];
    CHECK(moe_test_sh_out(gen_a, sizeof gen_a,
             "%s -m %s --expert-precision q8_0 --tokens %s -n 12 --ids --ignore-eos --logits-out %s 2>/dev/null", run,
             bundle, ids, path("a.f32")) == 0,
          "moe-run resident");
    CHECK(moe_test_sh_out(gen_b, sizeof gen_b,
             "%s -m %s --expert-precision q8_0 --expert-mem 25%% --stats-json %s --tokens %s -n 12 --ids --ignore-eos "
             "--logits-out %s 2>/dev/null",
             run, bundle, path("stats.json"), ids, path("b.f32")) == 0,
          "moe-run with --expert-mem 25%%");
    CHECK(!strcmp(gen_a, gen_b) && same_file(path("a.f32"), path("b.f32")),
          "the expert store changed the output: %s vs %s", gen_a, gen_b);
    cJSON *stj = jfile(path("stats.json"));
    CHECK(jnum(stj, "store.loads") > 0 && jnum(stj, "store.misses_high") > 0, "the store loaded no expert");
    cJSON_Delete(stj);

    /* 6. profile: every derived figure present and in range */
    CHECK(moe_test_sh_out(out, sizeof out,
             "%s profile %s --dataset %s -o %s --ctx 64 --max-tokens 1024 --big-little-every 2 --csv-dir %s --json "
             "2>/dev/null",
             prep, bundle, text, path("profile.h5"), path("csv")) == 0,
          "profile");
    cJSON *pj = jparse(out);
    const double t1 = jnum(pj, "hobbit.t1"), t2 = jnum(pj, "hobbit.t2"), hi = jnum(pj, "hobbit.high"),
                 lo = jnum(pj, "hobbit.low"), sk = jnum(pj, "hobbit.skip"), r = jnum(pj, "gate_output_pearson");
    CHECK(in01(t1) && in01(t2) && t1 <= t2 && in01(hi) && in01(lo) && in01(sk) && fabs(hi + lo + sk - 1) < 1e-6,
          "HOBBIT: T1 %g T2 %g, shares %g %g %g", t1, t2, hi, lo, sk);
    CHECK(r >= -1 && r <= 1, "gate weight vs output norm: Pearson r %g", r);
    CHECK(jnum(pj, "k") == K && jnum(pj, "experts") == E, "profile: K %g, E %g", jnum(pj, "k"), jnum(pj, "experts"));
    const cJSON *stacked = jget(pj, "stacked");
    CHECK(cJSON_GetArraySize(stacked) == 4, "stacked gate: %d distances, expected 1..4", cJSON_GetArraySize(stacked));
    for (int d = 0; d < cJSON_GetArraySize(stacked); d++) {
        const cJSON *e = cJSON_GetArrayItem(stacked, d);
        CHECK(jnum(e, "distance") == d + 1 && in01(jnum(e, "top1")) && in01(jnum(e, "recall")),
              "stacked gate at distance %d: top-1 %g, recall %g", d + 1, jnum(e, "top1"), jnum(e, "recall"));
    }
    CHECK(cJSON_GetArraySize(jget(pj, "paths")) == 2, "profile: path dictionaries of order 1 and 2");
    const cJSON *pl;
    int n_pl = 0;
    cJSON_ArrayForEach(pl, jget(pj, "placement")) n_pl += in01(jnum(pl, "hit_rate")) && in01(jnum(pl, "resident"));
    CHECK(n_pl == 3, "placement: %d resident shares with a hit rate, expected 3", n_pl);
    const double gamma = jnum(pj, "big_little.gamma");
    CHECK(jnum(pj, "big_little.little_k") == K / 2 && in01(gamma) && in01(jnum(pj, "big_little.fallback")) &&
              cJSON_GetArraySize(jget(pj, "big_little.grid")) > 0,
          "big-little: little K %g (expected %d), gamma %g", jnum(pj, "big_little.little_k"), K / 2, gamma);
    cJSON_Delete(pj);
    static const char *const csv[] = {"hobbit.csv", "stacked.csv", "paths.csv", "placement.csv", "big_little.csv"};
    for (size_t i = 0; i < sizeof csv / sizeof csv[0]; i++) {
        char c[64];
        snprintf(c, sizeof c, "csv/%s", csv[i]);
        CHECK(file_size_ok(path(c)), "profile --csv-dir wrote no %s", csv[i]);
    }
    CHECK(moe_test_sh_out(out, sizeof out, "%s inspect %s --json", prep, bundle) == 0 && strstr(out, "\"hobbit.t1\"") &&
              strstr(out, "\"mobile.gamma\""),
          "profile wrote no T1 or gamma into the tuning");

    /* 7. big-little with K/2 experts: gamma 0 is the little model alone,
     * gamma 1 falls back on every token and scores exactly as top-K */
    for (int g = 0; g <= 1; g++) {
        CHECK(moe_test_sh_out(out, sizeof out,
                 "%s eval %s --ref %s --dataset %s --ctx 64 --max-chunks 2 --little-k %d --gamma %d --json 2>/dev/null",
                 prep, bundle, bundle, text, K / 2, g) == 0,
              "eval --little-k %d --gamma %d", K / 2, g);
        cJSON *j = jparse(out);
        const double fb = jnum(j, "big_little.fallback_ratio"), k = jnum(j, "kld.mean");
        CHECK(jnum(j, "big_little.little_k") == K / 2 && fb == g && (g == 0 ? k > 0 : k == 0),
              "big-little gamma %d: little K %g, fallback %g, KL %g", g, jnum(j, "big_little.little_k"), fb, k);
        cJSON_Delete(j);
    }
    CHECK(moe_test_sh_out(NULL, 0,
             "%s -m %s --expert-mem 25%% --little-k %d --tokens %s -n 12 --ids --ignore-eos --stats-json %s "
             ">/dev/null 2>&1",
             run, bundle, K / 2, ids, path("bl.json")) == 0,
          "moe-run --little-k %d", K / 2);
    cJSON *bl = jfile(path("bl.json"));
    CHECK(jnum(bl, "big_little.little_k") == K / 2 && jnum(bl, "big_little.k") == K &&
              jnum(bl, "big_little.tokens") > 0 && in01(jnum(bl, "big_little.fallback_ratio")) &&
              fabs(jnum(bl, "big_little.gamma") - gamma) < 1e-6,
          "moe-run big-little stats: little K %g, K %g, gamma %g (the profile's %g)", jnum(bl, "big_little.little_k"),
          jnum(bl, "big_little.k"), jnum(bl, "big_little.gamma"), gamma);
    cJSON_Delete(bl);

    /* 8. fit-cache at an eighth of the experts: every policy and the offline bound */
    CHECK(moe_test_sh_out(out, sizeof out,
             "%s fit-cache %s --profile %s --cache-experts %d,%d --sizes %d --fit-once --opt-iters 200 "
             "--opt-seconds 2 --json 2>/dev/null",
             prep, bundle, path("profile.h5"), E * K / 8 + K, E * K / 16 + K, E * K / 8 + K) == 0,
          "fit-cache");
    static const char *const pol[] = {"lru", "lfu", "lhu", "twiddler", "hobbit", "belady", "offline_optimum"};
    for (size_t i = 0; i < sizeof pol / sizeof pol[0]; i++) {
        char q[64];
        snprintf(q, sizeof q, "\"%s", pol[i]);
        CHECK(strstr(out, q), "fit-cache JSON lacks %s", pol[i]);
    }

    /* 9. sensitivity (a few sequences) and the bit-width search within 2 %;
     * then the bundle runs on its map */
    CHECK(moe_test_sh_out(NULL, 0,
             "%s sensitivity %s --dataset %s --low q2_k --base q8_0 --ctx 32 --max-tokens 128 -o %s >/dev/null 2>&1",
             prep, bundle, text, path("sens.h5")) == 0,
          "sensitivity");
    CHECK(moe_test_sh_out(out, sizeof out,
             "%s bitwidth %s --sensitivity %s --dataset %s --ctx 64 --max-chunks 2 --max-loss 2%% 2>/dev/null", prep,
             bundle, path("sens.h5"), text) == 0 &&
              strstr(out, "chosen"),
          "bitwidth: %.400s", out);
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s --tokens %s -n 4 --ids --ignore-eos 2>&1", run, bundle, ids) == 0 &&
              strstr(out, "experts:"),
          "moe-run on the bit-width map: %.400s", out);

    /* 10. this machine's numbers, a plan for a small memory size, and moe-run on it */
    CHECK(moe_test_sh_out(NULL, 0, "%s hw %s --hw %s >/dev/null 2>&1", prep, bundle, path("hw.json")) == 0, "hw");
    CHECK(moe_test_sh_out(out, sizeof out,
             "%s plan %s --profile %s --mem 40M --ctx 256 --prompt-len 16 --hw %s --no-measure --top 2 --apply "
             "2>/dev/null",
             prep, bundle, path("profile.h5"), path("hw.json")) == 0 &&
              strstr(out, "chosen"),
          "plan: %.600s", out);
    CHECK(!strstr(out, " nan "), "plan predicted no speed: %.600s", out);
    CHECK(moe_test_sh_out(out, sizeof out, "%s -m %s --tokens %s -n 8 --ids --ignore-eos 2>&1", run, bundle, ids) == 0 &&
              strstr(out, "using the bundle's plan"),
          "moe-run on the plan: %.600s", out);
}

int main(int argc, char **argv) {
    int full = argc > 1 && !strcmp(argv[1], "--full");
    argc -= full, argv += full;
    if (argc < 4) {
        fprintf(stderr, "usage: test-stages [--full] MOE-PREP MOE-RUN MODEL [ARCH]\n");
        return 2;
    }
    prep = argv[1], run = argv[2];
    const char *name = argv[3], *arch = argc > 4 ? argv[4] : NULL;
    char model[1024], text[1100];
    if (strchr(name, '/')) { /* a checkpoint directory: skipped while it has no weights */
        const char *env = getenv("MOE_STAGES_MODEL");
        if (env && *env) name = env;
        if (strlen(name) >= sizeof model) return 2;
        snprintf(model, sizeof model, "%s", name);
        snprintf(text, sizeof text, "%s/model.safetensors", model);
        struct stat sb;
        if (stat(text, &sb) != 0) {
            printf("test-stages: %s has no model.safetensors (not trained yet): skipped\n", model);
            return 77;
        }
        snprintf(text, sizeof text, "%s/heldout/python_docs.txt", model);
        if (stat(text, &sb) != 0) snprintf(text, sizeof text, "%s/demo/calibration.txt", MOE_FIXTURES);
    } else {
        snprintf(model, sizeof model, "%s/models/%s", MOE_FIXTURES, name);
        snprintf(text, sizeof text, "%s/demo/calibration.txt", MOE_FIXTURES);
    }
    if (!mkdtemp(tmp)) return 1;
    if (full) {
        full_stages(model, text, arch);
        printf("test-stages --full %s: %d checks, %s\n", model, checks, fails ? "FAILED" : "ok");
        if (!fails) moe_test_sh_out(NULL, 0, "rm -rf %s", tmp);
        return fails != 0;
    }
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
