#!/usr/bin/env bash
# bench-offload.sh - expert offloading benchmark on the trained demo model, made
# big enough for I/O to matter.
#
#   tests/bench/bench-offload.sh [--work DIR] [--ffn N] [--rounds R] [-n TOKENS]
#                                [--threads T] [--io direct|buffered|mmap]
#                                [--model DIR] [--calib python_docs|mix] [--temp T]
#                                [--prep-only] [--dry-run] [--no-build]
#
# --model: another trained checkpoint with heldout/ texts (default
# datasets/models/tiny-moe-mixtral; e.g. datasets/models/tiny-moe-qwen3 with a
# smaller --ffn: it has 12x the experts).
# --calib mix: profile and fit on the first half of every held-out domain
# (python_docs, wordnet, c4, gsm8k, fortunes; the prompts come from the
# second halves) instead of python_docs alone: calibration like the workload
# (docs/benchmarks.md). Use its own --work: the bundle's tuning differs.
# --temp T: step 8's runs sample at temperature T (--top-p 0.95, --seed 42)
# instead of decoding greedily (default 0, greedy: the issue's method). The tiny
# models' greedy continuations fall into loops (a repeated token routes to the
# same experts every step), which flatters recency; sampling is the workload a
# chat user makes.
#
# Steps (each prints the exact command it runs; a step whose output exists is
# reused, unless an earlier step in the chain ran again):
#   1. build (cmake Release, build dir $MOE_BUILD_DIR or build/)
#   2. inflate the trained model (datasets/models/tiny-moe-mixtral, F = 256) to
#      --ffn N (default 8192) with tests/bench/inflate-moe: zero rows/columns,
#      same routing and logits, 32x the expert bytes
#   3. check: moe-run on the original and the inflated checkpoint gives
#      bit-identical logits (a few tokens)
#   4. quantize: --experts q8_0,q4_k,q2_k --dense q8_0; print each precision's
#      expert bytes (moe-prep inspect --json)
#   5. profile the bundle on the demo's calibration text (heldout/python_docs.txt,
#      --ctx 256, as scripts/demo.sh); writes HOBBIT thresholds into the bundle
#   6. fit-cache at the 25 % budget (--fast-mem = 25 % of the q8_0 expert bytes,
#      --high q8_0 --low q2_k): HOBBIT's weights into the bundle's tuning
#   7. bench-io on the bundle: the storage's raw read bandwidth
#   8. moe-run, interleaved over --rounds rounds (the order reverses every other
#      round) on held-out prompts of the other four domains (c4, fortunes,
#      gsm8k, wordnet), -t T, -n TOKENS decode tokens, at budgets of 25 % and
#      50 % of the q8_0 expert bytes:
#        a  --policy lru --dynamic off --prefetch off --high q8_0   (baseline)
#        b  a + --dynamic on --low q2_k                             (HOBBIT precision)
#        c  b + --policy hobbit                                     (fitted weights)
#        d  c + --prefetch on --prefetch-layers P --prefetch-paths M
#        e  no --expert-mem, --expert-precision q8_0                (all resident)
#        f  --expert-mem only: moe-run's default engine (what a user gets)
#        g  f + --prefetch-slots 1 --route-margin 0.05             (issue 31's options)
#      Before each offloaded run the bundle's pages are dropped from the page
#      cache (dd iflag=nocache); before e they are loaded (resident ceiling).
#   9. the table: median decode tokens/s per configuration and budget, ratio to
#      a at the same budget and to e, bytes read per token, hit ratios, stall.
#  10. the simulator against the run: b at 25 % without warm start, with
#      --trace-out, on one prompt; the trace replayed by fit-cache at the run's
#      cache sizes and prompt length; LRU's hit ratio and bytes per token from
#      both (fit-cache's policies are the runtime's cache core, so they should
#      agree up to the runtime's 4 KiB-rounded reads).
#  11. quality: moe-prep eval through the engine (b at 25 %, one token per
#      step) against the all-resident q8_0 run on held-out text: PPL rise, KL,
#      top-token agreement and the share of low-precision expert uses.
#
# The moe-run options of step 8 are edited in one place: the CONFIGS table and
# offload_opts() below. Results: $WORK/runs/*.json (--stats-json), *.log
# (stderr), $WORK/results.tsv, $WORK/table.txt.
#
# Environment: MOE_BUILD_DIR, MOE_OFFLOAD_DIR (= --work), MOE_OFFLOAD_MOE_RUN (the
# moe-run binary, default $MOE_BUILD_DIR/moe-run), MOE_OFFLOAD_PREFETCH_LAYERS
# (default 1), MOE_OFFLOAD_PREFETCH_PATHS (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."

work=${MOE_OFFLOAD_DIR:-/tmp/moe-offload}
ffn=8192
rounds=3
n_predict=96
threads=2
io=direct
prep_only=0
dry_run=0
do_build=1
build=${MOE_BUILD_DIR:-build}
prefetch_layers=${MOE_OFFLOAD_PREFETCH_LAYERS:-1}
prefetch_paths=${MOE_OFFLOAD_PREFETCH_PATHS:-2}
model=datasets/models/tiny-moe-mixtral
calib_mode=python_docs
temp=0
prompt_domains="c4 fortunes gsm8k wordnet"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --ffn) ffn=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n|--n-predict) n_predict=$2; shift 2 ;;
    --threads|-t) threads=$2; shift 2 ;;
    --io) io=$2; shift 2 ;;
    --prep-only) prep_only=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --no-build) do_build=0; shift ;;
    --model) model=${2%/}; shift 2 ;;
    --calib) calib_mode=$2; shift 2 ;;
    --temp) temp=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-offload: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$ffn$rounds$n_predict$threads" in *[!0-9]*) echo "bench-offload: --ffn, --rounds, -n, --threads take integers" >&2; exit 2 ;; esac
case "$io" in direct|buffered|mmap) ;; *) echo "bench-offload: --io takes direct, buffered or mmap" >&2; exit 2 ;; esac
case "$temp" in '' | *[!0-9.]* | *.*.*) echo "bench-offload: --temp takes a number >= 0" >&2; exit 2 ;; esac
sampling=()
if [ "$(awk -v t="$temp" 'BEGIN { print (t > 0) }')" = 1 ]; then sampling=(--temp "$temp" --top-p 0.95 --seed 42); fi

# run: print a command (shell-quoted, so it can be pasted) and run it.
run() {
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
  "$@"
}

# Steps form a chain: once one runs, every later step runs too (the bundle they
# reuse would be stale otherwise).
redo=0
# need OUTPUT DESCRIPTION: true when the step must run; says why it is skipped.
need() {
  if [ $redo -eq 0 ] && [ -e "$1" ]; then
    echo "== $2: reusing $1"
    return 1
  fi
  echo "== $2"
  redo=1
  return 0
}

prep=$build/moe-prep
moerun=${MOE_OFFLOAD_MOE_RUN:-$build/moe-run}
inflate=$build/tests/inflate-moe
benchio=$build/tests/bench-io
[ -f "$model/config.json" ] && [ -d "$model/heldout" ] ||
  { echo "bench-offload: $model is not a trained checkpoint with heldout/ texts" >&2; exit 2; }
case "$calib_mode" in
  python_docs) calib=$model/heldout/python_docs.txt ;;
  mix)
    mkdir -p "$work"
    calib=$work/calib-mix.txt
    for d in python_docs wordnet c4 gsm8k fortunes; do
      n=$(wc -l <"$model/heldout/$d.txt")
      head -n $((n / 2 - 1)) "$model/heldout/$d.txt" # the prompts start at line n / 2
    done >"$calib" ;;
  *) echo "bench-offload: --calib takes python_docs or mix" >&2; exit 2 ;;
esac
inflated=$work/$(basename "$model")-ffn$ffn
bundle=$work/$(basename "$model")-ffn$ffn.moeb
profile=$work/p.h5
mkdir -p "$work/runs" "$work/prompts"

# ---- 1. build ----------------------------------------------------------------
if [ $do_build -eq 1 ]; then
  echo "== build ($build, Release)"
  run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  run cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target moe-run moe-prep inflate-moe bench-io
fi

# ---- 2. inflate ----------------------------------------------------------------
if need "$inflated/model.safetensors" "inflate the trained model to FFN $ffn"; then
  run "$inflate" "$model" "$inflated" --ffn "$ffn"
fi

# ---- 3. check: same logits ------------------------------------------------------
if need "$work/check-logits.ok" "check: original and inflated checkpoint give bit-identical logits"; then
  ids=$(run "$moerun" -m "$model" --tokenize -p "The river rose through the night, and by morning")
  run "$moerun" -m "$model" --tokens "$ids" -n 4 --ignore-eos --ids --logits-out "$work/check-orig.f32" -t "$threads" 2>/dev/null
  run "$moerun" -m "$inflated" --tokens "$ids" -n 4 --ignore-eos --ids --logits-out "$work/check-inflated.f32" -t "$threads" 2>/dev/null
  if ! cmp "$work/check-orig.f32" "$work/check-inflated.f32"; then
    echo "bench-offload: the inflated model's logits differ from the original's" >&2
    exit 1
  fi
  echo "logits bit-identical ($(stat -c %s "$work/check-orig.f32") bytes)" | tee "$work/check-logits.ok"
  rm -f "$work/check-orig.f32" "$work/check-inflated.f32"
fi

# ---- 4. quantize ------------------------------------------------------------------
if need "$bundle" "quantize: experts q8_0,q4_k,q2_k, dense q8_0"; then
  run "$prep" quantize "$inflated" -o "$bundle" --experts q8_0,q4_k,q2_k --dense q8_0 -t "$threads" 2>&1 |
    grep -v '^quantize: ' || true
  [ -f "$bundle" ] || { echo "bench-offload: quantize wrote no bundle" >&2; exit 1; }
fi
run "$prep" inspect "$bundle" --json >"$work/inspect.json"
# expert_field PREC KEY: a field of one precision in inspect --json (cJSON prints
# one key per line).
expert_field() {
  awk -v p="$1" -v k="$2" '
    /"name":/ { gsub(/[",\t ]/, "", $0); sub(/^name:/, "", $0); cur = $0; next }
    $0 ~ "\"" k "\":" && cur == p { gsub(/[^0-9]/, "", $0); print; exit }' "$work/inspect.json"
}
q8_total=$(expert_field q8_0 total_bytes)
[ -n "$q8_total" ] || { echo "bench-offload: no q8_0 precision in $bundle" >&2; exit 1; }
budget25=$((q8_total / 4))
budget50=$((q8_total / 2))
{
  printf 'expert bytes of %s (FFN %s):\n' "$(basename "$bundle")" "$ffn"
  printf '  %-6s %12s %14s\n' precision "per expert" "all experts"
  for p in q8_0 q4_k q2_k; do
    printf '  %-6s %10.2f MB %12.1f MB\n' "$p" "$(expert_field $p blob_bytes | awk '{print $1/1e6}')" \
      "$(expert_field $p total_bytes | awk '{print $1/1e6}')"
  done
  printf '  budgets: 25 %% = %d bytes (%.1f MB), 50 %% = %d bytes (%.1f MB) of the q8_0 expert bytes\n' \
    "$budget25" "$(awk -v b=$budget25 'BEGIN{print b/1e6}')" "$budget50" "$(awk -v b=$budget50 'BEGIN{print b/1e6}')"
} | tee "$work/expert-bytes.txt"

# ---- 5. profile ----------------------------------------------------------------------
if need "$profile" "profile on the calibration text ($(basename "$calib"))"; then
  run "$prep" profile "$bundle" --dataset "$calib" -o "$profile" --ctx 256 -t "$threads" >"$work/profile.txt"
  grep -E '^HOBBIT|^profile of' "$work/profile.txt" || true
fi

# ---- 6. fit-cache at the 25 % budget -------------------------------------------------
if need "$work/fit-cache-25.txt" "fit-cache: HOBBIT weights for --fast-mem $budget25 (25 %)"; then
  run "$prep" fit-cache "$bundle" --profile "$profile" --fast-mem "$budget25" --high q8_0 --low q2_k \
    --csv "$work/fit-cache-25.csv" >"$work/fit-cache-25.txt.tmp"
  mv "$work/fit-cache-25.txt.tmp" "$work/fit-cache-25.txt"
fi
sed -n '1,40p' "$work/fit-cache-25.txt"

# ---- 7. bench-io (every time: the ceiling for misses belongs to the same run) --------------
if [ $dry_run -eq 0 ] && [ $prep_only -eq 0 ]; then
  echo "== bench-io: raw read bandwidth of the bundle's storage"
  run "$benchio" "$bundle" --rounds 2 >"$work/bench-io.txt.tmp"
  mv "$work/bench-io.txt.tmp" "$work/bench-io.txt"
  grep -v "^{" "$work/bench-io.txt"
fi

# ---- 8. moe-run configurations --------------------------------------------------------------
# prompts: ~500 bytes from the middle of each held-out domain the profile did not see
for d in $prompt_domains; do
  f=$work/prompts/$d.txt
  [ -s "$f" ] && continue
  src=$model/heldout/$d.txt
  half=$(( $(wc -l <"$src") / 2 ))
  tail -n +"$half" "$src" | awk '{ s = s $0 "\n"; if (length(s) >= 500) { printf "%s", s; exit } }' >"$f"
done

# The configurations: name and options (edit here when moe-run's options change).
configs=(a b c d e f g)
declare -A CONFIGS=(
  [a]="--policy lru --dynamic off --prefetch off --high q8_0"
  [b]="--policy lru --dynamic on --prefetch off --high q8_0 --low q2_k"
  [c]="--policy hobbit --dynamic on --prefetch off --high q8_0 --low q2_k"
  [d]="--policy hobbit --dynamic on --prefetch on --prefetch-layers $prefetch_layers --prefetch-paths $prefetch_paths --high q8_0 --low q2_k"
  [e]="--expert-precision q8_0"
  [f]=""
  [g]="--prefetch-slots 1 --route-margin 0.05"
)
# offload_opts CONFIG BUDGET: the memory options of one run (e: none).
offload_opts() {
  if [ "$1" = e ]; then echo ""; else echo "--expert-mem $2 --io $io"; fi
}

if [ $prep_only -eq 1 ]; then
  echo "== --prep-only: stopping before the moe-run benchmark"
  exit 0
fi
if [ $dry_run -eq 0 ] && ! grep -q -- '--expert-mem' <<<"$("$moerun" --help 2>&1)"; then
  echo "bench-offload: $moerun has no --expert-mem option yet: preparation is done in $work;" >&2
  echo "  the runs it would make are listed by: $0 --work $work --no-build --dry-run" >&2
  exit 1
fi

# stat_of KEY: a number from the run's --stats-json file ($stats; a flat key), "" if absent.
stat_of() {
  [ -f "$stats" ] && sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\([-0-9.eE+]*\).*/\1/p" "$stats" | head -n 1
  return 0
}

# one_run ROUND CONFIG BUDGET_NAME BUDGET PROMPT: one moe-run; appends a line to results.tsv.
one_run() {
  local round=$1 cfg=$2 bname=$3 budget=$4 prompt=$5
  local tag="r$round-$cfg-$bname-$prompt" stats log rc=0
  stats=$work/runs/$tag.json
  log=$work/runs/$tag.log
  # shellcheck disable=SC2206,SC2207 # option strings split on purpose
  local cmd=("$moerun" -m "$bundle" -f "$work/prompts/$prompt.txt" -n "$n_predict" --ignore-eos -t "$threads"
             ${sampling[@]+"${sampling[@]}"} ${CONFIGS[$cfg]} $(offload_opts "$cfg" "$budget") --stats-json "$stats")
  if [ $dry_run -eq 1 ]; then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    return 0
  fi
  if [ "$cfg" = e ]; then
    run cat "$bundle" >/dev/null                              # resident ceiling: pages cached
  else
    run dd if="$bundle" iflag=nocache count=0 status=none     # offloaded: start from storage
  fi
  rm -f "$stats"
  printf '+' >&2
  printf ' %q' "${cmd[@]}" >&2
  printf ' >/dev/null 2>%q\n' "$log" >&2
  "${cmd[@]}" >/dev/null 2>"$log" || rc=$?
  local tps
  tps=$(stat_of tokens_per_s_decode)
  # fall back on moe-run's own summary line: "generated N tokens in T s (X tok/s)"
  [ -n "$tps" ] || tps=$(sed -n 's/.*generated [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$log" | tail -n 1)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$cfg" "$bname" "$prompt" "$rc" "${tps:-}" \
    "$(stat_of bytes_read_per_decode_token)" "$(stat_of hit_ratio_high)" "$(stat_of hit_ratio_low)" "$(stat_of stall_s_per_decode_token)" \
    "$(stat_of peak_resident_bytes)" >>"$work/results.tsv"
  [ $rc -eq 0 ] || echo "bench-offload: run $tag exited $rc (see $log)" >&2
}

echo "== moe-run: $rounds rounds x ${#configs[@]} configurations x budgets 25/50 % x prompts ($prompt_domains), -n $n_predict -t $threads"
[ $dry_run -eq 1 ] || printf 'round\tconfig\tbudget\tprompt\trc\ttok_s\tbytes_per_decode_tok\thit_high\thit_low\tstall_s_decode_tok\tpeak_bytes\n' >"$work/results.tsv"
for ((r = 1; r <= rounds; r++)); do
  order=("${configs[@]}")
  if [ $((r % 2)) -eq 0 ]; then # alternate the order so drift hits every configuration alike
    order=()
    for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[i]}"); done
  fi
  for prompt in $prompt_domains; do
    for cfg in "${order[@]}"; do
      if [ "$cfg" = e ]; then
        one_run "$r" e all 0 "$prompt"
      else
        one_run "$r" "$cfg" 25 "$budget25" "$prompt"
        one_run "$r" "$cfg" 50 "$budget50" "$prompt"
      fi
    done
  done
  [ $dry_run -eq 1 ] && break
done
[ $dry_run -eq 1 ] && exit 0

# ---- 9. table ----------------------------------------------------------------------------------
# median KEY_COLUMN over the runs of one configuration and budget
median() {
  awk -F'\t' -v c="$1" -v b="$2" -v k="$3" 'NR > 1 && $2 == c && $3 == b && $5 == 0 && $k != "" { print $k }' \
    "$work/results.tsv" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
resident=$(median e all 6)
{
  echo "decode tokens/s, median over $rounds rounds x prompts ($prompt_domains); FFN $ffn, -t $threads, -n $n_predict, --io $io, $([ ${#sampling[@]} -gt 0 ] && echo "sampled: ${sampling[*]}" || echo greedy)"
  echo "budgets: 25 % = $budget25 bytes, 50 % = $budget50 bytes (of the q8_0 expert bytes, $q8_total)"
  printf '%-7s %-6s %6s %9s %7s %9s %11s %8s %8s %10s %10s\n' config budget runs "tok/s" "x a" "x e" "MB/dec tok" "hit hi" "hit lo" "stall ms" "peak MB"
  for cfg in "${configs[@]}"; do
    for b in 25 50; do
      [ "$cfg" = e ] && { [ $b = 25 ] || continue; b=all; }
      tps=$(median "$cfg" "$b" 6)
      base=$(median a "$b" 6)
      [ "$cfg" = e ] && base=""
      ok=$(awk -F'\t' -v c="$cfg" -v b="$b" 'NR > 1 && $2 == c && $3 == b { n++; if ($5 == 0 && $6 != "") k++ } END { printf "%d/%d", k, n }' "$work/results.tsv")
      awk -v c="$cfg" -v b="$b" -v ok="$ok" -v t="$tps" -v base="$base" -v res="$resident" \
          -v by="$(median "$cfg" "$b" 7)" -v hh="$(median "$cfg" "$b" 8)" -v hl="$(median "$cfg" "$b" 9)" \
          -v st="$(median "$cfg" "$b" 10)" -v pk="$(median "$cfg" "$b" 11)" '
        function f(x, fmt) { return x == "" ? "-" : sprintf(fmt, x) }
        BEGIN {
          printf "%-7s %-6s %6s %9s %7s %9s %11s %8s %8s %10s %10s\n", c, b, ok, f(t, "%.2f"),
            (t != "" && base > 0) ? sprintf("%.2f", t / base) : "-",
            (t != "" && res > 0) ? sprintf("%.2f", t / res) : "-",
            by == "" ? "-" : sprintf("%.2f", by / 1e6), f(hh, "%.3f"), f(hl, "%.3f"),
            st == "" ? "-" : sprintf("%.2f", st * 1e3), pk == "" ? "-" : sprintf("%.1f", pk / 1e6)
        }'
    done
  done
  echo "a: LRU, q8_0 only; b: + HOBBIT dynamic precision (q2_k low); c: + HOBBIT policy; d: + prefetch; e: all resident; f: moe-run defaults (only --expert-mem); g: f + prefetch slot + route margin 0.05"
  echo "MB/dec tok and stall ms: bytes read and time waiting for reads per decoded token; hit ratios over the whole run"
  echo "runs: successful/all; medians over the successful ones. Storage, reads of one q8_0 expert blob:"
  echo "  $(grep "^ *fastest" "$work/bench-io.txt" | head -n 1 | sed 's/^ *//'), direct-t1 $(awk '/direct-t1/ {print $2 " MB/s"; exit}' "$work/bench-io.txt") (bench-io, $work/bench-io.txt)"
} | tee "$work/table.txt"

# ---- 10. the simulator's prediction against the run ------------------------------------------------
echo "== simulator check: config b at 25 %, no warm start, trace replayed by fit-cache"
stats=$work/runs/sim-b-25.json
rm -f "$stats" "$work/sim-trace.h5"
run dd if="$bundle" iflag=nocache count=0 status=none
# shellcheck disable=SC2086 # option strings split on purpose
run "$moerun" -m "$bundle" -f "$work/prompts/c4.txt" -n "$n_predict" --ignore-eos -t "$threads" ${CONFIGS[b]} \
  $(offload_opts b "$budget25") --warm off --stats-json "$stats" --trace-out "$work/sim-trace.h5" >/dev/null 2>"$work/runs/sim-b-25.log"
hc=$(stat_of high_cap); lc=$(stat_of low_cap); np=$(stat_of prompt_tokens)
run_hit=$(stat_of hit_ratio); run_bpt=$(stat_of bytes_read_per_token)
run "$prep" fit-cache "$bundle" --profile "$work/sim-trace.h5" --cache-experts "$hc,$lc" --sizes "$hc" --heldout 0 \
  --prompt-len "$np" --high q8_0 --low q2_k --no-tuning --no-profile-update >"$work/sim-replay.txt" 2>&1
# the lru row: "lru  HIT %  PENALTY  BYTES MiB  GAP"
sim_hit=$(awk '$1 == "lru" { sub("%", "", $2); print $2 / 100; exit }' "$work/sim-replay.txt")
sim_bpt=$(awk '$1 == "lru" { v = $5; u = $6; m = (u == "MiB") ? 1048576 : (u == "KiB") ? 1024 : (u == "GiB") ? 1073741824 : 1; print v * m; exit }' "$work/sim-replay.txt")
awk -v rh="$run_hit" -v rb="$run_bpt" -v sh="$sim_hit" -v sb="$sim_bpt" -v h="$hc" -v l="$lc" -v n="$np" 'BEGIN {
  printf "LRU + dynamic precision, %d high + %d low copies, prompt %d tokens + decode:\n", h, l, n
  printf "  %-10s %10s %14s\n", "", "hit ratio", "bytes/token"
  printf "  %-10s %10.4f %11.3f MB\n", "moe-run", rh, rb / 1e6
  printf "  %-10s %10.4f %11.3f MB\n", "simulator", sh, sb / 1e6
  printf "  run / simulator bytes per token: %.3f\n", rb / sb
}' | tee "$work/sim-check.txt"

# ---- 11. quality of dynamic precision through the engine ------------------------------------------
echo "== quality: eval through the engine (b at 25 %, --batch 1) against all resident q8_0"
run "$prep" eval "$bundle" --ref "$bundle" --expert-precision q8_0 --dataset "$model/heldout/c4.txt" --ctx 256 \
  --max-chunks "${MOE_OFFLOAD_EVAL_CHUNKS:-4}" --batch 1 -t "$threads" ${CONFIGS[b]} $(offload_opts b "$budget25") \
  >"$work/eval-b-25.txt" 2>"$work/eval-b-25.log"
grep -E "Mean PPL|Mean    KLD|Same top|^engine|expert uses" "$work/eval-b-25.txt" | tee "$work/quality.txt"
