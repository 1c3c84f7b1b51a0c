/*
 * quant-kasym-simd.h - q4_k and q5_k weight quantizers with one SIMD lane per
 * sub-block, bytes identical to quant.c's reference (quantize_k_asym). Private
 * to formats/: included once by quant-avx2.c (8 lanes: one block of 256) and
 * once by quant-avx512.c (16 lanes: two blocks), each defining first the lane
 * type and operations below (KQ_*, kq_*).
 *
 * Why lanes are sub-blocks: the reference's fit (fit_scale_min) is a
 * sequence of float sums and trial grids over the 32 weights of a sub-block,
 * and any reordering of those sums changes the bytes. Running the 8 (16)
 * sub-blocks side by side, each lane performs exactly the reference's
 * operations in the reference's order (no fused multiply-add: the library is
 * built with -ffp-contract=off), and the data-dependent branches become
 * per-lane selects. The small per-block rest (the 6-bit scales, the levels
 * again with the quantized scales, the packing) is the reference's code.
 *
 * The includer provides: KQ_NL (lanes), KQ_TGT (its target attribute),
 * kq_vf / kq_vi / kq_vm (float, int32 and mask vectors) and
 *   kq_load(p), kq_set1(f), kq_add, kq_sub, kq_mul, kq_div, kq_sqrt, kq_abs,
 *   kq_izero(), kq_neg (sign flip), kq_min_lt(a, b) = a < b ? a : b, kq_max_gt(a, b) =
 *   a > b ? a : b (lane-wise, NaN as these C expressions), kq_gt, kq_lt, kq_eq
 *   (ordered compares), kq_and, kq_any, kq_sel(m, a, b) = m ? a : b (floats),
 *   kq_seli (int32), kq_round(v) = round_nearest of quant.c lane-wise,
 *   kq_clamp(l, nmax), kq_cvt (int32 -> float), kq_store / kq_storei, and
 *   kq_has_nan(x): whether the 256 floats at x hold a NaN.
 */
#ifndef KQ_NL
#error "define the lane operations before including quant-kasym-simd.h"
#endif

/*
 * fit_scale_min of quant.c (n = 32, squared error) for KQ_NL sub-blocks at
 * once: x[i] and w[i] hold element i of every lane's sub-block and its weight.
 * Out: the levels L[i], the scale and -min of each lane.
 */
static KQ_TGT void kq_fit(const kq_vf *x, const kq_vf *w, kq_vi *L, kq_vf *scale_out, kq_vf *neg_min_out,
                          int nmax, float rmin, float rdelta, int nstep) {
    const kq_vf zero = kq_set1(0.0f);
    kq_vf lo = x[0], hi = x[0];
    kq_vf sum_w = w[0];
    kq_vf sum_x = kq_mul(sum_w, x[0]);
    for (int i = 1; i < 32; i++) {
        lo = kq_min_lt(x[i], lo);
        hi = kq_max_gt(x[i], hi);
        sum_w = kq_add(sum_w, w[i]);
        sum_x = kq_add(sum_x, kq_mul(w[i], x[i]));
    }
    lo = kq_sel(kq_gt(lo, zero), zero, lo);
    const kq_vm flat = kq_eq(hi, lo); /* the reference returns early there: L = 0, scale 0, -lo */
    kq_vf iscale = kq_div(kq_set1((float)nmax), kq_sub(hi, lo));
    kq_vf scale = kq_div(kq_set1(1.0f), iscale);
    kq_vf min = lo;
    kq_vf best_err = zero;
    for (int i = 0; i < 32; i++) {
        L[i] = kq_clamp(kq_round(kq_mul(iscale, kq_sub(x[i], min))), nmax);
        kq_vf diff = kq_sub(kq_add(kq_mul(scale, kq_cvt(L[i])), min), x[i]);
        diff = kq_mul(diff, diff);
        best_err = kq_add(best_err, kq_mul(w[i], diff));
    }
    kq_vi Laux[32];
    for (int k = 0; k <= nstep; k++) {
        const float num = rmin + rdelta * (float)k + (float)nmax; /* as the reference computes it */
        iscale = kq_div(kq_set1(num), kq_sub(hi, min));
        kq_vf sum_l = zero, sum_l2 = zero, sum_xl = zero;
        for (int i = 0; i < 32; i++) {
            Laux[i] = kq_clamp(kq_round(kq_mul(iscale, kq_sub(x[i], min))), nmax);
            const kq_vf l = kq_cvt(Laux[i]);
            const kq_vf wl = kq_mul(w[i], l);
            sum_l = kq_add(sum_l, wl);
            sum_l2 = kq_add(sum_l2, kq_mul(wl, l));
            sum_xl = kq_add(sum_xl, kq_mul(wl, x[i]));
        }
        const kq_vf det = kq_sub(kq_mul(sum_w, sum_l2), kq_mul(sum_l, sum_l));
        const kq_vm ok = kq_gt(det, zero); /* the reference's `continue` where !(det > 0) */
        if (!kq_any(ok)) continue;
        kq_vf s = kq_div(kq_sub(kq_mul(sum_w, sum_xl), kq_mul(sum_x, sum_l)), det);
        kq_vf m = kq_div(kq_sub(kq_mul(sum_l2, sum_x), kq_mul(sum_l, sum_xl)), det);
        const kq_vm pos = kq_gt(m, zero);
        m = kq_sel(pos, zero, m);
        s = kq_sel(pos, kq_div(sum_xl, sum_l2), s);
        kq_vf err = zero;
        for (int i = 0; i < 32; i++) {
            kq_vf diff = kq_sub(kq_add(kq_mul(s, kq_cvt(Laux[i])), m), x[i]);
            diff = kq_mul(diff, diff);
            err = kq_add(err, kq_mul(w[i], diff));
        }
        const kq_vm better = kq_and(ok, kq_lt(err, best_err));
        if (!kq_any(better)) continue;
        for (int i = 0; i < 32; i++) L[i] = kq_seli(better, Laux[i], L[i]);
        best_err = kq_sel(better, err, best_err);
        scale = kq_sel(better, s, scale);
        min = kq_sel(better, m, min);
    }
    for (int i = 0; i < 32; i++) L[i] = kq_seli(flat, kq_izero(), L[i]);
    *scale_out = kq_sel(flat, zero, scale);
    *neg_min_out = kq_neg(kq_sel(flat, lo, min));
}

/* The rest of quantize_k_asym for one block of 256 (x), given its 8 fits
 * (scales, mins, levels L): the 6-bit scales and mins, d and dmin, and the
 * levels again with the quantized scale and min of each sub-block. */
static KQ_TGT void kq_finish(const float *x, uint8_t *hdr, uint8_t *L, int nmax, const float *scales,
                             const float *mins) {
    moe_k_asym_header(scales, mins, hdr); /* the same code as the reference */
    const uint8_t *s = hdr + 4;
    uint16_t hd, hm;
    memcpy(&hd, hdr, 2);
    memcpy(&hm, hdr + 2, 2);
    const float d = _cvtsh_ss(hd), dmin = _cvtsh_ss(hm);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        moe_q4k_scale_min(j, s, &sc, &m);
        const float dl = d * (float)sc;
        if (dl == 0) continue;
        const kq_vf vml = kq_set1(dmin * (float)m), vdl = kq_set1(dl);
        for (int l = 0; l < 32; l += KQ_NL) {
            int32_t q[KQ_NL];
            kq_storei(q, kq_clamp(kq_round(kq_div(kq_add(kq_load(x + 32 * j + l), vml), vdl)), nmax));
            for (int t = 0; t < KQ_NL && l + t < 32; t++) L[32 * j + l + t] = (uint8_t)q[t];
        }
    }
}

/*
 * quantize_k_asym of quant.c for KQ_NL / 8 blocks at x (256 weights each,
 * consecutive), written at y with `bytes` per block: the fits lane-parallel,
 * then kq_finish and the packing of each block. With one = 1 only the first
 * block is real (lanes of the second repeat it) and only it is written.
 */
static KQ_TGT void kq_blocks(const float *x, uint8_t *y, size_t bytes, int nmax, float rmin, int nstep, int q5,
                             int one) {
    float xt[32][KQ_NL], sc[KQ_NL], mn[KQ_NL];
    int32_t lt[32][KQ_NL];
    kq_vf xv[32], wv[32], scale, neg_min;
    kq_vi L[32];
    for (int i = 0; i < 32; i++)
        for (int j = 0; j < KQ_NL; j++) xt[i][j] = x[32 * (one ? j % 8 : j) + i];
    kq_vf sum_x2 = kq_set1(0.0f);
    for (int i = 0; i < 32; i++) {
        xv[i] = kq_load(xt[i]);
        sum_x2 = kq_add(sum_x2, kq_mul(xv[i], xv[i]));
    }
    const kq_vf av_x = kq_sqrt(kq_div(sum_x2, kq_set1(32.0f)));
    for (int i = 0; i < 32; i++) wv[i] = kq_add(av_x, kq_abs(xv[i]));
    kq_fit(xv, wv, L, &scale, &neg_min, nmax, rmin, 0.1f, nstep);
    kq_store(sc, scale);
    kq_store(mn, neg_min);
    for (int i = 0; i < 32; i++) kq_storei(lt[i], L[i]);
    for (int b = 0; b < (one ? 1 : KQ_NL / 8); b++) {
        uint8_t Lb[MOE_QK_K];
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 32; i++) Lb[32 * j + i] = (uint8_t)lt[i][8 * b + j];
        uint8_t *blk = y + bytes * (size_t)b;
        kq_finish(x + MOE_QK_K * b, blk, Lb, nmax, sc + 8 * b, mn + 8 * b);
        if (q5) { /* quantize_q5_K's packing: bit 4 to qh */
            uint8_t *qh = blk + offsetof(moe_block_q5_K, qh), *q = blk + offsetof(moe_block_q5_K, qs);
            memset(qh, 0, 32);
            for (int w = 0; w < MOE_QK_K; w++)
                if (Lb[w] > 15) qh[w % 32] = (uint8_t)(qh[w % 32] | (1u << (w / 32)));
            for (int c = 0; c < 4; c++)
                for (int l = 0; l < 32; l++)
                    q[32 * c + l] = (uint8_t)((Lb[64 * c + l] & 15) | ((Lb[64 * c + 32 + l] & 15) << 4));
        } else { /* quantize_q4_K's nibbles */
            uint8_t *q = blk + offsetof(moe_block_q4_K, qs);
            for (int c = 0; c < 4; c++)
                for (int l = 0; l < 32; l++) q[32 * c + l] = (uint8_t)(Lb[64 * c + l] | (Lb[64 * c + 32 + l] << 4));
        }
    }
}

/*
 * The row kernels: nb blocks, KQ_NL / 8 at a time where they can. A block
 * holding a NaN goes to the reference itself (moe_quant_ref_blocks): a NaN's
 * payload can become a level there, and which of two NaNs an addition returns
 * depends on the operand order the compiler picked for the reference. Without
 * NaNs in the input every NaN that arises is the default one, whatever the
 * order, and its level is 0 (and sign never reaches a byte).
 */
static KQ_TGT void kq_rows(const float *x, uint8_t *y, int64_t nb, size_t bytes, int nmax, float rmin, int nstep,
                           int q5, enum moe_qtype t) {
    int64_t i = 0;
    while (i < nb) {
        const float *xb = x + MOE_QK_K * i;
        uint8_t *yb = y + bytes * (size_t)i;
        if (kq_has_nan(xb)) {
            moe_quant_ref_blocks(t, xb, yb, 1);
            i++;
        } else if (KQ_NL == 16 && i + 1 < nb && !kq_has_nan(xb + MOE_QK_K)) {
            kq_blocks(xb, yb, bytes, nmax, rmin, nstep, q5, 0);
            i += 2;
        } else {
            kq_blocks(xb, yb, bytes, nmax, rmin, nstep, q5, KQ_NL == 16);
            i++;
        }
    }
}

static KQ_TGT void quant_q4_K(const float *x, void *y, int64_t nb) {
    kq_rows(x, y, nb, sizeof(moe_block_q4_K), 15, -1.0f, 20, 0, MOE_QTYPE_Q4_K);
}
static KQ_TGT void quant_q5_K(const float *x, void *y, int64_t nb) {
    kq_rows(x, y, nb, sizeof(moe_block_q5_K), 31, -0.5f, 15, 1, MOE_QTYPE_Q5_K);
}
