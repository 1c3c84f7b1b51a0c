/*
 * bench-multiseq.c - aggregate decode speed of P concurrent sequences
 * decoded together (moe_session_decode_batch), P = 1, 2, 4, 8, with every
 * expert resident and with an expert budget, in one process.
 *
 * The model is loaded twice (resident, repacked for the CPU's kernels as
 * moe-run does; and lazy, its experts read by a store of --share of the
 * q8_0 expert bytes, LRU, dynamic precision and prefetch off, so both compute
 * the same q8_0 model). One session of max(P) sequences per mode. First each
 * prompt runs alone (moe_session_forward_seq, one-token steps): the
 * reference tokens. Then each round runs every (mode, P, way) in turn: P
 * sequences reset, each prefilled with its own 8-token prompt, then N decode
 * steps of all P, greedy, timed; aggregate tokens/s = P N / time. The two
 * ways: batched (one decode_batch call per step for the P sequences) and,
 * for P > 1, round-robin (what a server without batching does: each step
 * runs the P sequences one after another, moe_session_forward_seq). Every
 * round checks that each sequence's tokens equal its run alone. The store's
 * loads and bytes read per decoded token are counted over the timed steps.
 * Figures: the median over rounds.
 * Not a test: figures go to docs/benchmarks.md with the command.
 *
 *   bench-multiseq BUNDLE [-p LIST] [-n N] [-r ROUNDS] [-t THREADS] [--share S] [--no-resident] [--no-store]
 *   bench-multiseq /tmp/moe-offload/tiny-moe-mixtral-ffn8192.moeb -p 1,2,4,8 -n 32 -r 3
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-model.h"
#include "moe-sampler.h"
#include "moe-session.h"

#define MAX_P 8    /* the most concurrent sequences */
#define N_CFG 8    /* entries of -p */
#define NPROMPT 8  /* prompt tokens */
#define MAX_N 256

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int usage(void) {
    fprintf(stderr,
            "usage: bench-multiseq BUNDLE [-p LIST] [-n N] [-r ROUNDS] [-t THREADS] [--share S] [--no-resident]\n"
            "                      [--no-store]\n"
            "  -p LIST    concurrent sequences, comma-separated, each 1..%d (default 1,2,4,8)\n"
            "  -n N       decode steps per round (default 32, at most %d)\n"
            "  -r ROUNDS  rounds (default 3)\n"
            "  -t THREADS CPU threads (default 2)\n"
            "  --share S  the store's budget: share S of the q8_0 expert bytes (default 0.25)\n"
            "example: bench-multiseq /tmp/moe-offload/tiny-moe-mixtral-ffn8192.moeb -p 1,2,4,8 -n 32 -r 3\n",
            MAX_P, MAX_N);
    return 2;
}

/* One mode: a model and a session of MAX_P sequences on it. */
struct mode {
    const char *name;
    struct moe_model *m;
    struct moe_session *s;
    int store;
};

static int32_t ref[MAX_P][MAX_N + 1]; /* each prompt's greedy tokens, run alone */

static void prompt(int q, int V, int32_t *ids) {
    for (int j = 0; j < NPROMPT; j++) ids[j] = (int32_t)((97 * q + 31 * j + 17) % V);
}

/* alone: prompt q in sequence 0, then n one-token steps; its tokens into ref[q]. */
static int alone(struct mode *md, int q, int n, float *lg) {
    const int V = md->m->cfg.n_vocab;
    int32_t ids[NPROMPT];
    prompt(q, V, ids);
    moe_session_reset(md->s);
    if (moe_session_forward_seq(md->s, 0, ids, NPROMPT, lg, 0) != MOE_OK) return 0;
    for (int j = 0; j <= n; j++) {
        ref[q][j] = moe_argmax(lg, V);
        if (j < n && moe_session_forward_seq(md->s, 0, &ref[q][j], 1, lg, 0) != MOE_OK) return 0;
    }
    return 1;
}

/* One (mode, P) round's figures. */
struct fig {
    double tps, loads_tok, mb_token;
    int same;
};

/* round_p: P sequences prefilled, then n decode steps timed: decode_batch
 * (batch) or each sequence's step by itself. */
static int round_p(struct mode *md, int P, int batch, int n, float *lg, struct fig *f) {
    const int V = md->m->cfg.n_vocab;
    int seqs[MAX_P];
    int32_t t[MAX_P], ids[NPROMPT];
    moe_session_reset(md->s);
    for (int q = 0; q < P; q++) {
        prompt(q, V, ids);
        seqs[q] = q;
        if (moe_session_forward_seq(md->s, q, ids, NPROMPT, lg + (size_t)q * V, 0) != MOE_OK) return 0;
        t[q] = moe_argmax(lg + (size_t)q * V, V);
    }
    f->same = 1;
    for (int q = 0; q < P; q++) f->same &= t[q] == ref[q][0];
    struct moe_store_stats a = {0}, b = {0};
    const struct moe_store *st = moe_session_store(md->s);
    if (st) moe_store_get_stats(st, &a);
    const double t0 = now_s();
    for (int j = 0; j < n; j++) {
        if (batch && moe_session_decode_batch(md->s, seqs, t, P, lg) != MOE_OK) return 0;
        for (int q = 0; !batch && q < P; q++)
            if (moe_session_forward_seq(md->s, q, t + q, 1, lg + (size_t)q * V, 0) != MOE_OK) return 0;
        for (int q = 0; q < P; q++) {
            t[q] = moe_argmax(lg + (size_t)q * V, V);
            f->same &= t[q] == ref[q][j + 1];
        }
    }
    const double dt = now_s() - t0;
    if (st) moe_store_get_stats(st, &b);
    f->tps = (double)P * n / dt;
    f->loads_tok = (double)(b.loads - a.loads) / ((double)P * n);
    f->mb_token = (double)(b.load_bytes - a.load_bytes) / 1e6 / ((double)P * n);
    return 1;
}

static int parse_list(const char *v, int *p, int *n) {
    *n = 0;
    for (const char *s = v; *s && *n < N_CFG;) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > MAX_P || (*end && *end != ',')) return 0;
        p[(*n)++] = (int)x;
        s = *end ? end + 1 : end;
    }
    return *n > 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) return usage();
    const char *path = argv[1];
    int plist[N_CFG] = {1, 2, 4, 8}, np = 4, n = 32, rounds = 3, threads = 2, resident = 1, offload = 1;
    double share = 0.25;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--no-resident")) {
            resident = 0;
            continue;
        }
        if (!strcmp(o, "--no-store")) {
            offload = 0;
            continue;
        }
        if (i + 1 >= argc) return usage();
        const char *v = argv[++i];
        if (!strcmp(o, "-p")) {
            if (!parse_list(v, plist, &np)) return usage();
        } else if (!strcmp(o, "-n")) {
            n = atoi(v);
        } else if (!strcmp(o, "-r")) {
            rounds = atoi(v);
        } else if (!strcmp(o, "-t")) {
            threads = atoi(v);
        } else if (!strcmp(o, "--share")) {
            share = atof(v);
        } else {
            return usage();
        }
    }
    if (n < 1 || n > MAX_N || rounds < 1 || threads < 1 || !(share > 0 && share <= 1) || !(resident || offload))
        return usage();
    struct mode modes[2] = {{"resident", NULL, NULL, 0}, {"store", NULL, NULL, 1}};
    struct moe_store_params sp = moe_store_default_params();
    sp.expert_mem_share = share, sp.high = "q8_0", sp.dynamic = 0, sp.policy = MOE_CACHE_LRU, sp.repack = 1;
    int rc = 1, nm = 0;
    float *lg = NULL;
    double *fig = NULL;
    for (int k = 0; k < 2; k++) {
        if ((k == 0 && !resident) || (k == 1 && !offload)) continue;
        struct mode *md = &modes[nm++];
        *md = modes[k];
        struct moe_model_params mp = moe_model_default_params();
        mp.expert_precision = "q8_0";
        mp.lazy_experts = md->store;
        size_t packed = 0;
        if (moe_model_load(path, &mp, &md->m) != MOE_OK || moe_model_repack(md->m, !md->store, &packed) != MOE_OK) {
            fprintf(stderr, "cannot load %s\n", path);
            goto done;
        }
        struct moe_session_params p = moe_session_default_params();
        p.n_ctx = NPROMPT + n + 8, p.n_threads = threads, p.n_seq = MAX_P, p.store = md->store ? &sp : NULL;
        if (moe_session_create(md->m, &p, &md->s) != MOE_OK) goto done;
    }
    const int V = modes[0].m->cfg.n_vocab;
    lg = malloc(sizeof *lg * (size_t)V * MAX_P);
    fig = malloc(sizeof *fig * (size_t)rounds * 2 * N_CFG * 2 * 3);
    if (!lg || !fig) goto done;
    int maxp = 1;
    for (int i = 0; i < np; i++) maxp = plist[i] > maxp ? plist[i] : maxp;
    for (int q = 0; q < maxp; q++) /* the references, on the first mode */
        if (!alone(&modes[0], q, n, lg)) goto done;
    printf("%s: %d decode steps per round, %d rounds, %d threads; store: %.0f %% of the q8_0 expert bytes, LRU, "
           "dynamic precision and prefetch off, io %s\n",
           path, n, rounds, threads, 100 * share, sp.io == MOE_IO_DIRECT ? "direct" : "other");
    int all_same = 1;
    for (int r = 0; r < rounds; r++) {
        printf("round %d:", r + 1);
        for (int k = 0; k < nm; k++)
            for (int i = 0; i < np; i++)
                for (int w = 0; w < 2; w++) { /* w 0: batched, 1: round-robin */
                    if (w && plist[i] == 1) continue;
                    struct fig f;
                    if (!round_p(&modes[k], plist[i], !w, n, lg, &f)) goto done;
                    double *x = fig + ((((size_t)k * N_CFG + (size_t)i) * 2 + (size_t)w) * (size_t)rounds + (size_t)r) * 3;
                    x[0] = f.tps, x[1] = f.loads_tok, x[2] = f.mb_token;
                    all_same &= f.same;
                    printf(" %s/P%d%s %.1f", modes[k].name, plist[i], w ? "rr" : "", f.tps);
                    fflush(stdout);
                }
        printf("\n");
    }
    printf("\nbatched: one decode_batch step for the P sequences; round-robin: the P sequences' steps one at a time\n"
           "| mode | P | batched tokens/s | x P=1 | round-robin tokens/s | batched / round-robin |"
           " expert loads / token, batched | round-robin | MB read / token, batched | round-robin |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < nm; k++) {
        double base = 0;
        for (int i = 0; i < np; i++) {
            double med[2][3];
            for (int w = 0; w < 2; w++)
                for (int c = 0; c < 3; c++) {
                    double v[64];
                    const int wi = plist[i] == 1 ? 0 : w, nr = rounds < 64 ? rounds : 64;
                    for (int r = 0; r < nr; r++)
                        v[r] = fig[((((size_t)k * N_CFG + (size_t)i) * 2 + (size_t)wi) * (size_t)rounds + (size_t)r) * 3 +
                                   (size_t)c];
                    med[w][c] = median(v, nr);
                }
            if (i == 0) base = med[0][0];
            printf("| %s | %d | %.1f | %.2f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", modes[k].name, plist[i],
                   med[0][0], med[0][0] / base, med[1][0], med[0][0] / med[1][0], med[0][1], med[1][1], med[0][2],
                   med[1][2]);
        }
    }
    printf("\ngreedy tokens of every sequence equal to its run alone: %s\n", all_same ? "yes" : "NO");
    rc = all_same ? 0 : 1;
done:
    for (int k = 0; k < 2; k++) {
        moe_session_free(modes[k].s);
        moe_model_free(modes[k].m);
    }
    free(lg);
    free(fig);
    return rc;
}
