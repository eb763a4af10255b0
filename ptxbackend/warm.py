"""Deployment warm-up: record which kernels a program compiles, replay them once at deployment.

``PTXBACKEND_RECORD=/path/manifest.jsonl`` makes every :func:`ptxbackend.compile`
of the process append the request (source, options, target, compiler) to the
manifest, once per distinct request.  ``ptxbackend warm MANIFEST`` replays it:
compile (or hit), and on a GPU load each kernel so the per-device JIT cubin is
stored too.  After that, the program's start-up compiles and JIT-compiles nothing.
"""

import json
import logging
import os
import sys

from .errors import PtxBackendError

log = logging.getLogger("ptxbackend")


def read_manifest(path):
    """The distinct requests of a manifest, in first-seen order."""
    seen = set()
    requests = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                item = json.loads(line)
                marker = (item["source"], tuple(item["options"]), item["target"], item["compiler"])
            except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
                raise PtxBackendError("%s line %d is not a ptxbackend manifest record (one JSON object a line, "
                                  "written with PTXBACKEND_RECORD=FILE; a bundle goes to `ptxbackend cache "
                                  "import`)" % (path, number))
            if marker not in seen:
                seen.add(marker)
                requests.append(item)
    return requests


class Progress(object):
    """A one-line progress bar on stderr when it is a terminal, else a line every 10%."""

    def __init__(self, total, label, stream=None):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self._last_decile = -1

    def step(self, note=""):
        self.done += 1
        fraction = self.done / float(self.total)
        if self.tty:
            bar = "#" * int(fraction * 30)
            self.stream.write("\r%s [%-30s] %d/%d %s" % (self.label, bar, self.done, self.total, note[:40]))
            if self.done == self.total:
                self.stream.write("\n")
        elif int(fraction * 10) != self._last_decile:
            self._last_decile = int(fraction * 10)
            self.stream.write("%s: %d/%d\n" % (self.label, self.done, self.total))
        self.stream.flush()


def replay(path, device_cc=None, out=print):
    """Compile every request of the manifest and, on a GPU, store its JIT cubin.

    Returns ``(compiled, hits, failures)``.
    """
    from . import driver
    from .engine import compile as compile_kernel
    from .engine import load
    from .errors import PtxBackendError
    requests = read_manifest(path)
    on_gpu = device_cc is None and driver.available()
    progress = Progress(len(requests), "warm kernels")
    compiled = hits = 0
    failures = []
    for item in requests:
        try:
            artifact = compile_kernel(item["source"], item["options"], target=item["target"],
                                      compiler=item["compiler"], device_cc=device_cc,
                                      name=item.get("name") or "kernel.cu")
            if artifact.cache_hit:
                hits += 1
            else:
                compiled += 1
            if on_gpu:
                load(artifact).unload()
        except PtxBackendError as exc:
            failures.append((item.get("key", "?")[:12], str(exc).splitlines()[0]))
        progress.step(item.get("name") or "")
    out("%d kernels: %d compiled, %d already cached, %d failed%s" % (
        len(requests), compiled, hits, len(failures), "; JIT cubins stored for this GPU" if on_gpu else ""))
    for key, message in failures:
        out("  failed %s: %s" % (key, message))
    return compiled, hits, failures


def _library_results_path():
    from .config import load_settings
    from .engine import open_store
    return os.path.join(open_store(load_settings()).meta_dir, "jit-libraries.json")


def save_library_results(results):
    """Remember what each library's JIT needed, so `doctor` can check the driver's cache size."""
    from . import _fsutil
    path = _library_results_path()
    known = load_library_results()
    for result in results:
        known[result["library"]] = {"jit_cache_growth_bytes": result["jit_cache_growth_bytes"],
                                    "first_s": result["first"]["total_s"], "second_s": result["second"]["total_s"]}
    try:
        _fsutil.make_private_dirs(os.path.dirname(path))
        _fsutil.write_atomic(path, json.dumps(known, indent=1, sort_keys=True).encode("utf-8"))
    except OSError as exc:
        log.warning("ptxbackend: cannot save library warm-up results to %s: %s", path, exc)


def load_library_results():
    try:
        with open(_library_results_path()) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
