"""pytest's junit files as outcomes, for the GPU harnesses (tests/legacy, tests/cupy_v2_v9).

Both compare the outcome of every test with and without ptxbackend, so both read
junit files the same way: a missing or truncated file (a process killed at its
time limit) counts as no outcomes, not as an error of the harness.
"""

import os
import xml.etree.ElementTree as ElementTree


def parse_junit(path, short_class=False):
    """{'<class>::<test>': 'passed'|'failed'|'error'|'skipped'} from a junit file ({} if absent or cut short).

    ``short_class`` keeps only the last dotted part of the class name (``TestA`` for
    ``tests.x.TestA``); CuPy's parameterized class names hold dots of their own, so
    the v2-v9 harness keeps them whole.
    """
    outcomes = {}
    if not os.path.exists(path):
        return outcomes
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError:
        return outcomes
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        if short_class:
            classname = classname.rsplit(".", 1)[-1]
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
