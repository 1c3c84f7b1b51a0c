#!/usr/bin/env python3
"""Input rate of `moe-prep quantize` against `llama-quantize` (issue 18). Not run by CI.

    python3 tests/bench/bench-quantize-rate.py --model /tmp/moe-llama/synth-mixtral \\
        --gguf /tmp/moe-llama/synth-bf16.gguf --llama-bin /tmp/moe-llama/llama-build/bin \\
        --types q8_0,q4_k --reps 3 --cache cold

Runs both quantizers exactly as tests/bench/bench-llama.py does (2 threads):
    moe-prep quantize MODEL -o OUT.moeb --experts T --dense T -t 2
    llama-quantize --pure MODEL-bf16.gguf OUT.gguf FTYPE 2
one after the other, the order alternating between rounds, and prints each
run's input rate (BF16 input bytes / wall seconds, MB/s) and the medians.
Page cache: `cold` drops the input files' cached pages before each run
(posix_fadvise DONTNEED; other files are left alone), `warm` reads them once
before each run; each output is deleted right after its run (not timed), so a
run never pays for the previous one's writeback. --extra-moe-prep BIN adds a
second moe-prep binary (e.g. a build of an older commit) to the same rounds.
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LLAMA_FTYPE = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q2_k": "Q2_K", "q3_k": "Q3_K_M", "q4_k": "Q4_K_M",
               "q5_k": "Q5_K_M", "q6_k": "Q6_K"}


def cache(paths, mode):
    """Drop (cold) or load (warm) the page-cache pages of the input files."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            if mode == "cold":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 16 << 20):
                    pass
        finally:
            os.close(fd)


def timed(cmd):
    """Wall seconds of a command (fails loudly)."""
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    t = time.time() - t0
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-2000:] + r.stderr[-2000:])
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (BF16 safetensors)")
    ap.add_argument("--gguf", required=True, help="the same model as a BF16 GGUF")
    ap.add_argument("--llama-bin", required=True, help="directory holding llama-quantize")
    ap.add_argument("--moe-prep", default=os.path.join(REPO, "build", "moe-prep"))
    ap.add_argument("--extra-moe-prep", default=None, help="a second moe-prep binary timed alongside")
    ap.add_argument("--work", default="/tmp/moe-qrate", help="where the outputs go (deleted after each run)")
    ap.add_argument("--types", default="q8_0,q4_k")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", choices=["cold", "warm"], default="cold")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    st_files = sorted(glob.glob(os.path.join(a.model, "*.safetensors")))
    st_bytes = sum(os.path.getsize(f) for f in st_files)
    g_bytes = os.path.getsize(a.gguf)
    runners = [("moe-prep", a.moe_prep)]
    if a.extra_moe_prep:
        runners.append(("moe-prep(extra)", a.extra_moe_prep))
    runners.append(("llama-quantize", None))
    rates = {}
    for t in a.types.split(","):
        for rep in range(a.reps):
            order = runners if rep % 2 == 0 else runners[::-1]
            for name, binary in order:
                if binary:
                    out = os.path.join(a.work, f"q-{t}.moeb")
                    cmd = [binary, "quantize", a.model, "-o", out, "--experts", t, "--dense", t, "-t", str(a.threads)]
                    inputs, nbytes = st_files, st_bytes
                else:
                    out = os.path.join(a.work, f"q-{t}.gguf")
                    cmd = [os.path.join(a.llama_bin, "llama-quantize"), "--pure", a.gguf, out, LLAMA_FTYPE[t],
                           str(a.threads)]
                    inputs, nbytes = [a.gguf], g_bytes
                cache(inputs, a.cache)
                load = os.getloadavg()[0]
                s = timed(cmd)
                os.remove(out)
                r = nbytes / s / 1e6
                rates.setdefault((t, name), []).append(r)
                print(f"{t} round {rep + 1} {name:16s} {s:7.2f} s {r:7.1f} MB/s (load {load:.2f})", flush=True)
    print(f"\nmedians ({a.cache} page cache, {a.threads} threads, {a.reps} rounds):")
    for t in a.types.split(","):
        ll = statistics.median(rates[(t, "llama-quantize")])
        for name, _ in runners:
            m = statistics.median(rates[(t, name)])
            extra = "" if name == "llama-quantize" else f"  ratio {m / ll:.2f}x"
            print(f"  {t:5s} {name:16s} {m:7.1f} MB/s{extra}")


if __name__ == "__main__":
    main()
