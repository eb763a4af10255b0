"""`ptxbackend doctor`: what this machine has, what ptxbackend would do, and what to fix."""

import os
import sys

from ..gpu import driver
from .._version import __version__
from ..compilers import KINDS, get_compiler
from ..config import settings_and_problems
from ..compiling.engine import open_store
from ..errors import PtxBackendError
from ..compiling.targets import choose_target, format_cc


def _range(identity):
    archs = identity.virtual_archs
    return "compute_%d..compute_%d" % (archs[0], archs[-1]) if archs else "none"


def _imported_jit_report(settings, path, warnings):
    """The driver JIT cache `cache import` installed: in use here, complete, and how large a cache it needs."""
    from ..deploy import jit_bundle
    record = jit_bundle.installed_record(settings.cache_dir)
    if not record:
        return None
    found = jit_bundle.check_installed(record, path)
    if not found["in_use"]:
        warnings.append("a driver JIT cache for %s was imported into %s, but this process's driver uses %s: "
                        "unset CUDA_CACHE_PATH (the start-up hook points it there), or set it to that directory."
                        % (", ".join(l["path"] for l in found["libraries"]), found["directory"], path))
    elif found["files_present"] != found["files"]:
        warnings.append("the imported driver JIT cache in %s misses %d of its %d files: import the bundle again."
                        % (found["directory"], found["files"] - found["files_present"], found["files"]))
    for lib in found["libraries"]:
        if lib["state"] == "different":
            warnings.append("%s is not the library the imported driver JIT cache was warmed for (%d bytes, sha256 "
                            "%s): the driver will JIT-compile it again. Warm and export the library in use."
                            % (lib["path"], lib["size"], (lib.get("sha256") or "?")[:16]))
    limit = os.environ.get("CUDA_CACHE_MAXSIZE")
    if limit and limit.isdigit() and int(limit) < found["needs_maxsize"]:
        warnings.append("CUDA_CACHE_MAXSIZE=%s is below the %d bytes of the imported driver JIT cache: the "
                        "driver may evict it. Set CUDA_CACHE_MAXSIZE=4294967296." % (limit, found["needs_maxsize"]))
    found["driver"] = record.get("driver")
    found["gpus"] = record.get("gpus")
    return found


def _jit_cache_report(warnings, settings=None):
    env = {name: os.environ.get(name) for name in
           ("CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE", "CUDA_CACHE_PATH", "CUDA_FORCE_PTX_JIT")}
    try:
        from _ptxbackend_env import set_by_hook
    except ImportError:
        set_by_hook = {}
    path = env["CUDA_CACHE_PATH"] or os.path.join(os.path.expanduser("~"), ".nv", "ComputeCache")
    if env["CUDA_CACHE_DISABLE"] == "1":
        warnings.append("CUDA_CACHE_DISABLE=1: the driver JIT-compiles PTX (yours and CUDA libraries') "
                        "again in every process. Unset it.")
    if env["CUDA_CACHE_MAXSIZE"]:
        try:
            if int(env["CUDA_CACHE_MAXSIZE"]) < (256 << 20):
                warnings.append("CUDA_CACHE_MAXSIZE=%s bytes is small: a library's JIT output (cuDNN: "
                                "hundreds of MB) will not fit and is compiled again in every process. "
                                "Set CUDA_CACHE_MAXSIZE=4294967296." % env["CUDA_CACHE_MAXSIZE"])
        except ValueError:
            warnings.append("CUDA_CACHE_MAXSIZE=%r is not a number of bytes." % env["CUDA_CACHE_MAXSIZE"])
    from ..deploy.replay import load_library_results
    needed = sum(int(r.get("jit_cache_growth_bytes", 0)) for r in load_library_results().values())
    if needed and env["CUDA_CACHE_MAXSIZE"]:
        try:
            if int(env["CUDA_CACHE_MAXSIZE"]) < needed:
                warnings.append("CUDA_CACHE_MAXSIZE=%s is below the %d bytes `ptxbackend warm --libs` measured "
                                "as needed: libraries will be JIT-compiled again in every process. Set "
                                "CUDA_CACHE_MAXSIZE=4294967296." % (env["CUDA_CACHE_MAXSIZE"], needed))
        except ValueError:
            pass
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    writable = bool(probe) and os.access(probe, os.W_OK)
    if not writable:
        warnings.append("the driver JIT cache path %s is not writable: JIT results are lost at exit. "
                        "Set CUDA_CACHE_PATH to a writable directory." % path)
    report = {"variables": env, "path": path, "writable": writable, "needed_bytes": needed,
              "set_by_hook": sorted(name for name, value in set_by_hook.items() if env.get(name) == value)}
    if settings is not None:
        report["imported"] = _imported_jit_report(settings, path, warnings)
    return report


def _site_dirs():
    import site
    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.append(user)
    dirs.extend(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    unique = []
    for directory in dirs:
        if directory not in unique:
            unique.append(directory)
    return unique


def _hook_report(warnings):
    """Where the .pth hook is installed, whether it is active here, and what it did to CuPy."""
    files = [os.path.join(d, "ptxbackend.pth") for d in _site_dirs()
             if os.path.isfile(os.path.join(d, "ptxbackend.pth"))]
    try:
        import _ptxbackend_env
        active, disabled = _ptxbackend_env.active(), _ptxbackend_env.disabled()
    except ImportError:
        active, disabled = False, False
    report = {"pth_files": files, "active": active, "disabled": disabled}
    if not files:
        warnings.append("ptxbackend.pth is not in any site-packages directory: CuPy is not switched at "
                        "start-up. Reinstall from the checkout (`python -m pip install .`), or call ptxbackend.install().")
    elif not active and not disabled and sys.flags.no_site:
        warnings.append("this interpreter runs with -S, so the start-up hook did not run.")
    try:
        import cupy  # noqa: F401  (doctor is explicit: importing CuPy here is what the user asked for)
    except Exception as exc:  # CuPy missing or broken: report, never fail
        report["cupy_import_error"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        from ..hook import cupy_integration
        report["cupy"] = cupy_integration.status()
    except Exception as exc:
        report["cupy"] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    report["dependency_checks"] = _dependency_checks(report)
    return report


def _dependency_checks(hook_report):
    """How a hit re-checks the headers of CuPy's kernels (its include directory) and of NVRTC's quoted
    includes (the working directory): a network file system makes every hit look at every header."""
    from ..dependencies import depsets
    places = [os.getcwd()]
    cupy = sys.modules.get("cupy")
    if cupy is not None and getattr(cupy, "__file__", None):
        places.insert(0, os.path.join(os.path.dirname(cupy.__file__), "_core", "include"))
    found = {}
    for place in places:
        try:
            found[place] = depsets.watch_mode(place)
        except Exception as exc:  # a report line, never a failure
            found[place] = "unknown: %s: %s" % (type(exc).__name__, exc)
    return found


def _default_kind(settings, compilers):
    """The compiler compile() would use: the one set, else nvcc when found, else NVRTC."""
    if settings.compiler in KINDS:
        return settings.compiler
    for kind in KINDS:
        if "error" not in compilers.get(kind, {"error": 1}):
            return kind
    return None


def collect():
    """Gather the report as a JSON-able dict."""
    warnings = []
    report = {"python": sys.version.split()[0], "executable": sys.executable,
              "ptxbackend": __version__, "package": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    # Problems stop ptxbackend from doing what it is set to do (exit status 1); warnings are advice.
    # Every one is listed and the rest of the report is still made.
    settings, problems = settings_and_problems()
    report["problems"] = problems
    if settings.compiler and settings.compiler not in KINDS:
        problems.append("PTXBACKEND_COMPILER=%r is not a compiler ptxbackend knows: use %s, or unset it"
                        % (settings.compiler, " or ".join(KINDS)))
    report["settings"] = {name: {"value": _redacted(name, value), "from": settings.origins[name]}
                          for name, value in sorted(settings.as_dict().items())}
    store = open_store(settings)
    entries = list(store.entries())
    old_layouts, unknown = store.root_items()
    report["cache"] = {"dir": store.root, "entries": len(entries),
                       "bytes": sum(size for _p, size, _m in entries), "max_bytes": settings.cache_max_size,
                       "old_layouts": old_layouts, "unknown": unknown}
    report["remote"] = _remote_report(settings, problems, warnings)
    compilers = {}
    for kind in KINDS:
        try:
            compiler = get_compiler(kind, settings.nvcc, settings.nvrtc, os.path.join(store.meta_dir, "compilers"))
            identity = compiler.identity
            compilers[kind] = {"path": identity.path, "version": identity.version, "range": _range(identity),
                               "cubin": bool(identity.real_archs), "identity": identity,
                               "outputs": list(compiler.output_kinds)}
        except PtxBackendError as exc:
            compilers[kind] = {"error": str(exc)}
            if getattr(settings, kind):  # named by PTXBACKEND_NVCC / PTXBACKEND_NVRTC: it must work
                problems.append("%s: %s" % (kind, str(exc).splitlines()[0]))
    devices = []
    drv = {"available": driver.available()}
    if not drv["available"]:
        drv["reason"] = _driver_reason()
        if os.environ.get("PTXBACKEND_LIBCUDA"):  # named on purpose: it must work
            problems.append(drv["reason"] if "PTXBACKEND_LIBCUDA" in drv["reason"] else
                            "PTXBACKEND_LIBCUDA=%s cannot be used: %s" % (os.environ["PTXBACKEND_LIBCUDA"],
                                                                         drv["reason"]))
    report["environment"] = _environment_report(problems)
    if drv["available"]:
        drv.update(version=driver.driver_version(), build=driver.driver_build(), library=driver.library_path())
        for ordinal in range(driver.device_count()):
            devices.append({"ordinal": ordinal, "name": driver.device_name(ordinal),
                            "cc": driver.compute_capability(ordinal)})
    elif settings.device_cc:
        from ..compiling.targets import parse_cc
        devices.append({"ordinal": None, "name": "PTXBACKEND_DEVICE_CC", "cc": parse_cc(settings.device_cc)})
    else:
        warnings.append("no CUDA driver or GPU here: 'auto' needs PTXBACKEND_DEVICE_CC (e.g. 7.5) to "
                        "build for another machine.")
    for device in devices:
        device["auto"] = {}
        for kind, info in compilers.items():
            if "identity" not in info:
                continue
            try:
                target, reason = choose_target(settings.target, info["identity"], device["cc"])
                if target.output_kind not in info["outputs"]:
                    raise PtxBackendError("%s cannot build a %s (target %s)" % (kind, target.output_kind, target))
                device["auto"][kind] = {"target": str(target), "kind": target.output_kind, "why": reason,
                                        "uses": target.part_for(device["cc"])}
            except PtxBackendError as exc:
                device["auto"][kind] = {"error": str(exc)}
                if kind == _default_kind(settings, compilers):
                    problems.append("%s cannot build for %s (%s) with PTXBACKEND_TARGET=%s: %s" % (
                        kind, device["name"], format_cc(device["cc"]), settings.target,
                        str(exc).splitlines()[0]))
    for info in compilers.values():
        info.pop("identity", None)
    if all("error" in info for info in compilers.values()):
        warnings.append("no compiler found: only kernels already in the cache can be loaded. Install a CUDA "
                        "toolkit or `pip install nvidia-cuda-nvrtc-cu12`, or set PTXBACKEND_NVCC.")
    report.update(compilers=compilers, driver=drv, devices=devices, libraries=_libraries_report(),
                  hook=_hook_report(warnings),
                  driver_jit_cache=_jit_cache_report(warnings, settings), warnings=warnings)
    return report


def _libraries_report():
    """Where `warm --libs cudnn` would find cuDNN (the same search), or what to install: advice, not a
    warning, since most programs never load it.  Nothing is loaded."""
    from ..gpu.libraries import find_cuda_library
    from ..deploy.library_warmup import not_found_message
    path, looked = find_cuda_library("cudnn")
    report = {"cudnn": {"path": path} if path else {"missing": not_found_message("cudnn", looked)}}
    report["cudnn"]["steering"] = _cudnn_steering_report(path)
    return report


def _cudnn_steering_report(path):
    """The cuDNN algorithm verdicts `warm --libs cudnn` filed: for each library and GPU, what the start-up hook
    steers Chainer's convolutions away from and why (lines), and whether the file found here still matches."""
    from ..config import load_settings
    from ..gpu import cudnn_algos
    from ..hook import cudnn_steering
    try:
        entries = cudnn_algos.load(open_store(load_settings()).meta_dir)
    except PtxBackendError as exc:
        return {"lines": ["cuDNN algorithm verdicts: cannot open the cache (%s)" % exc]}
    lines = []
    here = None
    if path:
        try:
            here = cudnn_algos.library_identity(path)
        except OSError:
            here = None
    for entry in entries:
        current = here is not None and all(entry["library"][k] == here[k] for k in ("path", "size", "mtime_ns"))
        described = cudnn_algos.describe(entry)
        lines.append("%s: %s%s" % (entry["library"]["path"], described[0],
                                   "" if current or here is None or entry["library"]["path"] != here["path"]
                                   else " (STALE: the file changed since; run `ptxbackend warm --libs cudnn`)"))
        lines.extend(described[1:])
    if not entries:
        lines.append("cuDNN algorithm verdicts: none (`ptxbackend warm --libs cudnn` self-tests every convolution "
                     "algorithm on this GPU; until then Chainer's choice is not steered)")
    if not cudnn_steering.enabled():
        lines.append("steering is OFF (PTXBACKEND_CUDNN_STEERING=%s)" % os.environ.get("PTXBACKEND_CUDNN_STEERING"))
    return {"lines": lines, "entries": len(entries)}


def _redacted(name, value):
    """A setting's value as printed: the fleet store URL without its password (parsed, not cut at '@')."""
    if name != "remote" or not value:
        return value
    from ..cache.remote import redact_url
    return redact_url(value)


def _driver_reason():
    try:
        count = driver.device_count()
    except PtxBackendError as exc:
        return " ".join(str(exc).split())
    return "the driver loads but sees no GPU" if not count else "unknown"


# Read from the environment only (docs/configuration.md, the rows with no config-file key).
ENV_ONLY = ("PTXBACKEND_CONFIG", "PTXBACKEND_DISABLE", "PTXBACKEND_RECORD", "PTXBACKEND_JIT_CACHE_MAXSIZE",
            "PTXBACKEND_LIBCUDA", "PTXBACKEND_CUDNN_STEERING")


def _environment_report(problems):
    """The environment-only knobs: each value, or ``None`` when unset."""
    found = {name: os.environ.get(name) or None for name in ENV_ONLY}
    disable = (found["PTXBACKEND_DISABLE"] or "").strip().lower()
    if disable not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        problems.append("PTXBACKEND_DISABLE=%r is neither 1 nor 0: the start-up hook stays on. Write 1 to "
                        "turn it off, or unset it." % found["PTXBACKEND_DISABLE"])
    if found["PTXBACKEND_JIT_CACHE_MAXSIZE"]:
        from ..config import parse_size
        try:
            parse_size(found["PTXBACKEND_JIT_CACHE_MAXSIZE"])
        except ValueError as exc:
            problems.append("PTXBACKEND_JIT_CACHE_MAXSIZE: %s; the hook uses 4G" % exc)
    return found


def _remote_report(settings, problems, warnings):
    """The fleet store: where, its mode, whether it answers, and this process's counters."""
    if not settings.remote:
        return None
    from ..compiling.engine import open_cache, remote_problem
    try:
        cache = open_cache(settings)
    except PtxBackendError as exc:  # the local cache is reported (and failed) elsewhere
        return {"problem": str(exc)}
    if cache.remote is None:
        problem = remote_problem(settings)
        problems.append("the fleet store %s is not used: %s" % (_redacted("remote", settings.remote), problem))
        return {"problem": problem}
    remote = cache.remote
    reachable = remote.ping() if hasattr(remote, "ping") else None
    stats = remote.stats()
    if not reachable:
        state = str(stats.get("state"))
        warnings.append("the %s does not answer (%s): programs go on with their local cache, "
                        "paying at most one timeout (%.2f s) each" % (
                            remote.description, state[len("failed: "):] if state.startswith("failed: ") else state,
                            settings.remote_timeout))
    return {"description": remote.description, "mode": settings.remote_mode, "reachable": bool(reachable),
            "stats": stats}


def _shown(value):
    return "(unset)" if value is None else str(value)


def verdict(report):
    """One line that answers "is it all right?": OK, or how many problems and warnings, and the first."""
    problems, warnings = report.get("problems") or [], report.get("warnings") or []
    if not problems and not warnings:
        return "verdict: OK"
    counts = ", ".join(part for part in (
        "%d problem%s" % (len(problems), "" if len(problems) == 1 else "s") if problems else "",
        "%d warning%s" % (len(warnings), "" if len(warnings) == 1 else "s") if warnings else "") if part)
    return "verdict: %s; first: %s" % (counts, (problems or warnings)[0])


def render(report):
    """The report as text for a terminal: the verdict first, then the details, then each finding again."""
    lines = [verdict(report),
             "ptxbackend %s on Python %s (%s)" % (report["ptxbackend"], report["python"], report["executable"])]
    if "settings" in report:
        lines.append("settings:")
        width = max(len(name) for name in report["settings"])
        shown = dict((name, _shown(info["value"])) for name, info in report["settings"].items())
        value_width = max(len(v) for v in shown.values())
        for name, info in sorted(report["settings"].items()):
            lines.append("  %-*s  %-*s  (%s)" % (width, name, value_width, shown[name], info["from"]))
    if report.get("environment"):
        lines.append("environment only:")
        width = max(len(name) for name in report["environment"])
        for name, value in sorted(report["environment"].items()):
            lines.append("  %-*s  %s" % (width, name, _shown(value)))
    if "cache" in report:
        cache = report["cache"]
        lines.append("cache: %s  (%d %s, %.1f MiB of %s)" % (
            cache["dir"], cache["entries"], "entry" if cache["entries"] == 1 else "entries",
            cache["bytes"] / 1048576.0,
            "%.0f MiB" % (cache["max_bytes"] / 1048576.0) if cache["max_bytes"] else "no limit"))
        if cache.get("old_layouts"):
            lines.append("  old layouts: %s (an earlier ptxbackend's; 'ptxbackend cache prune' removes them)"
                         % ", ".join(cache["old_layouts"]))
        if cache.get("unknown"):
            lines.append("  not made by ptxbackend (left alone, never removed): %s" % ", ".join(cache["unknown"]))
    remote = report.get("remote")
    if remote:
        if "description" in remote:
            lines.append("%s: %s" % (remote["description"], "reachable" if remote["reachable"] else
                                     "NOT reachable"))
            stats = remote.get("stats") or {}
            lines.append("  this process: " + "; ".join(
                "%s %s" % (level, ", ".join("%s %d" % (k, v) for k, v in sorted(stats[level].items())))
                for level in ("entry", "jit", "other") if isinstance(stats.get(level), dict)))
        else:
            lines.append("fleet store: not used: %s" % remote["problem"])
    for kind, info in sorted(report.get("compilers", {}).items()):
        if "error" in info:
            # The whole message: its later lines are where it looked (the NVRTC search list).
            lines.append("%s: not available: %s" % (kind, "\n    ".join(info["error"].splitlines())))
        else:
            lines.append("%s: %s at %s, targets %s%s" % (kind, info["version"], info["path"], info["range"],
                                                         "" if info["cubin"] else " (PTX only)"))
    drv = report.get("driver", {})
    if drv.get("available"):
        lines.append("driver: %s (CUDA %s), %s" % (drv["build"], drv["version"], drv["library"]))
    elif "driver" in report:
        lines.append("driver: not available: %s" % drv.get("reason", "unknown"))
    for device in report.get("devices", []):
        lines.append("device %s: %s, compute capability %s" % (device["ordinal"], device["name"],
                                                               format_cc(device["cc"])))
        for kind, choice in sorted(device["auto"].items()):
            if "error" in choice:
                lines.append("  %s -> no target: %s" % (kind, choice["error"]))
            else:
                uses = ""
                if choice["kind"] == "fatbin":
                    uses = "; this GPU uses its %s part%s" % (choice["uses"], " (JIT)" if str(
                        choice["uses"]).startswith("compute") else "")
                lines.append("  %s -> %s (%s): %s%s" % (kind, choice["target"], choice["kind"], choice["why"], uses))
    for name, info in sorted((report.get("libraries") or {}).items()):
        lines.append("%s: %s" % (name, info.get("path") or "not found: " + info["missing"]))
        for line in (info.get("steering") or {}).get("lines", ()):
            lines.append("  " + line)
    hook = report.get("hook")
    if hook:
        where = ", ".join(hook["pth_files"]) or "not installed"
        state = "disabled (PTXBACKEND_DISABLE)" if hook["disabled"] else (
            "active" if hook["active"] else "not active in this interpreter")
        lines.append("start-up hook: %s; %s" % (where, state))
        cupy = hook.get("cupy", {})
        if hook.get("cupy_import_error"):
            lines.append("cupy: not importable (%s)" % hook["cupy_import_error"])
        elif cupy.get("error"):
            lines.append("cupy: %s" % cupy["error"])
        elif cupy.get("cupy_version"):
            lines.append("cupy: %s (%s API), compiler %s; replaced: %s" % (
                cupy["cupy_version"], cupy.get("generation"), cupy.get("compiler"),
                ", ".join(cupy.get("replaced") or []) or "nothing"))
        for place, how in sorted((hook.get("dependency_checks") or {}).items()):
            lines.append("headers under %s: %s" % (place, how))
    jit = report.get("driver_jit_cache")
    if jit:
        by_hook = jit.get("set_by_hook") or ()
        shown = ", ".join("%s=%s%s" % (name, value, " (set by the start-up hook)" if name in by_hook else "")
                          for name, value in sorted(jit["variables"].items()) if value) or "driver defaults"
        lines.append("driver JIT cache: %s (%s, %s)" % (jit["path"], shown,
                                                        "writable" if jit["writable"] else "NOT writable"))
        imported = jit.get("imported")
        if imported:
            lines.append("  imported set (driver %s): %s, %d of %d files, needs CUDA_CACHE_MAXSIZE >= %d; warmed for %s" % (
                (imported.get("driver") or {}).get("build"), "in use" if imported["in_use"] else "NOT in use",
                imported["files_present"], imported["files"], imported["needs_maxsize"],
                ", ".join("%s (%d bytes, sha256 %s; at the build box's path here: %s)" % (
                    l["name"], l["size"], (l.get("sha256") or "?")[:12],
                    {"same size": "the same size", "different": "ANOTHER file", "elsewhere": "none"}[l["state"]])
                    for l in imported["libraries"]) or "no libraries"))
    for problem in report.get("problems", []):
        lines.append("PROBLEM: " + problem)
    for warning in report.get("warnings", []):
        lines.append("WARNING: " + warning)
    if not report.get("warnings") and not report.get("problems"):
        lines.append("no problems found")
    return "\n".join(lines)
