#!/usr/bin/env bash
# bench-mobile.sh - MoBiLE big-little decoding and the planner, measured.
#
#   tests/bench/bench-mobile.sh [--work DIR] [--inflated FILE.moeb --profile P.h5]
#                               [--rounds R] [-n TOKENS] [--threads T] [--gammas LIST]
#                               [--mems LIST] [--eval-chunks N] [--skip-mobile]
#                               [--skip-quality] [--skip-plan] [--no-build]
#
# Steps (each prints the command it runs):
#   1. build (cmake Release, $MOE_BUILD_DIR or build/)
#   2. the trained model (datasets/models/tiny-moe-mixtral) quantized as the
#      offloading benchmark does (q8_0,q4_k,q2_k experts, q8_0 dense), profiled on
#      heldout/python_docs.txt (--ctx 256), fit-cache at 25 %; the inflated model
#      (FFN 8192, from tests/bench/bench-offload.sh: --inflated, default
#      /tmp/moe-offload/tiny-moe-mixtral-ffn8192.moeb, and its --profile) is COPIED
#      into DIR: nothing is written where it came from
#   3. MoBiLE speed, both models side by side, one run: decode tokens/s at 25 % of
#      the q8_0 expert bytes (--policy lru --dynamic off --high q8_0), for
#        K      the model's top-K
#        K2     --little-k K/2 --gamma 0 (the little model alone)
#        g=G    --little-k K/2 --gamma G for each G of --gammas (prefetch 2 layers ahead)
#        g=Gnp  the first G of --gammas with --bl-prefetch 0
#      interleaved over --rounds rounds (order reversed every other round) on the
#      offloading benchmark's four held-out prompts (c4, fortunes, gsm8k, wordnet),
#      -n TOKENS each; the bundle's pages dropped before each run. Table: median
#      tok/s, ratio to K, fallback ratio, MoBiLE's predicted speed-up
#      T / (T_little + r T_big) with T = T_big the K run's time per token and T_little
#      the K2 run's, and bytes read per token.
#   4. MoBiLE quality on heldout/c4.txt of the trained model (moe-prep eval --ref the
#      same bundle at q8_0, --ctx 256): PPL, KL to the K run, top-token agreement for
#      K2 and each gamma, the fallback ratio, and the share of the K2 -> K gap (in
#      ln PPL and in KL) that big-little recovers. The inflated model computes the
#      same logits (zero rows), so its quality is the trained model's.
#   5. the planner against reality, on the inflated model: moe-prep hw (this
#      machine's numbers, into DIR/hw.json), then for each --mems size moe-prep plan
#      --eval-text heldout/c4.txt --quality-budget 3 % --json; every plan of its
#      table (within the budget, distinct, at most 4) run with moe-run on the four
#      prompts, interleaved over the rounds; predicted against measured tok/s, and
#      whether the chosen plan is the fastest measured.
#
# Results: DIR/mobile.tsv, DIR/mobile-table.txt, DIR/quality.txt, DIR/plan-*.json,
# DIR/plan.tsv, DIR/plan-table.txt, DIR/runs/*.json (--stats-json), *.log.
# The machine this runs on should be idle; a shared one gives noisy figures (the
# tables print medians and ratios measured in the same interleaved rounds).
set -euo pipefail
cd "$(dirname "$0")/../.."

work=${MOE_MOBILE_DIR:-/tmp/moe-mobile}
inflated_src=/tmp/moe-offload/tiny-moe-mixtral-ffn8192.moeb
profile_src=/tmp/moe-offload/p.h5
rounds=3
n_predict=64
threads=2
gammas="0.05 0.1 0.2 0.3"
mems="96M 128M 192M"
eval_chunks=4
skip_mobile=0
skip_quality=0
skip_plan=0
do_build=1
build=${MOE_BUILD_DIR:-build}
model=datasets/models/tiny-moe-mixtral

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --inflated) inflated_src=$2; shift 2 ;;
    --profile) profile_src=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n|--n-predict) n_predict=$2; shift 2 ;;
    --threads|-t) threads=$2; shift 2 ;;
    --gammas) gammas=$2; shift 2 ;;
    --mems) mems=$2; shift 2 ;;
    --eval-chunks) eval_chunks=$2; shift 2 ;;
    --skip-mobile) skip_mobile=1; shift ;;
    --skip-quality) skip_quality=1; shift ;;
    --skip-plan) skip_plan=1; shift ;;
    --no-build) do_build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-mobile: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds$n_predict$threads$eval_chunks" in *[!0-9]*) echo "bench-mobile: --rounds, -n, --threads, --eval-chunks take integers" >&2; exit 2 ;; esac

run() {
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
  "$@"
}

prep=$build/moe-prep
moerun=$build/moe-run
mkdir -p "$work/runs" "$work/prompts"

# ---- 1. build ----------------------------------------------------------------------------
if [ $do_build -eq 1 ]; then
  echo "== build ($build, Release)"
  run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  run cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target moe-run moe-prep
fi

# ---- 2. the two bundles ------------------------------------------------------------------------
trained=$work/trained.moeb
inflated=$work/inflated.moeb
if [ ! -f "$trained" ]; then
  echo "== the trained model: quantize, profile, fit-cache"
  run "$prep" quantize "$model" -o "$trained" --experts q8_0,q4_k,q2_k --dense q8_0 -t "$threads" >/dev/null 2>&1
  run "$prep" profile "$trained" --dataset "$model/heldout/python_docs.txt" -o "$work/trained-p.h5" --ctx 256 \
    -t "$threads" >"$work/trained-profile.txt"
  q8=$("$prep" inspect "$trained" --json | awk '/"name":/ { gsub(/[",\t ]/, ""); sub(/^name:/, ""); cur = $0 }
       /"total_bytes":/ && cur == "q8_0" { gsub(/[^0-9]/, ""); print; exit }')
  run "$prep" fit-cache "$trained" --profile "$work/trained-p.h5" --fast-mem "$((q8 / 4))" --high q8_0 --low q2_k \
    >"$work/trained-fit-cache.txt" 2>&1
fi
if [ ! -f "$inflated" ]; then
  [ -f "$inflated_src" ] && [ -f "$profile_src" ] || {
    echo "bench-mobile: no inflated bundle at $inflated_src (run tests/bench/bench-offload.sh --prep-only first)" >&2
    exit 1
  }
  echo "== the inflated model: a copy of $inflated_src"
  run cp "$inflated_src" "$inflated"
  run cp "$profile_src" "$work/inflated-p.h5"
fi
for d in c4 fortunes gsm8k wordnet; do # the offloading benchmark's prompts: ~500 bytes from each file's middle
  f=$work/prompts/$d.txt
  [ -s "$f" ] && continue
  src=$model/heldout/$d.txt
  half=$(( $(wc -l <"$src") / 2 ))
  tail -n +"$half" "$src" | awk '{ s = s $0 "\n"; if (length(s) >= 500) { printf "%s", s; exit } }' >"$f"
done
prompts="c4 fortunes gsm8k wordnet"

# stat_of FILE KEY: a number from a --stats-json file (first occurrence of the key).
stat_of() {
  [ -f "$1" ] && sed -n "s/.*\"$2\"[[:space:]]*:[[:space:]]*\([-0-9.eE+]*\).*/\1/p" "$1" | head -n 1
  return 0
}

# one_run TSV TAG BUNDLE PROMPT OPTIONS...: one moe-run from cold storage; a line in TSV.
one_run() {
  local tsv=$1 tag=$2 bundle=$3 prompt=$4
  shift 4
  local stats=$work/runs/$tag.json log=$work/runs/$tag.log rc=0
  rm -f "$stats"
  run dd if="$bundle" iflag=nocache count=0 status=none
  printf '+ %q -m %q -f %q -n %s --ignore-eos -t %s --no-plan %s\n' "$moerun" "$bundle" "$work/prompts/$prompt.txt" \
    "$n_predict" "$threads" "$*" >&2
  "$moerun" -m "$bundle" -f "$work/prompts/$prompt.txt" -n "$n_predict" --ignore-eos -t "$threads" --no-plan "$@" \
    --stats-json "$stats" >/dev/null 2>"$log" || rc=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tag" "$prompt" "$rc" "$(stat_of "$stats" tokens_per_s_decode)" \
    "$(stat_of "$stats" fallback_ratio)" "$(stat_of "$stats" bytes_read_per_token)" "$(stat_of "$stats" hit_ratio)" \
    "$(stat_of "$stats" decode_s)" >>"$tsv"
  [ $rc -eq 0 ] || echo "bench-mobile: run $tag exited $rc (see $log)" >&2
}

# pool TSV CONFIG: the successful runs of CONFIG over every round and prompt (tags
# r<round>-CONFIG-<prompt>).
pool() {
  awk -F'\t' -v c="$2" 'NR > 1 { t = $1; sub(/^r[0-9]+-/, "", t); sub(/-[a-z0-9]+$/, "", t); if (t == c && $3 == 0) print }' "$1"
}
# median COLUMN: the median of a column of stdin ("" when empty).
median() {
  awk -F'\t' -v k="$1" '$k != "" { print $k }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# ---- 3. MoBiLE speed ----------------------------------------------------------------------
if [ $skip_mobile -eq 0 ]; then
  echo "== MoBiLE speed: K, K2 and big-little at 25 % of the q8_0 expert bytes, $rounds rounds x 2 models x prompts"
  first_gamma=${gammas%% *}
  configs=(K K2)
  for g in $gammas; do configs+=("g=$g"); done
  configs+=("g=${first_gamma}np")
  # opts_of CONFIG: the moe-run options of a config (K2 = K/2 for both models: top-2 -> 1)
  opts_of() {
    local base="--expert-mem 25% --policy lru --dynamic off --high q8_0 --prefetch off"
    case "$1" in
      K) echo "$base --little-k 0" ;;
      K2) echo "$base --little-k 1 --gamma 0" ;;
      g=*np) local g=${1#g=}; echo "$base --little-k 1 --gamma ${g%np} --bl-prefetch 0" ;;
      g=*) echo "$base --little-k 1 --gamma ${1#g=} --bl-prefetch 2" ;;
    esac
  }
  tsv=$work/mobile.tsv
  printf 'tag\tprompt\trc\ttok_s\tfallback\tbytes_per_tok\thit\tdecode_s\n' >"$tsv"
  for ((r = 1; r <= rounds; r++)); do
    order=("${configs[@]}")
    if [ $((r % 2)) -eq 0 ]; then
      order=()
      for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[i]}"); done
    fi
    for prompt in $prompts; do
      for cfg in "${order[@]}"; do
        for m in trained inflated; do
          # shellcheck disable=SC2046 # options split on purpose
          one_run "$tsv" "r$r-$m-$cfg-$prompt" "$work/$m.moeb" "$prompt" $(opts_of "$cfg")
        done
      done
    done
  done
  {
    echo "decode tokens/s, median over $rounds rounds x 4 prompts, -n $n_predict -t $threads, 25 % of the q8_0 expert bytes"
    echo "(--policy lru --dynamic off --high q8_0 --prefetch off); big-little: --little-k 1, big passes prefetched 2 layers"
    echo "ahead (np: not prefetched). predicted speed-up: MoBiLE's T / (T_little + r T_big), T = T_big = K's time per"
    echo "token, T_little = K2's, r = the run's fallback ratio"
    printf '%-9s %-10s %9s %7s %10s %11s %10s %8s\n' model config "tok/s" "x K" fallback "predicted x" "MB/token" "hit"
    for m in trained inflated; do
      tk=$(pool "$tsv" "$m-K" | median 4)
      tl=$(pool "$tsv" "$m-K2" | median 4)
      for cfg in "${configs[@]}"; do
        tps=$(pool "$tsv" "$m-$cfg" | median 4)
        fb=$(pool "$tsv" "$m-$cfg" | median 5)
        by=$(pool "$tsv" "$m-$cfg" | median 6)
        hit=$(pool "$tsv" "$m-$cfg" | median 7)
        awk -v m="$m" -v c="$cfg" -v t="$tps" -v tk="$tk" -v tl="$tl" -v fb="$fb" -v by="$by" -v hit="$hit" 'BEGIN {
          pred = "-"
          if (fb != "" && tk > 0 && tl > 0) pred = sprintf("%.2f", (1 / tk) / (1 / tl + fb / tk))
          printf "%-9s %-10s %9s %7s %10s %11s %10s %8s\n", m, c, t == "" ? "-" : sprintf("%.2f", t),
            (t != "" && tk > 0) ? sprintf("%.2f", t / tk) : "-", fb == "" ? "-" : sprintf("%.1f %%", 100 * fb),
            pred, by == "" ? "-" : sprintf("%.2f", by / 1e6), hit == "" ? "-" : sprintf("%.3f", hit) }'
      done
    done
  } | tee "$work/mobile-table.txt"
fi

# ---- 4. MoBiLE quality ------------------------------------------------------------------------------
if [ $skip_quality -eq 0 ]; then
  echo "== MoBiLE quality on $model/heldout/c4.txt (eval --ref the same bundle, q8_0, --ctx 256, $eval_chunks chunks)"
  qtsv=$work/quality.tsv
  printf 'gamma\tppl\tref_ppl\tkld\tsame_top\tfallback\n' >"$qtsv"
  for g in 0 $gammas 1; do
    out=$work/eval-g$g.json
    run "$prep" eval "$trained" --ref "$trained" --expert-precision q8_0 --dataset "$model/heldout/c4.txt" --ctx 256 \
      --max-chunks "$eval_chunks" -t "$threads" --little-k 1 --gamma "$g" --json >"$out" 2>"$work/eval-g$g.log"
    # the figures by key (cJSON writes the object on one line, with or without spaces)
    ppl=$(sed -n 's/.*"ppl":[[:space:]]*{[[:space:]]*"value":[[:space:]]*\([-0-9.eE+]*\).*/\1/p' "$out")
    rppl=$(sed -n 's/.*"ref_ppl":[[:space:]]*{[[:space:]]*"value":[[:space:]]*\([-0-9.eE+]*\).*/\1/p' "$out")
    kld=$(sed -n 's/.*"kld":[[:space:]]*{[[:space:]]*"mean":[[:space:]]*\([-0-9.eE+]*\).*/\1/p' "$out")
    top=$(sed -n 's/.*"same_top":[[:space:]]*{[[:space:]]*"value":[[:space:]]*\([-0-9.eE+]*\).*/\1/p' "$out")
    fb=$(stat_of "$out" fallback_ratio)
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$g" "$ppl" "$rppl" "$kld" "$top" "$fb" >>"$qtsv"
  done
  awk -F'\t' 'NR == 1 { next } { g[NR] = $1; p[NR] = $2; r[NR] = $3; k[NR] = $4; t[NR] = $5; f[NR] = $6; if ($1 == 0) { p2 = $2; k2 = $4 } ref = $3; n = NR }
    END {
      printf "held-out c4, trained model (q8_0 experts): K = top-2 (PPL %.3f), K2 = top-1; big-little gamma G\n", ref
      printf "%-8s %9s %9s %10s %9s %9s %14s %14s\n", "run", "PPL", "PPL/K", "KL to K", "top agr", "fallback", "gap ln PPL", "gap KL"
      for (i = 2; i <= n; i++) {
        name = g[i] == 0 ? "K2" : g[i] == 1 ? "g=1 (K)" : "g=" g[i]
        rec = (log(p2) - log(r[i])) > 0 ? (log(p2) - log(p[i])) / (log(p2) - log(r[i])) : 0
        reck = k2 > 0 ? (k2 - k[i]) / k2 : 0
        printf "%-8s %9.3f %9.4f %10.5f %8.1f%% %8.1f%% %13.0f%% %13.0f%%\n", name, p[i], p[i] / r[i], k[i], 100 * t[i], 100 * f[i], 100 * rec, 100 * reck
      }
      print "gap: the share of the K2 -> K difference that big-little recovers (0 % = K2, 100 % = K)"
    }' "$qtsv" | tee "$work/quality.txt"
fi

# ---- 5. the planner against reality --------------------------------------------------------------------
if [ $skip_plan -eq 0 ]; then
  echo "== planner check on the inflated model: moe-prep hw, then plans at $mems"
  run "$prep" hw "$inflated" -t "$threads" --hw "$work/hw.json" | tee "$work/hw.txt"
  ptsv=$work/plan.tsv
  printf 'tag\tprompt\trc\ttok_s\tfallback\tbytes_per_tok\thit\tdecode_s\n' >"$ptsv"
  declare -A PRED OPTS CHOSEN
  all_tags=()
  for mem in $mems; do
    js=$work/plan-$mem.json
    run "$prep" plan "$inflated" --profile "$work/inflated-p.h5" --mem "$mem" --hw "$work/hw.json" -t "$threads" \
      --no-measure --eval-text "$model/heldout/c4.txt" --quality-budget 3% --eval-ctx 128 --eval-chunks 2 --top 4 \
      --json >"$js" 2>"$work/plan-$mem.log"
    run "$prep" plan "$inflated" --profile "$work/inflated-p.h5" --mem "$mem" --hw "$work/hw.json" -t "$threads" \
      --no-measure --eval-text "$model/heldout/c4.txt" --quality-budget 3% --eval-ctx 128 --eval-chunks 2 --top 4 \
      >"$work/plan-$mem.txt" 2>/dev/null
    # the eligible plans of the table, distinct options, at most 4; the chosen one first
    n=0
    while IFS=$'\t' read -r rank tps opts; do
      tag="m$mem-p$rank"
      PRED[$tag]=$tps
      OPTS[$tag]=$opts
      [ $n -eq 0 ] && CHOSEN[$mem]=$tag
      all_tags+=("$tag")
      n=$((n + 1))
      [ $n -ge 4 ] && break
    done < <(python3 -c 'import json, sys
for p in json.load(open(sys.argv[1]))["plans"]:
    if p["eligible"]: print("%d\t%.9g\t%s" % (p["rank"], p["tok_s"], p["options"]))' "$js" |
             awk -F'\t' '!seen[$2 $3]++')
  done
  for ((r = 1; r <= rounds; r++)); do
    order=("${all_tags[@]}")
    if [ $((r % 2)) -eq 0 ]; then
      order=()
      for ((i = ${#all_tags[@]} - 1; i >= 0; i--)); do order+=("${all_tags[i]}"); done
    fi
    for prompt in $prompts; do
      for tag in "${order[@]}"; do
        # shellcheck disable=SC2086 # options split on purpose
        one_run "$ptsv" "r$r-$tag-$prompt" "$inflated" "$prompt" ${OPTS[$tag]}
      done
    done
  done
  {
    echo "planner check, inflated model (FFN 8192), -t $threads, -n $n_predict; measured: median over $rounds rounds x 4 prompts"
    echo "plans: the eligible ones of each table (quality budget 3 % PPL on c4, eval through the engine), chosen first"
    printf '%-6s %-8s %10s %10s %9s %s\n' mem plan predicted measured "meas/pred" options
    for tag in "${all_tags[@]}"; do
      meas=$(pool "$ptsv" "$tag" | median 4)
      mem=${tag%%-p*}; mem=${mem#m}
      mark=" "; [ "${CHOSEN[$mem]}" = "$tag" ] && mark="*"
      awk -v mem="$mem" -v t="$tag" -v p="${PRED[$tag]}" -v m="$meas" -v o="${OPTS[$tag]}" -v mark="$mark" 'BEGIN {
        printf "%-6s %s%-7s %10.2f %10s %9s %s\n", mem, mark, substr(t, index(t, "-p") + 1), p,
          m == "" ? "-" : sprintf("%.2f", m), m == "" ? "-" : sprintf("%.2f", m / p), o }'
    done
    echo "*: the chosen plan. meas/pred within 0.8 .. 1.2 is the goal."
  } | tee "$work/plan-table.txt"
fi
