"""Section 2: warm start in a fresh process with N = 1, 10, 100 distinct cached kernels (GPU only).

Every measurement is a fresh interpreter (benchutil.spawn).  Inside it, the driver context (or
CuPy's) is made first, then one extra cached kernel is used and timed alone ("first": it pays the
one-time costs: settings, store, compiler memo, CuPy's set-up), then the N kernels are timed
together: the per-kernel figure is that time / N.

Paths (rows):
  floor            read a native cubin file + driver.load_module (what no cache can beat)
  ptxbackend cubin ptxbackend.compile() hit + ptxbackend.load() with the cubin level on
  ptxbackend cubin, headers   the same kernels, each starting with #include <bench/carray.cuh>
                   (a copy of benchmarks/kernels/include: 9 headers, read through -I DIR)
  PTX, JIT cache off   the same with PTXBACKEND_CUBIN_CACHE=0 and CUDA_CACHE_DISABLE=1
  PTX, JIT cache warm  PTXBACKEND_CUBIN_CACHE=0, CUDA_CACHE_PATH warmed by an earlier process
  CuPy stock       N ElementwiseKernels, first use, CuPy's cache warm, PTXBACKEND_DISABLE=1
  CuPy + ptxbackend the same through the start-up hook (target auto, and the PTX target)
A discarded warm-up process per row fills its caches first.  Repetitions are interleaved
(for each repetition: for each N: for each row).  ``--warm-rows`` measures only some rows.

The headers row is the cost of a hit that has to re-validate the headers a kernel read (issue 12):
it compiles to the same code as the plain row, so the two differ only in what compile() does.
"""

import gc
import os
import time
from concurrent.futures import ThreadPoolExecutor

import ab
import benchutil
import machine

WARMUP_ID = 999
FIRST_ID = 1000
ROWS = ("floor", "pb_cubin", "pb_cubin_hdr", "floor_jit", "pb_ptx_nojit", "pb_ptx_jitwarm",
        "cupy_stock", "cupy_hook", "cupy_hook_ptx")
# Longer than the few seconds within which a just-changed header's stat cannot be trusted: a
# dependency-checking cache may record such a header to be hashed on every hit.  CuPy's installed
# headers are old, and that is the hit to measure.
HEADER_SETTLE_S = 3.0


# --------------------------------------------------------------------------- child

def _cupy_kernel(cupy, i):
    return cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * %d.0f + 1.0f" % i, "bench_warm_%d" % i)


def warm_child(args):
    mode, ids = args["mode"], args["ids"]
    perf = time.perf_counter
    out = {"n": len(ids)}
    if mode == "floor":
        from ptxbackend.gpu import driver
        driver.ensure_context()
        paths = [os.path.join(args["cubin_dir"], "k%d.cubin" % i) for i in ids]
        first = os.path.join(args["cubin_dir"], "k%d.cubin" % WARMUP_ID)
        gc.collect()
        t0 = perf()
        with open(first, "rb") as handle:
            keep = [driver.load_module(handle.read(), "cubin")]
        t1 = _settle(perf)
        for path in paths:
            with open(path, "rb") as handle:
                data = handle.read()
            keep.append(driver.load_module(data, "cubin"))
        t2 = perf()
        out["kinds"] = sorted(set(m.kind for m in keep))
    elif mode == "ptxbackend":
        import ptxbackend
        from ptxbackend.gpu import driver
        driver.ensure_context()
        header, options = _header_options(args.get("include_dir"))
        sources = [benchutil.kernel_source("elementwise", i, header) for i in ids]
        first = benchutil.kernel_source("elementwise", WARMUP_ID, header)
        target, compiler = args["target"], args["compiler"]
        gc.collect()
        t0 = perf()
        keep = [ptxbackend.load(ptxbackend.compile(first, options, target=target, compiler=compiler))]
        t1 = _settle(perf)
        hits = 0
        in_compile = 0.0
        for source in sources:
            c0 = perf()
            artifact = ptxbackend.compile(source, options, target=target, compiler=compiler)
            in_compile += perf() - c0
            hits += bool(artifact.cache_hit)
            keep.append(ptxbackend.load(artifact))
        t2 = perf()
        out["hits"] = hits
        out["compile_ms"] = in_compile * 1000.0 / max(1, len(ids))
        out["kinds"] = sorted(set(m.kind for m in keep))
    else:  # cupy
        stats = None
        if args.get("hook"):
            import _ptxbackend_boot
            _ptxbackend_boot.start()
        import cupy
        if args.get("hook"):
            stats = _count_ptxbackend_compiles()
        x = cupy.arange(1024, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        first = _cupy_kernel(cupy, WARMUP_ID)
        kernels = [_cupy_kernel(cupy, i) for i in ids]
        gc.collect()
        t0 = perf()
        first(x)
        cupy.cuda.Device().synchronize()
        t1 = _settle(perf)
        for kernel in kernels:
            kernel(x)
        cupy.cuda.Device().synchronize()
        t2 = perf()
        if stats is not None:
            import ptxbackend
            out.update(stats)
            out["installed"] = ptxbackend.installed()
    out["first_ms"] = (t1[0] - t0) * 1000.0
    out["per_kernel_ms"] = (t2 - t1[1]) * 1000.0 / max(1, len(ids))
    out["ptxbackend"] = benchutil.imported_ptxbackend()
    return out


def _header_options(include_dir):
    """(header the sources start with, compile options) for a row; CuPy v1's way: an absolute -I."""
    if not include_dir:
        return None, ()
    return benchutil.HEADER_ROOT, ("-I", include_dir)


def _settle(perf):
    """End the first kernel's clock, collect garbage, start the per-kernel clock: ``(end, start)``.

    Every row gets the same clean heap, so no row inherits a full collection
    made due by its imports (ptxbackend's lazy ones run in the first kernel).
    """
    end = perf()
    gc.collect()
    return end, perf()


def _count_ptxbackend_compiles():
    """Count the compiles the hook hands to ptxbackend, and their cache hits (a few microseconds each)."""
    from ptxbackend.compiling import engine
    stats = {"served": 0, "hits": 0, "kinds": []}
    entry = ab.hook_entry(engine)
    original = getattr(engine, entry)

    def counting(*args, **kwargs):
        artifact = original(*args, **kwargs)
        stats["served"] += 1
        stats["hits"] += bool(artifact.cache_hit)
        if artifact.kind not in stats["kinds"]:
            stats["kinds"].append(artifact.kind)
        return artifact

    setattr(engine, entry, counting)
    return stats


# --------------------------------------------------------------------------- preparation (runner)

def _compile_many(ids, target, entry, cache_dir, cc, workers, include_dir=None):
    """ptxbackend.compile() every variant into ``cache_dir``; returns {id: artifact}."""
    import ptxbackend
    saved = {k: os.environ.get(k) for k in ("PTXBACKEND_NVCC", "PTXBACKEND_NVRTC")}
    os.environ.update(machine.env_for(entry))
    cc_text = "%d.%d" % (cc // 10, cc % 10)
    header, options = _header_options(include_dir)

    def one(i):
        return i, ptxbackend.compile(benchutil.kernel_source("elementwise", i, header), options, target=target,
                                     compiler=entry["kind"], device_cc=cc_text, cache_dir=cache_dir)
    try:
        results = dict([one(ids[0])])  # the first alone: compiler identity, store
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results.update(pool.map(one, ids[1:]))
        return results
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _write_headers(ctx):
    """The header tree in a fresh -I directory; returns (directory, relative header paths, lines)."""
    include_dir = ctx.ws.fresh("include")
    names = benchutil.write_header_tree(include_dir)
    lines = 0
    for name in names:
        with open(os.path.join(include_dir, name)) as handle:
            lines += sum(1 for _ in handle)
    return include_dir, names, lines


def _wait_until_settled(directory, names, age):
    """Sleep until every header was last changed (mtime or ctime) more than ``age`` seconds ago."""
    newest = 0.0
    for name in names:
        st = os.stat(os.path.join(directory, name))
        newest = max(newest, st.st_mtime, st.st_ctime)
    delay = newest + age - time.time()
    if delay > 0:
        time.sleep(delay)


def _extract_jit_cubins(out_dir, cache_dir, built):
    """Write the payload of each artifact's JIT cubin entry to OUT/k<id>.cubin; returns how many are missing."""
    from ptxbackend.cache import entry
    found = {}
    for base, _dirs, files in os.walk(cache_dir):
        if os.sep + "jit" + os.sep in base + os.sep:
            for name in files:
                if name.endswith(".cubin"):
                    found[name[:-len(".cubin")]] = os.path.join(base, name)
    missing = 0
    for i, artifact in built.items():
        path = found.get(artifact.key)
        if path is None:
            missing += 1
            continue
        with open(path, "rb") as handle:
            payload = entry.decode(handle.read(), artifact.key, "cubin")[0]
        with open(os.path.join(out_dir, "k%d.cubin" % i), "wb") as handle:
            handle.write(payload)
    return missing


def run(ctx):
    if not ctx.gpu.get("available"):
        return ctx.skipped("Warm start in a fresh process", "needs a GPU (%s)" % ctx.gpu.get("why", "none found"))
    reps = ctx.reps(full=5, quick=2)
    ns = (1, 10, 100)
    ids_all = list(range(FIRST_ID, FIRST_ID + max(ns))) + [WARMUP_ID]
    cc = ctx.device_cc
    wanted = set(getattr(ctx.args, "warm_rows", None) or ROWS)
    notes = ["Per-kernel ms = (time for the N kernels) / N in a fresh process, after one extra kernel "
             "(its time is 'first kernel'); median (min-max, repetitions).",
             "Kernel for the floor and ptxbackend rows: benchmarks/kernels/elementwise.cu with a distinct "
             "BENCH_VARIANT each; CuPy rows: distinct ElementwiseKernels."]
    if wanted != set(ROWS):
        notes.append("Rows measured (--warm-rows): %s." % ", ".join(k for k in ROWS if k in wanted))
    if "floor_jit" in wanted and "pb_cubin" not in wanted:
        wanted.discard("floor_jit")
        notes.append("floor_jit not measured: it loads the JIT cubins that the pb_cubin row's warm-up writes.")
    workers = max(1, min(8, os.cpu_count() or 1))
    include_dir = None
    if "pb_cubin_hdr" in wanted:
        # Written first, so that it is old enough by the time its kernels are compiled.
        include_dir, header_names, header_lines = _write_headers(ctx)
        notes.append("Headers row: the same kernels, each starting with #include <%s>, compiled with -I %s: "
                     "%d headers, %d lines (a copy of benchmarks/kernels/include, older than %.0f s when "
                     "compiled)."
                     % (benchutil.HEADER_ROOT, include_dir, len(header_names), header_lines, HEADER_SETTLE_S))

    native_slot, native = machine.pick(ctx.toolkits, ("nvrtc13", "nvcc13"), cc, kind="sm")
    ptx_slot, ptx = machine.pick(ctx.toolkits, ("nvrtc13", "nvcc13", "nvrtc117", "nvcc112"), ctx.ptx_arch)
    ptx_target = "compute_%d" % ctx.ptx_arch
    rows = []  # (key, label, child args, env)
    base = {"CUDA_CACHE_MAXSIZE": benchutil.JIT_CACHE_4G, "PTXBACKEND_DISABLE": "1", "CUDA_CACHE_DISABLE": None}

    if native and "floor" in wanted:
        cubin_dir = ctx.ws.fresh("floor-cubins")
        benchutil.log("warm: building %d native cubins (sm_%d) with %s" % (len(ids_all), cc, native_slot))
        built = _compile_many(ids_all, "sm_%d" % cc, native, ctx.ws.fresh("floor-cache"), cc, workers)
        for i, artifact in built.items():
            with open(os.path.join(cubin_dir, "k%d.cubin" % i), "wb") as handle:
                handle.write(artifact.image)
        env = dict(base, CUDA_CACHE_PATH=ctx.ws.fresh("jit-floor"))
        rows.append(("floor", "floor: read cubin + cuModuleLoadData (sm_%d)" % cc,
                     {"mode": "floor", "cubin_dir": cubin_dir}, env))
    elif "floor" in wanted:
        notes.append("floor not measured: no compiler here emits sm_%d cubins." % cc)

    jit_floor = None
    pb_rows = ("pb_cubin", "pb_ptx_nojit", "pb_ptx_jitwarm")
    if ptx and wanted.intersection(pb_rows + ("pb_cubin_hdr",)):
        pb_cache = ctx.ws.fresh("pb-cache")
        pb_built = {}
        if wanted.intersection(pb_rows):
            benchutil.log("warm: building %d PTX entries (%s) with %s" % (len(ids_all), ptx_target, ptx_slot))
            pb_built = _compile_many(ids_all, ptx_target, ptx, pb_cache, cc, workers)
        common = dict(base, PTXBACKEND_CACHE_DIR=pb_cache, **machine.env_for(ptx))
        args = {"mode": "ptxbackend", "target": ptx_target, "compiler": ptx["kind"]}
        who = "%s %s" % (machine.label(ptx_slot, ptx), ptx_target)
        rows.append(("pb_cubin", "ptxbackend hit, cubin level (%s)" % who, args,
                     dict(common, PTXBACKEND_CUBIN_CACHE="1", CUDA_CACHE_PATH=ctx.ws.fresh("jit-pbcubin"))))
        if "pb_cubin_hdr" in wanted:
            hdr_cache = ctx.ws.fresh("pb-hdr-cache")
            _wait_until_settled(include_dir, header_names, HEADER_SETTLE_S)
            benchutil.log("warm: building %d PTX entries with headers (%s) with %s"
                          % (len(ids_all), ptx_target, ptx_slot))
            hdr_built = _compile_many(ids_all, ptx_target, ptx, hdr_cache, cc, workers, include_dir)
            if pb_built:
                # What makes the two rows comparable: the loads are of the same bytes.
                differ = sum(1 for i in ids_all if hdr_built[i].image != pb_built[i].image)
                notes.append("Headers row: its kernels compile to the same PTX as the plain row's." if not differ
                             else "Headers row: %d of %d kernels compile to other PTX than the plain row's."
                             % (differ, len(ids_all)))
            rows.append(("pb_cubin_hdr", "ptxbackend hit, cubin level, headers (%d through -I)" % len(header_names),
                         dict(args, include_dir=include_dir),
                         dict(common, PTXBACKEND_CACHE_DIR=hdr_cache, PTXBACKEND_CUBIN_CACHE="1",
                              CUDA_CACHE_PATH=ctx.ws.fresh("jit-pbhdr"))))
        # The same floor loop over the very bytes the cubin level loads (the driver's JIT output,
        # taken out of ptxbackend's entries after the warm-up): what is left is ptxbackend's own work.
        jit_floor = (ctx.ws.fresh("floor-jit-cubins"), pb_cache, pb_built)
        rows.append(("floor_jit", "floor with those JIT cubins: read + cuModuleLoadData",
                     {"mode": "floor", "cubin_dir": jit_floor[0]},
                     dict(base, CUDA_CACHE_PATH=ctx.ws.fresh("jit-floor2"))))
        rows.append(("pb_ptx_nojit", "ptxbackend PTX, driver JIT cache off", args,
                     dict(common, PTXBACKEND_CUBIN_CACHE="0", CUDA_CACHE_DISABLE="1",
                          CUDA_CACHE_PATH=ctx.ws.fresh("jit-off"))))
        rows.append(("pb_ptx_jitwarm", "ptxbackend PTX, driver JIT cache warm", args,
                     dict(common, PTXBACKEND_CUBIN_CACHE="0", CUDA_CACHE_PATH=ctx.ws.fresh("jit-warm"))))
    elif not ptx and wanted.intersection(pb_rows + ("pb_cubin_hdr", "floor_jit")):
        notes.append("ptxbackend rows not measured: no compiler here builds %s." % ptx_target)

    if ctx.cupy.get("cupy_version") and wanted.intersection(("cupy_stock", "cupy_hook", "cupy_hook_ptx")):
        stock_dir = ctx.ws.fresh("cupy-stock")
        rows.append(("cupy_stock", "CuPy %s stock (its cache warm)" % ctx.cupy["cupy_version"],
                     {"mode": "cupy"}, dict(base, CUPY_CACHE_DIR=stock_dir, CUDA_CACHE_PATH=ctx.ws.fresh("jit-cs"))))
        hook = dict(base, PTXBACKEND_DISABLE=None, CUPY_CACHE_DIR=ctx.ws.fresh("cupy-hook"))
        if "path" in ctx.toolkits.get("nvrtc13", {}):
            hook["PTXBACKEND_NVRTC"] = ctx.toolkits["nvrtc13"]["path"]
        rows.append(("cupy_hook", "CuPy + ptxbackend hook (target auto)", {"mode": "cupy", "hook": True},
                     dict(hook, PTXBACKEND_CACHE_DIR=ctx.ws.fresh("hook-cache"), CUDA_CACHE_PATH=ctx.ws.fresh("jit-ch"))))
        rows.append(("cupy_hook_ptx", "CuPy + ptxbackend hook (%s, cubin level)" % ptx_target,
                     {"mode": "cupy", "hook": True},
                     dict(hook, PTXBACKEND_TARGET=ptx_target, PTXBACKEND_CACHE_DIR=ctx.ws.fresh("hook-ptx-cache"),
                          CUDA_CACHE_PATH=ctx.ws.fresh("jit-chp"))))
    elif wanted.intersection(("cupy_stock", "cupy_hook", "cupy_hook_ptx")):
        notes.append("CuPy rows not measured: CuPy is not importable here (%s)." % ctx.cupy.get("cupy_error", "missing"))
    rows = [row for row in rows if row[0] in wanted]

    failed = {}
    for key, label, args, env in rows:  # warm-up: fill every cache this row reads
        benchutil.log("warm: warm-up process for %s" % key)
        if key == "floor_jit":
            try:
                missing = _extract_jit_cubins(*jit_floor)
            except Exception as exc:  # another ptxbackend version's cache layout
                failed[key] = "JIT cubins not extracted from ptxbackend's cache: %s" % benchutil.first_line(exc)
                continue
            if missing:
                failed[key] = "%d JIT cubins not found in ptxbackend's cache after its warm-up" % missing
                continue
        try:
            got = benchutil.spawn("bench_warm", "warm_child", dict(args, ids=ids_all[:-1]),
                                  benchutil.clean_env(env), timeout=600)
            if key.startswith("cupy_hook") and got.get("served", 0) < max(ns):
                notes.append("%s: ptxbackend served %d of %d kernels in the warm-up (the rest fell back to CuPy)."
                             % (key, got.get("served", 0), max(ns)))
        except benchutil.ChildError as exc:
            failed[key] = str(exc)
    samples = {(key, n): [] for key, _l, _a, _e in rows for n in ns}
    firsts = {(key, n): [] for key, _l, _a, _e in rows for n in ns}
    compiles = {(key, n): [] for key, _l, _a, _e in rows for n in ns}
    checks = {}
    in_compile = {}
    imported = {}  # (version, dir) of the ptxbackend each child imported -> rows
    for rep in range(reps):
        for n in ns:
            for key, label, args, env in rows:
                if key in failed:
                    continue
                benchutil.log("warm: rep %d N=%d %s" % (rep + 1, n, key))
                try:
                    got = benchutil.spawn("bench_warm", "warm_child", dict(args, ids=ids_all[:n]),
                                          benchutil.clean_env(env), timeout=600)
                except benchutil.ChildError as exc:
                    failed[key] = str(exc)
                    continue
                samples[(key, n)].append(got["per_kernel_ms"])
                firsts[(key, n)].append(got["first_ms"])
                if "compile_ms" in got:
                    compiles[(key, n)].append(got["compile_ms"])
                    in_compile.setdefault(key, []).append((n, got["compile_ms"], got["per_kernel_ms"]))
                if got.get("ptxbackend"):
                    imported.setdefault((got["ptxbackend"]["version"], got["ptxbackend"]["dir"]), set()).add(key)
                checks.setdefault(key, got)
                if "hits" in got and got["hits"] < n:
                    notes.append("%s N=%d: only %d of %d were cache hits." % (key, n, got["hits"], n))
    for key, why in failed.items():
        notes.append("%s failed: %s" % (key, why))
    for key, got in sorted(checks.items()):
        if "kinds" in got:
            notes.append("%s: modules loaded from %s images%s." % (
                key, "/".join(got["kinds"]),
                "" if "served" not in got else "; hook installed: %s" % got.get("installed")))

    for key, values in sorted(in_compile.items()):
        big = [v for v in values if v[0] == max(ns)]
        if big:
            notes.append("%s N=%d: of each kernel's %s ms, compile() (settings, key, cache read and checks) took %s ms; "
                         "the rest is load() (device check, cuModuleLoadDataEx)."
                         % (key, max(ns), benchutil.fmt_stat(benchutil.summarize([v[2] for v in big], "ms")),
                            benchutil.fmt_stat(benchutil.summarize([v[1] for v in big], "ms"))))
    stats = {}
    for (key, n), values in samples.items():
        stats.setdefault(key, {})[str(n)] = {"per_kernel_ms": benchutil.summarize(values, "ms"),
                                             "first_ms": benchutil.summarize(firsts[(key, n)], "ms")}
        if compiles[(key, n)]:
            stats[key][str(n)]["compile_ms"] = benchutil.summarize(compiles[(key, n)], "ms")
    source = getattr(ctx, "ptxbackend_src", None) or {}
    measured = [{"version": version, "dir": where, "rows": sorted(keys)}
                for (version, where), keys in sorted(imported.items())]
    for entry in measured:
        notes.append("Children imported ptxbackend %s from %s (rows: %s)%s." % (
            entry["version"], entry["dir"], ", ".join(entry["rows"]),
            "" if entry["dir"] == source.get("dir", entry["dir"])
            else "; NOT the ptxbackend this run was asked to measure (%s)" % source.get("dir")))
    legacy = ctx.legacy or {}
    result = _report(rows, stats, ns, notes, legacy, ptx_target)
    result["ptxbackend_measured"] = measured
    result["ptxbackend_src"] = source
    return result


def _report(rows, stats, ns, notes, legacy, ptx_target):
    floor = stats.get("floor", {})
    columns = ["path"]
    for n in ns:
        columns += ["N=%d ms/kernel" % n, "x floor"]
    columns.append("first kernel, ms (N=%d runs)" % max(ns))
    columns.append("compile() ms/kernel (N=%d)" % max(ns))
    table = []
    plot_labels, series = [], {"N=%d" % n: [] for n in ns}
    for key, label, _args, _env in rows:
        row = [label]
        for n in ns:
            cell = stats.get(key, {}).get(str(n), {}).get("per_kernel_ms")
            base = floor.get(str(n), {}).get("per_kernel_ms")
            row += [benchutil.fmt_stat(cell), benchutil.fmt_ratio(benchutil.ratio(cell, base) if base else None)]
            series["N=%d" % n].append(cell)
        row.append(benchutil.fmt_stat(stats.get(key, {}).get(str(max(ns)), {}).get("first_ms")))
        row.append(benchutil.fmt_stat(stats.get(key, {}).get(str(max(ns)), {}).get("compile_ms")))
        table.append(row)
        plot_labels.append(key)
    for key, label in LEGACY_ROWS:
        value = legacy.get(key)
        if value is None:
            continue
        row = [label + " (legacy harness)"]
        for n in ns:
            cell = value.get(str(n)) if isinstance(value, dict) and "median" not in value else \
                (value if n == max(ns) else None)
            base = floor.get(str(n), {}).get("per_kernel_ms")
            row += [benchutil.fmt_stat(cell), benchutil.fmt_ratio(benchutil.ratio(cell, base) if cell and base else None)]
        row += ["-", "-"]
        table.append(row)
    if legacy:
        notes.append("Legacy rows come from --legacy-results (%s); a value without N is shown under N=%d."
                     % (legacy.get("_source", "?"), max(ns)))
    big = str(max(ns))

    def med(key, figure="per_kernel_ms"):
        return (stats.get(key, {}).get(big, {}).get(figure) or {}).get("median")
    summary = {"n": max(ns), "floor_ms": med("floor"), "floor_jit_ms": med("floor_jit"), "pb_cubin_ms": med("pb_cubin"),
               "pb_cubin_hdr_ms": med("pb_cubin_hdr"), "pb_cubin_compile_ms": med("pb_cubin", "compile_ms"),
               "pb_cubin_hdr_compile_ms": med("pb_cubin_hdr", "compile_ms"),
               "pb_ptx_nojit_ms": med("pb_ptx_nojit"), "pb_ptx_jitwarm_ms": med("pb_ptx_jitwarm"),
               "cupy_stock_ms": med("cupy_stock"), "cupy_hook_ms": med("cupy_hook"),
               "cupy_hook_ptx_ms": med("cupy_hook_ptx"), "ptx_target": ptx_target}
    for key, _label in LEGACY_ROWS:
        if key in legacy:
            summary["legacy_" + key] = _median_of(legacy[key], big)
    measured = any(cell["per_kernel_ms"]["reps"] for row in stats.values() for cell in row.values())
    return {"title": "Warm start in a fresh process (N distinct cached kernels)", "status": "ok" if measured else "error",
            "notes": notes, "stats": stats, "summary": summary, "rows": [[key, label] for key, label, _a, _e in rows],
            "table": {"columns": columns, "rows": table},
            "plots": [{"file": "warm.png", "title": "Warm start per kernel (fresh process)", "ylabel": "ms per kernel",
                       "log": True, "labels": plot_labels, "series": series}]}


# --------------------------------------------------------------------------- legacy results

LEGACY_ROWS = (
    ("stock_warm_ms_per_kernel", "Chainer 1.24 stock, first use of a cached kernel"),
    ("ptxbackend_warm_ms_per_kernel", "Chainer 1.24 + ptxbackend, first use of a cached kernel"),
    ("stock_hit_ms_per_kernel", "Chainer 1.24 stock compile_with_cache hit"),
    ("ptxbackend_hit_ms_per_kernel", "Chainer 1.24 + ptxbackend compile_with_cache hit"),
    ("stock_cold_ms_per_kernel", "Chainer 1.24 stock, cold (compile)"),
    ("ptxbackend_cold_ms_per_kernel", "Chainer 1.24 + ptxbackend, cold (compile)"),
)


def _as_stat(value):
    if isinstance(value, (int, float)):
        return benchutil.summarize([value], "ms")
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        return benchutil.summarize(value, "ms")
    if isinstance(value, dict) and "median" in value:
        stat = benchutil.summarize([value["median"]], "ms")
        stat.update({k: value[k] for k in ("min", "max", "reps", "q1", "q3") if k in value})
        return stat
    return None


def normalize_legacy(data, source="?"):
    """The legacy harness's per-kernel figures, as {key: stat or {N: stat}}; unknown keys ignored.

    Keys are looked up at the top level, then under "benchmarks".  Each value is a number, a list of
    repetitions, a {"median", "min", "max", "reps"} dict, or a dict of those keyed by N ("1", "100").
    """
    found = {"_source": source}
    for scope in (data, data.get("benchmarks") if isinstance(data, dict) else None):
        if not isinstance(scope, dict):
            continue
        for key, _label in LEGACY_ROWS:
            if key in found or key not in scope:
                continue
            value = scope[key]
            stat = _as_stat(value)
            if stat is None and isinstance(value, dict):
                per_n = {str(n): _as_stat(v) for n, v in value.items() if _as_stat(v) is not None}
                if per_n:
                    found[key] = per_n
                continue
            if stat is not None:
                found[key] = stat
    return found


def _median_of(value, n):
    if isinstance(value, dict) and "median" not in value:
        value = value.get(n) or (value[sorted(value, key=int)[-1]] if value else None)
    return value.get("median") if isinstance(value, dict) else None
