"""`cache prune` and `cache clear` delete only what ptxbackend wrote: an old layout (v1-v3) is removed
only when it is the tree 0.1, 0.2 or 0.3 wrote (made here by those releases, taken from this
repository's history); anything else in the cache root is left alone and named, by prune, clear,
`cache info` and doctor."""

import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO, SAXPY, _missing

# The last commit of each release that wrote a layout older than this one's, and the tree it wrote.
RELEASES = {"v1": "dc44526^", "v2": "dc44526", "v3": "91c624a"}

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
for name in ("_ptxbackend_pth", "_ptxbackend_boot", "_ptxbackend_env"):
    sys.modules.pop(name, None)
import ptxbackend
assert ptxbackend.__file__.startswith(sys.argv[1]), ptxbackend.__file__
ptxbackend.compile(sys.argv[3], target="compute_75", compiler="nvcc", cache_dir=sys.argv[2])
print(ptxbackend.__version__)
"""


@pytest.fixture(scope="module")
def old_caches(tmp_path_factory, nvcc13):
    """``{layout: cache root}``: a cache each old release filed a kernel in, with its own code."""
    made = {}
    base = tmp_path_factory.mktemp("old-releases")
    for layout, commit in sorted(RELEASES.items()):
        if subprocess.run(["git", "-C", REPO, "cat-file", "-e", commit + "^{commit}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            _missing("the release that wrote %s in this checkout's git history (%s)" % (layout, commit))
        tree = base / ("tree-" + layout)
        tree.mkdir()
        archive = base / (layout + ".tar")
        with open(str(archive), "wb") as handle:
            subprocess.check_call(["git", "-C", REPO, "archive", "--format=tar", commit, "ptxbackend"], stdout=handle)
        with tarfile.open(str(archive)) as tar:
            tar.extractall(str(tree), **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        cache = base / ("cache-" + layout)
        env = dict(os.environ, PTXBACKEND_DISABLE="1")
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(cache), SAXPY], env=env, cwd="/",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        assert proc.returncode == 0, proc.stderr
        assert sorted(os.listdir(str(cache))) == [layout], os.listdir(str(cache))
        made[layout] = cache
    return made


def _cache_with(tmp_path, old_caches, *layouts):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    for layout in layouts:
        shutil.copytree(str(old_caches[layout] / layout), str(root / layout), symlinks=True)
    return root


def _cli(root, *args):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(root))
    proc = subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    return proc.stdout


@pytest.mark.parametrize("action", ["prune", "clear"])
def test_the_trees_old_releases_wrote_are_removed(tmp_path, old_caches, action):
    root = _cache_with(tmp_path, old_caches, "v1", "v2", "v3")
    out = _cli(root, "cache", "info")
    assert "old:       v1, v2, v3" in out and "left alone" not in out, out
    out = _cli(root, "cache", action)
    assert sorted(os.listdir(str(root))) == ["v4"], out
    assert "left alone" not in out


def _user_folders(root, old_caches):
    """Folders of the user's in the cache root, each named as an old layout, none written by ptxbackend."""
    for name in ("v0", "v1", "v2"):
        (root / name / "holiday").mkdir(parents=True)
        (root / name / "holiday" / "photo.jpg").write_bytes(b"\xff\xd8 precious")
    (root / "v3").mkdir()  # empty: nothing shows ptxbackend made it
    (root / "notes.txt").write_text("mine")


def test_folders_named_as_old_layouts_that_ptxbackend_did_not_write_are_left_alone_and_named(tmp_path,
                                                                                             old_caches):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    _user_folders(root, old_caches)
    for action in ("prune", "clear"):
        out = _cli(root, "cache", action)
        assert "left alone: notes.txt, v0, v1, v2, v3 in %s" % root in out, out
        assert "removed the old layout" not in out
    for name in ("v0", "v1", "v2"):
        assert (root / name / "holiday" / "photo.jpg").read_bytes() == b"\xff\xd8 precious"
    assert (root / "v3").is_dir() and (root / "notes.txt").read_text() == "mine"
    info = _cli(root, "cache", "info")
    assert "left alone: notes.txt, v0, v1, v2, v3" in info and "old:" not in info, info
    doctor = _cli(root, "doctor", "--json")
    report = json.loads(doctor)
    assert report["cache"]["unknown"] == ["notes.txt", "v0", "v1", "v2", "v3"]
    assert report["cache"]["old_layouts"] == []


def _entry_of(root, layout):
    found = [os.path.join(base, name) for base, _dirs, names in os.walk(str(root / layout))
             for name in names if name.endswith(".ptx")]
    assert found
    return found[0]


@pytest.mark.parametrize("change", ["user-file", "foreign-entry", "link", "schema", "other-owner"])
def test_an_old_tree_with_anything_ptxbackend_did_not_write_is_left_alone_whole(tmp_path, old_caches, change):
    root = _cache_with(tmp_path, old_caches, "v2", "v3")
    entry = _entry_of(root, "v2")
    if change == "user-file":
        (root / "v2" / "thesis.tex").write_text("precious")
    elif change == "foreign-entry":  # named as an entry, not one: no magic
        with open(entry, "wb") as handle:
            handle.write(b"precious")
    elif change == "link":
        os.symlink(str(tmp_path), os.path.join(os.path.dirname(entry), "elsewhere"))
    elif change == "schema":  # an entry of another version's tree
        with open(entry, "r+b") as handle:
            handle.seek(4)
            handle.write(struct.pack("<H", 3))
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(entry, 65534, 65534)
    out = _cli(root, "cache", "prune")
    assert "removed the old layout %s" % (root / "v3") in out, out
    assert "left alone: v2 in" in out, out
    assert os.path.exists(entry) and sorted(os.listdir(str(root))) == ["v2", "v4"]


def test_the_old_layout_roles_are_what_those_releases_wrote():
    from ptxbackend.cache.layout import old_layout_role
    key = "ab" + "c" * 62
    assert old_layout_role(["nvcc-13.0.88", "compute_75", "ab", key + ".ptx"]) == "entry"
    assert old_layout_role(["nvcc-13.0.88", "compute_75", "jit", "sm_75-575", "ab", key + ".cubin"]) == "entry"
    assert old_layout_role(["nvcc-13.0.88", "identity.json"]) == "producer"
    assert old_layout_role(["locks", "ab", key + ".lock"]) == "lock"
    assert old_layout_role(["sysdeps", "ab", key + ".json"]) == "headers"
    assert old_layout_role(["meta", "compilers", "x.json"]) == "memo"
    for foreign in (["nvcc-13.0.88", "compute_75", "cd", key + ".ptx"], ["photo.jpg"],
                    ["nvcc-13.0.88", "compute_75", "ab", key + ".txt"], ["locks", "notes.txt"],
                    ["sysdeps", "cd", key + ".json"], ["nvcc-13.0.88", "..", "x"]):
        assert old_layout_role(foreign) is None, foreign
