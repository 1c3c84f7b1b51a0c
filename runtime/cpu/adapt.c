/*
 * adapt.c - the decode-mode chooser of moe-adapt.h: a state machine over
 * measured step times (warm-up, measure both modes, steady run, again).
 */
#include "adapt-impl.h"

#include <stdlib.h>
#include <string.h>

void moe_adapt_init(struct moe_adapt *a, int enabled) {
    memset(a, 0, sizeof *a);
    a->state = enabled ? MOE_ADAPT_WARMUP : MOE_ADAPT_OFF;
    a->left = MOE_ADAPT_WARM;
    a->choice = -1;
    a->rng = 0x853c49e6748fea9bull;
}

/* next_bit: one pseudo-random bit (xorshift64). */
static int next_bit(struct moe_adapt *a) {
    a->rng ^= a->rng << 13;
    a->rng ^= a->rng >> 7;
    a->rng ^= a->rng << 17;
    return (int)(a->rng >> 63);
}

static int cmp_i64(const void *x, const void *y) {
    const int64_t p = *(const int64_t *)x, q = *(const int64_t *)y;
    return (p > q) - (p < q);
}

/* median: of the n values v (sorted in place). */
static int64_t median(int64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int moe_adapt_begin(struct moe_adapt *a, int n) {
    /* a measured step that never reported (no logits were wanted): steps
     * like it cannot be measured, so after a few give up measuring */
    if (a->measured && ++a->dropped > 2 * MOE_ADAPT_SAMPLES) a->state = MOE_ADAPT_OFF;
    a->measured = 0;
    if (n != 1 || a->state == MOE_ADAPT_OFF) return a->solo = 0;
    switch (a->state) {
    case MOE_ADAPT_WARMUP:
        a->solo = 0;
        if (a->left > 1) a->left--;
        else a->measured = 1; /* the last warm-up step tells a large model */
        return 0;
    case MOE_ADAPT_STEADY:
        if (a->left > 0) {
            a->left--;
            return a->solo = a->choice;
        }
        a->state = MOE_ADAPT_MEASURE;
        a->n[0] = a->n[1] = 0;
        /* fall through */
    case MOE_ADAPT_MEASURE:
    default:
        /* shuffled: either mode while both still need samples */
        if (a->n[0] >= MOE_ADAPT_SAMPLES) a->solo = 1;
        else if (a->n[1] >= MOE_ADAPT_SAMPLES) a->solo = 0;
        else a->solo = next_bit(a);
        a->measured = 1;
        return a->solo;
    }
}

void moe_adapt_end(struct moe_adapt *a, int64_t ns) {
    if (!a->measured) return;
    a->measured = 0;
    a->dropped = 0;
    if (a->state == MOE_ADAPT_WARMUP) {
        a->left = 0;
        if (ns > MOE_ADAPT_MAX_NS) {
            a->state = MOE_ADAPT_OFF;
            return;
        }
        a->state = MOE_ADAPT_MEASURE;
        a->n[0] = a->n[1] = 0;
        return;
    }
    if (a->state != MOE_ADAPT_MEASURE) return;
    a->t[a->solo][a->n[a->solo]++] = ns;
    if (a->n[0] < MOE_ADAPT_SAMPLES || a->n[1] < MOE_ADAPT_SAMPLES) return;
    const int64_t par = median(a->t[0], MOE_ADAPT_SAMPLES), solo = median(a->t[1], MOE_ADAPT_SAMPLES);
    const int choice = solo * 100 < par * 97; /* solo only if at least 3 % faster */
    if (choice == a->choice) {
        a->run = a->run * 2 < MOE_ADAPT_RUN_MAX ? a->run * 2 : MOE_ADAPT_RUN_MAX;
    } else {
        if (a->choice >= 0) a->switches++;
        a->run = MOE_ADAPT_RUN_MIN;
    }
    a->choice = choice;
    a->state = MOE_ADAPT_STEADY;
    a->left = a->run;
}
