#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the
# pipeline on the embedded default model: check the checkpoint, quantize it
# into a multi-precision bundle, inspect and verify the bundle, measure each
# precision against the original (perplexity, KL), generate text, profile the
# routing, sweep EdgeMoE sensitivities, search per-expert bit-widths, run with a quarter of the
# expert bytes in memory next to all resident, decode big-little (MoBiLE) and plan a run for
# a memory size. The default model is the small MoE trained for the project
# (datasets/models/tiny-moe-mixtral: Mixtral architecture, BF16); MOE_DEMO_MODEL
# picks another checkpoint directory, MOE_DEMO_TEXT another calibration text.
# Then the same stages, shorter, on the second trained model, fine-grained
# routing (datasets/models/tiny-moe-qwen3: Qwen3-MoE, 12 layers of 32 experts of
# 32, top-4) when its weights are there; MOE_DEMO_MODEL2 picks another
# checkpoint of that kind, MOE_DEMO_MODEL2=none skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
default_model=datasets/models/tiny-moe-mixtral
[ -f "$default_model/model.safetensors" ] || default_model=tests/fixtures/models/qwen3_moe-f32
model=${MOE_DEMO_MODEL:-$default_model}
work=${MOE_DEMO_DIR:-build/demo}
text=${MOE_DEMO_TEXT:-$model/heldout/python_docs.txt}
[ -f "$text" ] || text=tests/fixtures/demo/calibration.txt
experts=${MOE_DEMO_EXPERTS:-q8_0,q4_k,q2_k}
dense=${MOE_DEMO_DENSE:-q8_0}

scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" --target moe-run moe-prep
mkdir -p "$work"

echo
echo "== 1. check the checkpoint"
build/moe-prep check "$model"
echo
echo "== 2. quantize: experts at $experts side by side, other matrices at $dense"
build/moe-prep quantize "$model" -o "$work/model.moeb" --experts "$experts" --dense "$dense" 2>&1 | grep -v '^quantize: '

echo
echo "== 3. inspect and verify the bundle"
build/moe-prep inspect "$work/model.moeb" --verify
echo
echo "== 4. each expert precision against the original checkpoint ($text)"
ppl_summary=""
for p in ${experts//,/ }; do
  line=$(build/moe-prep eval "$work/model.moeb" --expert-precision "$p" --ref "$model" --dataset "$text" \
      --ctx 256 --max-chunks 8 2>&1 >/dev/null | tail -n 1 | sed 's/^moe-prep eval: //')
  printf '%-5s %s\n' "$p" "$line"
  ppl_summary+=$(echo "$line" | sed -n 's/.*PPL \([0-9.]*\), mean KLD \([0-9.]*\), same top \([0-9.]*\) %.*/'"$p"' PPL \1, KL \2, same top \3 %;  /p')
done
echo
low=${experts##*,}
echo "== 5. generate from the bundle ($low experts, greedy, 40 tokens)"
build/moe-run -m "$work/model.moeb" --expert-precision "$low" -p "The function returns" -n 40 \
    >"$work/sample.txt" 2>"$work/speed.txt"
cat "$work/sample.txt"
cat "$work/speed.txt"
echo
echo "== 6. profile the routing on held-out text (HOBBIT thresholds, popular experts, prefetch accuracy, big-little)"
build/moe-prep profile "$work/model.moeb" --dataset "$text" -o "$work/profile.h5" --ctx 256 --csv-dir "$work/profile-csv" |
    tee "$work/profile.txt"
build/moe-prep profile report "$work/profile.h5" -o "$work/profile.html"
echo
text2="$model/heldout/wordnet.txt"
echo "== 7. profile a second domain ($(basename "$text2")) in two shards, as on two machines, and merge them"
for i in 1 2; do
    build/moe-prep profile "$work/model.moeb" --dataset "$text2" -o "$work/shard$i.h5" --ctx 256 --shard $i/2 \
        >/dev/null
done
build/moe-prep profile merge "$work/shard1.h5" "$work/shard2.h5" -o "$work/profile2.h5" >"$work/profile2.txt"
grep -E "^profile of|^  [0-9]+ MoE|^HOBBIT|^big-little|suggested gamma" "$work/profile2.txt"
build/moe-prep profile report "$work/profile2.h5" -o "$work/profile2.html"
echo
echo "== 8. expert cache: replay the routing through LRU/LFU/LHU/FLD/EdgeMoE/Twiddler/HOBBIT/Belady, fit HOBBIT's weights"
build/moe-prep fit-cache "$work/model.moeb" --profile "$work/profile.h5" --fast-mem 2MiB \
    --csv "$work/cache.csv" | tee "$work/cache.txt"
build/moe-prep profile report "$work/profile.h5" -o "$work/profile.html"
echo
text3="$model/heldout/c4.txt"
[ -f "$text3" ] || text3="$text"
echo "== 9. EdgeMoE sensitivity: each expert alone at the lowest precision ($(basename "$text2"), 10 sequences)"
build/moe-prep sensitivity "$work/model.moeb" --dataset "$text2" --max-tokens 2560 --ctx 256 \
    -o "$work/sensitivity.h5" --csv "$work/sensitivity.csv" | tee "$work/sensitivity.txt"
build/moe-prep profile report "$work/sensitivity.h5" -o "$work/sensitivity.html"
echo
echo "== 10. EdgeMoE bit-width search within a 2 % loss budget (held out: $(basename "$text3"))"
build/moe-prep bitwidth "$work/model.moeb" --sensitivity "$work/sensitivity.h5" --dataset "$text2" \
    --ctx 256 --max-loss 2% --heldout "$text3" 2>/dev/null | tee "$work/bitwidth.txt"
echo
echo "== 11. offloading: a quarter of the expert bytes in memory, next to every expert resident"
echo "   (moe-run's engine: HOBBIT's fitted cache from step 8, dynamic precision with T1/T2 from step 6,"
echo "    each expert's home precision from the bit-width map of step 10; misses read with O_DIRECT)"
build/moe-run -m "$work/model.moeb" -p "The function returns" -n 64 --ignore-eos \
    >"$work/resident.txt" 2>"$work/resident-speed.txt"
build/moe-run -m "$work/model.moeb" -p "The function returns" -n 64 --ignore-eos --expert-mem 25% \
    --stats-json "$work/offload-stats.json" >"$work/offload.txt" 2>"$work/offload-speed.txt"
printf 'all resident  %s\n' "$(grep '^moe-run: prompt' "$work/resident-speed.txt" | sed 's/^moe-run: //')"
printf '25 %% resident %s\n' "$(grep '^moe-run: prompt' "$work/offload-speed.txt" | sed 's/^moe-run: //')"
printf '              %s\n' "$(grep '^moe-run: experts:.*cache' "$work/offload-speed.txt" | sed 's/^moe-run: experts: //')"
echo "   stats: $work/offload-stats.json; same text as all resident: $(cmp -s "$work/resident.txt" "$work/offload.txt" && echo yes || echo 'no (dynamic precision)')"
# the miss path against the storage: each read's rate (read, checksum, interleave) next to a plain O_DIRECT read
stat_of() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\([-0-9.eE+]*\).*/\1/p" "$work/offload-stats.json" | head -n 1; }
storage=$(dd if="$work/model.moeb" of=/dev/null bs=1M iflag=direct 2>&1 | sed -n 's/.*, \([0-9.,]* [kMG]*B\/s\)$/\1/p')
echo "   reads: $(awk -v b="$(stat_of bytes_read_per_decode_token)" 'BEGIN { printf "%.2f MB", b / 1e6 }') per decoded token," \
     "each at $(awk -v r="$(stat_of read_bytes_per_s)" 'BEGIN { printf "%.0f MB/s", r / 1e6 }') (read, checksum, interleave);" \
     "the storage: ${storage:-n/a} (dd, O_DIRECT, the whole bundle)"
offload_quality=$(build/moe-prep eval "$work/model.moeb" --ref "$work/model.moeb" --dataset "$text3" --ctx 256 \
    --max-chunks 4 --batch 1 --expert-mem 25% 2>&1 >/dev/null | tail -n 1 | sed 's/^moe-prep eval: //')
echo "   quality through the engine (one token per step) against all resident: $offload_quality"
echo
echo "== 12. big-little decoding (MoBiLE): top-1 experts per token, top-2 again when the top probability is below gamma"
gamma=$(sed -n 's/.*suggested gamma \([0-9.]*\).*/\1/p' "$work/profile.txt" | head -n 1)
for run in "K --little-k 0" "K2 --little-k 1 --gamma 0" "big-little --little-k 1"; do
  name=${run%% *}
  # shellcheck disable=SC2086 # options split on purpose
  build/moe-run -m "$work/model.moeb" -p "The function returns" -n 64 --ignore-eos --expert-mem 25% ${run#* } \
      --stats-json "$work/bl-$name.json" >/dev/null 2>"$work/bl-$name.txt"
  printf '%-11s %s %s\n' "$name" "$(grep '^moe-run: prompt' "$work/bl-$name.txt" | sed 's/.*generated/generated/')" \
      "$(grep '^moe-run: big-little' "$work/bl-$name.txt" | sed 's/^moe-run: big-little: /; /')"
done
bl_quality=""
for g in 0 "$gamma"; do
  q=$(build/moe-prep eval "$work/model.moeb" --ref "$work/model.moeb" --dataset "$text3" --ctx 256 --max-chunks 4 \
      --little-k 1 --gamma "$g" 2>&1 >/dev/null | tail -n 1 | sed 's/^moe-prep eval: //')
  printf 'gamma %-6s %s\n' "$g" "$q"
  bl_quality+="gamma $g: $(echo "$q" | sed -n 's/.*PPL \([0-9.]*\), mean KLD \([0-9.]*\), same top \([0-9.]*\) %.*fallback \([0-9.]*\) %.*/PPL \1, KL \2, same top \3 %, fallback \4 %/p');  "
done
echo
echo "== 13. plan a run for a small memory size: this machine's numbers, the best plans, then the run it chose"
build/moe-prep hw "$work/model.moeb" --hw "$work/hw.json" | tail -n 5
mem=${MOE_DEMO_MEM:-25M}
build/moe-prep plan "$work/model.moeb" --profile "$work/profile.h5" --mem "$mem" --hw "$work/hw.json" \
    --eval-text "$text3" --quality-budget 3% --top 4 --apply 2>/dev/null | tee "$work/plan.txt"
predicted=$(sed -n 's/^\* chosen: plan [0-9]*, \([0-9.]*\) tokens.*/\1/p' "$work/plan.txt")
build/moe-run -m "$work/model.moeb" -p "The function returns" -n 64 --ignore-eos --stats-json "$work/plan-run.json" \
    >/dev/null 2>"$work/plan-run.txt"
measured=$(sed -n 's/.*"tokens_per_s_decode"[[:space:]]*:[[:space:]]*\([0-9.e+]*\).*/\1/p' "$work/plan-run.json")
[ -n "$measured" ] && measured=$(printf '%.1f' "$measured") # the JSON keeps every digit
grep '^moe-run: using the bundle' "$work/plan-run.txt" | sed 's/^moe-run: //'
echo "predicted $predicted tokens/s, measured $measured tokens/s (moe-run with no options: the plan in the tuning)"
echo
echo "== summary"
echo "model      $model: $(stat -c %s "$model"/*.safetensors | awk '{s+=$1} END {printf "%.2f MB", s/1e6}')" \
     "checkpoint -> $(stat -c %s "$work/model.moeb" | awk '{printf "%.2f MB", $1/1e6}') bundle holding experts at $experts"
echo "quality    $(basename "$text"), against the checkpoint: $ppl_summary"
echo "sample     $low experts: $(tr '\n' ' ' < "$work/sample.txt" | cut -c1-110)..."
echo "speed      $(sed 's/^moe-run: //' "$work/speed.txt")"
echo "profile    $(grep '^HOBBIT' "$work/profile.txt" | sed 's/^HOBBIT thresholds //')"
echo "           top experts: $(grep -A1 '^most used experts' "$work/profile.txt" | tail -1 | sed 's/^ *//')"
echo "           next-layer prefetch (stacked gate): $(awk '/^stacked-gate/ {getline; getline; print "top-1 " $3 ", top-K recall " $4; exit}' "$work/profile.txt")"
echo "           big-little: $(grep 'suggested gamma' "$work/profile.txt" | sed 's/^ *//')"
echo "           report $work/profile.html, CSV in $work/profile-csv, tuning written into $work/model.moeb"
echo "sensitivity $(grep '^cost' "$work/sensitivity.txt" | sed 's/^cost: //')"
echo "           $(grep '^proxy' "$work/sensitivity.txt"); heat map $work/sensitivity.html"
echo "bit-widths $(grep -A1 '^chosen' "$work/bitwidth.txt" | tr '\n' ' ' | sed 's/  */ /g')"
echo "           $(grep '^held-out' "$work/bitwidth.txt")"
echo "offload    25 % of the expert bytes: $(grep '^moe-run: prompt' "$work/offload-speed.txt" | sed 's/.*generated/generated/') vs all resident $(grep '^moe-run: prompt' "$work/resident-speed.txt" | sed 's/.*generated/generated/')"
echo "big-little gamma $gamma (the profile's, for a 20 % fallback ratio): $(grep '^moe-run: prompt' "$work/bl-big-little.txt" | sed 's/.*generated/generated/')"
echo "           vs top-2 $(grep '^moe-run: prompt' "$work/bl-K.txt" | sed 's/.*generated/generated/'); quality on $(basename "$text3"): $bl_quality"
echo "plan       $mem: predicted $predicted tokens/s, measured $measured tokens/s ($work/plan.txt)"

# ---- the second model: fine-grained routing (issue 25) ----------------------------------------------
model2=${MOE_DEMO_MODEL2:-datasets/models/tiny-moe-qwen3}
echo
if [ "$model2" = none ] || [ ! -f "$model2/model.safetensors" ]; then
  echo "== second model: skipped ($model2 has no model.safetensors yet: datasets/models/train_moe.py --arch qwen3_moe)"
  exit 0
fi
w2=$work/model2
mkdir -p "$w2"
text2b="$model2/heldout/python_docs.txt"
[ -f "$text2b" ] || text2b="$text"
text2c="$model2/heldout/c4.txt"
[ -f "$text2c" ] || text2c="$text2b"
echo "== second model: $model2 (fine-grained routing, shorter runs)"
build/moe-prep check "$model2"
echo "-- quantize: q8_0,q4_k,q2_k (an expert's down rows are its FFN width: k-quants need 256, so narrower ones fall back)"
build/moe-prep quantize "$model2" -o "$w2/model.moeb" --experts q8_0,q4_k,q2_k --dense q8_0 2>&1 |
    grep -v '^quantize: ' | grep -E 'note|wrote|experts'
build/moe-prep inspect "$w2/model.moeb" --verify | grep -E 'bits/weight|checksums'
echo "-- each expert precision against the checkpoint ($(basename "$text2b"))"
for p in q8_0 q4_k q2_k; do
  printf '%-5s %s\n' "$p" "$(build/moe-prep eval "$w2/model.moeb" --expert-precision "$p" --ref "$model2" --dataset "$text2b" \
      --ctx 256 --max-chunks 4 2>&1 >/dev/null | tail -n 1 | sed 's/^moe-prep eval: //')"
done
echo "-- generate (q4_k experts, greedy, 40 tokens)"
build/moe-run -m "$w2/model.moeb" --expert-precision q4_k -p "The function returns" -n 40 2>"$w2/speed.txt"
grep '^moe-run: prompt' "$w2/speed.txt" | sed 's/^moe-run: //'
echo "-- profile: HOBBIT thresholds, stacked-gate accuracy 1-4 layers ahead, placement, big-little with K/2"
build/moe-prep profile "$w2/model.moeb" --dataset "$text2b" -o "$w2/profile.h5" --ctx 256 --max-tokens 4096 \
    --csv-dir "$w2/profile-csv" >"$w2/profile.txt" 2>"$w2/profile.log"
grep -E '^HOBBIT|^gate weight|suggested gamma' "$w2/profile.txt"
sed -n '/^placement by popularity/,/^ *random/p;/^stacked-gate/,/^ *4 /p' "$w2/profile.txt"
echo "-- expert cache in a quarter of the q8_0 expert bytes: every policy, HOBBIT fitted, the offline bound"
q8=$(build/moe-prep inspect "$w2/model.moeb" --json | sed -n '/"name":[[:space:]]*"q8_0"/,/total_bytes/s/.*"total_bytes":[[:space:]]*\([0-9]*\).*/\1/p' | head -n 1)
build/moe-prep fit-cache "$w2/model.moeb" --profile "$w2/profile.h5" --fast-mem $((q8 / 4)) --fit-once \
    --opt-seconds 2 2>/dev/null >"$w2/cache.txt" || true
awk '/^cache:/ { n++ } n == 1' "$w2/cache.txt" # the fitted size; 25/50/75 % of the experts in $w2/cache.txt
echo "-- offloading: a quarter of the expert bytes against all resident; big-little (K/2) at the profile's gamma"
build/moe-run -m "$w2/model.moeb" -p "The function returns" -n 64 --ignore-eos >/dev/null 2>"$w2/resident.txt"
build/moe-run -m "$w2/model.moeb" -p "The function returns" -n 64 --ignore-eos --expert-mem 25% >/dev/null 2>"$w2/offload.txt"
build/moe-run -m "$w2/model.moeb" -p "The function returns" -n 64 --ignore-eos --expert-mem 25% --little-k 2 \
    >/dev/null 2>"$w2/bl.txt"
printf 'all resident  %s\n' "$(grep '^moe-run: prompt' "$w2/resident.txt" | sed 's/.*generated/generated/')"
printf '25 %% resident %s\n' "$(grep '^moe-run: prompt' "$w2/offload.txt" | sed 's/.*generated/generated/')"
printf 'big-little    %s; %s\n' "$(grep '^moe-run: prompt' "$w2/bl.txt" | sed 's/.*generated/generated/')" \
    "$(grep '^moe-run: big-little' "$w2/bl.txt" | sed 's/^moe-run: big-little: //')"
echo "   quality through the engine at 25 % (one token per step, $(basename "$text2c")): $(build/moe-prep eval "$w2/model.moeb" \
    --ref "$w2/model.moeb" --dataset "$text2c" --ctx 256 --max-chunks 2 --batch 1 --expert-mem 25% 2>&1 >/dev/null |
    tail -n 1 | sed 's/^moe-prep eval: //')"
