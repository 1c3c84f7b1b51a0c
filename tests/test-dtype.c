/* test-dtype.c - f16/bf16 <-> f32 conversions against exhaustive and known values;
 * every float8 e4m3fn code against the format's definition and against torch's
 * values (tests/fixtures/models/deepseek_v3-fp8/oracle/f8_e4m3_values.f32). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moe-dtype.h"
#include "moe-mmap.h"
#include "moe-test.h"

/* e4m3_by_definition: the value of an e4m3fn code computed from the format's
 * definition with ldexp (independent of the bit manipulation under test):
 * (-1)^s 2^(e-7) (1 + m/8), subnormals (-1)^s 2^-6 m/8, e = 15 with m = 7 NaN. */
static float e4m3_by_definition(unsigned c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return (float)(s ? -v : v);
}

/* check_e4m3: all 256 codes, by definition and against torch's table. */
static void check_e4m3(void) {
    CHECK(moe_dtype_size(MOE_DTYPE_F8_E4M3) == 1 && !strcmp(moe_dtype_name(MOE_DTYPE_F8_E4M3), "F8_E4M3"),
          "F8_E4M3 size and name");
    CHECK(moe_f8_e4m3_to_f32(0x7e) == 448.0f && moe_f8_e4m3_to_f32(0xfe) == -448.0f, "e4m3 largest finite");
    CHECK(moe_f8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9), "e4m3 smallest subnormal");
    CHECK(moe_f8_e4m3_to_f32(0x38) == 1.0f && moe_f8_e4m3_to_f32(0x08) == ldexpf(1.0f, -6), "e4m3 1.0, min normal");
    CHECK(isnan(moe_f8_e4m3_to_f32(0x7f)) && isnan(moe_f8_e4m3_to_f32(0xff)), "e4m3 NaN codes");
    CHECK(moe_f8_e4m3_to_f32(0x80) == 0.0f && signbit(moe_f8_e4m3_to_f32(0x80)), "e4m3 -0");
    char *torch = NULL;
    size_t len = 0;
    const char *path = MOE_FIXTURES "/models/deepseek_v3-fp8/oracle/f8_e4m3_values.f32";
    CHECK(moe_read_file(path, 4096, &torch, &len) == MOE_OK && len == 256 * 4, "%s: 256 floats", path);
    int bad = 0;
    for (unsigned c = 0; c < 256 && bad < 5; c++) {
        const float got = moe_f8_e4m3_to_f32((uint8_t)c), def = e4m3_by_definition(c);
        float t = NAN;
        if (torch && len == 256 * 4) memcpy(&t, torch + 4 * c, 4);
        const int ok_def = isnan(def) ? isnan(got) : (got == def && signbit(got) == signbit(def));
        const int ok_torch = isnan(t) ? isnan(got) : (got == t && signbit(got) == signbit(t));
        CHECK(ok_def && ok_torch, "e4m3 code 0x%02x: %g, by definition %g, torch %g", c, (double)got, (double)def,
              (double)t);
        bad += !(ok_def && ok_torch);
        uint8_t code = (uint8_t)c;
        float row;
        moe_convert_row_f32(MOE_DTYPE_F8_E4M3, &code, &row, 1);
        CHECK(isnan(got) ? isnan(row) : row == got, "e4m3 row conversion of 0x%02x", c);
    }
    free(torch);
}


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
    check_e4m3();
    printf("test-dtype: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}
