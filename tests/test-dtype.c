/* test-dtype.c - f16/bf16 <-> f32 conversions against exhaustive and known values. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe-dtype.h"
#include "moe-test.h"


int main(void) {
    /* known half values */
    CHECK(moe_f16_to_f32(0x3c00) == 1.0f, "f16 1.0");
    CHECK(moe_f16_to_f32(0xc000) == -2.0f, "f16 -2.0");
    CHECK(moe_f16_to_f32(0x7bff) == 65504.0f, "f16 max");
    CHECK(moe_f16_to_f32(0x0001) == ldexpf(1.0f, -24), "f16 smallest subnormal");
    CHECK(moe_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24), "f16 largest subnormal");
    CHECK(isinf(moe_f16_to_f32(0x7c00)), "f16 inf");
    CHECK(isnan(moe_f16_to_f32(0x7e00)), "f16 nan");
    /* every finite half survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = moe_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        uint16_t back = moe_f32_to_f16(f);
        CHECK(back == h, "f16 round trip of 0x%04x gave 0x%04x", h, back);
        if (back != h) break;
    }
    /* rounding: halfway cases go to even */
    CHECK(moe_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "tie to even (down)");
    CHECK(moe_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02, "tie to even (up)");
    CHECK(moe_f32_to_f16(1e6f) == 0x7c00, "overflow to inf");
    CHECK(moe_f32_to_f16(ldexpf(1.0f, -26)) == 0x0000, "underflow to zero");
    CHECK(moe_f32_to_f16(ldexpf(3.0f, -26)) == 0x0001, "rounds up to smallest subnormal");
    /* bf16 */
    CHECK(moe_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(moe_f32_to_bf16(1.0f) == 0x3f80, "bf16 from 1.0");
    CHECK(moe_f32_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3f80, "bf16 tie to even");
    CHECK(moe_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)) == 0x3f82, "bf16 tie up");
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = moe_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        CHECK(moe_f32_to_bf16(f) == h, "bf16 round trip 0x%04x", h);
    }
    /* row conversion */
    uint16_t row[3] = {0x3c00, 0x4000, 0xbc00};
    float out[3];
    moe_convert_row_f32(MOE_DTYPE_F16, row, out, 3);
    CHECK(out[0] == 1.0f && out[1] == 2.0f && out[2] == -1.0f, "f16 row");
    printf("test-dtype: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}
