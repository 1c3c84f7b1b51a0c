/*
 * moe-adapt.h - whether a decode step of a small model runs on all of the
 * pool's threads or on the caller alone, chosen by measuring both.
 *
 * A decoded token of a small model is dozens of loops of a few microseconds.
 * Two threads make it faster when they have a core each; when the second
 * thread shares its core with the first (SMT siblings on the host of a
 * virtual machine) or with another busy process, the caller waits for its
 * chunks and the step gets slower than on one thread. Which case holds can
 * change from minute to minute on a shared machine, and nothing the guest can
 * read tells. So the CPU backend measures: after a short warm-up it runs
 * ADAPT_SAMPLES steps in each mode, in a shuffled order (so that a growing
 * context, a MoBiLE little/big alternation or a change of the machine's
 * load hits both alike), keeps the mode with the lower median step time
 * (parallel unless solo is at least 3 % faster), runs it for a while, then
 * measures again. The run doubles (64 up to 4096 steps) while the choice
 * stays the same. Steps of large models (the warm-up's steps longer than
 * 2 ms: memory-bound, where every thread adds bandwidth) always use every
 * thread, with no measuring at all.
 *
 * A step is measured from its start (the embedding) to its logits; steps
 * whose logits nobody asks for cannot be measured, and after a few of those
 * every step runs parallel.
 *
 * Only speed changes: the thread split does not change any result (the
 * kernels give the same bits on any split). MOE_CPU_ADAPT=0 in the
 * environment turns it off (every step parallel).
 *
 * The decisions are a pure state machine over the step times it is given,
 * so they are tested with made-up times (test-adapt).
 */
#ifndef MOE_ADAPT_H
#define MOE_ADAPT_H

#include <stdint.h>

#define MOE_ADAPT_SAMPLES 8      /* steps per mode in one measurement */
#define MOE_ADAPT_WARM 3         /* decode steps not measured at the start */
#define MOE_ADAPT_MAX_NS 2000000 /* a warm-up step longer than this: always parallel */
#define MOE_ADAPT_RUN_MIN 64
#define MOE_ADAPT_RUN_MAX 4096

enum moe_adapt_state { MOE_ADAPT_WARMUP, MOE_ADAPT_MEASURE, MOE_ADAPT_STEADY, MOE_ADAPT_OFF };

struct moe_adapt {
    enum moe_adapt_state state;
    int solo;          /* the current step's mode: 1 caller alone, 0 every thread */
    int choice;        /* the mode the last measurement chose (-1: none yet) */
    int left;          /* steps left in the warm-up or the steady run */
    int run;           /* length of the current steady run */
    int measured;      /* 1 while a begun step will be reported (moe_adapt_end) */
    int dropped;       /* measured steps in a row that were never reported */
    int n[2];          /* samples of the current measurement, per mode */
    int64_t t[2][MOE_ADAPT_SAMPLES];
    uint64_t rng;      /* shuffles the measured modes */
    uint64_t switches; /* measurements that changed the mode (for -v and tests) */
};

/* moe_adapt_init: enabled (0: every step parallel, never measured). */
void moe_adapt_init(struct moe_adapt *a, int enabled);

/* moe_adapt_begin: a step of n tokens starts; returns 1 if it runs on the
 * caller alone. Steps of n != 1 tokens (prompts; 0 for a step that is not a
 * decode step at all) always run parallel and are not measured. */
int moe_adapt_begin(struct moe_adapt *a, int n);

/* moe_adapt_end: the step begun last took ns nanoseconds (ignored unless
 * it was a one-token step that is being measured). */
void moe_adapt_end(struct moe_adapt *a, int64_t ns);

#endif
