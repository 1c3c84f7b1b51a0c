/*
 * test-sampler.c - runtime/sampler.c: greedy at temperature 0, seeded
 * sampling reproducible, and bad parameters (negative, NaN or infinite
 * temperature, top-p outside (0, 1], negative top-k) refused at creation
 * instead of silently meaning "greedy".
 */
#include <math.h>
#include <stdio.h>

#include "moe-sampler.h"
#include "moe-test.h"

/* quiet: drop the expected error messages. */
static void quiet(enum moe_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

/* refused: moe_sampler_create rejects p and leaves *out NULL. */
static int refused(struct moe_sampler_params p) {
    struct moe_sampler *s = (struct moe_sampler *)&p; /* any non-NULL value: must be cleared */
    enum moe_status st = moe_sampler_create(&p, 8, &s);
    int ok = st == MOE_ERR_INVALID && s == NULL;
    moe_sampler_free(st == MOE_OK ? s : NULL);
    return ok;
}

int main(void) {
    moe_log_set(quiet, NULL);
    const float logits[8] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 0.0f, 1.5f, -3.0f};
    struct moe_sampler_params p = moe_sampler_default_params();
    struct moe_sampler *s = NULL;
    CHECK(moe_sampler_create(&p, 8, &s) == MOE_OK && s, "default params accepted");
    CHECK(s && moe_sampler_sample(s, logits) == 1, "temperature 0 is greedy, lowest id on ties");
    moe_sampler_free(s);

    /* seeded sampling: same seed, same draws */
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.top_k = 4;
    p.seed = 7;
    struct moe_sampler *a = NULL, *b = NULL;
    CHECK(moe_sampler_create(&p, 8, &a) == MOE_OK && moe_sampler_create(&p, 8, &b) == MOE_OK, "sampling params");
    int same = a && b;
    for (int i = 0; same && i < 64; i++) {
        int32_t x = moe_sampler_sample(a, logits), y = moe_sampler_sample(b, logits);
        same = x == y && x >= 0 && x < 8;
    }
    CHECK(same, "same seed gives the same draws, all in range");
    moe_sampler_free(a);
    moe_sampler_free(b);

    /* bad values are refused (issue 17: --temp -1 ran greedy) */
    struct moe_sampler_params bad = moe_sampler_default_params();
    bad.temperature = -1.0f;
    CHECK(refused(bad), "negative temperature refused");
    bad.temperature = NAN;
    CHECK(refused(bad), "NaN temperature refused");
    bad.temperature = INFINITY;
    CHECK(refused(bad), "infinite temperature refused");
    bad = moe_sampler_default_params();
    bad.top_p = 0.0f;
    CHECK(refused(bad), "top-p 0 refused");
    bad.top_p = 1.5f;
    CHECK(refused(bad), "top-p above 1 refused");
    bad.top_p = NAN;
    CHECK(refused(bad), "NaN top-p refused");
    bad = moe_sampler_default_params();
    bad.top_k = -2;
    CHECK(refused(bad), "negative top-k refused");
    printf("test-sampler: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}
