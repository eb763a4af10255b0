#!/usr/bin/env bash
# Device call (issue 24, closing runs), from the repository root on the H200:
#   1. stock CuPy 14 against the hook of 0.2.0 and of this tree again, 4 rounds (benchmarks/run.py cupy-ab);
#   2. Chainer 1.24 with nvcc 11.2 through the hook of 0.2.0 and of this tree (benchmarks/device/chainer-ab.sh);
#   3. the legacy harness, steps a-e and g (tests/legacy/run_gpu.sh).
# Carries .device/run24, .device/legacy and .device/nvcc112.tar.xz (about 53 MiB).  About 9 minutes.
ROUNDS=4 BUDGET=170
. benchmarks/device/cupy14-ab-setup.sh
sed -n '1,20p' "$OUT/cupy14-ab/summary.md" 2>/dev/null || tail -n 30 "$OUT/cupy14-ab.log"

say "2. Chainer 1.24 A/B"
LEGACY_NVCC112=/tmp/tk/nvcc112/bin/nvcc112 bash benchmarks/device/chainer-ab.sh > "$OUT/chainer-ab-call.log" 2>&1
say "rc=$?"; grep -E "^(round|budget)" "$OUT/chainer-ab-call.log" | cut -c1-150; sed -n '/^| arm/,/^$/p' "$OUT/chainer-ab/summary.md" 2>/dev/null

say "3. legacy harness a-e, g"
left=$((575 - SECONDS))
if [ $left -gt 90 ]; then
  LEGACY_NVCC112=/tmp/tk/nvcc112/bin/nvcc112 LEGACY_BUDGET_S=$((left - 10)) OUT=$OUT/legacy \
    timeout $left bash tests/legacy/run_gpu.sh > /dev/null 2>&1
  say "rc=$?"; cat "$OUT/legacy/summary.txt" 2>/dev/null | tail -n 25
else
  say "skipped: $left s left"
fi
