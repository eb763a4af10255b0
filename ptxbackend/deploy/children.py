"""How ptxbackend starts a Python child of its own (``warm --libs``'s library and JIT workers): isolated.

``python -m ptxbackend...`` would import from the working directory first (and
from ``PYTHONPATH`` and the user's site directory): a ``ptxbackend/`` package
another user planted in a shared directory would run as the victim.  The child
is started with ``-I`` (none of those) and told where the package its parent
runs lives, so it runs exactly that code.
"""

import os
import sys

# Runs in the child: put the parent's package first, then run the module as __main__.
_RUNNER = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); name = sys.argv.pop(1); "
           "sys.argv[0] = name; runpy.run_module(name, run_name='__main__', alter_sys=True)")


def package_parent():
    """The directory holding the ``ptxbackend`` package this process runs."""
    here = os.path.dirname(os.path.abspath(__file__))  # .../ptxbackend/deploy
    return os.path.dirname(os.path.dirname(here))


def python_module(module, *args):
    """The argument list that runs ``python -m module args...`` isolated (see the module docstring)."""
    return [sys.executable, "-I", "-c", _RUNNER, package_parent(), module] + [str(a) for a in args]
