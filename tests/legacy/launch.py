"""Run a program unchanged, recording every CuPy kernel compile it asks for.

    python launch.py --record rec.json -- program.py [args...]

Observation only: after ``import cupy`` (when the start-up hook, if active, has
already replaced CuPy's compile function) it wraps the function Chainer's CuPy
calls, ``cupy.cuda.compile_with_cache``, and, when ptxbackend serves CuPy, the
``ptxbackend.compiling.engine.compile`` it calls, to record per kernel: its name, the time
taken, what ptxbackend produced (kind, target, producer, cache hit) or why it
failed.  Then it runs the program as ``__main__``.  The record is written even
when the program fails (then with its error).
"""

import json
import re
import runpy
import sys
import time
import traceback

_NAME = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)')


def _kernel_name(source):
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    names = _NAME.findall(source or "")
    return names[-1] if names else "?"


def _first_lines(exc, count=12):
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "\n".join(lines[:count])


def main():
    argv = sys.argv[1:]
    if len(argv) < 4 or argv[0] != "--record" or argv[2] != "--":
        sys.exit(__doc__)
    record_path, program, program_args = argv[1], argv[3], argv[4:]
    start = time.time()
    record = {"program": program, "args": program_args, "compiles": [], "ptxbackend": [],
              "hook_active": False, "compile_function": None, "error": None}

    try:
        import cupy  # noqa: F401  (runs the start-up hook's hand-over, if any)
        import cupy.cuda
        record["cupy_file"] = cupy.__file__
        original = cupy.cuda.compile_with_cache
        record["compile_function"] = "%s.%s" % (getattr(original, "__module__", "?"),
                                                getattr(original, "__name__", "?"))
        record["hook_active"] = getattr(original, "_ptxbackend_original", None) is not None
        record["ptxbackend_imported"] = "ptxbackend" in sys.modules

        def compile_with_cache(source, *args, **kwargs):
            item = {"kernel": _kernel_name(source)}
            t0 = time.perf_counter()
            try:
                return original(source, *args, **kwargs)
            except Exception as exc:
                item["error"] = "%s: %s" % (type(exc).__name__, _first_lines(exc))
                raise
            finally:
                # microseconds: a warm hit takes a fraction of a millisecond
                item["seconds"] = round(time.perf_counter() - t0, 7)
                record["compiles"].append(item)

        cupy.cuda.compile_with_cache = compile_with_cache

        if record["hook_active"]:
            from ptxbackend.compiling import engine
            engine_compile = engine.compile

            def traced_compile(source, *args, **kwargs):
                item = {"kernel": _kernel_name(source)}
                try:
                    artifact = engine_compile(source, *args, **kwargs)
                except Exception as exc:
                    item["error"] = "%s: %s" % (type(exc).__name__, _first_lines(exc, 20))
                    raise
                finally:
                    record["ptxbackend"].append(item)
                item.update(kind=artifact.kind, target=str(artifact.target), producer=artifact.producer,
                            cache_hit=bool(artifact.cache_hit))
                return artifact

            engine.compile = traced_compile

            # The driver JITs counted where ptxbackend asks for them (a JIT cubin found in a cache:
            # none); and, at the end, what its caches served (local, fleet).
            from ptxbackend.gpu import driver
            link_ptx = driver.link_ptx
            record["jit_links"] = 0

            def counted_link(*args, **kwargs):
                record["jit_links"] += 1
                return link_ptx(*args, **kwargs)
            driver.link_ptx = counted_link
    except Exception as exc:  # no GPU stack: the program reports it its own way
        record["setup_error"] = "%s: %s" % (type(exc).__name__, _first_lines(exc))

    status = 0
    sys.argv = [program] + program_args
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        record["error"] = "%s: %s" % (type(exc).__name__, str(exc))
        traceback.print_exc()
        status = 1
    finally:
        record["seconds"] = round(time.time() - start, 3)
        if record.get("hook_active"):
            try:
                from ptxbackend.compiling import engine
                from ptxbackend.config import load_settings
                record["cache_stats"] = engine.open_cache(load_settings()).stats()
            except Exception as exc:
                record["cache_stats"] = {"error": str(exc)}
        with open(record_path, "w") as handle:
            json.dump(record, handle, indent=1)
    sys.exit(status)


if __name__ == "__main__":
    main()
