#!/usr/bin/env bash
# gguf-roundtrip.sh - a checkpoint through the GGUF converter and back (issue 25,
# item 2): what llama.cpp loads is what this project computes. Not run by CI
# (needs Python with numpy and gguf, and llama.cpp's binaries).
#
#   tests/bench/gguf-roundtrip.sh MODEL_DIR [--work DIR] [--text FILE] [--no-build]
#
# Steps (each prints the command it runs):
#   1. tests/bench/hf_to_gguf.py MODEL_DIR -> MODEL.gguf (BF16 as stored, the
#      checkpoint's own tokenizer: --vocab hf); Mixtral and Qwen3-MoE
#   2. moe-prep check on both: the same architecture and shape
#   3. moe-run on both, greedy on fixed ids: the same ids, logits within 1e-5
#      (the prompt's rows are bit-identical; decode rows may differ in the last
#      bit, the router being float32 in the GGUF and BF16 in the checkpoint)
#   4. moe-prep quantize from each (q8_0): both bundles score the same PPL
#   5. llama.cpp (LLAMA_BIN: llama-completion, llama-perplexity, llama-tokenize):
#      the same token ids for a prompt, the same greedy text for 3 prompts of
#      24 tokens, and the perplexity of llama-perplexity -c 128 --chunks 4 next
#      to moe-prep eval --ctx 128 --max-chunks 4 (both score the second half of
#      each chunk); skipped with a note when LLAMA_BIN has no llama-perplexity
# Prints a summary table; exits 1 if a check fails.
#
# Environment: MOE_BUILD_DIR (default build), LLAMA_BIN (default
# /work/llama/build/bin when present), GGUF_PY (a gguf-py directory put on
# PYTHONPATH, e.g. llama.cpp's vendor/llama.cpp/gguf-py; else the installed gguf).
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
model="" work=/tmp/moe-gguf-roundtrip text="" do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gguf-roundtrip: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$model" ] || { echo "gguf-roundtrip: one MODEL_DIR only" >&2; exit 2; }; model=$1; shift ;;
  esac
done
[ -n "$model" ] || { usage >&2; exit 2; }
[ -f "$model/config.json" ] || { echo "gguf-roundtrip: $model has no config.json" >&2; exit 1; }
build=${MOE_BUILD_DIR:-build}
lbin=${LLAMA_BIN:-}
[ -z "$lbin" ] && [ -x /work/llama/build/bin/llama-completion ] && lbin=/work/llama/build/bin
[ -n "${GGUF_PY:-}" ] && export PYTHONPATH="$GGUF_PY${PYTHONPATH:+:$PYTHONPATH}"
[ -n "$text" ] || text=$model/heldout/python_docs.txt
[ -f "$text" ] || text=tests/fixtures/demo/calibration.txt
mkdir -p "$work"
run() { printf '+' >&2; printf ' %q' "$@" >&2; printf '\n' >&2; "$@"; }
fail=0
check() { # check OK-EXPR MESSAGE
  if [ "$1" = 1 ]; then printf '  ok    %s\n' "$2"; else printf '  FAIL  %s\n' "$2"; fail=1; fi
}

if [ $do_build -eq 1 ]; then
  run cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  run cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target moe-run moe-prep >/dev/null
fi
prep=$build/moe-prep moerun=$build/moe-run
name=$(basename "$(cd "$model" && pwd)")
gguf=$work/$name.gguf

echo "== 1. convert"
run python3 tests/bench/hf_to_gguf.py "$model" "$gguf" --vocab hf

echo "== 2. check"
shape() { "$prep" check "$1" --json | python3 -c 'import json,sys; d=json.load(sys.stdin)
print(" ".join(f"{k}={d[k]}" for k in ("arch","layers","hidden","heads","kv_heads","head_dim","vocab","experts","experts_per_token","expert_ffn","params")))'; }
s_ck=$(shape "$model") s_gg=$(shape "$gguf")
echo "  checkpoint: $s_ck"
echo "  gguf:       $s_gg"
check "$([ "$s_ck" = "$s_gg" ] && echo 1)" "moe-prep check: the same architecture and shape"

echo "== 3. moe-run on both"
ids=1,17,33,65,129,257,3,5,9
run "$moerun" -m "$model" --tokens $ids --ids -n 16 --ignore-eos --logits-out "$work/ck.f32" >"$work/ck.ids" 2>/dev/null
run "$moerun" -m "$gguf" --tokens $ids --ids -n 16 --ignore-eos --logits-out "$work/gg.f32" >"$work/gg.ids" 2>/dev/null
diff=$(python3 -c 'import sys, numpy as np
a, b = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:3])
print(f"{np.abs(a - b).max():.3g}" if a.shape == b.shape else "inf")' "$work/ck.f32" "$work/gg.f32")
check "$(cmp -s "$work/ck.ids" "$work/gg.ids" && echo 1)" "moe-run greedy ids: checkpoint and GGUF the same"
check "$(python3 -c "print(1 if float('$diff') <= 1e-5 else 0)")" "moe-run logits: max |checkpoint - GGUF| = $diff (<= 1e-5)"

echo "== 4. quantize from each"
run "$prep" quantize "$model" -o "$work/ck.moeb" --experts q8_0 --dense q8_0 >/dev/null 2>&1
run "$prep" quantize "$gguf" -o "$work/gg.moeb" --experts q8_0 --dense q8_0 >/dev/null 2>&1
p_b1=$("$prep" eval "$work/ck.moeb" --dataset "$text" --ctx 128 --max-chunks 4 2>&1 >/dev/null | sed -n 's/.*PPL \([0-9.]*\).*/\1/p' | tail -1)
p_b2=$("$prep" eval "$work/gg.moeb" --dataset "$text" --ctx 128 --max-chunks 4 2>&1 >/dev/null | sed -n 's/.*PPL \([0-9.]*\).*/\1/p' | tail -1)
check "$([ -n "$p_b1" ] && [ "$p_b1" = "$p_b2" ] && echo 1)" "bundles from checkpoint and GGUF (q8_0): PPL $p_b1 and $p_b2"

echo "== 5. llama.cpp"
if [ -z "$lbin" ] || [ ! -x "$lbin/llama-perplexity" ] || [ ! -x "$lbin/llama-completion" ]; then
  echo "  skipped: no llama-completion and llama-perplexity in LLAMA_BIN (${lbin:-unset})"
else
  prompt="The function returns the value of"
  t_ll=$("$lbin/llama-tokenize" -m "$gguf" -p "$prompt" --ids --log-disable 2>/dev/null | tail -n 1 | tr -d '[] ')
  t_us=$("$moerun" -m "$model" --tokenize -p "$prompt" | tr -d ' ')
  check "$([ -n "$t_ll" ] && [ "$t_ll" = "$t_us" ] && echo 1)" "token ids of \"$prompt\": llama.cpp [$t_ll], moe-run [$t_us]"
  same=0 n=0
  for p in "The function returns" "Question: A farmer has 12" "def main():"; do
    n=$((n + 1))
    "$lbin/llama-completion" -m "$gguf" -p "$p" -n 24 --temp 0 --ignore-eos -no-cnv --no-warmup -t 2 -c 256 \
      >"$work/ll$n.txt" 2>"$work/ll$n.log" || true
    "$moerun" -m "$model" -p "$p" -n 24 --temp 0 --ignore-eos >"$work/us$n.txt" 2>/dev/null || true
    if [ -s "$work/ll$n.txt" ] && cmp -s <(tr -s ' \n' <"$work/ll$n.txt") <(tr -s ' \n' <"$work/us$n.txt"); then
      same=$((same + 1))
    fi
  done
  check "$([ $same = $n ] && echo 1)" "greedy text, 24 tokens: $same of $n prompts the same (llama-completion on the GGUF, moe-run on the checkpoint)"
  run "$lbin/llama-perplexity" -m "$gguf" -f "$text" -c 128 --chunks 4 -t 2 >"$work/lp.out" 2>"$work/lp.log" || true
  p_ll=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$work/lp.log" "$work/lp.out" | head -n 1)
  p_us=$("$prep" eval "$model" --dataset "$text" --ctx 128 --max-chunks 4 2>&1 >/dev/null | sed -n 's/.*PPL \([0-9.]*\).*/\1/p' | tail -1)
  rel=$(python3 -c "print(f'{abs(float(\"${p_ll:-nan}\") / float(\"${p_us:-nan}\") - 1) * 100:.3f}')")
  check "$(python3 -c "print(1 if float('$rel') <= 0.5 else 0)")" \
    "perplexity ($(basename "$text"), 4 chunks of 128): llama.cpp $p_ll, moe-prep eval $p_us (${rel} % apart, <= 0.5 %)"
fi
[ $fail -eq 0 ] && echo "gguf-roundtrip $name: all checks passed" || echo "gguf-roundtrip $name: FAILED"
exit $fail
