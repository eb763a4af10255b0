#!/usr/bin/env bash
# Issue 38 rows 1, 2, 7, 8 and issue 40's signals on the H200 machine: the command-line safety tests and the
# injection fuzzer with its nvcc 13, the libjit GPU tests (parallel-JIT workers are isolated children now),
# and `warm --libs curand --jobs 4` started from a directory holding a planted ptxbackend package, with the
# dependencies on PYTHONPATH (the children must find them, and never the planted package).
# Carries .device/cmdline (wheels: platformdirs, filelock, hypothesis, sortedcontainers, attrs, pytest and
# its dependencies; `pip download --no-deps` of those names). About 3 minutes.
. benchmarks/device/setup.sh
site_wheels --no-compile /tmp/site .device/cmdline/*.whl
REPO=$PWD
export PYTHONPATH=/tmp/site:$REPO
gpu_line; nvcc --version | tail -n 1
echo "== safety tests, injection fuzzer, libjit (GPU tests included)"
timeout 400 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_command_line_safety.py \
  tests/test_injection_fuzz.py tests/test_libjit.py > $OUT/cmdline-tests.log 2>&1
echo "rc=$?"; grep -E "passed|failed|SKIP|FAIL|Error" $OUT/cmdline-tests.log | tail -n 12
echo "== warm --libs curand --jobs 4 from a directory with a planted ptxbackend"
mkdir -p /tmp/planted/ptxbackend/deploy
for f in __init__.py deploy/__init__.py deploy/library_warmup.py deploy/parallel_jit.py; do
  echo "open('/tmp/planted-ran', 'a').write('$f ')" > /tmp/planted/ptxbackend/$f
done
cd /tmp/planted && PYTHONPATH=/tmp/planted:/tmp/site timeout 300 python3 -I -c "import sys; sys.path[:0] = ['/tmp/site', '$REPO']; \
from ptxbackend.cli.commands import main; sys.exit(main(['warm', '--libs', 'curand', '--jobs', '4']))" 2>&1 | tail -n 8
echo "warm rc=${PIPESTATUS[0]}"
if [ -e /tmp/planted-ran ]; then echo "PLANTED PACKAGE RAN: $(cat /tmp/planted-ran)"; else echo "planted package never ran"; fi
