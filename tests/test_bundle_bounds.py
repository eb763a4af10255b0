"""The bounded reader is the first and only reader of a bundle: a small archive whose headers declare
gigabytes is refused from its declared sizes, with little memory, by `cache import` of either kind
of bundle (nothing sniffs the archive with tarfile or gzip before the bounds apply)."""

import io
import json
import os
import subprocess
import sys
import tarfile
import zlib

import pytest

from conftest import REPO

# Peak memory a refusal may take (the interpreter and ptxbackend are ~25 MiB of it); 0.4.0 took
# 1168 MiB for the archive below.  Generous on purpose: it tells "bounded" from "read whole".
PEAK_LIMIT_KIB = 200 << 10


def _header(name, size, typeflag):
    """A ustar header block, with its checksum, that tarfile takes as written."""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108] = b"0000600\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = ("%011o\0" % size).encode("ascii")
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = typeflag
    block[257:265] = b"ustar\x0000"
    block[148:156] = ("%06o\0 " % sum(block)).encode("ascii")
    return bytes(block)


def _gzip_with_zeros(path, head, zeros):
    """``head``, then ``zeros`` bytes of zeros, gzip-compressed into ``path`` (about 1 MB for 1 GiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as handle:
        handle.write(packer.compress(head))
        for _ in range(zeros >> 20):
            handle.write(packer.compress(chunk))
        handle.write(packer.flush())


@pytest.fixture(scope="session")
def pax_bomb(tmp_path_factory):
    """A 1 MB .tgz whose first member is a pax header declaring 1 GiB (and holding it: zeros)."""
    path = str(tmp_path_factory.mktemp("bundles") / "pax-1gib.tgz")
    _gzip_with_zeros(path, _header(b"././@PaxHeader", 1 << 30, tarfile.XHDTYPE), 1 << 30)
    assert os.path.getsize(path) < 2 << 20
    return path


# A child's own ru_maxrss starts at its parent's: Linux carries the forked copy's high-water mark across
# exec, so a child of a 200 MiB pytest reads 200 MiB before it does anything.  A small launcher runs the
# measured child and reads RUSAGE_CHILDREN, whose start is the launcher's own few MiB.
LAUNCHER = r"""
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      universal_newlines=True)
sys.stdout.write(proc.stdout)
sys.stderr.write(proc.stderr)
print("exit-status", proc.returncode)
print("peak", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_in_child(code, tmp_path):
    """Run ``code`` in a fresh interpreter; ``(its stdout lines, stderr, its peak RSS in KiB)``."""
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, code], env=env, cwd=str(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    lines = proc.stdout.split("\n")
    peak = [int(line.split()[1]) for line in lines if line.startswith("peak ")]
    assert proc.returncode == 0 and peak and "exit-status 0" in lines, (proc.stdout, proc.stderr)
    return [line for line in lines if line and not line.startswith(("peak ", "exit-status "))], proc.stderr, peak[0]


def test_cache_import_refuses_a_pax_header_declaring_a_gigabyte_with_little_memory(pax_bomb, tmp_path):
    code = ("from ptxbackend.cli.commands import main\n"
            "try:\n    code = main(['cache', 'import', %r])\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            "print('exit', code)\n" % pax_bomb)
    out, err, peak = _peak_in_child(code, tmp_path)
    assert out == ["exit 1"] and "Traceback" not in err, (out, err)
    assert pax_bomb in err and "extension header of 1073741824 bytes" in err and "nothing was imported" in err
    assert len(err.strip().splitlines()) == 1, err
    assert peak < PEAK_LIMIT_KIB, "a 1 MB bundle took %d MiB to refuse" % (peak >> 10)
    assert not list((tmp_path / "cache").rglob("*.ptx"))


@pytest.mark.parametrize("reader", [
    "from ptxbackend.cache import bundle, DirectoryStore\n"
    "bundle.import_bundle(DirectoryStore(%r), %r)",
    "from ptxbackend.deploy import jit_bundle\n"
    "jit_bundle.install(%r, %r, {'driver_build': '1', 'gpus': []})",
    "from ptxbackend.deploy import jit_bundle\n"
    "print('is a driver-JIT bundle:', jit_bundle.is_bundle(%r or %r))",
], ids=["kernel-bundle", "driver-jit-bundle", "kind-of-bundle"])
def test_each_reader_of_a_bundle_refuses_the_header_before_reading_it(pax_bomb, tmp_path, reader):
    target = str(tmp_path / "target")
    args = (target, pax_bomb) if "import_bundle" in reader else (pax_bomb, target)
    code = ("from ptxbackend.errors import CacheError\n"
            "try:\n    " + (reader % args).replace("\n", "\n    ") +
            "\nexcept CacheError as exc:\n    print('refused:', exc)\n")
    out, err, peak = _peak_in_child(code, tmp_path)
    assert out in (["is a driver-JIT bundle: False"],) or (
        len(out) == 1 and out[0].startswith("refused:") and "extension header" in out[0]), (out, err)
    assert peak < PEAK_LIMIT_KIB, "%d MiB" % (peak >> 10)


def _tar_gz(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def test_a_pax_header_of_a_long_member_name_is_still_read(tmp_path):
    from ptxbackend.cache import archive
    long_name = "v4/" + "d" * 150 + "/entry.ptx"
    path = tmp_path / "long.tgz"
    path.write_bytes(_tar_gz([(long_name, b"x")]))
    assert archive.first_member_name(str(path), 1 << 20) == long_name


def test_a_later_member_with_a_huge_pax_header_is_refused_by_its_declared_size(tmp_path):
    from ptxbackend.cache import DirectoryStore, bundle
    from ptxbackend.errors import CacheError
    manifest = json.dumps({"format": bundle.BUNDLE_FORMAT, "schema": bundle.SCHEMA_VERSION,
                           "files": []}).encode()
    head = _header(bundle.MANIFEST.encode(), len(manifest), tarfile.REGTYPE) + manifest.ljust(512, b"\0")
    path = str(tmp_path / "later.tgz")
    _gzip_with_zeros(path, head + _header(b"././@PaxHeader", 1 << 30, tarfile.XHDTYPE), 4 << 20)
    with pytest.raises(CacheError) as info:
        bundle.import_bundle(DirectoryStore(str(tmp_path / "target")), path)
    assert "extension header of 1073741824 bytes" in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_bundle_that_is_no_regular_file_is_refused_without_waiting(tmp_path, kind):
    """The API has no command line checking the file first: the bounded reader refuses a FIFO itself."""
    import threading
    from ptxbackend.cache import DirectoryStore, bundle
    from ptxbackend.deploy import jit_bundle
    from ptxbackend.errors import CacheError
    path = str(tmp_path / "bundle.tgz")
    os.mkfifo(path) if kind == "fifo" else os.mkdir(path)
    outcome = []

    def attempt():
        try:
            bundle.import_bundle(DirectoryStore(str(tmp_path / "target")), path)
        except CacheError as exc:
            outcome.append(str(exc))
        outcome.append(jit_bundle.is_bundle(path))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():
        with open(path, "wb"):  # let the stuck reader go before failing
            pass
        pytest.fail("import of a FIFO waited for a writer")
    assert outcome[-1] is False and "not a regular file" in outcome[0], outcome
