#!/usr/bin/env python3
"""Build tests/fixtures/quant/act.bin: activation quantization and integer dot
products from independent implementations (not run by CI).

tests/test-quant.c checks against it, without Python:
  * moe_quantize_act gives, bit for bit, gguf.quants.quantize(Q8_0) for q8_0
    activations and ggml's quantize_row_q8_K_ref (C; what llama.cpp's x86 CPU
    backend uses for activations) for q8_k ones (gguf 0.19 cannot quantize q8_k;
    the script checks that this is still so);
  * moe_vec_dot_act agrees, within its stated tolerance, with ggml's generic C
    dot products ggml_vec_dot_{q8_0,q4_0}_q8_0_generic and
    ggml_vec_dot_{q2,q3,q4,q5,q6}_K_q8_K_generic on those activations (ggml
    accumulates in float in its own order, so the results are not bit-identical).

ggml is compiled from the llama-cpp-python sdist (which vendors llama.cpp),
ggml-quants.c and ggml-cpu/quants.c only, with `cc -O2 -DNDEBUG
-ffp-contract=off` and no -march (so the generic C code, no FMA):
    pip install gguf numpy
    pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/g
    tar xzf /tmp/g/llama_cpp_python-0.3.36.tar.gz -C /tmp/g
    python3 tests/oracle/make_act_fixtures.py \\
        --ggml-src /tmp/g/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml

Activation rows (1024 elements each): normal; rmsnorm-like (per-channel gains
and four massive channels); swiglu (silu(a) * b, heavy-tailed); sparse (80 %
zeros); tiny (q8_0's f16 scales become subnormal or zero); exact rounding ties
for both q8_0 (half-away) and q8_k (half-even); mixed block scales; some
all-zero blocks; equal-magnitude maxima of both signs (q8_k keeps the sign of
the first). Weight rows (1024 elements) per type: N(0, 0.02^2) with outliers,
quantized by gguf (q8_0, q4_0) or ggml's reference quantizers (k-quants), and
random bytes with sane f16 scales.

Output format: see tests/fixtures/quant/README.md ("act.bin").
Deterministic (fixed seeds).
"""
import argparse
import ctypes
import os
import struct
import subprocess
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
N = 1024

# weight type -> (ggml name stem, activation type, quantizer origin)
WTYPES = [
    (T.Q8_0, "q8_0", T.Q8_0, "gguf"),
    (T.Q4_0, "q4_0", T.Q8_0, "gguf"),
    (T.Q2_K, "q2_K", T.Q8_K, "ggml"),
    (T.Q3_K, "q3_K", T.Q8_K, "ggml"),
    (T.Q4_K, "q4_K", T.Q8_K, "ggml"),
    (T.Q5_K, "q5_K", T.Q8_K, "ggml"),
    (T.Q6_K, "q6_K", T.Q8_K, "ggml"),
]
# byte offsets of the f16 scale fields (random-byte rows get sane values there)
F16_FIELDS = {T.Q8_0: [0], T.Q4_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2],
              T.Q5_K: [0, 2], T.Q6_K: [208]}


def act_rows():
    rng = np.random.default_rng(20250118)
    f = np.float32
    rows = [("normal", rng.standard_normal(N).astype(f))]
    g = np.abs(1.0 + 0.3 * rng.standard_normal(N))
    x = rng.standard_normal(N) * g
    x[rng.choice(N, 4, replace=False)] *= 50.0
    rows.append(("rmsnorm", x.astype(f)))
    a, b = rng.standard_normal(N) * 1.5, rng.standard_normal(N) * 1.5
    rows.append(("swiglu", (a / (1.0 + np.exp(-a)) * b).astype(f)))
    x = rng.standard_normal(N)
    x[rng.random(N) < 0.8] = 0.0
    rows.append(("sparse", x.astype(f)))
    rows.append(("tiny", (rng.standard_normal(N) * 1e-6).astype(f)))
    t = (rng.integers(-126, 126, N) + 0.5)
    t[::32] = 127.0
    rows.append(("ties", t.astype(f)))
    scales = 10.0 ** rng.uniform(-4, 2, N // 32)
    rows.append(("mixed-scales", (rng.standard_normal(N) * np.repeat(scales, 32)).astype(f)))
    x = rng.standard_normal(N)
    x[32:64] = 0.0
    x[256:512] = 0.0
    rows.append(("zero-blocks", x.astype(f)))
    x = rng.uniform(-1, 1, N)
    for s in range(0, N, 32):
        x[s + 3], x[s + 17] = (-2.5, 2.5) if (s // 32) % 2 == 0 else (2.5, -2.5)
    rows.append(("signed-max", x.astype(f)))
    return rows


def build_ggml(src):
    """Compile ggml-quants.c and ggml-cpu/quants.c (generic C) with stubs."""
    d = tempfile.mkdtemp(prefix="ggmlact-")
    stub = os.path.join(d, "stubs.c")
    with open(stub, "w") as fh:
        fh.write("#include <stdio.h>\n#include <stdlib.h>\n#include <stddef.h>\n"
                 "void ggml_abort(const char *f, int l, const char *fmt, ...) "
                 "{ fprintf(stderr, \"ggml_abort %s:%d\\n\", f, l); abort(); }\n"
                 "size_t ggml_row_size(int t, long n) { abort(); }\n"
                 "const char *ggml_type_name(int t) { return \"?\"; }\n"
                 "size_t ggml_type_size(int t) { abort(); }\n"
                 "float ggml_table_f32_f16[1 << 16];\n")
    lib = os.path.join(d, "libggmlact.so")
    s = os.path.join(src, "src")
    cmd = ["cc", "-O2", "-DNDEBUG", "-fPIC", "-shared", "-std=gnu11", "-ffp-contract=off",
           "-I" + s, "-I" + os.path.join(src, "include"), "-I" + os.path.join(s, "ggml-cpu"),
           os.path.join(s, "ggml-quants.c"), os.path.join(s, "ggml-cpu", "quants.c"), stub, "-o", lib, "-lm"]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(lib)
    # the f16 -> f32 table ggml's CPU backend fills at init (exact conversions)
    tbl = (ctypes.c_float * 65536).in_dll(lib, "ggml_table_f32_f16")
    vals = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    ctypes.memmove(tbl, vals.ctypes.data, 65536 * 4)
    return lib


def ggml_quantize(lib, stem, x):
    qt = getattr(T, stem.upper())
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    out = np.zeros(len(x) // bs * ts, np.uint8)
    xx = np.ascontiguousarray(x, np.float32)
    getattr(lib, "quantize_row_%s_ref" % stem)(xx.ctypes.data_as(ctypes.c_void_p),
                                              out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(x)))
    return out


def ggml_dot(lib, stem, act, w, a):
    s = ctypes.c_float(0)
    fn = getattr(lib, "ggml_vec_dot_%s_%s_generic" % (stem, "q8_0" if act == T.Q8_0 else "q8_K"))
    fn(ctypes.c_int(N), ctypes.byref(s), ctypes.c_size_t(0), w.ctypes.data_as(ctypes.c_void_p),
       ctypes.c_size_t(0), a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0), ctypes.c_int(1))
    return s.value


def random_bytes(qt, rng):
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, (N // bs, ts)).astype(np.uint8)
    for off in F16_FIELDS[qt]:
        v = (rng.standard_normal(N // bs) * 0.01).astype(np.float16)
        b[:, off:off + 2] = v.view(np.uint8).reshape(-1, 2)
    return b.reshape(-1)


def name32(s):
    b = s.encode()
    assert len(b) < 32
    return b + b"\0" * (32 - len(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ggml-src", required=True, help="llama.cpp's ggml directory")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "quant", "act.bin"))
    args = ap.parse_args()
    try:  # the fixture's q8_k origin is ggml's C because gguf cannot quantize q8_k
        gguf.quants.quantize(np.zeros(256, np.float32), T.Q8_K)
        raise SystemExit("gguf can quantize q8_k now: use it as the oracle")
    except NotImplementedError:
        pass
    lib = build_ggml(args.ggml_src)
    rows = act_rows()
    acts = []
    out = bytearray(b"MOEQAC01")
    out += struct.pack("<II", N, len(rows))
    for name, x in rows:
        q80 = np.asarray(gguf.quants.quantize(x, T.Q8_0), np.uint8).reshape(-1)
        q8k = ggml_quantize(lib, "q8_K", x)
        acts.append((q80, q8k))
        out += name32(name) + x.astype("<f4").tobytes() + q80.tobytes() + q8k.tobytes()
    rng = np.random.default_rng(77)
    wrows = []
    for qt, stem, act, origin in WTYPES:
        w = (rng.standard_normal(N) * 0.02).astype(np.float32)
        w[rng.choice(N, 5, replace=False)] *= 15.0
        if origin == "gguf":
            wq = np.asarray(gguf.quants.quantize(w, qt), np.uint8).reshape(-1)
        else:
            wq = ggml_quantize(lib, stem, w)
        wrows.append((qt, stem, act, "quantized", wq))
        wrows.append((qt, stem, act, "random-bytes", random_bytes(qt, rng)))
    out += struct.pack("<I", len(wrows))
    for qt, stem, act, name, wq in wrows:
        dots = [ggml_dot(lib, stem, act, wq, a[0] if act == T.Q8_0 else a[1]) for a in acts]
        out += struct.pack("<I", int(qt)) + name32(name) + wq.tobytes() + np.asarray(dots, "<f4").tobytes()
    with open(args.out, "wb") as fh:
        fh.write(out)
    print("wrote %s: %d activation rows, %d weight rows x %d dots, %d bytes" %
          (args.out, len(rows), len(wrows), len(rows), len(out)))


if __name__ == "__main__":
    main()
