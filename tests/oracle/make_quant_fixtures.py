#!/usr/bin/env python3
"""Build the quantization fixtures under tests/fixtures/quant/ (not run by CI).

For every type in formats/moe-quant.h the fixture holds input rows, the quantized
bytes of an independent implementation, and the floats that gguf's numpy code
dequantizes those bytes to. tests/test-quant.c checks that moe_quantize_row gives
the same bytes and moe_dequantize_row the same floats, bit for bit.

Oracles:
  * gguf.quants.quantize (gguf 0.19) for f16, bf16, q8_0, q4_0 and mxfp4, the types
    it can quantize (it raises NotImplementedError for the k-quants; checked below);
    for mxfp4 the script also checks that ggml's quantize_row_mxfp4_ref agrees.
  * ggml's reference quantizers quantize_row_{q2,q3,q4,q5,q6,q8}_K_ref from
    ggml-quants.c, compiled here into a small shared library (no -march, and
    -ffp-contract=off, so no multiply-add is fused; -DNDEBUG, as in release
    builds) and called through ctypes.
    The source comes from the llama-cpp-python sdist, which vendors llama.cpp:
        pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/g
        tar xzf /tmp/g/llama_cpp_python-0.3.36.tar.gz -C /tmp/g
        python3 tests/oracle/make_quant_fixtures.py \
            --ggml-src /tmp/g/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml
  * gguf.quants.dequantize for every type except q8_k, which gguf cannot read;
    q8_k's floats are d * q in float32 computed with numpy (ggml's formula).

Input rows: synthetic (normal, outliers, zeros, constant, tiny, f32-subnormal,
large, exact rounding ties, mixed block scales, positive-only, sparse) and real
weights: 512-element slices of four tensors of stories260K (read with the
safetensors package). Plus, per type, a block of random bytes (with sane f16
scales) to exercise every bit pattern of the dequantizer.

The script also prints (and writes to stats.txt) the relative RMSE of each
k-quant on the normal and real-weight rows, as quantized by ggml and
dequantized by gguf: the error bounds quoted in moe-quant.h and the test.

Usage:  python3 tests/oracle/make_quant_fixtures.py --ggml-src DIR [--out DIR]
Needs:  numpy (2.4 used), gguf (0.19.0), safetensors (0.8.0), a C compiler.
Deterministic: fixed seeds; rerunning gives identical files.
"""
import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "..", "shared", "models", "stories260K", "stories260K.safetensors")

ORIGIN_RANDOM, ORIGIN_GGUF, ORIGIN_GGML, ORIGIN_NUMPY = 0, 1, 2, 3

# name -> (ggml type, row length for input-derived cases, quantizer origin)
TYPES = {
    "f16": (T.F16, 256, ORIGIN_GGUF),
    "bf16": (T.BF16, 256, ORIGIN_GGUF),
    "q8_0": (T.Q8_0, 256, ORIGIN_GGUF),
    "q4_0": (T.Q4_0, 256, ORIGIN_GGUF),
    "q2_k": (T.Q2_K, 512, ORIGIN_GGML),
    "q3_k": (T.Q3_K, 512, ORIGIN_GGML),
    "q4_k": (T.Q4_K, 512, ORIGIN_GGML),
    "q5_k": (T.Q5_K, 512, ORIGIN_GGML),
    "q6_k": (T.Q6_K, 512, ORIGIN_GGML),
    "q8_k": (T.Q8_K, 512, ORIGIN_GGML),
    "mxfp4": (T.MXFP4, 256, ORIGIN_GGUF),
}

# byte offsets of the f16 scale fields (set to sane values in random-byte blocks)
F16_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
GGML_REF = {T.Q2_K: "q2_K", T.Q3_K: "q3_K", T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K",
            T.Q8_K: "q8_K", T.MXFP4: "mxfp4"}

ROW = 512


def input_rows():
    """The named input rows (float32, 512 elements each)."""
    rng = np.random.default_rng(20240601)
    rows = []
    f = np.float32
    rows.append(("normal", rng.standard_normal(ROW).astype(f)))
    x = (rng.standard_normal(ROW) * 0.02).astype(f)
    idx = rng.choice(ROW, 6, replace=False)
    x[idx] = (rng.choice([-1, 1], 6) * rng.uniform(30, 100, 6) * 0.02).astype(f)
    rows.append(("outliers", x))
    rows.append(("zeros", np.zeros(ROW, f)))
    rows.append(("constant", np.full(ROW, 0.7, f)))
    rows.append(("tiny", (rng.standard_normal(ROW) * 1e-5).astype(f)))
    rows.append(("f32-subnormal", (rng.standard_normal(ROW) * 1e-39).astype(f)))
    rows.append(("large", (rng.standard_normal(ROW) * 2e4).astype(f)))
    # exact ties: 127 in each block of 32 makes q8_0's d = 1, so x*(1/d) = k + 0.5
    t = (rng.integers(-126, 126, ROW) + 0.5).astype(f)
    t[::32] = 127.0
    rows.append(("ties", t))
    scales = 10.0 ** rng.uniform(-4, 2, ROW // 32)
    rows.append(("mixed-scales", (rng.standard_normal(ROW) * np.repeat(scales, 32)).astype(f)))
    rows.append(("positive", rng.uniform(0, 1, ROW).astype(f)))
    x = np.zeros(ROW, f)
    idx = rng.choice(ROW, 12, replace=False)
    x[idx] = rng.standard_normal(12).astype(f)
    rows.append(("sparse", x))
    w = load_file(MODEL)
    for name in ["tok_embeddings.weight", "layers.0.attention.wq.weight",
                 "layers.2.feed_forward.w2.weight", "layers.4.attention.wv.weight"]:
        rows.append(("real:" + name, np.ascontiguousarray(w[name].reshape(-1)[:ROW], dtype=f)))
    return rows


def build_ggml(src):
    """Compile ggml-quants.c (+ stubs for the few ggml symbols it references)."""
    d = tempfile.mkdtemp(prefix="ggmlq-")
    stub = os.path.join(d, "stubs.c")
    with open(stub, "w") as fh:
        fh.write("#include <stdio.h>\n#include <stdlib.h>\n#include <stddef.h>\n"
                 "void ggml_abort(const char *f, int l, const char *fmt, ...) "
                 "{ fprintf(stderr, \"ggml_abort %s:%d\\n\", f, l); abort(); }\n"
                 "size_t ggml_row_size(int t, long n) { abort(); }\n"
                 "const char *ggml_type_name(int t) { return \"?\"; }\n"
                 "size_t ggml_type_size(int t) { abort(); }\n")
    lib = os.path.join(d, "libggmlq.so")
    s = os.path.join(src, "src")
    # -DNDEBUG as in release builds: ggml asserts |v| < 2^22 in nearest_int, which the
    # f32-subnormal row violates (1/d overflows); release ggml then rounds as the
    # magic-number trick does, and moe_quantize_row reproduces that.
    cmd = ["cc", "-O2", "-DNDEBUG", "-fPIC", "-shared", "-std=gnu11", "-ffp-contract=off",
           "-I" + s, "-I" + os.path.join(src, "include"),
           os.path.join(s, "ggml-quants.c"), stub, "-o", lib, "-lm"]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(lib)


def ggml_quantize(lib, qt, x):
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    out = np.zeros(len(x) // bs * ts, np.uint8)  # zeroed: q8_k leaves bsums of zero blocks unset
    xx = np.ascontiguousarray(x, np.float32)
    getattr(lib, "quantize_row_%s_ref" % GGML_REF[qt])(
        xx.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int64(len(x)))
    return out


def ggml_dequantize(lib, qt, q, n):
    y = np.zeros(n, np.float32)
    getattr(lib, "dequantize_row_%s" % GGML_REF[qt])(
        q.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return y


def dequantize(qt, q, n):
    if qt == T.Q8_K:  # gguf cannot read q8_k: d (f32) * q, in float32
        b = q.reshape(-1, 292)
        d = b[:, 0:4].copy().view(np.float32)
        qs = b[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (qs * d).reshape(-1)[:n].astype(np.float32), ORIGIN_NUMPY
    return np.asarray(gguf.quants.dequantize(q, qt), np.float32).reshape(-1), ORIGIN_GGUF


def random_bytes(qt, n, rng):
    """Random block bytes with sane f16 scales (or random non-NaN f16/bf16 values)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    if qt in (T.F16, T.BF16):
        h = rng.integers(0, 65536, n).astype(np.uint16)
        exp_all_ones = (h & 0x7c00) == 0x7c00 if qt == T.F16 else (h & 0x7f80) == 0x7f80
        h[exp_all_ones] &= 0x83ff if qt == T.F16 else 0x807f  # no inf/NaN: exponent -> 0
        return h.view(np.uint8)
    b = rng.integers(0, 256, (n // bs, ts)).astype(np.uint8)
    if qt == T.Q8_K:
        b[:, 0:4] = (rng.standard_normal(n // bs) * 0.01).astype(np.float32).view(np.uint8).reshape(-1, 4)
    if qt == T.MXFP4:  # e8m0 scales 2^-28 .. 2^12 (and the two subnormal codes): finite values
        b[:, 0] = rng.integers(100, 140, n // bs).astype(np.uint8)
        b[:2, 0] = [0, 1]
    for off in F16_FIELDS.get(qt, []):
        v = (rng.standard_normal(n // bs) * 0.01).astype(np.float16)
        b[:, off:off + 2] = v.view(np.uint8).reshape(-1, 2)
    return b.reshape(-1)


def rel_rmse(x, y):
    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
    return float(np.sqrt(np.mean((x.astype(np.float64) - y) ** 2))) / rms if rms > 0 else 0.0


GOLDEN, MIX1, MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(z):
    """splitmix64's finalizer on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


def bulk_input(rows, n, seed):
    """The bulk rows, exactly as tests/test-quant.c's bulk_value() makes them.

    Element idx (row-major) is (((u0 + u1) + u2) + u3 - 2) * 2^(row % 16 - 8), times
    8 when idx % 61 == 0, in float32, with u_k = (mix64(seed + (4*idx + k) * GOLDEN)
    >> 40) * 2^-24: a bell-shaped distribution with varying scale and outliers.
    Every operation is exact or a single IEEE float32 rounding, so C and numpy agree.
    """
    idx = np.arange(rows * n, dtype=np.uint64)
    u = [(mix64(np.uint64(seed) + (idx * np.uint64(4) + np.uint64(k)) * GOLDEN) >> np.uint64(40))
         .astype(np.float32) * np.float32(2.0 ** -24) for k in range(4)]
    x = ((u[0] + u[1]) + u[2]) + u[3] - np.float32(2)
    row = (idx // np.uint64(n)).astype(np.int64)
    x = x * np.exp2((row % 16) - 8).astype(np.float32)
    x = np.where(idx % np.uint64(61) == 0, x * np.float32(8), x)
    return x.astype(np.float32)


def bulk_hash(b):
    """Position-dependent 64-bit hash of a byte string: the wrapping sum over its
    little-endian 64-bit words w_i (zero-padded) of mix64(w_i + i * GOLDEN)."""
    b = bytes(b)
    b += b"\0" * (-len(b) % 8)
    w = np.frombuffer(b, dtype="<u8")
    i = np.arange(len(w), dtype=np.uint64)
    return int(np.sum(mix64(w + i * GOLDEN), dtype=np.uint64))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ggml-src", required=True,
                    help="llama.cpp's ggml/ directory (holding src/ggml-quants.c)")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "quant"))
    args = ap.parse_args()

    for qt in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        try:
            gguf.quants.quantize(np.zeros(256, np.float32), qt)
            sys.exit("gguf can quantize %s now: use it as the oracle" % qt.name)
        except NotImplementedError:
            pass

    lib = build_ggml(args.ggml_src)
    rows = input_rows()
    os.makedirs(args.out, exist_ok=True)

    with open(os.path.join(args.out, "inputs.bin"), "wb") as fh:
        fh.write(b"MOEQIN01" + struct.pack("<I", len(rows)))
        for name, x in rows:
            fh.write(name.encode()[:31].ljust(32, b"\0") + struct.pack("<I", len(x)) + x.tobytes())

    stats = ["relative RMSE = rms(dequantize(quantize(x)) - x) / rms(x); quantized by ggml's "
             "reference C, dequantized by gguf", ""]
    agree, mx_agree = [], []
    for tname, (qt, n, origin) in TYPES.items():
        cases = []
        for ri, (name, x) in enumerate(rows):
            xs = x[:n]
            if origin == ORIGIN_GGUF:
                q = np.asarray(gguf.quants.quantize(xs, qt)).view(np.uint8).reshape(-1)
            else:
                q = ggml_quantize(lib, qt, xs)
            y, dorigin = dequantize(qt, q, n)
            cases.append((name, ri, n, origin, dorigin, q, y))
            if origin == ORIGIN_GGML and qt != T.Q8_K:
                gy = ggml_dequantize(lib, qt, q, n)
                agree.append(np.array_equal(gy.view(np.uint32), y.view(np.uint32)))
            if qt == T.MXFP4:  # gguf's numpy quantizer and ggml's C one give the same bytes
                mx_agree.append(np.array_equal(ggml_quantize(lib, qt, xs), q))
            if qt not in (T.F16, T.BF16) and (name in ("normal", "outliers") or name.startswith("real:")):
                stats.append("%-5s %-40s %.5f" % (tname, name, rel_rmse(xs, y)))
        rng = np.random.default_rng(7 + int(qt))
        nr = 768 if gguf.GGML_QUANT_SIZES[qt][0] == 256 else 256
        q = random_bytes(qt, nr, rng)
        y, dorigin = dequantize(qt, q, nr)
        cases.append(("random-bytes", -1, nr, ORIGIN_RANDOM, dorigin, q, y))
        with open(os.path.join(args.out, tname + ".bin"), "wb") as fh:
            fh.write(b"MOEQFX01" + struct.pack("<II", int(qt), len(cases)))
            for name, ri, cn, qo, do, q, y in cases:
                assert len(q) == cn // gguf.GGML_QUANT_SIZES[qt][0] * gguf.GGML_QUANT_SIZES[qt][1]
                fh.write(name.encode()[:31].ljust(32, b"\0"))
                fh.write(struct.pack("<iIII", ri, cn, qo, do))
                fh.write(q.tobytes() + y.astype("<f4").tobytes())
        stats.append("")
    bulk = ["# type rows n seed quant_hash dequant_hash (see README.md)"]
    for tname, (qt, _, origin) in TYPES.items():
        rows_b, n_b, seed = 64, 4096, 1000 + int(qt)
        x = bulk_input(rows_b, n_b, seed)
        if origin == ORIGIN_GGUF:
            q = np.asarray(gguf.quants.quantize(x.reshape(rows_b, n_b), qt)).view(np.uint8).reshape(-1)
        else:
            q = ggml_quantize(lib, qt, x)
        y, _ = dequantize(qt, q, rows_b * n_b)
        bulk.append("%s %d %d %d 0x%016x 0x%016x" % (tname, rows_b, n_b, seed, bulk_hash(q.tobytes()),
                                                    bulk_hash(y.astype("<f4").tobytes())))
    with open(os.path.join(args.out, "bulk.txt"), "w") as fh:
        fh.write("\n".join(bulk) + "\n")
    stats.append("ggml's C dequantizers == gguf's numpy dequantize on all %d k-quant cases: %s"
                  % (len(agree), all(agree)))
    stats.append("ggml's C quantize_row_mxfp4_ref == gguf's numpy MXFP4 quantizer on all %d input rows: %s"
                  % (len(mx_agree), all(mx_agree)))
    text = "\n".join(stats) + "\n"
    with open(os.path.join(args.out, "stats.txt"), "w") as fh:
        fh.write(text)
    print(text)
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print("wrote %s (%d bytes)" % (args.out, total))


if __name__ == "__main__":
    main()
