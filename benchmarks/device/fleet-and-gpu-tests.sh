#!/usr/bin/env bash
# Device call (issues 13/14): GPU tests, the fleet store tests, the legacy harness's step h (two machines of one
# fleet), the warm-hit A/B before/after the store seam, and the fleet benchmark on the H200.
. benchmarks/device/setup.sh
D=.device/run3
site_wheels --no-compile /tmp/site $D/platformdirs-*.whl .device/fleet/redis-*.whl
export PYTHONPATH=/tmp/site
unpack_nvcc112
export PTXBACKEND_TEST_VALKEY_SERVER=$PWD/.device/fleet/valkey-server
gpu_line
echo "== gpu tests + fleet tests"
PTXBACKEND_TEST_NVCC112=/tmp/tk/nvcc112/bin/nvcc112 PYTHONPATH=/tmp/site:$PWD \
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests tests/test_fleet.py tests/test_remote_store.py > $OUT/gpu-tests.log 2>&1
echo "rc=$?"; tail -n 8 $OUT/gpu-tests.log
echo "== legacy harness, step h (two machines of one fleet)"
LEGACY_NVCC112=/tmp/tk/nvcc112/bin/nvcc112 LEGACY_STEPS=h OUT=$OUT/legacy timeout 200 bash tests/legacy/run_gpu.sh > /dev/null 2>&1
echo "rc=$?"; tail -n 12 $OUT/legacy/summary.txt 2>/dev/null || tail -n 30 $OUT/legacy/run_gpu.log
echo "== warm hit A/B: before the seam (557a9b2) vs after"
PYTHONPATH=/tmp/site timeout 120 python3 benchmarks/run.py hit --before $D/pb-before --pairs 8 --out $OUT/hit-ab.json > $OUT/hit-ab.log 2>&1
echo "rc=$?"; tail -n 12 $OUT/hit-ab.log
echo "== fleet benchmark on the H200"
PYTHONPATH=/tmp/site timeout 150 python3 benchmarks/run.py --sections fleet --no-plots --out $OUT/bench-fleet > $OUT/bench-fleet.log 2>&1
echo "rc=$?"; grep -i "target" $OUT/bench-fleet.log | grep -v "not measured"; sed -n '/## 7/,$p' $OUT/bench-fleet/results.md | head -16
