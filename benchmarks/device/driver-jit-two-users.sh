#!/usr/bin/env bash
# Issue 25, row 4, on a machine with a GPU, as root: another user's directory named as the cache
# (PTXBACKEND_CACHE_DIR, XDG_CACHE_HOME, or a link planted in a sticky directory) never becomes the
# driver's JIT cache.  Two users made with useradd: mallory prepares a cache directory holding
# driver-jit/ (world-writable, as an attacker would leave it), alice runs the start-up hook and a real
# PTX JIT.  PASS when alice's CUDA_CACHE_PATH never names mallory's directory and the JIT writes nothing
# there, while the control (alice's own imported set) is used and written.  Prints PASS or FAIL.
#
#   benchmarks/device/driver-jit-two-users.sh            # runs it (root, GPU machine; removes its users)
#   benchmarks/device/driver-jit-two-users.sh --dry-run  # prints the plan, changes nothing (any machine)
set -u
export PYTHONUNBUFFERED=1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
W=/tmp/ptxb-two-users
ALICE=ptxb-alice
MALLORY=ptxb-mallory
if [ "${1:-}" = "--dry-run" ]; then
  cat <<EOF
dry run: nothing is created or changed.
would: useradd -M -r $ALICE; useradd -M -r $MALLORY
would: copy $REPO/_ptxbackend_pth.py to $W/repo (readable by both)
would: as $MALLORY: $W/mallory/cache/driver-jit, $W/mallory/xdg/ptxbackend/driver-jit (mode 777),
       and the link $W/sticky/ptxb-cache -> $W/mallory/cache in the sticky $W/sticky
would: as $ALICE, for PTXBACKEND_CACHE_DIR=$W/mallory/cache, XDG_CACHE_HOME=$W/mallory/xdg,
       PTXBACKEND_CACHE_DIR=$W/sticky/ptxb-cache, and the control PTXBACKEND_CACHE_DIR=$W/alice/cache:
       python3 with the start-up hook (_ptxbackend_pth.install()), print CUDA_CACHE_PATH, JIT one new PTX
       module through libcuda (cuModuleLoadData), count the files in each driver-jit/ before and after
would: userdel both users, rm -rf $W
EOF
  exit 0
fi
if [ "$(id -u)" != 0 ]; then echo "FAIL: run as root (useradd)"; exit 2; fi
if ! command -v nvidia-smi >/dev/null; then echo "FAIL: no GPU here (nvidia-smi missing); --dry-run shows the plan"; exit 2; fi
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader

cleanup() { userdel "$ALICE" 2>/dev/null; userdel "$MALLORY" 2>/dev/null; rm -rf "$W"; }
cleanup
trap cleanup EXIT
useradd -M -r -s /bin/sh "$ALICE" && useradd -M -r -s /bin/sh "$MALLORY" || { echo "FAIL: useradd"; exit 2; }
mkdir -p "$W/repo" "$W/sticky" "$W/alice/home" "$W/mallory"
chmod 755 "$W" "$W/repo"; chmod 1777 "$W/sticky"
cp "$REPO/_ptxbackend_pth.py" "$W/repo/" && chmod 644 "$W/repo/_ptxbackend_pth.py"
chown -R "$ALICE:" "$W/alice"; chmod 700 "$W/alice"; chown "$MALLORY:" "$W/mallory"; chmod 755 "$W/mallory"
as() { local who=$1; shift; runuser -u "$who" -- env -i PATH=/usr/bin:/bin HOME="$W/${who#ptxb-}" "$@"; }
# mallory's side: the directories alice is pointed at, world-writable so the driver could write there
as "$MALLORY" sh -c "umask 000; mkdir -p $W/mallory/cache/driver-jit $W/mallory/xdg/ptxbackend/driver-jit \
  && chmod 777 $W/mallory/cache/driver-jit $W/mallory/xdg/ptxbackend/driver-jit \
  && ln -s $W/mallory/cache $W/sticky/ptxb-cache" || { echo "FAIL: mallory's setup"; exit 2; }
# alice's own imported set (the control): private, as 'ptxbackend cache import' makes it
as "$ALICE" sh -c "umask 077; mkdir -p $W/alice/cache/driver-jit" || { echo "FAIL: alice's setup"; exit 2; }

cat > "$W/repo/jit.py" <<'PY'
import ctypes, os, sys, uuid
import _ptxbackend_pth
_ptxbackend_pth.install()  # what ptxbackend.pth runs at every interpreter start
print("CUDA_CACHE_PATH=%s" % os.environ.get("CUDA_CACHE_PATH"))
cuda = ctypes.CDLL("libcuda.so.1")
def check(status, what):
    if status != 0:
        sys.exit("%s failed: %d" % (what, status))
dev, ctx, mod = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuInit(0), "cuInit")
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
name = "k_" + uuid.uuid4().hex  # a module the driver has never seen: a JIT and a cache write
ptx = (".version 7.0\n.target sm_75\n.address_size 64\n.visible .entry %s(.param .u64 p)\n{\n"
       ".reg .u64 %%a;\nld.param.u64 %%a, [p];\nret;\n}\n" % name).encode()
check(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(ptx)), "cuModuleLoadData")
print("JIT ok")
PY
chmod 644 "$W/repo/jit.py"

files() { find "$1" -type f 2>/dev/null | wc -l; }
verdict=PASS
run_case() {  # name, the variable alice sets, the directory that must stay untouched (or be used)
  local name=$1 setting=$2 watched=$3 expect=$4
  local before after out
  before=$(files "$watched")
  out=$(as "$ALICE" "$setting" PYTHONPATH="$W/repo" python3 "$W/repo/jit.py" 2>&1)
  after=$(files "$watched")
  echo "== $name ($setting)"; echo "$out" | sed 's/^/   /'
  echo "   files in $watched: $before -> $after"
  if [ "$expect" = unused ]; then
    if echo "$out" | grep -q "CUDA_CACHE_PATH=$W/mallory\|CUDA_CACHE_PATH=$W/sticky" || [ "$after" != "$before" ]; then
      echo "   FAIL: the driver was pointed at, or wrote into, another user's directory"; verdict=FAIL
    fi
  else
    if ! echo "$out" | grep -q "CUDA_CACHE_PATH=$watched" || [ "$after" -le "$before" ]; then
      echo "   FAIL: the control did not use its own imported set (the check cannot see a write)"; verdict=FAIL
    fi
  fi
  echo "$out" | grep -q "JIT ok" || { echo "   FAIL: the JIT itself failed"; verdict=FAIL; }
}
run_case "another user's directory as PTXBACKEND_CACHE_DIR" PTXBACKEND_CACHE_DIR="$W/mallory/cache" \
  "$W/mallory/cache/driver-jit" unused
run_case "another user's directory as XDG_CACHE_HOME" XDG_CACHE_HOME="$W/mallory/xdg" \
  "$W/mallory/xdg/ptxbackend/driver-jit" unused
run_case "another user's link in a sticky directory" PTXBACKEND_CACHE_DIR="$W/sticky/ptxb-cache" \
  "$W/mallory/cache/driver-jit" unused
run_case "control: alice's own imported set" PTXBACKEND_CACHE_DIR="$W/alice/cache" \
  "$W/alice/cache/driver-jit" used
echo "$verdict"
[ "$verdict" = PASS ]
