#!/usr/bin/env bash
# gpu-check.sh - the CUDA backend's checks on a real GPU in one command (issues 28,
# 29 and 32 item 3). Run on an H200 on 2026-11-28 (five runs; the figures are in
# docs/benchmarks.md, "The CUDA backend on an H200"); --rehearse runs its non-GPU
# commands on the CPU machine.
#
#   scripts/gpu-check.sh OUTDIR [--build DIR] [--only STEP|STAGE,...] [--dry-run]
#                               [--rehearse] [--work DIR] [--keep-work] [--threads N]
#                               [--budget SECONDS] [--synth-type TYPE] [--ctest]
#   scripts/gpu-check.sh --pack [--build DIR] [--all-libs] [DEST]
#
# On the CPU machine, once per source change (nvcc is slow: only the targets the
# checks need, only sm_90 for the H200):
#   export PATH=$PATH:/usr/local/cuda/bin
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
#   scripts/gpu-check.sh --pack --build build-gpu        # builds the targets, writes build-gpu-carry/
# --pack runs `cmake --build` for moe-run moe-prep inflate-moe bench-cuda bench-io and
# every gpu-labelled test, copies those programs and the shared libraries they load
# (from ldd, less glibc's own and, without --all-libs, less those every Ubuntu 24.04
# has: BASE_LIBS below) into build-gpu-carry/carry.tar.xz (about 4.5 MiB), and checks
# that the working tree that travels plus the carry stay under 64 MiB (the tree alone
# was 55.5 MiB in November 2026; with the fine-grained model it is 81 MiB, so leave
# that model, which no step uses, out of the working tree for the run:
#   git sparse-checkout set --no-cone '/*' '!/datasets/models/tiny-moe-qwen3/'
# before --pack, and `git sparse-checkout disable` after).
# Then the device tool's run, with carry ["build-gpu-carry"] and timeout_s 600:
#   bash scripts/gpu-check.sh "$OUT" --build build-gpu-carry
# and, after a fix, the failed steps only: ... --only gpu-tests,logits-trained
#
# On the GPU machine the carry is unpacked into WORK/build; a library the machine
# lacks (libcjson, libhdf5, ...) is taken from the carry, one the machine has is
# not (LD_LIBRARY_PATH names a folder of links to the missing ones only); cuBLAS
# (dlopened by the backend) is looked up in ldconfig, the CUDA toolkit and
# Python's nvidia packages.
#
# Steps, in the order they run (each with its own timeout, continuing past a
# failure; no step runs past the global budget, default 450 s):
#   parity:  env              nvidia-smi (device, driver, CUDA), libraries, cuBLAS
#            gpu-tests        every gpu-labelled ctest (test-cuda: each kernel against
#                             the CPU reference per stored type, several shapes, then
#                             whole models)
#            gemv-tiled       the opt-in one-token GEMV (MOE_CUDA_GEMV=tiled, not yet
#                             run): test-cuda with it, bench-cuda --gemv-only with and
#                             without it
#            trained-bundle   the trained model (datasets/models/tiny-moe-mixtral) as a
#                             bundle, experts q8_0,q4_k,q2_k, dense q8_0
#            logits-trained   GPU all resident against the CPU's float products
#                             (MOE_CPU_INT=0): checkpoint and each precision, 40-token
#                             prompt + 64 greedy steps, max |dlogit| <= 1e-3 on every
#                             position with --gemm f32, tokens identical; the default
#                             f16 prompt GEMMs (<= 5e-2) and the CPU's default 8-bit
#                             activation path reported beside
#            inflated-bundle  tests/bench/bench-offload.sh --prep-only: the model
#                             inflated to FFN 8192, checked, quantized q8_0,q4_k,q2_k,
#                             profiled, fit-cache at 25 %
#            logits-inflated  as logits-trained on the inflated bundle (q8_0, q2_k)
#            bench-cuda       tests/bench-cuda on the inflated bundle: pinned and
#                             pageable H2D against the pinned peak, GEMV q4_k / q8_0
#                             against the device copy (goal >= 70 %), the engine's
#                             expert copies against the pinned peak (goal >= 90 %)
#   offload: offload-logits   --expert-mem 25 % --dynamic off: logits and 64 tokens
#                             equal to the all-resident GPU run (--cpu-experts never;
#                             auto and always reported)
#            offload-decode   decode tok/s at 25 and 50 % of the q8_0 expert bytes:
#                             lru (q8_0, no prefetch, no warm start, no CPU experts),
#                             default engine, + prefetch, + big-little, + --host-mem
#                             (the rest, pinned), + --uma; goal default >= 3x lru at 25 %
#            twiddler         256-token prompt at 25 %: --cpu-experts auto, always,
#                             never; goal auto faster than both
#            copies           the latency table written at start, the H2D rate of the
#                             runs against the pinned peak, and a lower bound of the
#                             share of copy time hidden (what --stats-json lacks is
#                             listed)
#   graphs:  graphs           CUDA graphs (--graphs on|off), trained bundle all resident,
#                             256 greedy steps twice each way: logits within 1e-3 (bit-
#                             identity reported), tokens identical, every
#                             decode step a graph, graph nodes == the launch plan, one
#                             launch per token; tok/s, goal >= 1.3x
#            graphs-offload   (after inflated-bundle) at 25 % graphs do not apply
#                             (reason "expert budget"), logits identical on and off
#            launches         launches per token (gpu.launches_per_token) with and
#                             without graphs, resident and at 25 %
#            uma              --uma forced against the plain run: trained model
#                             resident, inflated at 25 % (logits, tokens, tok/s, memory)
#   parity:  synth-make       the synthetic 2.4 B Mixtral of bench-llama.py made here
#                             (tests/bench/make_synthetic_checkpoint.py needs python3
#                             with numpy; skipped with the reason otherwise; generated
#                             in the background from the start), quantized --synth-type
#            synth-decode     its resident decode tok/s, GPU against the CPU path in the
#                             same run, and 8 greedy steps of logits against the CPU
# The order is the step table's (STEP_TABLE below): the graphs step right after the
# trained model's parity (short, its goal its own), its 25 % half and the launch counts
# after the inflated bundle, uma after bench-cuda, then offload. The synthetic model's
# steps run last: they are the slowest, and the others matter more if time runs out.
#
# Output (OUTDIR, 5 files): summary.txt (the one-screen table, also printed last),
# summary.json (every step: stage, status, seconds, figure, goal and its details),
# parity.log, offload.log, graphs.log (every command as run, its output). Statuses:
# pass, miss (measured, goal not met), fail (wrong result or error), timeout, skip
# (with the reason), info (measured, no goal), not-implemented, option-missing,
# not-exposed.
#
# --dry-run (also when no GPU or nvidia-smi is found): checks every program, test,
# option name and input the steps use, prints the plan, writes the two summary
# files and exits 0 ("skipped: no GPU"), 1 if something is missing. --ctest: the
# same, but exits 77 (skip) for a build without CUDA (ctest gpu-check-dry-run).
# --rehearse: runs every step on the CPU (--device cpu, FFN 1024, a small
# synthetic model, MOE_CPU_INT=0 for both sides) so that the commands, parsers and
# summaries are exercised without a GPU; GPU-only programs report skip.
# --only: step or stage names, comma-separated; steps whose inputs a skipped step
# would have made reuse WORK (--keep-work) or report skip, so on a fresh machine name
# the steps that make them too (--only inflated-bundle,offload). Each moe-run has a
# timeout of its own (60 s), so that a hang costs a run, not a step.
#
# Environment: MOE_GPU_CHECK_PYTHON (default python3).
set -uo pipefail

SELF=$(readlink -f "$0")
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
cd "$ROOT" || exit 1

# ---- the step table: name stage timeout(s) ------------------------------------------
STEP_TABLE="
env parity 40
gpu-tests parity 150
gemv-tiled parity 60
trained-bundle parity 60
logits-trained parity 90
graphs graphs 90
inflated-bundle parity 120
logits-inflated parity 60
graphs-offload graphs 30
launches graphs 10
bench-cuda parity 120
uma graphs 60
offload-logits offload 60
offload-decode offload 150
twiddler offload 60
copies offload 20
synth-make parity 200
synth-decode parity 90
"
MODEL=datasets/models/tiny-moe-mixtral
CALIB=$MODEL/heldout/python_docs.txt
PROMPT_SRC=$MODEL/heldout/c4.txt
NP=40       # prompt tokens of the parity runs (>= 32: prompt chunks take the cuBLAS path)
ND=64       # greedy steps
TOL=1e-3    # max |dlogit| GPU against CPU
TOL16=5e-2  # prompt rows through f16 GEMMs (test-cuda's bound)
# moe-run and moe-prep options the steps use (checked by --dry-run against --help)
RUN_OPTS="--device --tokens --ids --logits-out --stats-json --expert-mem --expert-precision --dynamic --high
 --policy --prefetch --warm --little-k --host-mem --uma --cpu-experts --gemm --graphs --ignore-eos --tokenize -n -t -f -p -m"
PREP_OPTS="quantize:--experts quantize:--dense quantize:-t inspect:--json profile:--dataset profile:--ctx
 fit-cache:--fast-mem fit-cache:--profile"

usage() { sed -n '2,/^set -uo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; }

# ======================================================================================
# helpers shared by the driver and the steps
# ======================================================================================
say() { printf '%s\n' "$*"; }
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
# show_run: show, with the parity prompt's ids as $IDS40 (printed once at the top of
# parity.log) and other long arguments shortened
show_run() {
  local a disp=() ids
  ids=$(fact ids40)
  for a in "$@"; do
    if [ -n "$ids" ] && [ "$a" = "$ids" ]; then disp+=('$IDS40')
    elif [ ${#a} -gt 160 ]; then disp+=("${a:0:48}...(${#a} characters)")
    else disp+=("$(printf '%q' "$a")")
    fi
  done
  printf '+ %s\n' "${disp[*]}"
}
now() { date +%s.%N; }
# kv KEY VALUE: a figure of the running step (its JSON); the last value of a key wins
kv() { printf '%s\t%s\n' "$1" "$(printf '%s' "$2" | tr '\t\n' '  ')" >>"$GC_KV"; }
fact_set() { printf '%s' "$2" >"$GC_WORK/facts/$1"; }
fact() { cat "$GC_WORK/facts/$1" 2>/dev/null; }
fmt() { awk -v x="$2" -v f="$1" 'BEGIN { if (x == "") print "-"; else printf f, x }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print ""; else printf "%.3g", a / b }'; }
# le A B: A <= B numerically (false when A is empty)
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 <= b + 0) }'; }

# jget FILE KEY.PATH: a value from a JSON file ("" if absent); python3 when present,
# else the first "KEY": number of the last path component
jget() {
  [ -s "$1" ] || return 0
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$1" "$2" <<'EOF' 2>/dev/null
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
if v is None: print("")
elif isinstance(v, bool): print("true" if v else "false")
elif isinstance(v, (int, float)): print(repr(v))
else: print(v if isinstance(v, str) else json.dumps(v))
EOF
  else
    sed -n "s/.*\"${2##*.}\"[[:space:]]*:[[:space:]]*\"\{0,1\}\([-0-9.eE+a-z]*\).*/\1/p" "$1" | head -n 1
  fi
}

# jgets FILE KEY.PATH...: several values of one file in one python3 call, separated by
# \x1f (not white space: empty fields for absent keys survive IFS=$'\x1f' read -r ...)
jgets() {
  local f=$1 k vals=()
  shift
  if [ -s "$f" ] && command -v python3 >/dev/null 2>&1; then
    python3 - "$f" "$@" <<'PYJ' 2>/dev/null && return 0
import json, sys
d = json.load(open(sys.argv[1]))
out = []
for path in sys.argv[2:]:
    v = d
    for k in path.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    out.append("" if v is None else ("true" if v is True else "false" if v is False else
               repr(v) if isinstance(v, (int, float)) else str(v)))
print("\x1f".join(out))
PYJ
  fi
  for k in "$@"; do vals+=("$(jget "$f" "$k")"); done
  (IFS=$'\x1f'; printf '%s\n' "${vals[*]}")
}

# json_kv FILE: a kv file as the members of a JSON object (no braces); numbers stay numbers
json_kv() {
  awk -F'\t' '
    function jstr(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/[\001-\037]/, " ", s); return "\"" s "\"" }
    function jval(s) {
      if (s ~ /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ || s == "true" || s == "false" || s == "null") return s
      return jstr(s)
    }
    NF >= 1 && $1 != "" { if (!($1 in v)) order[++n] = $1; v[$1] = (NF >= 2 ? $2 : "") }
    END { for (i = 1; i <= n; i++) printf "%s%s: %s", (i > 1 ? ", " : ""), jstr(order[i]), jval(v[order[i]]) }' "$1"
}

# kv_get FILE KEY: the last value of KEY in a kv file
kv_get() { awk -F'\t' -v k="$2" '$1 == k { v = $2 } END { print v }' "$1" 2>/dev/null; }

# ======================================================================================
# step mode: one step's body, run by the driver under `timeout` (see run_step)
# ======================================================================================

# mrun TAG DEVICE OPTIONS...: one moe-run with -t, --device and --stats-json added,
# under a timeout of its own (GC_RUN_TIMEOUT, 60 s: a hang costs one run, not the
# step); stdout in runs/TAG.out, stderr in runs/TAG.err, stats in runs/TAG.json.
mrun() {
  local tag=$1 dev=$2
  shift 2
  local d=$GC_WORK/runs rc=0
  rm -f "$d/$tag.json" "$d/$tag.out" "$d/$tag.err"
  local cmd=("$GC_BIN/moe-run" --device "$dev" -t "$GC_THREADS" "$@" --stats-json "$d/$tag.json")
  show_run "${cmd[@]}"
  # --foreground: moe-run stays in the step's process group, which the step's own
  # timeout kills as a whole
  timeout --foreground -k 5 "$GC_RUN_TIMEOUT" "${cmd[@]}" >"$d/$tag.out" 2>"$d/$tag.err" || rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "  TIMEOUT after $GC_RUN_TIMEOUT s (one moe-run); stderr:"
    tail -n 10 "$d/$tag.err" | sed 's/^/  | /'
  elif [ $rc -ne 0 ]; then
    say "  exit $rc; stderr:"
    tail -n 30 "$d/$tag.err" | sed 's/^/  | /'
  else
    grep -E '^moe-run: (prompt|experts|big-little)' "$d/$tag.err" | sed 's/^/  | /'
  fi
  return $rc
}

# cmp_logits A B V [FROM TO]: "MAX WORST_ROW BAD ROWS" over rows FROM..TO-1 (TO 0: to
# the end) of two float32 files of V columns; BAD counts NaN / inf values. Exit 1 if a
# file is missing or the sizes differ (the reason printed instead).
cmp_logits() {
  local a=$1 b=$2 V=$3 from=${4:-0} to=${5:-0}
  if [ ! -s "$a" ] || [ ! -s "$b" ]; then echo "missing logits file"; return 1; fi
  local sa sb
  sa=$(stat -c %s "$a")
  sb=$(stat -c %s "$b")
  if [ "$sa" != "$sb" ]; then echo "sizes differ ($sa vs $sb bytes)"; return 1; fi
  paste <(od -An -v -tf4 -w4 "$a") <(od -An -v -tf4 -w4 "$b") | awk -v V="$V" -v from="$from" -v to="$to" '
    { r = int((NR - 1) / V); rows = r + 1
      if (r < from || (to > 0 && r >= to)) next
      if ($1 ~ /nan|inf/ || $2 ~ /nan|inf/) { bad++; next }
      d = $1 - $2; if (d < 0) d = -d
      if (d > m) { m = d; wr = r } }
    END { printf "%.4g %d %d %d\n", m + 0, wr + 0, bad + 0, rows + 0 }'
}

# same_ids A B: "yes" when two --ids outputs are equal and not empty, else "no"
same_ids() { if [ -s "$1" ] && cmp -s "$1" "$2"; then echo yes; else echo no; fi; }

# parity_case LABEL MODEL NDEC STRICT_ONLY [moe-run options...]: the CPU's float
# products against the GPU (--gemm f32, then the default f16 prompt GEMMs) and the
# CPU's default 8-bit activation path. Sets PC_OK (1: within TOL, tokens identical)
# and PC_FIG; records LABEL_* figures.
parity_case() {
  local label=$1 model=$2 nd=$3 strict_only=$4
  shift 4
  local d=$GC_WORK/runs ids V rows r
  ids=$(fact ids40)
  V=$(sed -n 's/.*"vocab_size"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p' "$(model_config "$model")" | head -n 1)
  local common=(-m "$model" "$@" --tokens "$ids" -n "$nd" --ignore-eos --ids)
  PC_OK=0
  PC_FIG="$label: run failed"
  MOE_CPU_INT=0 mrun "$label-cpu" cpu "${common[@]}" --logits-out "$d/$label-cpu.f32" || { kv "${label}_error" "CPU run failed"; return; }
  mrun "$label-gpu" "$GC_DEV" "${common[@]}" --gemm f32 --logits-out "$d/$label-gpu.f32" || { kv "${label}_error" "GPU run failed"; return; }
  r=$(cmp_logits "$d/$label-cpu.f32" "$d/$label-gpu.f32" "$V") || { kv "${label}_error" "$r"; PC_FIG="$label: $r"; return; }
  set -- $r
  local mx=$1 wr=$2 bad=$3 same
  rows=$4
  same=$(same_ids "$d/$label-cpu.out" "$d/$label-gpu.out")
  kv "${label}_max_abs_diff" "$mx"
  kv "${label}_worst_position" "$wr"
  kv "${label}_positions" "$rows"
  kv "${label}_nonfinite" "$bad"
  kv "${label}_tokens_identical" "$same"
  say "  $label: max |dlogit| $mx (worst position $wr of $rows), non-finite $bad, $nd greedy tokens identical: $same"
  if le "$mx" "$TOL" && [ "$bad" = 0 ] && [ "$same" = yes ]; then PC_OK=1; fi
  PC_FIG="$mx"
  [ "$strict_only" = 1 ] && return
  if mrun "$label-gpu16" "$GC_DEV" "${common[@]}" --logits-out "$d/$label-gpu16.f32"; then
    r=$(cmp_logits "$d/$label-cpu.f32" "$d/$label-gpu16.f32" "$V" 0 "$NP") && {
      set -- $r
      kv "${label}_f16_prompt_max_abs_diff" "$1"
      kv "${label}_f16_prompt_within_5e-2" "$(le "$1" "$TOL16" && echo yes || echo no)"
    }
    r=$(cmp_logits "$d/$label-cpu.f32" "$d/$label-gpu16.f32" "$V" "$NP" 0) && { set -- $r; kv "${label}_f16_decode_max_abs_diff" "$1"; }
    kv "${label}_f16_tokens_identical" "$(same_ids "$d/$label-cpu.out" "$d/$label-gpu16.out")"
  fi
  if mrun "$label-cpuint" cpu "${common[@]}" --logits-out "$d/$label-cpuint.f32"; then
    r=$(cmp_logits "$d/$label-cpu.f32" "$d/$label-cpuint.f32" "$V") && { set -- $r; kv "${label}_cpu_int8_vs_float_max_abs_diff" "$1"; }
    kv "${label}_cpu_int8_tokens_identical" "$(same_ids "$d/$label-cpu.out" "$d/$label-cpuint.out")"
  fi
}

# model_config MODEL: the config.json that gives MODEL's vocabulary (bundles: their source)
model_config() {
  case "$1" in
    *.moeb) case "$(basename "$1")" in
              synth*) echo "$GC_WORK/synth/config.json" ;;
              *) echo "$MODEL/config.json" ;;
            esac ;;
    *) echo "$1/config.json" ;;
  esac
}

# need_file PATH WHAT: skip the step (status skip) when an input is missing
need_file() {
  if [ ! -e "$1" ]; then
    kv status skip
    kv reason "needs $2 ($1 missing)"
    say "skip: needs $2 ($1 missing)"
    exit 0
  fi
}

# drop_cache FILE: start a run from storage (advisory, as bench-offload.sh)
drop_cache() { dd if="$1" iflag=nocache count=0 status=none 2>/dev/null || true; }

offload_bundle() { echo "$GC_WORK/offload/tiny-moe-mixtral-ffn$GC_FFN.moeb"; }

# ---- parity ------------------------------------------------------------------------------
step_env() {
  local smi name driver mem cuda ver
  if [ "$GC_MODE" = rehearse ]; then
    kv status skip
    kv reason "rehearsal on the CPU: no GPU"
  elif smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); then
    say "$smi"
    IFS=',' read -r name driver mem _ <<<"$(echo "$smi" | head -n 1)"
    cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
    name=$(echo "$name" | sed 's/^ *//')
    driver=$(echo "$driver" | sed 's/^ *//')
    kv device "$name"
    kv driver "$driver"
    kv memory "$(echo "$mem" | sed 's/^ *//')"
    kv cuda_driver_version "$cuda"
    kv gpus "$(echo "$smi" | wc -l)"
    nvidia-smi 2>&1 | head -n 20
    nvidia-smi -q -d CLOCK 2>&1 | grep -A4 -i 'max clocks' | head -n 6
    kv status pass
    kv figure "$name, driver $driver, CUDA $cuda"
  else
    say "nvidia-smi failed: $smi"
    kv status fail
    kv reason "nvidia-smi failed"
  fi
  ver=$("$GC_BIN/moe-run" --version 2>&1)
  say "moe-run --version: $ver"
  kv moe_run_version "$ver"
  kv build "$(cat "$GC_BIN/manifest.txt" 2>/dev/null | tr '\n' ';' | cut -c1-400)"
  kv libraries_from_carry "$(ls "$GC_WORK/lib" 2>/dev/null | tr '\n' ' ')"
  kv cublas "${GC_CUBLAS:-not found}"
  kv cpus "$(nproc)"
  kv threads "$GC_THREADS"
  kv work_free "$(df -h "$GC_WORK" | awk 'NR == 2 { print $4 }')"
  kv python_numpy "$(fact python_numpy)"
  case "$ver" in *cuda*) ;; *) kv status fail; kv reason "moe-run has no cuda backend: $ver" ;; esac
  if [ "$GC_MODE" = run ] && [ -z "${GC_CUBLAS:-}" ]; then
    kv status fail
    kv reason "cuBLAS (libcublas.so.*) not found: prompt GEMMs (32 tokens or more) will fail"
  fi
  if grep -q MISSING "$GC_WORK/libs.txt" 2>/dev/null; then
    kv status fail
    kv reason "$(grep MISSING "$GC_WORK/libs.txt" | head -n 3 | tr '\n' ' ')(pack again: MOE_GPU_CHECK_BASE_LIBS without them)"
  fi
}

# test_cmd EXE ARGS: a gpu-tests.tsv row's program and tab-separated arguments with @SRC@
# and @BUILD@ resolved, into the caller's `exe` and `argv`
test_cmd() {
  local a i
  exe=${1//@SRC@/$ROOT}
  exe=${exe//@BUILD@/$GC_BIN}
  IFS=$'\t' read -r -a argv <<<"$2"
  for i in "${!argv[@]}"; do
    a=${argv[$i]//@SRC@/$ROOT}
    argv[$i]=${a//@BUILD@/$GC_BIN}
  done
}

step_gpu_tests() {
  local list=$GC_WORK/gpu-tests.tsv n=0 nfail=0 fig="" first=""
  need_file "$list" "the gpu-labelled tests' list"
  while IFS=$'\t' read -r name exe args; do
    [ -n "$name" ] || continue
    n=$((n + 1))
    local argv=() rc=0
    test_cmd "$exe" "$args"
    say "== ctest $name"
    show "$exe" "${argv[@]}"
    # tee: what it printed reaches the log even when the step's timeout kills it
    (cd "$GC_BIN/tests" 2>/dev/null || cd "$GC_BIN" || exit 1; exec "$exe" "${argv[@]}") 2>&1 | tee "$GC_WORK/runs/test-$name.txt"
    rc=${PIPESTATUS[0]}
    local checks fails
    checks=$(sed -n "s/^$name: \([0-9]*\) checks.*/\1/p" "$GC_WORK/runs/test-$name.txt" | tail -n 1)
    fails=$(grep -c '^FAIL ' "$GC_WORK/runs/test-$name.txt")
    kv "${name}_exit" "$rc"
    kv "${name}_checks" "${checks:-}"
    kv "${name}_fails" "$fails"
    local k=0
    while IFS= read -r line; do
      k=$((k + 1))
      kv "${name}_fail_$k" "$line"
      [ -n "$first" ] || first="$name: $line"
    done < <(grep '^FAIL ' "$GC_WORK/runs/test-$name.txt" | head -n 8)
    if [ $rc -eq 77 ]; then
      fig+="$name skipped (no device) "
    elif [ $rc -ne 0 ]; then
      nfail=$((nfail + 1))
      fig+="$name: ${checks:-?} checks, $fails FAIL, exit $rc "
      [ -n "$first" ] || first="$name exited $rc: $(tail -n 1 "$GC_WORK/runs/test-$name.txt")"
    else
      fig+="$name: ${checks:-?} checks ok "
    fi
  done <"$list"
  kv tests "$n"
  kv figure "$fig"
  kv goal "every check passes"
  if [ $n -eq 0 ]; then kv status fail; kv reason "no gpu-labelled test found"
  elif [ $nfail -gt 0 ]; then kv status fail; kv reason "$first"
  elif [[ $fig == *skipped* ]]; then kv status skip; kv reason "no CUDA device"
  else kv status pass
  fi
}

step_gemv_tiled() {
  # the opt-in one-token GEMV with x in shared memory (MOE_CUDA_GEMV=tiled, kernels.cu):
  # test-cuda with it, then bench-cuda --gemv-only without and with it, interleaved twice
  local list=$GC_WORK/gpu-tests.tsv out=$GC_WORK/runs/test-cuda-tiled.txt name exe args rc=0 argv=()
  need_file "$list" "the gpu-labelled tests' list"
  IFS=$'\t' read -r name exe args < <(grep '^test-cuda' "$list")
  if [ -z "${exe:-}" ]; then kv status fail; kv reason "no test-cuda in the gpu tests"; return; fi
  test_cmd "$exe" "$args"
  show env MOE_CUDA_GEMV=tiled "$exe" "${argv[@]}"
  (cd "$GC_BIN/tests" 2>/dev/null || cd "$GC_BIN" || exit 1; MOE_CUDA_GEMV=tiled exec "$exe" "${argv[@]}") 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [ $rc -eq 77 ]; then kv status skip; kv reason "no CUDA device"; return; fi
  kv test_cuda_tiled_exit "$rc"
  kv test_cuda_tiled_fails "$(grep -c '^FAIL ' "$out")"
  kv test_cuda_tiled_first_fail "$(grep -m 1 '^FAIL ' "$out")"
  local r v f t fig=""
  for r in 1 2; do
    for v in plain tiled; do
      f=$GC_WORK/runs/gemv-$v-$r.txt
      if [ $v = tiled ]; then MOE_CUDA_GEMV=tiled "$GC_BIN/tests/bench-cuda" --gemv-only >"$f" 2>&1
      else "$GC_BIN/tests/bench-cuda" --gemv-only >"$f" 2>&1; fi
      cat "$f"
    done
  done
  for t in q4_k q8_0; do
    local bp bt
    bp=$(cat "$GC_WORK"/runs/gemv-plain-*.txt | sed -n "s/^| GEMV $t 14336 x 4096, 1 token | \([0-9.]*\) GB.*/\1/p" | sort -g | tail -n 1)
    bt=$(cat "$GC_WORK"/runs/gemv-tiled-*.txt | sed -n "s/^| GEMV $t 14336 x 4096, 1 token | \([0-9.]*\) GB.*/\1/p" | sort -g | tail -n 1)
    kv "gemv_${t}_plain_gbs" "$bp"
    kv "gemv_${t}_tiled_gbs" "$bt"
    fig+="$t $(fmt %.0f "$bt") vs $(fmt %.0f "$bp") GB/s "
  done
  kv figure "tiled GEMV: ${fig% }"
  kv goal "test-cuda passes with it; faster than the plain kernel"
  if [ $rc -ne 0 ]; then kv status fail; kv reason "test-cuda with MOE_CUDA_GEMV=tiled: $(grep -m 1 '^FAIL ' "$out")"
  else kv status info; fi
}

step_trained_bundle() {
  local b=$GC_WORK/trained.moeb rc=0
  rm -f "$b"
  show "$GC_BIN/moe-prep" quantize "$MODEL" -o "$b" --experts q8_0,q4_k,q2_k --dense q8_0 -t "$GC_THREADS"
  "$GC_BIN/moe-prep" quantize "$MODEL" -o "$b" --experts q8_0,q4_k,q2_k --dense q8_0 -t "$GC_THREADS" \
    >"$GC_WORK/runs/trained-quantize.txt" 2>&1 || rc=$?
  grep -v '^quantize: ' "$GC_WORK/runs/trained-quantize.txt"
  if [ $rc -eq 0 ] && [ -s "$b" ]; then
    kv status pass
    kv figure "$(stat -c %s "$b" | awk '{ printf "%.1f MB bundle", $1 / 1e6 }')"
  else
    kv status fail
    kv reason "moe-prep quantize failed"
  fi
}

# parity_step LABELPREFIX CASES...: each case "label|model|options"; the step's status
parity_step() {
  local all=1 fig="" worst=0 c n=0 same=0
  for c in "$@"; do
    IFS='|' read -r label model opts <<<"$c"
    # shellcheck disable=SC2086 # options split on purpose
    parity_case "$label" "$model" "$ND" 0 $opts
    [ "$PC_OK" = 1 ] || all=0
    fig+="$label $PC_FIG, "
    n=$((n + 1))
    [ "$(kv_get "$GC_KV" "${label}_tokens_identical")" = yes ] && same=$((same + 1))
    local m
    m=$(kv_get "$GC_KV" "${label}_max_abs_diff")
    [ -n "$m" ] && ! le "$m" "$worst" && worst=$m
  done
  kv max_abs_diff "$worst"
  kv cases "${fig%, }"
  kv figure "max|d| $worst; tokens same in $same of $n"
  kv goal "<= $TOL, tokens same"
  if [ $all = 1 ]; then kv status pass; else kv status fail; kv reason "a case is over $TOL, differs in tokens or failed (see the log)"; fi
}

step_logits_trained() {
  local b=$GC_WORK/trained.moeb
  need_file "$b" "trained-bundle"
  parity_step "ckpt|$MODEL|" "q8_0|$b|--expert-precision q8_0" "q4_k|$b|--expert-precision q4_k" \
    "q2_k|$b|--expert-precision q2_k"
}

step_inflated_bundle() {
  local w=$GC_WORK/offload b
  b=$(offload_bundle)
  show env MOE_BUILD_DIR="$GC_BIN" tests/bench/bench-offload.sh --prep-only --no-build --work "$w" --ffn "$GC_FFN" --threads "$GC_THREADS"
  if ! MOE_BUILD_DIR=$GC_BIN tests/bench/bench-offload.sh --prep-only --no-build --work "$w" --ffn "$GC_FFN" \
      --threads "$GC_THREADS" 2>&1 | grep -v 'fitting HOBBIT.s weights: \(grid\|refin\)'; then
    kv status fail
    kv reason "bench-offload.sh --prep-only failed"
    return
  fi
  local q8 q4 q2
  # the per-precision totals of inspect --json, as bench-offload.sh reads them
  field() {
    awk -v p="$1" -v k="$2" '
      /"name":/ { gsub(/[",\t ]/, "", $0); sub(/^name:/, "", $0); cur = $0; next }
      $0 ~ "\"" k "\":" && cur == p { gsub(/[^0-9]/, "", $0); print; exit }' "$w/inspect.json"
  }
  q8=$(field q8_0 total_bytes)
  q4=$(field q4_k total_bytes)
  q2=$(field q2_k total_bytes)
  if [ -z "$q8" ] || [ ! -s "$w/fit-cache-25.txt" ]; then
    kv status fail
    kv reason "no q8_0 expert bytes in inspect.json or no fit-cache output"
    return
  fi
  fact_set q8_total "$q8"
  fact_set budget25 $((q8 / 4))
  fact_set budget50 $((q8 / 2))
  kv q8_0_expert_bytes "$q8"
  kv q4_k_expert_bytes "$q4"
  kv q2_k_expert_bytes "$q2"
  kv budget25_bytes $((q8 / 4))
  kv budget50_bytes $((q8 / 2))
  kv hobbit "$(grep '^HOBBIT' "$w/profile.txt" | head -n 1)"
  kv status pass
  kv figure "$(awk -v a="$q8" 'BEGIN { printf "q8_0 experts %.1f MB; 25 %% = %.1f MB", a / 1e6, a / 4e6 }'), profiled, fitted"
}

step_logits_inflated() {
  local b
  b=$(offload_bundle)
  need_file "$b" "inflated-bundle"
  parity_step "inf-q8_0|$b|--expert-precision q8_0" "inf-q2_k|$b|--expert-precision q2_k"
}

step_bench_cuda() {
  local b out=$GC_WORK/runs/bench-cuda.txt rc=0
  b=$(offload_bundle)
  need_file "$b" "inflated-bundle"
  need_file "$GC_BIN/tests/bench-cuda" "the bench-cuda program"
  wait_synth_gen 90
  show "$GC_BIN/tests/bench-cuda" "$b" --threads "$GC_THREADS" -n "$ND" --prompt 256 --expert-mem 25%
  "$GC_BIN/tests/bench-cuda" "$b" --threads "$GC_THREADS" -n "$ND" --prompt 256 --expert-mem 25% 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if grep -q 'no CUDA device' "$out"; then
    kv status skip
    kv reason "no CUDA device"
    return
  fi
  parse_bench_cuda "$out"
  [ $rc -eq 0 ] || { kv status fail; kv reason "bench-cuda exited $rc"; }
}

# parse_bench_cuda FILE: bench-cuda's markdown table as figures, status and facts
parse_bench_cuda() {
  local f=$1 pinned pageable gmin="" ecopy line
  pinned=$(sed -n 's/^| host->device memcpy.*| pinned \([0-9.]*\) GB\/s, pageable \([0-9.]*\) GB\/s.*/\1/p' "$f" | head -n 1)
  pageable=$(sed -n 's/^| host->device memcpy.*| pinned \([0-9.]*\) GB\/s, pageable \([0-9.]*\) GB\/s.*/\2/p' "$f" | head -n 1)
  kv pinned_h2d_gbs "$pinned"
  kv pageable_h2d_gbs "$pageable"
  [ -n "$pinned" ] && fact_set pinned_gbs "$pinned"
  while IFS= read -r line; do
    # | GEMV q4_k 14336 x 4096, 1 token | 1234.5 GB/s = 45 % of the 3000.0 GB/s device copy | >= 70 % |
    local t no ni gb pct d2d
    read -r t no ni gb pct d2d <<<"$(echo "$line" | sed -n 's/^| GEMV \([a-z0-9_]*\) \([0-9]*\) x \([0-9]*\), 1 token | \([0-9.]*\) GB\/s = \([0-9]*\) % of the \([0-9.]*\) GB\/s.*/\1 \2 \3 \4 \5 \6/p')"
    [ -n "${t:-}" ] || continue
    kv "gemv_${t}_${no}x${ni}_gbs" "$gb"
    kv "gemv_${t}_${no}x${ni}_pct_of_d2d" "$pct"
    kv d2d_copy_gbs "$d2d"
    if [ -z "$gmin" ] || [ "$pct" -lt "$gmin" ]; then gmin=$pct; fi
  done < <(grep '^| GEMV ' "$f")
  kv gemv_min_pct_of_d2d "$gmin"
  local rg rc
  read -r rg rc _ <<<"$(sed -n 's/^| decode, all experts resident | GPU \([0-9.]*\) tok\/s, CPU \([0-9.]*\) tok\/s (\([0-9.]*\)x).*/\1 \2 \3/p' "$f")"
  kv resident_decode_gpu_tps "${rg:-}"
  kv resident_decode_cpu_tps "${rc:-}"
  local ff fl fx
  read -r ff fl fx <<<"$(sed -n 's/^| decode, .* of experts on the GPU | full engine \([0-9.]*\) tok\/s, on-demand LRU \([0-9.]*\) tok\/s (\([0-9.]*\)x).*/\1 \2 \3/p' "$f")"
  kv offload25_full_tps "${ff:-}"
  kv offload25_lru_tps "${fl:-}"
  kv offload25_full_over_lru "${fx:-}"
  ecopy=$(sed -n 's/^| host->device expert copies.*| \([0-9.]*\) GB\/s = \([0-9]*\) % of the pinned peak.*/\2/p' "$f")
  kv expert_copies_pct_of_pinned "$ecopy"
  local ts ta tc
  read -r ts ta tc <<<"$(sed -n 's/^| [0-9]*-token prompt.*| split \([0-9.]*\) s, always-transfer \([0-9.]*\) s, always-CPU \([0-9.]*\) s.*/\1 \2 \3/p' "$f")"
  kv twiddler_split_s "${ts:-}"
  kv twiddler_never_s "${ta:-}"
  kv twiddler_always_s "${tc:-}"
  kv figure "pinned ${pinned:-?} GB/s; GEMV >= ${gmin:-?} % of d2d; copies ${ecopy:-?} % of pinned"
  kv goal "GEMV >=70 %, copies >=90 %"
  if [ -z "$pinned" ] || [ -z "$gmin" ]; then
    kv status fail
    kv reason "bench-cuda printed no copy or GEMV row"
  elif [ "$gmin" -ge 70 ] && [ -n "$ecopy" ] && [ "$ecopy" -ge 90 ]; then
    kv status pass
  else
    kv status miss
  fi
}

# synthetic model: generated in the background from the start (start_synth_gen)
wait_synth_gen() {
  local cap=$1 t=0
  [ -e "$GC_WORK/synth-gen.pid" ] || return 0
  while [ ! -e "$GC_WORK/synth-gen.rc" ] && [ $t -lt "$cap" ]; do sleep 1; t=$((t + 1)); done
  [ $t -gt 0 ] && say "(waited ${t} s for the synthetic model's generation to finish)"
  return 0
}

step_synth_make() {
  local s=$GC_WORK/synth b=$GC_WORK/synth-$GC_SYNTH_TYPE.moeb
  if [ "$(fact python_numpy)" != yes ]; then
    kv status skip
    kv reason "no python3 with numpy on this machine: tests/bench/make_synthetic_checkpoint.py cannot run"
    return
  fi
  wait_synth_gen 100000
  say "== generation (started in the background at $(cat "$GC_WORK/synth-gen.start" 2>/dev/null))"
  cat "$GC_WORK/synth-gen.log" 2>/dev/null
  if [ "$(cat "$GC_WORK/synth-gen.rc" 2>/dev/null)" != 0 ]; then
    kv status fail
    kv reason "make_synthetic_checkpoint.py failed"
    return
  fi
  kv generate_s "$(cat "$GC_WORK/synth-gen.seconds" 2>/dev/null)"
  local t0 t1
  t0=$(now)
  show "$GC_BIN/moe-prep" quantize "$s" -o "$b" --experts "$GC_SYNTH_TYPE" --dense "$GC_SYNTH_TYPE" -t "$GC_THREADS"
  "$GC_BIN/moe-prep" quantize "$s" -o "$b" --experts "$GC_SYNTH_TYPE" --dense "$GC_SYNTH_TYPE" -t "$GC_THREADS" 2>&1 |
    grep -v '^quantize: '
  t1=$(now)
  if [ ! -s "$b" ]; then
    kv status fail
    kv reason "moe-prep quantize wrote no bundle"
    return
  fi
  kv quantize_s "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
  kv bundle_bytes "$(stat -c %s "$b")"
  kv parameters "$(awk '/ of BF16 weights/ { print $2 }' "$GC_WORK/synth-gen.log")"
  kv status pass
  kv figure "$(awk '/ of BF16 weights/ { print $2 " GB BF16" }' "$GC_WORK/synth-gen.log") -> $(stat -c %s "$b" | awk '{ printf "%.2f GB", $1 / 1e9 }') $GC_SYNTH_TYPE"
}

step_synth_decode() {
  local b=$GC_WORK/synth-$GC_SYNTH_TYPE.moeb d=$GC_WORK/runs gt ct ids
  need_file "$b" "synth-make"
  ids=$(seq 0 7 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), (97 * $1 + 13) % 32000 }')
  mrun synth-gpu "$GC_DEV" -m "$b" --tokens "$ids" -n "$ND" --ignore-eos --ids
  mrun synth-cpu cpu -m "$b" --tokens "$ids" -n "$ND" --ignore-eos --ids
  gt=$(jget "$d/synth-gpu.json" tokens_per_s_decode)
  ct=$(jget "$d/synth-cpu.json" tokens_per_s_decode)
  kv gpu_decode_tps "$gt"
  kv cpu_decode_tps "$ct"
  kv gpu_over_cpu "$(ratio "$gt" "$ct")"
  kv gpu_prompt_tps "$(jget "$d/synth-gpu.json" tokens_per_s_prompt)"
  kv gpu_peak_device_bytes "$(jget "$d/synth-gpu.json" gpu.peak_device_bytes)"
  kv tokens_identical_cpu_int8_vs_gpu "$(same_ids "$d/synth-cpu.out" "$d/synth-gpu.out")"
  # logits: 8 greedy steps against the CPU's float products
  parity_case synth "$b" 8 1
  kv figure "GPU $(fmt %.1f "$gt") vs CPU $(fmt %.1f "$ct") tok/s ($(ratio "$gt" "$ct")x); logits $(kv_get "$GC_KV" synth_max_abs_diff)"
  kv goal "report; logits <= $TOL"
  if [ -z "$gt" ] || [ -z "$ct" ]; then kv status fail; kv reason "a decode run failed"
  elif [ "$PC_OK" != 1 ]; then kv status fail; kv reason "logits over $TOL or tokens differ (8 steps)"
  else kv status pass
  fi
}

# ---- offload ------------------------------------------------------------------------------
step_offload_logits() {
  local b d=$GC_WORK/runs ids V b25 r
  b=$(offload_bundle)
  need_file "$b" "inflated-bundle"
  b25=$(fact budget25)
  ids=$(fact ids40)
  V=$(sed -n 's/.*"vocab_size"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p' "$MODEL/config.json")
  local common=(-m "$b" --expert-precision q8_0 --tokens "$ids" -n "$ND" --ignore-eos --ids)
  local off=(--expert-mem "$b25" --dynamic off --high q8_0)
  mrun off-ref "$GC_DEV" "${common[@]}" --graphs off --logits-out "$d/off-ref.f32" || { kv status fail; kv reason "all-resident GPU run failed"; return; }
  local mode ok=1 fig=""
  for mode in never auto always; do
    if ! mrun "off-$mode" "$GC_DEV" "${common[@]}" "${off[@]}" --cpu-experts "$mode" --logits-out "$d/off-$mode.f32"; then
      kv "${mode}_error" "run failed"
      [ $mode = never ] && ok=0
      continue
    fi
    if r=$(cmp_logits "$d/off-ref.f32" "$d/off-$mode.f32" "$V"); then
      set -- $r
      kv "${mode}_max_abs_diff" "$1"
      kv "${mode}_nonfinite" "$3"
      kv "${mode}_bit_identical" "$(cmp -s "$d/off-ref.f32" "$d/off-$mode.f32" && echo yes || echo no)"
      kv "${mode}_tokens_identical" "$(same_ids "$d/off-ref.out" "$d/off-$mode.out")"
      kv "${mode}_misses_high" "$(jget "$d/off-$mode.json" store.misses_high)"
      kv "${mode}_h2d_copies" "$(jget "$d/off-$mode.json" gpu.h2d_copies)"
      kv "${mode}_host_works" "$(jget "$d/off-$mode.json" gpu.host_works)"
      kv "${mode}_latency_table" "$(jget "$d/off-$mode.json" gpu.latency_table)"
      say "  --cpu-experts $mode: max |dlogit| $1 against all resident, bit-identical $(kv_get "$GC_KV" "${mode}_bit_identical"), tokens identical $(kv_get "$GC_KV" "${mode}_tokens_identical")"
      fig+="$mode $1 "
      if [ $mode = never ] && { ! le "$1" "$TOL" || [ "$3" != 0 ] || [ "$(kv_get "$GC_KV" never_tokens_identical)" != yes ]; }; then ok=0; fi
    else
      kv "${mode}_error" "$r"
      [ $mode = never ] && ok=0
    fi
  done
  kv figure "max|d| vs resident: ${fig% }"
  kv goal "never <= $TOL, tokens same"
  if [ $ok = 1 ]; then kv status pass; else kv status fail; kv reason "--cpu-experts never differs from all resident or failed"; fi
}

# the configurations of offload-decode: name and options (before --expert-mem)
offload_cfg() {
  case "$1" in
    lru) echo "--policy lru --dynamic off --prefetch off --warm off --high q8_0 --cpu-experts never" ;;
    default) echo "" ;;
    prefetch) echo "--prefetch on" ;;
    biglittle) echo "--prefetch on --little-k 1" ;;
    hostmem) echo "--prefetch on --host-mem $2" ;;
    uma) echo "--prefetch on --uma" ;;
  esac
}
OFFLOAD_CFGS="lru default prefetch biglittle hostmem uma"

step_offload_decode() {
  local b d=$GC_WORK/runs q8 cfg pct budget tps
  b=$(offload_bundle)
  need_file "$b" "inflated-bundle"
  q8=$(fact q8_total)
  [ -n "$q8" ] || { kv status skip; kv reason "needs inflated-bundle (no expert bytes recorded)"; return; }
  for pct in 25 50; do
    budget=$(fact "budget$pct")
    for cfg in $OFFLOAD_CFGS; do
      drop_cache "$b"
      # shellcheck disable=SC2046 # options split on purpose
      mrun "dec-$cfg-$pct" "$GC_DEV" -m "$b" -f "$GC_WORK/prompt.txt" -n "$ND" --ignore-eos \
        $(offload_cfg "$cfg" $((q8 - budget))) --expert-mem "$budget"
      local by hr st
      IFS=$'\x1f' read -r tps by hr st <<<"$(jgets "$d/dec-$cfg-$pct.json" tokens_per_s_decode \
        store.bytes_read_per_decode_token store.hit_ratio store.stall_s_per_decode_token)"
      kv "tps_${cfg}_$pct" "$tps"
      kv "bytes_read_per_decode_token_${cfg}_$pct" "$by"
      kv "hit_ratio_${cfg}_$pct" "$hr"
      kv "stall_s_per_decode_token_${cfg}_$pct" "$st"
    done
  done
  say ""
  say "decode tok/s (-n $ND, one run each; budgets of the q8_0 expert bytes $q8):"
  printf '  %-10s %10s %10s\n' config 25% 50%
  for cfg in $OFFLOAD_CFGS; do
    printf '  %-10s %10s %10s\n' "$cfg" "$(fmt %.1f "$(kv_get "$GC_KV" "tps_${cfg}_25")")" "$(fmt %.1f "$(kv_get "$GC_KV" "tps_${cfg}_50")")"
  done
  local dl r
  dl=$(kv_get "$GC_KV" tps_default_25)
  r=$(ratio "$dl" "$(kv_get "$GC_KV" tps_lru_25)")
  kv default_over_lru_25 "$r"
  kv default_over_lru_50 "$(ratio "$(kv_get "$GC_KV" tps_default_50)" "$(kv_get "$GC_KV" tps_lru_50)")"
  kv hostmem_over_storage_25 "$(ratio "$(kv_get "$GC_KV" tps_hostmem_25)" "$(kv_get "$GC_KV" tps_prefetch_25)")"
  kv uma_over_copies_25 "$(ratio "$(kv_get "$GC_KV" tps_uma_25)" "$(kv_get "$GC_KV" tps_prefetch_25)")"
  kv figure "25 %: default $(fmt %.1f "$dl") vs lru $(fmt %.1f "$(kv_get "$GC_KV" tps_lru_25)") tok/s = ${r:-?}x"
  kv goal "default >= 3x lru at 25 %"
  local missing=0
  for cfg in $OFFLOAD_CFGS; do
    [ -n "$(kv_get "$GC_KV" "tps_${cfg}_25")" ] && [ -n "$(kv_get "$GC_KV" "tps_${cfg}_50")" ] || missing=$((missing + 1))
  done
  if [ -z "$r" ]; then kv status fail; kv reason "the default or lru run failed"
  elif [ $missing -gt 0 ]; then kv status fail; kv reason "$missing configuration(s) failed (see the log)"
  elif awk -v r="$r" 'BEGIN { exit !(r >= 3) }'; then kv status pass
  else kv status miss
  fi
}

step_twiddler() {
  local b d=$GC_WORK/runs ids b25 mode
  b=$(offload_bundle)
  need_file "$b" "inflated-bundle"
  b25=$(fact budget25)
  ids=$(seq 0 255 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), (97 * $1 + 13) % 4096 }')
  say "the 256 prompt ids: (97 i + 13) mod 4096, i = 0..255"
  if ! ls "$XDG_CACHE_HOME"/moe/latency-* >/dev/null 2>&1; then
    say "(no latency table cached yet: one warm-up run measures it)"
    mrun tw-warmup "$GC_DEV" -m "$b" --tokens "${ids%%,*}" -n 8 --ignore-eos --expert-mem "$b25" --cpu-experts auto
  fi
  for mode in auto always never; do
    drop_cache "$b"
    mrun "tw-$mode" "$GC_DEV" -m "$b" --tokens "$ids" -n 0 --expert-mem "$b25" --cpu-experts "$mode"
    kv "prompt_s_$mode" "$(jget "$d/tw-$mode.json" prompt_s)"
    kv "placed_$mode" "$(jget "$d/tw-$mode.json" gpu.placed)"
    kv "placed_host_$mode" "$(jget "$d/tw-$mode.json" gpu.placed_host)"
    kv "host_wait_s_$mode" "$(jget "$d/tw-$mode.json" gpu.host_wait_s)"
  done
  local a al nv
  a=$(kv_get "$GC_KV" prompt_s_auto)
  al=$(kv_get "$GC_KV" prompt_s_always)
  nv=$(kv_get "$GC_KV" prompt_s_never)
  kv figure "256-token prompt: auto $(fmt %.3f "$a") s, always $(fmt %.3f "$al") s, never $(fmt %.3f "$nv") s"
  kv goal "auto < always, never"
  if [ -z "$a" ] || [ -z "$al" ] || [ -z "$nv" ]; then kv status fail; kv reason "a run failed"
  elif awk -v a="$a" -v b="$al" -v c="$nv" 'BEGIN { exit !(a < b && a < c) }'; then kv status pass
  else kv status miss
  fi
}

step_copies() {
  local d=$GC_WORK/runs pinned f any=0 tag
  pinned=$(fact pinned_gbs)
  kv pinned_peak_gbs "$pinned"
  say "== the latency table(s) the start-up measurement wrote ($XDG_CACHE_HOME/moe)"
  for f in "$XDG_CACHE_HOME"/moe/latency-*; do
    [ -e "$f" ] || continue
    any=1
    say "--- $f"
    cat "$f"
    kv latency_table_file "$(basename "$f")"
    kv latency_table_lines "$(wc -l <"$f")"
  done
  [ $any = 1 ] || say "(none: no run with --cpu-experts auto and a missing expert has run)"
  if [ "$GC_MODE" = rehearse ]; then
    kv status skip
    kv reason "rehearsal on the CPU: no copies, no latency table"
  fi
  say "== H2D copies of the offload-decode runs (gpu.h2d_bytes / gpu.h2d_s) against the pinned peak (${pinned:-?} GB/s)"
  printf '  %-16s %10s %10s %8s %10s %10s\n' run copies "GB/s" "% peak" "stall s" "hidden>="
  local best="" bestpct=""
  for f in "$d"/dec-*.json; do
    [ -e "$f" ] || continue
    tag=$(basename "$f" .json)
    local by s n st rate pct hid
    IFS=$'\x1f' read -r by s n st <<<"$(jgets "$f" gpu.h2d_bytes gpu.h2d_s gpu.h2d_copies store.stall_s)"
    rate=$(awk -v b="$by" -v s="$s" 'BEGIN { if (s + 0 > 0) printf "%.2f", b / s / 1e9 }')
    pct=$(awk -v r="$rate" -v p="$pinned" 'BEGIN { if (r != "" && p + 0 > 0) printf "%.0f", 100 * r / p }')
    # lower bound of the share of copy time hidden: the session's whole wait for loads
    # (reads and copies together) counted as copy time not hidden
    hid=$(awk -v st="$st" -v s="$s" 'BEGIN { if (s + 0 > 0 && st != "") { h = 1 - st / s; if (h < 0) h = 0; printf "%.2f", h } }')
    printf '  %-16s %10s %10s %8s %10s %10s\n' "$tag" "${n:-}" "${rate:--}" "${pct:--}" "$(fmt %.3f "$st")" "${hid:--}"
    [ -n "$rate" ] && kv "h2d_gbs_${tag#dec-}" "$rate"
    [ -n "$pct" ] && kv "h2d_pct_of_pinned_${tag#dec-}" "$pct"
    [ -n "$hid" ] && kv "copy_hidden_share_lower_bound_${tag#dec-}" "$hid"
    if [ -n "$pct" ] && { [ -z "$bestpct" ] || [ "$pct" -gt "$bestpct" ]; }; then bestpct=$pct; best=$tag; fi
  done
  kv not_exposed "copy/compute overlap time per copy (only h2d_s, the loaders' wait, and store.stall_s, the session's wait for reads and copies together); launches per token; per-layer copy timeline"
  kv figure "best H2D ${bestpct:-?} % of pinned (${best:-none}); latency table $([ $any = 1 ] && echo written || echo none)"
  kv goal "report"
  if [ "$GC_MODE" = rehearse ]; then :
  elif [ $any = 0 ] && [ -z "$best" ]; then kv status fail; kv reason "no latency table and no run with copies (offload steps not run or failed)"
  else kv status info
  fi
}

# ---- graphs ---------------------------------------------------------------------------------
step_graphs() {
  # decode steps as one CUDA graph (moe-run --graphs on|off; moe-graph.h): all resident on
  # the trained bundle, the same ids with and without graphs, interleaved twice each:
  # logits (within TOL; bit-identity reported), tokens, decode tok/s (best of two), launches per token, the
  # graph's nodes against the launch plan; at 25 % in VRAM graphs do not apply (the
  # store decides each step's copies): the runs say so and give the same logits
  local d=$GC_WORK/runs tb ids V ok=1 r n=256 rep f
  tb=$GC_WORK/trained.moeb
  ids=$(fact ids40)
  V=$(sed -n 's/.*"vocab_size"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p' "$MODEL/config.json")
  if ! grep -q -- '--graphs' <<<"$("$GC_BIN/moe-run" --help 2>&1)"; then
    kv status option-missing
    kv reason "moe-run has no --graphs"
    return
  fi
  if [ ! -s "$tb" ]; then kv status fail; kv reason "no trained bundle ($tb)"; return; fi
  local common=(-m "$tb" --expert-precision q8_0 --tokens "$ids" -n "$n" --ignore-eos --ids)
  for rep in 1 2; do
    for f in off on; do
      mrun "gr-$f-$rep" "$GC_DEV" "${common[@]}" --graphs "$f" --logits-out "$d/gr-$f-$rep.f32" || ok=0
    done
  done
  if r=$(cmp_logits "$d/gr-off-1.f32" "$d/gr-on-1.f32" "$V"); then
    set -- $r
    kv max_abs_diff "$1"
    kv bit_identical "$(cmp -s "$d/gr-off-1.f32" "$d/gr-on-1.f32" && echo yes || echo no)"
    kv tokens_identical "$(same_ids "$d/gr-off-1.out" "$d/gr-on-1.out")"
    # the same kernels and jobs; only the routing's expf runs on the device: within TOL,
    # the same tokens (bit-identity reported)
    le "$1" "$TOL" && [ "$3" = 0 ] && [ "$(kv_get "$GC_KV" tokens_identical)" = yes ] || ok=0
  else
    kv logits_error "$r"
    ok=0
  fi
  local best_off best_on
  best_off=$(for rep in 1 2; do jget "$d/gr-off-$rep.json" tokens_per_s_decode; done | sort -g | tail -n 1)
  best_on=$(for rep in 1 2; do jget "$d/gr-on-$rep.json" tokens_per_s_decode; done | sort -g | tail -n 1)
  kv resident_tps_off "$best_off"
  kv resident_tps_on "$best_on"
  kv speedup "$(ratio "$best_on" "$best_off")"
  local sg sp why lo lon nodes emitted plan fails
  IFS=$'\x1f' read -r sg sp why lon nodes emitted plan fails <<<"$(jgets "$d/gr-on-1.json" graphs.steps_graph \
    graphs.steps_plain graphs.why_plain gpu.launches_per_token gpu.graph_nodes gpu.graph_emitted graphs.plan_ops \
    gpu.graph_failed)"
  lo=$(jget "$d/gr-off-1.json" gpu.launches_per_token)
  kv steps_graph "$sg"; kv steps_plain "$sp"; kv why_plain "$why"; kv graph_failed "$fails"
  kv launches_per_token_off "$lo"; kv launches_per_token_on "$lon"
  kv graph_nodes "$nodes"; kv graph_emitted "$emitted"; kv plan_ops "$plan"
  # every decode step a graph (n - 1: the first token comes from the prompt), one launch each,
  # the graph holding exactly the plan's operations
  [ "$sg" = "$((n - 1))" ] && [ "$sp" = 0 ] || ok=0
  [ -n "$plan" ] && [ "$nodes" = "$plan" ] && [ "$emitted" = "$plan" ] || ok=0
  le "$lon" 1.0001 || ok=0
  kv figure "resident $(fmt %.1f "$best_on") vs $(fmt %.1f "$best_off") tok/s ($(kv_get "$GC_KV" speedup)x), launches/token $(fmt %.1f "$lon") vs $(fmt %.1f "$lo"), nodes $nodes/plan $plan, max |dlogit| $(kv_get "$GC_KV" max_abs_diff)"
  kv goal ">= 1.3x decode tok/s, all resident"
  if [ "$GC_MODE" = rehearse ]; then # the CPU backend has no graph step: the commands and parsers ran
    kv status info
    kv reason "CPU rehearsal: no graph step on the CPU backend (why_plain: $why)"
  elif [ $ok = 0 ]; then kv status fail; kv reason "logits differ, a run failed, or the graph does not hold the plan"
  elif le 1.3 "$(kv_get "$GC_KV" speedup)"; then kv status pass
  else kv status miss; fi
}

step_graphs_offload() {
  # at 25 % in VRAM graphs do not apply (the store decides each step's copies): the runs
  # say so ("expert budget") and give the same logits with --graphs on and off
  local d=$GC_WORK/runs ib ids ok=1
  ib=$(offload_bundle)
  ids=$(fact ids40)
  if [ ! -s "$ib" ]; then kv status skip; kv reason "no inflated bundle ($ib)"; return; fi
  local oc=(-m "$ib" --expert-precision q8_0 --expert-mem "$(fact budget25)" --dynamic off --high q8_0
    --cpu-experts never --tokens "$ids" -n "$ND" --ignore-eos --ids)
  mrun gr25-off "$GC_DEV" "${oc[@]}" --graphs off --logits-out "$d/gr25-off.f32" || ok=0
  mrun gr25-on "$GC_DEV" "${oc[@]}" --graphs on --logits-out "$d/gr25-on.f32" || ok=0
  kv offload25_tps_off "$(jget "$d/gr25-off.json" tokens_per_s_decode)"
  kv offload25_tps_on "$(jget "$d/gr25-on.json" tokens_per_s_decode)"
  kv offload25_why "$(jget "$d/gr25-on.json" graphs.why_plain)"
  kv offload25_identical "$(cmp -s "$d/gr25-off.f32" "$d/gr25-on.f32" && echo yes || echo no)"
  kv offload25_launches_per_token "$(jget "$d/gr25-on.json" gpu.launches_per_token)"
  [ "$(kv_get "$GC_KV" offload25_why)" = "expert budget" ] && [ "$(kv_get "$GC_KV" offload25_identical)" = yes ] || ok=0
  kv figure "25 %: $(fmt %.1f "$(kv_get "$GC_KV" offload25_tps_on)") tok/s, op by op ($(kv_get "$GC_KV" offload25_why)), logits same: $(kv_get "$GC_KV" offload25_identical)"
  kv goal "graphs refused at 25 % (expert budget), logits same"
  if [ "$GC_MODE" = rehearse ]; then kv status info; kv reason "CPU rehearsal: no graph step on the CPU backend"
  elif [ $ok = 1 ]; then kv status pass
  else kv status fail; kv reason "a run failed, the reason is not \"expert budget\", or the logits differ"; fi
}

step_uma() {
  local d=$GC_WORK/runs tb ib ids V ok=1 r fig=""
  tb=$GC_WORK/trained.moeb
  ib=$(offload_bundle)
  ids=$(fact ids40)
  V=$(sed -n 's/.*"vocab_size"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p' "$MODEL/config.json")
  if ! grep -q -- '--uma' <<<"$("$GC_BIN/moe-run" --help 2>&1)"; then
    kv status option-missing
    kv reason "moe-run has no --uma"
    return
  fi
  local c label model opts
  for c in "resident|$tb|--expert-precision q8_0" "offload25|$ib|--expert-precision q8_0 --expert-mem $(fact budget25) --dynamic off --high q8_0 --cpu-experts never"; do
    IFS='|' read -r label model opts <<<"$c"
    if [ ! -s "$model" ]; then # the inflated bundle's step did not run (--only): say so, no failure
      [ "$label" = offload25 ] && { kv "${label}_skipped" "no inflated bundle (inflated-bundle not run)"; continue; }
      kv "${label}_error" "no bundle ($model)"; ok=0; continue
    fi
    local common=(-m "$model" --tokens "$ids" -n "$ND" --ignore-eos --ids)
    # shellcheck disable=SC2086 # options split on purpose
    mrun "uma-$label-plain" "$GC_DEV" "${common[@]}" $opts --logits-out "$d/uma-$label-plain.f32" || { ok=0; continue; }
    # shellcheck disable=SC2086
    mrun "uma-$label-uma" "$GC_DEV" "${common[@]}" $opts --uma --logits-out "$d/uma-$label-uma.f32" || { ok=0; continue; }
    if r=$(cmp_logits "$d/uma-$label-plain.f32" "$d/uma-$label-uma.f32" "$V"); then
      set -- $r
      kv "${label}_max_abs_diff" "$1"
      kv "${label}_bit_identical" "$(cmp -s "$d/uma-$label-plain.f32" "$d/uma-$label-uma.f32" && echo yes || echo no)"
      kv "${label}_tokens_identical" "$(same_ids "$d/uma-$label-plain.out" "$d/uma-$label-uma.out")"
      le "$1" "$TOL" && [ "$3" = 0 ] && [ "$(kv_get "$GC_KV" "${label}_tokens_identical")" = yes ] || ok=0
      fig+="$label d=$1 "
    else
      kv "${label}_error" "$r"
      ok=0
    fi
    local f tp fl db pb hc
    for f in plain uma; do
      IFS=$'\x1f' read -r tp fl db pb hc <<<"$(jgets "$d/uma-$label-$f.json" tokens_per_s_decode gpu.uma \
        gpu.peak_device_bytes gpu.peak_pinned_bytes gpu.h2d_copies)"
      kv "${label}_${f}_tps" "$tp"
      kv "${label}_${f}_uma_flag" "$fl"
      kv "${label}_${f}_device_bytes" "$db"
      kv "${label}_${f}_pinned_bytes" "$pb"
      kv "${label}_${f}_h2d_copies" "$hc"
    done
    fig+="($(fmt %.0f "$(kv_get "$GC_KV" "${label}_uma_tps")")/$(fmt %.0f "$(kv_get "$GC_KV" "${label}_plain_tps")") tok/s) "
  done
  kv figure "uma vs plain: ${fig% }"
  kv goal "logits same, report speed"
  if [ $ok = 1 ]; then kv status pass; else kv status fail; kv reason "--uma differs from the plain run or a run failed"; fi
}

step_launches() {
  # launches per decoded token (gpu.launches_per_token: kernels, copies and memsets the
  # host enqueued per one-token step; a graph launch is one), from the graphs step's runs
  local d=$GC_WORK/runs lo lon l25
  lo=$(jget "$d/gr-off-1.json" gpu.launches_per_token)
  lon=$(jget "$d/gr-on-1.json" gpu.launches_per_token)
  l25=$(jget "$d/gr25-on.json" gpu.launches_per_token)
  kv launches_per_token_off "$lo"; kv launches_per_token_on "$lon"; kv launches_per_token_25 "$l25"
  # what docs/architecture.md counts for the op-by-op path: 18 per MoE layer (no shared
  # expert) + 8 per step; the trained model has 4 MoE layers
  kv expected_off 80
  kv figure "resident: $(fmt %.1f "$lo") op by op, $(fmt %.1f "$lon") with graphs; 25 %: $(fmt %.1f "$l25")"
  kv goal "launches/token, +-graphs"
  if [ "$GC_MODE" = rehearse ]; then kv status info; kv reason "CPU rehearsal: the CPU backend counts no launches"
  elif [ -z "$lo" ] || [ -z "$lon" ]; then kv status fail; kv reason "no launches_per_token in the graphs step's runs"
  else kv status info; fi
}

# ======================================================================================
# the driver
# ======================================================================================

# steps_of: the step table as "name stage timeout" lines
steps_of() { echo "$STEP_TABLE" | awk 'NF == 3'; }

selected() { # selected NAME STAGE
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"* | *",$2,"*) return 0 ;; esac
  return 1
}

# run_step NAME STAGE TIMEOUT: the step under timeout, its output appended to the
# stage's log, its figures into WORK/steps/NAME.json
run_step() {
  local name=$1 stage=$2 t=$3 kvf=$GC_WORK/steps/$1.kv log=$OUTDIR/$2.log rc=0 t0 t1 left status reason
  : >"$kvf"
  left=$(awk -v d="$DEADLINE" -v n="$(now)" 'BEGIN { printf "%d", d - n }')
  {
    echo
    echo "==================== $stage / $name (timeout ${t} s, $(date -u +%H:%M:%S) UTC, ${left} s of the budget left)"
  } >>"$log"
  if [ "$left" -lt 10 ]; then
    printf 'status\tskip\nreason\tglobal time budget (%s s) spent\n' "$BUDGET" >>"$kvf"
    echo "skipped: global time budget spent" >>"$log"
  else
    [ "$t" -gt "$left" ] && t=$left
    t0=$(now)
    GC_KV=$kvf timeout -k 5 "$t" bash "$SELF" --step "$name" >>"$log" 2>&1 || rc=$?
    t1=$(now)
    status=$(kv_get "$kvf" status)
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      printf 'status\ttimeout\nreason\tkilled after %s s\n' "$t" >>"$kvf"
    elif [ $rc -ne 0 ]; then
      case "$status" in fail | skip | option-missing | not-implemented) ;; *) printf 'status\tfail\n' >>"$kvf" ;; esac
      [ -n "$(kv_get "$kvf" reason)" ] || printf 'reason\tthe step exited %s\n' "$rc" >>"$kvf"
    elif [ -z "$status" ]; then
      printf 'status\tinfo\n' >>"$kvf"
    fi
    printf 'seconds\t%s\n' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" >>"$kvf"
  fi
  status=$(kv_get "$kvf" status)
  reason=$(kv_get "$kvf" reason)
  echo "---- $name: $status${reason:+ ($reason)}" >>"$log"
  printf '%-8s %-16s %-15s %s\n' "$stage" "$name" "$status" "$(kv_get "$kvf" figure)" | cut -c1-120
  {
    printf '{"step": "%s", "stage": "%s", "timeout_s": %s, ' "$name" "$stage" "$3"
    json_kv "$kvf"
    printf '}'
  } >"$GC_WORK/steps/$name.json"
}

# write_summary MODE SECONDS: summary.json and summary.txt from WORK/steps
write_summary() {
  local mode=$1 secs=$2 first=1 name stage t kvf
  {
    printf '{"tool": "scripts/gpu-check.sh", "mode": "%s", "date_utc": "%s", "seconds": %s, "budget_s": %s, ' \
      "$mode" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$secs" "$BUDGET"
    printf '"build": "%s", "commit": "%s", "steps": [\n' "$(grep -h '^MOE_CUDA\|^cuda_architectures' "$GC_BIN/manifest.txt" 2>/dev/null | tr '\n' ' ')" \
      "$(sed -n 's/^commit=//p' "$GC_BIN/manifest.txt" 2>/dev/null)"
    while read -r name stage t; do
      [ -e "$GC_WORK/steps/$name.json" ] || continue
      [ $first = 1 ] || printf ',\n'
      first=0
      cat "$GC_WORK/steps/$name.json"
    done < <(steps_of)
    printf '\n]}\n'
  } >"$OUTDIR/summary.json.tmp" && mv "$OUTDIR/summary.json.tmp" "$OUTDIR/summary.json"
  {
    local env_kv=$GC_WORK/steps/env.kv
    local dev
    dev=$(kv_get "$env_kv" device)
    [ -n "$dev" ] && dev="$dev, driver $(kv_get "$env_kv" driver), CUDA $(kv_get "$env_kv" cuda_driver_version)"
    echo "gpu-check ($mode): ${dev:-no GPU};" \
      "$(sed -n 's/^commit=//p' "$GC_BIN/manifest.txt" 2>/dev/null | cut -c1-12) $(sed -n 's/^dirty_files=/dirty /p' "$GC_BIN/manifest.txt" 2>/dev/null); ${secs} s of ${BUDGET}"
    printf '%-7s %-15s %-15s %6s  %-50s %s\n' stage step status s "key figure" goal
    while read -r name stage t; do
      kvf=$GC_WORK/steps/$name.kv
      [ -e "$kvf" ] || continue
      printf '%-7s %-15s %-15s %6s  %-50s %s\n' "$stage" "$name" "$(kv_get "$kvf" status)" "$(kv_get "$kvf" seconds)" \
        "$(kv_get "$kvf" figure | cut -c1-50)" "$(kv_get "$kvf" goal | cut -c1-28)"
    done < <(steps_of)
    # the reasons of the steps that did not pass, one line per distinct reason
    while read -r name stage t; do
      kvf=$GC_WORK/steps/$name.kv
      [ -e "$kvf" ] || continue
      case "$(kv_get "$kvf" status)" in pass | info | "") continue ;; esac
      printf '%s\t%s\n' "$name" "$(kv_get "$kvf" reason)"
    done < <(steps_of) | awk -F'\t' '$2 != "" { if (!($2 in who)) order[++n] = $2; who[$2] = who[$2] (who[$2] == "" ? "" : ",") $1 }
      END { if (n) print "reasons:"; for (i = 1; i <= n; i++) printf "  %s: %s\n", who[order[i]], substr(order[i], 1, 150) }' 
    echo "files: $OUTDIR/{summary.txt,summary.json,parity.log,offload.log,graphs.log}"
  } >"$OUTDIR/summary.txt"
}

# unpack_build: GC_BIN, the folder of the programs (a build folder, or a carry unpacked)
unpack_build() {
  if [ -f "$BUILD/carry.tar.xz" ]; then
    GC_BIN=$GC_WORK/build
    rm -rf "$GC_BIN"
    mkdir -p "$GC_BIN"
    tar -xJf "$BUILD/carry.tar.xz" -C "$GC_BIN" || { echo "gpu-check: cannot unpack $BUILD/carry.tar.xz" >&2; return 1; }
  else
    GC_BIN=$(cd "$BUILD" && pwd)
  fi
}

# resolve_libs: link the libraries the programs need and this machine lacks from the
# carry's lib/ into WORK/lib, which LD_LIBRARY_PATH then names
resolve_libs() {
  local lib=$GC_WORK/lib missing l pass
  mkdir -p "$lib"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for pass in 1 2 3 4 5 6; do
    missing=$(for b in moe-run moe-prep tests/inflate-moe tests/bench-cuda tests/test-cuda; do
      [ -x "$GC_BIN/$b" ] && ldd "$GC_BIN/$b" 2>/dev/null
    done | awk '/not found/ { print $1 }' | sort -u)
    [ -n "$missing" ] || return 0
    for l in $missing; do
      if [ -e "$GC_BIN/lib/$l" ]; then
        ln -sf "$GC_BIN/lib/$l" "$lib/$l"
        echo "library $l: from the carry"
      elif [ "$pass" = 6 ]; then
        echo "library $l: MISSING (not on this machine, not in the carry)"
      fi
    done
  done
}

# find_cublas: the folder of libcublas.so.MAJOR (the backend dlopens it), added to
# LD_LIBRARY_PATH; GC_CUBLAS names the file found
find_cublas() {
  local maj f
  maj=$(sed -n 's/^cublas_major=//p' "$GC_BIN/manifest.txt" 2>/dev/null)
  maj=${maj:-13}
  f=$(ldconfig -p 2>/dev/null | awk -v n="libcublas.so.$maj" '$1 == n { print $NF; exit }')
  if [ -z "$f" ]; then
    for f in /usr/local/cuda/lib64/libcublas.so.$maj /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.$maj \
      /usr/local/cuda-*/lib64/libcublas.so.$maj; do
      [ -e "$f" ] && break
      f=""
    done
  fi
  if [ -z "$f" ] && command -v python3 >/dev/null 2>&1; then
    local sp
    for sp in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
      f=$(find "$sp/nvidia" -name "libcublas.so.$maj*" 2>/dev/null | head -n 1)
      [ -n "$f" ] && break
    done
  fi
  if [ -n "$f" ]; then
    GC_CUBLAS=$f
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"
    export LD_LIBRARY_PATH
    echo "cuBLAS: $f"
  else
    GC_CUBLAS=""
    echo "cuBLAS: libcublas.so.$maj NOT FOUND"
  fi
  export GC_CUBLAS
}

# gpu_tests_list BUILD_DIR SRC: the gpu-labelled tests of a build's CTestTestfile.cmake,
# one per line: name, program, arguments (tab-separated, @BUILD@ / @SRC@ for the dirs)
gpu_tests_list() {
  local bd=$1 src=$2 f=$1/tests/CTestTestfile.cmake name
  [ -f "$f" ] || return 0
  for name in $(sed -n 's/^set_tests_properties(\[=\[\([^]]*\)\]=\] PROPERTIES .*LABELS "\([^"]*\)".*/\1 \2/p' "$f" |
      awk '{ n = split($2, l, ";"); for (i = 1; i <= n; i++) if (l[i] == "gpu") print $1 }'); do
    grep -F "add_test([=[$name]=] " "$f" | head -n 1 | grep -o '"[^"]*"' | tr -d '"' |
      sed -e "s#^$bd#@BUILD@#" -e "s#^$src#@SRC@#" | paste -s -d '\t' - | sed "s/^/$name\t/"
  done
}

# ---- --pack ---------------------------------------------------------------------------------
# sonames of Ubuntu 24.04's required packages and of its python3 (libstdc++6, zlib1g,
# libzstd1 and libgnutls30t64 for apt, libpcre2-8-0 for grep, libgmp10 for coreutils,
# libssl3t64 for python3.12): not carried unless --all-libs (about 5 MiB more, which
# the 64 MiB may not hold); MOE_GPU_CHECK_BASE_LIBS replaces the list. Small
# libraries are carried even where the image likely has them.
BASE_LIBS=${MOE_GPU_CHECK_BASE_LIBS:-"libstdc++.so.6 libgcc_s.so.1 libz.so.1 libzstd.so.1 libpcre2-8.so.0 libgmp.so.10
 libp11-kit.so.0 libgnutls.so.30 libnettle.so.8 libhogweed.so.6 libssl.so.3 libcrypto.so.3"}
BASE_LIBS=$(echo $BASE_LIBS)
pack() {
  local dest=$1 bd src stage f tests
  bd=$(cd "$BUILD" && pwd) || { echo "gpu-check --pack: no build folder $BUILD" >&2; return 1; }
  grep -q '^MOE_CUDA:BOOL=ON' "$bd/CMakeCache.txt" 2>/dev/null || {
    echo "gpu-check --pack: $bd is not a -DMOE_CUDA=ON build; configure it as the header of $0 says" >&2
    return 1
  }
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$bd/CMakeCache.txt")
  local archs
  archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$bd/CMakeCache.txt")
  case ";$archs;" in *";90;"* | *";90-real;"* | *";90a"*) ;; *)
    echo "gpu-check --pack: CMAKE_CUDA_ARCHITECTURES is '$archs': the H200 needs 90" >&2
    return 1 ;;
  esac
  tests=$(gpu_tests_list "$bd" "$src")
  local targets="moe-run moe-prep inflate-moe bench-cuda bench-io"
  targets+=" $(echo "$tests" | awk -F'\t' 'NF { print $1 }' | tr '\n' ' ')"
  echo "== build: $targets"
  # shellcheck disable=SC2086 # target list split on purpose
  PATH=$PATH:/usr/local/cuda/bin nice cmake --build "$bd" -j"$(nproc)" --target $targets | grep -v '^\[' || true
  stage=$(mktemp -d)
  mkdir -p "$stage/tests" "$stage/lib"
  for f in moe-run moe-prep tests/inflate-moe tests/bench-cuda tests/bench-io; do
    [ -x "$bd/$f" ] || { echo "gpu-check --pack: $bd/$f was not built" >&2; rm -rf "$stage"; return 1; }
    cp "$bd/$f" "$stage/$f"
  done
  while IFS=$'\t' read -r name exe _; do
    [ -n "$name" ] || continue
    f=${exe//@BUILD@/$bd}
    [ -x "$f" ] || { echo "gpu-check --pack: gpu test $name: $f missing" >&2; rm -rf "$stage"; return 1; }
    cp "$f" "$stage/${exe#@BUILD@/}"
  done <<<"$tests"
  printf '%s\n' "$tests" >"$stage/gpu-tests.tsv"
  # the shared libraries they load, less glibc's own (always there, and must match the
  # loader) and, unless --all-libs, those every Ubuntu 24.04 has under the same name
  # (BASE_LIBS: the GPU machine's image is Ubuntu 24.04 with Python 3.12; leaving them
  # out keeps the carry near 4 MiB instead of 9)
  local l
  for l in $(find "$stage" -type f -perm -u+x -exec ldd {} \; | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
    case "$(basename "$l")" in
      libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | ld-linux*.so.* | libresolv.so.*) continue ;;
    esac
    if [ "$ALL_LIBS" = 0 ] && [[ " $BASE_LIBS " == *" $(basename "$l") "* ]]; then continue; fi
    cp -L "$l" "$stage/lib/$(basename "$l")"
  done
  local nv
  nv=$(PATH=$PATH:/usr/local/cuda/bin nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
  {
    echo "MOE_CUDA=ON"
    echo "cuda_architectures=$archs"
    echo "build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$bd/CMakeCache.txt")"
    echo "nvcc=$nv"
    echo "cublas_major=${nv%%.*}"
    echo "commit=$(git -C "$src" rev-parse HEAD 2>/dev/null)"
    echo "dirty_files=$(git -C "$src" status --porcelain 2>/dev/null | grep -c .)"
    echo "packed_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "glibc=$(ldd --version | head -n 1 | awk '{ print $NF }')"
    echo "build_dir=$bd"
  } >"$stage/manifest.txt"
  mkdir -p "$dest"
  rm -f "$dest/carry.tar.xz"
  XZ_OPT=-9e tar -cJf "$dest/carry.tar.xz.tmp" -C "$stage" . && mv "$dest/carry.tar.xz.tmp" "$dest/carry.tar.xz"
  cp "$stage/manifest.txt" "$stage/gpu-tests.tsv" "$dest/"
  echo "== $dest: $(du -b "$dest/carry.tar.xz" | awk '{ printf "%.2f MiB", $1 / 1048576 }') compressed, from:"
  (cd "$stage" && find . -type f | sort | xargs du -b | awk '{ printf "  %8.2f MiB  %s\n", $1 / 1048576, $2 }')
  rm -rf "$stage"
  # what travels: tracked + untracked-not-ignored files, shared/, and the carry
  local tree carry total
  tree=$(cd "$src" && git ls-files -z -c -o --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  [ -d "$src/shared" ] && tree=$((tree + $(du -sb "$src/shared" | awk '{ print $1 }')))
  carry=$(du -sb "$dest" | awk '{ print $1 }')
  total=$((tree + carry))
  awk -v t="$tree" -v c="$carry" -v s="$total" 'BEGIN {
    printf "travels: working tree %.2f MiB + carry %.2f MiB = %.2f MiB of 64 MiB\n", t / 1048576, c / 1048576, s / 1048576 }'
  if [ "$total" -gt $((64 * 1048576)) ]; then
    echo "gpu-check --pack: over the device tool's 64 MiB" >&2
    return 1
  fi
  echo "run tool: command 'bash scripts/gpu-check.sh \"\$OUT\" --build $(basename "$dest")', carry [\"$(basename "$dest")\"], timeout_s 600"
}

# ---- --dry-run checks -----------------------------------------------------------------------
# check WHAT OK: one line of the dry run's check list; counts failures
check() {
  if [ "$2" = 0 ]; then printf '  ok       %s\n' "$1"; else printf '  MISSING  %s\n' "$1"; CHECK_FAILS=$((CHECK_FAILS + 1)); fi
}

dry_checks() {
  local cuda=0 b o sub help opts
  CHECK_FAILS=0
  echo "== checks (build $BUILD -> $GC_BIN)"
  if [ -f "$GC_BIN/manifest.txt" ]; then
    grep -q '^MOE_CUDA=ON' "$GC_BIN/manifest.txt" && cuda=1
  elif grep -q '^MOE_CUDA:BOOL=ON' "$GC_BIN/CMakeCache.txt" 2>/dev/null; then
    cuda=1
  fi
  if [ $cuda = 0 ] && [ "$CTEST" = 1 ]; then
    echo "  note     $GC_BIN is not a -DMOE_CUDA=ON build: the CUDA programs are not checked"
  else
    check "a -DMOE_CUDA=ON build ($GC_BIN)" $((1 - cuda))
  fi
  for b in moe-run moe-prep tests/inflate-moe; do
    [ -x "$GC_BIN/$b" ]
    check "program $b" $?
  done
  if [ $cuda = 1 ]; then
    [ -x "$GC_BIN/tests/bench-cuda" ]
    check "program tests/bench-cuda" $?
    grep -q cuda <<<"$("$GC_BIN/moe-run" --version 2>&1)"
    check "moe-run --version lists the cuda backend" $?
    local list=$GC_WORK/gpu-tests.tsv n=0 name exe args
    while IFS=$'\t' read -r name exe args; do
      [ -n "$name" ] || continue
      n=$((n + 1))
      exe=${exe//@BUILD@/$GC_BIN}
      [ -x "${exe//@SRC@/$ROOT}" ]
      check "gpu test $name: ${exe//@SRC@/$ROOT}" $?
      local a
      for a in $args; do
        case "$a" in @SRC@/*) [ -e "${a//@SRC@/$ROOT}" ]; check "  its input ${a#@SRC@/}" $? ;; esac
        case "$a" in @BUILD@/*.d) ;; @BUILD@/*) [ -e "${a//@BUILD@/$GC_BIN}" ]; check "  its input ${a#@BUILD@/}" $? ;; esac
      done
    done <"$list"
    [ $n -gt 0 ]
    check "at least one gpu-labelled test ($n)" $?
  fi
  if [ -x "$GC_BIN/moe-run" ]; then
    help=$("$GC_BIN/moe-run" --help 2>&1)
    for o in $RUN_OPTS; do
      grep -q -e "^ *${o}[ ,=]" -e ", ${o}[ =]" -e "^ *${o}\$" <<<"$help"
      check "moe-run option $o" $?
    done
  fi
  if [ -x "$GC_BIN/moe-prep" ]; then
    for o in $PREP_OPTS; do
      sub=${o%%:*}
      opts=${o#*:}
      # the help captured first: grep -q leaving early would SIGPIPE a writer (pipefail)
      grep -q -e "^ *${opts}[ ,=]" -e ", ${opts}[ =]" <<<"$("$GC_BIN/moe-prep" "$sub" --help 2>&1)"
      check "moe-prep $sub option $opts" $?
    done
  fi
  for f in "$MODEL/model.safetensors" "$MODEL/config.json" "$MODEL/tokenizer.json" "$CALIB" "$PROMPT_SRC" \
    tests/bench/bench-offload.sh tests/bench/make_synthetic_checkpoint.py tests/fixtures/models; do
    [ -e "$f" ]
    check "input $f" $?
  done
  local tools="timeout od awk paste sed dd stat cmp seq ldd nproc df"
  [ -f "$BUILD/carry.tar.xz" ] && tools+=" tar xz"
  for t in $tools; do
    command -v "$t" >/dev/null 2>&1
    check "tool $t" $?
  done
  # a carry older than the sources it was built from
  if [ -f "$BUILD/carry.tar.xz" ] && command -v git >/dev/null 2>&1 && git rev-parse HEAD >/dev/null 2>&1; then
    local pc newer
    pc=$(sed -n 's/^commit=//p' "$GC_BIN/manifest.txt")
    newer=$(find formats runtime tools datasets tests/bench CMakeLists.txt -newer "$BUILD/carry.tar.xz" \
      \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name CMakeLists.txt \) 2>/dev/null | wc -l)
    [ "$pc" = "$(git rev-parse HEAD)" ] || echo "  note     the carry was packed at commit ${pc:0:12}, HEAD is $(git rev-parse --short=12 HEAD)"
    [ "$newer" = 0 ] || echo "  note     $newer source file(s) changed since the carry was packed: pack again (--pack)"
  fi
  if [ "$(python_numpy)" = yes ]; then
    echo "  ok       python3 with numpy (synth-make)"
  else
    echo "  note     no python3 with numpy here: synth-make would report skip (the GPU machine has both)"
  fi
  return 0
}

python_numpy() { "$PY" -c 'import numpy' >/dev/null 2>&1 && echo yes || echo no; }

# start_synth_gen: make the synthetic model in the background (single-threaded numpy)
start_synth_gen() {
  local s=$GC_WORK/synth
  [ "$(fact python_numpy)" = yes ] || return 0
  echo "$(date -u +%H:%M:%S) UTC" >"$GC_WORK/synth-gen.start"
  (
    t0=$(now)
    rc=0
    # shellcheck disable=SC2086 # dimensions split on purpose
    nice -n 5 "$PY" tests/bench/make_synthetic_checkpoint.py "$s" $SYNTH_DIMS >"$GC_WORK/synth-gen.log" 2>&1 &
    echo $! >"$GC_WORK/synth-gen.pypid"
    wait $! || rc=$?
    awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }' >"$GC_WORK/synth-gen.seconds"
    echo "$rc" >"$GC_WORK/synth-gen.rc"
  ) &
  echo $! >"$GC_WORK/synth-gen.pid"
  SYNTH_PID=$!
  echo "synthetic model: generating in the background (pid $SYNTH_PID): $PY tests/bench/make_synthetic_checkpoint.py $s $SYNTH_DIMS"
}

# stop_synth_gen: end the background generation if it still runs (at exit)
stop_synth_gen() {
  [ -n "${SYNTH_PID:-}" ] || return 0
  [ -e "$GC_WORK/synth-gen.rc" ] && return 0
  kill "$(cat "$GC_WORK/synth-gen.pypid" 2>/dev/null)" "$SYNTH_PID" 2>/dev/null
  return 0
}

main() {
  OUTDIR=""
  BUILD=""
  ONLY=""
  MODE=run
  CTEST=0
  WORK=/tmp/moe-gpu-check
  KEEP=0
  THREADS=$(nproc 2>/dev/null || echo 2)
  BUDGET=450
  SYNTH_TYPE=q4_k
  PY=${MOE_GPU_CHECK_PYTHON:-python3}
  local do_pack=0 dest=""
  ALL_LIBS=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --step) shift; "step_${1//-/_}"; exit $? ;;
      --build) BUILD=$2; shift 2 ;;
      --only) ONLY=$2; shift 2 ;;
      --dry-run) MODE=dry-run; shift ;;
      --ctest) MODE=dry-run; CTEST=1; shift ;;
      --rehearse) MODE=rehearse; shift ;;
      --work) WORK=$2; shift 2 ;;
      --keep-work) KEEP=1; shift ;;
      --threads) THREADS=$2; shift 2 ;;
      --budget) BUDGET=$2; shift 2 ;;
      --synth-type) SYNTH_TYPE=$2; shift 2 ;;
      --pack) do_pack=1; shift ;;
      --all-libs) ALL_LIBS=1; shift ;;
      -h | --help) usage; exit 0 ;;
      -*) echo "gpu-check: unknown option '$1' (see --help)" >&2; exit 2 ;;
      *)
        if [ $do_pack = 1 ] && [ -z "$dest" ]; then dest=$1
        elif [ -z "$OUTDIR" ]; then OUTDIR=$1
        else echo "gpu-check: one output folder only ('$1')" >&2; exit 2
        fi
        shift ;;
    esac
  done
  case "$THREADS$BUDGET" in *[!0-9]*) echo "gpu-check: --threads and --budget take integers" >&2; exit 2 ;; esac
  if [ $do_pack = 1 ]; then
    BUILD=${BUILD:-build-gpu}
    pack "${dest:-build-gpu-carry}"
    exit $?
  fi
  [ -n "$OUTDIR" ] || { echo "gpu-check: no output folder (see --help)" >&2; exit 2; }
  if [ -z "$BUILD" ]; then
    for b in build-gpu-carry build-gpu build; do [ -d "$b" ] && { BUILD=$b; break; }; done
    BUILD=${BUILD:-build}
  fi
  [ -d "$BUILD" ] || { echo "gpu-check: no build folder '$BUILD' (--build)" >&2; exit 1; }
  if [ -n "$ONLY" ]; then
    local w
    for w in ${ONLY//,/ }; do
      steps_of | awk -v w="$w" '$1 == w || $2 == w { f = 1 } END { exit !f }' ||
        { echo "gpu-check: --only: no step or stage '$w'" >&2; exit 2; }
    done
  fi
  if [ "$MODE" = run ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "gpu-check: no GPU found (nvidia-smi missing or failing): dry run instead"
    MODE=dry-run
  fi
  mkdir -p "$OUTDIR" || exit 1
  OUTDIR=$(cd "$OUTDIR" && pwd)
  rm -f "$OUTDIR"/summary.json "$OUTDIR"/summary.txt "$OUTDIR"/parity.log "$OUTDIR"/offload.log "$OUTDIR"/graphs.log
  if [ "$MODE" = dry-run ]; then
    WORK=${TMPDIR:-/tmp}/moe-gpu-check-dry.$$
    trap 'rm -rf "$WORK"' EXIT
  fi
  [ $KEEP = 1 ] || rm -rf "$WORK"
  mkdir -p "$WORK/steps" "$WORK/facts" "$WORK/runs" || exit 1
  GC_WORK=$(cd "$WORK" && pwd)
  unpack_build || exit 1
  rm -f "$GC_WORK"/steps/*
  export GC_WORK GC_BIN GC_THREADS=$THREADS GC_MODE=$MODE GC_SYNTH_TYPE=$SYNTH_TYPE
  export XDG_CACHE_HOME=$GC_WORK/cache PY
  export GC_DEV=cuda GC_FFN=8192 GC_RUN_TIMEOUT=60
  SYNTH_DIMS="--hidden 2048 --ffn 5632 --layers 8 --experts 8 --vocab 32000 --heads 16 --kv-heads 4"
  if [ "$MODE" = rehearse ]; then
    GC_DEV=cpu
    GC_FFN=1024
    SYNTH_DIMS="--hidden 512 --ffn 1024 --layers 2 --experts 4 --vocab 32000 --heads 8 --kv-heads 2"
    export MOE_CPU_INT=0 # both sides of every comparison on the CPU's float products
  fi
  [ -f "$GC_BIN/gpu-tests.tsv" ] && cp "$GC_BIN/gpu-tests.tsv" "$GC_WORK/gpu-tests.tsv" ||
    gpu_tests_list "$GC_BIN" "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$GC_BIN/CMakeCache.txt" 2>/dev/null)" >"$GC_WORK/gpu-tests.tsv"
  START=$(now)
  DEADLINE=$(awk -v s="$START" -v b="$BUDGET" 'BEGIN { printf "%.0f", s + b }')
  export DEADLINE BUDGET OUTDIR ROOT

  if [ "$MODE" = dry-run ]; then
    dry_checks
    echo "== plan (mode run on a GPU; budget $BUDGET s; work $WORK; threads $THREADS)"
    local name stage t sum=0
    while read -r name stage t; do
      selected "$name" "$stage" || continue
      printf '  %-8s %-16s timeout %4s s\n' "$stage" "$name" "$t"
      sum=$((sum + t))
      printf 'status\tskip\nreason\tskipped: no GPU (dry run)\n' >"$GC_WORK/steps/$name.kv"
      printf '{"step": "%s", "stage": "%s", "timeout_s": %s, %s}' "$name" "$stage" "$t" "$(json_kv "$GC_WORK/steps/$name.kv")" \
        >"$GC_WORK/steps/$name.json"
    done < <(steps_of)
    echo "  (sum of the timeouts $sum s; the global budget $BUDGET s stops the run before 8 minutes)"
    write_summary dry-run 0
    if [ "$CHECK_FAILS" -gt 0 ]; then
      echo "gpu-check: dry run: $CHECK_FAILS check(s) failed" >&2
      exit 1
    fi
    if [ "$CTEST" = 1 ] && ! grep -q '^MOE_CUDA:BOOL=ON' "$GC_BIN/CMakeCache.txt" 2>/dev/null && [ ! -f "$GC_BIN/manifest.txt" ]; then
      echo "gpu-check: build without CUDA: checked what it has (skip)"
      exit 77
    fi
    echo "skipped: no GPU (dry run: every program, test, option and input checked)"
    exit 0
  fi

  # ---- run (or rehearse) ----
  ulimit -c 0
  {
    echo "gpu-check ($MODE) $(date -u +%Y-%m-%dT%H:%M:%SZ); root $ROOT; build $BUILD -> $GC_BIN; work $GC_WORK"
    cat "$GC_BIN/manifest.txt" 2>/dev/null
    resolve_libs >"$GC_WORK/libs.txt" # not in a pipe: it exports LD_LIBRARY_PATH
    cat "$GC_WORK/libs.txt"
    find_cublas
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  } >>"$OUTDIR/parity.log" 2>&1
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" GC_CUBLAS="${GC_CUBLAS:-}"
  fact_set python_numpy "$(python_numpy)"
  # prompts: 40 tokens of held-out text (parity), ~500 bytes of another slice (speed)
  local ids
  ids=$("$GC_BIN/moe-run" -m "$MODEL" --tokenize -p "$(head -c 600 "$PROMPT_SRC")" 2>>"$OUTDIR/parity.log" | tr -d ' \n' | cut -d, -f1-$NP)
  [ "$(echo "$ids" | tr ',' '\n' | grep -c .)" = "$NP" ] || ids=$(seq 0 $((NP - 1)) | awk '{ printf "%s%d", (NR > 1 ? "," : ""), (37 * $1 + 11) % 4096 }')
  fact_set ids40 "$ids"
  echo "IDS40=$ids" >>"$OUTDIR/parity.log"
  local half
  half=$(($(wc -l <"$PROMPT_SRC") / 2))
  tail -n +"$half" "$PROMPT_SRC" | awk '{ s = s $0 "\n"; if (length(s) >= 500) { printf "%s", s; exit } }' >"$GC_WORK/prompt.txt"
  SYNTH_PID=""
  if selected synth-make parity; then start_synth_gen >>"$OUTDIR/parity.log" 2>&1; fi
  trap 'stop_synth_gen' EXIT

  printf '%-8s %-16s %-15s %s\n' stage step status "key figure"
  local name stage t
  while read -r name stage t; do
    selected "$name" "$stage" || continue
    run_step "$name" "$stage" "$t"
  done < <(steps_of)
  local secs
  secs=$(awk -v a="$START" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')
  write_summary "$MODE" "$secs"
  echo
  cat "$OUTDIR/summary.txt"
  exit 0
}

main "$@"
