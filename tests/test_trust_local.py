"""Issue 25's local rows: what a bundle, the cache root, the start-up hook and a library name from
outside can make ptxbackend do.  Real files, real symlinks, real archives, real subprocesses; each
input is valid but for the one thing its check is about."""

import errno
import os
import subprocess
import sys

import pytest

from conftest import REPO

from ptxbackend.files import private as _fsutil


def test_a_lock_file_is_opened_without_following_a_symlink(tmp_path):
    # A dangling link: opening through it with O_CREAT would create the file it names (anywhere the
    # victim can write); with O_NOFOLLOW the open fails and nothing is created.
    target = tmp_path / "created-through-the-link"
    lock_path = tmp_path / "entry.lock"
    os.symlink(str(target), str(lock_path))
    with pytest.raises(OSError) as raised:
        with _fsutil.exclusive_lock(str(lock_path), 1.0):
            pass
    assert raised.value.errno in (errno.ELOOP, errno.EMLINK)
    assert not os.path.lexists(str(target))
    # The same call on a plain path works (the input is otherwise valid).
    with _fsutil.exclusive_lock(str(tmp_path / "plain.lock"), 1.0):
        pass


KERNEL = 'extern "C" __global__ void trust_%s(float* y) { y[threadIdx.x] += 1.0f; }\n'


def fleet_env(valkey, tmp_path, **changes):
    """The environment of a CLI run against the real server, in a namespace of this test's own."""
    key = tmp_path / "fleet.key"
    if not key.exists():
        key.write_bytes(os.urandom(32).hex().encode())
        os.chmod(str(key), 0o600)
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("PTXBACKEND_")
               or k.startswith("PTXBACKEND_TEST"))
    env.update(PYTHONPATH=REPO, PTXBACKEND_REMOTE=valkey.url, PTXBACKEND_REMOTE_KEY_FILE=str(key),
               PTXBACKEND_REMOTE_NAMESPACE="trust-%s" % tmp_path.name, PTXBACKEND_REMOTE_TIMEOUT="5",
               PTXBACKEND_CACHE_DIR=os.environ["PTXBACKEND_CACHE_DIR"])
    env.update(changes)
    return env


def cli(env, *args):
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, cwd=str(env.get("CWD", REPO)))


def test_cache_push_works_on_a_cache_without_dependency_sets(valkey, tmp_path, nvcc13):
    import shutil
    import ptxbackend
    art = ptxbackend.compile(KERNEL % "push", target="compute_75")
    depsets_dir = os.path.join(art.store.local.base, "depsets")
    shutil.rmtree(depsets_dir, ignore_errors=True)  # a cache an NVRTC-only box or an import filled
    proc = cli(fleet_env(valkey, tmp_path), "cache", "push")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pushed ") and "Traceback" not in proc.stderr


def _planted_library(directory):
    """A file in ``directory`` that a loader would accept as a library (any bytes do for the search)."""
    path = directory / "cudnn"
    path.write_bytes(b"\x7fELF planted")
    return path


def test_a_library_name_never_resolves_to_a_file_in_the_working_directory(tmp_path, monkeypatch):
    from ptxbackend.deploy import library_warmup as libwarm
    planted = _planted_library(tmp_path)
    monkeypatch.chdir(str(tmp_path))
    try:
        found = libwarm.find_library("cudnn")
    except OSError as exc:
        found = None
        assert "no libcudnn.so" in str(exc)
    assert found is None or not found.startswith(str(tmp_path)), found
    # Named as a path, the same file is the user's choice and is taken.
    assert libwarm.find_library("./cudnn") == str(planted)


def test_the_wheel_search_skips_the_working_directory_python_put_first(tmp_path, monkeypatch):
    from ptxbackend.gpu import libraries as libsearch
    lib = tmp_path / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.9").write_bytes(b"\x7fELF planted")
    monkeypatch.chdir(str(tmp_path))
    for first in ("", str(tmp_path)):  # python -c puts '', python -m the directory itself
        monkeypatch.setattr(sys, "path", [first] + [p for p in sys.path if p not in ("", str(tmp_path))])
        found, _looked = libsearch.find_cuda_library("cudnn")
        assert found is None or not found.startswith(str(tmp_path)), (first, found)
    # The same directory as a later sys.path entry (a site directory the user added) is searched.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))] + [str(tmp_path)])
    assert libsearch.find_cuda_library("cudnn")[0] == str(lib / "libcudnn.so.9")


def test_warm_libs_with_a_file_of_that_name_in_the_working_directory_is_one_clear_line(tmp_path):
    _planted_library(tmp_path)
    env = dict(os.environ, PYTHONPATH=REPO, CWD=str(tmp_path), CUDA_PATH="", CUDA_HOME="", LD_LIBRARY_PATH="")
    proc = cli(env, "warm", "--libs", "cudnn")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert str(tmp_path / "cudnn") not in proc.stdout + proc.stderr


NOBODY = 65534
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="planting a link of another user needs chown (root)")


_OLD_ENTRY = os.path.join("nvcc-11.2", "compute_75", "ab", "ab" * 32 + ".ptx")


def _victim_with_old_layouts(tmp_path):
    """A private directory of the user's own holding what `cache prune` would delete in a cache: the
    trees 0.1 and 0.2 wrote (an entry each, named by its key, with their magic and schema)."""
    victim = tmp_path / "victim"
    for number, layout in ((1, "v1"), (2, "v2")):
        entry = victim / layout / _OLD_ENTRY
        entry.parent.mkdir(parents=True)
        entry.write_bytes(b"PTXB" + bytes([number, 0]) + b"precious")
    for path in (victim, victim / "v1", victim / "v2"):
        os.chmod(str(path), 0o700)
    return victim


def _sticky(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(str(sticky), 0o1777)
    return sticky


@needs_root
def test_a_cache_root_that_is_another_users_link_is_refused_and_nothing_is_pruned(tmp_path):
    victim = _victim_with_old_layouts(tmp_path)
    planted = _sticky(tmp_path) / "cache"
    os.symlink(str(victim), str(planted))
    os.lchown(str(planted), NOBODY, NOBODY)  # another user planted it in /tmp
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(planted))
    proc = cli(env, "cache", "prune")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "symbolic link %s, which belongs to uid %d" % (planted, NOBODY) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (victim / "v1" / _OLD_ENTRY).exists() and (victim / "v2" / _OLD_ENTRY).exists()
    assert not (victim / "v4").exists()  # nothing was created through the link either
    # The same link of the user's own is the user's choice: prune works and removes the old layouts.
    os.lchown(str(planted), 0, 0)
    proc = cli(env, "cache", "prune")
    assert proc.returncode == 0, proc.stderr
    assert not (victim / "v1").exists() and not (victim / "v2").exists()


def test_old_layouts_are_removed_through_the_root_descriptor_never_through_a_link(tmp_path):
    from ptxbackend.cache import DirectoryStore
    outside = _victim_with_old_layouts(tmp_path)
    root = tmp_path / "cache"
    store = DirectoryStore(str(root))
    (root / "v2").mkdir(mode=0o700)
    os.symlink(str(outside / "v1" / "nvcc-11.2"), str(root / "v2" / "nvcc-11.2"))  # a link inside an old layout
    os.symlink(str(outside / "v1"), str(root / "v1"))  # an old layout that is a link
    # Neither is a tree ptxbackend wrote (it made no links): both are left alone, and named.
    assert store.old_layouts() == [] and store.unknown_items() == ["v1", "v2"]
    assert store.remove_old_layouts() == []
    assert os.path.islink(str(root / "v1")) and os.path.islink(str(root / "v2" / "nvcc-11.2"))
    assert (outside / "v1" / _OLD_ENTRY).read_bytes() == b"PTXB\x01\x00precious"


HOOK = "import os, _ptxbackend_pth; _ptxbackend_pth.install(); print(os.environ.get('CUDA_CACHE_PATH'))"


def _hook_points_at(root, **env_changes):
    """What a new interpreter's start-up hook sets CUDA_CACHE_PATH to, and its stderr lines."""
    env = dict((k, v) for k, v in os.environ.items() if k != "CUDA_CACHE_PATH")
    env.update(PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(root))
    env.update(env_changes)
    proc = subprocess.run([sys.executable, "-c", HOOK], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr.strip().splitlines()


def _imported_set(root):
    """A cache directory holding an imported driver-JIT set, private as ptxbackend makes it."""
    (root / "driver-jit").mkdir(parents=True)
    os.chmod(str(root), 0o700)
    os.chmod(str(root / "driver-jit"), 0o700)
    return root / "driver-jit"


@pytest.mark.parametrize("how", ["root group-writable", "parent world-writable, not sticky"])
def test_the_hook_never_points_the_driver_at_a_cache_others_can_write(tmp_path, how):
    root = tmp_path / "shared" / "cache"
    managed = _imported_set(root)
    assert _hook_points_at(root) == (str(managed), [])  # valid as made: used
    if how == "root group-writable":
        os.chmod(str(root), 0o770)
    else:
        os.chmod(str(tmp_path / "shared"), 0o777)
    pointed, stderr = _hook_points_at(root)
    assert pointed == "None" and len(stderr) == 1 and "driver JIT cache is left at the driver's default" in stderr[0]


@needs_root
@pytest.mark.parametrize("how", ["cache dir of another user", "driver-jit of another user",
                                 "another user's link as the cache dir", "XDG_CACHE_HOME of another user"])
def test_the_hook_never_points_the_driver_at_another_users_directory(tmp_path, how):
    theirs = tmp_path / "home-of-nobody" / "ptxbackend"  # what the other user's own cache looks like
    managed = _imported_set(theirs)
    os.chmod(str(tmp_path / "home-of-nobody"), 0o755)
    env = {}
    root = theirs
    if how == "cache dir of another user":
        os.chown(str(theirs), NOBODY, NOBODY)
        os.chown(str(managed), NOBODY, NOBODY)
    elif how == "driver-jit of another user":
        os.chown(str(managed), NOBODY, NOBODY)
    elif how == "another user's link as the cache dir":
        root = _sticky(tmp_path) / "cache"
        os.symlink(str(theirs), str(root))
        os.lchown(str(root), NOBODY, NOBODY)
    else:
        os.chown(str(theirs), NOBODY, NOBODY)
        os.chown(str(managed), NOBODY, NOBODY)
        env = {"PTXBACKEND_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path / "home-of-nobody")}
    pointed, stderr = _hook_points_at(root, **env)
    assert pointed == "None", how
    assert len(stderr) == 1 and ("uid %d" % NOBODY) in stderr[0]


# -- bundles: read front to back, sizes that are sizes, signatures first (rows 1, 6, 8; issue 26) -----------

import bz2  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import tarfile  # noqa: E402
import time  # noqa: E402

from ptxbackend.deploy import jit_bundle as driverjit  # noqa: E402
from ptxbackend.cache import DirectoryStore, bundle  # noqa: E402
from ptxbackend.cache.keys import SCHEMA_VERSION  # noqa: E402
from ptxbackend.errors import CacheError  # noqa: E402
from test_deploy import DEPSET, DEPSET_NAME, ENTRY_NAME, _bundle_of, _entry_bytes  # noqa: E402
from test_driverjit import H200, KEY, _bundle, _members, _rebuild, warmed  # noqa: E402,F401


def _manifest_of(files):
    return {"format": bundle.BUNDLE_FORMAT, "schema": SCHEMA_VERSION,
            "files": [{"name": n, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()]}


def _header(name, size, kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _padded(data):
    return data + b"\0" * (-len(data) % 512)


def _manifest_member(files):
    """The raw tar member of a true manifest of ``files``."""
    manifest = json.dumps(_manifest_of(files)).encode()
    return _header(bundle.MANIFEST, len(manifest)) + _padded(manifest)


def _import(tmp_path, path, key=None):
    return bundle.import_bundle(DirectoryStore(str(tmp_path / "line-pc")), path, key)


def _valid_files():
    return {ENTRY_NAME: _entry_bytes(), DEPSET_NAME: DEPSET}


@pytest.mark.parametrize("size", [-1, 1.5, "52", True, None])
def test_a_manifest_size_that_is_not_a_whole_number_of_bytes_is_refused(tmp_path, size):
    files = _valid_files()
    manifest = _manifest_of(files)
    manifest["files"][0]["size"] = size
    path = str(tmp_path / "b.tar")
    with tarfile.open(path, "w") as archive:
        for name, data in [(bundle.MANIFEST, json.dumps(manifest).encode())] + list(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(CacheError, match="has the size"):
        _import(tmp_path, path)


def _raw_bundle(path, manifest_bytes, tail=b""):
    """A plain tar whose first member is ``manifest_bytes`` (any bytes), then the valid files, then ``tail``."""
    parts = [_header(bundle.MANIFEST, len(manifest_bytes)), _padded(manifest_bytes)]
    for name, data in _valid_files().items():
        parts += [_header(name, len(data)), _padded(data)]
    with open(path, "wb") as out:
        out.write(b"".join(parts) + tail + b"\0" * 1024)
    return path


@pytest.mark.parametrize("manifest", ["Infinity", "NaN", "nested"])
def test_a_manifest_that_is_no_json_ptxbackend_writes_is_one_clear_line(tmp_path, manifest):
    text = json.dumps(_manifest_of(_valid_files()))
    if manifest == "nested":
        text = "[" * 200000 + "]" * 200000  # RecursionError in json.loads
    else:
        text = text.replace('"size": %d' % len(_entry_bytes()), '"size": %s' % manifest, 1)
    path = _raw_bundle(str(tmp_path / "b.tar"), text.encode())
    with pytest.raises(CacheError, match="no valid"):
        _import(tmp_path, path)
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = cli(env, "cache", "import", path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("gpus", [[1], ["NVIDIA H200"], [{"name": "NVIDIA H200", "cc": "90"}], "H200"])
def test_a_driver_jit_manifest_with_a_gpu_list_of_other_things_is_one_clear_error(tmp_path, warmed, gpus):
    members = _members(_bundle(tmp_path, warmed))
    manifest = json.loads(members[0][1])
    manifest["gpus"] = gpus
    raw = json.dumps(manifest).encode()
    members[0][0].size = len(raw)
    path = _rebuild(str(tmp_path / "gpus.tgz"), [(members[0][0], raw)] + members[1:])
    with pytest.raises(CacheError, match="no valid"):
        driverjit.install(path, str(tmp_path / "cache"), H200)


def _bz2_bomb(path, gigabytes):
    """A .tar.bz2: a valid bundle's manifest and files, then an unlisted member of ``gigabytes`` GiB of
    zeros.  bzip2 streams concatenate, so the zeros are one small stream repeated."""
    files = _valid_files()
    head = [_manifest_member(files), _header(ENTRY_NAME, len(files[ENTRY_NAME])),
            _padded(files[ENTRY_NAME]), _header(DEPSET_NAME, len(DEPSET)), _padded(DEPSET)]
    size = gigabytes << 30
    zeros = bz2.compress(bytes(64 << 20), 9)
    with open(path, "wb") as out:
        out.write(bz2.compress(b"".join(head) + _header(bundle.LAYOUT + "/bomb", size)))
        for _ in range(size // (64 << 20)):
            out.write(zeros)
    return path


def _refused_at_the_first_stray_member(tmp_path, path, what):
    """Seconds until the import of ``path`` refuses its first unlisted member (printed as a figure)."""
    started = time.time()
    with pytest.raises(CacheError, match="unexpected member"):
        _import(tmp_path, path)
    elapsed = time.time() - started
    print("reliability: %s: archive_bytes=%d, refused_after_s=%.3f" % (what, os.path.getsize(path), elapsed))
    return elapsed


def test_a_bz2_bomb_in_an_unlisted_member_is_refused_before_it_is_unpacked(tmp_path):
    path = _bz2_bomb(str(tmp_path / "bomb.tar.bz2"), 21)
    # A scan of the members first decompresses all 21 GiB: about 90 s.
    assert _refused_at_the_first_stray_member(tmp_path, path, "bz2 bomb of 21 GiB") < 10


def test_an_archive_that_unpacks_past_its_manifest_is_stopped_at_the_budget(tmp_path):
    """A pax extension header of 256 MiB before a listed file: tarfile reads such a header whole, before
    any member check could see it; the decompressed bytes are counted as they are produced."""
    files = _valid_files()
    pax = 256 << 20
    raw = _manifest_member(files) + _header("pax", pax, tarfile.XHDTYPE)
    path = str(tmp_path / "pax.tar.gz")
    chunk = bytes(1 << 20)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(raw)
        for _ in range(pax >> 20):
            out.write(chunk)
        for name, data in files.items():
            out.write(_header(name, len(data)) + _padded(data))
        out.write(b"\0" * 1024)
    with pytest.raises(CacheError, match="unpacks to more than its manifest declares"):
        _import(tmp_path, path)


def test_four_hundred_thousand_empty_members_are_refused_at_the_first(tmp_path):
    """Issue 26: an archive of 400,000 empty members; a scan of all members took 31 s before the first
    was refused.  Read in archive order, the first one that is not listed is refused."""
    empty = _header(bundle.LAYOUT + "/nvcc-13.0.88/compute_75/ab/empty.ptx", 0)
    path = str(tmp_path / "many.tar.gz")
    with gzip.open(path, "wb") as out:
        out.write(_manifest_member(_valid_files()))
        for _ in range(400):
            out.write(empty * 1000)
        out.write(b"\0" * 1024)
    assert _refused_at_the_first_stray_member(tmp_path, path, "400000 empty members") < 3


def test_an_unsigned_driver_jit_bundle_is_refused_before_any_file_is_read(tmp_path, warmed):
    # A member the manifest does not list comes first: refused for it, the check ran after the files.
    members = _members(_bundle(tmp_path, warmed))
    stray = tarfile.TarInfo("jit/stray")
    stray.size = 4
    path = _rebuild(str(tmp_path / "unsigned.tgz"), members[:1] + [(stray, b"evil")] + members[1:])
    with pytest.raises(CacheError, match="is not signed"):
        driverjit.install(path, str(tmp_path / "cache"), H200, key=KEY)
    with pytest.raises(CacheError, match="unexpected member"):  # without a key: the stray member
        driverjit.install(path, str(tmp_path / "cache"), H200)


# -- row 1: kernel bundles signed; entries that arrived unsigned never leave; nvcc entries need their set ---

OTHER_KEY = b"another fleet key, 16 bytes or more"


def _bundle_signed_with(tmp_path, key, files=None, name="signed.tar.gz", stray_first=False):
    """A kernel bundle as export_bundle writes it, signed with ``key`` (``None``: unsigned)."""
    files = files or _valid_files()
    manifest = json.dumps(_manifest_of(files), indent=1, sort_keys=True).encode()
    path = str(tmp_path / name)
    with tarfile.open(path, "w:gz") as archive:  # as export writes them: the CLI takes only gzip
        members = [(bundle.MANIFEST, manifest)]
        if key is not None:
            members.append((bundle.SIGNATURE, archive_sign(key, manifest)))
        if stray_first:
            members.append((bundle.LAYOUT + "/nvcc-13.0.88/compute_75/cd/stray.ptx", b"stray"))
        for member in members + list(files.items()):
            bundle.add_member(archive, *member)
    return path


def archive_sign(key, manifest):
    from ptxbackend.cache import archive
    return archive.sign(key, bundle._MAC_CONTEXT, manifest)


def test_with_a_fleet_key_only_kernel_bundles_signed_with_it_import(tmp_path):
    assert _import(tmp_path, _bundle_signed_with(tmp_path, KEY), KEY) == (1, 0)
    for key, why in ((None, "is not signed"), (OTHER_KEY, "signed with another key")):
        # A stray member right after the manifest: the signature is refused first, before any file.
        path = _bundle_signed_with(tmp_path, key, name="other.tar", stray_first=True)
        with pytest.raises(CacheError, match=why):
            bundle.import_bundle(DirectoryStore(str(tmp_path / "c2")), path, KEY)
        assert not os.path.exists(str(tmp_path / "c2" / bundle.LAYOUT / "nvcc-13.0.88"))
    # Without a key configured, an unsigned bundle imports as before.
    assert bundle.import_bundle(DirectoryStore(str(tmp_path / "c3")), _bundle_signed_with(tmp_path, None)) == (1, 0)


def test_export_with_a_key_is_signed_and_imports_where_the_key_is(tmp_path, nvcc13):
    import ptxbackend
    ptxbackend.compile(KERNEL % "signed", target="compute_75")
    store = DirectoryStore(os.environ["PTXBACKEND_CACHE_DIR"])
    path = str(tmp_path / "box.tgz")
    assert bundle.export_bundle(store, path, key=KEY) == 1
    assert bundle.import_bundle(DirectoryStore(str(tmp_path / "line-pc")), path, KEY) == (1, 0)


def test_an_nvcc_entry_without_its_dependency_set_is_refused(tmp_path):
    bare = _entry_bytes(deps=b"")  # the forged entry of row 1: a real key, an empty dependency list
    with pytest.raises(CacheError, match="nvcc entry without a dependency set"):
        _import(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: bare}, with_depset=False))
    with pytest.raises(CacheError, match="dependency set .* is neither in the bundle nor in this cache"):
        _import(tmp_path, _bundle_of(tmp_path, {ENTRY_NAME: _entry_bytes()}, with_depset=False))
    assert not os.path.exists(str(tmp_path / "line-pc" / bundle.LAYOUT / "nvcc-13.0.88"))
    # An NVRTC entry (its headers are the caller's strings) needs none.
    nvrtc_name = ENTRY_NAME.replace("nvcc-13.0.88", "nvrtc-12.0")
    from ptxbackend.cache import entry
    blob = entry.encode(b"// a kernel\n", {"key": "ab" * 32, "kind": "ptx", "producer": "nvrtc-12.0"})
    assert _import(tmp_path, _bundle_of(tmp_path, {nvrtc_name: blob}, with_depset=False)) == (1, 0)


def _server_names(valkey, namespace):
    import redis
    client = redis.Redis(host="127.0.0.1", port=valkey.port, password=valkey.password)
    return sorted(k.decode().split("/", 1)[1] for k in client.keys(namespace + ":v*"))


def test_cache_push_never_uploads_entries_that_arrived_unsigned(valkey, tmp_path, nvcc13):
    import ptxbackend
    art = ptxbackend.compile(KERNEL % "own", target="compute_75")  # compiled here: pushed
    box = os.environ["PTXBACKEND_CACHE_DIR"]
    unsigned = _bundle_signed_with(tmp_path, None)
    assert bundle.import_bundle(DirectoryStore(box), unsigned) == (1, 0)  # no key configured yet
    env = fleet_env(valkey, tmp_path)
    refused = cli(env, "cache", "import", unsigned)  # with the key configured: refused
    assert refused.returncode == 1 and "is not signed" in refused.stderr and "Traceback" not in refused.stderr
    proc = cli(env, "cache", "push")
    assert proc.returncode == 0, proc.stderr
    assert "kept 1 entry that arrived in an unsigned bundle" in proc.stdout
    names = _server_names(valkey, env["PTXBACKEND_REMOTE_NAMESPACE"])
    assert art.name in names and ENTRY_NAME.split("/", 1)[1] not in names
    # Nor does a signed export carry it.
    path = str(tmp_path / "box.tgz")
    assert bundle.export_bundle(DirectoryStore(box), path, key=KEY) == 1  # its own entry only
    # The same bundle signed vouches for it: now it goes.
    bundle.import_bundle(DirectoryStore(box), _bundle_signed_with(tmp_path, KEY, name="again.tar.gz"), KEY)
    assert cli(env, "cache", "push").returncode == 0
    assert ENTRY_NAME.split("/", 1)[1] in _server_names(valkey, env["PTXBACKEND_REMOTE_NAMESPACE"])


# -- issue 38 row 3: provenance follows the PTX to its driver cubin ----------------------------------------

def _driver_stood_in_by_nvcc(monkeypatch, nvcc13, tmp_path):
    """No GPU here: the driver's JIT of a PTX entry is stood in for by a real sm_90 cubin that nvcc 13
    makes of that PTX, returned where the driver's link would return its own."""
    from ptxbackend.compiling import image
    from ptxbackend.gpu import driver
    made = []

    def link_ptx(ptx):
        src, out = tmp_path / ("jit%d.ptx" % len(made)), tmp_path / ("jit%d.cubin" % len(made))
        src.write_bytes(bytes(ptx))
        subprocess.run([nvcc13, "-cubin", "-arch=sm_90", str(src), "-o", str(out)], check=True)
        made.append(out.read_bytes())
        return made[-1]

    monkeypatch.setattr(driver, "link_ptx", link_ptx)
    monkeypatch.setattr(driver, "driver_build", lambda: "580.159.04")
    monkeypatch.setattr(image, "current_device_cc", lambda: 90)
    return made


def test_a_jit_cubin_of_an_entry_that_arrived_unsigned_never_reaches_the_fleet(valkey, tmp_path, nvcc13,
                                                                               monkeypatch):
    import ptxbackend
    from ptxbackend.cache.remote import RemoteStore
    from ptxbackend.compiling import engine, image
    made = _driver_stood_in_by_nvcc(monkeypatch, nvcc13, tmp_path)
    # Another machine's PTX entry, in a bundle nobody signed, imported on the build box.
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(tmp_path / "elsewhere"))
    ptxbackend.compile(KERNEL % "unsigned_jit", target="compute_75")
    unsigned = str(tmp_path / "unsigned.tgz")
    assert bundle.export_bundle(DirectoryStore(str(tmp_path / "elsewhere")), unsigned) == 1
    box = str(tmp_path / "box")
    assert bundle.import_bundle(DirectoryStore(box), unsigned)[0] == 1
    # The build box, rw on the fleet store, loads it (the driver makes its cubin) and one of its own.
    env = fleet_env(valkey, tmp_path, PTXBACKEND_CACHE_DIR=box)
    for name, value in env.items():
        if name.startswith("PTXBACKEND_"):
            monkeypatch.setenv(name, value)
    engine._reset_for_tests()
    imported = ptxbackend.compile(KERNEL % "unsigned_jit", target="compute_75")
    own = ptxbackend.compile(KERNEL % "own_jit", target="compute_75")
    assert imported.cache_hit and not own.cache_hit
    for art in (imported, own):
        assert image.loadable_image(art, True)[1] == "cubin"
    assert len(made) == 2
    jit_of = dict((art, image.jit_name(art, 90)) for art in (imported, own))
    namespace = env["PTXBACKEND_REMOTE_NAMESPACE"]
    names = _server_names(valkey, namespace)
    assert jit_of[own] in names  # the upload path works: this machine's own kernel's cubin went
    assert jit_of[imported] not in names and imported.name not in names
    # Nor does a push carry it later, though the cubin was made here.
    cache = own.store
    cache.push()
    assert cache.push_withheld == 2  # the imported PTX and its cubin
    assert jit_of[imported] not in _server_names(valkey, namespace)
    # A fresh read-only line PC: the box's own cubin verifies, the other is no hit at all.
    key = open(env["PTXBACKEND_REMOTE_KEY_FILE"], "rb").read()
    line_pc = RemoteStore(valkey.url, key, mode="ro", namespace=namespace, timeout=5.0)
    assert line_pc.get(jit_of[own]) is not None
    assert line_pc.get(jit_of[imported]) is None
