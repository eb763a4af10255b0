"""How ptxbackend starts a Python child of its own (``warm --libs``'s library and JIT workers): isolated.

``python -m ptxbackend...`` would import from the working directory first: a
``ptxbackend/`` package another user planted in a shared directory would run
as the victim.  The child is started with ``-I`` (no working directory, no
``PYTHONPATH``, no user site read by the child itself) and handed the import
path its parent uses, less the working directory: the directory of the
package the parent runs first, then the parent's other absolute entries (its
dependencies may come from ``PYTHONPATH`` or the user site, which the parent
already trusted).  So the child runs exactly the code its parent runs.
"""

import json
import os
import sys

# Runs in the child: the parent's import path first, then the module as __main__.
_RUNNER = ("import json, runpy, sys; sys.path[:0] = json.loads(sys.argv.pop(1)); name = sys.argv.pop(1); "
           "sys.argv[0] = name; runpy.run_module(name, run_name='__main__', alter_sys=True)")


def package_parent():
    """The directory holding the ``ptxbackend`` package this process runs."""
    here = os.path.dirname(os.path.abspath(__file__))  # .../ptxbackend/deploy
    return os.path.dirname(os.path.dirname(here))


def import_path():
    """The parent's import path for its child: its package's directory first, then every absolute entry of
    ``sys.path`` that is not the working directory (``python -m``/``-c`` put that first)."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed: nothing can be found there anyway
        cwd = None
    found = [package_parent()]
    for entry in sys.path:
        if not entry or not os.path.isabs(entry) or entry in found:
            continue
        if cwd is not None and os.path.realpath(entry) == cwd and entry != found[0]:
            continue
        found.append(entry)
    return found


def python_module(module, *args):
    """The argument list that runs ``python -m module args...`` isolated (see the module docstring)."""
    return [sys.executable, "-I", "-c", _RUNNER, json.dumps(import_path()), module] + [str(a) for a in args]
