#!/usr/bin/env bash
# Device call, from the repository root on the H200: Chainer 1.24's CuPy v1 through the start-up hook of
# ptxbackend 0.2.0 and of this working tree, both with nvcc 11.2 (target auto: compute_86 PTX), plus stock
# CuPy v1 with CUDA 13's nvcc for reference (first round only); fresh processes, 100 distinct kernels,
# ABAB rounds (benchmarks/run.py chainer-ab).
# Carries .device/legacy (tests/legacy/build.sh), .device/nvcc112.tar.xz (cp ../shared/toolkits/nvcc112.tar.xz
# .device/) and .device/run24 (benchmarks/device/stage.sh: platformdirs/filelock wheels, pb020.tar):
# about 52 MiB.
# Fits in about 4 minutes: setup ~15 s; a tree arm's round ~35-40 s (cold ~0.3 s/kernel with nvcc 11.2,
# warm a few s), stock13 ~50-60 s (round 0 only); no round is started that the longest time each arm took
# so far would push past 225 s from the start of this script, and `timeout 260` stops it hard (results.json
# and summary.md are rewritten after every child).
set -u
OUT=${OUT:-/tmp/chainer-ab-out}
TAG=chainer-ab
. benchmarks/device/setup.sh
site=/tmp/chainer-ab-site

# CHAINER_AB_BASE: the baseline tree, NAME=TAR in $D (default 0.2.0=pb020.tar; ab-h200.sh: 0.4.0=pb040.tar)
BASE=${CHAINER_AB_BASE:-0.2.0=pb020.tar}
need $L/chainer-1.24.0-*.whl "$D/${BASE#*=}" $D/filelock-*.whl
gpu_line
say "$($PY --version) at $(command -v $PY)"
chainer_site "$site"
unpack_nvcc112  # nvcc 11.2 (knows up to sm_86), called as `nvcc` through ab_chainer.py's logging wrapper
unpack_tree chainer-ab-base "$D/${BASE#*=}"  # the baseline tree
say "setup done in ${SECONDS}s"

nvcc13=/usr/local/cuda/bin/nvcc
[ -x "$nvcc13" ] || nvcc13=$(command -v nvcc)
budget=$((${CHAINER_AB_BUDGET_S:-225} - SECONDS))  # from this script's start
# CHAINER_AB_BUDGET_S (225), CHAINER_AB_ROUNDS (5), CHAINER_AB_STOCK13 (1: the reference arm in round 0)
# CHAINER_AB_EXTRA: more arguments, e.g. --dry-run to check the setup on a machine without a GPU
timeout 260 "$PY" benchmarks/run.py chainer-ab --site "$site" --nvcc112 "$nvcc112" --nvcc13 "$nvcc13" \
  --tree "${BASE%%=*}"=/tmp/chainer-ab-base --tree now="$PWD" $([ "${CHAINER_AB_STOCK13:-1}" = 1 ] && echo --stock13) \
  --rounds "${CHAINER_AB_ROUNDS:-5}" --budget-s "$budget" --child-timeout 120 \
  --out "$OUT/chainer-ab" ${CHAINER_AB_EXTRA:-} > "$OUT/chainer-ab.log" 2>&1
echo "rc=$? after ${SECONDS}s"
grep -E "^(toolkit|check|round|budget)" "$OUT/chainer-ab.log" | cut -c1-300
cat "$OUT/chainer-ab/summary.md" 2>/dev/null || tail -n 40 "$OUT/chainer-ab.log"
