# Sourced by cupy14-hook-and-slice.sh, cupy14-chainer-legacy.sh and cupy14-chainer-fleet.sh: the set-up
# (setup.sh: the wheels, 0.2.0's tree and nvcc 11.2 unpacked), then the CuPy 14 A/B (stock, 0.2.0, this
# tree, this tree with PTXBACKEND_NVRTC_PCH=1) with ROUNDS rounds within BUDGET seconds.
set -u
TAG=cupy14-ab
. benchmarks/device/setup.sh
site_wheels /tmp/site $D/*.whl
unpack_tree pb020 $D/pb020.tar
unpack_nvcc112
gpu_line

say "1. CuPy 14 A/B"
PYTHONPATH=/tmp/site timeout $((BUDGET + 60)) python3 benchmarks/run.py cupy-ab --tree 0.2.0=/tmp/pb020 \
  --tree now="$PWD" --tree pch="$PWD" --arm-env pch:PTXBACKEND_NVRTC_PCH=1 --rounds "$ROUNDS" --budget-s "$BUDGET" --child-timeout 110 --out "$OUT/cupy14-ab" \
  > "$OUT/cupy14-ab.log" 2>&1
say "rc=$?"
