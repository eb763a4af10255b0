# Sourced by cupy14-hook-and-slice.sh and cupy14-chainer-legacy.sh: the wheels, 0.2.0's tree and nvcc 11.2 unpacked,
# then the CuPy 14 A/B (stock, 0.2.0, this tree, this tree with PTXBACKEND_NVRTC_PCH=1) with ROUNDS rounds
# within BUDGET seconds.
export PYTHONUNBUFFERED=1
set -u
D=.device/run24
say() { echo "[cupy14-ab ${SECONDS}s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site $D/*.whl || exit 2
rm -rf /tmp/pb020 && mkdir -p /tmp/pb020 /tmp/tk && tar -xf $D/pb020.tar -C /tmp/pb020 || exit 2
tar -xJf .device/nvcc112.tar.xz -C /tmp/tk || exit 2
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader

say "1. CuPy 14 A/B"
PYTHONPATH=/tmp/site timeout $((BUDGET + 60)) python3 benchmarks/run.py cupy-ab --tree 0.2.0=/tmp/pb020 \
  --tree now="$PWD" --tree pch="$PWD" --arm-env pch:PTXBACKEND_NVRTC_PCH=1 --rounds "$ROUNDS" --budget-s "$BUDGET" --child-timeout 110 --out "$OUT/cupy14-ab" \
  > "$OUT/cupy14-ab.log" 2>&1
say "rc=$?"
