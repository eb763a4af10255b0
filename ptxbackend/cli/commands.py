"""The ``ptxbackend`` command line (also ``python -m ptxbackend``)."""

import argparse
import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
import time

from .._version import __version__
from ..errors import ConfigError, PtxBackendError


def _count(number, one, many):
    return "%d %s" % (number, one if number == 1 else many)


def _cmd_doctor(args):
    from . import doctor
    report = doctor.collect()
    if args.json:
        report["verdict"] = doctor.verdict(report)
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print(doctor.render(report))
    return 1 if report.get("problems") else 0


def _cmd_compile(args):
    from ..files import user
    from ..compiling.engine import compile as compile_kernel
    from ..compiling.engine import open_store
    from ..config import load_settings
    source = user.read_input(args.file, "source file", user.SOURCE_LIMIT, stdin_ok=True)
    output = None
    if args.output is not None:
        # Checked before the compile: a bad -o must not cost a compile first.
        output = user.check_output(args.output, "output file", inputs=[args.file],
                                        cache_root=open_store(load_settings()).root)
    from_stdin = args.file == "-"
    options = args.compiler_options
    started = time.time()
    artifact = compile_kernel(source, options, target=args.target, compiler=args.compiler,
                              device_cc=args.device_cc, name="stdin.cu" if from_stdin else args.file,
                              source_dir=os.getcwd() if from_stdin else
                              os.path.dirname(os.path.abspath(args.file)))
    elapsed = time.time() - started
    if output:
        with _about(args.output):
            user.write_output(output, artifact.image, "output file")
    if args.json:
        _print_json({"target": str(artifact.target), "reason": artifact.reason, "kind": artifact.kind,
                     "bytes": len(artifact.image), "producer": artifact.producer, "cache_path": artifact.path,
                     "cache_hit": bool(artifact.cache_hit), "seconds": elapsed, "key": artifact.key,
                     "output": args.output})
        return 0
    print("target:   %s (%s)" % (artifact.target, artifact.reason))
    print("kind:     %s, %d bytes, by %s" % (artifact.kind, len(artifact.image), artifact.producer))
    print("cache:    %s" % artifact.path)
    print("result:   %s in %.3f s" % ("hit" if artifact.cache_hit else "miss (compiled)", elapsed))
    if output:
        print("written:  %s" % args.output)
    return 0


#: Each ``cache`` flag and the actions it means something to: anywhere else it is refused, not ignored.
_CACHE_FLAGS = (("no_jit", "--no-jit", ("export",)), ("force", "--force", ("export",)),
                ("from_fleet", "--from-fleet", ("import",)), ("repair", "--repair", ("verify",)),
                ("max_size", "--max-size", ("prune",)), ("zero", "--zero", ("stats",)),
                ("device_cc", "--device-cc", ("import",)),
                ("json", "--json", ("info", "list", "stats", "verify", "prune", "push", "export", "import")))


def _flags_refused(command, given, table):
    """One error line for the first flag of ``table`` given (``getattr(given, dest)``) to a ``command``
    it means nothing to; ``None`` when all fit."""
    for dest, flag, actions in table:
        if getattr(given, dest, None) not in (None, False) and command not in actions:
            return "%s does not take %s (it goes with %s)" % (command, flag, " or ".join(actions))
    return None


def _cmd_cache(args):
    from ..config import load_settings
    from ..compiling.engine import open_store
    from ..config import parse_size
    from ..cache.entries import EntryCache
    from ..files import user
    if args.action is None:
        print("ptxbackend: error: cache needs an ACTION: %s (ptxbackend cache --help says what each does)"
              % ", ".join(name for name, _what in _CACHE_ACTIONS), file=sys.stderr)
        return 2
    if args.file is not None and args.action not in ("export", "import"):
        print("ptxbackend: error: cache %s takes no FILE (got %r)" % (args.action, args.file), file=sys.stderr)
        return 2
    refused = _flags_refused(args.action, args, _CACHE_FLAGS)
    if refused:
        print("ptxbackend: error: cache %s" % refused, file=sys.stderr)
        return 2
    limit = None
    if args.max_size:
        try:
            limit = parse_size(args.max_size)
        except ValueError as exc:
            raise ConfigError("--max-size %s" % exc)
    if args.action in ("info", "list", "verify", "stats", "prune", "clear") and \
            not _cache_exists(load_settings(cache_dir=args.cache_dir)):
        # Looking, or tidying nothing, must not create: the directory is made by the first compile.
        where = os.path.abspath(os.path.expanduser(load_settings(cache_dir=args.cache_dir).cache_dir))
        if args.json and args.action != "stats":
            _print_json(_nothing_there(args.action, where, args))
        elif args.action == "info":
            print("cache dir: %s (%s)\nentries:   0" % (where, "no ptxbackend cache in it yet: nothing compiled"
                                                          if os.path.isdir(where) else "not created yet: nothing compiled"))
            _print_remote(load_settings(cache_dir=args.cache_dir))  # the fleet store is there all the same
        elif args.action in ("verify", "prune", "clear"):
            print("no cache at %s: nothing to %s" % (where, args.action))
        elif args.action == "stats":
            _print_statistics(where, None, args.json)
        return 0
    store = open_store(load_settings(cache_dir=args.cache_dir))
    if args.action == "info":
        entries = list(store.entries())
        total = sum(size for _p, size, _m in entries)
        if args.json:
            old, unknown = store.root_items()
            _print_json({"cache_dir": store.root, "exists": True, "entries": len(entries), "bytes": total,
                         "max_size": store.max_size or None, "read_only": bool(getattr(store, "read_only", False)),
                         "producers": [p for p, _r in EntryCache(store).producer_records()],
                         "old_layouts": list(old), "unknown": list(unknown or [])})
            return 0
        print("cache dir: %s\nentries:   %d\nsize:      %.2f MiB (%s)" % (
            store.root, len(entries), total / 1048576.0,
            "limit %.0f MiB" % (store.max_size / 1048576.0) if store.max_size else "no limit"))
        for producer, _record in EntryCache(store).producer_records():
            print("producer:  %s" % producer)
        _print_remote(load_settings(cache_dir=args.cache_dir))
        old, unknown = store.root_items()
        if old:
            print("old:       %s, from an earlier ptxbackend; unused here ('ptxbackend cache prune' "
                  "removes them)" % ", ".join(old))
        _print_unknown(store, unknown)
    elif args.action == "stats":
        from ..cache import statistics
        statistics.save_all()  # what this process counted (none, for this command) is in
        if args.zero:
            statistics.zero(store)
        _print_statistics(store.root, statistics.read(store), args.json)
    elif args.action == "list" and args.json:
        _print_json({"cache_dir": store.root, "exists": True, "entries": [
            {"path": os.path.relpath(path, store.root), "bytes": size, "mtime": mtime}
            for path, size, mtime in sorted(store.entries())]})
    elif args.action == "list":
        for path, size, mtime in sorted(store.entries()):
            print("%10d  %s  %s" % (size, time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime)),
                                    os.path.relpath(path, store.root)))
    elif args.action == "verify":
        good, bad = store.verify(repair=args.repair, progress=_progress("cache verify", args, "entries checked"))
        # --repair removes what is bad, except a file ptxbackend does not write (store.verify leaves it)
        removed = [bool(args.repair) and not why.endswith("left alone") for _path, why in bad]
        if args.json:
            _print_json({"cache_dir": store.root, "exists": True, "verified": good, "repaired": bool(args.repair),
                         "bad": [{"path": path, "why": why, "removed": gone}
                                 for (path, why), gone in zip(bad, removed)]})
            return 1 if bad and not args.repair else 0
        for (path, why), gone in zip(bad, removed):
            print("BAD  %s: %s%s" % (path, why, " (removed)" if gone else ""))
        print("%s verified, %d bad" % (_count(good, "entry", "entries"), len(bad)))
        return 1 if bad and not args.repair else 0
    elif args.action == "prune":
        removed, freed = store.prune(limit, progress=_progress("cache prune", args))
        old_layouts = [os.path.join(store.root, name) for name in store.remove_old_layouts()]
        if args.json:
            _print_json({"cache_dir": store.root, "exists": True, "removed": removed, "bytes_freed": freed,
                         "max_size": (store.max_size if limit is None else limit) or None,
                         "old_layouts_removed": old_layouts, "unknown": list(store.unknown_items())})
            return 0
        print("removed %s, %.2f MiB" % (_count(removed, "entry", "entries"), freed / 1048576.0))
        for path in old_layouts:
            print("removed the old layout %s" % path)
        _print_unknown(store)
    elif args.action == "push":
        from ..compiling.engine import open_cache
        settings = load_settings(cache_dir=args.cache_dir)
        _fleet_store(settings, "cache push")
        cache = open_cache(settings)
        if not cache.remote.writable:
            raise PtxBackendError("cache push: the %s is read-only here "
                                  "(PTXBACKEND_REMOTE_MODE=ro)" % cache.remote.description)
        cache.remote.report_failures = False  # a failure is this command's error, said once below
        files, size = cache.push(progress=_progress("cache push", args))
        state = cache.remote.stats().get("state", "ok")
        if state != "ok":
            why = state[len("failed: "):] if state.startswith("failed: ") else state
            raise PtxBackendError("cache push to the %s failed: %s" % (cache.remote.description, why))
        if args.json:
            _print_json({"cache_dir": store.root, "remote": cache.remote.description, "pushed": files,
                         "bytes": size, "withheld": cache.push_withheld})
            return 0
        print("pushed %d files (%.2f MiB) from %s to %s" % (files, size / 1048576.0, store.root,
                                                           cache.remote.description))
        if cache.push_withheld:
            print("kept %s that arrived in %s here (never sent on)" % (
                _count(cache.push_withheld, "entry", "entries"),
                "an unsigned bundle" if cache.push_withheld == 1 else "unsigned bundles"))
    elif args.action == "clear":
        store.clear()
        store.remove_old_layouts()
        print("cleared %s" % store.root)
        _print_unknown(store)
    elif args.action in ("export", "import"):
        from ..deploy import jit_bundle
        from ..cache import bundle
        if args.from_fleet:
            if args.action != "import" or args.file:
                print("ptxbackend: error: --from-fleet goes with `cache import` and no FILE", file=sys.stderr)
                return 2
            return _import_from_fleet(load_settings(cache_dir=args.cache_dir), args.json, store.root)
        if not args.file:
            print("ptxbackend: error: cache %s needs a FILE" % args.action, file=sys.stderr)
            return 2
        if args.action == "export":
            user.check_output(args.file, "bundle", cache_root=store.root)
            with _about(args.file):
                count = bundle.export_bundle(store, args.file, include_jit=not args.no_jit, force=args.force,
                                             key=jit_bundle.fleet_key(load_settings(cache_dir=args.cache_dir)),
                                             progress=_progress("cache export", args))
            if args.json:
                _print_json({"exported": count, "cache_dir": store.root, "file": args.file,
                             "bytes": os.path.getsize(args.file)})
            else:
                print("exported %s from %s to %s (%d bytes)" % (_count(count, "entry", "entries"), store.root,
                                                               args.file, os.path.getsize(args.file)))
            return 0
        _check_bundle_file(args.file)
        if jit_bundle.is_bundle(args.file):
            settings = load_settings(cache_dir=args.cache_dir)
            manifest = jit_bundle.install(args.file, settings.cache_dir, jit_bundle.this_machine(),
                                         jit_bundle.fleet_key(settings))
            if args.json:
                _print_json({"imported": args.file, "cache_dir": store.root, "added": None, "present": None,
                             "gpus": None, "never_used": [],
                             "driver_jit": _driver_jit_summary(manifest, settings)})
                return 0
            print("imported the driver JIT cache of %s (driver %s; %s; %d files, %.1f MiB) into %s; new "
                  "processes use it unless CUDA_CACHE_PATH is set" % (
                      ", ".join(lib["name"] for lib in manifest["libraries"]) or "-", manifest["driver"]["build"],
                      ", ".join(g["name"] for g in manifest["gpus"]), len(manifest["files"]),
                      sum(f["size"] for f in manifest["files"]) / 1048576.0,
                      jit_bundle.managed_dir(settings.cache_dir)))
        else:
            gpus = _gpus_to_serve(args.device_cc)  # before importing: a wrong --device-cc imports nothing
            names = []
            added, present = bundle.import_bundle(store, args.file,
                                                  jit_bundle.fleet_key(load_settings(cache_dir=args.cache_dir)),
                                                  progress=_progress("cache import", args), seen=names)
            names = [name for name in names if "/jit/" not in name]  # a JIT result names its own GPU
            useless = _never_used(load_settings(cache_dir=args.cache_dir), names, gpus) if gpus else []
            if args.json:
                _print_json({"imported": args.file, "cache_dir": store.root, "added": added, "present": present,
                             "gpus": [label for _, label in gpus],
                             "never_used": [{"entry": name, "why": why} for name, why, _ in useless]})
            else:
                print("imported %s into %s: %s added, %d already present (all checksums verified)"
                      % (args.file, store.root, _count(added, "entry", "entries"), present))
            if useless:
                whys = {}
                for _name, why, _remedy in useless:
                    whys[why] = whys.get(why, 0) + 1
                if len(useless) == len(names):
                    head = "error: no entry of the bundle will be used here"
                else:
                    head = "warning: %d of the bundle's %d entries will never be used here" % (len(useless),
                                                                                               len(names))
                print("ptxbackend: %s: %s. %s." % (
                    head, "; ".join("%d %s" % (count, why) for why, count in sorted(whys.items())),
                    ". ".join(sorted(set(remedy for _, _, remedy in useless)))), file=sys.stderr)
                if len(useless) == len(names):
                    return 1
    return 0


def _never_used(settings, names, gpus):
    """``[(entry, why, remedy)]`` for the bundle's entries that ``compile()`` here would never look up:
    another producer than this machine's compilers, or another target than they ask for on these GPUs."""
    from ..compiling import engine, targets
    try:
        compilers, wanted = engine.targets_wanted(settings, [cc for cc, _ in gpus])
    except PtxBackendError:
        return []  # a named compiler that cannot be used: every compile says so; nothing to check here
    where = " or ".join(label for _, label in gpus)
    lowest = min(cc for cc, _ in gpus)
    retarget = ("Build them on the build box for this GPU (--device-cc %s) with this machine's target setting, "
                "or set a PTX target such as compute_%d on both" % (targets.format_cc(lowest), lowest))
    found = []
    for name in names:
        producer, target = name.split("/")[:2]
        if compilers and producer not in compilers:
            found.append((name, "made by %s, while this machine compiles with %s, %s only what it makes" % (
                producer, " and ".join(compilers), "which uses" if len(compilers) == 1 else "each of which uses"),
                          "Build the bundle with %s, or install the build box's compiler here"
                          % " or ".join(compilers)))
        elif producer not in wanted:
            found.append((name, "made by %s, which builds nothing for %s with target %s" % (
                producer, where, settings.target), retarget))
        elif target not in wanted[producer]:
            found.append((name, "built for %s, while %s asks %s for %s (target %s)" % (
                target, where, producer, " or ".join(sorted(wanted[producer])), settings.target), retarget))
    return found


def _gpus_to_serve(device_cc):
    """``[(cc, label)]``: the GPU named by ``--device-cc``, else this machine's GPUs, else none (a
    machine without a GPU or driver, such as one preparing a line PC's image, checks nothing)."""
    from ..compiling import targets
    if device_cc:
        cc = targets.parse_cc(device_cc)
        return [(cc, "a GPU of compute capability %s (--device-cc)" % targets.format_cc(cc))]
    from ..gpu import driver
    try:
        if not driver.available():
            return []
        ccs = [(driver.compute_capability(i), driver.device_name(i)) for i in range(driver.device_count())]
        return [(cc, "this machine's %s (sm_%d)" % (name, cc)) for cc, name in ccs]
    except Exception:  # noqa: BLE001  (a driver that cannot answer: nothing to check against, not a failure)
        return []


def _progress(label, args, unit="done"):
    """A progress display for a long action, on a terminal only (stderr a tty, no --json): elsewhere the
    action's result line is all it prints.  A factory of meters from the total (``None``: unknown)."""
    if getattr(args, "json", False) or not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    from ..deploy.replay import Progress
    return lambda total: Progress(total, label, unit=unit)


def _nothing_there(action, where, args):
    """An action's JSON document where there is no cache yet: its keys, empty."""
    document = {"cache_dir": where, "exists": False}
    if action == "info":
        document.update(entries=0, bytes=0, max_size=None, read_only=False, producers=[], old_layouts=[],
                        unknown=[])
    elif action == "list":
        document.update(entries=[])
    elif action == "verify":
        document.update(verified=0, repaired=bool(args.repair), bad=[])
    elif action == "prune":
        document.update(removed=0, bytes_freed=0, max_size=None, old_layouts_removed=[], unknown=[])
    return document


def _print_json(document):
    print(json.dumps(document, indent=2, sort_keys=True, default=str))


def _print_statistics(root, found, as_json):
    """``cache stats``: the counts kept across runs (``found``: statistics.read; ``None``: no cache)."""
    from ..cache import statistics
    if found is None:
        found = dict((name, 0) for name in statistics.FIELDS)
        found.update(compile_seconds=0.0, since=None, saved=None)
    lookups = found["local_hits"] + found["fleet_hits"] + found["misses"]
    # Time saved: each hit at the mean compile time this cache has seen (an estimate: kernels differ).
    mean = found["compile_seconds"] / found["compiles"] if found["compiles"] else None
    saved = (found["local_hits"] + found["fleet_hits"]) * mean if mean is not None else None
    if as_json:
        out = dict(found, cache_dir=root, hit_rate=(lookups - found["misses"]) / float(lookups) if lookups else None,
                   time_saved_seconds=saved)
        print(json.dumps(out, indent=2, sort_keys=True))
        return

    def when(seconds):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "-"
    print("statistics of %s, since %s (last saved %s)" % (root, when(found["since"]), when(found["saved"])))
    print("  local hits      %d" % found["local_hits"])
    print("  fleet hits      %d" % found["fleet_hits"])
    print("  misses          %d" % found["misses"])
    print("  hit rate        %s" % ("%.1f%%" % (100.0 * (lookups - found["misses"]) / lookups) if lookups else "-"))
    print("  compiles        %d (%.2f s)" % (found["compiles"], found["compile_seconds"]))
    print("  compile errors  %d" % found["compile_errors"])
    print("  time saved      %s" % ("about %.1f s (each hit at the mean compile time here, %.3f s)" % (saved, mean)
                                    if saved is not None else "- (no compile seen yet to estimate it from)"))


def _print_unknown(store, unknown=None):
    """The cache root's items ptxbackend did not make: named, never removed."""
    unknown = store.unknown_items() if unknown is None else unknown
    if unknown:
        print("left alone: %s in %s (not made by ptxbackend: prune and clear never remove them; move them "
              "out of the cache directory)" % (", ".join(unknown), store.root))


def _check_bundle_file(path):
    """A FIFO or device is refused, never waited on; so is a file that is no gzip stream, which
    tarfile's format guessing would read to its end (minutes for gigabytes of zeros)."""
    from ..files import user
    with user.open_input(path, "bundle") as handle:
        magic = handle.read(2)
    if magic != b"\x1f\x8b":
        raise PtxBackendError("%s is not a ptxbackend bundle: `ptxbackend cache export` and `warm "
                              "--driver-jit-bundle` write gzip-compressed tar files, and it is not one" % path)


def _cache_exists(settings):
    # A ptxbackend cache (its layout, an old one) or something that is no directory (the store names
    # it); a plain directory of other things is no cache, and looking at it must not make one.
    root = os.path.expanduser(settings.cache_dir)
    if not os.path.lexists(root):
        return False
    if not os.path.isdir(root) or os.path.islink(root):
        return True
    from ..cache.layout import LAYOUT, OLD_SCHEMAS
    return any(os.path.lexists(os.path.join(root, name)) for name in [LAYOUT] + ["v%d" % n for n in OLD_SCHEMAS])


def _fleet_store(settings, what):
    from ..compiling.engine import open_cache, remote_problem
    from ..state import state
    state.warned.add("remote")  # a command that needs the store says what is wrong as its error, once
    remote = open_cache(settings).remote
    if remote is None:
        raise PtxBackendError("%s needs a fleet store: %s" % (
            what, remote_problem(settings) or "set PTXBACKEND_REMOTE (docs/fleet.md)"))
    return remote


def _driver_jit_summary(manifest, settings):
    """``--json``'s ``driver_jit`` of an imported driver JIT set: what it holds and where it went."""
    from ..deploy import jit_bundle
    return {"libraries": [lib["name"] for lib in manifest["libraries"]], "driver": manifest["driver"]["build"],
            "gpus": [g["name"] for g in manifest["gpus"]], "files": len(manifest["files"]),
            "bytes": sum(f["size"] for f in manifest["files"]), "into": jit_bundle.managed_dir(settings.cache_dir)}


def _import_from_fleet(settings, as_json=False, root=None):
    """`cache import --from-fleet`: this machine's driver-JIT set from the fleet store, verified as a file."""
    from ..deploy import jit_bundle
    remote = _fleet_store(settings, "cache import --from-fleet")
    machine = jit_bundle.this_machine()
    work = tempfile.mkdtemp(prefix="ptxbackend-fleet-jit-")
    try:
        path = os.path.join(work, "driver-jit.tgz")
        name = jit_bundle.download(remote, machine, path)
        manifest = jit_bundle.install(path, settings.cache_dir, machine, jit_bundle.fleet_key(settings))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        _print_json({"imported": name, "cache_dir": root, "added": None, "present": None, "gpus": None,
                     "never_used": [],
                     "driver_jit": _driver_jit_summary(manifest, settings)})
        return 0
    print("imported the driver JIT cache of %s from the fleet store (%s) into %s" % (
        ", ".join(lib["name"] for lib in manifest["libraries"]) or "-", name,
        jit_bundle.managed_dir(settings.cache_dir)))
    return 0


def _print_remote(settings):
    """The fleet store's line of `cache info`: where, mode, whether it answers."""
    from ..compiling.engine import open_cache, remote_problem
    if not settings.remote:
        return
    cache = open_cache(settings)
    if cache.remote is None:
        print("remote:    not used: %s" % remote_problem(settings))
        return
    reachable = cache.remote.ping() if hasattr(cache.remote, "ping") else None
    print("remote:    %s (%s): %s" % (cache.remote.description, settings.remote_mode,
                                       "reachable" if reachable else cache.remote.stats().get("state")))
    from ..cache.counters import cache_counters, describe
    print("counters:  %s (this process)" % describe(cache_counters()))


def _library_names(text):
    """The libraries of ``--libs``, in order, each once (a name given twice is warmed once)."""
    names, seen = [], set()
    for name in (n.strip() for n in (text or "").split(",")):
        if name and name not in seen:
            seen.add(name)
            names.append(name)
    return names


def _cmd_warm(args):
    if not args.manifest and not args.libs and not args.from_fleet:
        print("ptxbackend: error: warm needs a MANIFEST (recorded with PTXBACKEND_RECORD=FILE), --libs "
              "and/or --from-fleet", file=sys.stderr)
        return 2
    from ..config import load_settings
    from ..compiling.engine import open_store
    refused = ("--force goes with --driver-jit-bundle" if args.force and not args.driver_jit_bundle else
               "--jobs goes with --libs" if args.jobs is not None and not args.libs else
               "--device-cc goes with a MANIFEST or --from-fleet (--libs warms the GPU of this machine)"
               if args.device_cc is not None and not (args.manifest or args.from_fleet) else None)
    if refused:
        print("ptxbackend: error: warm: %s" % refused, file=sys.stderr)
        return 2
    names = _library_names(args.libs)
    if args.libs is not None and not names:
        print("ptxbackend: error: --libs %r names no library: write e.g. --libs cudnn,cublas" % args.libs,
              file=sys.stderr)
        return 2
    store = open_store(load_settings())  # the cache it warms must be the real one: fail here, before any work
    if args.driver_jit_bundle is not None:
        from ..files import user
        user.check_output(args.driver_jit_bundle, "--driver-jit-bundle", cache_root=store.root)
    status = 0
    # --json: what the text reports, as one document at the end (the text lines are not printed).
    document = {"cache_dir": store.root, "from_fleet": None, "kernels": None, "libraries": None, "bundle": None}
    if args.from_fleet:
        from ..deploy import fleet_pull
        settings = load_settings(device_cc=args.device_cc)
        _fleet_store(settings, "warm --from-fleet")
        written, refused, groups = fleet_pull.pull(settings)
        document["from_fleet"] = {"written": written, "refused": refused, "groups": list(groups)}
        if not args.json:
            print("wrote %d files of the fleet's working set (%s) into %s%s" % (
                written, ", ".join(groups), store.root, "; %d refused" % refused if refused else ""))
    if args.manifest:
        from ..deploy.replay import replay
        kernels = []
        compiled, hits, failures = replay(args.manifest, device_cc=args.device_cc,
                                          out=(lambda *_: None) if args.json else print,
                                          progress=_progress("warm kernels", args), report=kernels)
        from ..gpu import driver
        document["kernels"] = {"manifest": args.manifest, "total": len(kernels), "compiled": compiled,
                               "cached": hits, "failed": len(failures),
                               "jit_stored": args.device_cc is None and driver.available(), "results": kernels}
        status = 1 if failures else 0
    if args.driver_jit_bundle and not args.libs:
        print("ptxbackend: error: --driver-jit-bundle packs what --libs warms: name the libraries", file=sys.stderr)
        return 2
    if args.libs:
        document["libraries"] = []
        status = _warm_libraries(args, names, status, document)
    if args.json:
        failed = [k for k in (document["kernels"] or {}).get("results", []) if k["result"] == "failed"] + \
            [lib for lib in document["libraries"] or [] if not lib["ok"]]
        document.update(ok=status == 0, failed=len(failed))
        _print_json(document)
    return status


def _warm_libraries(args, names, status, document):
    """``warm --libs``: each library JIT-compiled into the driver's cache, then packed and uploaded when
    all went well (``status``: 0 so far); each one's result appended to ``document["libraries"]``.
    Returns the exit status (1: something failed, a library's JIT did not stick)."""
    from ..config import load_settings
    from ..errors import PtxBackendError
    from ..deploy.library_warmup import default_jobs, warm_library
    from ..deploy.replay import save_library_results
    say = None if args.json else _say  # --json: stderr holds errors only
    libraries = document["libraries"]
    jit_dir = key = None
    if args.driver_jit_bundle:
        from ..deploy import jit_bundle
        key = jit_bundle.fleet_key(load_settings())
        # A fresh driver cache of its own, so that the bundle holds these libraries' JIT output only.
        jit_dir = tempfile.mkdtemp(prefix="ptxbackend-driver-jit-")
    make_meter = _progress("warm libraries", args)
    progress = make_meter(len(names)) if make_meter else None
    results = []
    for name in names:
        try:
            result = warm_library(name, jit_dir=jit_dir, jobs=args.jobs or default_jobs(), say=say)
        except (OSError, RuntimeError, PtxBackendError) as exc:
            libraries.append({"name": name, "library": None, "ok": False, "error": str(exc)})
            if not args.json:
                print("  %s: FAILED: %s" % (name, exc))
            status = 1
            if progress:
                progress.step(name)
            continue
        results.append(result)
        if progress:
            progress.step(name)
        # What the JIT cost without a cache: the first process, plus the workers' share when they did it.
        jit_s = result["first"]["total_s"] + (result["parallel"] or {}).get("worker_seconds_sum", 0.0)
        second_s = result["second"]["total_s"]
        kept = not (second_s > 0.5 * max(jit_s, 1e-9) and jit_s > 1.0 and second_s > 1.0)  # under 1 s is no JIT
        libraries.append({
            "name": name, "library": result["library"], "kind": result["kind"], "ok": kept,
            "error": None if kept else "the second process was not fast: the driver JIT cache did not keep "
                                       "the result",
            "first_s": result["first"]["total_s"], "second_s": second_s,
            "jit_cache_growth_bytes": result["jit_cache_growth_bytes"], "jit_cache_dir": result["jit_cache_dir"],
            "cuda_cache_maxsize": result["cuda_cache_maxsize"],
            "output_sha256": result["second"].get("output_sha256"), "parallel": result["parallel"],
            "selftest": result.get("selftest")})
        if not kept:
            status = 1
        if args.json:
            continue
        if result["parallel"]:
            _print_parallel(result)
        print("  %s: first process %.2f s (%s), second process %.3f s; driver JIT cache grew %.1f MiB "
              "(CUDA_CACHE_MAXSIZE=%s)%s" % (
                  result["library"], result["first"]["total_s"],
                  "after the parallel JIT" if result["parallel"] else "JIT", result["second"]["total_s"],
                  result["jit_cache_growth_bytes"] / 1048576.0, result["cuda_cache_maxsize"],
                  "; output sha256 %s" % result["second"]["output_sha256"][:16]
                  if result["second"].get("output_sha256") else ""))
        if result.get("selftest"):
            _print_selftest(result["selftest"])
        if not kept:
            print("  WARNING: the second process was not fast: the driver JIT cache did not keep the "
                  "result. Check CUDA_CACHE_DISABLE, CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE "
                  "(ptxbackend doctor).")
    save_library_results(results)
    try:
        if jit_dir and results and not status:
            manifest = jit_bundle.pack(jit_dir, [r["library"] for r in results], args.driver_jit_bundle,
                                      jit_bundle.this_machine(), key, force=args.force)
            packed = document["bundle"] = {
                "file": args.driver_jit_bundle, "files": len(manifest["files"]),
                "bytes": sum(f["size"] for f in manifest["files"]), "signed": bool(key), "uploaded_as": None}
            if not args.json:
                print("packed the driver JIT cache (%d files, %.1f MiB%s) into %s" % (
                    packed["files"], packed["bytes"] / 1048576.0, ", signed with the fleet key" if key else "",
                    args.driver_jit_bundle))
            settings = load_settings()
            if settings.remote:
                remote = _fleet_store(settings, "uploading the driver JIT set")
                if remote.writable:
                    name = jit_bundle.upload(remote, args.driver_jit_bundle, jit_bundle.this_machine())
                    state = remote.stats().get("state", "ok")
                    packed["uploaded_as"] = name if state == "ok" else None
                    packed["upload_error"] = None if state == "ok" else state
                    if not args.json:
                        print("uploaded it to the fleet store as %s%s" % (name, "" if state == "ok" else
                                                                          " (FAILED: %s)" % state))
    finally:
        if jit_dir:
            shutil.rmtree(jit_dir, ignore_errors=True)
    return status


def _print_selftest(selftest):
    from ..deploy.cudnn_selftest import summary
    from ..gpu import cudnn_algos
    print("  cuDNN %d algorithm self-test on %s: %d shapes x float16/32/64, %.1f s; verdicts in %s" % (
        selftest["cudnn_version"], selftest["device"]["name"], len(selftest["cases"]), selftest["seconds"],
        selftest["verdict_file"]))
    for line in summary(selftest):
        print("    " + line)
    entry = {"device": selftest["device"], "verdicts": selftest["verdicts"], "cudnn_version": selftest["cudnn_version"],
             "tested_at": "now"}
    for line in cudnn_algos.describe(entry)[1:]:
        print("    steered: " + line.strip())


def _say(line):
    _end_progress_line()  # on a line of its own, not after the bar; the bar is drawn again at its next step
    sys.stderr.write("  %s\n" % line)  # unbuffered, beside the progress line: seen even if the run is cut
    sys.stderr.flush()


def _print_parallel(result):
    """What the parallel JIT did, and whether the library's own start then found it in the cache."""
    par, first = result["parallel"], result["first"]
    seconds = [w["seconds"] for w in par["workers"] if w.get("seconds") is not None]
    print("  parallel JIT (sm_%d): %d fatbin images, %d skipped (SASS for this GPU), %d skipped (no code it can "
          "use), %d left to the library's start (-rdc, linked at load), %d loaded, %d refused by the driver; "
          "%.1f MiB of PTX; %d workers %s s, sum %.1f s (the serial warm-up, estimated), wall %.1f s; driver JIT "
          "cache grew %.1f MiB" % (
              par["device_cc"], par["images"], par["skipped_sass"], par["skipped_no_code"],
              par.get("skipped_relocatable", 0), par["loaded"],
              par["refused"], par["ptx_bytes"] / 1048576.0, par["jobs"],
              "/".join("%.1f" % s for s in seconds) or "-", par["worker_seconds_sum"], par["wall_s"],
              par["jit_cache_growth_bytes"] / 1048576.0))
    for reason in par["failed_workers"] + par["errors"]:
        print("    %s" % reason)
    print("  the library's own start then took %.2f s and grew the JIT cache %.1f MiB" % (
        first["first_call_s"], result["first_growth_bytes"] / 1048576.0))
    if result["first_growth_bytes"] > max(1 << 20, par["jit_cache_growth_bytes"] // 20) \
            or par["failed_workers"]:
        print("  WARNING: the library's own start still JIT-compiled: the parallel loads did not fill (all) the "
              "cache entries it looks up (the keys did not match, or a worker failed). Its start did the rest "
              "serially; --jobs 1 is the serial warm-up alone.")


def _cmd_completion(args, parser):
    from . import completion
    print(getattr(completion, args.shell)(parser))
    return 0


def _cmd_demo(args):
    from . import demo
    return demo.run(device_cc=args.device_cc, compiler=args.compiler, target=args.target)


def _jobs(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("%r is not a number of processes (1 or more)" % text)
    return value


def _cache_dir_argument(text):
    # Refused as PTXBACKEND_CACHE_DIR refuses it: '' would silently mean the default, '   ' a folder of spaces.
    if not text.strip():
        raise argparse.ArgumentTypeError("empty or only spaces: name a directory, or leave --cache-dir out for "
                                         "the default")
    return text


#: The ``cache`` actions, each with one line of what it does.
_CACHE_ACTIONS = (
    ("info", "where the cache is, its entries, size, producers, old layouts and the fleet store"),
    ("list", "every entry: its size, last use and path"),
    ("stats", "hits, misses and compiles kept across runs"),
    ("verify", "check every entry and what it depends on (exit 1 while anything is bad)"),
    ("prune", "remove the least recently used entries down to 80% of the size limit, and old layouts"),
    ("clear", "remove every entry"),
    ("export", "write the entries into a bundle FILE, for machines without a compiler"),
    ("import", "add a bundle FILE's entries (or a driver JIT bundle) to this cache"),
    ("push", "upload the local entries to the fleet store (PTXBACKEND_REMOTE)"))

#: What each flag of _CACHE_FLAGS says in the help of the action(s) that take it.
_CACHE_FLAG_HELP = {
    "no_jit": ("store_true", "leave out the per-GPU JIT cubins (keep only compiler output)"),
    "force": ("store_true", "replace an existing FILE"),
    "from_fleet": ("store_true", "this machine's driver JIT set (driver build, GPU model) from the fleet store, "
                                 "instead of a FILE"),
    "repair": ("store_true", "remove the bad entries and the damaged sets and records they name"),
    "max_size": ("SIZE", "size limit, e.g. 500M; 0 is no limit (default PTXBACKEND_CACHE_MAX_SIZE)"),
    "device_cc": ("X.Y", "the line's GPU (e.g. 7.5) when it is not this machine's: entries it cannot run are "
                         "named (default: this machine's GPUs)"),
    "zero": ("store_true", "start the statistics again from now"),
    "json": ("store_true", "one JSON document on stdout (docs/usage.md lists the keys)"),
}


def _add_cache_actions(cache):
    """One sub-parser per ``cache`` action, with that action's own flags in its help.  The flags of the
    other actions are parsed too, unlisted, so that one given to the wrong action is refused in one line
    naming the action(s) it goes with (_flags_refused), not as an unknown flag."""
    actions = cache.add_subparsers(dest="action", metavar="ACTION", help="one of the actions below")
    lines = []
    for action, what in _CACHE_ACTIONS:
        p = actions.add_parser(action, description="ptxbackend cache %s: %s." % (action, what))
        takes_file = action in ("export", "import")
        p.add_argument("file", nargs="?", metavar="FILE",
                       help="the bundle (a gzip-compressed tar file)" if takes_file else argparse.SUPPRESS)
        p.add_argument("--cache-dir", type=_cache_dir_argument, metavar="DIR",
                       help="cache directory (PTXBACKEND_CACHE_DIR)")
        for dest, flag, owners in _CACHE_FLAGS:
            kind, text = _CACHE_FLAG_HELP[dest]
            extra = {} if kind == "store_true" else {"metavar": kind}  # a flag with a value: its metavar
            p.add_argument(flag, dest=dest, action="store_true" if kind == "store_true" else "store",
                           help=text if action in owners else argparse.SUPPRESS,
                           **extra)
        p.set_defaults(func=_cmd_cache)
        usage = " ".join(p.format_usage().split()[1:]).replace("[-h] ", "").replace("[-h]", "")
        lines.append("  %-7s %s\n          %s" % (action, what, usage[len(p.prog) + 1:] or "(no flags)"))
    cache.epilog = "each action, what it does and its flags:\n" + "\n".join(lines)
    cache.set_defaults(func=_cmd_cache, action=None)


def _cache_action_first(argv):
    """``cache --cache-dir D prune`` as ``cache prune --cache-dir D``: the flags are each action's own
    now, and what worked with the flags first (0.4.0 took them anywhere) still does."""
    if not argv or argv[0] != "cache":
        return argv
    takes_value = set(["--cache-dir"] + [flag for dest, flag, _owners in _CACHE_FLAGS
                                         if _CACHE_FLAG_HELP[dest][0] != "store_true"])
    before, i = [], 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-h", "--help"):
        before.append(argv[i])
        if argv[i] in takes_value and i + 1 < len(argv):
            before.append(argv[i + 1])
            i += 1
        i += 1
    if not before:
        return argv
    if i >= len(argv):
        return ["cache"]  # flags and no action: what is missing is the action (_cmd_cache says so)
    return ["cache", argv[i]] + before + argv[i + 1:]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="ptxbackend",
        description="Compile CUDA kernels for GPUs newer than your toolkit: PTX, a safe cache, driver JIT.")
    parser.add_argument("--version", action="version", version="ptxbackend " + __version__)
    sub = parser.add_subparsers(dest="command")

    doctor = sub.add_parser("doctor", help="report compilers, driver, devices, target choice, cache, problems")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_cmd_doctor)

    def add_build_options(p):
        p.add_argument("--target", help="auto, native, compute_XY, sm_XY, X.Y or a comma list (PTXBACKEND_TARGET)")
        p.add_argument("--compiler", choices=("nvcc", "nvrtc"), help="compiler to use (PTXBACKEND_COMPILER)")
        p.add_argument("--device-cc", help="build for a GPU of this compute capability, e.g. 7.5 "
                                           "(PTXBACKEND_DEVICE_CC)")

    comp = sub.add_parser("compile", help="compile a .cu file through the cache")
    comp.add_argument("file", help="CUDA source file")
    add_build_options(comp)
    comp.add_argument("-o", "--output", help="also write the image to this file")
    comp.add_argument("--json", action="store_true", help="one JSON document on stdout")
    comp.epilog = "Compiler options go after --, e.g.: ptxbackend compile k.cu --target compute_75 -- -I include"
    comp.set_defaults(func=_cmd_compile)

    cache = sub.add_parser("cache", help="inspect or maintain the cache",
                           description="Inspect or maintain the cache. `ptxbackend cache ACTION --help` shows "
                                       "one action's flags.", formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_cache_actions(cache)

    warm = sub.add_parser("warm", help="at deployment: compile and JIT recorded kernels, pre-JIT CUDA libraries",
                          description="At deployment: compile (and on a GPU, JIT) the kernels a MANIFEST "
                                      "recorded, fill the cache from the fleet store, and/or pre-JIT CUDA "
                                      "libraries (--libs), so that the program's start compiles nothing. Give "
                                      "a MANIFEST, --from-fleet, --libs, or several.")
    warm.add_argument("manifest", nargs="?", metavar="MANIFEST",
                      help="kernel manifest written with PTXBACKEND_RECORD=FILE ('-': standard input)")
    warm.add_argument("--json", action="store_true", help="one JSON document on stdout: each kernel's and "
                      "library's result, the counts and failures")
    kernels = warm.add_argument_group("with a MANIFEST or --from-fleet (the kernels)")
    kernels.add_argument("--from-fleet", action="store_true",
                         help="fill the local cache with the fleet store's working set for this machine's "
                              "compiler, target and GPU (one round trip)")
    kernels.add_argument("--device-cc", metavar="X.Y",
                         help="compile for another GPU (no JIT step), e.g. 7.5")
    libraries = warm.add_argument_group("with --libs (the CUDA libraries' driver JIT)")
    libraries.add_argument("--libs", help="comma list of libraries to pre-JIT: cudnn, cublas, curand or paths")
    libraries.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                           help="JIT the libraries' fatbin images in N processes (default: the CPU count); "
                                "1: the library's own start does the whole JIT, serially")
    libraries.add_argument("--driver-jit-bundle", metavar="FILE",
                           help="warm into a fresh driver JIT cache and pack it into FILE, for "
                                "`ptxbackend cache import FILE` on machines with the same driver and GPU")
    libraries.add_argument("--force", action="store_true", help="with --driver-jit-bundle: replace an existing "
                                                                "FILE")
    warm.set_defaults(func=_cmd_warm)

    completion = sub.add_parser("completion", help="print a shell completion script: "
                                "eval \"$(ptxbackend completion bash)\"")
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(func=lambda args: _cmd_completion(args, parser))

    demo = sub.add_parser("demo", help="compile the example kernel; on a GPU, run it and check the result")
    add_build_options(demo)
    demo.set_defaults(func=_cmd_demo)
    return parser


def _stdout_closed():
    """Whether file descriptor 1 is closed (`ptxbackend cache list >&-`): Python then has no stdout."""
    if sys.stdout is None:
        return True
    import io
    try:
        os.fstat(sys.stdout.fileno())
    except (io.UnsupportedOperation, AttributeError):  # a replaced sys.stdout (tests): it is open
        return False
    except (OSError, ValueError):
        return True
    return False


def main(argv=None):
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" belongs to the compiler, untouched by argparse.
    compiler_options = []
    if "--" in argv:
        split = argv.index("--")
        argv, compiler_options = argv[:split], argv[split + 1:]
    if _stdout_closed():
        print("ptxbackend: error: standard output is closed; run it with stdout open (e.g. >/dev/null)",
              file=sys.stderr)
        return 1
    args = parser.parse_args(_cache_action_first(argv))
    args.compiler_options = compiler_options
    from ..compiling import engine
    engine.state.temporary_cache_fallback = False  # an admin command on a throwaway cache would only pretend
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from . import signals
    stdout, sys.stdout = sys.stdout, _Output(sys.stdout)
    try:
        with signals.stopping_like_ctrl_c():
            status = args.func(args)
            sys.stdout.flush()  # inside the try: a closed pipe is found here, not at interpreter exit
        return status
    except _OutputFailed as exc:
        failed = exc.args[0]
        print("ptxbackend: error: cannot write the output: %s (standard output)" % (
            os.strerror(failed.errno) if failed.errno else failed), file=sys.stderr)
        try:  # what is still buffered would fail again at the interpreter's exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1
    except signals.Terminated as exc:
        # SIGTERM/SIGHUP: unwound like Ctrl-C (the compiler's group ended, temporary files removed).
        print("\nptxbackend: %s" % exc, file=sys.stderr)
        return signals.exit_status(exc)
    except BrokenPipeError:
        # `ptxbackend cache info | head -1`: the reader has what it wanted; say nothing more.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except KeyboardInterrupt:
        # Ctrl-C: the compiler child was killed with its group (compilers/nvcc.py); no traceback.
        print("\nptxbackend: interrupted", file=sys.stderr)
        return 130
    except PtxBackendError as exc:
        _end_progress_line()
        print("ptxbackend: error: %s" % exc, file=sys.stderr)
        _save_whole_log(exc)
        return 1
    except (IOError, OSError) as exc:
        _end_progress_line()
        print("ptxbackend: error: %s" % _explained(exc), file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


def _end_progress_line():
    # A bar left part way (the command failed during it) would have the error run on after it.
    if "ptxbackend.deploy.replay" in sys.modules:
        sys.modules["ptxbackend.deploy.replay"].Progress.end_open_line()


#: What to do about the file-system errors a command meets most, by errno.
_REMEDIES = {
    errno.ENOSPC: "no space left on the file system of %s: free some, or write elsewhere",
    errno.EDQUOT: "the disk quota is used up on the file system of %s: free some, or write elsewhere",
    errno.EROFS: "%s is on a read-only file system: write elsewhere",
    errno.EEXIST: "%s already exists: remove it, or choose another name",
    errno.EACCES: "no permission to write %s: choose a place you own",
    errno.EPERM: "not permitted to change %s: choose a place you own",
}


@contextlib.contextmanager
def _about(path):
    """A write error with no file name (a full disk fails ``write()``, not ``open()``) is about ``path``."""
    try:
        yield
    except (IOError, OSError) as exc:
        if getattr(exc, "filename", None) is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), path)
        raise


def _explained(exc):
    """One line for a file-system error: the file it is about (a temporary file's destination, not the
    temporary name), which side it is (the cache or the output) and what to do."""
    path = getattr(exc, "filename", None)
    if not path or exc.errno not in _REMEDIES:
        return str(exc)
    path = str(path)
    directory, base = os.path.split(path)
    if base.startswith(".") and ".tmp-" in base:
        # write_atomic's temporary file: ".NAME.tmp-XXXX" is about NAME; ".tmp-XXXX" about its directory
        original = base[1:base.rindex(".tmp-")]
        path = os.path.join(directory, original) if original else directory
    side = "the output"
    try:
        from ..config import load_settings
        root = os.path.realpath(os.path.expanduser(load_settings().cache_dir))
        if os.path.realpath(path) == root or os.path.realpath(path).startswith(root + os.sep):
            side = "the cache"
    except Exception:  # a setting that cannot be read is reported elsewhere; name the path alone
        pass
    return "%s (%s)" % (_REMEDIES[exc.errno] % path, side)


def _save_whole_log(exc):
    """A compiler log cut in the message (errors.LOG_HEAD): the whole of it in a private file, named."""
    log = getattr(exc, "log", "") or ""
    from ..errors import LOG_HEAD, LOG_TAIL
    if len(log.splitlines()) <= LOG_HEAD + LOG_TAIL + 1:
        return
    try:
        handle, path = tempfile.mkstemp(prefix="ptxbackend-compiler-log-", suffix=".txt")  # mode 0600
        with os.fdopen(handle, "w") as out:
            out.write(log)
        print("ptxbackend: the whole compiler log (%d lines): %s" % (len(log.splitlines()), path), file=sys.stderr)
    except (OSError, IOError):
        pass


class _OutputFailed(Exception):
    """A write to standard output failed (``doctor > /dev/full``): the report could not be given."""


class _Output(object):
    """Standard output, whose write errors are told apart from every other ``OSError``."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except (IOError, OSError) as exc:
            raise _OutputFailed(exc)

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            raise
        except (IOError, OSError) as exc:
            raise _OutputFailed(exc)

    def __getattr__(self, name):
        return getattr(self._stream, name)


if __name__ == "__main__":
    sys.exit(main())
