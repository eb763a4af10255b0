"""Sizes have one meaning everywhere: ``0`` is "no limit" for the variable, the config file,
``--max-size`` and prune alike (0.4.0's prune took it as "remove everything"), and a fraction of a byte
is refused with one line (0.4.0 took ``0.5`` as 0 bytes)."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from ptxbackend import config
from ptxbackend.cache import DirectoryStore, layout
from ptxbackend.cache.entries import EntryCache
from ptxbackend.compiling.targets import parse_target


def _filled_cache(root, count=5):
    store = DirectoryStore(str(root))
    for i in range(count):
        key = "%02x" % i + "0" * 62
        EntryCache(store).write(layout.entry_name("p-1", parse_target("compute_75"), key, "ptx"), b"x" * 4000,
                                {"key": key, "kind": "ptx"})
    return store


def _entries(root):
    return len(list(DirectoryStore(str(root)).entries()))


def _cli(root, *args, **env):
    full = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(root))
    full.update(env)
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(args), env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)


def _config(tmp_path, text):
    path = tmp_path / "config.ini"
    path.write_text("[ptxbackend]\n" + text + "\n")
    os.chmod(str(path), 0o600)
    return str(path)


@pytest.mark.parametrize("how", ["variable", "config", "max-size", "variable-and-max-size"])
def test_zero_is_no_limit_for_prune_however_it_is_given(tmp_path, how):
    root = tmp_path / "cache"
    _filled_cache(root)
    env, args = {}, []
    if how.startswith("variable"):
        env["PTXBACKEND_CACHE_MAX_SIZE"] = "0"
    if how == "config":
        env["PTXBACKEND_CONFIG"] = _config(tmp_path, "cache_max_size = 0")
    if how.endswith("max-size"):
        args = ["--max-size", "0"]
    proc = _cli(root, "cache", "prune", *args, **env)
    assert proc.returncode == 0 and "removed 0 entries" in proc.stdout, (proc.stdout, proc.stderr)
    assert _entries(root) == 5, "a size of 0 pruned the cache"
    info = _cli(root, "cache", "info", **env)
    if not args:
        assert "(no limit)" in info.stdout, info.stdout
    # The same cache with a real limit is pruned: the test above could fail.
    assert "removed 5 entries" in _cli(root, "cache", "prune", "--max-size", "1", **env).stdout
    assert _entries(root) == 0


def test_zero_is_no_limit_for_the_store_while_compiling_and_pruning(tmp_path):
    store = _filled_cache(tmp_path / "cache")
    store.max_size = 0
    assert store.prune() == (0, 0) and store.prune(0) == (0, 0)
    store._maybe_prune()
    assert _entries(tmp_path / "cache") == 5


@pytest.mark.parametrize("text", ["0.5", "1.5", "0.5B", "0.001", "2.25 B"])
def test_a_fraction_of_a_byte_is_refused(text):
    with pytest.raises(ValueError) as info:
        config.parse_size(text)
    assert "fraction of a byte" in str(info.value) and "0 for no limit" in str(info.value)


@pytest.mark.parametrize("text", ["0.0001K", "0.0000001M"])
def test_a_size_with_a_unit_below_one_byte_is_refused(text):
    with pytest.raises(ValueError) as info:
        config.parse_size(text)
    assert "less than one byte" in str(info.value)


@pytest.mark.parametrize("text,size", [("0", 0), ("0.0", 0), ("0K", 0), ("1.0", 1), ("0.5K", 512), ("1.3K", 1331),
                                       ("1.5G", 3 << 29)])
def test_whole_bytes_and_units_with_fractions_are_taken(text, size):
    assert config.parse_size(text) == size


@pytest.mark.parametrize("how", ["variable", "config", "max-size"])
def test_the_command_line_refuses_a_fraction_of_a_byte_with_one_line_and_prunes_nothing(tmp_path, how):
    root = tmp_path / "cache"
    _filled_cache(root)
    env, args = {}, []
    if how == "variable":
        env["PTXBACKEND_CACHE_MAX_SIZE"] = "0.5"
    elif how == "config":
        env["PTXBACKEND_CONFIG"] = _config(tmp_path, "cache_max_size = 0.5")
    else:
        args = ["--max-size", "0.5"]
    proc = _cli(root, "cache", "prune", *args, **env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "'0.5' is a fraction of a byte" in proc.stderr
    assert ("PTXBACKEND_CACHE_MAX_SIZE", "cache_max_size", "--max-size")[
        ("variable", "config", "max-size").index(how)] in proc.stderr
    assert _entries(root) == 5
