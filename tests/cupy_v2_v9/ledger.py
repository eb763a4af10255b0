"""The outcomes of CuPy's tests across several GPU calls (step d of harness.py).

CuPy 9.6's test_arithmetic needs more compile time than one 10-minute call has, so step d keeps a ledger:
one JSON line per finished test, ``{"file", "mode", "i", "id", "outcome"}`` (``i``: the test's position in
the file as collected, ``id``: its node id, checked against this call's collection).  A call reads the
ledgers of earlier calls, runs only the tests that have no outcome yet in a mode, and writes the merged
ledger back; the comparison of the two modes is over the merged ledger.
"""

import collections
import gzip
import json


def read(paths):
    """Entries of gzip'd JSON-lines ledgers, later files winning: {(file, mode, i): (id, outcome)}."""
    entries = {}
    for path in paths:
        with gzip.open(path, "rt") as handle:
            for line in handle:
                if line.strip():
                    e = json.loads(line)
                    entries[(e["file"], e["mode"], e["i"])] = (e["id"], e["outcome"])
    return entries


def write(path, entries):
    with gzip.open(path, "wt") as handle:
        for (file, mode, i), (node, outcome) in sorted(entries.items()):
            handle.write(json.dumps({"file": file, "mode": mode, "i": i, "id": node, "outcome": outcome}) + "\n")


def progress(path):
    """The lines chunk_plugin's V2V9_PROGRESS wrote: {i: (id, outcome)} ({} if there is no file)."""
    done = {}
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return done
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:  # the last line of a process killed while writing it
            continue
        done[e["i"]] = (e["id"], e["outcome"])
    return done


def stale(entries, ids):
    """Keys whose id is not the one collected at that position now ({file: [node id, ...]})."""
    return sorted(k for k, (node, _o) in entries.items()
                  if k[0] in ids and (k[2] >= len(ids[k[0]]) or ids[k[0]][k[2]] != node))


def missing_ranges(total, done, size):
    """Ranges [a, b) of at most ``size`` positions of range(total) that are not in ``done``, in order."""
    ranges, start = [], None
    for i in range(total + 1):
        gap = i < total and i not in done
        if gap and start is None:
            start = i
        if start is not None and (not gap or i - start == size):
            ranges.append((start, i))
            start = i if gap else None
    return ranges


def after_exit(start, stop, done):
    """What a process that ended before the deadline left of its range [start, stop).

    Returns (crashed, rest): the first position without an outcome is the test that was running when the
    process died (None if every test has one), and ``rest`` the range after it, to run in a new process.
    """
    for i in range(start, stop):
        if i not in done:
            return i, ((i + 1, stop) if i + 1 < stop else None)
    return None, None


def compare(entries, ids, modes=("stock", "hook")):
    """Per file and in all: how many tests have an outcome in each mode, the tallies, and the differences."""
    report = {"files": {}, "differences": [], "complete": True, "totals": {m: collections.Counter() for m in modes}}
    for file, nodes in sorted(ids.items()):
        outcomes = {m: {i: entries[(file, m, i)][1] for i in range(len(nodes)) if (file, m, i) in entries}
                    for m in modes}
        both = set(outcomes[modes[0]]) & set(outcomes[modes[1]])
        row = {"collected": len(nodes), "done_in_both": len(both)}
        for m in modes:
            row[m] = dict(collections.Counter(outcomes[m].values()))
            report["totals"][m].update(row[m])
        differ = sorted(i for i in both if outcomes[modes[0]][i] != outcomes[modes[1]][i])
        report["differences"] += [{"file": file, "i": i, "id": nodes[i], modes[0]: outcomes[modes[0]][i],
                                   modes[1]: outcomes[modes[1]][i]} for i in differ]
        row["not_passed"] = ["%s (%s)" % (nodes[i], outcomes[modes[0]][i])
                             for i in sorted(both) if outcomes[modes[0]][i] != "passed"]
        report["complete"] = report["complete"] and len(both) == len(nodes)
        report["files"][file] = row
    report["totals"] = {m: dict(c) for m, c in report["totals"].items()}
    return report
