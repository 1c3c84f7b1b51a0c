#!/usr/bin/env python3
"""moe-run against llama.cpp on the CPU, side by side (issue 18). Not run by CI.

    python3 tests/bench/bench-llama.py                     # work dir /tmp/moe-llama
    python3 tests/bench/bench-llama.py --models tiny --reps 5 --types q4_k,q8_0

Steps (each skipped when its output exists in the work dir):
  1. builds this project (Release) and llama.cpp from the source distribution
     of llama-cpp-python on PyPI (`pip download --no-binary :all: --no-deps
     llama-cpp-python`, vendor/llama.cpp, CPU only, GGML_NATIVE);
  2. models: the trained demo model (datasets/models/tiny-moe-mixtral) and a
     synthetic Mixtral-shaped checkpoint (hidden 2048, 8 layers, 8 experts of
     5632, top-2, 16 heads, 4 KV heads, vocab 32000: 2.4 B parameters, random
     BF16 weights, tests/bench/make_synthetic_checkpoint.py);
  3. each model as a BF16 GGUF (tests/bench/hf_to_gguf.py), then quantized by
     both projects' own quantizers to the same type everywhere:
     `moe-prep quantize --experts T --dense T` and `llama-quantize --pure`
     (routers and norms stay float32 in both); the input rate of both
     quantizers (BF16 input bytes / wall time, 2 threads) is printed;
  4. the streaming-read bandwidth (bench-quant's f32 sum, 1 and 2 threads)
     at the start of every round;
  5. rounds: for every model, type and thread count, moe-run and llama-bench
     one after the other (the order alternates between rounds): decode
     tokens/s (moe-run: 64 tokens after an 8-token prompt; llama-bench -n 64)
     and prompt tokens/s for 256 and 512 tokens (one batch: moe-run -b 512,
     llama-bench's default batch 2048 / ubatch 512); for the models of
     --threads-inproc also moe-run's decode with 2 threads against 1 in one
     process (tests/bench/bench-decode: a warm-up, then rounds alternating
     the thread counts; llama-bench likewise warms up in its process).
Prints the median of each figure over the rounds, the ratio moe-run /
llama.cpp (of the medians, and the median of the per-round ratios), and for decode the share of the bandwidth bound: active weight
bytes per token (attention, router, the top-k experts, LM head, at the stored
types) over the measured streaming read of the same thread count.
"""
import argparse
import glob
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# bits per weight of the stored types (ggml's block sizes)
BPW = {"q8_0": 8.5, "q4_0": 4.5, "q2_k": 2.625, "q3_k": 3.4375, "q4_k": 4.5, "q5_k": 5.5, "q6_k": 6.5625,
       "bf16": 16, "f16": 16, "f32": 32}
LLAMA_FTYPE = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q2_k": "Q2_K", "q3_k": "Q3_K_M", "q4_k": "Q4_K_M",
               "q5_k": "Q5_K_M", "q6_k": "Q6_K"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    """Run a command (list), fail loudly; returns its stdout."""
    log("+ " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", **kw)
    if r.returncode != 0:
        log(r.stdout[-4000:], r.stderr[-4000:])
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def build_ours(build):
    run(["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DMOE_CUDA=OFF"])
    run(["cmake", "--build", build, "-j2", "--target", "moe-run", "moe-prep", "bench-quant", "bench-decode"])


def build_llama(work):
    """llama.cpp from the llama-cpp-python sdist; returns its bin directory."""
    bindir = os.path.join(work, "llama-build", "bin")
    if os.path.exists(os.path.join(bindir, "llama-bench")) and os.path.exists(os.path.join(bindir, "llama-quantize")):
        return bindir
    dl = os.path.join(work, "sdist")
    os.makedirs(dl, exist_ok=True)
    if not glob.glob(os.path.join(dl, "llama_cpp_python-*.tar.gz")):
        run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "llama-cpp-python", "-d", dl])
    tgz = sorted(glob.glob(os.path.join(dl, "llama_cpp_python-*.tar.gz")))[-1]
    src = tgz[: -len(".tar.gz")]
    if not os.path.isdir(src):
        with tarfile.open(tgz) as t:
            t.extractall(dl)
    lsrc = os.path.join(src, "vendor", "llama.cpp")
    b = os.path.join(work, "llama-build")
    run(["cmake", "-S", lsrc, "-B", b, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=OFF", "-DGGML_NATIVE=ON",
         "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"])
    run(["cmake", "--build", b, "-j2", "--target", "llama-bench", "llama-quantize"])
    return bindir


def model_dims(d):
    c = json.load(open(os.path.join(d, "config.json")))
    H = c["hidden_size"]
    hd = c.get("head_dim") or H // c["num_attention_heads"]
    return dict(H=H, F=c["intermediate_size"], L=c["num_hidden_layers"], qd=c["num_attention_heads"] * hd,
                kvd=c["num_key_value_heads"] * hd, E=c["num_local_experts"], K=c["num_experts_per_tok"],
                V=c["vocab_size"])


def active_bytes(m, t):
    """Weight bytes one decoded token reads: attention, router (f32), top-k experts, LM head."""
    b = BPW[t] / 8
    per_layer = (2 * m["H"] * m["qd"] + 2 * m["H"] * m["kvd"]) * b + m["H"] * m["E"] * 4 + m["K"] * 3 * m["H"] * m["F"] * b
    return m["L"] * per_layer + m["V"] * m["H"] * b


def dir_bytes(d):
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(d, "*.safetensors")))


def stream_gbs(build):
    """Streaming-read GB/s with 1 and 2 threads (bench-quant's f32 sum, 256 MiB)."""
    out = run([os.path.join(build, "tests", "bench-quant"), "--mb", "256", "--reps", "3", "--types", "q8_0",
               "--threads", "2", "--no-quantize", "--csv"])
    g = {}
    for line in out.splitlines():
        f = line.split(",")
        if f[0] == "stream":
            g[1] = float(f[6])
        elif f[0] == "stream2":
            g[2] = float(f[6])
    return g


def ours_run(build, bundle, tokens, n_predict, threads, batch):
    """moe-run's stats: (prompt tokens/s, decode tokens/s)."""
    sj = bundle + f".stats-{os.getpid()}.json"
    run([os.path.join(build, "moe-run"), "-m", bundle, "--tokens", ",".join(map(str, tokens)), "-n", str(n_predict),
         "--ignore-eos", "-t", str(threads), "-c", "1024", "-b", str(batch), "--stats-json", sj])
    s = json.load(open(sj))
    os.remove(sj)
    return s["tokens_per_s_prompt"], s.get("tokens_per_s_decode", 0.0)


def ours_threads(build, bundle, n_predict):
    """bench-decode -t 1,2 in one process (rounds alternate the thread
    counts): the median of its per-round ratios 2 threads / 1 thread."""
    out = run([os.path.join(build, "tests", "bench-decode"), bundle, "-t", "1,2", "-n", str(n_predict), "-r", "10"])
    for line in out.splitlines():
        if line.startswith("t2:") and "ratio" in line:
            return float(line.split("median")[2].split(",")[0])
    raise SystemExit("bench-decode printed no ratio:\n" + out)


def llama_run(bindir, gguf, threads, p, n):
    """llama-bench's mean tokens/s of one test (-p p -n n), one repetition."""
    out = run([os.path.join(bindir, "llama-bench"), "-m", gguf, "-t", str(threads), "-p", str(p), "-n", str(n),
               "-r", "1", "-o", "json"])
    j = json.loads(out)
    return j[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/moe-llama")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--models", default="tiny,synth")
    ap.add_argument("--types", default="q4_k,q8_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="256,512")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads-inproc", default="tiny",
                    help="models whose moe-run 2-thread/1-thread decode ratio is also measured in one process "
                         "(bench-decode) every round (default tiny; '' for none)")
    ap.add_argument("--no-quantize-rate", action="store_true",
                    help="do not quantize again where both outputs exist (no quantizer timing)")
    ap.add_argument("--quantize-only", action="store_true", help="time the quantizers, print their rates, stop")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    build_ours(a.build)
    bindir = build_llama(a.work)
    types = a.types.split(",")
    threads = [int(x) for x in a.threads.split(",")]
    prompts = [int(x) for x in a.prompts.split(",")]

    models = {}
    for name in a.models.split(","):
        if name == "tiny":
            d = os.path.join(REPO, "datasets", "models", "tiny-moe-mixtral")
        elif name == "synth":
            d = os.path.join(a.work, "synth-mixtral")
            if not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
                run([sys.executable, os.path.join(REPO, "tests", "bench", "make_synthetic_checkpoint.py"), d,
                     "--hidden", "2048", "--ffn", "5632", "--layers", "8", "--experts", "8", "--vocab", "32000",
                     "--heads", "16", "--kv-heads", "4"])
        else:
            d = os.path.abspath(name)
            name = os.path.basename(os.path.normpath(d))
        models[name] = d

    # conversion and quantization (both quantizers timed, 2 threads)
    files, qrate = {}, []
    for name, d in models.items():
        g16 = os.path.join(a.work, f"{name}-bf16.gguf")
        if not os.path.exists(g16):
            run([sys.executable, os.path.join(REPO, "tests", "bench", "hf_to_gguf.py"), d, g16 + ".tmp"])
            os.replace(g16 + ".tmp", g16)
        for t in types:
            ob = os.path.join(a.work, f"{name}-{t}.moeb")
            og = os.path.join(a.work, f"{name}-{t}.gguf")
            fresh = not (os.path.exists(ob) and os.path.exists(og))
            if fresh or not a.no_quantize_rate:
                t0 = time.time()
                run([os.path.join(a.build, "moe-prep"), "quantize", d, "-o", ob, "--experts", t, "--dense", t, "-t", "2"])
                t1 = time.time()
                run([os.path.join(bindir, "llama-quantize"), "--pure", g16, og, LLAMA_FTYPE[t], "2"])
                t2 = time.time()
                inb = dir_bytes(d)
                qrate.append((name, t, inb / (t1 - t0) / 1e6, os.path.getsize(g16) / (t2 - t1) / 1e6))
                log(f"quantize {name} {t}: moe-prep {t1 - t0:.1f} s, llama-quantize {t2 - t1:.1f} s")
            files[(name, t)] = (ob, og)

    def print_qrate():
        if qrate:
            print(f"\nquantize input rate (MB/s of BF16 input, 2 threads):")
            for name, t, o, l in qrate:
                print(f"  {name:<18} {t:<5} moe-prep {o:7.1f}  llama-quantize {l:7.1f}  ratio {o / l:.2f}x")

    if a.quantize_only:
        print_qrate()
        return

    rng = random.Random(1)
    res = {}  # (model, type, threads, test) -> {"ours": [...], "llama": [...]}
    inproc = {}  # (model, type) -> [bench-decode 2t/1t ratio per round]
    inproc_models = [x for x in a.threads_inproc.split(",") if x]
    bw = {1: [], 2: []}
    for r in range(a.reps):
        g = stream_gbs(a.build)
        for k in bw:
            if k in g:
                bw[k].append(g[k])
        for name, d in models.items():
            V = model_dims(d)["V"]
            for t in types:
                ob, og = files[(name, t)]
                for th in threads:
                    order = ["ours", "llama"] if r % 2 == 0 else ["llama", "ours"]
                    for who in order:
                        if who == "ours":
                            short = [rng.randrange(3, V) for _ in range(8)]
                            _, dec = ours_run(a.build, ob, short, a.decode + 1, th, 512)
                            res.setdefault((name, t, th, "decode"), {}).setdefault("ours", []).append(dec)
                            for p in prompts:
                                toks = [rng.randrange(3, V) for _ in range(p)]
                                pp, _ = ours_run(a.build, ob, toks, 0, th, 512)
                                res.setdefault((name, t, th, f"pp{p}"), {}).setdefault("ours", []).append(pp)
                        else:
                            dec = llama_run(bindir, og, th, 0, a.decode)
                            res.setdefault((name, t, th, "decode"), {}).setdefault("llama", []).append(dec)
                            for p in prompts:
                                pp = llama_run(bindir, og, th, p, 0)
                                res.setdefault((name, t, th, f"pp{p}"), {}).setdefault("llama", []).append(pp)
                if name in inproc_models and 1 in threads and 2 in threads:
                    inproc.setdefault((name, t), []).append(ours_threads(a.build, ob, a.decode))
        log(f"round {r + 1}/{a.reps} done")

    med = statistics.median
    print(f"\nstreaming read (median of {a.reps}): " +
          ", ".join(f"{k} thread{'s' if k > 1 else ''} {med(v):.1f} GB/s" for k, v in bw.items() if v))
    print(f"\n{'model':<18} {'type':<5} {'thr':>3} {'test':<7} {'moe-run':>9} {'llama.cpp':>9} {'ratio':>6} "
          f"{'bound':>8} {'ours %':>6} {'llama %':>7}   (tokens/s, median of {a.reps})")
    for (name, t, th, test), v in res.items():
        o, l = med(v["ours"]), med(v["llama"])
        bo, bl = max(v["ours"]), max(v["llama"])
        extra = ""
        if test == "decode" and bw.get(th):
            bound = med(bw[th]) * 1e9 / active_bytes(model_dims(models[name]), t)
            extra = f"{bound:8.1f} {100 * o / bound:5.0f}% {100 * l / bound:6.0f}%"
        print(f"{name:<18} {t:<5} {th:>3} {test:<7} {o:9.1f} {l:9.1f} {o / l:5.2f}x {extra}")
        paired = med([x / y for x, y in zip(v["ours"], v["llama"])])
        print(f"    per-round ratio median {paired:.2f}x; best of {len(v['ours'])}: moe-run {bo:.1f}, llama.cpp {bl:.1f}, "
              f"ratio {bo / bl:.2f}x; all rounds: "
              f"moe-run {', '.join(f'{x:.1f}' for x in v['ours'])}; llama.cpp {', '.join(f'{x:.1f}' for x in v['llama'])}")
    for (name, t), v in inproc.items():
        l1, l2 = res.get((name, t, 1, "decode"), {}).get("llama"), res.get((name, t, 2, "decode"), {}).get("llama")
        lr = f"; llama-bench 2/1 threads {med(l2) / med(l1):.2f}x (medians above)" if l1 and l2 else ""
        print(f"{name} {t}: moe-run decode 2 threads / 1 thread in one process (bench-decode -r 10, per-round median): "
              f"median of rounds {med(v):.2f}x, all rounds {', '.join(f'{x:.2f}' for x in v)}{lr}")
    print_qrate()


if __name__ == "__main__":
    main()
