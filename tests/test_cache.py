"""The entry format, the request key and the directory store."""

import os
import stat

import pytest

from ptxbackend.cache import DirectoryStore, entry, layout, request_key
from ptxbackend.cache.entries import EntryCache
from ptxbackend.compilers.options import read_path_options
from ptxbackend.errors import CacheError
from ptxbackend.compiling.targets import parse_target


def test_entry_round_trip():
    blob = entry.encode(b"payload", {"key": "k", "kind": "ptx"})
    assert blob[:4] == b"PTXB"
    assert entry.decode(blob, "k", "ptx") == (b"payload", {"key": "k", "kind": "ptx"})


@pytest.mark.parametrize("damage", ["truncate", "extend", "flip", "magic", "schema", "empty"])
def test_entry_damage_is_detected(damage):
    blob = bytearray(entry.encode(b"x" * 100, {"key": "k", "kind": "ptx"}))
    if damage == "truncate":
        blob = blob[:-1]
    elif damage == "extend":
        blob += b"\0"
    elif damage == "flip":
        blob[-5] ^= 0x10
    elif damage == "magic":
        blob[0:4] = b"XXXX"
    elif damage == "schema":
        blob[4] = 99
    else:
        blob = bytearray()
    with pytest.raises(entry.CorruptEntry):
        entry.decode(bytes(blob), "k", "ptx")


def test_entry_key_and_kind_are_checked_without_the_metadata():
    blob = entry.encode(b"\x7fELF", {"key": "e" * 64, "kind": "cubin", "note": "x"})
    assert entry.decode(blob, "e" * 64, "cubin", with_metadata=False) == (b"\x7fELF", None)
    with pytest.raises(entry.CorruptEntry, match="entry holds 'cubin', expected 'ptx'"):
        entry.decode(blob, "e" * 64, "ptx", with_metadata=False)
    with pytest.raises(entry.CorruptEntry, match="entry belongs to key 'e"):
        entry.decode(blob, "f" * 64, "cubin", with_metadata=False)


def test_entry_checksum_covers_the_header():
    blob = bytearray(entry.encode(b"x" * 50, {"key": "k", "kind": "ptx"}))
    blob[30] ^= 1  # inside the key field: still a well-formed header
    with pytest.raises(entry.CorruptEntry, match="checksum mismatch"):
        entry.decode(bytes(blob))


@pytest.mark.parametrize("meta", [{"key": "k" * 65, "kind": "ptx"}, {"key": "k", "kind": "elf"}])
def test_entry_encode_refuses_what_the_header_cannot_hold(meta):
    with pytest.raises(ValueError):
        entry.encode(b"p", meta)


def test_old_layouts_are_listed_and_removed_only_on_request(tmp_path):
    root = tmp_path / "c"
    (root / "v1" / "nvcc-11.2" / "compute_75" / "ab").mkdir(parents=True)
    # As 0.1 filed an entry: its name is its key, its content begins with the magic and schema 1.
    (root / "v1" / "nvcc-11.2" / "compute_75" / "ab" / ("ab" * 32 + ".ptx")).write_bytes(b"PTXB\x01\x00old")
    (root / "v99").mkdir()  # a newer ptxbackend's: never ours to remove
    os.chmod(str(root), 0o700)
    store = DirectoryStore(str(root))
    assert store.old_layouts() == ["v1"] and (root / "v1").exists()
    assert store.remove_old_layouts() == ["v1"]
    assert not (root / "v1").exists() and (root / "v99").exists() and os.path.isdir(store.base)


def test_entry_for_another_key_is_rejected():
    blob = entry.encode(b"p", {"key": "other", "kind": "ptx"})
    with pytest.raises(entry.CorruptEntry):
        entry.decode(blob, "k", "ptx")


def test_request_key_depends_on_each_part():
    base = request_key("src", ("-DX=1",), parse_target("compute_75"), ())
    assert base == request_key(u"src", ["-DX=1"], parse_target("compute_75"), ())
    others = {
        request_key("src2", ("-DX=1",), parse_target("compute_75"), ()),
        request_key("src", ("-DX=2",), parse_target("compute_75"), ()),
        request_key("src", ("-DX=1",), parse_target("compute_80"), ()),
        request_key("src", ("-DX=1",), parse_target("sm_75"), ()),
        request_key("src", ("-DX=1",), parse_target("compute_75"), ("other.cu",)),
    }
    assert base not in others and len(others) == 5


def test_include_dirs_forms(tmp_path):
    a, b, c = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")
    parsed = read_path_options(["-I" + a, "-I", b, "--include-path=" + c, "-DX"])
    assert parsed.include_dirs == [a, b, c]
    assert read_path_options(["-I " + a]).include_dirs == [a]  # CuPy v2-v9 put a space after -I
    assert read_path_options(["-I " + a]).options == ("-I " + a,)  # absolute paths keep their spelling


def test_relative_paths_in_options_are_made_absolute(tmp_path):
    (tmp_path / "pre.h").write_text("")  # nvcc finds a relative -include in the working directory first
    parsed = read_path_options(["-I", "inc", "-Isub", "-isystem", "sys", "-include", "pre.h", "-DX=inc"],
                               str(tmp_path))
    assert parsed.options == ("-I", str(tmp_path / "inc"), "-I" + str(tmp_path / "sub"),
                              "-isystem", str(tmp_path / "sys"), "-include", str(tmp_path / "pre.h"), "-DX=inc")
    assert parsed.named_dirs == [str(tmp_path / "inc"), str(tmp_path / "sub"), str(tmp_path / "sys")]
    assert parsed.pre_includes == [str(tmp_path / "pre.h")]
    # ... and then on the include path: a name not in the working directory is left to nvcc.
    parsed = read_path_options(["-I", "inc", "-include", "val.h"], str(tmp_path))
    assert parsed.options == ("-I", str(tmp_path / "inc"), "-include", "val.h")
    assert parsed.pre_include_names == ["val.h"]


def test_store_write_read_and_private_modes(tmp_path):
    store = DirectoryStore(str(tmp_path / "c"))
    cache = EntryCache(store)
    name = layout.entry_name("nvcc-13.0.88", parse_target("compute_75"), "ab" + "0" * 62, "ptx")
    path = store.path_of(name)
    assert "/v4/nvcc-13.0.88/compute_75/ab/" + "ab" + "0" * 62 + ".ptx" in path
    jit = store.path_of(layout.jit_name("nvcc-13.0.88", parse_target("compute_75"), "ab" + "0" * 62, 90, "580.1"))
    assert jit.endswith("/v4/nvcc-13.0.88/compute_75/jit/sm_90-580.1/ab/" + "ab" + "0" * 62 + ".cubin")
    cache.write(name, b"ptx text", {"key": "ab" + "0" * 62, "kind": "ptx"})
    assert cache.read(name, "ab" + "0" * 62, "ptx")[0] == b"ptx text"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.base).st_mode) == 0o700
    assert [p for p, _s, _m in store.entries()] == [path]
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp")]


def test_store_discards_corrupt_and_planted_entries(tmp_path):
    store = EntryCache(DirectoryStore(str(tmp_path / "c")))
    key = "cd" + "1" * 62
    name = layout.entry_name("p-1", parse_target("sm_90"), key, "cubin")
    path = store.path_of(name)
    store.write(name, b"\x7fELF...", {"key": key, "kind": "cubin"})
    with open(path, "r+b") as handle:
        handle.seek(-2, os.SEEK_END)
        handle.write(b"!!")
    assert store.read(name, key, "cubin") is None
    assert not os.path.exists(path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    os.symlink(str(secret), path)
    assert store.read(name, key, "cubin") is None
    assert not os.path.lexists(path) and secret.read_bytes() == b"not yours"
    os.makedirs(path)
    assert store.read(name, key, "cubin") is None
    assert not os.path.exists(path)


def test_store_refuses_world_writable_dir(tmp_path):
    root = tmp_path / "c"
    DirectoryStore(str(root))
    os.chmod(DirectoryStore(str(root)).base, 0o777)
    with pytest.raises(CacheError) as info:
        DirectoryStore(str(root))
    assert "chmod 700" in str(info.value)


def test_prune_removes_least_recently_used(tmp_path):
    store = DirectoryStore(str(tmp_path / "c"), max_size=None)
    paths = []
    for i in range(10):
        key = "%02x" % i + "0" * 62
        path = store.path_of(layout.entry_name("p-1", parse_target("compute_75"), key, "ptx"))
        EntryCache(store).write(layout.entry_name("p-1", parse_target("compute_75"), key, "ptx"), b"x" * 1000,
                                {"key": key, "kind": "ptx"})
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(path)
    one = os.path.getsize(paths[0])
    removed, freed = store.prune(5 * one)
    assert removed == 6 and freed == 6 * one  # down to 80% of the limit: four newest stay
    assert [os.path.exists(p) for p in paths] == [False] * 6 + [True] * 4


def test_verify_reports_bad_entries(tmp_path):
    store = DirectoryStore(str(tmp_path / "c"))
    key = "ee" + "2" * 62
    name = layout.entry_name("p-1", parse_target("compute_75"), key, "ptx")
    path = store.path_of(name)
    EntryCache(store).write(name, b"ok", {"key": key, "kind": "ptx"})
    assert store.verify() == (1, [])
    with open(path, "ab") as handle:
        handle.write(b"junk")
    good, bad = store.verify(repair=True)
    assert good == 0 and len(bad) == 1 and not os.path.exists(path)


def test_identity_is_written_once(tmp_path):
    from ptxbackend.compilers.base import CompilerIdentity
    store = EntryCache(DirectoryStore(str(tmp_path / "c")))
    identity = CompilerIdentity("nvcc", "/x/nvcc", "11.2.152", (61, 86), (61, 86), True)
    store.save_producer(identity.producer, identity.producer_record())
    path = os.path.join(store.local.base, "nvcc-11.2.152", "identity.json")
    os.utime(path, (1, 1))
    store.save_producer(identity.producer, identity.producer_record())
    assert os.stat(path).st_mtime == 1  # unchanged identity: not rewritten
    assert store.producer_records() == [("nvcc-11.2.152", identity.producer_record())]
    # A producer record is data for choosing targets: it names no program or library of this machine.
    assert "/x/nvcc" not in open(path).read()


@pytest.mark.parametrize("how", ["world-writable parent", "group-writable grandparent", "parent of another user"])
def test_cache_below_a_directory_others_control_is_refused(tmp_path, how):
    parent = tmp_path / "shared" / "deeper"
    parent.mkdir(parents=True)
    if how == "world-writable parent":
        os.chmod(str(parent), 0o777)
    elif how == "group-writable grandparent":
        os.chmod(str(tmp_path / "shared"), 0o775)
    else:
        if not hasattr(os, "getuid") or os.getuid() != 0:
            pytest.skip("needs root to give the directory away")
        os.chown(str(parent), 65534, 65534)
        os.chmod(str(parent), 0o755)
    with pytest.raises(CacheError, match="could replace the cache"):
        DirectoryStore(str(parent / "cache"))


def test_cache_below_a_sticky_shared_directory_is_accepted(tmp_path):
    shared = tmp_path / "tmp-like"
    shared.mkdir()
    os.chmod(str(shared), 0o1777)  # as /tmp: others may write, but not rename what is ours
    DirectoryStore(str(shared / "cache"))
