"""A pytest plugin (``-p chunk_plugin``) that runs one contiguous share of a file's tests.

CuPy's parameterized test classes carry numpy reprs, newlines included, in
their names, so node ids cannot be passed on a command line; the harness
splits by position instead.  V2V9_CHUNK=i/n keeps the i-th of n slices of the
collected tests (the same slices in every mode); V2V9_COUNT_FILE=path writes
how many tests were collected; V2V9_DESELECT=name,... drops test functions by
name first.
"""

import os


def pytest_collection_modifyitems(session, config, items):
    # V2V9_DESELECT=name,name: test functions that cannot run here (see the harness), in every mode
    names = set(n for n in os.environ.get("V2V9_DESELECT", "").split(",") if n)
    if names:
        dropped = [item for item in items if getattr(item, "originalname", None) in names or item.name in names]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item not in dropped]
    count_file = os.environ.get("V2V9_COUNT_FILE")
    if count_file:
        with open(count_file, "w") as handle:
            handle.write(str(len(items)))
    chunk = os.environ.get("V2V9_CHUNK")
    if chunk:
        index, total = (int(x) for x in chunk.split("/"))
        total_items = len(items)
        keep = items[index * total_items // total:(index + 1) * total_items // total]
        deselected = [item for item in items if item not in keep]
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep
