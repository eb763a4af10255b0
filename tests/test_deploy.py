"""Deployment: record and replay kernels, export and import bundles, a machine without compilers."""

import hashlib
import io
import json
import os
import tarfile

import pytest

import ptxbackend
from ptxbackend.cache import SCHEMA_VERSION, DirectoryStore, bundle, entry
from ptxbackend.cache.store import LAYOUT
from ptxbackend.errors import CacheError, CompilerNotFoundError
from conftest import (HIDE_NVRTC, REPO, SAXPY, count_calls, hide_nvrtc, hide_toolkit, no_toolkit_env, requires_gpu,
                      run_python)


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
    out = run_python("from ptxbackend.deploy.replay import replay; replay(%r)" % manifest,
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
    env = dict(no_toolkit_env(tmp_path), PTXBACKEND_CACHE_DIR=line_pc)
    out = run_python(code, env).split()
    assert out[0::2] == ["True"] * 4 and out[1].startswith("nvcc-13")


def _line_pc(tmp_path, *argv, **env):
    """``ptxbackend ARGV`` as run on a line PC without any compiler (no toolkit, no NVRTC wheel)."""
    import subprocess
    import sys
    code = HIDE_NVRTC + "from ptxbackend.cli.commands import main; sys.exit(main(%r))" % (list(argv),)
    full = dict(os.environ, PYTHONPATH=REPO, **no_toolkit_env(tmp_path))
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", code], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, cwd=str(tmp_path))
    return proc.returncode, proc.stdout, proc.stderr


def test_import_names_the_entries_a_line_pc_would_never_use_and_that_is_what_then_happens(nvcc13, tmp_path):
    """A bundle that verifies but never hits: built for another GPU or target than the line asks for."""
    ptxbackend.compile(kernel(0), device_cc="7.5")  # sm_75 code: this GPU only
    ptxbackend.compile(kernel(1), target="compute_75")  # PTX: any GPU from 7.5 on, asked for as compute_75
    path = str(tmp_path / "line.tgz")
    assert bundle.export_bundle(DirectoryStore(os.environ["PTXBACKEND_CACHE_DIR"]), path) == 2
    line = {"PTXBACKEND_CACHE_DIR": str(tmp_path / "line-pc")}
    code, out, err = _line_pc(tmp_path, "cache", "import", path, "--device-cc", "7.5", **line)
    assert code == 0 and "2 entries added" in out
    assert "warning: 1 of the bundle's 2 entries will never be used here: 1 built for compute_75" in err, err
    assert "asks nvcc-13.0.88 for sm_75 (target auto)" in err and err.count("\n") == 1
    code, out, err = _line_pc(tmp_path, "cache", "import", path, "--device-cc", "8.6", "--json", **line)
    assert code == 1 and "error: no entry of the bundle will be used here" in err, err
    assert sorted(e["entry"].split("/")[1] for e in json.loads(out)["never_used"]) == ["compute_75", "sm_75"]
    line["PTXBACKEND_TARGET"] = "compute_75"
    code, out, err = _line_pc(tmp_path, "cache", "import", path, "--device-cc", "8.6", **line)
    assert code == 0 and "1 of the bundle's 2 entries" in err and "1 built for sm_75" in err, err
    # What it said is what happens: on an 8.6 line with target compute_75, the PTX hits, the cubin cannot.
    probe = (HIDE_NVRTC + "import ptxbackend\nfrom ptxbackend.errors import CompilerNotFoundError\n"
             "for i in range(2):\n"
             "    try:\n        print(ptxbackend.compile(%r.replace('saxpy', 'saxpy_%%d' %% i), device_cc='8.6')"
             ".cache_hit)\n"
             "    except CompilerNotFoundError:\n        print('never')" % SAXPY)
    assert run_python(probe, dict(no_toolkit_env(tmp_path), **line)).split() == ["never", "True"]


def test_import_says_when_this_machine_compiles_with_another_compiler_than_the_bundle_was_made_by(
        nvcc13, nvrtc_pch, tmp_path):
    ptxbackend.compile(SAXPY, target="compute_75")
    path = str(tmp_path / "line.tgz")
    bundle.export_bundle(DirectoryStore(os.environ["PTXBACKEND_CACHE_DIR"]), path)
    nvrtc = [os.path.join(nvrtc_pch, n) for n in sorted(os.listdir(nvrtc_pch)) if n.startswith("libnvrtc.so")][0]
    code, _, err = _line_pc(tmp_path, "cache", "import", path, "--device-cc", "7.5",
                            PTXBACKEND_CACHE_DIR=str(tmp_path / "line-pc"), PTXBACKEND_NVRTC=nvrtc)
    assert code == 1 and "1 made by nvcc-13.0.88, while this machine compiles with nvrtc-13.5" in err, err
    assert "Build the bundle with nvrtc-13.5" in err
    # Without --device-cc or a GPU here (an image prepared on another machine), nothing is checked.
    from conftest import gpu_available
    if not gpu_available():
        code, _, err = _line_pc(tmp_path, "cache", "import", path, PTXBACKEND_CACHE_DIR=str(tmp_path / "other"),
                                PTXBACKEND_NVRTC=nvrtc)
        assert code == 0 and err == ""


@pytest.mark.gpu
@requires_gpu
def test_import_checks_the_bundle_against_this_machines_gpu(nvcc13, tmp_path):
    from ptxbackend.gpu import driver
    cc = driver.compute_capability(0)
    other = "7.5" if cc != 75 else "8.6"
    ptxbackend.compile(SAXPY, device_cc=other)
    path = str(tmp_path / "line.tgz")
    bundle.export_bundle(DirectoryStore(os.environ["PTXBACKEND_CACHE_DIR"]), path)
    from test_cli import cli  # with this machine's compilers: on a line PC with NVRTC, the message is about it
    code, _, err = cli("cache", "import", path, env={"PTXBACKEND_CACHE_DIR": str(tmp_path / "line-pc")})
    assert code == 1 and "this machine's %s (sm_%d) asks nvcc-" % (driver.device_name(0), cc) in err, err


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
    assert code == 0 and "exported 1 entry" in out, err
    code, out, err = cli("cache", "import", path, "--cache-dir", str(tmp_path / "other"))
    assert code == 0 and "1 entry added" in out, err
    code, _, err = cli("cache", "import", str(source))
    assert code == 1 and "not a ptxbackend bundle" in err
    assert cli("warm")[0] == 2


def test_compile_without_compiler_or_cache_entry_says_so(monkeypatch, tmp_path):
    hide_toolkit(monkeypatch, tmp_path)
    hide_nvrtc(monkeypatch)
    with pytest.raises(CompilerNotFoundError) as info:
        ptxbackend.compile(SAXPY, device_cc="7.5")
    assert "Import a bundle" in str(info.value)


def test_bundle_reaches_a_line_pc_with_the_same_toolkit_as_hits(logging_nvcc, tmp_path):
    """A line PC with the build box's toolkit checks the entries' toolkit headers from the bundle's
    header lists and hits: nothing is compiled again."""
    wrapper, log = logging_nvcc
    env = {"PTXBACKEND_NVCC": wrapper, "PTXBACKEND_CACHE_DIR": str(tmp_path / "build-box")}
    code = "import ptxbackend; a = ptxbackend.compile(%r, target='compute_75'); print(a.cache_hit)" % SAXPY
    assert run_python(code, env).strip() == "False"
    path = str(tmp_path / "kernels.tgz")
    bundle.export_bundle(DirectoryStore(str(tmp_path / "build-box")), path)
    names = tarfile.open(path).getnames()
    assert any("/depsets/" in n for n in names) and not any("/meta/" in n for n in names)
    compiles = count_calls(log, "--ptx")
    bundle.import_bundle(DirectoryStore(str(tmp_path / "line-pc")), path)
    env["PTXBACKEND_CACHE_DIR"] = str(tmp_path / "line-pc")
    assert run_python(code, env).strip() == "True"
    assert count_calls(log, "--ptx") == compiles


def _valid_bundle_plus(tmp_path, name, data):
    """A bundle whose manifest lists ``name`` with its true checksum: only the kind check can refuse it."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    manifest = {"format": bundle.BUNDLE_FORMAT, "schema": SCHEMA_VERSION,
                "files": [{"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}]}
    return _bundle_with(tmp_path, [(info, data)], manifest)


def test_import_refuses_a_compiler_memo(tmp_path):
    memo = json.dumps({"fingerprint": "x", "identity": {"kind": "nvrtc", "path": "/tmp/evil.so"}}).encode()
    path = _valid_bundle_plus(tmp_path, LAYOUT + "/meta/compilers/" + "a" * 32 + ".json", memo)
    with pytest.raises(CacheError, match="unexpected member"):
        bundle.import_bundle(DirectoryStore(str(tmp_path / "c")), path)
    assert not os.path.exists(str(tmp_path / "c" / LAYOUT / "meta" / "compilers"))


def test_import_refuses_a_producer_record_that_names_a_path(tmp_path):
    record = json.dumps({"kind": "nvrtc", "version": "12.0.76", "virtual_archs": [75], "real_archs": [75],
                         "archs_reliable": True, "path": "/tmp/evil.so"}).encode()
    path = _valid_bundle_plus(tmp_path, LAYOUT + "/nvrtc-12.0.76/identity.json", record)
    with pytest.raises(CacheError, match="not a producer record"):
        bundle.import_bundle(DirectoryStore(str(tmp_path / "c")), path)


def test_import_refuses_a_dependency_set_not_named_by_its_digest(tmp_path):
    data = json.dumps({"files": [["/usr/include/stdio.h", 1, 2, 3, 4, 5, "0" * 64, True, True]],
                       "absent": [["/usr/include", 1, 2, 3, True, ["val.h"]]]}).encode()
    wrong = "ab" + "0" * 62
    path = _valid_bundle_plus(tmp_path, "%s/depsets/ab/%s.json" % (LAYOUT, wrong), data)
    with pytest.raises(CacheError, match="SHA-256 of its content"):
        bundle.import_bundle(DirectoryStore(str(tmp_path / "c")), path)
    right = hashlib.sha256(data).hexdigest()
    ok = _valid_bundle_plus(tmp_path, "%s/depsets/%s/%s.json" % (LAYOUT, right[:2], right), data)
    assert bundle.import_bundle(DirectoryStore(str(tmp_path / "c")), ok) == (0, 0)


@pytest.mark.parametrize("body", [
    [["/usr/include/stdio.h", 1, 2, 3, 4, "0" * 64, True]],                      # the 0.3 header list
    {"files": [["/x.h", 1, 2, 3, 4, 5, "0" * 64, True, True]], "absent": [], "run": "/bin/sh"},
    {"files": [["/x.h", "1", 2, 3, 4, 5, "0" * 64, True, True]], "absent": []},
    {"files": [], "absent": [["/usr/include", 1, 2, 3, True, ["../../etc/passwd"]]]},
])
def test_import_refuses_what_is_not_a_dependency_set(tmp_path, body):
    data = json.dumps(body).encode()
    right = hashlib.sha256(data).hexdigest()
    path = _valid_bundle_plus(tmp_path, "%s/depsets/%s/%s.json" % (LAYOUT, right[:2], right), data)
    with pytest.raises(CacheError, match="not a dependency set"):
        bundle.import_bundle(DirectoryStore(str(tmp_path / "c")), path)


def _real_bundle(tmp_path, nvcc13):
    store = DirectoryStore(str(tmp_path / "build-box"))
    ptxbackend.compile(SAXPY, target="compute_75", cache_dir=store.root)
    path = str(tmp_path / "kernels.tgz")
    bundle.export_bundle(store, path)
    return path


def test_export_never_writes_through_a_planted_file_and_needs_force(nvcc13, tmp_path):
    store = DirectoryStore(str(tmp_path / "build-box"))
    ptxbackend.compile(SAXPY, target="compute_75", cache_dir=store.root)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "out.tgz"
    # The old temporary name, planted as a link to a victim: a fixed name would be written through.
    os.symlink(str(victim), str(dest) + ".tmp-%d" % os.getpid())
    for pid in range(os.getpid() - 50, os.getpid() + 50):
        try:
            os.symlink(str(victim), str(tmp_path / (".out.tgz.tmp-%d" % pid)))
        except OSError:
            pass
    assert bundle.export_bundle(store, str(dest)) == 1
    assert victim.read_bytes() == b"precious"
    with pytest.raises(CacheError, match="--force"):
        bundle.export_bundle(store, str(dest))
    assert bundle.export_bundle(store, str(dest), force=True) == 1


@pytest.mark.parametrize("damage", ["truncated", "bit flip"])
def test_damaged_bundle_is_one_clear_error_and_imports_nothing(nvcc13, tmp_path, damage):
    path = _real_bundle(tmp_path, nvcc13)
    data = bytearray(open(path, "rb").read())
    if damage == "truncated":
        data = data[:len(data) * 2 // 3]
    else:
        data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    target = tmp_path / "line-pc"
    with pytest.raises(CacheError, match="damaged|checksum") as info:
        bundle.import_bundle(DirectoryStore(str(target)), path)
    assert path in str(info.value)
    assert not [p for p, _s, _m in DirectoryStore(str(target)).entries()]


def test_member_larger_than_its_manifest_says_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A small archive whose member unpacks far past the size its manifest declares."""
    import gzip
    name = LAYOUT + "/nvcc-13.0.88/compute_75/ab/" + "ab" * 32 + ".ptx"
    size = 64 << 20  # zeros compress to almost nothing
    path = str(tmp_path / "bomb.tgz")
    manifest = {"format": bundle.BUNDLE_FORMAT, "schema": SCHEMA_VERSION,
                "files": [{"name": name, "sha256": "0" * 64, "size": 1}]}
    with gzip.open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as archive:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo(bundle.MANIFEST)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(name)
        info.size = size
        archive.addfile(info, io.BytesIO(bytes(size)))
    assert os.path.getsize(path) < size // 100
    reads = []
    real_extract = tarfile.TarFile.extractfile

    def counting(self, member):
        handle = real_extract(self, member)
        reads.append(member.name)
        return handle
    monkeypatch.setattr(tarfile.TarFile, "extractfile", counting)
    with pytest.raises(CacheError, match="its manifest says 1"):
        bundle.import_bundle(DirectoryStore(str(tmp_path / "c")), path)
    assert reads == [bundle.MANIFEST]  # the member itself was never read


# Each bundle below is valid in every respect but one, so only the check named in its test can refuse it.
KEY = "ab" * 32
ENTRY_NAME = "%s/nvcc-13.0.88/compute_75/ab/%s.ptx" % (LAYOUT, KEY)


# The dependency set an nvcc entry must name (an entry of nvcc without one is refused).
DEPSET = json.dumps({"files": [], "absent": []}).encode()
DEPSET_DIGEST = hashlib.sha256(DEPSET).hexdigest()
DEPSET_NAME = "%s/depsets/%s/%s.json" % (LAYOUT, DEPSET_DIGEST[:2], DEPSET_DIGEST)


def _entry_bytes(key=KEY, deps=DEPSET_DIGEST.encode()):
    return entry.encode(b"// a kernel\n", {"key": key, "kind": "ptx", "producer": "nvcc-13.0.88"}, deps)


def _bundle_of(tmp_path, files, listed=None, extra_members=(), with_depset=True):
    """A bundle of ``files`` (name -> bytes) and the dependency set its entries name, its manifest listing
    ``listed`` (default: all, truthfully)."""
    listed = files if listed is None else listed
    if with_depset:
        files, listed = dict(files), dict(listed)
        files[DEPSET_NAME] = listed[DEPSET_NAME] = DEPSET
    manifest = {"format": bundle.BUNDLE_FORMAT, "schema": SCHEMA_VERSION,
                "files": [{"name": n, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                          for n, d in listed.items()]}
    members = []
    for name, data in files.items():
        info = tarfile.TarInfo(name)
        info.size = len(data)
        members.append((info, data))
    return _bundle_with(tmp_path, members + list(extra_members), manifest)


def _imports(tmp_path, path):
    target = DirectoryStore(str(tmp_path / "line-pc"))
    return bundle.import_bundle(target, path), target


def test_the_valid_bundle_these_tests_start_from_imports(tmp_path):
    (added, _present), target = _imports(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: _entry_bytes()}))
    assert added == 1 and len(list(target.entries())) == 1


def test_import_refuses_a_member_that_climbs_out_of_the_cache(tmp_path):
    name = "%s/../../outside/x/%s.ptx" % (LAYOUT, KEY)  # an entry name in every other respect
    with pytest.raises(CacheError, match="unexpected member"):
        _imports(tmp_path, _bundle_of(tmp_path, {name: _entry_bytes()}))
    assert not os.path.exists(str(tmp_path / "outside"))


def test_import_refuses_a_link_member_as_not_a_regular_file(tmp_path):
    """A symlink member whose manifest line matches the regular member it points to."""
    link = tarfile.TarInfo("%s/nvcc-13.0.88/compute_75/cd/%s.ptx" % (LAYOUT, "cd" * 32))
    link.type = tarfile.SYMTYPE
    link.linkname = ENTRY_NAME
    data = _entry_bytes()
    listed = {ENTRY_NAME: data, link.name: data}
    with pytest.raises(CacheError, match="not a regular file"):
        _imports(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: data}, listed, [(link, None)]))


def test_import_refuses_an_entry_that_is_not_a_valid_entry(tmp_path):
    with pytest.raises(CacheError, match="not a valid entry"):
        _imports(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: b"// raw PTX, not a cache entry\n"}))
    assert not os.path.exists(str(tmp_path / "line-pc" / LAYOUT / "nvcc-13.0.88"))


def test_import_refuses_an_entry_filed_under_another_key(tmp_path):
    with pytest.raises(CacheError, match="not a valid entry.*belongs to key"):
        _imports(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: _entry_bytes("cd" * 32)}))


def test_import_refuses_a_member_the_manifest_does_not_list(tmp_path):
    other = "%s/nvcc-13.0.88/compute_75/cd/%s.ptx" % (LAYOUT, "cd" * 32)
    files = {ENTRY_NAME: _entry_bytes(), other: _entry_bytes("cd" * 32)}
    with pytest.raises(CacheError, match="unexpected member"):
        _imports(tmp_path, _bundle_of(tmp_path, files, {ENTRY_NAME: files[ENTRY_NAME]}))


def test_import_refuses_a_bundle_missing_a_listed_file(tmp_path):
    other = "%s/nvcc-13.0.88/compute_75/cd/%s.ptx" % (LAYOUT, "cd" * 32)
    listed = {ENTRY_NAME: _entry_bytes(), other: _entry_bytes("cd" * 32)}
    with pytest.raises(CacheError, match="missing"):
        _imports(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: listed[ENTRY_NAME]}, listed))


def test_import_refuses_a_manifest_declaring_more_than_the_budget(tmp_path, monkeypatch):
    data = _entry_bytes()
    monkeypatch.setattr(bundle, "MAX_TOTAL", len(data) - 1)  # instead of a 4 GiB test file
    with pytest.raises(CacheError, match="more than an import reads"):
        _imports(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: data}))


def test_import_refuses_a_file_that_differs_from_its_manifest_checksum(tmp_path):
    """A well-formed producer record changed after export (same size): only the checksum tells."""
    name = LAYOUT + "/nvcc-13.0.88/identity.json"
    record = json.dumps({"kind": "nvcc", "version": "13.0.88", "virtual_archs": [75], "real_archs": [75],
                         "archs_reliable": True}).encode()
    changed = record.replace(b"[75]", b"[90]", 1)
    with pytest.raises(CacheError, match="does not match its checksum"):
        _imports(tmp_path, _bundle_of(tmp_path, {name: changed}, {name: record}))
