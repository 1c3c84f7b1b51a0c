/*
 * fuzz-src.h - a fuzz input read as a stream of choices, for the recipe
 * builders of fuzz-bundle-gen.h, fuzz-config-gen.h and fuzz-profile.c
 * (docs/fuzzing.md, "Reaching the readers from nothing"). Every choice reads
 * one byte; a used-up input reads zeros, so a short recipe means the default
 * of every choice it does not reach.
 */
#ifndef MOE_FUZZ_SRC_H
#define MOE_FUZZ_SRC_H

#include <stddef.h>
#include <stdint.h>

struct fz_src {
    const uint8_t *p;
    size_t n, i;
};

/* fz_byte: the next input byte, 0 once the input is used up. */
static inline unsigned fz_byte(struct fz_src *s) { return s->i < s->n ? s->p[s->i++] : 0; }

/* fz_pick: a choice in [0, n) that is dflt for a 0 byte (and for an exhausted
 * input), so that short recipes describe the default item. */
static inline unsigned fz_pick(struct fz_src *s, unsigned n, unsigned dflt) { return (fz_byte(s) + dflt) % n; }

/* fz_left: 1 while input bytes remain. */
static inline int fz_left(const struct fz_src *s) { return s->i < s->n; }

#endif
