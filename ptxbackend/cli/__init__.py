"""The ``ptxbackend`` command line (the top layer: it may import every other package).

Owns: :mod:`.commands` (argument parsing and each command), :mod:`.doctor` and :mod:`.demo`.
``ptxbackend.cli:main`` is the console script's entry point.
"""

from .commands import main

__all__ = ["main"]
