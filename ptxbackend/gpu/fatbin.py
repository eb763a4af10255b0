"""Find the fatbin images inside a shared library and tell which need the driver's JIT on a GPU.

A CUDA library keeps its device code in ELF sections that nvcc fills with
fatbin images: ``.nv_fatbin`` holds those its runtime loads one by one;
``__nv_relfatbin`` (``nvcc -rdc``) holds relocatable images that the runtime
links together at load time, so they are reported but never warmed alone.
Each image starts with a 16-byte header (magic 0xBA55ED50, u16 version, u16
header size, u64 payload size) and holds entries, each with a header of at
least 64 bytes (kind 1 = PTX, 2 = ELF/SASS; header size; stored size; PTX
ISA or ELF version; the sm/compute number; flags; for a compressed entry its
uncompressed size).  Images may be padded with zero bytes between them.
Little-endian ELF32 and ELF64 are read.

Only the section bytes are read (cuDNN 7's ``.nv_fatbin`` is 183 MB of a
203 MB file); every length read from the file is checked against what is
there before it is used, so a malformed library is a :class:`FatbinError`
with one line, never a crash or a huge allocation.  Stdlib only.
"""

import os
import struct

from ..errors import PtxBackendError

MAGIC = 0xBA55ED50
# .nv_fatbin holds the images a library's runtime loads; __nv_relfatbin (nvcc -rdc) relocatable images
# that the runtime links (cuLink*) at load time, which a plain load of each image does not reproduce.
SECTIONS = (".nv_fatbin", "__nv_relfatbin")
RELOCATABLE = "__nv_relfatbin"
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_IMAGE_HEADER = struct.Struct("<IHHQ")
# kind, version, header size, stored size, compressed size, (unknown), minor, major, arch, name offset,
# name length, flags, (zero), uncompressed size
_ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQQQ")
_KIND = {1: "ptx", 2: "sass"}
_COMPRESSED = 0x2000 | 0x8000  # the two compression flags seen: CUDA <= 12 (LZ4) and CUDA 13 nvcc's default


class FatbinError(PtxBackendError, ValueError):
    """The library's ELF or fatbin data is not what it claims; the message is one line."""


class Entry(object):
    __slots__ = ("kind", "arch", "text_bytes")

    def __init__(self, kind, arch, text_bytes):
        self.kind = kind            # 'ptx', 'sass' or 'other'
        self.arch = arch            # 52 for compute_52 / sm_52
        self.text_bytes = text_bytes  # uncompressed size of the PTX text or ELF

    def __repr__(self):
        return "Entry(%s, %d, %d)" % (self.kind, self.arch, self.text_bytes)


class Image(object):
    """One fatbin image: where it is in the file (``offset``, ``size``), its entries, its section."""
    __slots__ = ("offset", "size", "entries", "section")

    def __init__(self, offset, size, entries, section=".nv_fatbin"):
        self.offset = offset
        self.size = size
        self.entries = entries
        self.section = section

    def archs(self, kind):
        return sorted(e.arch for e in self.entries if e.kind == kind)

    @property
    def ptx_bytes(self):
        return sum(e.text_bytes for e in self.entries if e.kind == "ptx")

    def jit_bytes(self, cc):
        """Bytes of the PTX the driver JIT-compiles on ``cc``: the newest PTX entry not newer than it."""
        usable = [e for e in self.entries if e.kind == "ptx" and e.arch <= cc]
        return max(usable, key=lambda e: e.arch).text_bytes if usable else 0

    def needs(self, cc):
        """``'sass'``: machine code runs on compute capability ``cc`` (same major, not newer), no JIT;
        ``'jit'``: the driver JIT-compiles a PTX entry not newer than ``cc``; ``'none'``: no code it can use;
        ``'relocatable'``: an -rdc image the runtime links with others, never loaded alone."""
        if self.section == RELOCATABLE:
            return "relocatable"
        if any(arch // 10 == cc // 10 and arch <= cc for arch in self.archs("sass")):
            return "sass"
        if any(arch <= cc for arch in self.archs("ptx")):
            return "jit"
        return "none"


def _is_elf64(head, where):
    """Whether the ELF is 64-bit, after checking that it is a little-endian ELF at all."""
    if len(head) < 64 or head[:4] != b"\x7fELF":
        raise FatbinError("%s is not an ELF file (a shared library), so it has no fatbin sections" % where)
    if head[5:6] != b"\x01":
        raise FatbinError("%s is a big-endian ELF file: fatbins are only read from little-endian libraries" % where)
    if head[4:5] not in (b"\x01", b"\x02"):
        raise FatbinError("%s has an unknown ELF class %r" % (where, head[4:5]))
    return head[4:5] == b"\x02"


def _section_headers(handle, file_size, where):
    """[(name, type, offset, size)] of the ELF's sections, each checked to lie inside the file."""
    handle.seek(0)
    head = handle.read(64)
    is64 = _is_elf64(head, where)
    if is64:
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        shdr, fields = struct.Struct("<IIQQQQIIQQ"), (0, 1, 4, 5, 6)  # name, type, offset, size, link
    else:
        shoff, = struct.unpack_from("<I", head, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x2E)
        shdr, fields = struct.Struct("<IIIIIIIIII"), (0, 1, 4, 5, 6)
    if shoff == 0:
        return []  # no section table: nothing to find
    if shentsize < shdr.size:
        raise FatbinError("%s: ELF section headers of %d bytes are shorter than the %d an ELF%d header needs"
                          % (where, shentsize, shdr.size, 64 if is64 else 32))

    def header(index):
        handle.seek(shoff + index * shentsize)
        raw = handle.read(shdr.size)
        if len(raw) != shdr.size:
            raise FatbinError("%s: ELF section header %d lies past the end of the %d-byte file"
                              % (where, index, file_size))
        values = shdr.unpack(raw)
        return tuple(values[i] for i in fields)

    if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering: the real values sit in section 0
        _name, _type, _off, size0, link0 = header(0)
        shnum = shnum or size0
        shstrndx = link0 if shstrndx == 0xFFFF else shstrndx
    headers = [header(i) for i in range(shnum)]
    if shstrndx >= shnum:
        raise FatbinError("%s: ELF section-name table index %d is not one of its %d sections"
                          % (where, shstrndx, shnum))
    _n, _t, str_off, str_size, _l = headers[shstrndx]
    if str_off + str_size > file_size:
        raise FatbinError("%s: ELF section-name table (%d bytes at %d) is outside the %d-byte file"
                          % (where, str_size, str_off, file_size))
    handle.seek(str_off)
    names = handle.read(str_size)
    sections = []
    for index, (name_off, kind, offset, size, _link) in enumerate(headers):
        end = names.find(b"\0", name_off) if name_off < len(names) else -1
        name = names[name_off:end].decode("latin-1") if end >= 0 else ""
        if kind != 8 and offset + size > file_size:  # SHT_NOBITS (8) occupies no file bytes
            raise FatbinError("%s: ELF section %d (%s) claims %d bytes at %d, past the end of the %d-byte file"
                              % (where, index, name or "unnamed", size, offset, file_size))
        sections.append((name, kind, offset, size))
    return sections


def parse_images(data, base=0, where="fatbin data"):
    """The fatbin images in ``data`` (one section's bytes; ``base`` its file offset), in order."""
    images = []
    pos, end = 0, len(data)
    while pos < end:
        found = data.find(_MAGIC_BYTES, pos)
        gap = data[pos:found if found >= 0 else end]
        if gap.count(b"\0") != len(gap):  # between images only padding may sit
            raise FatbinError("%s: bytes at offset %d are neither zero padding nor a fatbin header (magic "
                              "0x%08X): a corrupt or truncated library" % (where, base + pos, MAGIC))
        if found < 0:
            break
        images.append(_parse_image(data, found, base, where))
        pos = found + images[-1].size
    return images


def _parse_image(data, start, base, where):
    if start + _IMAGE_HEADER.size > len(data):
        raise FatbinError("%s: fatbin header at offset %d is cut short" % (where, base + start))
    _magic, _version, header_size, payload = _IMAGE_HEADER.unpack_from(data, start)
    end = start + header_size + payload
    if header_size < _IMAGE_HEADER.size or end > len(data):
        raise FatbinError("%s: fatbin image at offset %d claims %d + %d bytes, past the end of its "
                          "%d-byte section: a corrupt or truncated library"
                          % (where, base + start, header_size, payload, len(data)))
    entries = []
    pos = start + header_size
    while pos < end:
        if pos + _ENTRY_HEADER.size > end:
            raise FatbinError("%s: fatbin entry header at offset %d runs past its image's end at %d"
                              % (where, base + pos, base + end))
        fields = _ENTRY_HEADER.unpack_from(data, pos)
        kind, entry_header, stored, arch, flags, uncompressed = fields[0], fields[2], fields[3], fields[8], \
            fields[11], fields[13]
        if entry_header < _ENTRY_HEADER.size or pos + entry_header + stored > end:
            raise FatbinError("%s: fatbin entry at offset %d claims %d + %d bytes, past its image's end at "
                              "%d" % (where, base + pos, entry_header, stored, base + end))
        text = uncompressed if flags & _COMPRESSED and uncompressed else stored
        entries.append(Entry(_KIND.get(kind, "other"), arch, text))
        pos += entry_header + stored
    return Image(base + start, end - start, entries)


def read_images(path):
    """The fatbin images of the library at ``path``: only its fatbin sections are read."""
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        images = []
        for name, _kind, offset, size in _section_headers(handle, file_size, path):
            if name not in SECTIONS or _kind == 8:  # SHT_NOBITS: no bytes in the file
                continue
            handle.seek(offset)
            data = handle.read(size)  # a file shrunk meanwhile gives less: parse_images checks against len(data)
            for image in parse_images(data, offset, "%s section %s" % (path, name)):
                image.section = name
                images.append(image)
    return images
