"""Deployment: record and replay kernels, export and import bundles, a machine without compilers."""

import io
import json
import os
import tarfile

import pytest

import ptxbackend
from ptxbackend.cache import SCHEMA_VERSION, DirectoryStore, bundle
from ptxbackend.cache.store import LAYOUT
from ptxbackend.errors import CacheError, CompilerNotFoundError
from conftest import HIDE_NVRTC, REPO, SAXPY, count_calls, hide_nvrtc, run_python


def kernel(i):
    return SAXPY.replace("saxpy", "saxpy_%d" % i)


def test_record_then_replay_warms_a_fresh_cache(logging_nvcc, tmp_path):
    wrapper, log = logging_nvcc
    manifest = str(tmp_path / "kernels.jsonl")
    program = ("import ptxbackend\nfor i in range(3):\n"
               "    src = %r.replace('saxpy', 'saxpy_%%d' %% i)\n"
               "    ptxbackend.compile(src, ['-DX=1'], target='compute_75')\n"
               "    ptxbackend.compile(src, ['-DX=1'], target='compute_75')\n" % SAXPY)
    run_python(program, {"PTXBACKEND_RECORD": manifest, "PTXBACKEND_NVCC": wrapper})
    lines = [json.loads(line) for line in open(manifest)]
    assert len(lines) == 3 and lines[0]["options"] == ["-DX=1"] and lines[0]["target"] == "compute_75"
    assert lines[0]["compiler"] == "nvcc"
    fresh = str(tmp_path / "line-pc-cache")
    out = run_python("from ptxbackend.warm import replay; replay(%r)" % manifest,
                     {"PTXBACKEND_CACHE_DIR": fresh, "PTXBACKEND_NVCC": wrapper})
    assert "3 kernels: 3 compiled, 0 already cached, 0 failed" in out
    calls = count_calls(log)
    again = run_python("import ptxbackend\nfor i in range(3):\n"
                       "    print(ptxbackend.compile(%r.replace('saxpy', 'saxpy_%%d' %% i), ['-DX=1'],"
                       " target='compute_75').cache_hit)" % SAXPY,
                       {"PTXBACKEND_CACHE_DIR": fresh, "PTXBACKEND_NVCC": wrapper})
    assert again.split() == ["True"] * 3 and count_calls(log) == calls


def test_export_import_serves_a_machine_without_any_compiler(nvcc13, tmp_path):
    for i in range(4):
        ptxbackend.compile(kernel(i), device_cc="7.5")
    store = DirectoryStore(os.environ["PTXBACKEND_CACHE_DIR"])
    path = str(tmp_path / "line.tar.gz")
    assert bundle.export_bundle(store, path) == 4
    line_pc = str(tmp_path / "line-pc")
    added, present = bundle.import_bundle(DirectoryStore(line_pc), path)
    assert (added, present) == (4, 0)
    assert bundle.import_bundle(DirectoryStore(line_pc), path) == (0, 4)
    code = (HIDE_NVRTC + "import ptxbackend\nfor i in range(4):\n"
            "    a = ptxbackend.compile(%r.replace('saxpy', 'saxpy_%%d' %% i), device_cc='7.5')\n"
            "    print(a.cache_hit, a.producer)" % SAXPY)
    env = {"PTXBACKEND_CACHE_DIR": line_pc, "PATH": str(tmp_path / "nothing"), "CUDA_PATH": "",
           "CUDA_HOME": ""}
    out = run_python(code, env).split()
    assert out[0::2] == ["True"] * 4 and out[1].startswith("nvcc-13")


def _bundle_with(tmp_path, members, manifest):
    path = str(tmp_path / "evil.tar")
    with tarfile.open(path, "w") as archive:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo(bundle.MANIFEST)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
        for info, payload in members:
            archive.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def test_import_refuses_other_schema_and_damage(nvcc13, tmp_path):
    ptxbackend.compile(SAXPY, device_cc="7.5")
    store = DirectoryStore(os.environ["PTXBACKEND_CACHE_DIR"])
    good = str(tmp_path / "good.tar.gz")
    bundle.export_bundle(store, good)
    target = DirectoryStore(str(tmp_path / "target"))
    with pytest.raises(CacheError) as info:
        bundle.import_bundle(target, _bundle_with(tmp_path, [], {"format": 1, "schema": 99, "files": []}))
    assert "schema 99" in str(info.value) and "Export the bundle again" in str(info.value)
    link = tarfile.TarInfo(LAYOUT + "/p-1/compute_75/ab/x.ptx")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(CacheError):
        bundle.import_bundle(target, _bundle_with(tmp_path, [(link, None)], {"format": 1, "schema": SCHEMA_VERSION, "files": []}))
    escape = tarfile.TarInfo(LAYOUT + "/../../escape.ptx")
    escape.size = 1
    with pytest.raises(CacheError):
        bundle.import_bundle(target, _bundle_with(tmp_path, [(escape, b"x")], {
            "format": 1, "schema": SCHEMA_VERSION, "files": [{"name": escape.name, "sha256": "0", "size": 1}]}))
    with tarfile.open(good) as archive:
        members = [(m, archive.extractfile(m).read()) for m in archive.getmembers()]
    manifest = json.loads(members[0][1])
    flipped = [(m, d[:-1] + bytes([d[-1] ^ 1]) if m.name.endswith(".cubin") else d) for m, d in members[1:]]
    with pytest.raises(CacheError) as info:
        bundle.import_bundle(target, _bundle_with(tmp_path, flipped, manifest))
    assert "checksum" in str(info.value)
    assert list(target.entries()) == []  # nothing half-imported
    with pytest.raises(CacheError):
        bundle.import_bundle(target, os.path.join(REPO, "README.md"))


def test_cli_export_import_and_warm(nvcc13, tmp_path):
    from test_cli import cli
    source = tmp_path / "k.cu"
    source.write_text(SAXPY)
    assert cli("compile", str(source), "--device-cc", "7.5")[0] == 0
    path = str(tmp_path / "b.tar.gz")
    code, out, err = cli("cache", "export", path)
    assert code == 0 and "exported 1 entries" in out, err
    code, out, err = cli("cache", "import", path, "--cache-dir", str(tmp_path / "other"))
    assert code == 0 and "1 entries added" in out, err
    code, _, err = cli("cache", "import", str(source))
    assert code == 1 and "not a ptxbackend bundle" in err
    assert cli("warm")[0] == 2


def test_compile_without_compiler_or_cache_entry_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    hide_nvrtc(monkeypatch)
    with pytest.raises(CompilerNotFoundError) as info:
        ptxbackend.compile(SAXPY, device_cc="7.5")
    assert "Import a bundle" in str(info.value)
