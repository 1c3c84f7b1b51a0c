#!/bin/sh
# check-include-graph.sh SRC_DIR - the folders' include graph follows the
# layering of docs/architecture.md and has no cycle:
#
#   formats <- datasets
#           <- runtime's rooms, in this order: tokenizer <- model <- backend
#              (the seam and the registry) <- offload (store, cache core,
#              tuning, GPU tiers, Twiddler) <- cpu, cuda (the backends)
#              <- runtime (session, sampler, hardware meter)
#           <- tools/common
#           <- the stage folders (tools/quantize, profile, calibrate, plan)
#           <- the CLIs (tools/moe-prep.c, runtime/cli, and every *-cmd.c:
#              a subcommand's CLI half lives beside its stage's library),
#              and beside them runtime/server (moe-serve: the HTTP server
#              and its engine thread over the session, and its CLI, which
#              uses runtime/cli's option tables)
#
# Every #include "x.h" of every .c/.h/.cu file is resolved to the folder that
# holds x.h; an edge from a lower layer to a higher one, an include between
# two stage folders or between the two backends, or a cycle (found with
# tsort) fails with the offending file and include. Exit 0 when the graph is
# clean.
set -u
cd "$1" || exit 2
folders="formats datasets runtime/tokenizer runtime/model runtime/backend runtime/offload runtime/cpu runtime/cuda
runtime runtime/cli runtime/server tools tools/common tools/quantize tools/profile tools/calibrate tools/plan"
rank() {
    case "$1" in
    formats) echo 0 ;; datasets) echo 10 ;;
    runtime/tokenizer) echo 20 ;; runtime/model) echo 21 ;; runtime/backend) echo 22 ;; runtime/offload) echo 23 ;;
    runtime/cpu|runtime/cuda) echo 24 ;; runtime) echo 25 ;;
    tools/common) echo 30 ;; tools/quantize|tools/profile|tools/calibrate|tools/plan) echo 40 ;;
    tools|runtime/cli|runtime/server) echo 50 ;; *) echo 99 ;;
    esac
}
# every folder that holds sources must be in the list above (a new room is placed in the layering)
for f in $(find runtime formats datasets tools -name '*.[ch]' -o -name '*.cu' | sed 's|/[^/]*$||' | sort -u); do
    case " $(echo $folders) " in *" $f "*) ;; *) echo "folder $f is not in check-include-graph.sh's layering"; exit 1 ;; esac
done
map=$(mktemp) edges=$(mktemp)
trap 'rm -f "$map" "$edges"' EXIT
for d in $folders; do
    for h in "$d"/*.h; do [ -e "$h" ] && echo "$(basename "$h") $d"; done
done >"$map"
dups=$(awk '{print $1}' "$map" | sort | uniq -d)
if [ -n "$dups" ]; then echo "header names in more than one folder: $dups"; exit 1; fi
bad=0
for d in $folders; do
    for f in "$d"/*.c "$d"/*.h "$d"/*.cu; do
        [ -e "$f" ] || continue
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
            to=$(awk -v h="$(basename "$inc")" '$1 == h {print $2}' "$map")
            if [ -z "$to" ] || [ "$to" = "$d" ]; then continue; fi
            echo "$to $d" >>"$edges"
            rf=$(rank "$d") rt=$(rank "$to")
            case "$f" in *-cmd.c) rf=50 ;; esac # a subcommand's CLI half: the CLI layer
            if [ "$rt" -gt "$rf" ]; then
                echo "layering: $f (layer $rf) includes $inc from $to (layer $rt)"; bad=1
            elif [ "$rt" -eq 40 ] && [ "$rf" -eq 40 ]; then
                echo "stage includes another stage: $f includes $inc from $to"; bad=1
            elif [ "$rt" -eq 24 ] && [ "$rf" -eq 24 ]; then
                echo "backend includes another backend: $f includes $inc from $to"; bad=1
            fi
        done
    done
done
if ! sort -u "$edges" | tsort >/dev/null 2>&1; then
    echo "the folder graph has a cycle:"; sort -u "$edges" | tsort 2>&1 >/dev/null | sed 's/^/  /'; bad=1
fi
[ "$bad" -eq 0 ] && echo "include graph: $(sort -u "$edges" | wc -l) folder edges, layered, no cycle"
exit "$bad"
