"""Recording kernel requests: ``PTXBACKEND_RECORD=manifest.jsonl`` appends each distinct request.

``ptxbackend warm MANIFEST`` (:mod:`ptxbackend.warm`) replays the file at deployment.
"""

import json
import logging
import os
import threading

log = logging.getLogger("ptxbackend")

RECORD_ENV = "PTXBACKEND_RECORD"

_recorded = set()
_record_lock = threading.Lock()


def record_request(key, source, options, target_spec, compiler, name):
    """Append one request to the manifest named by PTXBACKEND_RECORD (once per key per process)."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    with _record_lock:
        if key in _recorded:
            return
        _recorded.add(key)
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    line = json.dumps({"key": key, "source": source, "options": list(options), "target": target_spec,
                       "compiler": compiler, "name": name}, sort_keys=True) + "\n"
    try:
        import filelock
        with filelock.FileLock(path + ".lock", timeout=60):
            with open(path, "a") as handle:
                handle.write(line)
    except Exception as exc:  # recording is a side job: it must never break the program
        log.warning("ptxbackend: cannot record to %s=%s: %s", RECORD_ENV, path, exc)
