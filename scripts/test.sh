#!/usr/bin/env bash
# The README's second command: install what is missing, build, run the whole test
# suite with ctest; then rebuild with AddressSanitizer + UndefinedBehaviorSanitizer
# and run the tests again (all but the GPU ones and the slow model-quality
# check, which only reruns the same arithmetic on more tokens); compile the CUDA
# backend when the toolkit is installed (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

scripts/install-deps.sh

cuda_flag=-DMOE_CUDA=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  cuda_flag=-DMOE_CUDA=ON
fi

echo "== build (release, $cuda_flag)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$cuda_flag" >/dev/null
cmake --build build -j"$jobs"
echo "== tests"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMOE_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
echo "== tests under sanitizers"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs" -LE "gpu|slow")
