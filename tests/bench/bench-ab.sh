#!/usr/bin/env bash
# bench-ab.sh - two builds of moe-run side by side in one run: the same bit
# for bit, and as fast? For a change that should move code, not behaviour
# (issue 27's re-rooming), or any change whose speed is in question.
#
#   tests/bench/bench-ab.sh OLD_BUILD NEW_BUILD [--work DIR] [--rounds R]
#                           [-n TOKENS] [-t THREADS]
#
# OLD_BUILD and NEW_BUILD are build directories (each with moe-run; NEW_BUILD
# also moe-prep). DIR (default /tmp/moe-offload) must hold the inflated
# bundle that `tests/bench/bench-offload.sh --prep-only` writes
# (tiny-moe-mixtral-ffn8192.moeb: the trained demo model at FFN 8192,
# experts q8_0,q4_k,q2_k, profiled and fitted at 25 %).
#
# Configurations (moe-run, held-out prompts of four domains, -n TOKENS decode
# tokens after the prompt, --ignore-eos, -t THREADS):
#   tiny      the trained demo model as a q4_k bundle (written once by
#             NEW_BUILD's moe-prep), all resident: a small model's decode,
#             where per-step overhead shows
#   resident  the inflated bundle with every expert resident at q8_0
#             (--expert-precision q8_0), page cache warm
#   offload   the inflated bundle with --expert-mem = 25 % of the q8_0 expert
#             bytes and the defaults otherwise (direct I/O, the bundle's
#             fitted policy and thresholds), page cache dropped before each run
#   lru       the same budget with plain LRU, no dynamic precision, no
#             prefetch, every copy q8_0 (bench-offload.sh's baseline a)
# Every round runs each configuration with both builds, the order alternating
# between rounds (ABBA). Before timing, each configuration's logits from the
# two builds are compared byte for byte (--logits-out): a refactor that
# changes a logit is reported as such.
#
# Prints, per configuration: median decode and prompt tokens/s of each build,
# new/old (ratio of the medians and median of the per-round ratios), and the
# offloaded runs' bytes read and stall per decoded token. The tiny model's
# decode steps take tens of microseconds: with -t 2 its figures move with the
# adaptive thread mode and the machine's state; -t 1 (or callgrind's
# instruction counts) compares it better. Results:
# $WORK/ab/*.json (--stats-json), $WORK/ab/results.tsv.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] && case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || { echo "bench-ab: give OLD_BUILD and NEW_BUILD (see --help)" >&2; exit 2; }
old=$1 new=$2
shift 2
work=${MOE_OFFLOAD_DIR:-/tmp/moe-offload}
rounds=5 n_predict=64 threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n) n_predict=$2; shift 2 ;;
    -t|--threads) threads=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-ab: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds$n_predict$threads" in *[!0-9]*) echo "bench-ab: --rounds, -n, -t take integers" >&2; exit 2 ;; esac
for b in "$old" "$new"; do
  [ -x "$b/moe-run" ] || { echo "bench-ab: $b/moe-run is missing (build it first)" >&2; exit 2; }
done
bundle=$work/tiny-moe-mixtral-ffn8192.moeb
[ -f "$bundle" ] || { echo "bench-ab: $bundle is missing: run tests/bench/bench-offload.sh --prep-only first" >&2; exit 2; }
out=$work/ab
mkdir -p "$out"
model=datasets/models/tiny-moe-mixtral
tiny=$out/tiny-q4_k.moeb
if [ ! -f "$tiny" ]; then
  echo "== the demo model as a q4_k bundle"
  "$new/moe-prep" quantize "$model" -o "$tiny" --experts q4_k --dense q4_k >/dev/null
fi
# the q8_0 expert bytes of the inflated bundle: the 25 % budget
q8=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(next(p["total_bytes"] for p in d["precisions"] if p["name"]=="q8_0"))' \
     <("$new/moe-prep" inspect "$bundle" --json) 2>/dev/null || true)
if [ -z "$q8" ]; then
  q8=$(( 53477376 * 4 )) # bench-offload.sh's figure for FFN 8192 (25 % = 53477376)
fi
budget=$(( q8 / 4 ))
prompts=()
for d in c4 fortunes gsm8k wordnet; do prompts+=("$model/heldout/$d.txt"); done

# opts CONFIG: the model and options of a configuration.
opts() {
  case "$1" in
    tiny) echo "-m $tiny" ;;
    resident) echo "-m $bundle --expert-precision q8_0" ;;
    offload) echo "-m $bundle --expert-mem $budget" ;;
    lru) echo "-m $bundle --expert-mem $budget --policy lru --dynamic off --prefetch off --high q8_0" ;;
  esac
}
# prompt_of I: the first 400 bytes of held-out prompt I (mod 4), as a file.
prompt_of() {
  local f=$out/prompt$(( $1 % 4 )).txt
  [ -f "$f" ] || head -c 400 "${prompts[$(( $1 % 4 ))]}" >"$f"
  echo "$f"
}
drop_cache() { dd if="$bundle" iflag=nocache count=0 status=none 2>/dev/null || true; }
warm_cache() { cat "$bundle" >/dev/null; }

echo "== logits: old and new, byte for byte"
for c in tiny resident offload lru; do
  for side in old new; do
    b=$old; [ $side = new ] && b=$new
    case $c in offload|lru) drop_cache ;; esac
    # shellcheck disable=SC2046 # opts is a word list
    "$b/moe-run" $(opts $c) -f "$(prompt_of 0)" -n 8 --ignore-eos -t "$threads" --logits-out "$out/logits-$c-$side.f32" \
      >/dev/null 2>"$out/logits-$c-$side.log"
  done
  if cmp -s "$out/logits-$c-old.f32" "$out/logits-$c-new.f32"; then echo "  $c: identical ($(stat -c %s "$out/logits-$c-new.f32") bytes)"
  else echo "  $c: LOGITS DIFFER"; fi
done

echo "== $rounds rounds, -n $n_predict, -t $threads, budget $budget bytes (25 % of q8_0 experts)"
tsv=$out/results.tsv
printf 'round\tconfig\tbuild\tprompt\tdecode_tps\tprompt_tps\tbytes_per_decode_token\tstall_s_per_decode_token\n' >"$tsv"
for r in $(seq 1 "$rounds"); do
  order="old new"; [ $(( r % 2 )) -eq 0 ] && order="new old"
  for c in tiny resident offload lru; do
    for side in $order; do
      b=$old; [ $side = new ] && b=$new
      p=$(prompt_of "$r")
      case $c in offload|lru) drop_cache ;; *) warm_cache ;; esac
      j=$out/r$r-$c-$side.json
      # shellcheck disable=SC2046
      "$b/moe-run" $(opts $c) -f "$p" -n "$n_predict" --ignore-eos -t "$threads" --stats-json "$j" >/dev/null 2>"$out/r$r-$c-$side.log"
      python3 - "$j" "$r" "$c" "$side" "$(basename "$p")" >>"$tsv" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
s = j.get("store") or {}
f = lambda v: "" if v is None else "%.6g" % v
print("\t".join(sys.argv[2:6] + [f(j["tokens_per_s_decode"]), f(j["tokens_per_s_prompt"]),
                               f(s.get("bytes_read_per_decode_token")), f(s.get("stall_s_per_decode_token"))]))
EOF
    done
  done
  echo "  round $r done"
done

python3 - "$tsv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = statistics.median
print("\n%-9s %12s %12s %8s %10s | %12s %12s %8s | %s" % ("config", "decode old", "decode new", "new/old", "per-round",
      "prompt old", "prompt new", "new/old", "MB read / stall ms per decode token (old -> new)"))
for c in ("tiny", "resident", "offload", "lru"):
    d = {b: [float(r["decode_tps"]) for r in rows if r["config"] == c and r["build"] == b] for b in ("old", "new")}
    p = {b: [float(r["prompt_tps"]) for r in rows if r["config"] == c and r["build"] == b] for b in ("old", "new")}
    per = [float(n["decode_tps"]) / float(o["decode_tps"]) for o in rows for n in rows
           if o["config"] == n["config"] == c and o["round"] == n["round"] and o["build"] == "old" and n["build"] == "new"]
    extra = ""
    if c in ("offload", "lru"):
        mb = {b: med([float(r["bytes_per_decode_token"]) for r in rows if r["config"] == c and r["build"] == b]) / 1e6 for b in ("old", "new")}
        st = {b: med([float(r["stall_s_per_decode_token"]) for r in rows if r["config"] == c and r["build"] == b]) * 1e3 for b in ("old", "new")}
        extra = "%.1f -> %.1f MB, %.1f -> %.1f ms" % (mb["old"], mb["new"], st["old"], st["new"])
    print("%-9s %12.1f %12.1f %8.3f %10.3f | %12.1f %12.1f %8.3f | %s" % (c, med(d["old"]), med(d["new"]), med(d["new"]) / med(d["old"]),
          med(per), med(p["old"]), med(p["new"]), med(p["new"]) / med(p["old"]), extra))
EOF
