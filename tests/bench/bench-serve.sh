#!/usr/bin/env bash
# bench-serve.sh - moe-serve under concurrent requests (issue 26, item 4): the
# aggregate decode speed of 1, 2, 4 and 8 requests decoded together in one
# batched step, against the same requests served without batching, on the
# inflated demo model, all resident and at 25 % of the q8_0 expert bytes.
# Not part of CI.
#
#   tests/bench/bench-serve.sh [--work DIR] [--rounds R] [-n TOKENS] [--threads T]
#                              [--conc LIST] [--ways LIST] [--no-build] [--dry-run]
#
# Steps:
#   1. build moe-serve (cmake Release, build dir $MOE_BUILD_DIR or build/)
#   2. the inflated bundle (FFN 8192; q8_0/q4_k/q2_k experts):
#      tests/bench/bench-offload.sh --prep-only --work DIR (reused when DIR has
#      it; default DIR /tmp/moe-offload); the budget is 25 % of its q8_0 expert
#      bytes (DIR/expert-bytes.txt)
#   3. eight held-out prompts (~160 bytes each, two from each of the c4,
#      fortunes, gsm8k and wordnet held-out files: text the profile in step 2
#      did not see)
#   4. R rounds; in each, one server per configuration (the order reverses
#      every other round), each started as
#        moe-serve -m BUNDLE --port 0 -t T --ctx 256 --no-plan MODE WAY
#      MODE  resident: --expert-precision q8_0 (every expert in memory)
#            25%:      --expert-mem B --io direct --policy lru --dynamic off
#                      --prefetch off --high q8_0 (every copy q8_0: the same
#                      model as resident)
#      WAY   batched:    --parallel 8 (one session, one batched step for all)
#            sequential: --sequential --parallel 8 (one session per sequence,
#                        stepped one after another: round-robin; resident only,
#                        as each session would have its own budget of B bytes)
#            one:        --parallel 1 (one request at a time; the rest queue)
#      On each server, first every prompt alone (greedy, TOKENS tokens,
#      ignore_eos), then for each P in LIST (1,2,4,8; order reversed every
#      other round) P requests at once (prompts 0..P-1, sent together from P
#      threads). Every answer, alone or concurrent, on every server, must
#      equal the answer its prompt got alone on the first batched server of
#      its mode (and the two modes must agree: they compute the same model).
#   5. per P, from /metrics before and after: aggregate decode tokens/s =
#      decode-step tokens / engine decode time; end to end = generated tokens
#      / wall time from sending to the last answer (prefill and HTTP
#      included); expert hit ratio (hits / uses, prompt and decode); MB of
#      experts read per generated token. Medians over the rounds.
#
# Results: DIR/serve/results.tsv (one line per round, configuration and P),
# DIR/serve/table.md, DIR/serve/*.log (each server's stderr).
# Environment: MOE_BUILD_DIR, MOE_OFFLOAD_DIR (= --work), MOE_SERVE_BIN (the
# moe-serve binary, default $MOE_BUILD_DIR/moe-serve).
set -euo pipefail
cd "$(dirname "$0")/../.."

work=${MOE_OFFLOAD_DIR:-/tmp/moe-offload}
rounds=3
n_predict=64
threads=2
conc=1,2,4,8
ways=batched,sequential,one
do_build=1
dry_run=0
build=${MOE_BUILD_DIR:-build}
model=datasets/models/tiny-moe-mixtral

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n|--n-predict) n_predict=$2; shift 2 ;;
    --threads|-t) threads=$2; shift 2 ;;
    --conc) conc=$2; shift 2 ;;
    --ways) ways=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-serve: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds$n_predict$threads" in *[!0-9]*) echo "bench-serve: --rounds, -n, --threads take integers" >&2; exit 2 ;; esac
case ",$conc," in *[!0-9,]*|*,,*) echo "bench-serve: --conc takes a list such as 1,2,4,8" >&2; exit 2 ;; esac
for c in ${conc//,/ }; do
  [ "$c" -ge 1 ] && [ "$c" -le 8 ] || { echo "bench-serve: --conc values are 1 .. 8 (the 8 prompts)" >&2; exit 2; }
done
for w in ${ways//,/ }; do
  case "$w" in batched|sequential|one) ;; *) echo "bench-serve: --ways takes batched, sequential, one" >&2; exit 2 ;; esac
done
case ",$ways," in *,batched,*) ;; *) echo "bench-serve: --ways must include batched (the reference answers)" >&2; exit 2 ;; esac

run() {
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
  "$@"
}

serve=${MOE_SERVE_BIN:-$build/moe-serve}
bundle=$work/tiny-moe-mixtral-ffn8192.moeb
out=$work/serve

# ---- 1. build --------------------------------------------------------------------------------
if [ $do_build -eq 1 ] && [ $dry_run -eq 0 ]; then
  echo "== build ($build, Release)"
  run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  run cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target moe-serve
fi

# ---- 2. the inflated bundle and the budget ----------------------------------------------------
if [ ! -f "$bundle" ] || [ ! -f "$work/expert-bytes.txt" ]; then
  echo "== the inflated bundle: tests/bench/bench-offload.sh --prep-only"
  if [ $dry_run -eq 0 ]; then
    build_opt=(); [ $do_build -eq 1 ] || build_opt=(--no-build)
    MOE_BUILD_DIR=$build run tests/bench/bench-offload.sh --prep-only --work "$work" "${build_opt[@]}"
  fi
fi
budget=$(sed -n 's/.*budgets: 25 % = \([0-9]*\) bytes.*/\1/p' "$work/expert-bytes.txt" 2>/dev/null || true)
if [ -z "$budget" ]; then
  [ $dry_run -eq 1 ] || { echo "bench-serve: no 25 % budget in $work/expert-bytes.txt" >&2; exit 1; }
  budget=B
fi
echo "== bundle $bundle, budget (25 % of the q8_0 expert bytes) $budget bytes"

# ---- 3-5. the servers, the requests, the table -------------------------------------------------
mkdir -p "$out"
export BS_SERVE=$serve BS_BUNDLE=$bundle BS_BUDGET=$budget BS_OUT=$out BS_ROUNDS=$rounds BS_N=$n_predict \
       BS_THREADS=$threads BS_CONC=$conc BS_WAYS=$ways BS_MODEL=$model BS_DRY=$dry_run
exec python3 - <<'PY'
import http.client, json, os, re, shlex, signal, statistics, subprocess, sys, threading, time

E = os.environ
serve, bundle, budget, out = E["BS_SERVE"], E["BS_BUNDLE"], E["BS_BUDGET"], E["BS_OUT"]
rounds, n_tok, threads = int(E["BS_ROUNDS"]), int(E["BS_N"]), E["BS_THREADS"]
concs = [int(c) for c in E["BS_CONC"].split(",")]
ways_asked = E["BS_WAYS"].split(",")
dry = E["BS_DRY"] == "1"

MODES = {
    "resident": ["--expert-precision", "q8_0"],
    "25%": ["--expert-mem", budget, "--io", "direct", "--policy", "lru", "--dynamic", "off", "--prefetch", "off",
            "--high", "q8_0"],
}
WAYS = {"batched": ["--parallel", "8"], "sequential": ["--sequential", "--parallel", "8"], "one": ["--parallel", "1"]}
# (mode, way) pairs; sequential only resident: each of its 8 sessions would get its own budget
CONFIGS = [(m, w) for m in MODES for w in ways_asked if not (w == "sequential" and m != "resident")]


def prompts():
    """Eight held-out prompts: ~160 bytes at 1/3 and 2/3 of each domain's file, cut at a space."""
    ps = []
    for d in ("c4", "fortunes", "gsm8k", "wordnet"):
        text = open(os.path.join(E["BS_MODEL"], "heldout", d + ".txt"), encoding="utf-8").read()
        for frac in (1 / 3, 2 / 3):
            at = text.find("\n", int(len(text) * frac)) + 1
            chunk = " ".join(text[at:at + 400].split())
            ps.append(chunk[:chunk.rfind(" ", 0, 160)])
    return ps


PROMPTS = prompts()


def cmd_of(mode, way):
    return [serve, "-m", bundle, "--port", "0", "-t", threads, "--ctx", "256", "--no-plan"] + MODES[mode] + WAYS[way]


def start(mode, way, tag):
    log = open(os.path.join(out, tag + ".log"), "w")
    p = subprocess.Popen(cmd_of(mode, way), stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    m = re.search(r":(\d+)\s*$", line)
    if not m:
        p.kill()
        sys.exit(f"bench-serve: {tag}: the server did not start (see {out}/{tag}.log)")
    return p, int(m.group(1))


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return {k: float(v) for k, v in re.findall(r"^([a-z_]+) (\S+)$", text, re.M)}


def complete(port, prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = json.dumps({"prompt": prompt, "max_tokens": n_tok, "temperature": 0, "ignore_eos": True})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    if r.status != 200:
        sys.exit(f"bench-serve: HTTP {r.status}: {data}")
    j = json.loads(data)
    return j["choices"][0]["text"], j["usage"]["completion_tokens"]


def concurrent(port, n):
    """n requests (prompts 0..n-1) sent together; their texts, tokens and the wall time."""
    res = [None] * n
    go = threading.Barrier(n + 1)

    def worker(i):
        go.wait()
        res[i] = complete(port, PROMPTS[i])

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in ts:
        t.join()
    return res, time.monotonic() - t0


if dry:
    for m, w in CONFIGS:
        print("+ " + " ".join(shlex.quote(a) for a in cmd_of(m, w)))
    print(f"then per server: {len(PROMPTS)} prompts alone, then P = {concs} at once; {rounds} rounds")
    sys.exit(0)

ref = {}       # mode -> the answers alone on its first batched server
mismatch = []  # (round, mode, way, P or 'alone', prompt index)
rows = []      # dicts, one per round x config x P
tsv = open(os.path.join(out, "results.tsv"), "w")
cols = ["round", "mode", "way", "P", "decode_tok_s", "e2e_tok_s", "gen_tokens", "step_tokens", "steps", "decode_s",
        "wall_s", "hit_ratio", "mb_per_gen_token", "loads_per_gen_token"]
print("\t".join(cols), file=tsv, flush=True)
order = sorted(CONFIGS, key=lambda c: c[1] != "batched")  # a batched server first: the reference answers
for rnd in range(1, rounds + 1):
    cfgs = order if rnd % 2 else [order[0]] + order[1:][::-1]
    levels = concs if rnd % 2 else concs[::-1]
    for mode, way in cfgs:
        tag = f"r{rnd}-{mode.rstrip('%')}-{way}"
        print(f"== round {rnd}: {mode} {way}: " + " ".join(shlex.quote(a) for a in cmd_of(mode, way)), flush=True)
        p, port = start(mode, way, tag)
        try:
            alone = [complete(port, q)[0] for q in PROMPTS]
            if mode not in ref:
                ref[mode] = alone
            mismatch += [(rnd, mode, way, "alone", i) for i in range(len(PROMPTS)) if alone[i] != ref[mode][i]]
            for n in levels:
                m0 = metrics(port)
                res, wall = concurrent(port, n)
                m1 = metrics(port)
                d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
                mismatch += [(rnd, mode, way, n, i) for i in range(n) if res[i][0] != ref[mode][i]]
                gen = d["moe_generated_tokens_total"]
                row = {"round": rnd, "mode": mode, "way": way, "P": n,
                       "decode_tok_s": d["moe_decode_step_tokens_total"] / d["moe_decode_seconds_total"],
                       "e2e_tok_s": sum(r[1] for r in res) / wall, "gen_tokens": gen,
                       "step_tokens": d["moe_decode_step_tokens_total"], "steps": d["moe_decode_steps_total"],
                       "decode_s": d["moe_decode_seconds_total"], "wall_s": wall,
                       "hit_ratio": d["moe_expert_hits_total"] / d["moe_expert_uses_total"]
                       if d.get("moe_expert_uses_total", 0) > 0 else 1.0,
                       "mb_per_gen_token": d["moe_expert_bytes_read_total"] / gen / 1e6,
                       "loads_per_gen_token": d["moe_expert_loads_total"] / gen}
                rows.append(row)
                print("\t".join(f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in cols),
                      file=tsv, flush=True)
                print(f"   P={n}: {row['decode_tok_s']:.1f} tok/s decode, {row['e2e_tok_s']:.1f} end to end, "
                      f"{row['step_tokens'] / max(row['steps'], 1):.2f} tokens a step, hit {row['hit_ratio']:.3f}, "
                      f"{row['mb_per_gen_token']:.2f} MB/token", flush=True)
        finally:
            stop(p)

same_modes = "resident" not in ref or "25%" not in ref or ref["resident"] == ref["25%"]


def med(mode, way, n, key):
    v = [r[key] for r in rows if r["mode"] == mode and r["way"] == way and r["P"] == n]
    return statistics.median(v) if v else float("nan")


ws = [w for w in ("sequential", "one") if w in ways_asked]
hdr = "| mode | P | batched tok/s | × P=1 |"
for w in ws:
    hdr += f" {w} tok/s | batched / {w} |"
hdr += " end to end tok/s, batched |"
for w in ws:
    hdr += f" {w} |"
hdr += " hit ratio, batched |" + "".join(f" {w} |" for w in ws)
hdr += " MB read / token, batched |" + "".join(f" {w} |" for w in ws)
lines = [hdr, "|---|" + "---:|" * (hdr.count("|") - 2)]
for mode in MODES:
    for n in concs:
        b = med(mode, "batched", n, "decode_tok_s")
        line = f"| {mode} | {n} | {b:.1f} | {b / med(mode, 'batched', concs[0], 'decode_tok_s'):.2f} |"
        for w in ws:
            x = med(mode, w, n, "decode_tok_s")
            line += " – | – |" if x != x else f" {x:.1f} | {b / x:.2f} |"
        line += f" {med(mode, 'batched', n, 'e2e_tok_s'):.1f} |"
        for w in ws:
            x = med(mode, w, n, "e2e_tok_s")
            line += " – |" if x != x else f" {x:.1f} |"
        for key, fmt in (("hit_ratio", "{:.3f}"), ("mb_per_gen_token", "{:.2f}")):
            line += " " + fmt.format(med(mode, "batched", n, key)) + " |"
            for w in ws:
                x = med(mode, w, n, key)
                line += " – |" if x != x else " " + fmt.format(x) + " |"
        lines.append(line)
summary = (f"{len(rows)} measurements, {rounds} rounds; answers: "
           + ("every request's greedy text equals its text served alone (all servers, all P)" if not mismatch
              else f"{len(mismatch)} MISMATCHES: {mismatch[:8]}")
           + ("; resident and 25 % agree" if same_modes else "; resident and 25 % answers DIFFER"))
table = "\n".join(lines) + "\n\n" + summary + "\n"
open(os.path.join(out, "table.md"), "w").write(table)
print()
print(table)
sys.exit(1 if mismatch or not same_modes else 0)
PY
