"""A pytest plugin (``-p chunk_plugin``) that runs one contiguous range of a file's tests and records each
outcome the moment the test ends.

CuPy's parameterized test classes carry numpy reprs, newlines included, in
their names, so node ids cannot be passed on a command line; the harness
addresses tests by position instead.  Environment:

- V2V9_DESELECT=name,...: drop test functions by name first (in every mode; file.py::name: in that file only);
- V2V9_IDS_FILE=path: write the collected node ids (a JSON list), position = index;
- V2V9_RANGE=a:b: keep the tests at positions a..b-1 of that list;
- V2V9_PROGRESS=path: append one JSON line per finished test, ``{"i", "id", "outcome"}``, flushed at once,
  so that a process killed at its time limit (or by a crash) leaves the outcomes of the tests it finished.
  Outcomes read like pytest's junit files: a failure in setup or teardown is "error", in the test
  "failed"; a skip or an expected failure "skipped"; anything else "passed";
- V2V9_COMBINATION_SHARD=k/n: a test decorated to walk every dtype combination (cupy.testing's
  ``for_dtypes_combination(full=True)``, and so ``for_all_dtypes_combination(full=True)``) walks only
  every n-th one, from the k-th: the harness's warm-up processes share one test's kernels out this way.
"""

import functools
import json
import os
import sys

_positions = {}
_reports = {}


def pytest_collection_modifyitems(session, config, items):
    names = set(n for n in os.environ.get("V2V9_DESELECT", "").split(",") if n)
    if names:
        def named(item, name):
            # "file.py::function" names one file's function; a bare name, that function in every file
            where, _, function = name.rpartition("::")
            path = item.nodeid.split("::")[0]
            if where and path != where and not path.endswith("/" + where):
                return False
            return getattr(item, "originalname", None) == function or item.name == function
        dropped = [item for item in items if any(named(item, name) for name in names)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item not in dropped]
    ids_file = os.environ.get("V2V9_IDS_FILE")
    if ids_file:
        with open(ids_file, "w") as handle:
            json.dump([item.nodeid for item in items], handle)
    start, stop = 0, len(items)
    wanted = os.environ.get("V2V9_RANGE")
    if wanted:
        start, stop = (int(x) for x in wanted.split(":"))
        keep = items[start:stop]
        config.hook.pytest_deselected(items=items[:start] + items[stop:])
        items[:] = keep
    _positions.clear()
    _positions.update((item.nodeid, start + k) for k, item in enumerate(items))


def outcome_of(reports):
    """One test's outcome from its setup/call/teardown reports (the words pytest's junit files use)."""
    by_phase = dict((r.when, r) for r in reports)
    if any(r.failed for r in reports if r.when != "call"):
        return "error"
    if "call" in by_phase and by_phase["call"].failed:
        return "failed"
    if any(r.skipped for r in reports):
        return "skipped"
    return "passed"


def pytest_runtest_logreport(report):
    path = os.environ.get("V2V9_PROGRESS")
    if not path:
        return
    seen = _reports.setdefault(report.nodeid, [])
    seen.append(report)
    if report.when != "teardown":
        return
    del _reports[report.nodeid]
    line = {"i": _positions.get(report.nodeid), "id": report.nodeid, "outcome": outcome_of(seen)}
    with open(path, "a") as handle:
        handle.write(json.dumps(line) + "\n")


def _share_out_dtype_combinations(index, total):
    import cupy.testing
    module = sys.modules[cupy.testing.for_dtypes_combination.__module__]  # v9: _helper; v10+: _loops
    parameterized, original = module._parameterized, module.for_dtypes_combination

    @functools.wraps(original)
    def for_dtypes_combination(types, names=("dtype",), full=None):
        product = parameterized.product  # what the full=True branch calls to list the combinations

        def every_nth(parameter):
            return [combination for k, combination in enumerate(product(parameter)) if k % total == index]
        parameterized.product = every_nth
        try:
            return original(types, names, full)
        finally:
            parameterized.product = product
    module.for_dtypes_combination = cupy.testing.for_dtypes_combination = for_dtypes_combination


if os.environ.get("V2V9_COMBINATION_SHARD"):
    _share_out_dtype_combinations(*(int(x) for x in os.environ["V2V9_COMBINATION_SHARD"].split("/")))
