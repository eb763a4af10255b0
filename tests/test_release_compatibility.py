"""What the last release (0.4.0) filed is still a hit: the layout and the key did not move under users' caches.

0.4.0's own code (its tree taken from this repository's history) compiles into a cache in a child
process; this checkout then asks for the same kernels in that cache.  A second check pins the key
itself: a request whose every part is fixed has the name 0.4.0 gave it.
"""

import os
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO, SAXPY, _missing

#: The last commit of 0.4.0 as released (stop 34).
RELEASE_0_4_0 = "4f6f762"
RELEASE_FILES = ("ptxbackend", "_ptxbackend_pth.py", "_ptxbackend_boot.py")


@pytest.fixture(scope="module")
def release_tree(tmp_path_factory):
    """0.4.0's package, unpacked from git history (CI clones the repository with it)."""
    git = subprocess.run(["git", "-C", REPO, "cat-file", "-e", RELEASE_0_4_0 + "^{commit}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if git.returncode != 0:
        _missing("0.4.0 in this checkout's git history (commit %s)" % RELEASE_0_4_0)
    target = tmp_path_factory.mktemp("ptxbackend-0.4.0")
    archive = target / "tree.tar"
    with open(str(archive), "wb") as handle:
        subprocess.check_call(["git", "-C", REPO, "archive", "--format=tar", RELEASE_0_4_0] + list(RELEASE_FILES),
                              stdout=handle)
    with tarfile.open(str(archive)) as tar:
        tar.extractall(str(target / "tree"))
    return str(target / "tree")


CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
for name in ("_ptxbackend_pth", "_ptxbackend_boot", "_ptxbackend_env"):  # this checkout's, imported by its .pth
    sys.modules.pop(name, None)
import ptxbackend
assert ptxbackend.__version__ == "0.4.0" and ptxbackend.__file__.startswith(sys.argv[1]), ptxbackend.__file__
request = json.loads(sys.argv[2])
artifact = ptxbackend.compile(request["source"], request["options"], target=request["target"],
                              compiler=request["compiler"], cache_dir=request["cache_dir"], name=request["name"])
print(json.dumps({"path": artifact.path, "key": artifact.key, "hit": artifact.cache_hit}))
"""


def _requests(tmp_path, header_dir):
    header_dir.mkdir()
    (header_dir / "scale.cuh").write_text("#define SCALE 3.0f\n")
    with_header = '#include "scale.cuh"\nextern "C" __global__ void k(float* x) { x[0] *= SCALE; }\n'
    return [
        dict(source=SAXPY, options=["-DN=4"], target="compute_75", name="kernel.cu"),
        dict(source=with_header, options=["-I", str(header_dir)], target="compute_75", name="scaled.cu"),
        dict(source=SAXPY, options=[], target="sm_75", name="kernel.cu"),
    ]


@pytest.mark.parametrize("compiler", ["nvcc", "nvrtc"])
def test_an_entry_written_by_0_4_0_is_a_hit(release_tree, tmp_path, compiler, nvcc13, nvrtc117):
    import json
    import ptxbackend
    cache = str(tmp_path / "shared-cache")
    env = dict(os.environ, PTXBACKEND_DISABLE="1", PTXBACKEND_NVRTC=nvrtc117)
    for request in _requests(tmp_path, tmp_path / "inc"):
        if compiler == "nvrtc" and request["target"].startswith("sm_"):
            continue
        request.update(compiler=compiler, cache_dir=cache)
        proc = subprocess.run([sys.executable, "-c", CHILD, release_tree, json.dumps(request)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, cwd="/")
        assert proc.returncode == 0, proc.stderr
        old = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not old["hit"]
        os.environ["PTXBACKEND_NVRTC"] = nvrtc117  # the clean_environment fixture restores it
        artifact = ptxbackend.compile(request["source"], request["options"], target=request["target"],
                                      compiler=compiler, cache_dir=cache, name=request["name"])
        assert artifact.cache_hit, request
        assert (artifact.key, artifact.path) == (old["key"], old["path"])


def test_the_key_of_a_fixed_request_is_the_one_0_4_0_gave_it():
    from ptxbackend.cache import layout, request_key
    from ptxbackend.compiling.targets import parse_target
    target = parse_target("compute_75")
    key = request_key(SAXPY, ("-DN=4", "-I", "/opt/inc"), target,
                      ("kernel.cu", "gcc 12.2.0 0123456789ab", "CPATH=/x", "0123456789abcdef"))
    # Computed by 0.4.0 (commit 4f6f762) for the same arguments.
    assert key == EXPECTED_KEY
    assert layout.entry_name("nvcc-13.0.88", target, key, "ptx") == "nvcc-13.0.88/compute_75/%s/%s.ptx" % (
        key[:2], key)
    assert layout.LAYOUT == "v4"


EXPECTED_KEY = "1bf07307c47286e7328747c0f7eaf63938563e184fe49b066a554395b1ba30c0"
