#!/usr/bin/env bash
# bench-claims.sh - the papers' claims measured on each model given, side by side
# (issue 25, item 3). Not run by CI.
#
#   tests/bench/bench-claims.sh [--work DIR] [--no-build] [--quick] MODEL_DIR...
#   tests/bench/bench-claims.sh datasets/models/tiny-moe-mixtral datasets/models/tiny-moe-qwen3
#
# For each checkpoint (its heldout/python_docs.txt is the calibration text,
# heldout/c4.txt the held-out one):
#   1. quantize --experts q8_0,q4_k,q2_k --dense q8_0
#   2. profile on python_docs (--ctx 256, every sequence; --big-little-every 1)
#      -> HOBBIT's T1/T2 and the high/low/skip shares, the Pearson r of gate
#      weight and expert output norm, stacked-gate top-1 accuracy 1-3 layers
#      ahead, Twiddler's popularity placement against random at 25/50 %
#   3. HOBBIT's PPL rise: moe-prep eval through the engine on c4 (--batch 1,
#      --expert-mem 25 % of the q8_0 expert bytes, --dynamic on --high q8_0
#      --low q2_k --policy lru) against all resident at q8_0
#   4. EdgeMoE: tests/bench/path-mass on the profile (routing mass on the top
#      20 % of the possible top-1 paths l-1 -> l); sensitivity (q2_k against
#      q8_0, wordnet, 2560 tokens) and bitwidth --max-loss 2 %: the map's expert
#      bytes against all q8_0
#   5. MoBiLE with K/2 experts: moe-prep eval on c4 at gamma 0 (K/2 alone),
#      1 (all K) and a grid; fallback ratio against gamma, and the share of the
#      K/2 -> K gap in ln PPL recovered at 10, 20, 30 % fallback (linear between
#      the grid's points); tokens/s one token per step through the engine with
#      --expert-mem 25 % (--policy lru --dynamic off --high q8_0 --prefetch off)
#      at K and big-little (the profile's gamma) on the same held-out tokens
#      (moe-prep eval --batch 1, 4 chunks of 128), median of 5 runs
#   6. the cache: fit-cache at 25 % of the q8_0 expert bytes (fitted HOBBIT,
#      LRU, Belady) and the gap of each to the offline optimum's proven bound
# --quick: fewer tokens everywhere (for plumbing). The table goes to stdout and
# $WORK/claims.md, every command to $WORK/commands.txt.
# The inflated-experts offloading table is tests/bench/bench-offload.sh (the
# Mixtral model); inflate-moe widens Qwen-named experts too.
#
# Environment: MOE_BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
work=/tmp/moe-claims do_build=1 quick=0 models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "bench-claims: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || { usage >&2; exit 2; }
build=${MOE_BUILD_DIR:-build}
if [ $do_build -eq 1 ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target moe-run moe-prep path-mass >/dev/null
fi
prep=$build/moe-prep moerun=$build/moe-run pathmass=$build/tests/path-mass
mkdir -p "$work"
: >"$work/commands.txt"
run() { printf '%q ' "$@" >>"$work/commands.txt"; printf '\n' >>"$work/commands.txt"; "$@"; }
jq_() { python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    d = d[int(k)] if isinstance(d, list) else d[k]
print(d)' "$@"; }
if [ $quick -eq 1 ]; then ptok="--max-tokens 2048" chunks=2 stok=512 reps=1; else ptok="" chunks=4 stok=2560 reps=5; fi

declare -A R
cols=()
for model in "${models[@]}"; do
  name=$(basename "$(cd "$model" && pwd)")
  cols+=("$name")
  w=$work/$name
  mkdir -p "$w"
  calib=$model/heldout/python_docs.txt held=$model/heldout/c4.txt sens=$model/heldout/wordnet.txt
  for f in "$calib" "$held" "$sens"; do [ -f "$f" ] || { echo "bench-claims: $f missing" >&2; exit 1; }; done
  echo "== $name" >&2
  echo "# $name" >>"$work/commands.txt"
  run "$prep" check "$model" --json >"$w/check.json"
  K=$(jq_ "$w/check.json" experts_per_token) E=$(jq_ "$w/check.json" experts) L=$(jq_ "$w/check.json" moe_layers)
  R[$name,shape]="$L x $E experts, top-$K"
  run "$prep" quantize "$model" -o "$w/m.moeb" --experts q8_0,q4_k,q2_k --dense q8_0 >/dev/null 2>&1
  run "$prep" inspect "$w/m.moeb" --json >"$w/inspect.json"
  q8=$(python3 -c 'import json,sys; print([p for p in json.load(open(sys.argv[1]))["precisions"] if p["name"] == "q8_0"][0]["total_bytes"])' "$w/inspect.json")
  budget=$((q8 / 4))

  # 2. profile
  # shellcheck disable=SC2086 # $ptok is empty or two words
  run "$prep" profile "$w/m.moeb" --dataset "$calib" -o "$w/profile.h5" --ctx 256 $ptok --big-little-every 1 \
      --json >"$w/profile.json" 2>/dev/null
  pj=$w/profile.json
  pct() { python3 -c "print(f'{float(\"$1\") * 100:.1f} %')"; }
  R[$name,hobbit]="T1 $(printf %.3f "$(jq_ "$pj" hobbit.t1)"), T2 $(printf %.3f "$(jq_ "$pj" hobbit.t2)"): high $(pct "$(jq_ "$pj" hobbit.high)"), low $(pct "$(jq_ "$pj" hobbit.low)"), skip $(pct "$(jq_ "$pj" hobbit.skip)")"
  R[$name,pearson]=$(printf %.3f "$(jq_ "$pj" gate_output_pearson)")
  for d in 0 1 2; do R[$name,stacked$d]=$(pct "$(jq_ "$pj" stacked.$d.top1)"); done
  for i in 0 1; do
    R[$name,place$i]="$(pct "$(jq_ "$pj" placement.$i.hit_rate)") (random $(pct "$(jq_ "$pj" placement.$i.random)"))"
  done
  gamma=$(jq_ "$pj" big_little.gamma)

  # 3. HOBBIT's quality through the engine
  run "$prep" eval "$w/m.moeb" --ref "$w/m.moeb" --expert-precision q8_0 --dataset "$held" --ctx 256 \
      --max-chunks "$chunks" --batch 1 --policy lru --dynamic on --high q8_0 --low q2_k --expert-mem "$budget" \
      --json >"$w/hobbit-eval.json" 2>/dev/null
  R[$name,hobbit_ppl]=$(python3 -c 'import json,sys
d = json.load(open(sys.argv[1])); e = d["engine"]; r = d["ppl_ratio"]
low = (e["hits_low"] + e["misses_low"]) / max(1, e["accesses"]); v = r["value"]; se = r["stderr"]
print(f"PPL {(v - 1) * 100:+.2f} % (+- {se * 100:.2f}) with {low * 100:.1f} % of expert uses low")' \
      "$w/hobbit-eval.json")

  # 4. EdgeMoE
  run "$pathmass" "$w/profile.h5" --top 0.2 >"$w/paths.json"
  R[$name,paths]="$(pct "$(jq_ "$w/paths.json" order1.mass_top_possible)") (of $((E * E)) possible l-1 -> l pairs; $(pct "$(jq_ "$w/paths.json" order1.paths_seen)") of them occur)"
  run "$prep" sensitivity "$w/m.moeb" --dataset "$sens" --low q2_k --base q8_0 --ctx 256 --max-tokens "$stok" \
      -o "$w/sens.h5" >/dev/null 2>&1
  run "$prep" bitwidth "$w/m.moeb" --sensitivity "$w/sens.h5" --dataset "$sens" --ctx 256 --max-chunks "$chunks" \
      --max-loss 2% --heldout "$held" --json >"$w/bitwidth.json" 2>/dev/null || true
  R[$name,bitwidth]=$(python3 -c 'import json,sys
d = json.load(open(sys.argv[1])); c = d["chosen"]; q8 = [u for u in d["uniform"] if u["precision"] == "q8_0"][0]
b = c["expert_bytes"]; h = c.get("heldout_loss"); b8 = q8["expert_bytes"]; k = c["k"]; lo = c["lower"]; up = c["upper"]
loss = c["loss"]
nm = len(c["map"])
what = f"all {nm} experts at {lo}" if lo == up else f"{k} experts at {lo}, the rest {up}"
print(f"{b / 2**20:.2f} MiB, {b / b8 * 100:.0f} % of all-q8_0 ({what}; loss {loss * 100:.2f} %"
      + (f", held out {h * 100:.2f} %" if h is not None else "") + ")")' \
      "$w/bitwidth.json" 2>/dev/null || echo "n/a (see $w/bitwidth.json)")

  # 5. MoBiLE with K/2
  k2=$((K / 2))
  : >"$w/mobile.tsv"
  for g in 0 0.02 0.05 0.1 0.15 0.2 0.3 0.5 1; do
    run "$prep" eval "$w/m.moeb" --ref "$w/m.moeb" --expert-precision q8_0 --dataset "$held" --ctx 256 \
        --max-chunks "$chunks" --little-k "$k2" --gamma "$g" --json >"$w/bl-$g.json" 2>/dev/null
    printf '%s\t%s\t%s\n' "$g" "$(jq_ "$w/bl-$g.json" big_little.fallback_ratio)" "$(jq_ "$w/bl-$g.json" nll.mean)" >>"$w/mobile.tsv"
  done
  R[$name,mobile]=$(python3 -c 'import sys
rows = [tuple(map(float, l.split("\t"))) for l in open(sys.argv[1]) if l.strip()]
n0 = [r for r in rows if r[0] == 0][0][2]; n1 = [r for r in rows if r[0] == 1][0][2]
pts = sorted((r[1], (n0 - r[2]) / (n0 - n1) if n0 != n1 else float("nan")) for r in rows)
def at(f):
    for (f0, g0), (f1, g1) in zip(pts, pts[1:]):
        if f0 <= f <= f1: return g0 if f1 == f0 else g0 + (g1 - g0) * (f - f0) / (f1 - f0)
    return float("nan")
gap = (n0 - n1) / n1 if n1 else float("nan")
if abs(n0 - n1) < 0.005: # under 0.5 % of PPL between K/2 and K: shares of it are noise
    print(f"no gap to recover: ln PPL {n0:.4f} at K/2, {n1:.4f} at K ({abs(n0 - n1) * 100:.2f} % of PPL)")
else:
    print("; ".join(f"{f * 100:.0f} % fallback: {at(f) * 100:.0f} %" for f in (0.1, 0.2, 0.3)))
print(", ".join(f"{r[0]:g}: {r[1] * 100:.0f} %" for r in rows if 0 < r[0] < 1))' "$w/mobile.tsv")
  R[$name,mobile_gap]=$(echo "${R[$name,mobile]}" | head -n 1)
  R[$name,mobile_fb]=$(echo "${R[$name,mobile]}" | tail -n 1)
  off=(--expert-mem "$budget" --policy lru --dynamic off --high q8_0 --prefetch off) # the bundle has no plan.*
  for cfg in K BL; do
    : >"$w/speed-$cfg.txt"
    for ((i = 0; i < reps; i++)); do
      if [ $cfg = K ]; then extra=(--little-k 0); else extra=(--little-k "$k2" --gamma "$gamma"); fi
      # the same tokens for both (teacher-forced, one token per step): each run's own greedy
      # text would make the cache serve two different streams
      run "$prep" eval "$w/m.moeb" --dataset "$held" --ctx 128 --max-chunks 4 --batch 1 "${off[@]}" "${extra[@]}" \
          --json >"$w/speed.json" 2>/dev/null
      python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["chunks"] * d["ctx"] / d["seconds"])' \
          "$w/speed.json" >>"$w/speed-$cfg.txt"
    done
  done
  med() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  sk=$(med "$w/speed-K.txt") sb=$(med "$w/speed-BL.txt")
  R[$name,mobile_speed]=$(printf '%.0f tok/s against %.0f at K (%.2fx; gamma %.3f)' "$sb" "$sk" "$(echo "$sb $sk" | awk '{print $1 / $2}')" "$gamma")

  # 6. the cache against the offline optimum
  run "$prep" fit-cache "$w/m.moeb" --profile "$w/profile.h5" --fast-mem "$budget" --fit-once --opt-seconds 20 \
      --no-profile-update --json >"$w/cache.json" 2>/dev/null
  R[$name,cache]=$(python3 -c 'import json,sys
d = json.load(open(sys.argv[1])); s = d["sizes"][0]
r = {x["policy"]: x for x in s["results"]}
o = s.get("offline_optimum", {})
hi = s["high_experts"]; lo = s["low_experts"]
def one(p):
    h = r[p]["hit_ratio"] * 100; g = r[p].get("gap_to_bound_pct", float("nan"))
    return f"{p} {h:.1f} % hits, +{g:.0f} %"
print(f"{hi}+{lo} copies: " + ", ".join(one(p) for p in ("hobbit", "lru", "belady") if p in r)
      + (" (optimum exact)" if o.get("exact") else ""))' "$w/cache.json")
done

{
  printf '| claim |'; for c in "${cols[@]}"; do printf ' %s |' "$c"; done; printf '\n|---|'
  for c in "${cols[@]}"; do printf -- '---|'; done; printf '\n'
  row() { printf '| %s |' "$1"; for c in "${cols[@]}"; do printf ' %s |' "${R[$c,$2]:-}"; done; printf '\n'; }
  row "shape" shape
  row "HOBBIT: shares at the profiled T1/T2" hobbit
  row "HOBBIT: quality through the engine at 25 % (q8_0/q2_k, c4)" hobbit_ppl
  row "HOBBIT: stacked gate, top-1 1 layer ahead" stacked0
  row "HOBBIT: stacked gate, 2 layers ahead" stacked1
  row "HOBBIT: stacked gate, 3 layers ahead" stacked2
  row "HOBBIT: Pearson r, gate weight vs expert output norm" pearson
  row "EdgeMoE: mass on the top 20 % of paths" paths
  row "EdgeMoE: bit-width map at a 2 % budget" bitwidth
  row "MoBiLE (K/2): fallback ratio at gamma (c4)" mobile_fb
  row "MoBiLE (K/2): K/2 -> K gap recovered (ln PPL)" mobile_gap
  row "MoBiLE: big-little vs K at 25 % of expert bytes (same tokens, one per step)" mobile_speed
  row "Twiddler: popularity placement hit rate, 25 %" place0
  row "Twiddler: popularity placement hit rate, 50 %" place1
  row "cache at 25 %: hit ratio, gap to the offline bound" cache
} | tee "$work/claims.md"
echo "commands: $work/commands.txt" >&2
