"""Turn the measurement dict into results.json, results.md and PNG plots; judge the issue's targets.

Pure functions of the results dict (no timing here), so tests can feed a small fake one.

A results dict: {"machine", "gpu", "toolkits", "cupy", "args", "sections": {name: section}}, where a
section is {"title", "status", "notes": [str], "table": {"columns", "rows"}, "summary": {...},
"plots": [{"file", "title", "ylabel", "labels", "series": {name: [stat dict or number]}, "log"?}]}.
"""

import json
import os

SECTION_ORDER = ("compile", "warm", "kernels", "hook", "libraries", "concurrency", "fleet")

# Anchors from the project's measurements on the H200 (shared FACTS, 2026-11-29), used only when this
# run has no figure of its own; the Targets table says so.
ANCHORS = {"floor_ms": 0.044, "cupy14_warm_ms": 0.31, "chainer_stock_hit_ms": 3.07}


def _fmt(value, unit="", digits=3):
    if value is None:
        return "-"
    return ("%.*g%s" % (digits, value, unit))


def _target(name, status, value, detail):
    return {"target": name, "status": status, "value": value, "detail": detail}


def _summary(results, section):
    sec = results.get("sections", {}).get(section) or {}
    if sec.get("status") not in ("ok", "partial"):
        return None, sec
    return sec.get("summary") or {}, sec


def _why_not(sec):
    notes = sec.get("notes") or []
    if sec.get("status") == "skipped" and notes:
        return notes[0]
    if sec.get("status") == "error" and notes:
        return notes[-1]
    return "section not run"


def evaluate_targets(results):
    """The issue's targets: met / not met / not measured here, each with its number."""
    out = []
    warm, warm_sec = _summary(results, "warm")
    name = "cache hit (key, read, verify, load; cubin level) <= 1.5x the floor"
    if warm and warm.get("pb_cubin_ms") is not None and warm.get("floor_ms"):
        r = warm["pb_cubin_ms"] / warm["floor_ms"]
        same = ""
        if warm.get("floor_jit_ms"):
            same = "; against the floor loop over the same JIT cubins (%s ms): %.2fx" % (
                _fmt(warm["floor_jit_ms"]), warm["pb_cubin_ms"] / warm["floor_jit_ms"])
        out.append(_target(name, "met" if r <= 1.5 else "not met", "%.2fx" % r,
                           "%s ms vs floor %s ms per kernel, N=%s%s" % (_fmt(warm["pb_cubin_ms"]),
                                                                        _fmt(warm["floor_ms"]), warm.get("n"), same)))
    else:
        out.append(_target(name, "not measured", "-", _why_not(warm_sec)))

    name = "cache hit >= 20x faster than stock Chainer 1.24's compile_with_cache hit"
    stock = None
    if warm:
        stock = warm.get("legacy_stock_hit_ms_per_kernel") or warm.get("legacy_stock_warm_ms_per_kernel")
    source = "legacy harness" if stock else "anchor %.2f ms (FACTS, not measured in this run)" % ANCHORS["chainer_stock_hit_ms"]
    if warm and warm.get("pb_cubin_ms"):
        stock_ms = stock or ANCHORS["chainer_stock_hit_ms"]
        r = stock_ms / warm["pb_cubin_ms"]
        out.append(_target(name, "met" if r >= 20 else "not met", "%.1fx" % r,
                           "ptxbackend %s ms vs stock %s ms (%s)" % (_fmt(warm["pb_cubin_ms"]), _fmt(stock_ms), source)))
    else:
        out.append(_target(name, "not measured", "-", "needs the warm-start section (GPU)"))

    name = "end to end: first use of a cached kernel in Chainer 1.24 + ptxbackend faster than CuPy 14's warm first use"
    ours = warm.get("legacy_ptxbackend_warm_ms_per_kernel") if warm else None
    cupy14 = warm.get("cupy_stock_ms") if warm else None
    if ours is not None and cupy14 is not None:
        out.append(_target(name, "met" if ours < cupy14 else "not met", "%s vs %s ms" % (_fmt(ours), _fmt(cupy14)),
                           "Chainer+ptxbackend (legacy harness) vs CuPy 14 stock, per kernel"))
    else:
        missing = "--legacy-results with ptxbackend_warm_ms_per_kernel" if ours is None else "CuPy 14 row (GPU + CuPy)"
        out.append(_target(name, "not measured", "-", "needs %s" % missing))

    comp, comp_sec = _summary(results, "compile")
    name = "cold compile per kernel within 5% of the bare compiler call"
    if comp and comp.get("worst_toolkit_ratio") is not None:
        # Judged per toolkit on all its paired repetitions: one cell's median of a few noisy
        # compiles says more about the machine's noise than about ptxbackend.
        r = comp["worst_toolkit_ratio"]
        overheads = ", ".join("%s %+.2f ms" % (k, v["overhead_ms"]["median"])
                              for k, v in sorted(comp["per_toolkit"].items()))
        out.append(_target(name, "met" if r <= 1.05 else "not met", "worst toolkit %.3fx" % r,
                           "median paired ratio per toolkit, all cells pooled; overhead per compile: %s; "
                           "single cells: median %.3fx, worst %.3fx over %d cells"
                           % (overheads, comp.get("median_ratio") or 0, comp.get("worst_ratio") or 0,
                              comp.get("cells", 0))))
    elif comp and comp.get("worst_ratio") is not None:
        r = comp["worst_ratio"]
        out.append(_target(name, "met" if r <= 1.05 else "not met", "worst %.3fx" % r,
                           "median over %d kernel/toolkit cells %.3fx" % (comp.get("cells", 0), comp.get("median_ratio") or 0)))
    else:
        out.append(_target(name, "not measured", "-", _why_not(comp_sec)))

    kern, kern_sec = _summary(results, "kernels")
    name = "PTX-JIT kernels within 3% of native cubin run time"
    if kern and kern.get("worst_ratio") is not None:
        r = kern["worst_ratio"]
        out.append(_target(name, "met" if r <= 1.03 else "not met", "worst %.3fx" % r,
                           "best %.3fx (saxpy and sinf chain, compute_61/75/86)" % kern.get("best_ratio")))
    else:
        out.append(_target(name, "not measured", "-", _why_not(kern_sec)))

    hook, hook_sec = _summary(results, "hook")
    name = "hook cost < 1 ms and `python -c pass` within 5%"
    if hook and hook.get("pass_ratio") is not None:
        # The hook's cost is what a whole `python -c pass` pays for it (site reading the .pth and
        # running its line), not only the import that -X importtime shows.
        delta = hook.get("pass_delta_ms")
        ok = hook["pass_ratio"] <= 1.05 and delta is not None and delta < 1.0
        out.append(_target(name, "met" if ok else "not met",
                           "+%s ms; pass %.3fx" % (_fmt(delta), hook["pass_ratio"]),
                           "python -c pass, median difference; -X importtime of the start-up module: %s ms"
                           % _fmt(hook.get("boot_import_ms"))))
    else:
        out.append(_target(name, "not measured", "-", _why_not(hook_sec)))

    lib, lib_sec = _summary(results, "libraries")
    name = "library first call in the 2nd process within 1.2x of a library with native code"
    if lib and lib.get("ratio_to_native") is not None:
        r = lib["ratio_to_native"]
        out.append(_target(name, "met" if r <= 1.2 else "not met", "%.2fx" % r,
                           "old cuRAND 2nd process %s s vs native cuRAND %s s" % (
                               _fmt(lib.get("ptxbackend_second_call_s")), _fmt(lib.get("native_first_call_s")))))
    else:
        out.append(_target(name, "not measured", "-", _why_not(lib_sec) if not lib else "no native cuRAND reference"))

    conc, conc_sec = _summary(results, "concurrency")
    name = "16-process cold start compiles each kernel once"
    if conc and conc.get("compiles") is not None:
        detail = "%d processes x %d kernels: %s compiles per repetition" % (
            conc["processes"], conc["kernels"], "/".join(str(c) for c in conc["compiles"]))
        status = "met" if conc["each_once"] else "not met"
        if conc["processes"] != 16 and status == "met":
            detail += " (--quick size, not 16 x 50)"
        out.append(_target(name, status, "/".join(str(c) for c in conc["compiles"]), detail))
    else:
        out.append(_target(name, "not measured", "-", _why_not(conc_sec)))
    fleet, fleet_sec = _summary(results, "fleet")
    if fleet and fleet.get("total_compiles") is not None:
        out.append(_target("fleet: each kernel compiled once", "met" if fleet["each_once"] else "not met",
                           str(fleet["total_compiles"]), "%d machines x %d kernels" % (fleet["machines"],
                                                                                       fleet["kernels"])))
        ratio = fleet.get("remote_over_local")
        out.append(_target("fleet: first use on a new machine within 1.5x a local hit",
                           "met" if ratio and ratio <= 1.5 else "not met",
                           "%.2fx" % (ratio or 0), "new machine %.3f ms, local %.3f ms per kernel" % (
                               fleet["remote_hit_ms"], fleet["local_hit_ms"])))
        trips = fleet.get("round_trips_per_new_process")
        if trips:
            out.append(_target("fleet: one round trip per new process", "met" if max(trips) <= 1 else "not met",
                               "/".join(str(t) for t in trips), "its working set fetched with its first lookup "
                               "(%.2f ms on the server per process)" % (fleet.get("working_set_fetch_ms") or 0)))
        errors = fleet.get("dead_remote_errors_per_process") or []
        out.append(_target("fleet: a dead remote costs at most one timeout per process",
                           "met" if errors and max(errors) <= 1 else "not met", "/".join(str(e) for e in errors),
                           "remote errors per process (refused / paused); first read %s s, later reads %s us" % (
                               "/".join("%.3f" % x for x in fleet.get("dead_remote_first_read_s") or []),
                               "/".join("%.1f" % (x * 1e6) for x in fleet.get("dead_remote_later_read_s") or []))))
        out.append(_target("fleet: 0 of the fuzzed remote values loaded", "met" if fleet["fuzzed_loaded"] == 0
                           else "not met", str(fleet["fuzzed_loaded"]), "%d values" % fleet["fuzzed_values"]))
    else:
        out.append(_target("fleet store", "not measured", "-", _why_not(fleet_sec)))
    return out


# --------------------------------------------------------------------------- Markdown

def _cell(value):
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns, rows):
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        row = list(row) + [""] * (len(columns) - len(row))
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def render_markdown(results):
    m = results.get("machine", {})
    gpu = results.get("gpu", {})
    out = ["# ptxbackend benchmarks", ""]
    out.append("Run %s on `%s` (%s CPUs, Python %s)%s, %.0f s." % (
        results.get("created", "?"), m.get("hostname", "?"), m.get("cpu_count", "?"), m.get("python", "?"),
        " with --quick" if results.get("args", {}).get("quick") else "", results.get("duration_s") or 0))
    if gpu.get("available"):
        out.append("GPU: %s, compute capability %s, driver %s (CUDA %s)." % (
            gpu.get("name"), _cc_text(gpu.get("cc")), gpu.get("driver_build"), gpu.get("driver_cuda_version")))
    else:
        out.append("GPU: none (%s)." % gpu.get("why", "not found"))
    cupy = results.get("cupy", {})
    out.append("CuPy: %s; ptxbackend's start-up hook installed in this interpreter: %s." % (
        cupy.get("cupy_version") or "not importable", "yes" if cupy.get("hook_active") else "no"))
    source = results.get("ptxbackend")
    if source:
        out.append("ptxbackend %s from `%s` (git tree %s%s)%s." % (
            source.get("version") or "(not importable)", source.get("dir"), (source.get("tree") or "?")[:12],
            "; commit %s%s" % (source["commit"][:10], " with changes" if source.get("modified") else "")
            if source.get("commit") else "",
            "; --ptxbackend-src" if results.get("args", {}).get("ptxbackend_src") else ""))
    out += ["", "## Toolkits", ""]
    if any(s.get("run", {}).get("created") != results.get("created") for s in (results.get("sections") or {}).values()):
        out += ["Those of the latest run; sections kept from earlier runs (--merge) name their own.", ""]
    rows = []
    for slot, entry in sorted((results.get("toolkits") or {}).items()):
        if "path" in entry:
            rows.append([slot, "%s %s" % (entry.get("kind"), entry.get("version")), entry.get("path"), entry.get("origin", "")])
        else:
            rows.append([slot, "not found", "-", entry.get("missing", "")])
    out.append(markdown_table(["slot", "version", "path", "found through / why not"], rows))
    out += ["", "## Targets", ""]
    targets = results.get("targets") or evaluate_targets(results)
    out.append(markdown_table(["target", "status", "value", "detail"],
                              [[t["target"], "**%s**" % t["status"], t["value"], t["detail"]] for t in targets]))
    sections = results.get("sections") or {}
    for number, name in enumerate(SECTION_ORDER, 1):
        if name not in sections:
            continue
        sec = sections[name]
        out += ["", "## %d. %s" % (number, sec.get("title", name)), ""]
        if sec.get("status") != "ok":
            out.append("Status: **%s**." % sec.get("status"))
            out.append("")
        run = sec.get("run")
        if run and any(s.get("run", {}).get("created") != run.get("created") for s in sections.values()):
            out.append("Measured in the run of %s (ptxbackend %s; toolkits: %s)." % (
                run.get("created", "?"), run.get("ptxbackend", "?"),
                ", ".join("%s %s" % (slot, text) for slot, text in sorted((run.get("toolkits") or {}).items()))))
            out.append("")
        for table in [sec.get("table")] + list(sec.get("tables") or []):
            if table and table.get("rows"):
                out.append(markdown_table(table["columns"], table["rows"]))
                out.append("")
        for note in sec.get("notes") or []:
            out.append("- " + _cell(note))
        for plot in sec.get("plot_files") or []:
            out += ["", "![%s](%s)" % (name, plot)]
    if results.get("plot_note"):
        out += ["", results["plot_note"]]
    return "\n".join(out).rstrip() + "\n"


def _cc_text(cc):
    return "-" if cc is None else "%d.%d" % (cc // 10, cc % 10)


# --------------------------------------------------------------------------- plots

def _median(value):
    if isinstance(value, dict):
        return value.get("median"), value.get("min"), value.get("max")
    return value, None, None


def make_plots(results, out_dir):
    """Grouped bar charts with min-max error bars; returns a note when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # ImportError, or a broken backend
        return "Plots skipped: matplotlib is not usable here (%s)." % exc
    for name, sec in (results.get("sections") or {}).items():
        files = []
        for spec in sec.get("plots") or []:
            labels, series = spec.get("labels") or [], spec.get("series") or {}
            if not labels or not series:
                continue
            fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) * max(1, len(series)) ** 0.5 + 2), 4.5))
            width = 0.8 / max(1, len(series))
            drawn = False
            for index, (label, values) in enumerate(sorted(series.items())):
                xs, heights, lows, highs = [], [], [], []
                for pos, value in enumerate(values):
                    median, lo, hi = _median(value)
                    if median is None:
                        continue
                    xs.append(pos + (index - (len(series) - 1) / 2.0) * width)
                    heights.append(median)
                    lows.append(median - lo if lo is not None else 0)
                    highs.append(hi - median if hi is not None else 0)
                if xs:
                    ax.bar(xs, heights, width, yerr=[lows, highs], capsize=2, label=label)
                    drawn = True
            if not drawn:
                plt.close(fig)
                continue
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center",
                               fontsize=7 if len(labels) > 8 else 9)
            ax.set_ylabel(spec.get("ylabel", ""))
            ax.set_title(spec.get("title", name))
            if spec.get("log"):
                ax.set_yscale("log")
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, spec["file"]), dpi=110)
            plt.close(fig)
            files.append(spec["file"])
        sec["plot_files"] = files
    return None


# --------------------------------------------------------------------------- writing

def write_results(results, out_dir, plots=True):
    """Write results.json, results.md (and the plots); return their paths."""
    if not os.path.isdir(out_dir):
        os.makedirs(out_dir)
    results["targets"] = evaluate_targets(results)
    if plots:
        results["plot_note"] = make_plots(results, out_dir)
    json_path = os.path.join(out_dir, "results.json")
    tmp = json_path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True, default=str)
        handle.write("\n")
    os.replace(tmp, json_path)
    md_path = os.path.join(out_dir, "results.md")
    with open(md_path, "w") as handle:
        handle.write(render_markdown(results))
    return json_path, md_path
