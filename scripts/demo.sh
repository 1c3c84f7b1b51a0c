#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the
# pipeline that exists so far on the embedded default model: check the
# checkpoint, quantize it into a multi-precision bundle, inspect and verify the
# bundle, measure each precision against the original (perplexity, KL), and
# generate text. For now the default is a committed tiny fixture model (random
# weights, so the text is not meaningful); a trained small MoE replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
model=${MOE_DEMO_MODEL:-tests/fixtures/models/qwen3_moe-f32}
work=${MOE_DEMO_DIR:-build/demo}
text=${MOE_DEMO_TEXT:-tests/fixtures/demo/calibration.txt}

scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" --target moe-run moe-prep
mkdir -p "$work"

echo
echo "== 1. check the checkpoint"
build/moe-prep check "$model"
echo
echo "== 2. quantize: experts at f32, q8_0 and q4_0 side by side, other weights f32"
build/moe-prep quantize "$model" -o "$work/model.moeb" --experts f32,q8_0,q4_0 --dense f32
echo
echo "== 3. inspect and verify the bundle"
build/moe-prep inspect "$work/model.moeb" --verify
echo
echo "== 4. each expert precision against the original checkpoint"
for p in f32 q8_0 q4_0; do
  printf '%-5s ' "$p"
  build/moe-prep eval "$work/model.moeb" --expert-precision "$p" --ref "$model" --dataset "$text" \
      --ctx 64 2>&1 >/dev/null | tail -n 1 | sed 's/^moe-prep eval: //'
done
echo
echo "== 5. generate from the bundle (q4_0 experts, greedy, 24 tokens)"
build/moe-run -m "$work/model.moeb" --expert-precision q4_0 -p "The quick brown fox" -n 24
echo
echo "summary: $(stat -c %s "$model"/*.safetensors | awk '{s+=$1} END {printf "%.2f MB", s/1e6}') checkpoint ->" \
     "$(stat -c %s "$work/model.moeb" | awk '{printf "%.2f MB", $1/1e6}') bundle holding three expert precisions"
