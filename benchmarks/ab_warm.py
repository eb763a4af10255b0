#!/usr/bin/env python3
"""The warm hit before and after a change to ptxbackend (issue 12), from two runs of the warm section.

    python benchmarks/run.py warm-compare BEFORE/results.json AFTER/results.json [--out FILE.md]

BEFORE comes from `run.py --sections warm --ptxbackend-src OLD`, AFTER from the same command without
--ptxbackend-src, on the same machine.  Prints a Markdown table (row, N, before and after us per
kernel, the difference of the medians) and writes it to --out (default: compare-warm.md beside
AFTER).  The issue's budgets, judged at N=100 on the medians: the hit without headers may grow by
10 us per kernel, the hit whose kernel includes headers by 30 us.
"""

import argparse
import json
import os
import sys

BUDGET_N = "100"
BUDGETS_US = {"pb_cubin": 10.0, "pb_cubin_hdr": 30.0}
FIGURES = (("per_kernel_ms", ""), ("compile_ms", ", compile() only"))


def load(path):
    with open(path) as handle:
        data = json.load(handle)
    warm = (data.get("sections") or {}).get("warm")
    if not warm or not warm.get("stats"):
        raise SystemExit("%s: no warm-section figures (status %s)" % (path, (warm or {}).get("status", "not run")))
    return data, warm


def _source(data, warm):
    return (warm.get("run") or {}).get("ptxbackend_src") or warm.get("ptxbackend_src") or data.get("ptxbackend") or {}


def describe(name, path, data, warm):
    src = _source(data, warm)
    gpu = data.get("gpu") or {}
    commit = ""
    if src.get("commit"):
        commit = ", commit %s%s" % (src["commit"][:10], " with changes" if src.get("modified") else "")
    measured = "; ".join("%s from %s" % (m.get("version"), m.get("dir")) for m in warm.get("ptxbackend_measured") or [])
    return ("- %s: `%s`, run of %s on %s (%s, driver %s): ptxbackend %s from `%s`, git tree %s%s%s; %s repetitions."
            % (name, path, (warm.get("run") or {}).get("created") or data.get("created"),
               (data.get("machine") or {}).get("hostname"), gpu.get("name"), gpu.get("driver_build"),
               src.get("version") or (warm.get("run") or {}).get("ptxbackend"), src.get("dir"),
               (src.get("tree") or "?")[:12], commit,
               "; the children imported %s" % measured if measured else "", _reps(warm)))


def _reps(warm):
    counts = set(cell["per_kernel_ms"]["reps"] for row in warm["stats"].values() for cell in row.values()
                 if cell.get("per_kernel_ms"))
    return "/".join(str(c) for c in sorted(counts)) or "0"


def _us(stat):
    if not stat or stat.get("median") is None:
        return None
    return stat["median"] * 1000.0


def _fmt_us(stat):
    if not stat or stat.get("median") is None:
        return "-"
    if stat.get("reps", 0) <= 1:
        return "%.1f" % (stat["median"] * 1000.0)
    return "%.1f (%.0f-%.0f)" % (stat["median"] * 1000.0, stat["min"] * 1000.0, stat["max"] * 1000.0)


def compare(before_data, before, after_data, after):
    """Rows of the table and the verdicts: ([[cells]], {row key: (delta us, budget us, met)})."""
    labels = dict((k, l) for k, l in (before.get("rows") or []) + (after.get("rows") or []))
    order = [k for k, _l in after.get("rows") or []] + sorted(after["stats"])
    keys = [k for i, k in enumerate(order) if k in before["stats"] and k in after["stats"] and k not in order[:i]]
    table, verdicts = [], {}
    for key in keys:
        for figure, suffix in FIGURES:
            ns = sorted(set(before["stats"][key]) & set(after["stats"][key]), key=int)
            for n in ns:
                b = before["stats"][key][n].get(figure)
                a = after["stats"][key][n].get(figure)
                if _us(b) is None and _us(a) is None:
                    continue
                delta = None if _us(b) is None or _us(a) is None else _us(a) - _us(b)
                budget, met = "-", "-"
                if figure == "per_kernel_ms" and n == BUDGET_N and key in BUDGETS_US:
                    budget = "+%.0f" % BUDGETS_US[key]
                    if delta is not None:
                        ok = delta <= BUDGETS_US[key]
                        met = "met" if ok else "**not met**"
                        verdicts[key] = (delta, BUDGETS_US[key], ok)
                    else:
                        met = "not measured"
                table.append(["%s%s" % (labels.get(key, key), suffix), n, _fmt_us(b), _fmt_us(a),
                              "-" if delta is None else "%+.1f" % delta, budget, met])
    return table, verdicts


def _table(columns, rows):
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)


def render(before_path, after_path):
    before_data, before = load(before_path)
    after_data, after = load(after_path)
    rows, verdicts = compare(before_data, before, after_data, after)
    out = ["# Warm hit before and after (issue 12)", ""]
    out.append("Each figure is the median over fresh processes of one run, in microseconds per kernel, with the "
               "run's min-max in parentheses. **The deltas are after minus before of those medians, from two "
               "separate runs on the same machine**, not a paired measurement: a delta smaller than the spread "
               "of the two runs is within their run-to-run noise. The compile() rows are the part of each "
               "kernel's time spent inside ptxbackend.compile() (key, settings, cache read, header checks); "
               "the rest of a hit is the module load.")
    out += ["", describe("before", before_path, before_data, before), describe("after", after_path, after_data, after)]
    warnings = []
    for what, get in (("host", lambda d: (d.get("machine") or {}).get("hostname")),
                      ("GPU", lambda d: (d.get("gpu") or {}).get("name")),
                      ("driver", lambda d: (d.get("gpu") or {}).get("driver_build"))):
        if get(before_data) != get(after_data):
            warnings.append("the two runs differ in %s (%s vs %s): the deltas are not a before/after comparison"
                            % (what, get(before_data), get(after_data)))
    trees = [_source(before_data, before).get("tree"), _source(after_data, after).get("tree")]
    if trees[0] and trees[0] == trees[1]:
        warnings.append("both runs measured the same ptxbackend (git tree %s): the deltas are noise" % trees[0][:12])
    out += ["- **warning**: %s." % w for w in warnings]
    out += ["", _table(["row", "N", "before us/kernel", "after us/kernel", "delta us", "budget us (N=%s)" % BUDGET_N,
                        "budget"], rows), ""]
    for key, label in (("pb_cubin", "without headers"), ("pb_cubin_hdr", "with headers")):
        if key in verdicts:
            delta, budget, ok = verdicts[key]
            out.append("- Hit %s, N=%s: %+.1f us per kernel against a budget of +%.0f us: %s." % (
                label, BUDGET_N, delta, budget, "met" if ok else "**not met**"))
        else:
            out.append("- Hit %s, N=%s: not measured in both runs." % (label, BUDGET_N))
    return "\n".join(out) + "\n", verdicts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="results.json of the run with the older ptxbackend")
    p.add_argument("after", help="results.json of the run with the newer ptxbackend")
    p.add_argument("--out", help="Markdown file to write (default: compare-warm.md beside AFTER)")
    args = p.parse_args(argv)
    text, _verdicts = render(args.before, args.after)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.after)), "compare-warm.md")
    with open(out, "w") as handle:
        handle.write(text)
    sys.stdout.write(text)
    sys.stderr.write("wrote %s\n" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
