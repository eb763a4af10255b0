"""The version of ptxbackend, in a module of its own so any module can import it without a cycle."""

__version__ = "0.4.0"
