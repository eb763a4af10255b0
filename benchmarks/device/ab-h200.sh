#!/usr/bin/env bash
# Device call, from the repository root on the H200: the A/B of record.
#   1. CuPy 14 through the start-up hook, cold and warm, 100 distinct ElementwiseKernels per fresh process,
#      3 rotated rounds; arms: stock CuPy, 0.4.0 (commit 4f6f762, flat layout), this tree (packages)
#      (`python benchmarks/run.py cupy-ab`: benchmarks/ab_cupy.py);
#   2. when .device/legacy is carried: Chainer 1.24's CuPy v1 with nvcc 11.2, 0.4.0 against this tree,
#      cold and warm, 2 rounds (chainer-ab.sh: `python benchmarks/run.py chainer-ab`).
# Stage HERE first: `bash benchmarks/device/stage.sh` (.device/run24: filelock/platformdirs wheels and the
# old trees as git archives, ~1 MiB); for part 2 also tests/legacy/build.sh (.device/legacy) and
# `cp ../shared/toolkits/nvcc112.tar.xz .device/`.  Carry: .device/run24 (part 1 alone), plus
# .device/legacy and .device/nvcc112.tar.xz (~53 MiB in all).  The machine's own CuPy 14 is used.
# Within 9 minutes: part 1 starts no round past AB_BUDGET_S (default 230 s), part 2 none past 200 s of its own.
# Set-up through setup.sh (shared with the other device scripts), line for line what this script did.
set -u
OUT=${OUT:-/tmp/ab-h200-out}
TAG=ab-h200
. benchmarks/device/setup.sh
PY=python3  # the Python this script has always installed into, whatever PYTHON says
ls $D/pb040.tar $D/filelock-*.whl >/dev/null || { say "run benchmarks/device/stage.sh here and carry $D"; exit 2; }
site_wheels /tmp/site $D/*.whl
unpack_tree pb040 $D/pb040.tar
gpu_line

say "1. CuPy 14 A/B: stock, 0.4.0, this tree"
PYTHONPATH=/tmp/site timeout $((${AB_BUDGET_S:-230} + 90)) python3 benchmarks/run.py cupy-ab \
  --tree 0.4.0=/tmp/pb040 --tree now="$PWD" --rounds "${AB_ROUNDS:-3}" --budget-s "${AB_BUDGET_S:-230}" \
  --child-timeout 110 --out "$OUT/cupy14-ab" > "$OUT/cupy14-ab.log" 2>&1
say "rc=$?"
grep -E "^(check|round|budget)" "$OUT/cupy14-ab.log" | cut -c1-200
cat "$OUT/cupy14-ab/summary.md" 2>/dev/null || tail -n 40 "$OUT/cupy14-ab.log"

if [ -d .device/legacy ] && [ -f .device/nvcc112.tar.xz ]; then
  say "2. Chainer 1.24 A/B: 0.4.0, this tree"
  CHAINER_AB_BASE=0.4.0=pb040.tar CHAINER_AB_STOCK13=0 CHAINER_AB_ROUNDS=${CHAINER_AB_ROUNDS:-2} \
    CHAINER_AB_BUDGET_S=${CHAINER_AB_BUDGET_S:-200} OUT="$OUT" bash benchmarks/device/chainer-ab.sh
else
  say "2. skipped: .device/legacy and .device/nvcc112.tar.xz not carried"
fi
say "done"
