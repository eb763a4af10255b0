#!/usr/bin/env bash
# Device call (issue 24, closing runs), from the repository root on the H200:
#   1. stock CuPy 14 against the start-up hook of 0.2.0 and of this tree (benchmarks/run.py cupy-ab, ABAB);
#   2. this repository's GPU tests (nvcc 11.2 present);
#   3. CuPy 14.2's own test slice (docs/compatibility.md) through the *installed* wheel's hook only, then
#      stock, for the same counts on the same machine.
# Carries .device/run24 (benchmarks/device/stage.sh), .device/nvcc112.tar.xz and .device/cupy14slice
# (tests.tar: `git archive v14.2.0 tests/conftest.py tests/cupy_tests/{__init__.py,core_tests,math_tests}` of a
# CuPy clone): about 35 MiB.  Fits in 9.5 minutes: the A/B stops starting rounds past 270 s.
ROUNDS=6 BUDGET=270
. benchmarks/device/cupy14-ab-setup.sh
grep -E "^(check|round|budget)" "$OUT/cupy14-ab.log" | cut -c1-160
cat "$OUT/cupy14-ab/summary.md" 2>/dev/null | sed -n '1,20p' || tail -n 30 "$OUT/cupy14-ab.log"

say "2. GPU tests"
PTXBACKEND_TEST_NVCC112=/tmp/tk/nvcc112/bin/nvcc112 PYTHONPATH=/tmp/site:$PWD \
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests > "$OUT/gpu-tests.log" 2>&1
say "rc=$?"; tail -n 6 "$OUT/gpu-tests.log"

say "3. CuPy 14.2's slice through the installed hook"
python3 -m pip install -q --no-index --no-deps $D/platformdirs-*.whl $D/filelock-*.whl > /dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation . > "$OUT/install.log" 2>&1 || { say "install failed"; tail "$OUT/install.log"; }
( cd /tmp && python3 -m ptxbackend doctor 2>&1 | grep -E "^headers under" )  # inotify or every hit, per place
rm -rf /tmp/c14 && mkdir -p /tmp/c14 && tar -xf .device/cupy14slice/tests.tar -C /tmp/c14
SLICE="tests/cupy_tests/core_tests/test_elementwise.py tests/cupy_tests/core_tests/test_reduction.py
       tests/cupy_tests/core_tests/test_raw.py tests/cupy_tests/math_tests/test_arithmetic.py"
ARGS=(-q -p no:cacheprovider --timeout 240 -n 14 -m "not slow" -rfE)
( cd /tmp/c14 && python3 -c 'import cupy, cupy.cuda.compiler as c, ptxbackend; from ptxbackend.hook import cupy_integration as i; print("hook:", ptxbackend.__version__, ptxbackend.__file__, i.installed(), c._compile_module_with_cache.__module__)' )
( cd /tmp/c14 && CUPY_CACHE_DIR=/tmp/cupy-ptxb PTXBACKEND_CACHE_DIR=/tmp/ptxb-c14 PTXBACKEND_TARGET=compute_75 \
  timeout 200 python3 -m pytest "${ARGS[@]}" $SLICE > "$OUT/slice-hook.log" 2>&1 )
say "hook rc=$?"; tail -n 2 "$OUT/slice-hook.log"
echo "ptxbackend entries: $(find /tmp/ptxb-c14 -path '*v4*' -type f | grep -c . ) (by dir: $(find /tmp/ptxb-c14 -path '*v4*' -type f | sed 's#/[^/]*$##; s#.*/v4/##' | cut -d/ -f1-3 | sort | uniq -c | sort -rn | head -4 | tr '\n' ';'))"
echo "CuPy cache files (hook run): $(find /tmp/cupy-ptxb -type f | grep -c .)"
echo "ptxbackend warnings in the hook run: $(grep -c 'ptxbackend' "$OUT/slice-hook.log")"
if [ $SECONDS -lt 440 ]; then
  ( cd /tmp/c14 && CUPY_CACHE_DIR=/tmp/cupy-stock PTXBACKEND_DISABLE=1 \
    timeout $((560 - SECONDS)) python3 -m pytest "${ARGS[@]}" $SLICE > "$OUT/slice-stock.log" 2>&1 )
  say "stock rc=$?"; tail -n 2 "$OUT/slice-stock.log"
else
  say "stock slice skipped: too little time left"
fi
