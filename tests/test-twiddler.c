/*
 * test-twiddler.c - Twiddler / Fiddler's latency model and decisions
 * (runtime/offload/twiddler.c) on simulated latency tables:
 *   - curves interpolate, clamp below and extrapolate above as documented;
 *   - the rule: resident -> GPU; otherwise CPU exactly while
 *     cpu(s) <= transfer + gpu(s), at the crossover computed by hand from
 *     linear curves; never / always;
 *   - the layer time is the max of the CPU side and the GPU pipeline, checked
 *     against a hand computation;
 *   - the planner is never slower in the model than the rule, all-GPU or
 *     all-CPU (random tables), keeps resident experts on the GPU, and splits a
 *     layer the rule would pile onto the CPU;
 *   - cache files round-trip, malformed ones are refused, the cache path
 *     follows XDG_CACHE_HOME and HOME.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe-test.h"
#include "moe-twiddler.h"

/* linear_entry: transfer T, gpu(s) = g0 + g1 s, cpu(s) = c1 s, sampled at 1, 2, 4, ..., 256. */
static struct moe_lat_entry linear_entry(int prec, double T, double g0, double g1, double c1) {
    struct moe_lat_entry e;
    memset(&e, 0, sizeof e);
    e.prec = prec;
    e.bytes = 1 << 20;
    e.transfer_s = T;
    for (int s = 1; s <= 256; s *= 2) {
        moe_lat_curve_add(&e.gpu, s, g0 + g1 * s);
        moe_lat_curve_add(&e.cpu, s, c1 * s);
    }
    return e;
}

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(a) + fabs(b) + 1e-30); }

static void curves(void) {
    struct moe_lat_curve c;
    memset(&c, 0, sizeof c);
    CHECK(isinf(moe_lat_curve_eval(&c, 3)), "an empty curve is never chosen");
    CHECK(moe_lat_curve_add(&c, 2, 1.0) == MOE_OK && moe_lat_curve_add(&c, 4, 3.0) == MOE_OK, "add points");
    CHECK(moe_lat_curve_add(&c, 4, 5.0) == MOE_ERR_INVALID, "token counts must rise");
    CHECK(moe_lat_curve_add(&c, 8, 0.0) == MOE_ERR_INVALID && moe_lat_curve_add(&c, 8, NAN) == MOE_ERR_INVALID,
          "times must be positive and finite");
    CHECK(near(moe_lat_curve_eval(&c, 1), 1.0) && near(moe_lat_curve_eval(&c, 3), 2.0), "below and between points");
    CHECK(near(moe_lat_curve_eval(&c, 10), 3.0 + 6.0), "above: along the last slope (1 per token)");
    struct moe_lat_curve d;
    memset(&d, 0, sizeof d);
    moe_lat_curve_add(&d, 1, 5.0);
    moe_lat_curve_add(&d, 2, 4.0);
    CHECK(near(moe_lat_curve_eval(&d, 100), 4.0), "a falling last segment is extended flat");
    for (int i = 0; i < MOE_LAT_MAX_POINTS; i++) moe_lat_curve_add(&d, 10 + i, 1.0);
    CHECK(d.n == MOE_LAT_MAX_POINTS && moe_lat_curve_add(&d, 1000, 1.0) == MOE_ERR_RANGE, "a full curve refuses more");
}

static void rule(void) {
    /* T = 4 ms, gpu = 1 ms + 0.01 ms/token, cpu = 0.5 ms/token: CPU iff 0.5 s <= 5 + 0.01 s, s <= 10.2 */
    struct moe_lat_entry e = linear_entry(0, 4e-3, 1e-3, 1e-5, 5e-4);
    for (int s = 1; s <= 300; s++) {
        const int want = 0.5 * s <= 5.0 + 0.01 * s;
        CHECK(moe_twiddler_rule(&e, s, 0, MOE_CPU_EXPERTS_AUTO) == want, "s = %d: %s expected", s, want ? "CPU" : "GPU");
        CHECK(moe_twiddler_rule(&e, s, 1, MOE_CPU_EXPERTS_AUTO) == 0 && moe_twiddler_rule(&e, s, 1, MOE_CPU_EXPERTS_ALWAYS) == 0,
              "s = %d: resident experts run on the GPU", s);
        CHECK(moe_twiddler_rule(&e, s, 0, MOE_CPU_EXPERTS_NEVER) == 0 && moe_twiddler_rule(&e, s, 0, MOE_CPU_EXPERTS_ALWAYS) == 1,
              "s = %d: never / always", s);
    }
    CHECK(moe_twiddler_rule(&e, 10, 0, MOE_CPU_EXPERTS_AUTO) == 1 && moe_twiddler_rule(&e, 11, 0, MOE_CPU_EXPERTS_AUTO) == 0,
          "the crossover lies between 10 and 11 tokens");
    CHECK(moe_twiddler_rule(NULL, 1, 0, MOE_CPU_EXPERTS_AUTO) == 0, "unmeasured: GPU");
    /* unified memory: no transfer; a CPU slower than the GPU never wins */
    struct moe_lat_entry u = linear_entry(0, 0, 1e-3, 1e-5, 2e-3);
    CHECK(moe_twiddler_rule(&u, 1, 0, MOE_CPU_EXPERTS_AUTO) == 0, "no transfer, slower CPU: GPU");
    enum moe_cpu_experts m;
    CHECK(moe_cpu_experts_parse("always", &m) == MOE_OK && m == MOE_CPU_EXPERTS_ALWAYS &&
              moe_cpu_experts_parse("sometimes", &m) == MOE_ERR_INVALID && !strcmp(moe_cpu_experts_name(MOE_CPU_EXPERTS_NEVER), "never"),
          "parse and name the modes");
}

static void layer_time(void) {
    struct moe_lat_entry e = linear_entry(0, 4e-3, 1e-3, 0, 5e-4);
    struct moe_twiddler_item it[4] = {{2, 1, &e}, {3, 0, &e}, {4, 0, &e}, {6, 0, &e}};
    uint8_t host[4] = {0, 0, 1, 0};
    struct moe_twiddler_time t;
    moe_twiddler_layer_time(4, it, host, &t);
    /* resident: 1 ms; copies end at 4 and 8 ms; computes: max(1,4)+1 = 5, max(5,8)+1 = 9 ms; CPU: 4 x 0.5 = 2 ms */
    CHECK(near(t.gpu_s, 9e-3) && near(t.cpu_s, 2e-3) && near(t.layer_s, 9e-3) && t.n_cpu == 1 && t.n_copied == 2,
          "pipeline %g / cpu %g / layer %g", t.gpu_s, t.cpu_s, t.layer_s);
    host[0] = 1; /* a resident expert forced onto the CPU counts there */
    moe_twiddler_layer_time(4, it, host, &t);
    CHECK(near(t.cpu_s, 3e-3) && near(t.gpu_s, 4e-3 + 1e-3 + 4e-3 + 1e-3 - 1e-3), "resident on the CPU: cpu %g gpu %g",
          t.cpu_s, t.gpu_s);
}

static double urand(unsigned *st) {
    *st = *st * 1103515245u + 12345u;
    return (double)((*st >> 8) & 0xffff) / 65536.0;
}

static void planner(void) {
    /* four experts of 2 tokens: each is cheaper on the CPU (1 ms) than copied (1.2 ms),
     * so the rule puts all four there (4 ms); splitting them is faster */
    struct moe_lat_entry e = linear_entry(0, 1.1e-3, 1e-4, 0, 5e-4);
    struct moe_twiddler_item it[4] = {{2, 0, &e}, {2, 0, &e}, {2, 0, &e}, {2, 0, &e}};
    uint8_t host[4], rule_host[4];
    struct moe_twiddler_time t, tr;
    for (int i = 0; i < 4; i++) rule_host[i] = (uint8_t)moe_twiddler_rule(&e, 2, 0, MOE_CPU_EXPERTS_AUTO);
    moe_twiddler_layer_time(4, it, rule_host, &tr);
    moe_twiddler_plan(MOE_CPU_EXPERTS_AUTO, 4, it, host, &t);
    CHECK(rule_host[0] == 1 && near(tr.layer_s, 4e-3), "the rule alone: all on the CPU, 4 ms");
    CHECK(t.layer_s < tr.layer_s * 0.8 && t.n_cpu >= 1 && t.n_copied >= 1, "the plan splits: %d CPU, %d copied, %g s",
          t.n_cpu, t.n_copied, t.layer_s);
    moe_twiddler_plan(MOE_CPU_EXPERTS_NEVER, 4, it, host, &t);
    CHECK(t.n_cpu == 0 && t.n_copied == 4, "never: all copied");
    moe_twiddler_plan(MOE_CPU_EXPERTS_ALWAYS, 4, it, host, &t);
    CHECK(t.n_cpu == 4, "always: all on the CPU");

    unsigned st = 12345;
    int worse = 0, resident_moved = 0;
    for (int trial = 0; trial < 2000; trial++) {
        struct moe_lat_entry ents[3];
        for (int p = 0; p < 3; p++)
            ents[p] = linear_entry(p, 1e-4 + 5e-3 * urand(&st), 1e-5 + 1e-3 * urand(&st), 1e-6 * urand(&st),
                                   1e-5 + 2e-3 * urand(&st));
        struct moe_twiddler_item items[16];
        const int n = 1 + (int)(urand(&st) * 16) % 16;
        for (int i = 0; i < n; i++)
            items[i] = (struct moe_twiddler_item){1 + (int)(urand(&st) * 64), urand(&st) < 0.3, &ents[i % 3]};
        uint8_t h[16], all_gpu[16], all_cpu[16], r[16];
        struct moe_twiddler_time tp, tg, tc, trr;
        moe_twiddler_plan(MOE_CPU_EXPERTS_AUTO, n, items, h, &tp);
        for (int i = 0; i < n; i++) {
            all_gpu[i] = 0;
            all_cpu[i] = !items[i].resident;
            r[i] = (uint8_t)moe_twiddler_rule(items[i].lat, items[i].tokens, items[i].resident, MOE_CPU_EXPERTS_AUTO);
            resident_moved += items[i].resident && h[i];
        }
        moe_twiddler_layer_time(n, items, all_gpu, &tg);
        moe_twiddler_layer_time(n, items, all_cpu, &tc);
        moe_twiddler_layer_time(n, items, r, &trr);
        struct moe_twiddler_time check;
        moe_twiddler_layer_time(n, items, h, &check);
        worse += !near(check.layer_s, tp.layer_s) || tp.layer_s > tg.layer_s * (1 + 1e-12) ||
                 tp.layer_s > tc.layer_s * (1 + 1e-12) || tp.layer_s > trr.layer_s * (1 + 1e-12) ||
                 !near(tp.layer_s, fmax(tp.gpu_s, tp.cpu_s));
    }
    CHECK(worse == 0, "%d of 2000 random layers planned slower than the rule, all-GPU or all-CPU", worse);
    CHECK(resident_moved == 0, "resident experts stay on the GPU (%d moved)", resident_moved);
}

static int n_logged;
static void count_log(enum moe_log_level level, const char *msg, void *user) {
    (void)user;
    (void)msg;
    n_logged += level >= MOE_LOG_ERROR;
}

static void cache_file(void) {
    struct moe_lat_table t, r;
    memset(&t, 0, sizeof t);
    snprintf(t.key, sizeof t.key, "cuda NVIDIA H100 80GB HBM3 sm_90 | cpu 16 threads | H 4096 F 14336 | q4_k/q4_k/q4_k");
    t.n = 2;
    t.e[0] = linear_entry(3, 1.5e-3, 2e-4, 1e-6, 4e-3);
    t.e[1] = linear_entry(0, 0.75e-3, 1e-4, 1e-6, 2e-3);
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "/tmp/test-twiddler.%ld", (long)getpid());
    snprintf(path, sizeof path, "%s/sub/latency.txt", dir);
    CHECK(moe_lat_table_write(&t, path) == MOE_OK, "write %s (creating directories)", path);
    CHECK(moe_lat_table_read(path, &r) == MOE_OK, "read it back");
    int same = r.n == t.n && !strcmp(r.key, t.key);
    for (int i = 0; same && i < t.n; i++) {
        same &= r.e[i].prec == t.e[i].prec && r.e[i].bytes == t.e[i].bytes && near(r.e[i].transfer_s, t.e[i].transfer_s);
        same &= r.e[i].gpu.n == t.e[i].gpu.n && r.e[i].cpu.n == t.e[i].cpu.n;
        for (int j = 0; same && j < t.e[i].gpu.n; j++)
            same &= r.e[i].gpu.s[j] == t.e[i].gpu.s[j] && fabs(r.e[i].gpu.t[j] / t.e[i].gpu.t[j] - 1) < 1e-8 &&
                    fabs(r.e[i].cpu.t[j] / t.e[i].cpu.t[j] - 1) < 1e-8;
    }
    CHECK(same, "the table round-trips");
    CHECK(moe_lat_table_find(&r, 0) == &r.e[1] && moe_lat_table_find(&r, 5) == NULL, "find entries by precision");
    CHECK(moe_lat_table_read("/nonexistent/latency.txt", &r) == MOE_ERR_NOT_FOUND, "a missing file");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "clean up");

    static const char *const bad[] = {
        "",
        "moe-latency 2\nkey k\nentries 0\n",
        "moe-latency 1\nentries 0\n",
        "moe-latency 1\nkey k\nentries 9\n",
        "moe-latency 1\nkey k\nentries -1\n",
        "moe-latency 1\nkey k\nentries 1\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 2 1 0.001\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 2 2 0.001 1 0.002\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 1 1 0\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 1 1 nan\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 -1\ngpu 1 1 0.001\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 0 0.001\ngpu 1 1 0.001\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001 7\ngpu 1 1 0.001\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 1 1 0.001 extra\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ngpu 17 1 0.001\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 2\nentry 0 100 0.001\ngpu 1 1 0.001\ncpu 1 1 0.001\n"
        "entry 0 100 0.001\ngpu 1 1 0.001\ncpu 1 1 0.001\n",
        "moe-latency 1\nkey k\nentries 0\nsomething else\n",
        "moe-latency 1\nkey k\nentries 1\nentry 0 100 0.001\ncpu 1 1 0.001\ngpu 1 1 0.001\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const int before = n_logged;
        CHECK(moe_lat_table_parse(bad[i], strlen(bad[i]), "bad", &r) == MOE_ERR_FORMAT && n_logged == before + 1,
              "malformed table %zu refused with one message", i);
    }
    const char nul[] = "moe-latency 1\nkey k\0x\nentries 0\n";
    CHECK(moe_lat_table_parse(nul, sizeof nul - 1, "nul", &r) == MOE_ERR_FORMAT, "a NUL byte is refused");
    const char ok[] = "moe-latency 1\nkey k\nentries 1\nentry 2 100 0.001\ngpu 2 1 0.001 8 0.002\ncpu 1 1 0.001\n\n";
    CHECK(moe_lat_table_parse(ok, sizeof ok - 1, "ok", &r) == MOE_OK && r.n == 1 && r.e[0].prec == 2 && r.e[0].gpu.n == 2,
          "a well-formed table with a trailing blank line parses");

    char p1[512], p2[512], p3[512];
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    CHECK(moe_lat_cache_path("key one", p1, sizeof p1) == MOE_OK && !strncmp(p1, "/x/cache/moe/latency-", 21),
          "XDG_CACHE_HOME: %s", p1);
    CHECK(moe_lat_cache_path("key two", p2, sizeof p2) == MOE_OK && strcmp(p1, p2) != 0, "keys give different files");
    setenv("XDG_CACHE_HOME", "relative", 1);
    setenv("HOME", "/home/u", 1);
    CHECK(moe_lat_cache_path("key one", p3, sizeof p3) == MOE_OK && !strncmp(p3, "/home/u/.cache/moe/latency-", 27) &&
              !strcmp(p3 + 19, p1 + 13),
          "a relative XDG_CACHE_HOME is ignored: %s", p3);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    CHECK(moe_lat_cache_path("k", p3, sizeof p3) == MOE_ERR_NOT_FOUND, "no HOME: no cache");
    setenv("HOME", "/home/u", 1);
    CHECK(moe_lat_cache_path("k", p3, 10) == MOE_ERR_RANGE, "a small buffer");
}

int main(void) {
    moe_log_set(count_log, NULL);
    curves();
    rule();
    layer_time();
    planner();
    cache_file();
    printf("test-twiddler: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}
