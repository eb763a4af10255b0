#!/usr/bin/env bash
# Build chainer==1.24.0 (with its bundled CuPy v1) from the PyPI sdist as a cp312 wheel, on the CPU
# machine, and stage what the GPU run needs in .device/legacy/.  From the repository root:
#
#     bash tests/legacy/build.sh
#
# Network: PyPI only (pip download).  CuPy v1's own tests are copied from $CUPY_V1_TESTS
# (default /tmp/cupy_v1_tests; see README.md for how to get them).  Scratch: $LEGACY_BUILD_DIR
# (default /tmp/ptxb-legacy-build; downloads and the build venv are reused between runs).
# LEGACY_SKIP_CHECK=1 skips the CPU validation at the end.
#
# cuDNN: cupy.cuda.cudnn is built against cuDNN 7.1.2 from cupy-cuda80 7.8.0's wheel (cudnn.h and
# libcudnn.so.7 extracted here at build time, never committed; $LEGACY_CUDNN_WHEEL, else the copy
# tests/cudnn7/build.sh downloaded, else pip downloads it).  LEGACY_CUDNN=0 builds without it (as before).
# With cuDNN, .device/legacy-cudnn/ gets what run_cudnn_gpu.sh needs (see README.md, "cuDNN on").
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
here=$repo/tests/legacy
work=${LEGACY_BUILD_DIR:-/tmp/ptxb-legacy-build}
out=$repo/.device/legacy
tests_src=${CUPY_V1_TESTS:-/tmp/cupy_v1_tests}
cuda=${LEGACY_CUDA:-/usr/local/cuda}
python=${LEGACY_PYTHON:-$(pyenv root)/versions/3.12.1/bin/python}
jobs=$(nproc 2>/dev/null || echo 2)
say() { echo "[build $((SECONDS))s] $*"; }
die() { echo "[build] ERROR: $*" >&2; exit 1; }
# pip, minus the noise of this machine's pip.conf (extra index locations that do not exist)
pip_() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }

[ -x "$python" ] || die "no Python 3.12 at $python (set LEGACY_PYTHON)"
[ -f "$cuda/include/cuda.h" ] || die "no CUDA headers at $cuda/include (set LEGACY_CUDA)"
[ -x "$cuda/bin/nvcc" ] || die "no nvcc at $cuda/bin/nvcc"
mkdir -p "$work/dl"
with_cudnn=${LEGACY_CUDNN:-1}

# 1. The build interpreter: Python 3.12, Cython 0.29 (Cython 3 needs one more fix), numpy 1.26.4,
#    and a setuptools that still has pkg_resources: pip runs the *unpatched* setup.py for the
#    sdist's metadata during `pip download`.
reqs="Cython==0.29.37 numpy==1.26.4 setuptools==69.5.1 wheel==0.43.0"
if [ "$(cat "$work/venv/requirements" 2>/dev/null)" != "$reqs" ]; then
  say "build venv: $reqs"
  rm -rf "$work/venv"
  "$python" -m venv "$work/venv"
  pip_ "$work/venv/bin/python" -m pip install -q --disable-pip-version-check $reqs
  echo "$reqs" > "$work/venv/requirements"
fi
vpy=$work/venv/bin/python

# 2. Downloads (PyPI; pip reuses what is already in $work/dl)
say "download: chainer 1.24.0 sdist, numpy/six/platformdirs wheels, cuBLAS/cuRAND 13 wheels"
pip_ "$vpy" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
  -d "$work/dl" chainer==1.24.0
pip_ "$vpy" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$work/dl" \
  numpy==1.26.4 six==1.17.0 platformdirs==4.3.6 filelock nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
sdist=$work/dl/chainer-1.24.0.tar.gz
[ -f "$sdist" ] || die "chainer-1.24.0.tar.gz not downloaded"

# 3. CUDA 13 pieces that are not in nvcc's toolkit here: cuBLAS/cuRAND headers and libraries from
#    NVIDIA's wheels (only .so.13/.so.10 inside: add the unversioned names the linker looks for),
#    and a link-only libcuda.so (no driver on this machine; see cuda_stub.c)
extra=$work/cuda
if [ ! -f "$extra/lib/libcurand.so" ] || [ ! -f "$extra/lib/libcublas.so" ]; then
  say "unpack cuBLAS/cuRAND headers and libraries"
  rm -rf "$extra" && mkdir -p "$extra/include" "$extra/lib"
  "$vpy" - "$extra" "$work"/dl/nvidia_cublas-13.0.2.14-*.whl "$work"/dl/nvidia_curand-10.4.0.35-*.whl <<'EOF'
import os, shutil, sys, zipfile
dest = sys.argv[1]
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")  # nvidia/cu13/{include,lib}/<file>
            if len(parts) == 4 and parts[0] == "nvidia" and parts[2] in ("include", "lib") and parts[3]:
                if parts[2] == "lib" and not parts[3].startswith(("libcublas.so", "libcublasLt.so", "libcurand.so")):
                    continue
                with z.open(name) as src, open(os.path.join(dest, parts[2], parts[3]), "wb") as dst:
                    shutil.copyfileobj(src, dst)
EOF
  ln -sf libcublas.so.13 "$extra/lib/libcublas.so"
  ln -sf libcurand.so.10 "$extra/lib/libcurand.so"
fi
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$extra/lib/libcuda.so" "$here/cuda_stub.c"
mkdir -p "$extra/rtstub" && ln -sf ../lib/libcuda.so "$extra/rtstub/libcuda.so.1"  # CPU checks only

# 3b. cuDNN 7.1.2 (the user's generation: CUDA 8) out of cupy-cuda80's wheel: its header to build
#     against and its library to link with (NVIDIA's files: extracted here, never committed)
cudnn_dir=$work/cudnn
if [ "$with_cudnn" = 1 ]; then
  cudnn_wheel=${LEGACY_CUDNN_WHEEL:-}
  for candidate in /tmp/ptxb-cudnn7-build/dl/cupy_cuda80-7.8.0-cp37-cp37m-manylinux1_x86_64.whl \
                   "$work"/dl/cupy_cuda80-7.8.0-cp37-cp37m-manylinux1_x86_64.whl; do
    [ -z "$cudnn_wheel" ] && [ -f "$candidate" ] && cudnn_wheel=$candidate
  done
  if [ -z "$cudnn_wheel" ]; then
    say "download cupy-cuda80==7.8.0 (210 MB: cuDNN 7.1.2's header and library)"
    pip_ "$vpy" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
      --platform manylinux1_x86_64 --python-version 3.7 -d "$work/dl" cupy-cuda80==7.8.0
    cudnn_wheel=$(ls "$work"/dl/cupy_cuda80-7.8.0-*.whl | head -n 1)
  fi
  if [ ! -f "$cudnn_dir/lib/libcudnn.so.7" ] || [ ! -f "$cudnn_dir/include/cudnn.h" ]; then
    say "extract cudnn.h and libcudnn.so.7 from $(basename "$cudnn_wheel")"
    rm -rf "$cudnn_dir" && mkdir -p "$cudnn_dir/include" "$cudnn_dir/lib"
    "$vpy" - "$cudnn_wheel" "$cudnn_dir" <<'EOF2'
import os, shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for member, dest in (("cupy/.data/include/cudnn.h", "include/cudnn.h"), ("cupy/.data/lib/libcudnn.so.7", "lib/libcudnn.so.7")):
        with z.open(member) as src, open(os.path.join(sys.argv[2], dest + ".tmp"), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.rename(os.path.join(sys.argv[2], dest + ".tmp"), os.path.join(sys.argv[2], dest))
EOF2
    ln -sf libcudnn.so.7 "$cudnn_dir/lib/libcudnn.so"
  fi
  grep -q '#define CUDNN_MAJOR 7' "$cudnn_dir/include/cudnn.h" || die "$cudnn_dir/include/cudnn.h is not cuDNN 7"
  [ "$(sha256sum < "$cudnn_dir/lib/libcudnn.so.7" | cut -d' ' -f1)" = \
    f7f1afa951ea854b05897990717eb947a8cdc7b3caf4348846736f49252e776f ] || die "libcudnn.so.7 is not cuDNN 7.1.2 for CUDA 8"
  cpath="$extra/include:$cudnn_dir/include"
  library_path="$extra/lib:$cudnn_dir/lib"
else
  cpath="$extra/include"
  library_path="$extra/lib"
fi

# 4. Fresh sources: the sdist, minus Cython 0.25's generated .cpp (they do not compile on
#    Python >= 3.11; Cython regenerates them), plus our patches
src=$work/src/chainer-1.24.0
rm -rf "$work/src" && mkdir -p "$work/src"
tar --no-same-owner -xzf "$sdist" -C "$work/src"
find "$src/cupy" -name '*.cpp' -delete
for p in "$here"/patches/*.patch; do
  say "patch $(basename "$p")"
  patch -d "$src" -p1 --forward --batch --no-backup-if-mismatch -s < "$p" || die "$(basename "$p") does not apply"
done

# 5. Build (CUDA_PATH: /usr/local/bin/nvcc may be a wrapper script, so do not let setup guess)
say "build the wheel (log: $work/build.log)"
rm -rf "$work/dist"
if ! (cd "$src" && env CUDA_PATH="$cuda" PATH="$cuda/bin:$PATH" CPATH="$cpath" \
      LIBRARY_PATH="$library_path" LD_LIBRARY_PATH="$library_path" CFLAGS="-g0" \
      "$vpy" setup.py build_ext -j "$jobs" bdist_wheel -d "$work/dist") > "$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log"
  die "setup.py failed"
fi
wheel=$(ls "$work"/dist/chainer-1.24.0-cp312-cp312-*.whl)

# 6. setup.py skips CUDA modules silently when a header or library check fails, and exits 0:
#    insist on all 13 extension modules, and on libcuda.so.1 being a dependency of cupy.cuda.driver
expected="cupy/core/core cupy/core/flags cupy/core/internal cupy/cuda/cublas cupy/cuda/curand
cupy/cuda/device cupy/cuda/driver cupy/cuda/function cupy/cuda/memory cupy/cuda/pinned_memory
cupy/cuda/profiler cupy/cuda/runtime cupy/util"
[ "$with_cudnn" = 1 ] && expected="$expected cupy/cuda/cudnn"  # skipped silently when cudnn.h is refused
listing=$("$vpy" -m zipfile -l "$wheel")
missing=""
for m in $expected; do
  echo "$listing" | grep -q "$m.cpython-312-x86_64-linux-gnu.so" || missing="$missing $m"
done
[ -z "$missing" ] || { grep -n "WARNING" "$work/build.log" || true; die "extension modules missing from the wheel:$missing"; }
built=$(find "$src/build" -name '*.so')
for so in $built; do
  nm -D --undefined-only "$so" | awk '{print $2}' | grep -E '^cu[A-Z]' | grep -v '@' || true
done | sort -u > "$work/driver-symbols.txt"
stubbed=$(nm -D --defined-only "$extra/lib/libcuda.so" | awk '{print $3}' | sort -u)
unstubbed=$(comm -23 "$work/driver-symbols.txt" <(echo "$stubbed"))
[ -z "$unstubbed" ] || die "add these driver functions to tests/legacy/cuda_stub.c: $unstubbed"
driver_so=$(echo "$built" | grep 'cupy/cuda/driver\.')
readelf -d "$driver_so" | grep -q 'NEEDED.*libcuda\.so\.1' || die "cupy.cuda.driver does not depend on libcuda.so.1"
if [ "$with_cudnn" = 1 ]; then
  cudnn_so=$(echo "$built" | grep 'cupy/cuda/cudnn\.')
  readelf -d "$cudnn_so" | grep -q 'NEEDED.*libcudnn\.so\.7' || die "cupy.cuda.cudnn does not depend on libcudnn.so.7"
  nm -D --undefined-only "$cudnn_so" | awk '{print $2}' | grep '^cudnn' | sort -u > "$work/cudnn-symbols.txt"
  nm -D --defined-only "$cudnn_dir/lib/libcudnn.so.7" | awk '{print $3}' | sort -u > "$work/cudnn-exports.txt"
  absent=$(comm -23 "$work/cudnn-symbols.txt" "$work/cudnn-exports.txt")
  [ -z "$absent" ] || die "cupy.cuda.cudnn imports what libcudnn.so.7 does not export: $absent"
  say "cupy.cuda.cudnn built: $(wc -l < "$work/cudnn-symbols.txt") cudnn* symbols, all exported by libcudnn.so.7"
fi
say "wheel OK: $(echo $expected | wc -w) extension modules; driver symbols $(tr '\n' ' ' < "$work/driver-symbols.txt")"

# 7. Stage for the GPU machine (.device/ is git-ignored; keep it small)
rm -rf "$out" && mkdir -p "$out"
cp "$wheel" "$work"/dl/numpy-1.26.4-cp312-cp312-manylinux*.whl "$work"/dl/six-1.17.0-*.whl \
   "$work"/dl/platformdirs-4.3.6-*.whl "$out/"
if [ -d "$tests_src" ]; then
  mkdir -p "$out/cupy_tests"
  cp -r "$tests_src"/. "$out/cupy_tests/"
  find "$out/cupy_tests" -name '__pycache__' -prune -exec rm -rf {} +
else
  say "WARNING: no CuPy v1 tests at $tests_src (CUPY_V1_TESTS): step g will be skipped on the GPU"
fi

# 8. CPU validation (no GPU here): import, train.py on numpy, the kernels through real compilers
if [ "${LEGACY_SKIP_CHECK:-0}" != 1 ]; then
  check=$work/check
  if [ ! -x "$check/venv/bin/python" ]; then
    "$python" -m venv "$check/venv"
    pip_ "$check/venv/bin/python" -m pip install -q --disable-pip-version-check pytest
  fi
  cpy=$check/venv/bin/python
  "$cpy" -m pip install -q --disable-pip-version-check --no-index --no-deps --force-reinstall "$out"/*.whl \
    "$work"/dl/filelock-*.whl
  export LD_LIBRARY_PATH="$extra/rtstub:$extra/lib:$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ "$with_cudnn" = 1 ] && export LD_LIBRARY_PATH="$cudnn_dir/lib:$LD_LIBRARY_PATH"
  say "check: import chainer, cupy (libcuda stub)"
  (cd /tmp && "$cpy" -c "import chainer, cupy; print('chainer', chainer.__version__, 'cupy.cuda available',
chainer.cuda.available, 'cudnn', chainer.cuda.cudnn_enabled)")
  if [ "$with_cudnn" = 1 ]; then
    say "check: cuDNN 7.1.2 through Chainer's own module (no GPU: version and descriptors only)"
    (cd /tmp && "$cpy" "$here/cudnn_cpu_check.py") || die "cupy.cuda.cudnn does not work against libcudnn.so.7"
  fi
  say "check: train.py on the CPU (numpy)"
  "$cpy" "$here/train.py" --device cpu --out "$check/train_cpu.json"
  nvcc112_args=()
  if [ -f "$repo/../shared/toolkits/nvcc112.tar.xz" ]; then
    [ -x "$check/tk/nvcc112/bin/nvcc112" ] || { mkdir -p "$check/tk" && tar -xJf "$repo/../shared/toolkits/nvcc112.tar.xz" -C "$check/tk"; }
    nvcc112_args=(--nvcc112 "$check/tk/nvcc112/bin/nvcc112")
  fi
  nvrtc_args=()
  nvrtc_whl=$(ls "$repo"/.device/nvidia_cuda_nvrtc_cu11-11.7.99-*.whl 2>/dev/null | head -n 1 || true)
  if [ -n "$nvrtc_whl" ]; then
    [ -d "$check/nvrtc" ] || "$cpy" -m pip install -q --no-index --no-deps --target "$check/nvrtc" "$nvrtc_whl"
    nvrtc_args=(--nvrtc "$(ls "$check"/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.* | grep -v builtins | head -n 1)")
  fi
  say "check: CuPy v1 kernels (carray.cuh + reduction) through nvcc 13 / nvcc 11.2 / NVRTC 11.7"
  rm -rf "$check/kernels"
  PATH="$cuda/bin:$PATH" PYTHONPATH="$repo" PTXBACKEND_CACHE_DIR="$check/kernels/ptxbackend-cache" \
    "$cpy" "$here/kernel_check.py" --out "$check/kernels" "${nvcc112_args[@]}" "${nvrtc_args[@]}"
  if [ -d "$out/cupy_tests" ]; then
    say "check: CuPy v1's tests are collected under pytest with the nose shim"
    (cd "$out/cupy_tests" && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$here/nose_shim" "$cpy" -m pytest -p no:cacheprovider \
      --collect-only -q core_tests/test_elementwise.py core_tests/test_reduction.py core_tests/test_userkernel.py \
      core_tests/test_carray.py core_tests/test_ndarray_reduction.py math_tests/test_arithmetic.py \
      math_tests/test_sumprod.py | tail -n 1)
  fi
fi

# 9. cuDNN: what run_cudnn_gpu.sh needs, in .device/legacy-cudnn/ (each call carries 64 MiB at most):
#    the wheels (also filelock, for ptxbackend's own venv), nvcc 11.2 (the hand fix's and the hook's compiler),
#    and the library in xz parts with SHA256SUMS (tests/cudnn7/build.sh makes those; reused)
if [ "$with_cudnn" = 1 ]; then
  staged=$repo/.device/legacy-cudnn
  rm -rf "$staged" && mkdir -p "$staged/wheels"
  cp "$out"/*.whl "$work"/dl/filelock-*.whl "$staged/wheels/"
  if [ ! -f "$repo/.device/cudnn7/SHA256SUMS" ]; then
    say "cuDNN parts: tests/cudnn7/build.sh (xz -9: minutes)"
    CUDNN7_WHEEL=$cudnn_wheel bash "$repo/tests/cudnn7/build.sh" > "$work/cudnn7-build.log" 2>&1 \
      || { tail -n 20 "$work/cudnn7-build.log"; die "tests/cudnn7/build.sh failed"; }
  fi
  cp "$repo"/.device/cudnn7/libcudnn.so.7.xz.part-* "$repo/.device/cudnn7/SHA256SUMS" "$staged/"
  nvcc112_src=${LEGACY_NVCC112_TARBALL:-$repo/../shared/toolkits/nvcc112.tar.xz}
  [ -f "$nvcc112_src" ] || nvcc112_src=/work/shared/toolkits/nvcc112.tar.xz
  [ -f "$nvcc112_src" ] && cp "$nvcc112_src" "$staged/nvcc112.tar.xz" || say "WARNING: no nvcc112.tar.xz: step c's hand fix will be skipped"
  say "cuDNN staged: $staged"
  du -sh "$staged"/* | sed 's/^/  /'
fi
say "done: $out"
ls -la "$out"
du -sh "$out"
