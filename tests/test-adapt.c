/*
 * test-adapt.c - runtime/cpu/adapt.c, the decode-mode chooser, fed made-up
 * step times:
 *   - warm-up steps run parallel and are not sampled; a last warm-up step
 *     longer than MOE_ADAPT_MAX_NS turns measuring off for good;
 *   - a measurement samples each mode MOE_ADAPT_SAMPLES times in a shuffled
 *     order, then keeps the faster one: solo only when it is at least 3 %
 *     faster (2 % is not enough, 5 % is);
 *   - a steady run repeats the choice, doubles while the choice stays the
 *     same (up to MOE_ADAPT_RUN_MAX) and falls back to MOE_ADAPT_RUN_MIN when
 *     it changes; a change follows the machine (parallel becomes slow);
 *   - steps of more than one token always run parallel and are not sampled;
 *   - disabled, or when steps never report their time, every step is parallel.
 */
#include <string.h>

#include "adapt-impl.h"
#include "moe-test.h"

/* step: one one-token step that takes par_ns in parallel and solo_ns alone;
 * returns the mode it ran in. */
static int step(struct moe_adapt *a, int64_t par_ns, int64_t solo_ns) {
    const int solo = moe_adapt_begin(a, 1);
    moe_adapt_end(a, solo ? solo_ns : par_ns);
    return solo;
}

/* measure: steps until a measurement ends (at least one: a steady run that
 * has just ended measures at its next step); counts the modes run. */
static int measure(struct moe_adapt *a, int64_t par_ns, int64_t solo_ns, int *n_par, int *n_solo) {
    *n_par = *n_solo = 0;
    int steps = 0;
    do {
        if (step(a, par_ns, solo_ns)) (*n_solo)++;
        else (*n_par)++;
        steps++;
    } while (a->state != MOE_ADAPT_STEADY && steps < 1000);
    return steps;
}

int main(void) {
    struct moe_adapt a;
    int np, ns;

    /* warm-up, then a measurement where solo is clearly faster */
    moe_adapt_init(&a, 1);
    int warm_solo = 0;
    for (int i = 0; i < MOE_ADAPT_WARM; i++) warm_solo += step(&a, 100000, 50000);
    CHECK(warm_solo == 0, "warm-up steps ran solo %d times", warm_solo);
    CHECK(a.state == MOE_ADAPT_MEASURE, "a short warm-up leads to a measurement (state %d)", a.state);
    int steps = measure(&a, 100000, 50000, &np, &ns);
    CHECK(steps == 2 * MOE_ADAPT_SAMPLES && np == MOE_ADAPT_SAMPLES && ns == MOE_ADAPT_SAMPLES,
          "a measurement takes %d samples of each mode (took %d: %d parallel, %d solo)", MOE_ADAPT_SAMPLES, steps, np,
          ns);
    CHECK(a.choice == 1 && a.run == MOE_ADAPT_RUN_MIN, "solo chosen, first run %d (choice %d)", a.run, a.choice);

    /* the order within a measurement is shuffled, not alternating */
    moe_adapt_init(&a, 1);
    for (int i = 0; i < MOE_ADAPT_WARM; i++) step(&a, 100, 100);
    int modes[2 * MOE_ADAPT_SAMPLES], alternating = 1;
    for (int i = 0; i < 2 * MOE_ADAPT_SAMPLES; i++) modes[i] = step(&a, 100, 100);
    for (int i = 1; i < 2 * MOE_ADAPT_SAMPLES - 2; i++) alternating &= modes[i] != modes[i - 1];
    CHECK(!alternating, "the modes of a measurement are shuffled");

    /* the steady run repeats the choice, then measures again; the same choice doubles the run */
    moe_adapt_init(&a, 1);
    for (int i = 0; i < MOE_ADAPT_WARM; i++) step(&a, 100000, 50000);
    measure(&a, 100000, 50000, &np, &ns);
    int run = a.run, solo_steps = 0;
    for (int i = 0; i < run; i++) solo_steps += step(&a, 100000, 50000);
    CHECK(solo_steps == run, "a steady run of %d repeats solo (%d did)", run, solo_steps);
    CHECK(a.state == MOE_ADAPT_STEADY, "still steady after the run's last step (state %d)", a.state);
    measure(&a, 100000, 50000, &np, &ns);
    CHECK(a.choice == 1 && a.run == 2 * run, "the same choice doubles the run: %d -> %d", run, a.run);
    for (int k = 0; k < 20; k++) {
        for (int i = 0; i < a.run; i++) step(&a, 100000, 50000);
        measure(&a, 100000, 50000, &np, &ns);
    }
    CHECK(a.run == MOE_ADAPT_RUN_MAX, "the run stops at %d (is %d)", MOE_ADAPT_RUN_MAX, a.run);

    /* the machine changes: parallel becomes faster; the next measurement follows */
    for (int i = 0; i < a.run; i++) step(&a, 50000, 100000);
    measure(&a, 50000, 100000, &np, &ns);
    CHECK(a.choice == 0 && a.run == MOE_ADAPT_RUN_MIN && a.switches == 1,
          "parallel chosen after the change, run back to %d (choice %d, run %d, switches %llu)", MOE_ADAPT_RUN_MIN,
          a.choice, a.run, (unsigned long long)a.switches);
    int par_steps = 0;
    for (int i = 0; i < a.run; i++) par_steps += !step(&a, 50000, 100000);
    CHECK(par_steps == MOE_ADAPT_RUN_MIN, "the steady run is parallel (%d of %d)", par_steps, MOE_ADAPT_RUN_MIN);

    /* ties and small gains keep parallel: solo needs 3 % */
    const int64_t solos[] = {100000, 98000, 95000};
    const int want[] = {0, 0, 1};
    for (int k = 0; k < 3; k++) {
        moe_adapt_init(&a, 1);
        for (int i = 0; i < MOE_ADAPT_WARM; i++) step(&a, 100000, solos[k]);
        measure(&a, 100000, solos[k], &np, &ns);
        CHECK(a.choice == want[k], "solo at %lld ns against parallel at 100000: chose %d, want %d",
              (long long)solos[k], a.choice, want[k]);
    }

    /* medians, not means: one slow outlier in the faster mode does not flip the choice */
    moe_adapt_init(&a, 1);
    for (int i = 0; i < MOE_ADAPT_WARM; i++) step(&a, 50000, 100000);
    int outlier = 0;
    while (a.state != MOE_ADAPT_STEADY) {
        const int solo = moe_adapt_begin(&a, 1);
        moe_adapt_end(&a, solo ? 100000 : (outlier++ == 0 ? 50000000 : 50000));
    }
    CHECK(a.choice == 0, "one 50 ms parallel step among 50 us ones still chooses parallel (chose %d)", a.choice);

    /* a large model: the warm-up's last step is over MOE_ADAPT_MAX_NS */
    moe_adapt_init(&a, 1);
    int any_solo = 0;
    for (int i = 0; i < 200; i++) any_solo |= step(&a, MOE_ADAPT_MAX_NS + 1, 1000);
    CHECK(a.state == MOE_ADAPT_OFF && !any_solo, "a slow step turns measuring off (state %d, solo %d)", a.state,
          any_solo);

    /* prompts: more than one token runs parallel, is not sampled and does not advance the warm-up */
    moe_adapt_init(&a, 1);
    for (int i = 0; i < MOE_ADAPT_WARM; i++) step(&a, 100000, 50000);
    const int before = a.n[0] + a.n[1];
    CHECK(moe_adapt_begin(&a, 16) == 0 && !a.measured, "a 16-token step runs parallel, unmeasured");
    moe_adapt_end(&a, 1);
    CHECK(a.n[0] + a.n[1] == before, "a 16-token step added a sample");

    /* disabled: always parallel */
    moe_adapt_init(&a, 0);
    any_solo = 0;
    for (int i = 0; i < 200; i++) any_solo |= step(&a, 100000, 1);
    CHECK(!any_solo && a.state == MOE_ADAPT_OFF, "disabled: every step parallel");

    /* steps that never report (no logits wanted): measuring gives up, parallel */
    moe_adapt_init(&a, 1);
    any_solo = 0;
    for (int i = 0; i < 200; i++) {
        const int s = moe_adapt_begin(&a, 1);
        if (i >= 100) any_solo |= s;
    }
    CHECK(a.state == MOE_ADAPT_OFF && !any_solo, "unreported steps: measuring off (state %d), parallel", a.state);

    printf("test-adapt: %d checks, %s\n", checks, fails ? "FAILED" : "ok");
    return fails != 0;
}
