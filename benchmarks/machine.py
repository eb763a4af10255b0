"""What this machine has: host, GPU (probed in a child process), compilers, CuPy.

Old toolkits are located the way tests/conftest.py does it: PTXBACKEND_TEST_NVCC112 /
PTXBACKEND_TEST_NVRTC, else the nvcc 11.2 bundle ../shared/toolkits/nvcc112.tar.xz next to the
checkout (unpacked into the run's temporary directory), else the nvidia-cuda-nvrtc-cu11 wheel on
sys.path.  Command-line options override each.
"""

import glob
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tarfile

import benchutil

SLOTS = ("nvcc13", "nvcc112", "nvrtc117", "nvrtc13")
SHARED_TOOLKITS = os.path.join(os.path.dirname(benchutil.REPO), "shared", "toolkits")
_NVRTC_RE = re.compile(r"^libnvrtc\.so((?:\.\d+)*)$")


def host_info():
    return {"hostname": socket.gethostname(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0], "executable": sys.executable}


def gpu_probe(args):
    """Child: the GPU as the driver sees it (run in a fresh process so the runner never initialises CUDA)."""
    from ptxbackend.gpu import driver
    if not driver.available():
        return {"available": False, "why": _driver_problem(driver)}
    ordinal = 0
    version = driver.driver_version()
    return {"available": True, "count": driver.device_count(), "name": driver.device_name(ordinal),
            "cc": driver.compute_capability(ordinal), "driver_build": driver.driver_build(),
            "driver_cuda_version": "%d.%d" % (version // 1000, version % 1000 // 10),
            "libcuda": driver.library_path()}


def _driver_problem(driver):
    try:
        driver.device_count()
        return "no CUDA device visible"
    except Exception as exc:  # DriverError: no libcuda, cuInit failed...
        return short_reason(exc)


def short_reason(exc):
    """The first sentence of an error, for a table cell."""
    text = benchutil.first_line(exc)
    for stop in (": no NVIDIA driver", ". "):
        if stop in text:
            text = text.split(stop)[0]
    return text[:160]


def detect_gpu():
    try:
        return benchutil.spawn("machine", "gpu_probe", {}, benchutil.clean_env(), timeout=120)
    except benchutil.ChildError as exc:
        return {"available": False, "why": short_reason(exc)}


def cupy_info():
    """CuPy's version (read in a child: importing CuPy here would slow every later step) and
    whether ptxbackend's start-up hook is installed in this interpreter."""
    code = ("import json, importlib.util, sys\n"
            "out = {'hook_active': False, 'cupy_version': None}\n"
            "try:\n"
            "    import _ptxbackend_boot\n"
            "    out['hook_active'] = bool(_ptxbackend_boot.active())\n"
            "except Exception:\n"
            "    pass\n"
            "if importlib.util.find_spec('cupy') is not None:\n"
            "    try:\n"
            "        import cupy\n"
            "        out['cupy_version'] = cupy.__version__\n"
            "    except Exception as exc:\n"
            "        out['cupy_error'] = '%s: %s' % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else '')\n"
            "print(json.dumps(out))\n")
    # The interpreter's own site only: the hook must be found where the user's programs would find it.
    env = {k: v for k, v in benchutil.clean_env().items() if k != "PYTHONPATH"}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        import json
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"hook_active": False, "cupy_version": None, "cupy_error": benchutil.first_line(exc)}


# --------------------------------------------------------------------------- compilers

def _nvcc_identity(path):
    from ptxbackend.compilers.nvcc import probe_nvcc
    return probe_nvcc(path)


def _nvrtc_identity(path):
    from ptxbackend.compilers.nvrtc import probe_nvrtc
    return probe_nvrtc(path)


def _entry(identity, origin):
    return {"kind": identity.kind, "path": identity.path, "version": identity.version, "origin": origin,
            "virtual_archs": list(identity.virtual_archs), "real_archs": list(identity.real_archs)}


def _major(version):
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def find_nvcc13(explicit=None):
    candidates = []
    if explicit:
        candidates.append(("--nvcc", explicit))
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(("$" + var, os.path.join(os.environ[var], "bin", "nvcc")))
    if shutil.which("nvcc"):
        candidates.append(("PATH", shutil.which("nvcc")))
    candidates.append(("default toolkit", "/usr/local/cuda/bin/nvcc"))
    looked = []
    for origin, path in candidates:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            looked.append("%s: %s (missing)" % (origin, path))
            continue
        try:
            identity = _nvcc_identity(path)
        except Exception as exc:
            looked.append("%s: %s (%s)" % (origin, path, benchutil.first_line(exc)))
            continue
        if _major(identity.version) >= 12:
            return _entry(identity, origin)
        looked.append("%s: %s is nvcc %s, not 12+" % (origin, path, identity.version))
    return {"missing": "no CUDA 12/13 nvcc (" + "; ".join(looked) + ")"}


def find_nvcc112(workspace, explicit=None, archive=None):
    path = explicit or os.environ.get("PTXBACKEND_TEST_NVCC112")
    origin = "--nvcc112" if explicit else "PTXBACKEND_TEST_NVCC112"
    if not path:
        archive = archive or os.environ.get("PTXBACKEND_BENCH_NVCC112_ARCHIVE") or \
            os.path.join(SHARED_TOOLKITS, "nvcc112.tar.xz")
        if not os.path.isfile(archive):
            return {"missing": "nvcc 11.2: set PTXBACKEND_TEST_NVCC112 or --nvcc112, or provide %s" % archive}
        target = workspace.path("toolkits")
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, filter="tar")  # keeps the bundle's executable bits
            else:
                tar.extractall(target)
        path = os.path.join(target, "nvcc112", "bin", "nvcc112")
        origin = "unpacked from %s" % archive
    try:
        return _entry(_nvcc_identity(path), origin)
    except Exception as exc:
        return {"missing": "nvcc 11.2 at %s: %s" % (path, benchutil.first_line(exc))}


def _nvrtc_in(directory):
    found = []
    for path in glob.glob(os.path.join(directory, "libnvrtc.so*")):
        match = _NVRTC_RE.match(os.path.basename(path))
        if match and os.path.isfile(path):
            found.append((tuple(int(p) for p in match.group(1).split(".") if p), path))
    return [p for _, p in sorted(found, reverse=True)]


def find_nvrtc117(explicit=None):
    path = explicit or os.environ.get("PTXBACKEND_TEST_NVRTC")
    origin = "--nvrtc117" if explicit else "PTXBACKEND_TEST_NVRTC"
    if not path:
        for entry in sys.path:
            hits = _nvrtc_in(os.path.join(entry or ".", "nvidia", "cuda_nvrtc", "lib"))
            if hits:
                path, origin = hits[0], "nvidia-cuda-nvrtc-cu11 wheel"
                break
    if not path:
        return {"missing": "NVRTC 11.x: pip install nvidia-cuda-nvrtc-cu11==11.7.99, or set PTXBACKEND_TEST_NVRTC"}
    try:
        identity = _nvrtc_identity(path)
    except Exception as exc:
        return {"missing": "NVRTC at %s: %s" % (path, benchutil.first_line(exc))}
    if _major(identity.version) != 11:
        return {"missing": "NVRTC at %s is %s, not 11.x" % (path, identity.version)}
    return _entry(identity, origin)


def find_nvrtc13(nvcc13_entry, explicit=None):
    dirs = []
    if explicit:
        dirs.append(("--nvrtc13", explicit))
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    if nvcc13_entry and nvcc13_entry.get("path"):
        roots.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(nvcc13_entry["path"]))))
    for root in roots:
        if root:
            for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
                dirs.append(("toolkit", os.path.join(root, sub)))
    for entry in sys.path:
        for sub in (("nvidia", "cu13", "lib"), ("nvidia", "cuda_nvrtc", "lib")):
            dirs.append(("wheel", os.path.join(entry or ".", *sub)))
    tried = set()
    for origin, where in dirs:
        paths = [where] if os.path.isfile(where) else _nvrtc_in(where)
        for path in paths:
            real = os.path.realpath(path)
            if real in tried:
                continue
            tried.add(real)
            try:
                identity = _nvrtc_identity(path)
            except Exception:
                continue
            if _major(identity.version) >= 12:
                return _entry(identity, "%s (%s)" % (origin, where))
    return {"missing": "no NVRTC 12/13 in the toolkit's lib64 or nvidia-*-cu13 wheels"}


def find_toolkits(workspace, args):
    nvcc13 = find_nvcc13(args.nvcc)
    found = {
        "nvcc13": nvcc13,
        "nvcc112": find_nvcc112(workspace, args.nvcc112, args.nvcc112_archive),
        "nvrtc117": find_nvrtc117(args.nvrtc117),
        "nvrtc13": find_nvrtc13(nvcc13 if "path" in nvcc13 else None, args.nvrtc13),
    }
    return found


def label(slot, entry):
    """'nvcc 13.0.88' for a found toolkit."""
    return "%s %s" % (entry.get("kind", slot), entry.get("version", "?"))


def env_for(entry):
    """PTXBACKEND_NVCC / PTXBACKEND_NVRTC pointing ptxbackend at exactly this toolkit."""
    return {"PTXBACKEND_NVCC" if entry["kind"] == "nvcc" else "PTXBACKEND_NVRTC": entry["path"]}


def newest(archs, limit):
    fit = [a for a in archs if a <= limit]
    return max(fit) if fit else None


def pick(toolkits, order, arch, kind="compute"):
    """The first found toolkit in ``order`` that can build ``kind``_``arch``, as (slot, entry)."""
    for slot in order:
        entry = toolkits.get(slot) or {}
        if "path" not in entry:
            continue
        archs = entry["virtual_archs"] if kind == "compute" else entry["real_archs"]
        if arch in archs:
            return slot, entry
    return None, None
