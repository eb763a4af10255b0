# Sourced by chainer-ab.sh and fleet-h200.sh (which set L, D, PY, site and say): Chainer 1.24 and what
# its children import installed into $site, CUDA 13's cuBLAS/cuRAND on LD_LIBRARY_PATH, nvcc 11.2 unpacked
# (sets $nvcc112).

nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
say "$($PY --version) at $(command -v $PY)"

# Chainer 1.24 (its bundled CuPy v1 is the package `cupy`), numpy 1.26.4, six, platformdirs, filelock: apart,
# first on the children's PYTHONPATH (the scripts put --site there), shadowing this Python's numpy and CuPy.
rm -rf "$site"
platformdirs=$(ls $L/platformdirs-*.whl $D/platformdirs-*.whl 2>/dev/null | head -n 1)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
  $L/chainer-1.24.0-*.whl $L/numpy-1.26.4-*.whl $L/six-*.whl $platformdirs $D/filelock-*.whl || exit 2

# cuBLAS/cuRAND of CUDA 13 for the bundled CuPy (as tests/legacy/run_gpu.sh)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

# nvcc 11.2 (knows up to sm_86), called as `nvcc` through ab_chainer.py's logging wrapper
nvcc112=${LEGACY_NVCC112:-/tmp/tk/nvcc112/bin/nvcc112}
if [ ! -x "$nvcc112" ]; then
  [ -f .device/nvcc112.tar.xz ] || { say "carry .device/nvcc112.tar.xz"; exit 2; }
  mkdir -p /tmp/tk && tar -xJf .device/nvcc112.tar.xz -C /tmp/tk || exit 2
  nvcc112=/tmp/tk/nvcc112/bin/nvcc112
fi
