/*
 * bench-profile - what profiling costs against a plain batched forward pass
 * over the same tokens. Runs, alternating, `rounds` times each:
 *   plain      : each sequence through a fresh session in one batch, no
 *                observers, no LM head (what a prefill over the text costs)
 *   plain+lm   : the same with logits for every position (what eval does)
 *   profile    : `moe-prep profile --big-little-every 0` (routing only)
 *   profile+bl : `moe-prep profile` with the default big-little sampling
 * and prints the median seconds of each and the ratios to `plain`. For the
 * profile both the recording loop (its --json "seconds": every forward pass
 * and observer) and the whole command (also loading, tokenizing, deriving
 * and writing) are shown; the command is compared with the plain loop plus
 * loading the model and tokenizing the text.
 *
 *   bench-profile MOE_PREP MODEL TEXT [ctx=256] [threads=0] [rounds=3]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe-dataset.h"
#include "moe-model.h"
#include "moe-session.h"
#include "token-stream.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* plain: every whole sequence of ctx tokens through a fresh session. */
static double plain(const struct moe_model *m, const int32_t *ids, size_t n_ids, int ctx, int threads, int lm) {
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = ctx;
    sp.n_batch = ctx;
    sp.n_threads = threads;
    float *logits = lm ? malloc((size_t)ctx * m->cfg.n_vocab * sizeof *logits) : NULL;
    int32_t *seq = malloc((size_t)ctx * sizeof *seq);
    const int32_t bos = moe_text_bos(m->tok);
    double t0 = now_s();
    for (size_t s = 0; s + (size_t)ctx <= n_ids; s += (size_t)ctx) {
        memcpy(seq, ids + s, (size_t)ctx * sizeof *seq);
        if (bos >= 0) seq[0] = bos;
        struct moe_session *ss = NULL;
        if (moe_session_create(m, &sp, &ss) || moe_session_forward(ss, seq, ctx, logits, 1)) {
            fprintf(stderr, "bench-profile: forward failed\n");
            exit(1);
        }
        moe_session_free(ss);
    }
    double t = now_s() - t0;
    free(seq);
    free(logits);
    return t;
}

/* profile: run moe-prep profile; *loop = its recording seconds; returns wall seconds. */
static double profile(const char *moe_prep, const char *model, const char *text, int ctx, int threads,
                      const char *extra, double *loop) {
    char cmd[4096], thr[32] = "";
    if (threads) snprintf(thr, sizeof thr, "-t %d", threads);
    snprintf(cmd, sizeof cmd,
             "%s profile %s --dataset %s -o /tmp/bench-profile.h5 --ctx %d --no-tuning --json %s %s 2>/dev/null",
             moe_prep, model, text, ctx, thr, extra);
    double t0 = now_s();
    FILE *f = popen(cmd, "r");
    if (!f) exit(1);
    static char out[1 << 20];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    if (pclose(f) != 0) {
        fprintf(stderr, "bench-profile: %s failed\n", cmd);
        exit(1);
    }
    double wall = now_s() - t0;
    const char *s = strstr(out, "\"seconds\":"); /* cJSON_Print: a tab or space may follow the colon */
    *loop = s ? atof(s + 10) : -1;
    return wall;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench-profile MOE_PREP MODEL TEXT [ctx=256] [threads=0] [rounds=3]\n");
        return 2;
    }
    const char *moe_prep = argv[1], *model = argv[2], *text = argv[3];
    int ctx = argc > 4 ? atoi(argv[4]) : 256, threads = argc > 5 ? atoi(argv[5]) : 0,
        rounds = argc > 6 ? atoi(argv[6]) : 3;
    if (rounds < 1 || rounds > 50 || ctx < 2) return 2;
    moe_log_set_level(MOE_LOG_WARN);
    char *buf = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    struct moe_model *m = NULL;
    struct moe_dataset_params dp = moe_dataset_default_params();
    double t_load = now_s();
    struct moe_model_params mp = moe_model_default_params();
    if (moe_text_load(text, &dp, &buf, &len) || moe_model_load(model, &mp, &m) ||
        moe_text_tokenize(m, NULL, buf, len, &ids, &n_ids)) {
        fprintf(stderr, "bench-profile: cannot load %s / %s\n", model, text);
        return 1;
    }
    t_load = now_s() - t_load;
    size_t n_tok = n_ids / (size_t)ctx * (size_t)ctx;
    double tp[50], tl[50], pw[50], pl[50], bw[50], bl[50];
    for (int r = 0; r < rounds; r++) {
        tp[r] = plain(m, ids, n_ids, ctx, threads, 0);
        tl[r] = plain(m, ids, n_ids, ctx, threads, 1);
        pw[r] = profile(moe_prep, model, text, ctx, threads, "--big-little-every 0", &pl[r]);
        bw[r] = profile(moe_prep, model, text, ctx, threads, "", &bl[r]);
    }
    double p0 = median(tp, rounds), p1 = median(tl, rounds), a = median(pl, rounds), aw = median(pw, rounds),
           b = median(bl, rounds), bwm = median(bw, rounds);
    printf("model %s, text %s: %zu tokens in sequences of %d, threads %d, median of %d rounds\n", model, text, n_tok,
           ctx, threads, rounds);
    printf("%-34s %9s %10s %8s\n", "run", "seconds", "tokens/s", "ratio");
    printf("%-34s %9.3f %10.0f %8.2f\n", "plain forward (no LM head)", p0, n_tok / p0, 1.0);
    printf("%-34s %9.3f %10.0f %8.2f\n", "plain forward + all logits", p1, n_tok / p1, p1 / p0);
    printf("%-34s %9.3f %10.0f %8.2f\n", "profile, routing only (loop)", a, n_tok / a, a / p0);
    printf("%-34s %9.3f %10.0f %8.2f\n", "profile + big-little (loop)", b, n_tok / b, b / p0);
    printf("%-34s %9.3f %10s %8.2f\n", "plain forward + model/text load", p0 + t_load, "", 1.0);
    printf("%-34s %9.3f %10s %8.2f\n", "profile, routing only (command)", aw, "", aw / (p0 + t_load));
    printf("%-34s %9.3f %10s %8.2f\n", "profile + big-little (command)", bwm, "", bwm / (p0 + t_load));
    free(ids);
    free(buf);
    moe_model_free(m);
    return 0;
}
