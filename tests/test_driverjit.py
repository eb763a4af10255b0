"""Driver-JIT bundles: pack, verify, refuse, install (CPU tests; the H200 runs are in docs/deployment.md).

The driver's cache is opaque files to ptxbackend; here a directory of such files stands for one, and
``machine`` is given explicitly (the CLI asks the driver).  Each refusal is tested with a bundle that is
valid in every other respect.
"""

import hashlib
import io
import json
import os
import tarfile

import pytest

from ptxbackend.deploy import jit_bundle as driverjit
from ptxbackend.errors import CacheError

H200 = {"driver_build": "580.159.04", "driver_version": 13000, "gpus": [{"name": "NVIDIA H200", "cc": 90}]}
KEY = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def warmed(tmp_path):
    """A warmed driver cache (nested files, as the driver writes them) and the library it was warmed for."""
    jit = tmp_path / "ComputeCache"
    (jit / "a" / "3").mkdir(parents=True)
    (jit / "index").write_bytes(b"index" * 100)
    (jit / "a" / "3" / "c0ffee").write_bytes(os.urandom(5000))
    (jit / "a" / "3" / "beef").write_bytes(os.urandom(300))
    lib = tmp_path / "libcurand.so.10"
    lib.write_bytes(b"\x7fELF library" * 100)
    return str(jit), str(lib)


def _bundle(tmp_path, warmed, machine=H200, key=None, name="jit.tgz"):
    path = str(tmp_path / name)
    driverjit.pack(warmed[0], [warmed[1]], path, machine, key=key)
    return path


def _members(path):
    with tarfile.open(path) as archive:
        return [(m, archive.extractfile(m).read() if m.isfile() else None) for m in archive.getmembers()]


def _rebuild(path, members):
    with tarfile.open(path, "w:gz") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _tree(root):
    found = {}
    for base, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(base, name)
            found[os.path.relpath(full, root)] = open(full, "rb").read()
    return found


def test_pack_then_install_gives_the_same_files_and_a_record(tmp_path, warmed):
    path = _bundle(tmp_path, warmed)
    assert driverjit.is_bundle(path)
    manifest = driverjit.install(path, str(tmp_path / "cache"), H200)
    target = driverjit.managed_dir(str(tmp_path / "cache"))
    assert _tree(target) == _tree(warmed[0])
    assert manifest["libraries"][0]["sha256"] == hashlib.sha256(open(warmed[1], "rb").read()).hexdigest()
    record = driverjit.installed_record(str(tmp_path / "cache"))
    assert record["directory"] == target and record["driver"]["build"] == "580.159.04"
    found = driverjit.check_installed(record, target)
    assert found["in_use"] and found["complete"] and found["files_present"] == 3
    assert found["libraries"][0]["state"] == "same size"
    assert not driverjit.check_installed(record, str(tmp_path / "elsewhere"))["in_use"]
    os.unlink(os.path.join(target, "index"))
    assert not driverjit.check_installed(record, target)["complete"]
    with open(warmed[1], "ab") as handle:
        handle.write(b"another build")
    assert driverjit.check_installed(record, target)["libraries"][0]["state"] == "different"
    os.unlink(warmed[1])
    assert driverjit.check_installed(record, target)["libraries"][0]["state"] == "elsewhere"


def test_a_second_import_replaces_the_set_whole(tmp_path, warmed):
    driverjit.install(_bundle(tmp_path, warmed), str(tmp_path / "cache"), H200)
    os.unlink(os.path.join(warmed[0], "a", "3", "beef"))
    (tmp_path / "ComputeCache" / "new").write_bytes(b"new")
    driverjit.install(_bundle(tmp_path, warmed, name="second.tgz"), str(tmp_path / "cache"), H200)
    assert _tree(driverjit.managed_dir(str(tmp_path / "cache"))) == _tree(warmed[0])


@pytest.mark.parametrize("machine, why", [
    (dict(H200, driver_build="575.57.08"), "warmed with driver 580.159.04"),
    (dict(H200, gpus=[{"name": "NVIDIA H100 80GB HBM3", "cc": 90}]), "warmed for NVIDIA H200"),
    (dict(H200, gpus=H200["gpus"] + [{"name": "NVIDIA L4", "cc": 89}]), "NVIDIA L4"),
    (dict(H200, gpus=[]), "no GPU"),
], ids=["other driver", "other GPU model", "a GPU it was not warmed for", "no GPU"])
def test_import_refuses_another_driver_or_gpu(tmp_path, warmed, machine, why):
    path = _bundle(tmp_path, warmed)
    with pytest.raises(CacheError, match=why):
        driverjit.install(path, str(tmp_path / "cache"), machine)
    assert not os.path.exists(driverjit.managed_dir(str(tmp_path / "cache")))


def test_a_changed_file_is_refused_and_the_old_set_stays(tmp_path, warmed):
    driverjit.install(_bundle(tmp_path, warmed), str(tmp_path / "cache"), H200)
    before = _tree(driverjit.managed_dir(str(tmp_path / "cache")))
    members = _members(_bundle(tmp_path, warmed, name="b.tgz"))
    members = [(m, d[:-1] + bytes([d[-1] ^ 1]) if m.name.endswith("c0ffee") else d) for m, d in members]
    path = _rebuild(str(tmp_path / "tampered.tgz"), members)
    with pytest.raises(CacheError, match="does not match its checksum"):
        driverjit.install(path, str(tmp_path / "cache"), H200)
    assert _tree(driverjit.managed_dir(str(tmp_path / "cache"))) == before
    assert [n for n in os.listdir(str(tmp_path / "cache")) if n.startswith(".driver-jit-")] == []


def _with_extra_member(tmp_path, warmed, info, data, listed_as):
    """A valid bundle plus one member the manifest lists (with its true size and digest)."""
    members = _members(_bundle(tmp_path, warmed, name="base.tgz"))
    manifest = json.loads(members[0][1])
    content = data if data is not None else b""
    manifest["files"].append({"name": listed_as, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()})
    raw = json.dumps(manifest).encode()
    members[0][0].size = len(raw)
    return _rebuild(str(tmp_path / "extra.tgz"), [(members[0][0], raw)] + members[1:] + [(info, data)])


def test_a_member_climbing_out_is_refused(tmp_path, warmed):
    info = tarfile.TarInfo("jit/../../outside")
    info.size = 4
    path = _with_extra_member(tmp_path, warmed, info, b"evil", "../../outside")
    with pytest.raises(CacheError, match="unexpected member"):
        driverjit.install(path, str(tmp_path / "cache"), H200)
    assert not os.path.exists(str(tmp_path / "outside"))


def test_a_link_member_is_refused(tmp_path, warmed):
    info = tarfile.TarInfo("jit/link")
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc/passwd"
    path = _with_extra_member(tmp_path, warmed, info, None, "link")
    with pytest.raises(CacheError, match="unexpected member"):
        driverjit.install(path, str(tmp_path / "cache"), H200)


def test_a_member_larger_than_declared_is_refused_before_it_is_read(tmp_path, warmed):
    members = _members(_bundle(tmp_path, warmed))
    grown = [(m, d) for m, d in members]
    for i, (m, d) in enumerate(grown):
        if m.name.endswith("beef"):
            m.size = len(d) + 10
            grown[i] = (m, d + b"x" * 10)
    path = _rebuild(str(tmp_path / "grown.tgz"), grown)
    with pytest.raises(CacheError, match="its manifest says"):
        driverjit.install(path, str(tmp_path / "cache"), H200)


def test_a_bundle_missing_a_listed_file_is_refused(tmp_path, warmed):
    members = [(m, d) for m, d in _members(_bundle(tmp_path, warmed)) if not m.name.endswith("index")]
    with pytest.raises(CacheError, match="missing"):
        driverjit.install(_rebuild(str(tmp_path / "short.tgz"), members), str(tmp_path / "cache"), H200)


def test_with_a_fleet_key_only_bundles_signed_with_it_are_installed(tmp_path, warmed):
    signed = _bundle(tmp_path, warmed, key=KEY, name="signed.tgz")
    driverjit.install(signed, str(tmp_path / "c1"), H200, key=KEY)
    with pytest.raises(CacheError, match="signed with another key"):
        driverjit.install(signed, str(tmp_path / "c2"), H200, key=b"another key, 16 bytes or more")
    with pytest.raises(CacheError, match="not signed"):
        driverjit.install(_bundle(tmp_path, warmed, name="plain.tgz"), str(tmp_path / "c3"), H200, key=KEY)
    # The manifest is what is signed: a changed manifest (another driver) fails with the same key.
    members = _members(signed)
    manifest = json.loads(members[0][1])
    manifest["created"] = 0
    raw = json.dumps(manifest).encode()
    members[0][0].size = len(raw)
    changed = _rebuild(str(tmp_path / "changed.tgz"), [(members[0][0], raw)] + members[1:])
    with pytest.raises(CacheError, match="signed with another key, or its manifest was changed"):
        driverjit.install(changed, str(tmp_path / "c4"), H200, key=KEY)


def test_a_damaged_bundle_is_one_clear_error(tmp_path, warmed):
    path = _bundle(tmp_path, warmed)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    with pytest.raises(CacheError, match="damaged|not a driver-JIT bundle"):
        driverjit.install(path, str(tmp_path / "cache"), H200)


def test_pack_refuses_an_empty_cache_and_an_existing_destination(tmp_path, warmed):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CacheError, match="empty"):
        driverjit.pack(str(empty), [warmed[1]], str(tmp_path / "x.tgz"), H200)
    path = _bundle(tmp_path, warmed)
    with pytest.raises(CacheError, match="--force"):
        driverjit.pack(warmed[0], [warmed[1]], path, H200)


def test_the_hook_points_the_driver_at_an_imported_set_only(tmp_path, monkeypatch):
    import _ptxbackend_pth
    monkeypatch.delenv("CUDA_CACHE_PATH", raising=False)
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    _ptxbackend_pth.use_imported_jit_cache()
    assert "CUDA_CACHE_PATH" not in os.environ  # nothing imported: the driver's own default
    os.makedirs(str(tmp_path / "cache" / "driver-jit"))
    _ptxbackend_pth.use_imported_jit_cache()
    assert os.environ["CUDA_CACHE_PATH"] == str(tmp_path / "cache" / "driver-jit")
    monkeypatch.setenv("CUDA_CACHE_PATH", "/users/own/cache")
    _ptxbackend_pth.use_imported_jit_cache()
    assert os.environ["CUDA_CACHE_PATH"] == "/users/own/cache"  # never overrides the user's


def test_the_hook_finds_an_imported_set_in_the_cache_dir_of_the_config_file(tmp_path, monkeypatch):
    import _ptxbackend_pth
    monkeypatch.delenv("CUDA_CACHE_PATH", raising=False)
    monkeypatch.delenv("PTXBACKEND_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))
    os.makedirs(str(tmp_path / "configured" / "driver-jit"))
    config = tmp_path / "config-home" / "ptxbackend" / "config.ini"
    config.parent.mkdir(parents=True)
    config.write_text("[ptxbackend]\ncache_dir = %s\n" % (tmp_path / "configured"))
    os.chmod(str(config), 0o644)
    _ptxbackend_pth.use_imported_jit_cache()
    assert os.environ["CUDA_CACHE_PATH"] == str(tmp_path / "configured" / "driver-jit")
    from ptxbackend.config import load_settings  # the package reads the same directory from the file
    assert load_settings().cache_dir == str(tmp_path / "configured")
    monkeypatch.delenv("CUDA_CACHE_PATH")
    os.chmod(str(config), 0o664)  # a file others may change names no directory for the driver
    _ptxbackend_pth.use_imported_jit_cache()
    assert "CUDA_CACHE_PATH" not in os.environ


def test_doctor_reports_the_imported_set_and_whether_the_driver_uses_it(tmp_path, warmed):
    import subprocess
    import sys
    from conftest import REPO
    root = str(tmp_path / "cache")
    driverjit.install(_bundle(tmp_path, warmed), root, H200)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_CACHE_PATH"}
    env.update(PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=root, PTXBACKEND_DEVICE_CC="9.0")

    def doctor(**extra):
        proc = subprocess.run([sys.executable, "-m", "ptxbackend", "doctor", "--json"], env=dict(env, **extra),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        return json.loads(proc.stdout)

    used = doctor(CUDA_CACHE_PATH=driverjit.managed_dir(root))
    imported = used["driver_jit_cache"]["imported"]
    assert imported["in_use"] and imported["complete"] and imported["needs_maxsize"] == 5000 + 300 + 500
    assert not [w for w in used["warnings"] if "imported" in w]
    elsewhere = doctor(CUDA_CACHE_PATH=str(tmp_path / "own-cache"))
    assert not elsewhere["driver_jit_cache"]["imported"]["in_use"]
    assert [w for w in elsewhere["warnings"] if "was imported into" in w]
