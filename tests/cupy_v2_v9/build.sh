#!/usr/bin/env bash
# Stage the real CuPy v2-v9 packages (issue 15) and CuPy 13.6.0 (issue 29) for the GPU run, on the CPU machine.
# From the repository root:
#
#     bash tests/cupy_v2_v9/build.sh            # 7.8.0 and 9.6.0
#     V2V9_VERSIONS=9.6.0 bash tests/cupy_v2_v9/build.sh
#     V2V9_VERSIONS=13.6.0 bash tests/cupy_v2_v9/build.sh
#
# For each version, .device/cupy_v2_v9/<version>/ gets:
#   python.tar.xz  pyenv's own interpreter prefix (it links libpython from that prefix, so it is unpacked at
#                  the same path on the GPU machine, which runs as root), stripped of its tests, with numpy,
#                  pytest and the real CuPy wheel installed (cupy/.data/lib and thrust dropped, see README)
#   libs.tar.xz    the CUDA libraries under the names the wheel asks for: the real CUDA 11.7 runtime and
#                  NVRTC 11.7 from NVIDIA's PyPI wheels, and generated stubs (stubgen.py) for the rest
#   wheels/        filelock and platformdirs for the interpreter (ptxbackend's own wheel is built there)
#   cupy_tests/    CuPy's own tests from the version's git tag, and the tag's pytest settings
#
# Network: PyPI only.  CuPy's tests come from a git clone of cupy/cupy with its tags: $CUPY_REPO (default
# /work/.mirror/cupy+cupy/repo; e.g. `git clone https://github.com/cupy/cupy`).  Scratch: $V2V9_BUILD_DIR
# (default /tmp/ptxb-v2v9-build; downloads are reused).  V2V9_SKIP_CHECK=1 skips the CPU import check.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
here=$repo/tests/cupy_v2_v9
work=${V2V9_BUILD_DIR:-/tmp/ptxb-v2v9-build}
cupy_repo=${CUPY_REPO:-/work/.mirror/cupy+cupy/repo}
pyroot=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
host_python=${V2V9_HOST_PYTHON:-python3}
say() { echo "[build $((SECONDS))s] $*"; }
die() { echo "[build] ERROR: $*" >&2; exit 1; }
pip_() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }

mkdir -p "$work/dl"
git -C "$cupy_repo" rev-parse -q --verify "refs/tags/v7.8.0" >/dev/null \
  || die "no CuPy git clone with tags at $cupy_repo (set CUPY_REPO; git clone https://github.com/cupy/cupy)"

# NVIDIA's CUDA 11.7 runtime and NVRTC, for both versions
pip_ "$host_python" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
  --platform manylinux1_x86_64 --python-version 3.8 -d "$work/dl" \
  nvidia-cuda-runtime-cu11==11.7.99 nvidia-cuda-nvrtc-cu11==11.7.99
cuda11=$work/cuda11
if [ ! -f "$cuda11/libnvrtc.so.11.2" ] || [ ! -f "$cuda11/libcudart.so.11.0" ] || [ ! -f "$cuda11/include/cuda_fp16.h" ]; then
  rm -rf "$cuda11" && mkdir -p "$cuda11"
  for w in "$work"/dl/nvidia_cuda_runtime_cu11-11.7.99-*.whl "$work"/dl/nvidia_cuda_nvrtc_cu11-11.7.99-*.whl; do
    (cd "$cuda11" && "$host_python" -m zipfile -e "$w" x)
  done
  mv "$cuda11"/x/nvidia/cuda_runtime/lib/libcudart.so.11.0 "$cuda11"/x/nvidia/cuda_nvrtc/lib/libnvrtc*.so* "$cuda11"/
  # CUDA 11.7's runtime headers: CuPy passes -I$CUDA_PATH/include and its kernels include cuda_fp16.h
  mv "$cuda11"/x/nvidia/cuda_runtime/include "$cuda11"/include
  rm -rf "$cuda11/x"
fi
ls "$cuda11"

build_version() {
  local version=$1 pyver wheel numpy cudart_name nvrtc_name stubs pytest=6.2.5
  case $version in
    7.8.0) pyver=3.7.16; wheel="cupy-cuda80==7.8.0"; numpy=1.19.5
           cudart_name=libcudart.so.8.0; nvrtc_name=libnvrtc.so.8.0
           stubs="libcublas.so.8.0 libcufft.so.8.0 libcurand.so.8.0 libcusparse.so.8.0 libcusolver.so.8.0" ;;
    9.6.0) pyver=3.8.18; wheel="cupy-cuda111==9.6.0"; numpy=1.21.6
           cudart_name=libcudart.so.11.0; nvrtc_name=libnvrtc.so.11.1
           stubs="libcublas.so.11 libcufft.so.10 libcurand.so.10 libcusparse.so.11 libcusolver.so.11" ;;
    # Issue 29: the last of lines 10-12, for the small program stock vs hook (steps a and b), linked like
    # 9.6.0 (the runtime and every library dynamically; 10.6.0's NVRTC symbols are @libnvrtc.so.11.1, and
    # 10-11 link NVTX); and 13.6.0, which links the runtime statically (libcudart.so.11.0 is staged but
    # unused).  11.6.0+ import nvrtc*@libnvrtc.so.11.2, which NVRTC 11.7 defines itself; 13's tests want
    # pytest >= 7.2.
    10.6.0|11.6.0|12.3.0|13.6.0) pyver=3.10.13; pytest=7.4.4
           cudart_name=libcudart.so.11.0; nvrtc_name=libnvrtc.so.11.2
           stubs="libcublas.so.11 libcufft.so.10 libcurand.so.10 libcusparse.so.11 libcusolver.so.11"
           case $version in
             10.6.0) wheel="cupy-cuda111==10.6.0"; numpy=1.22.4; nvrtc_name=libnvrtc.so.11.1
                     stubs="$stubs libnvToolsExt.so.1" ;;
             11.6.0) wheel="cupy-cuda11x==11.6.0"; numpy=1.24.4; stubs="$stubs libnvToolsExt.so.1" ;;
             *) wheel="cupy-cuda11x==$version"; numpy=1.26.4 ;;
           esac ;;
    *) die "unknown version $version (7.8.0, 9.6.0, 10.6.0, 11.6.0, 12.3.0 or 13.6.0)" ;;
  esac
  local short=${pyver%.*} src=$pyroot/versions/$pyver
  local out=$repo/.device/cupy_v2_v9/$version stage=$work/$version
  [ -x "$src/bin/python$short" ] || die "no pyenv Python $pyver at $src"
  say "== CuPy $version on Python $pyver"
  local prefix=$stage$src
  local site=$prefix/lib/python$short/site-packages
  if [ "${V2V9_REUSE_PYTHON:-0}" = 1 ] && [ -f "$out/python.tar.xz" ] && [ -d "$site/cupy" ]; then
    say "reusing the staged interpreter (V2V9_REUSE_PYTHON=1): $out/python.tar.xz"
    rm -rf "$stage/libs" "$stage/stubsrc" "$stage/cpucheck" "$stage/cuda" "$out/cupy_tests"
  else
  rm -rf "$stage" "$out" && mkdir -p "$stage" "$out/wheels"
  local pytag=cp${short/./}
  pip_ "$host_python" -m pip download -q --disable-pip-version-check --only-binary :all: --no-deps \
    --platform manylinux1_x86_64 --platform manylinux2014_x86_64 --python-version "$short" \
    --implementation cp -d "$work/dl/$pytag" "$wheel" "numpy==$numpy" "fastrlock==0.8.2" "six==1.16.0"
  # pip evaluates environment markers for this interpreter, not the target: 3.7's extra needs are named
  local extra=""
  [ "$short" = 3.7 ] && extra="importlib-metadata==6.7.0 zipp==3.15.0 typing-extensions==4.7.1"
  [ "$short" = 3.10 ] && extra="exceptiongroup==1.2.2 tomli==2.0.1"
  pip_ "$host_python" -m pip download -q --disable-pip-version-check --only-binary :all: \
    --python-version "$short" --implementation cp -d "$work/dl/$pytag" "pytest==$pytest" $extra
  pip_ "$host_python" -m pip download -q --disable-pip-version-check --only-binary :all: \
    --python-version "$short" --implementation cp -d "$out/wheels" filelock platformdirs

  # The interpreter, at the path it was built for (under $stage, tarred relative to /)
  mkdir -p "$(dirname "$prefix")"
  cp -a "$src" "$prefix"
  rm -rf "$prefix/lib/python$short/test" "$prefix/lib/python$short/idlelib" "$prefix/lib/python$short/tkinter" \
    "$prefix/lib/python$short/lib2to3/tests" "$prefix/lib/python$short/turtledemo" "$prefix/include" \
    "$prefix/lib/python$short/ensurepip" \
    "$prefix/share" "$prefix"/lib/python$short/config-* "$prefix"/lib/libpython*.a
  find "$prefix" -name __pycache__ -prune -exec rm -rf {} +
  # Its own pip installs into the copy (sys.prefix follows the executable); no bytecode, to stay small
  pip_ "$prefix/bin/python$short" -m pip install -q --disable-pip-version-check --no-index --no-compile \
    --find-links "$work/dl/$pytag" "$wheel" "numpy==$numpy" "pytest==$pytest"
  # cuDNN 7 and NCCL 2 (7.8.0 bundles 267 MB of them) are not used by the chosen tests; their modules are
  # optional imports.  thrust is dropped too: 7.8.0's cannot load against CUDA 11's runtime anyway
  # (cudaConfigureCall/cudaLaunch/cudaSetupArgument are gone), and 9.6.0's (57 MB) sorts, which no chosen
  # test does; CuPy imports both inside try/except ImportError.
  rm -rf "$site/cupy/.data/lib" "$site"/cupy/cuda/thrust.*.so
  # The wheels' extension modules carry their static symbol tables (core.so: 4.6 MB, 0.6 MB without); the
  # loader uses only the dynamic ones, which stay.  This is what makes 9.6.0 fit one 64 MiB carry.
  find "$site/cupy" "$site"/cupy_backends -name '*.so' -exec strip --strip-unneeded {} + 2>/dev/null || true
  find "$prefix" -name __pycache__ -prune -exec rm -rf {} +
  rm -rf "$site"/pip "$site"/pip-* "$site"/setuptools "$site"/setuptools-* "$site"/numpy/*/tests "$site"/numpy/tests
  # pip stays out: a venv made from this interpreter gets pip from the GPU machine's own (see run_gpu.sh)
  # -9: a 64 MiB dictionary finds the repeats across cub's many per-architecture kernels (9.6.0: 65 -> ~55 MB)
  tar -C "$stage" -cf - "${src#/}" | xz -T0 -9 > "$out/python.tar.xz"
  fi

  # The libraries, under the names the wheel asks for
  local libs=$stage/libs
  mkdir -p "$libs"
  cp "$cuda11"/libcudart.so.11.0 "$cuda11"/libnvrtc.so.11.2 "$cuda11"/libnvrtc-builtins.so.11.7 "$libs/"
  [ "$cudart_name" = libcudart.so.11.0 ] || ln -s libcudart.so.11.0 "$libs/$cudart_name"
  "$host_python" "$here/stubgen.py" "$site" "$stage/stubsrc" $stubs
  if [ "$nvrtc_name" = libnvrtc.so.11.2 ]; then
    :  # 11.6.0-13.6.0: the real NVRTC 11.7 under its own name
  elif [ "$nvrtc_name" = libnvrtc.so.8.0 ]; then
    ln -s libnvrtc.so.11.2 "$libs/$nvrtc_name"  # 7.8.0's modules ask for unversioned symbols: the name is enough
  else
    # 9.6.0's ask for nvrtc*@libnvrtc.so.11.1, which NVRTC 11.7 (@libnvrtc.so.11.2) does not define
    "$host_python" "$here/stubgen.py" --forward libnvrtc.so.11.2 "$site" "$stage/stubsrc" "$nvrtc_name"
    stubs="$stubs $nvrtc_name"
  fi
  for soname in $stubs; do
    gcc -shared -fPIC -O1 -Wl,-soname,"$soname" -Wl,--version-script,"$stage/stubsrc/$soname.map" \
      -o "$libs/$soname" "$stage/stubsrc/$soname.c" -ldl
  done
  cp "$stage/stubsrc/symbols.json" "$out/stub-symbols.json"
  mkdir -p "$stage/cuda" && cp -r "$cuda11/include" "$stage/cuda/include"
  tar -C "$stage" -cf - libs cuda | xz -T0 -9 > "$out/libs.tar.xz"

  # CuPy's own tests at the tag, with the tag's pytest settings (setup.cfg [tool:pytest]; 13: pyproject.toml)
  local settings=setup.cfg
  git -C "$cupy_repo" cat-file -e "v$version:$settings" 2>/dev/null || settings=pyproject.toml
  # 13.6.0 (issue 29) also gets cupyx.jit's tests: V2V9_TEST_FILES=../cupyx_tests/jit_tests/test_raw.py
  local jit=""
  [ "$version" = 13.6.0 ] && jit="tests/cupyx_tests/__init__.py tests/cupyx_tests/jit_tests"
  mkdir -p "$out/cupy_tests"
  git -C "$cupy_repo" archive "v$version" tests/conftest.py tests/cupy_tests/__init__.py \
    tests/cupy_tests/core_tests tests/cupy_tests/math_tests "$settings" $jit | tar -x -C "$out/cupy_tests"

  if [ "${V2V9_SKIP_CHECK:-0}" != 1 ]; then
    # import cupy on this machine: no driver here, so a libcuda.so.1 whose every function aborts
    # (generated like the stubs, from the modules' imports).  Catches a missing symbol or library.
    # CuPy 13 links the CUDA runtime statically, which opens libcuda.so.1 only at the first CUDA call.
    mkdir -p "$stage/cpucheck"
    local driver_users  # counted, not `grep -q`: under pipefail its early exit would fail the pipeline
    driver_users=$(find "$site/cupy" "$site/cupy_backends" -name '*.so' -exec readelf -d {} + 2>/dev/null \
      | grep -c 'NEEDED.*\[libcuda\.so\.1\]' || true)
    if [ "$driver_users" -gt 0 ]; then
      "$host_python" "$here/stubgen.py" "$site" "$stage/cpucheck" libcuda.so.1 >/dev/null
      gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stage/cpucheck/libcuda.so.1" "$stage/cpucheck/libcuda.so.1.c"
    fi
    LD_LIBRARY_PATH=$libs:$stage/cpucheck PYTHONDONTWRITEBYTECODE=1 "$prefix/bin/python$short" -c "
import cupy, cupy.cuda.compiler as c, inspect, numpy
f = getattr(c, '_compile_module_with_cache', None) or c.compile_with_cache
print('import ok: cupy', cupy.__version__, 'numpy', numpy.__version__, f.__name__, inspect.signature(f))
try:
    print('NVRTC through the stand-in name:', c._get_nvrtc_version())
except Exception as exc:  # CuPy 13 picks its NVRTC by the runtime's version, which needs libcuda.so.1
    if 'InsufficientDriver' not in str(exc):
        raise
    import ctypes
    v = (ctypes.c_int(), ctypes.c_int())
    ctypes.CDLL('libnvrtc.so.11.2').nvrtcVersion(ctypes.byref(v[0]), ctypes.byref(v[1]))
    print('NVRTC: CuPy asks the CUDA runtime for its version first, which needs a driver; libnvrtc.so.11.2 '
          'directly:', (v[0].value, v[1].value))
" 2> "$stage/cpucheck.err" || { cat "$stage/cpucheck.err"; die "import cupy $version failed on the CPU machine"; }
    # e.g. 'no version information available': a stand-in that does not look like the real library
    [ ! -s "$stage/cpucheck.err" ] || { cat "$stage/cpucheck.err"; die "the dynamic loader complained"; }
  fi
  say "staged $out: $(du -sh "$out" | cut -f1) ($(du -ch "$out"/*.tar.xz | tail -n 1 | cut -f1) in tarballs)"
}

for version in ${V2V9_VERSIONS:-7.8.0 9.6.0}; do
  build_version "$version"
done
