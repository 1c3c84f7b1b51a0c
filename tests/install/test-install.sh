#!/bin/sh
# test-install.sh BUILD_DIR SOURCE_DIR CC - `cmake --install` of the build tree
# into a temporary prefix, then what a user of the installed copy does: build
# tests/install/hello-moe.c with `pkg-config --cflags --libs --static moe`,
# write a bundle with the installed moe-prep, and run the program on a committed
# tiny checkpoint and that bundle. Needs no network.
set -eu
build=$1 src=$2 cc=${3:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/moe-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
for f in bin/moe-run bin/moe-serve bin/moe-prep include/moe/moe-model.h include/moe/moe-bundle.h include/moe/moe-dataset.h; do
    [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
libdir=$(find "$prefix" -name moe.pc -path '*/pkgconfig/*' -exec dirname {} \; | head -n 1)
[ -n "$libdir" ] || { echo "moe.pc not installed"; exit 1; }
if find "$prefix/include" -name '*-impl.h' | grep -q .; then echo "a private *-impl.h was installed"; exit 1; fi
for f in moe-opt.h moe-options.h moe-cuda.h moe-adapt.h; do
    [ ! -e "$prefix/include/moe/$f" ] || { echo "installed a header that is not public: $f"; exit 1; }
done
# every installed header: says what it is for in its first comment, has
# extern "C" guards, and compiles on its own (C11, and C++ when there is a
# C++ compiler)
cxx=$(command -v c++ || command -v g++ || true)
for h in "$prefix"/include/moe/*.h; do
    b=$(basename "$h")
    sed -n 2p "$h" | grep -q "^ \* $b - " || { echo "$b: the first comment does not begin \" * $b - what it is for\""; exit 1; }
    grep -q 'extern "C"' "$h" || { echo "$b: no extern \"C\" guard"; exit 1; }
    printf '#include <moe/%s>\nint moe_header_alone;\n' "$b" >"$tmp/alone.c"
    "$cc" -std=c11 -Wall -Werror -fsyntax-only -I"$prefix/include" "$tmp/alone.c" || { echo "$b does not compile alone (C)"; exit 1; }
    if [ -n "$cxx" ]; then
        cp "$tmp/alone.c" "$tmp/alone.cpp"
        "$cxx" -std=c++17 -fsyntax-only -I"$prefix/include" "$tmp/alone.cpp" || { echo "$b does not compile alone (C++)"; exit 1; }
    fi
done
export PKG_CONFIG_PATH="$libdir"
flags=$(pkg-config --cflags --libs --static moe)
case $flags in *"$prefix"*) ;; *) echo "moe.pc does not point into the prefix: $flags"; exit 1 ;; esac
# shellcheck disable=SC2086 # the flags are a word list
"$cc" -std=c11 -o "$tmp/hello-moe" "$src/tests/install/hello-moe.c" $flags
model=$src/tests/fixtures/models/olmoe-f32
"$prefix/bin/moe-prep" quantize "$model" -o "$tmp/olmoe.moeb" --experts q8_0,q4_0 -t 1 >"$tmp/quantize.log" 2>&1 ||
    { cat "$tmp/quantize.log"; exit 1; }
out=$("$tmp/hello-moe" "$model" "$tmp/olmoe.moeb")
expect="layers 2 experts 5
backend cpu, logits finite
bundle ok
bundle layers 2 experts 5 precisions 2"
if [ "$out" != "$expect" ]; then
    printf 'hello-moe printed:\n%s\nexpected:\n%s\n' "$out" "$expect"
    exit 1
fi
echo "installed copy OK: $out" | head -n 1
