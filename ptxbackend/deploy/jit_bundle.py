"""The driver's JIT cache, shipped: pack what ``warm --libs`` warmed, verify and install it elsewhere.

An old CUDA library with only PTX for a newer GPU is JIT-compiled by the driver
in every process whose driver JIT cache misses, and at least once on every new
machine (tens of seconds for cuRAND or cuDNN).  The driver's cache is tied to
the driver build and the GPU model, and is otherwise plain files: warmed once
on a build box, it serves every identical line PC.

A driver-JIT bundle is a tar (gzip) holding ``ptxbackend-driver-jit.json`` (the
manifest: driver, GPU models, libraries, and each file's size and SHA-256), the
files of the warmed cache under ``jit/``, and, when a fleet key is configured,
``ptxbackend-driver-jit.sig`` (HMAC-SHA256 of the manifest under that key, the second member: an import
where a key is configured checks it before any file is written; :mod:`ptxbackend.cache.archive`).

An import never touches the driver cache a user already has: it fills
``<cache dir>/driver-jit/`` (a directory ptxbackend owns), replacing it whole,
and the start-up hook points ``CUDA_CACHE_PATH`` there in every new process
where the user has not set ``CUDA_CACHE_PATH`` (docs/deployment.md says why).
"""

import hashlib
import json
import os
import shutil
import stat as stat_module
import tarfile
import tempfile
import time

from ..files import private
from .._version import __version__
from ..cache import archive as archive_format
from ..cache.bundle import add_member
from ..errors import CacheError

MANIFEST = "ptxbackend-driver-jit.json"
SIGNATURE = "ptxbackend-driver-jit.sig"
FORMAT = 1
FILES = "jit"
MANAGED = "driver-jit"
RECORD = "driver-jit.json"  # the installed manifest, beside the managed directory (for doctor)
_MAC_CONTEXT = b"ptxbackend-driver-jit-1\0"
# The driver caps its cache at 4 GiB; a bundle above that cannot be a driver cache.
MAX_FILE = 4 << 30
MAX_TOTAL = 4 << 30
MAX_MANIFEST = 64 << 20
_CHUNK = 1 << 20


def managed_dir(cache_root):
    """The driver JIT cache directory ptxbackend manages under a cache root."""
    return os.path.join(os.path.expanduser(cache_root), MANAGED)


def this_machine():
    """The driver and the GPU models here, as a manifest names them (needs the driver)."""
    from ..gpu import driver
    gpus = []
    for ordinal in range(driver.device_count()):
        gpus.append({"name": driver.device_name(ordinal), "cc": driver.compute_capability(ordinal)})
    return {"driver_build": driver.driver_build(), "driver_version": driver.driver_version(), "gpus": gpus}


def fleet_key(settings):
    """The fleet key (bytes) when one is configured (PTXBACKEND_REMOTE_KEY_FILE), else ``None``.

    A configured key that cannot be used is an error: bundles would otherwise go unsigned, or be
    accepted unsigned, without anyone noticing.
    """
    path = getattr(settings, "remote_key_file", None)
    if not path:
        return None
    from ..cache.remote import read_fleet_key
    key, why = read_fleet_key(path)
    if why:
        raise CacheError(why)
    return key


def fleet_name(machine):
    """The name a driver-JIT bundle has in the fleet store: by driver build and GPU models."""
    models = sorted(set("%s-sm%d" % ("".join(c if c.isalnum() else "_" for c in g["name"]), int(g["cc"]))
                        for g in machine["gpus"]))
    return "driver-jit/%s/%s.tgz" % (machine["driver_build"], "+".join(models) or "no-gpu")


def upload(remote, bundle_path, machine):
    """Put the bundle at ``bundle_path`` in the fleet store under :func:`fleet_name`; returns the name.

    The store seals it (HMAC) like every value; the bundle keeps its own signature and checks too.
    """
    name = fleet_name(machine)
    with open(bundle_path, "rb") as handle:
        remote.put(name, handle.read())
    return name


def download(remote, machine, destination):
    """Fetch this machine's driver-JIT bundle from the fleet store into ``destination``; returns the
    name, or raises :class:`CacheError` saying what is missing."""
    name = fleet_name(machine)
    blob = remote.get(name)
    if blob is None:
        raise CacheError("the %s has no driver JIT set for %s (%s): warm and export one on a "
                         "machine with that driver and GPU, with the fleet store configured"
                         % (remote.description, name, remote.stats().get("state", "")))
    fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(blob)
    return name


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def _cache_files(jit_dir):
    """``(relative name, path, size)`` of every regular file of a driver cache directory."""
    found = []
    for base, dirs, files in os.walk(jit_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            st = os.lstat(path)
            if stat_module.S_ISREG(st.st_mode):
                found.append((os.path.relpath(path, jit_dir).replace(os.sep, "/"), path, st.st_size))
    return found


def pack(jit_dir, libraries, destination, machine, key=None, force=False):
    """Write the driver JIT cache at ``jit_dir`` (warmed for ``libraries``) to a bundle at ``destination``.

    ``machine`` is :func:`this_machine` of the machine that warmed it; ``key`` (bytes) signs the
    manifest.  Returns the manifest.  Written to a new temporary file beside the destination and
    renamed, as ``cache export`` does; an existing destination needs ``force``.
    """
    files = _cache_files(jit_dir)
    if not files:
        raise CacheError("the driver JIT cache at %s is empty: nothing was JIT-compiled there (does the "
                         "library have machine code for this GPU already?)" % jit_dir)
    manifest = {"format": FORMAT, "ptxbackend": __version__, "created": time.time(),
                "driver": {"build": machine["driver_build"], "version": machine.get("driver_version")},
                "gpus": machine["gpus"],
                "libraries": [{"path": path, "name": os.path.basename(path), "size": os.path.getsize(path),
                               "sha256": _sha256_file(path)} for path in libraries],
                "files": [{"name": name, "size": size, "sha256": _sha256_file(path)} for name, path, size in files]}
    data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    with private.new_file_beside(destination, force) as raw, tarfile.open(fileobj=raw, mode="w:gz") as archive:
        add_member(archive, MANIFEST, data)
        if key:
            add_member(archive, SIGNATURE, archive_format.sign(key, _MAC_CONTEXT, data))
        for name, path, size in files:
            info = tarfile.TarInfo(FILES + "/" + name)
            info.size, info.mode, info.mtime = size, 0o600, int(time.time())
            with open(path, "rb") as handle:
                archive.addfile(info, handle)
    return manifest


def is_bundle(source):
    """Whether ``source`` is a driver-JIT bundle (its first member is the manifest), read through the
    import's own bounds: a header declaring a gigabyte is refused, never read."""
    return archive_format.first_member_name(source, MAX_MANIFEST) == MANIFEST


def _refusal(manifest, machine):
    """Why this machine must not use a bundle built for ``manifest``'s driver and GPUs, or ``None``."""
    built = manifest["driver"]["build"]
    if built != machine["driver_build"]:
        return ("it was warmed with driver %s and this machine has driver %s: the driver does not use JIT "
                "output of another driver build. Warm and export it on a machine with driver %s."
                % (built, machine["driver_build"], machine["driver_build"]))
    models = set((g["name"], int(g["cc"])) for g in manifest["gpus"])
    here = set((g["name"], int(g["cc"])) for g in machine["gpus"])
    if not here:
        return "this machine has no GPU the driver can see"
    missing = sorted(here - models)
    if missing:
        return ("it was warmed for %s and this machine has %s: the driver JIT-compiles for each GPU "
                "model. Warm and export it on a machine with that GPU."
                % (", ".join("%s (cc %d.%d)" % (n, c // 10, c % 10) for n, c in sorted(models)),
                   ", ".join("%s (cc %d.%d)" % (n, c // 10, c % 10) for n, c in missing)))
    return None


def _safe_member_name(name):
    parts = name.split("/")
    return (len(parts) >= 2 and parts[0] == FILES and "" not in parts and ".." not in parts
            and "." not in parts and not name.startswith("/") and "\\" not in name)


def install(source, cache_root, machine, key=None):
    """Verify the bundle at ``source`` for ``machine`` and make it the managed driver JIT cache.

    Every file is checked against the manifest (size before reading, SHA-256 while reading) and
    written to a staging directory; only when all verify does the staging directory replace the
    managed one.  With ``key`` (the fleet key) the manifest's signature must verify.  Returns the
    manifest.  Raises :class:`CacheError` saying why, with nothing changed.
    """
    target = managed_dir(cache_root)
    parent = os.path.dirname(target)
    private.make_private_dirs(parent)
    staging = tempfile.mkdtemp(prefix=".driver-jit-incoming-", dir=parent)
    try:
        manifest = _unpack_verified(source, staging, machine, key)
        _swap_in(staging, target)
        staging = None
        private.write_atomic(os.path.join(parent, RECORD),
                             json.dumps(dict(manifest, installed=time.time(), directory=target),
                                        indent=1, sort_keys=True).encode("utf-8"), durable=True)
        return manifest
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging, target):
    old = None
    if os.path.lexists(target):
        if os.path.islink(target) or not os.path.isdir(target):
            raise CacheError("%s is not a directory ptxbackend made; move it away and import again" % target)
        old = tempfile.mkdtemp(prefix=".driver-jit-old-", dir=os.path.dirname(target))
        os.rename(target, os.path.join(old, "jit"))
    os.rename(staging, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _unpack_verified(source, staging, machine, key):
    import zlib
    try:
        with archive_format.Untrusted(source, MAX_MANIFEST) as reading:
            return _unpack(reading, source, staging, machine, key)
    except archive_format.OverBudget as exc:
        raise CacheError("%s unpacks to more than its manifest declares (%s): a damaged or hostile bundle; "
                         "nothing was imported" % (source, exc))
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise CacheError("%s is damaged or not a complete bundle (%s: %s); copy it again. Nothing was "
                         "imported" % (source, type(exc).__name__, exc))
    except OSError as exc:
        if exc.errno is None:  # gzip's BadGzipFile and the like: damage, not a file we cannot read
            raise CacheError("%s is damaged or not a complete bundle (%s); copy it again. Nothing was "
                             "imported" % (source, exc))
        raise CacheError("cannot read %s: %s" % (source, exc.strerror or exc))


def _machine_problem(manifest):
    """What is wrong with the manifest's driver and GPU list, or ``None``."""
    driver = manifest.get("driver")
    if not isinstance(driver, dict) or not isinstance(driver.get("build"), str):
        return "no driver build"
    gpus = manifest.get("gpus")
    if not isinstance(gpus, list):
        return "no GPU list"
    for gpu in gpus:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("name"), str) \
                or not isinstance(gpu.get("cc"), int) or isinstance(gpu.get("cc"), bool) or not 10 <= gpu["cc"] <= 199:
            return "a GPU that is not a name and a compute capability: %.80r" % (gpu,)
    return None


def _unpack(reading, source, staging, machine, key):
    data, manifest = archive_format.read_manifest(reading, MANIFEST, MAX_MANIFEST)
    why = _machine_problem(manifest)
    if why:
        raise CacheError("%s has no valid %s (%s)" % (source, MANIFEST, why))
    if manifest.get("format") != FORMAT:
        raise CacheError("%s is a driver-JIT bundle of format %r; this ptxbackend %s reads format %d"
                         % (source, manifest.get("format"), __version__, FORMAT))
    why = _refusal(manifest, machine)
    if why:
        raise CacheError("%s cannot serve this machine: %s Nothing was imported." % (source, why))
    expected = archive_format.file_records(source, MANIFEST, manifest.get("files"), MAX_FILE, MAX_TOTAL)
    reading.allow(sum(r["size"] for r in expected.values()), len(expected))
    for member in archive_format.members_after_signature(reading, SIGNATURE, key, _MAC_CONTEXT, data):
        name = member.name[len(FILES) + 1:]
        if not member.isfile() or not _safe_member_name(member.name) or name not in expected:
            raise CacheError("%s: unexpected member %r (not a regular file the manifest lists under %s/); "
                             "nothing was imported" % (source, member.name, FILES))
        record = expected.pop(name)
        if member.size != record["size"]:
            raise CacheError("%s: %s is %d bytes, its manifest says %d; nothing was imported"
                             % (source, member.name, member.size, record["size"]))
        _write_checked(reading.archive.extractfile(member), os.path.join(staging, *name.split("/")), record,
                       source, member.name)
    if expected:
        raise CacheError("%s: %d files the manifest lists are missing (e.g. %s); nothing was imported"
                         % (source, len(expected), sorted(expected)[0]))
    return manifest


def _write_checked(handle, path, record, source, member_name):
    private.make_private_dirs(os.path.dirname(path))
    digest = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = handle.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > record["size"]:
                break
            digest.update(chunk)
            out.write(chunk)
    if size != record["size"] or digest.hexdigest() != record["sha256"]:
        raise CacheError("%s: %s does not match its checksum; the bundle is damaged, nothing was imported"
                         % (source, member_name))


def installed_record(cache_root):
    """The manifest of the last import under ``cache_root`` (with ``directory``), or ``None``."""
    path = os.path.join(os.path.dirname(managed_dir(cache_root)), RECORD)
    try:
        return json.loads(private.read_file(path).decode("utf-8"))
    except (OSError, ValueError):
        return None


def check_installed(record, cache_path):
    """For ``doctor``: whether the driver cache in use (``cache_path``) holds the imported set, per
    library, and the ``CUDA_CACHE_MAXSIZE`` it needs.  Returns a dict."""
    directory = record.get("directory")
    in_use = bool(cache_path) and os.path.realpath(cache_path) == os.path.realpath(directory or "")
    present = 0
    for item in record.get("files", []):
        try:
            present += os.path.getsize(os.path.join(directory, *item["name"].split("/"))) == item["size"]
        except OSError:
            pass
    libraries = []
    for lib in record.get("libraries", []):
        # The driver keys its cache by the code it compiles, not by the library's path: on a line PC the
        # library usually lives elsewhere.  At the build box's path, a file of another size is another
        # library (its JIT output will not be in the set).
        try:
            state = "same size" if os.path.getsize(lib["path"]) == lib["size"] else "different"
        except OSError:
            state = "elsewhere"
        libraries.append({"path": lib["path"], "name": lib.get("name"), "size": lib["size"],
                          "sha256": lib.get("sha256"), "state": state})
    complete = in_use and present == len(record.get("files", []))
    return {"directory": directory, "in_use": in_use, "complete": complete, "files": len(record.get("files", [])),
            "files_present": present, "libraries": libraries,
            "needs_maxsize": sum(item["size"] for item in record.get("files", []))}
