#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the main
# job on the embedded default model. For now the default is a committed tiny
# fixture model (random weights, so the text is not meaningful); a trained small
# MoE replaces it in a later stage.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
model=${MOE_DEMO_MODEL:-tests/fixtures/models/mixtral-f32}

scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" --target moe-run moe-prep

echo
echo "== 1. check the checkpoint"
build/moe-prep check "$model"
echo
echo "== 2. generate (greedy, 24 tokens)"
build/moe-run -m "$model" -p "The quick brown fox" -n 24
echo
echo "== 3. the same prompt as token ids"
build/moe-run -m "$model" --tokenize -p "The quick brown fox"
