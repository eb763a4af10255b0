#!/usr/bin/env bash
# One device call for issues 24 and 27 on landed code, from the repository root on the H200:
#   1. CuPy 14: stock against the hook of 0.2.0 and of this tree (cupy14-ab-setup.sh: run.py cupy-ab);
#   2. Chainer 1.24 + nvcc 11.2: 0.2.0 against this tree (chainer-ab.sh, without the stock13 reference);
#   3. Chainer 1.24 + nvcc 11.2 as two machines of one fleet store (fleet-h200.sh).
# Carries .device/run24, .device/nvcc112.tar.xz, .device/legacy and .device/fleet/valkey-server (~56 MiB).
# About 7.5 minutes with the defaults below (each part stops starting rounds at its own budget).
export PYTHONUNBUFFERED=1
ROUNDS=${ROUNDS:-3} BUDGET=${BUDGET:-130}
. benchmarks/device/cupy14-ab-setup.sh
grep -E "^(check|round|budget)" "$OUT/cupy14-ab.log" | cut -c1-160
sed -n '1,40p' "$OUT/cupy14-ab/summary.md" 2>/dev/null || tail -n 30 "$OUT/cupy14-ab.log"
say "2. Chainer A/B"
CHAINER_AB_STOCK13=0 CHAINER_AB_ROUNDS=${CHAINER_AB_ROUNDS:-2} CHAINER_AB_BUDGET_S=${CHAINER_AB_BUDGET_S:-150} \
  bash benchmarks/device/chainer-ab.sh
say "3. the fleet"
CHAINER_FLEET_ROUNDS=${CHAINER_FLEET_ROUNDS:-2} CHAINER_FLEET_BUDGET_S=${CHAINER_FLEET_BUDGET_S:-110} \
  bash benchmarks/device/fleet-h200.sh
say "done"
