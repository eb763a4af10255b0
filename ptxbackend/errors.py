"""Exception types raised by ptxbackend.

Every error the package raises derives from :class:`PtxBackendError`, so a
caller can catch one type.  Each message says what went wrong *and* what to do
about it: the people reading them keep production systems running and have no
time for guesswork.
"""


class PtxBackendError(Exception):
    """Base class of every error raised by ptxbackend."""


class ConfigError(PtxBackendError, ValueError):
    """A setting (argument, ``PTXBACKEND_*`` variable or config file) has a value that cannot be used."""


class TargetError(PtxBackendError, ValueError):
    """A target string is malformed, or no target fits the device and toolkit."""


class CompilerNotFoundError(PtxBackendError):
    """No usable compiler (nvcc or NVRTC) could be located."""


class CompileError(PtxBackendError):
    """The compiler rejected the source or its options.

    Attributes:
        command: the nvcc argument list, or the NVRTC option list.
        returncode: nvcc's exit status or NVRTC's result code.
        log: the full compiler log (stdout and stderr for nvcc).
        hint: a remedy when the cause is recognised, else ``''``.
    """

    def __init__(self, message, command=(), returncode=None, log="", hint=""):
        self.command = list(command)
        self.returncode = returncode
        self.log = log or ""
        self.hint = hint or ""
        text = message
        if self.command:
            text += "\n--- command / options ---\n" + " ".join(self.command)
        if self.log.strip():
            text += "\n--- compiler log ---\n" + _cut(self.log.rstrip())
        if self.hint:
            text += "\n--- what to do ---\n" + self.hint
        super(CompileError, self).__init__(text)


#: A compiler log longer than this many lines is shown by its head and tail (3 MB of bad source
#: makes tens of thousands of lines, and the first errors are the ones to read).
LOG_HEAD, LOG_TAIL = 40, 10


def _cut(log):
    lines = log.splitlines()
    if len(lines) <= LOG_HEAD + LOG_TAIL + 1:
        return log
    return "\n".join(lines[:LOG_HEAD] + ["... %d lines left out (the whole log: the error's .log) ..."
                                         % (len(lines) - LOG_HEAD - LOG_TAIL)] + lines[-LOG_TAIL:])


class CacheError(PtxBackendError):
    """The cache directory cannot be used as asked (permissions, ownership, lock time-out)."""


class DriverError(PtxBackendError):
    """A CUDA driver call failed.

    Attributes:
        code: the numeric ``CUresult`` (``None`` when libcuda could not be loaded).
        name: the driver's name for it, e.g. ``CUDA_ERROR_INVALID_PTX``.
        log: the JIT error log, when the failing call was a module load or link.
    """

    def __init__(self, message, code=None, name=None, log=""):
        self.code = code
        self.name = name
        self.log = log or ""
        text = message
        if self.log.strip():
            text += "\n--- driver JIT log ---\n" + self.log.rstrip()
        super(DriverError, self).__init__(text)
