#!/usr/bin/env bash
# The command line's --json and progress where they need the GPU: tests/test_cli_json.py (its driver JIT
# import runs only there), `warm MANIFEST --json` storing JIT cubins, `warm --libs curand --json` (one JSON
# document, each library's result), and the same warm on a terminal (a pty): its progress bars on stderr.
# Carries .device/cmdline (wheels: platformdirs, filelock, pytest and its dependencies; as
# cmdline-safety.sh). About 2 minutes.
. benchmarks/device/setup.sh
need .device/cmdline
site_wheels --no-compile /tmp/site .device/cmdline/*.whl
REPO=$PWD
export PYTHONPATH=/tmp/site:$REPO PTXBACKEND_CACHE_DIR=/tmp/cli-json-cache
gpu_line; nvcc --version | tail -n 1
say "tests/test_cli_json.py, tests/test_cache_verify.py (GPU test included)"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_cli_json.py tests/test_cache_verify.py \
  > $OUT/cli-json-tests.log 2>&1
echo "rc=$?"; grep -E "passed|failed|SKIP|FAIL|Error" $OUT/cli-json-tests.log | tail -n 12
say "warm MANIFEST --json on the GPU: JIT cubins stored"
python3 - > /tmp/kernels.jsonl <<'PY'
import json
for i in range(4):
    print(json.dumps({"source": 'extern "C" __global__ void k(float* y) { y[0] = %d; }' % i, "options": [],
                      "target": "compute_90", "compiler": "nvcc", "name": "k%d.cu" % i}))
PY
timeout 120 python3 -m ptxbackend warm /tmp/kernels.jsonl --json > $OUT/warm-kernels.json
echo "warm rc=$?"; python3 -c "import json; d = json.load(open('$OUT/warm-kernels.json')); k = d['kernels']; \
print('kernels', k['total'], 'compiled', k['compiled'], 'cached', k['cached'], 'failed', k['failed'], 'jit_stored', k['jit_stored'], 'ok', d['ok'])"
say "warm --libs curand --jobs 4 --json"
timeout 300 python3 -m ptxbackend warm --libs curand --jobs 4 --json > $OUT/warm-libs.json 2> $OUT/warm-libs.err
echo "warm rc=$? stderr lines $(wc -l < $OUT/warm-libs.err)"
python3 -c "import json; d = json.load(open('$OUT/warm-libs.json')); l = d['libraries'][0]; \
print(l['name'], l['library'], 'ok', l['ok'], 'first_s', l.get('first_s'), 'second_s', l.get('second_s'), \
'growth', l.get('jit_cache_growth_bytes'), 'parallel images', (l.get('parallel') or {}).get('images'), 'failed', d['failed'])"
say "the same two warms on a terminal: progress on stderr"
timeout 300 python3 - <<'PY'
import os, pty, subprocess, sys
for argv in (["warm", "/tmp/kernels.jsonl"], ["warm", "--libs", "curand", "--jobs", "4"]):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ptxbackend"] + argv, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    out = proc.communicate()[0]
    os.close(master)
    print(" ".join(argv), "rc", proc.returncode, "terminal:", repr(seen.decode("utf-8", "replace")[-160:]))
    print("  stdout:", out.decode().strip().splitlines()[:1])
PY
