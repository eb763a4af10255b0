"""Fill the driver's JIT cache for a library in parallel: its fatbin images, shared among processes.

A library's CUDA runtime loads (and the driver JIT-compiles) its modules one
after the other when it starts: for cuDNN 7 on an H200 that is many minutes on
one core.  The driver's JIT cache is keyed by what it compiles, so loading the
*same* fatbin image with plain cuModuleLoadData in another process (the driver
picks the same PTX entry, with the same default options) fills the entries the
library's runtime looks up later.  :func:`warm` splits the images that need the
JIT among ``jobs`` worker processes, balanced by PTX size, largest first; the
caller then starts the library itself once (libwarm's verification child), whose
short start is the proof that the keys matched.

Run as ``python -m ptxbackend.deploy.parallel_jit`` it is one worker: it reads ``{"path",
"ranges"}`` as JSON on stdin and prints one JSON line with its counts and time.
Nothing from the library names a program to run: workers are this package's own
module, given file offsets of a library this machine's discovery found or the
user named.
"""

import json
import subprocess
import sys
import time

from ..gpu.fatbin import MAGIC
from .children import python_module

_MAX_ERRORS = 5  # refusals quoted per worker; the rest are only counted
_SLOW_S = 10.0  # an image whose load takes this long is named on stderr as it finishes


def plan(images, cc):
    """Split ``images`` by what the driver does with them on compute capability ``cc``."""
    groups = {"sass": [], "jit": [], "none": [], "relocatable": []}
    for image in images:
        groups[image.needs(cc)].append(image)
    return groups


def shares(images, jobs, cc):
    """``jobs`` lists of images with balanced sizes of the PTX the driver JIT-compiles on ``cc``: largest
    first, each to the lightest list."""
    lists = [[] for _ in range(max(1, min(jobs, len(images))))]
    loads = [0] * len(lists)
    for image in sorted(images, key=lambda i: (-i.jit_bytes(cc), i.offset)):
        lightest = loads.index(min(loads))
        lists[lightest].append(image)
        loads[lightest] += image.jit_bytes(cc)
    return [share for share in lists if share]


def _start_worker(path, share, env):
    # stderr is ours: a slow image's line reaches the log as it happens, even if a deadline ends the run.
    proc = subprocess.Popen(python_module("ptxbackend.deploy.parallel_jit"), env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, universal_newlines=True)
    # The worker reads all of stdin before any CUDA call, so this write does not wait for its JIT.
    try:
        proc.stdin.write(json.dumps({"path": path, "ranges": [[i.offset, i.size] for i in share]}))
        proc.stdin.close()
    except OSError:
        pass  # it ended before reading: _finish_worker reports its exit status
    return proc


def _finish_worker(proc, number):
    stdout = proc.stdout.read()
    proc.wait()
    result = {"failed": "worker %d ended with exit status %d and no report" % (number, proc.returncode)}
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    result.setdefault("loaded", 0)
    result.setdefault("refused", 0)
    result.setdefault("seconds", None)
    result["worker"] = number
    return result


def warm(path, images, env, jobs, cc, say=None):
    """Load each of ``images`` (:func:`ptxbackend.gpu.fatbin.read_images` of ``path``) that needs the JIT on ``cc`` in ``jobs``
    processes run with ``env``.

    Returns the counts (images found, skipped because they carry SASS for this
    GPU or no code it can use, loaded, refused), the PTX bytes, each worker's
    seconds, their sum (an estimate of the serial warm-up this replaces) and the
    wall seconds.  ``say``: called with one line as the workers start.
    """
    groups = plan(images, cc)
    started = time.perf_counter()
    split = shares(groups["jit"], jobs, cc)
    if say:
        say("JIT-compiling %d of the %d fatbin images of %s (%.1f MiB of PTX) in %d processes"
            % (len(groups["jit"]), len(images), path, sum(i.jit_bytes(cc) for i in groups["jit"]) / 1048576.0,
               len(split)))
    procs = []
    try:
        for share in split:
            procs.append(_start_worker(path, share, env))
        workers = [_finish_worker(proc, n) for n, proc in enumerate(procs)]
    except BaseException:
        # Ctrl-C, SIGTERM or SIGHUP (cli/signals.py): no worker outlives the command.
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raise
    wall = time.perf_counter() - started
    seconds = [w["seconds"] for w in workers if w.get("seconds") is not None]
    return {"images": len(images), "skipped_sass": len(groups["sass"]), "skipped_no_code": len(groups["none"]),
            "skipped_relocatable": len(groups["relocatable"]),
            "to_load": len(groups["jit"]), "loaded": sum(w["loaded"] for w in workers),
            "refused": sum(w["refused"] for w in workers), "ptx_bytes": sum(i.jit_bytes(cc) for i in groups["jit"]),
            "jobs": len(workers), "workers": workers, "worker_seconds_sum": sum(seconds), "wall_s": wall,
            "device_cc": cc, "failed_workers": [w["failed"] for w in workers if w.get("failed")],
            "errors": [e for w in workers for e in w.get("errors", [])][:_MAX_ERRORS]}


def worker(request):
    """Load and unload each ``[offset, size]`` fatbin image of ``request['path']``; the counts and time."""
    from ..gpu import driver
    from ..errors import DriverError
    driver.ensure_context()
    started = time.perf_counter()
    loaded, refused, errors = 0, 0, []
    with open(request["path"], "rb") as handle:
        for offset, size in request["ranges"]:
            handle.seek(offset)
            image = handle.read(size)
            # The file could have changed since the parent parsed it: load only what is still a fatbin.
            if len(image) != size or image[:4] != MAGIC.to_bytes(4, "little"):
                refused += 1
                errors.append("offset %d: no longer a fatbin image (the library changed?)" % offset)
                continue
            began = time.perf_counter()
            try:
                driver.jit_image(image)
                loaded += 1
                if time.perf_counter() - began >= _SLOW_S:
                    sys.stderr.write("ptxbackend.deploy.parallel_jit: image at offset %d (%d of %d here) JIT-compiled in %.1f s\n"
                                     % (offset, loaded + refused, len(request["ranges"]), time.perf_counter() - began))
            except DriverError as exc:
                refused += 1
                errors.append("offset %d: %s" % (offset, " ".join(str(exc).split())[:300]))
    return {"loaded": loaded, "refused": refused, "seconds": time.perf_counter() - started,
            "errors": errors[:_MAX_ERRORS]}


if __name__ == "__main__":
    try:
        print(json.dumps(worker(json.loads(sys.stdin.read()))))
    except Exception as exc:  # the parent shows one line: what failed, not where in this file
        print(json.dumps({"failed": " ".join(str(exc).split())[:500] or type(exc).__name__}))
        sys.exit(1)
