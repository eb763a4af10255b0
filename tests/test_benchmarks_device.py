"""benchmarks/device/: the scripts parse, share their set-up through setup.sh, and that set-up works.

The scripts themselves need the H200; what runs here is bash on the real set-up functions (staged
files checked, a git archive unpacked, a real wheel installed with pip, nvcc 11.2 found).
"""

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

# The benchmarks run on the machines that measure (Python 3.7 and later: subprocess's capture_output,
# CuPy); the package itself, and its tests, still run on 3.6.
pytestmark = pytest.mark.skipif(sys.version_info < (3, 7), reason="the benchmarks need Python 3.7 or later")

DEVICE = os.path.join(REPO, "benchmarks", "device")
SCRIPTS = sorted(n for n in os.listdir(DEVICE) if n.endswith(".sh"))
# stage.sh runs on this machine; driver-jit-two-users.sh makes users, it stages nothing.
OWN_SETUP = ("stage.sh", "driver-jit-two-users.sh", "setup.sh")
# What only the shared set-up does: wheels into a site folder, progress lines, the GPU line, nvcc 11.2.
SETUP_ONLY = ("--target", "say() {", "nvidia-smi --query-gpu", "nvcc112.tar.xz -C")


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_device_script_parses(script):
    proc = subprocess.run(["bash", "-n", os.path.join(DEVICE, script)], stderr=subprocess.PIPE,
                          universal_newlines=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in OWN_SETUP])
def test_device_scripts_set_up_through_setup_sh_only(script):
    with open(os.path.join(DEVICE, script)) as handle:
        text = handle.read()
    assert "benchmarks/device/setup.sh" in text or "benchmarks/device/cupy14-ab-setup.sh" in text, script
    for pattern in SETUP_ONLY:
        assert pattern not in text, "%s does %r itself: use setup.sh" % (script, pattern)


def _bash(body, cwd, env=None):
    script = "set -u\n. %s\n%s\n" % (os.path.join(DEVICE, "setup.sh"), body)
    return subprocess.run(["bash", "-c", script, "device-test"], cwd=str(cwd), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120,
                          env=dict(os.environ, OUT=str(cwd / "out"), **(env or {})))


def test_need_stops_with_what_to_carry(tmp_path):
    (tmp_path / ".device" / "run24").mkdir(parents=True)
    (tmp_path / ".device" / "run24" / "pb040.tar").write_bytes(b"")
    ok = _bash('need .device/run24/pb040.tar; say "after"', tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("[device-test ") and ok.stdout.strip().endswith("after")
    missing = _bash('need .device/run24/pb040.tar $L/chainer-1.24.0-*.whl; say "not reached"', tmp_path)
    assert missing.returncode == 2 and "not reached" not in missing.stdout
    assert "missing .device/legacy/chainer-1.24.0-*.whl: stage it here" in missing.stdout
    assert missing.stdout.count("missing") == 1


def test_unpack_tree_gives_a_tree_the_ab_runner_accepts(tmp_path, monkeypatch):
    tar = tmp_path / "now.tar"
    archive = subprocess.run(["git", "-C", REPO, "archive", "-o", str(tar), "HEAD"], stderr=subprocess.PIPE)
    if archive.returncode:
        pytest.skip("not a git checkout")
    name = "ptxb-device-test-%d" % os.getpid()
    proc = _bash("unpack_tree %s %s" % (name, tar), tmp_path)
    try:
        assert proc.returncode == 0, proc.stderr
        monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
        import ab
        arm = ab.parse_trees(["t=/tmp/%s" % name], "stock")[0]
        assert arm["dir"] == "/tmp/" + name and arm["version"]
    finally:
        subprocess.run(["rm", "-rf", "/tmp/" + name])


def _wheel(directory):
    """A real (minimal) wheel: one module, its dist-info."""
    path = os.path.join(str(directory), "ptxbdevprobe-1.0-py3-none-any.whl")
    info = "ptxbdevprobe-1.0.dist-info/"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("ptxbdevprobe.py", "VALUE = 42\n")
        wheel.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: ptxbdevprobe\nVersion: 1.0\n")
        wheel.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                       "Tag: py3-none-any\n")
        wheel.writestr(info + "RECORD", "")
    return path


@pytest.mark.parametrize("flag", ["", "--no-compile "])
def test_site_wheels_installs_carried_wheels_without_an_index(tmp_path, flag):
    wheel = _wheel(tmp_path)
    site = tmp_path / "site"
    proc = _bash("site_wheels %s%s %s" % (flag, site, wheel), tmp_path, env={"PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    assert (site / "ptxbdevprobe.py").is_file()
    compiled = list((site / "__pycache__").glob("ptxbdevprobe*.pyc")) if (site / "__pycache__").is_dir() else []
    assert bool(compiled) == (flag == "")
    bad = _bash("site_wheels %s %s/none-*.whl; say not reached" % (site, tmp_path), tmp_path,
                env={"PYTHON": sys.executable})
    assert bad.returncode == 2 and "not reached" not in bad.stdout


def test_unpack_nvcc112_takes_the_named_one(tmp_path, nvcc112):
    proc = _bash('unpack_nvcc112; echo "nvcc112=$nvcc112"', tmp_path, env={"LEGACY_NVCC112": nvcc112})
    assert proc.returncode == 0 and proc.stdout.strip() == "nvcc112=" + nvcc112, proc.stderr
    gone = _bash('unpack_nvcc112; echo "not reached"', tmp_path, env={"LEGACY_NVCC112": str(tmp_path / "none")})
    if not os.path.exists("/tmp/tk/nvcc112/bin/nvcc112"):
        assert gone.returncode == 2 and "missing .device/nvcc112.tar.xz" in gone.stdout
