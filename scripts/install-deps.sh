#!/usr/bin/env bash
# Install the Debian/Ubuntu packages the project builds with, if any are missing.
# Safe to run repeatedly: it only calls apt-get when something is absent.
# --fuzz also installs clang and libFuzzer for the optional -DMOE_BUILD_FUZZ=ON
# build (docs/fuzzing.md); CI does not need them.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libzstd-dev libhdf5-dev libcsv-dev libcjson-dev
      libpcre2-dev libutf8proc-dev libxxhash-dev zlib1g-dev libmicrohttpd-dev curl)
if [ "${1:-}" = "--fuzz" ]; then
  pkgs+=(clang libclang-rt-dev)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
