"""Deployment warm-up: record which kernels a program compiles, replay them once at deployment.

``PTXBACKEND_RECORD=/path/manifest.jsonl`` makes every :func:`ptxbackend.compile`
of the process append the request to the manifest, once per distinct request:
everything its key is made of (source, name, options with absolute paths,
source_dir, target, compiler; for NVRTC the working directory), so that a warm
from any directory files the entries the program will ask for.  ``ptxbackend warm MANIFEST`` replays it:
compile (or hit), and on a GPU load each kernel so the per-device JIT cubin is
stored too.  After that, the program's start-up compiles and JIT-compiles nothing.
"""

import contextlib
import json
import logging
import os
import sys
import time

from ..compilers.grammar import option_problem
from ..compilers.options import read_path_options
from ..errors import PtxBackendError

log = logging.getLogger("ptxbackend")


_FIELDS = (("source", True), ("target", True), ("key", False), ("name", False), ("source_dir", False),
           ("cwd", False))
MANIFEST_LIMIT = 1 << 30


def _check_record(item):
    """Why ``item`` is not a request ptxbackend recorded (``None`` when it is one)."""
    if not isinstance(item, dict):
        return "not a JSON object"
    for field, required in _FIELDS:
        value = item.get(field)
        if (value is None and required) or (value is not None and not isinstance(value, str)):
            return "its %r is %s, not a string" % (field, json.dumps(value)[:40])
    if item.get("compiler") not in (None, "nvcc", "nvrtc"):
        return "its 'compiler' is %s, not \"nvcc\", \"nvrtc\" or null" % json.dumps(item.get("compiler"))[:40]
    options = item.get("options")
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        return "its 'options' are not a list of strings"
    # A manifest is data: its options never choose what runs (no -ccbin, options file or -Xcompiler)
    # and never reach nvcc's shell (no $, backquote ...): only the grammar of what CuPy and the docs
    # produce is replayed.
    why = option_problem(options)
    if why:
        return "%s; compile such kernels with ptxbackend.compile() in the program itself" % why
    for field in ("source_dir", "cwd"):
        directory = item.get(field)
        if directory is not None:
            # source_dir becomes "-I <source_dir>" (request.build), cwd where NVRTC looks first: the
            # same grammar as any -I from data.
            why = option_problem(["-I", directory])
            if why or not os.path.isabs(directory):
                return "its %r %s is not an absolute directory%s" % (
                    field, json.dumps(directory)[:80], " (%s)" % why if why else "")
    if list(read_path_options(options).options) != options:
        # A relative path means another request in another directory: the key would differ.
        return ("its options name a relative path, which names another file wherever warm runs; "
                "record it again with this version (it records paths absolute) or make the path absolute")
    return None


def _lines(path):
    from ..files import user
    if path == "-":
        handle = sys.stdin.buffer
    else:
        # Its lines choose what is compiled and filed: a file only its owner (or root) can write.
        handle = user.open_trusted_input(path, "manifest", MANIFEST_LIMIT, "warm")
    try:
        while True:
            raw = handle.readline(user.MANIFEST_LINE_LIMIT + 1)
            if not raw:
                return
            if len(raw) > user.MANIFEST_LINE_LIMIT:
                raise PtxBackendError("%s holds a line of more than %d bytes: not a ptxbackend manifest" % (
                    path, user.MANIFEST_LINE_LIMIT))
            yield raw
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()


def read_manifest(path):
    """The distinct requests of a manifest, in first-seen order."""
    seen = set()
    requests = []
    for number, raw in enumerate(_lines(path), 1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            item = json.loads(line)
        except ValueError:  # UnicodeDecodeError is a ValueError
            item, why = None, "not JSON"
        else:
            why = _check_record(item)
        if why:
            raise PtxBackendError("%s line %d is not a ptxbackend manifest record (%s; one JSON object a line, "
                                  "written with PTXBACKEND_RECORD=FILE; a bundle goes to `ptxbackend cache "
                                  "import`)" % (path, number, why))
        marker = (item["source"], tuple(item["options"]), item["target"], item.get("compiler"), item.get("name"),
                  item.get("source_dir"), item.get("cwd"))
        if marker not in seen:
            seen.add(marker)
            requests.append(item)
    return requests


@contextlib.contextmanager
def _working_directory(path):
    """Run the block in ``path`` (a record's ``cwd``: where NVRTC looked for the program's quoted
    includes), back where it was after; here when there is none or it does not exist on this machine
    (the entry may then hold what this directory gave, and the program's own call compile again)."""
    here = os.getcwd() if path else None
    if path:
        try:
            os.chdir(path)
        except OSError as exc:
            log.debug("ptxbackend: warm: %s: %s; compiling in %s", path, exc, here)
            here = None
    try:
        yield
    finally:
        if here is not None:
            os.chdir(here)


class Progress(object):
    """A one-line progress display on a terminal: a bar when the total is known, a running count when it
    is not (``total`` None: a walk that learns its size as it goes).  Redrawn at most ten times a
    second, so that a hundred thousand small steps do not cost a hundred thousand terminal writes.
    Not on a terminal (a log, a pipe) it draws nothing: there the command's result line says it all."""

    def __init__(self, total, label, stream=None, unit="done"):
        self.total = None if total is None else max(total, 1)
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0
        self._drawn = 0.0
        self._ended = False

    def step(self, note=""):
        self.done += 1
        last = self.total is not None and self.done >= self.total
        if self.tty and not self._ended:
            now = time.time()
            if last or now - self._drawn >= 0.1:
                self._drawn = now
                self._draw(note)
                if last:
                    self._end()

    def finish(self):
        """The last state drawn and the line ended (a running count has no last step of its own)."""
        if self.tty and not self._ended and self.done:
            self._draw("")
            self._end()

    #: The meter whose line is drawn and not yet ended: an error printed now must start a line of its own.
    open_line = None

    @classmethod
    def end_open_line(cls):
        """End the line a meter's bar is on (the command failed part way, or says something between two
        steps), so that what is printed next does not run on after the bar; a later step draws it again."""
        meter, cls.open_line = cls.open_line, None
        if meter is not None:
            meter.stream.write("\n")
            meter.stream.flush()

    def _draw(self, note):
        Progress.open_line = self
        if self.total is None:
            self.stream.write("\r%s: %d %s %s" % (self.label, self.done, self.unit, note[:40]))
        else:
            bar = "#" * int(self.done * 30 / self.total)
            self.stream.write("\r%s [%-30s] %d/%d %s" % (self.label, bar, self.done, self.total, note[:40]))
        self.stream.flush()

    def _end(self):
        self._ended = True
        if Progress.open_line is self:
            Progress.open_line = None
        self.stream.write("\n")
        self.stream.flush()


def replay(path, device_cc=None, out=print, progress=None, report=None):
    """Compile every request of the manifest and, on a GPU, store its JIT cubin.

    ``progress``: makes a meter from the number of requests (the command line's terminal display), or
    ``None``; ``report``: a list that gets one dict per request (``name``, ``key``, ``target``,
    ``compiler``, ``result``: compiled, cached or failed, ``error``).
    Returns ``(compiled, hits, failures)``.
    """
    from ..gpu import driver
    from ..compiling.engine import compile as compile_kernel
    from ..compiling.engine import load
    from ..errors import PtxBackendError
    requests = read_manifest(path)
    on_gpu = device_cc is None and driver.available()
    meter = progress(len(requests)) if progress and requests else None
    compiled = hits = 0
    failures = []
    for item in requests:
        result, error = "failed", None
        try:
            with _working_directory(item.get("cwd")):
                artifact = compile_kernel(item["source"], item["options"], target=item["target"],
                                          compiler=item.get("compiler"), device_cc=device_cc,
                                          name=item.get("name") or "kernel.cu", source_dir=item.get("source_dir"))
            if artifact.cache_hit:
                hits += 1
            else:
                compiled += 1
            result = "cached" if artifact.cache_hit else "compiled"
            if on_gpu:
                load(artifact).unload()
        except PtxBackendError as exc:
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            failures.append(((item.get("key") or "?")[:12], error))
            if result != "failed":  # compiled, then refused by the driver
                compiled, hits = (compiled - 1, hits) if result == "compiled" else (compiled, hits - 1)
                result = "failed"
        if report is not None:
            report.append({"name": item.get("name"), "key": item.get("key"), "target": item["target"],
                           "compiler": item.get("compiler"), "result": result, "error": error})
        if meter is not None:
            meter.step(item.get("name") or "")
    out("%d kernels: %d compiled, %d already cached, %d failed%s" % (
        len(requests), compiled, hits, len(failures), "; JIT cubins stored for this GPU" if on_gpu else ""))
    for key, message in failures:
        out("  failed %s: %s" % (key, message))
    return compiled, hits, failures


def _library_results_path():
    from ..config import load_settings
    from ..compiling.engine import open_store
    return os.path.join(open_store(load_settings()).meta_dir, "jit-libraries.json")


def save_library_results(results):
    """Remember what each library's JIT needed, so `doctor` can check the driver's cache size."""
    from ..files import private
    path = _library_results_path()
    known = load_library_results()
    for result in results:
        known[result["library"]] = {"jit_cache_growth_bytes": result["jit_cache_growth_bytes"],
                                    "first_s": result["first"]["total_s"], "second_s": result["second"]["total_s"]}
    try:
        private.make_private_dirs(os.path.dirname(path))
        private.write_atomic(path, json.dumps(known, indent=1, sort_keys=True).encode("utf-8"))
    except OSError as exc:
        log.warning("ptxbackend: cannot save library warm-up results to %s: %s", path, exc)


def load_library_results():
    try:
        with open(_library_results_path()) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
