"""pytest's junit files as outcomes, for the legacy GPU harness (tests/legacy).

It compares the outcome of every test with and without ptxbackend: a missing or
truncated file (a process killed at its time limit) counts as no outcomes, not
as an error of the harness.  (tests/cupy_v2_v9 records outcomes as they happen
instead, see its ledger.py: its runs span several calls.)
"""

import os
import xml.etree.ElementTree as ElementTree


def parse_junit(path):
    """{'<class>::<test>': 'passed'|'failed'|'error'|'skipped'} from a junit file ({} if absent or cut short).

    The class is the last dotted part of junit's class name (``TestA`` for ``tests.x.TestA``).
    """
    outcomes = {}
    if not os.path.exists(path):
        return outcomes
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError:
        return outcomes
    for case in root.iter("testcase"):
        classname = case.get("classname", "").rsplit(".", 1)[-1]
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                break
        outcomes["%s::%s" % (classname, case.get("name"))] = outcome
    return outcomes


def tally(outcomes):
    """{'passed': n, ...} of a {test: outcome} mapping."""
    counts = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def differences(mine, theirs):
    """The tests whose outcome differs between two {test: outcome} mappings (one side may lack a test)."""
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
