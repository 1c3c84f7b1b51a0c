#!/usr/bin/env python3
"""Compare two bundles (.moeb) byte for byte where it matters (issue 18). Not run by CI.

    python3 tests/bench/bundle-diff.py before.moeb after.moeb

Checks that both have the same directory offset, the same data region
(every tensor and expert blob, padding included), and the same tensor table
and expert section of the directory (docs/format.md); prints where the
metadata KV blocks differ (two runs of `moe-prep quantize` with the same
command line differ in `provenance.created` only). Exit 0 when the data,
tensors and experts are identical.
"""
import struct
import sys


def header(f):
    h = f.read(128)
    if h[:8] != b"MOEBUNDL":
        raise SystemExit(f"{f.name}: not a bundle")
    return struct.unpack_from("<QQ", h, 32)  # dir_offset, dir_size


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    fa, fb = open(sys.argv[1], "rb"), open(sys.argv[2], "rb")
    (oa, sa), (ob, sb) = header(fa), header(fb)
    if oa != ob:
        print(f"directory offsets differ: {oa} vs {ob}")
        return 1
    ok = True
    fa.seek(4096)
    fb.seek(4096)
    left = oa - 4096
    while left:
        n = min(left, 64 << 20)
        if fa.read(n) != fb.read(n):
            print(f"data region differs in [{oa - left}, {oa - left + n})")
            ok = False
            break
        left -= n
    fa.seek(oa)
    fb.seek(ob)
    da, db = fa.read(sa), fb.read(sb)
    ma, mb = struct.unpack_from("<Q", da, 8)[0], struct.unpack_from("<Q", db, 8)[0]
    if da[32 + ma:] != db[32 + mb:]:
        print("tensor table or expert section differs")
        ok = False
    A, B = da[32:32 + ma], db[32:32 + mb]
    if len(A) != len(B):
        print(f"metadata sizes differ: {len(A)} vs {len(B)}")
    else:
        diffs = [i for i in range(len(A)) if A[i] != B[i]]
        if diffs:
            lo, hi = max(0, diffs[0] - 32), diffs[-1] + 4
            print(f"metadata differs at {len(diffs)} bytes: {A[lo:hi]!r} vs {B[lo:hi]!r}")
    print(f"data region {oa - 4096} bytes, tensors and experts {len(da) - 32 - ma} bytes: "
          + ("identical" if ok else "DIFFERENT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
