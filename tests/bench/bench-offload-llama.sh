#!/usr/bin/env bash
# bench-offload-llama.sh - moe-run's default offloading engine against llama.cpp
# running the same model through mmap, both given the same total memory
# (issue 31, item 7; ../shared/PEERS.md "Equal memory for offloading").
# Not run by CI.
#
#   tests/bench/bench-offload-llama.sh [--work DIR] [--offload-work DIR]
#       [--rounds R] [-n TOKENS] [--threads T] [--budgets "25 50"]
#       [--prompts "c4 gsm8k"] [--dry-run]
#
# Steps (outputs that exist are reused):
#   1. tests/bench/bench-offload.sh --prep-only --work OFFLOAD_WORK: builds
#      this project, inflates the trained demo model to FFN 8192, quantizes it
#      (--experts q8_0,q4_k,q2_k --dense q8_0), profiles it and fits the cache
#      at the 25 % budget (the bundle bench-offload.sh measures);
#   2. llama.cpp from the llama-cpp-python source distribution (as
#      bench-llama.py: `pip download --no-binary :all: --no-deps
#      llama-cpp-python==0.3.36`, vendor/llama.cpp, CPU only, GGML_NATIVE;
#      AMX disabled where /proc/cpuinfo reports it), targets llama-completion,
#      llama-quantize, llama-tokenize; $LLAMA_BIN reuses a build;
#   3. the inflated checkpoint as a GGUF with its own tokenizer
#      (tests/bench/hf_to_gguf.py --vocab hf, gguf-py from the same
#      source distribution), then `llama-quantize --pure ... Q8_0`: every
#      matrix q8_0 as in the bundle's q8_0 experts and q8_0 dense weights
#      (llama.cpp keeps the routers in float32, as the bundle does);
#   4. checks: both tokenize every prompt to the same ids (llama-tokenize
#      against moe-run --tokenize);
#   5. rounds, interleaved (the order flips every round), for every budget
#      and prompt: moe-run with the default engine (`--expert-mem B` and
#      nothing else) from a cold page cache, then llama-completion (greedy,
#      --temp 0, same prompt text, same -n, mmap) from a cold page cache
#      inside a memory cgroup whose limit is the peak RSS of the moe-run run
#      just before it (cgroup v1 memory.limit_in_bytes, or v2 memory.max; the
#      page cache the mmap reads is charged to the cgroup);
#   6. the table: median decode tokens/s of both per budget, the ratio, the
#      memory limit, and on how many prompts the greedy texts agree (the
#      default engine computes some experts from lower-precision copies, HOBBIT,
#      so its continuation may part from llama.cpp's all-q8_0 one; its quality
#      is measured by bench-offload.sh's eval step, not here).
#
# Budgets are shares of the q8_0 expert bytes (the bundle's inspect --json).
# Results: $WORK/results.tsv, $WORK/runs/*, $WORK/table.txt.
# Needs root (drop_caches, cgroups). Environment: MOE_BUILD_DIR (default
# build), LLAMA_BIN (a directory with llama-completion, llama-quantize,
# llama-tokenize), LLAMA_SRC (an unpacked vendor/llama.cpp).
set -euo pipefail
cd "$(dirname "$0")/../.."

work=/tmp/moe-offload-llama
owork=${MOE_OFFLOAD_DIR:-/tmp/moe-offload}
rounds=3
n_predict=96
threads=2
budgets="25 50"
prompt_domains="c4 fortunes gsm8k wordnet"
dry_run=0
build=${MOE_BUILD_DIR:-build}
ffn=8192

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --offload-work) owork=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -n|--n-predict) n_predict=$2; shift 2 ;;
    --threads|-t) threads=$2; shift 2 ;;
    --budgets) budgets=$2; shift 2 ;;
    --prompts) prompt_domains=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-offload-llama: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds$n_predict$threads${budgets// /}" in *[!0-9]*) echo "bench-offload-llama: --rounds, -n, --threads, --budgets take integers" >&2; exit 2 ;; esac

run() {
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
  "$@"
}
die() { echo "bench-offload-llama: $*" >&2; exit 1; }
mkdir -p "$work/runs"

# ---- 1. the bundle bench-offload.sh measures ----------------------------------------
echo "== 1. bundle (tests/bench/bench-offload.sh --prep-only --work $owork)"
run env MOE_BUILD_DIR="$build" tests/bench/bench-offload.sh --prep-only --work "$owork" --ffn "$ffn" -t "$threads" >"$work/prep.log" 2>&1 ||
  die "bench-offload.sh --prep-only failed (see $work/prep.log)"
moerun=$build/moe-run
inflated=$owork/tiny-moe-mixtral-ffn$ffn
bundle=$owork/tiny-moe-mixtral-ffn$ffn.moeb
[ -f "$bundle" ] && [ -d "$inflated" ] || die "no bundle/inflated checkpoint in $owork"
q8_total=$(awk '/"name":/ && /"q8_0"/ { f = 1 } f && /"total_bytes"/ { gsub(/[^0-9]/, ""); print; exit }' "$owork/inspect.json")
[ -n "$q8_total" ] || die "no q8_0 total_bytes in $owork/inspect.json"

# ---- 2. llama.cpp --------------------------------------------------------------------------
lsrc=${LLAMA_SRC:-}
if [ -z "$lsrc" ]; then
  sd=$work/sdist
  mkdir -p "$sd"
  if ! ls "$sd"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    run python3 -m pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d "$sd" >/dev/null
  fi
  tgz=$(ls "$sd"/llama_cpp_python-*.tar.gz | tail -n 1)
  [ -d "${tgz%.tar.gz}" ] || run tar -xzf "$tgz" -C "$sd"
  lsrc=${tgz%.tar.gz}/vendor/llama.cpp
fi
lbin=${LLAMA_BIN:-$work/llama-build/bin}
if [ ! -x "$lbin/llama-completion" ] || [ ! -x "$lbin/llama-quantize" ] || [ ! -x "$lbin/llama-tokenize" ]; then
  echo "== 2. build llama.cpp ($lsrc)"
  flags=()
  if grep -qw amx_tile /proc/cpuinfo; then # see ../shared/PEERS.md
    flags=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  fi
  run cmake -S "$lsrc" -B "$work/llama-build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "${flags[@]}" >/dev/null
  run cmake --build "$work/llama-build" -j"$(nproc 2>/dev/null || echo 2)" --target llama-completion llama-quantize llama-tokenize >/dev/null
  lbin=$work/llama-build/bin
fi

# ---- 3. the same model as a q8_0 GGUF ----------------------------------------------------------
gguf16=$work/inflated-ffn$ffn.gguf
gguf8=$work/inflated-ffn$ffn-q8_0.gguf
if [ ! -f "$gguf8" ]; then
  echo "== 3. GGUF: hf_to_gguf.py --vocab hf, llama-quantize --pure Q8_0"
  run env PYTHONPATH="$lsrc/gguf-py" python3 tests/bench/hf_to_gguf.py "$inflated" "$gguf16.tmp" --vocab hf
  mv "$gguf16.tmp" "$gguf16"
  run "$lbin/llama-quantize" --pure "$gguf16" "$gguf8.tmp" Q8_0 "$threads" >"$work/quantize.log" 2>&1 ||
    die "llama-quantize failed (see $work/quantize.log)"
  mv "$gguf8.tmp" "$gguf8"
  rm -f "$gguf16"
fi
env PYTHONPATH="$lsrc/gguf-py" python3 - "$gguf8" <<'EOF' | tee "$work/gguf-types.txt"
import collections, sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
c = collections.Counter()
for t in r.tensors:
    kind = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
    c[(kind, t.tensor_type.name)] += 1
print("GGUF tensor types:", ", ".join(f"{k}={v} x{n}" for (k, v), n in sorted(c.items())))
EOF

# prompts: the same held-out slices bench-offload.sh uses
for d in $prompt_domains; do
  [ -s "$owork/prompts/$d.txt" ] || die "no prompt $owork/prompts/$d.txt (bench-offload.sh makes them)"
done

# ---- 4. same token ids ---------------------------------------------------------------------------
echo "== 4. tokenization"
for d in $prompt_domains; do
  ours=$("$moerun" -m "$bundle" --tokenize -f "$owork/prompts/$d.txt" 2>/dev/null)
  theirs=$("$lbin/llama-tokenize" -m "$gguf8" -f "$owork/prompts/$d.txt" --ids --log-disable 2>/dev/null | tail -n 1 |
    tr -d '[] ')
  if [ "$ours" = "$theirs" ]; then
    echo "  $d: same $(tr ',' '\n' <<<"$ours" | wc -l) ids"
  else
    echo "  $d: DIFFERENT ids" >&2
    echo "    moe-run:  ${ours:0:200}" >&2
    echo "    llama.cpp: ${theirs:0:200}" >&2
    die "the two tokenizers disagree on $d; the comparison would not be of the same work"
  fi
done

# ---- 5. rounds ----------------------------------------------------------------------------------------
cg_dir=""
cg_setup() { # cg_setup LIMIT_BYTES: a memory cgroup with that limit; sets cg_dir and cg_file
  if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
    cg_dir=/sys/fs/cgroup/memory/moe-bench-peer
    mkdir -p "$cg_dir"
    echo 0 >"$cg_dir/memory.force_empty" 2>/dev/null || true
    echo 0 >"$cg_dir/memory.max_usage_in_bytes" 2>/dev/null || true # the peak of this run, not of the one before
    echo -1 >"$cg_dir/memory.limit_in_bytes"
    echo "$1" >"$cg_dir/memory.limit_in_bytes"
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    cg_dir=/sys/fs/cgroup/moe-bench-peer
    mkdir -p "$cg_dir"
    echo "$1" >"$cg_dir/memory.max"
  else
    die "no writable memory cgroup (v1 /sys/fs/cgroup/memory or v2 with the memory controller)"
  fi
}
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
stat_of() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\([-0-9.eE+]*\).*/\1/p" "$2" | head -n 1; }

[ $dry_run -eq 1 ] || printf 'round\tbudget\tprompt\ttool\trc\ttok_s\tpeak_bytes\tlimit_bytes\n' >"$work/results.tsv"
for ((r = 1; r <= rounds; r++)); do
  for b in $budgets; do
    bytes=$((q8_total * b / 100))
    for d in $prompt_domains; do
      tag=r$r-b$b-$d
      ours_cmd=("$moerun" -m "$bundle" -f "$owork/prompts/$d.txt" -n "$n_predict" --ignore-eos -t "$threads" --temp 0
                --expert-mem "$bytes" --stats-json "$work/runs/$tag-moe.json")
      peer_cmd=("$lbin/llama-completion" -m "$gguf8" -f "$owork/prompts/$d.txt" -n "$n_predict" --ignore-eos -t "$threads"
                --temp 0 -c 1024 -no-cnv --no-warmup)
      if [ $dry_run -eq 1 ]; then
        printf '%q ' "${ours_cmd[@]}"; printf '\n'
        printf '[cgroup limit = peak RSS of the line above] '; printf '%q ' "${peer_cmd[@]}"; printf '\n'
        continue
      fi
      # moe-run first (its peak RSS sets the peer's limit), llama.cpp right after
      cold
      rc=0
      run "${ours_cmd[@]}" >"$work/runs/$tag-moe.txt" 2>"$work/runs/$tag-moe.log" || rc=$?
      tps=$(stat_of tokens_per_s_decode "$work/runs/$tag-moe.json")
      peak=$(stat_of peak_rss_bytes "$work/runs/$tag-moe.json")
      printf '%s\t%s\t%s\tmoe-run\t%s\t%s\t%s\t\n' "$r" "$b" "$d" "$rc" "${tps:-}" "${peak:-}" >>"$work/results.tsv"
      [ $rc -eq 0 ] && [ -n "$peak" ] || { echo "bench-offload-llama: moe-run $tag failed (rc $rc)" >&2; continue; }
      peak=${peak%.*}
      cg_setup "$peak"
      cold
      rc=0
      printf '+ [cgroup %s: %s bytes]' "$cg_dir" "$peak" >&2; printf ' %q' "${peer_cmd[@]}" >&2; printf '\n' >&2
      bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$cg_dir" "${peer_cmd[@]}" \
        >"$work/runs/$tag-llama.txt" 2>"$work/runs/$tag-llama.log" || rc=$?
      # the prompt-eval line also matches "eval time"; the decode line is the one without "prompt"
      ltps=$(grep 'eval time' "$work/runs/$tag-llama.log" | grep -v 'prompt eval' |
        sed -n 's/.*, *\([0-9.]*\) tokens per second.*/\1/p' | tail -n 1)
      lpeak=$(cat "$cg_dir/memory.max_usage_in_bytes" 2>/dev/null || cat "$cg_dir/memory.peak" 2>/dev/null || echo "")
      printf '%s\t%s\t%s\tllama.cpp\t%s\t%s\t%s\t%s\n' "$r" "$b" "$d" "$rc" "${ltps:-}" "$lpeak" "$peak" >>"$work/results.tsv"
      [ $rc -eq 0 ] || echo "bench-offload-llama: llama.cpp $tag exited $rc (see $work/runs/$tag-llama.log)" >&2
    done
  done
  [ $dry_run -eq 1 ] && exit 0
done
[ -n "$cg_dir" ] && rmdir "$cg_dir" 2>/dev/null || true

# ---- 6. table -------------------------------------------------------------------------------------------
median() { # median BUDGET TOOL COLUMN
  awk -F'\t' -v b="$1" -v t="$2" -v k="$3" 'NR > 1 && $2 == b && $4 == t && $5 == 0 && $k != "" { print $k }' \
    "$work/results.tsv" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
same_text() { # same_text BUDGET: prompts whose greedy continuations agree (first round)
  local n=0 k=0 d
  for d in $prompt_domains; do
    n=$((n + 1))
    if [ -s "$work/runs/r1-b$1-$d-moe.txt" ] && [ -s "$work/runs/r1-b$1-$d-llama.txt" ] &&
       cmp -s <(tr -s ' \n' <"$work/runs/r1-b$1-$d-moe.txt") <(tr -s ' \n' <"$work/runs/r1-b$1-$d-llama.txt"); then
      k=$((k + 1))
    fi
  done
  echo "$k/$n"
}
{
  echo "decode tokens/s, median over $rounds rounds x prompts ($prompt_domains); inflated demo model FFN $ffn, -t $threads, -n $n_predict"
  echo "moe-run: default engine, --expert-mem = budget x q8_0 expert bytes ($q8_total); llama.cpp: q8_0 GGUF, mmap, in a memory cgroup"
  echo "limited to moe-run's own peak RSS of the run just before; page cache dropped before every run"
  printf '%-7s %12s %14s %8s %14s %16s %10s\n' budget "moe-run" "llama.cpp" ratio "limit MB" "llama peak MB" "same greedy"
  for b in $budgets; do
    o=$(median "$b" moe-run 6); l=$(median "$b" llama.cpp 6); lim=$(median "$b" llama.cpp 8); lp=$(median "$b" llama.cpp 7)
    awk -v b="$b %" -v o="$o" -v l="$l" -v lim="$lim" -v lp="$lp" -v st="$(same_text "$b")" 'BEGIN {
      printf "%-7s %12s %14s %8s %14s %16s %10s\n", b, o == "" ? "-" : sprintf("%.2f", o), l == "" ? "-" : sprintf("%.2f", l),
        (o != "" && l > 0) ? sprintf("%.1fx", o / l) : "-", lim == "" ? "-" : sprintf("%.1f", lim / 1e6),
        lp == "" ? "-" : sprintf("%.1f", lp / 1e6), st }'
  done
  grep '^GGUF tensor types' "$work/gguf-types.txt" || true
} | tee "$work/table.txt"
