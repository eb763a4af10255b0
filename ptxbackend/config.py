"""Settings: function arguments, then ``PTXBACKEND_*`` variables, then a config file, then defaults.

The config file is INI with one ``[ptxbackend]`` section whose keys are the
knob names below (``target = compute_75``).  It is read from
``PTXBACKEND_CONFIG`` or, by default, ``<user config dir>/ptxbackend/config.ini``.
docs/configuration.md documents every knob in :data:`KNOBS`.
"""

import errno
import logging
import os

from _ptxbackend_env import parse_size  # noqa: F401  (one size parser for the hook and the package)

from .errors import ConfigError

def parse_bool(text):
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("not a boolean: %r (write 1 or 0)" % (text,))


def parse_seconds(text):
    """A finite number of seconds >= 0: a bounded wait must stay bounded."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")  # reported below, with the hint
    if not 0 <= seconds < float("inf"):  # also false for nan
        # filelock waits forever on a negative time-out; nan and inf never end either.
        raise ValueError("not a number of seconds >= 0: %r (write e.g. 600)" % (text,))
    return seconds


def parse_compiler_check(text):
    value = str(text).strip().lower()
    if value not in ("stat", "command"):
        raise ValueError("not a compiler check: %r (write stat or command)" % (text,))
    return value


def _text(value):
    return str(value).strip() or None


def _nonblank(value):
    """A value that names something (a path, a target): spaces alone are a mistake, not "unset"."""
    text = str(value).strip()
    if not text:
        raise ValueError("only spaces: write a value, or unset it for the default")
    return text


_CONFIG_LIMIT = 1 << 20


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def parse_log_level(text):
    """One of :data:`LOG_LEVELS` (any case)."""
    value = str(text).strip().lower()
    if value not in LOG_LEVELS:
        raise ValueError("not a log level: %r (write one of %s)" % (text, ", ".join(LOG_LEVELS)))
    return value


REMOTE_MODES = ("rw", "ro")


def parse_remote_mode(text):
    """``rw`` (read and upload) or ``ro`` (read only: line PCs)."""
    value = str(text).strip().lower()
    if value not in REMOTE_MODES:
        raise ValueError("not a remote mode: %r (write rw or ro)" % (text,))
    return value


# name -> (environment variable, default, parser)
KNOBS = {
    "target": ("PTXBACKEND_TARGET", "auto", _nonblank),
    "compiler": ("PTXBACKEND_COMPILER", None, _nonblank),
    "nvcc": ("PTXBACKEND_NVCC", None, _nonblank),
    "nvrtc": ("PTXBACKEND_NVRTC", None, _nonblank),
    "device_cc": ("PTXBACKEND_DEVICE_CC", None, _nonblank),
    "cache_dir": ("PTXBACKEND_CACHE_DIR", None, _nonblank),
    "cache_max_size": ("PTXBACKEND_CACHE_MAX_SIZE", 1 << 30, parse_size),
    "cubin_cache": ("PTXBACKEND_CUBIN_CACHE", True, parse_bool),
    "lock_timeout": ("PTXBACKEND_LOCK_TIMEOUT", 600.0, parse_seconds),
    # nvcc and the host compiler are subprocesses: one that never returns is killed after this.
    "compile_timeout": ("PTXBACKEND_COMPILE_TIMEOUT", 600.0, parse_seconds),
    "log": ("PTXBACKEND_LOG", "warning", parse_log_level),
    # The fleet store (docs/fleet.md): off unless a URL and a key file are given.
    "remote": ("PTXBACKEND_REMOTE", None, _text),
    "remote_mode": ("PTXBACKEND_REMOTE_MODE", "rw", parse_remote_mode),
    "remote_timeout": ("PTXBACKEND_REMOTE_TIMEOUT", 0.25, parse_seconds),
    "remote_namespace": ("PTXBACKEND_REMOTE_NAMESPACE", "ptxbackend", _text),
    "remote_key_file": ("PTXBACKEND_REMOTE_KEY_FILE", None, _text),
    "remote_password_file": ("PTXBACKEND_REMOTE_PASSWORD_FILE", None, _text),
    "remote_ttl": ("PTXBACKEND_REMOTE_TTL", 0.0, parse_seconds),
    "remote_budget": ("PTXBACKEND_REMOTE_BUDGET", 10.0, parse_seconds),
    "remote_retry": ("PTXBACKEND_REMOTE_RETRY", 30.0, parse_seconds),
    # How a hit knows the toolkit is the one that made the entry (docs/configuration.md).
    "compiler_check": ("PTXBACKEND_COMPILER_CHECK", "stat", parse_compiler_check),
    "deps_recheck": ("PTXBACKEND_DEPS_RECHECK", 0.0, parse_seconds),
    # NVRTC 12.8+'s precompiled headers for ptxbackend's own compiles (precompiled.py): a CuPy 14 miss on
    # the H200 in 0.67x stock CuPy's time (docs/benchmarks.md); 0 turns them off.
    "nvrtc_pch": ("PTXBACKEND_NVRTC_PCH", True, parse_bool),
}

# Variables the compilers read that change what they produce: part of every request's key.  The
# second line are those nvcc.profile appends to (``INCLUDES += ...``: the environment's value comes
# first), which tests/test_dependency_sets.py checks against real nvcc.profile files.  SOURCE_DATE_EPOCH
# (nvcc's __DATE__) is not here: a dependency set records the date a compile wrote (depsets.py).
NVCC_ENVIRONMENT = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH",
                    "CPLUS_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
                    "INCLUDES", "SYSTEM_INCLUDES", "LIBRARIES", "CUDAFE_FLAGS", "NVVM_FLAGS", "PTXAS_FLAGS",
                    "OCG_FLAGS", "NVLINK_FLAGS", "CICC_PATH", "NVVMIR_LIBRARY_DIR")

_file_cache = {}
_settings_cache = {}
_SETTINGS_CACHE_LIMIT = 64
# Besides the knobs, what the defaults depend on (the config file's and the cache's default places),
# and what the engine derives from a Settings object and remembers with it (the compiler on PATH).
_CONTEXT_ENV = ("PTXBACKEND_CONFIG", "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
                "PATH", "CUDA_PATH", "CUDA_HOME", "PTXBACKEND_RECORD") + NVCC_ENVIRONMENT
_ENV_NAMES = tuple(env for env, _default, _parse in KNOBS.values()) + _CONTEXT_ENV
try:
    # os.environ keeps its values in a plain dict under these keys (bytes on POSIX).  Reading
    # that dict costs 0.7 us for all the names above; os.environ.get costs 13 us: most of a
    # warm hit's budget.  Checked at every call, with os.environ.get as the fallback.
    _ENV_KEYS = tuple(os.environ.encodekey(name) for name in _ENV_NAMES)
except Exception:
    _ENV_KEYS = None
_logging_level = []
_logger = logging.getLogger("ptxbackend")


def config_file_path():
    explicit = os.environ.get("PTXBACKEND_CONFIG")
    if explicit:
        return explicit
    import platformdirs
    return os.path.join(platformdirs.user_config_dir("ptxbackend", appauthor=False), "config.ini")


def _file_values(path):
    stamp = _file_stamp(path)
    if stamp is None:
        if os.environ.get("PTXBACKEND_CONFIG"):
            # Named on purpose: carrying on without it would silently use other settings.
            raise ConfigError("PTXBACKEND_CONFIG names %s, which %s. Create it, or unset PTXBACKEND_CONFIG "
                              "to use the default place." % (path, _why_unreadable(path)))
        return {}
    cached = _file_cache.get(path)
    if cached and cached[0] == stamp:
        return cached[1]
    import configparser
    text = _read_config_file(path)
    parser = configparser.ConfigParser()
    try:
        parser.read_string(text, source=path)
        # items() interpolates, so a stray '%' fails here, not in read()
        values = dict(parser.items("ptxbackend")) if parser.has_section("ptxbackend") else {}
    except configparser.Error as exc:
        raise ConfigError("config file %s is not valid INI: %s. Fix it, or point "
                          "PTXBACKEND_CONFIG at another file." % (path, " ".join(str(exc).split())[:300]))
    misspelt = [name for name in parser.sections() if name != "ptxbackend" and name.lower() == "ptxbackend"]
    if misspelt:
        # Section names are case-sensitive: [PTXBACKEND] would be ignored without a word.
        raise ConfigError("config file %s has a [%s] section: write it [ptxbackend] (lower case), or its "
                          "settings are not read" % (path, misspelt[0]))
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        logging.getLogger("ptxbackend").warning(
            "ptxbackend: unknown keys in %s ignored: %s (known: %s)",
            path, ", ".join(unknown), ", ".join(sorted(KNOBS)))
    _warn_exposed_password(path, stamp[3], values.get("remote"))
    _file_cache[path] = (stamp, values)
    return values


def _warn_exposed_password(path, mode, url):
    """Warn when the config file gives the fleet store's password to everyone who can read it."""
    if not url or not mode & 0o044:
        return
    from urllib.parse import parse_qsl, urlsplit
    try:
        parts = urlsplit(url)
        exposed = bool(parts.password) or any(k.lower() == "password" for k, _v in parse_qsl(parts.query))
    except ValueError:
        exposed = "@" in url or "password" in url.lower()
    if exposed:
        logging.getLogger("ptxbackend").warning(
            "ptxbackend: config file %s holds the fleet store password (in remote = ...) and can be read by "
            "group or others (mode %o): run chmod 600 %s, or keep the password in "
            "PTXBACKEND_REMOTE_PASSWORD_FILE", path, mode & 0o777, path)


def _why_unreadable(path):
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return "does not exist"
        return "cannot be read (%s)" % (exc.strerror or exc)
    return "cannot be read"


def _read_config_file(path):
    """The text of the config file, if it is a regular file that only you (or root) can change.

    It names the compiler and the NVRTC library to load: a file someone else can write would let
    them choose what runs (the check OpenSSH makes of its configuration files).  The checks are of
    the descriptor read, so nothing can be swapped in between.
    """
    import stat as stat_module
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError("cannot read config file %s: %s" % (path, exc.strerror or exc))
    st = os.fstat(fd)
    if not stat_module.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError("config file %s is not a regular file; point PTXBACKEND_CONFIG at one" % path)
    with os.fdopen(fd, "rb") as handle:
        if hasattr(os, "getuid") and st.st_uid not in (os.getuid(), 0):
            raise ConfigError(
                "config file %s belongs to uid %d, not to you (uid %d) or root: refusing to take settings "
                "from it, as they choose the compiler and library ptxbackend runs. Fix its owner, or point "
                "PTXBACKEND_CONFIG at a file of your own." % (path, st.st_uid, os.getuid()))
        if st.st_mode & (stat_module.S_IWGRP | stat_module.S_IWOTH):
            raise ConfigError(
                "config file %s is writable by group or others (mode %o): refusing to take settings from "
                "it. Run: chmod go-w %s" % (path, st.st_mode & 0o777, path))
        if st.st_size > _CONFIG_LIMIT:
            raise ConfigError("config file %s is %d bytes: a ptxbackend config file is a few lines (at most "
                              "%d bytes). Point PTXBACKEND_CONFIG at the right file." % (
                                  path, st.st_size, _CONFIG_LIMIT))
        data = handle.read(_CONFIG_LIMIT + 1)
    if len(data) > _CONFIG_LIMIT:
        raise ConfigError("config file %s grew past %d bytes while it was read" % (path, _CONFIG_LIMIT))
    try:
        # utf-8-sig: an editor's byte-order mark is not a "missing section header".
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError("config file %s is not valid UTF-8: %s. Fix it, or point PTXBACKEND_CONFIG "
                          "at another file." % (path, exc))


class Settings(object):
    """The effective value of every knob, and where each came from."""

    def __init__(self, values, origins):
        self._values = values
        self.origins = origins
        # Plain attributes, not __getattr__: the hit path reads several per kernel.
        self.__dict__.update(values)

    def as_dict(self):
        return dict(self._values)


def load_settings(**overrides):
    """Resolve every knob.  ``overrides`` (non-``None`` values) win over everything.

    Every compile() asks, so the answer is remembered for as long as the
    environment variables it depends on and the config file's stat stay the
    same: a changed variable or an edited file is seen on the next call.
    """
    return _remembered(tuple(sorted((k, v) for k, v in overrides.items() if v is not None)), overrides)


def compile_settings(target=None, compiler=None, device_cc=None, cache_dir=None):
    """:func:`load_settings` with compile()'s four overrides, as cheaply as a warm hit needs."""
    return _remembered(("compile", target, compiler, device_cc, cache_dir),
                       {"target": target, "compiler": compiler, "device_cc": device_cc,
                        "cache_dir": cache_dir})


def _remembered(override_marker, overrides):
    marker = (_environment_values(), override_marker)
    try:
        cached = _settings_cache.get(marker)
    except TypeError:  # an unhashable override value: resolve it every time
        marker = cached = None
    if cached is not None and cached[0] == _file_stamp(cached[1]):
        return cached[2]
    file_path = config_file_path()
    stamp = _file_stamp(file_path)  # before reading: an edit made during the read is seen next time
    settings = _resolve(overrides, file_path)
    if marker is not None:
        if len(_settings_cache) >= _SETTINGS_CACHE_LIMIT:
            _settings_cache.clear()
        _settings_cache[marker] = (stamp, file_path, settings)
    return settings


def _environment_values():
    """The values of every variable the settings depend on, in a form fit only for comparing."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if _ENV_KEYS is not None and type(data) is dict:
        return tuple(map(data.get, _ENV_KEYS))
    return tuple(map(environ.get, _ENV_NAMES))


def _file_stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    # Owner and mode too: a chmod or chown must be seen by the next call, which re-checks the file.
    return (st.st_mtime, st.st_size, st.st_ino, st.st_mode, st.st_uid)


def settings_and_problems():
    """Settings for a report (``doctor``): each unusable value becomes a problem and its knob's
    default, instead of an error that would cut the report short.  Returns ``(settings, problems)``."""
    problems = []
    return _resolve({}, config_file_path(), problems), problems


def _resolve(overrides, file_path, problems=None):
    try:
        from_file = _file_values(file_path)
    except ConfigError as exc:
        if problems is None:
            raise
        problems.append(str(exc))
        from_file = {}
    values = {}
    origins = {}
    for name, (env, default, parse) in KNOBS.items():
        if overrides.get(name) is not None:
            values[name], origins[name] = overrides[name], "argument"
            continue
        raw, origin = os.environ.get(env), env
        if raw is None or raw == "":
            raw, origin = from_file.get(name), file_path
        if raw is None or raw == "":
            values[name], origins[name] = default, "default"
            continue
        try:
            values[name] = parse(raw)
        except ValueError as exc:
            error = ConfigError("%s=%r is invalid: %s" % (env if origin == env else name, raw, exc))
            if problems is None:
                raise error
            problems.append(str(error))
            values[name], origins[name] = default, "default (%s is invalid)" % (env if origin == env else name)
            continue
        origins[name] = origin
    if not values["cache_dir"]:
        import platformdirs
        values["cache_dir"] = platformdirs.user_cache_dir("ptxbackend", appauthor=False)
    settings = Settings(values, origins)
    # Environment only (a per-run switch, not a config-file knob): see ptxbackend.deploy.replay.
    settings.record = os.environ.get("PTXBACKEND_RECORD") or None
    settings.compiler_env = tuple("%s=%s" % (name, os.environ[name]) for name in NVCC_ENVIRONMENT
                                  if os.environ.get(name))
    return settings


def configure_logging(level_name):
    """Send ptxbackend's log records to stderr at ``level_name`` (PTXBACKEND_LOG)."""
    logger = _logger
    if _logging_level and _logging_level[0] == (level_name, logger.level, len(logger.handlers)):
        return  # the hit path asks on every compile(); nothing changed since the last call
    level = getattr(logging, str(level_name or "warning").upper(), None)
    if not isinstance(level, int):
        level = logging.WARNING
    logger.setLevel(level)
    if not any(getattr(h, "_ptxbackend", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._ptxbackend = True
        logger.addHandler(handler)
        logger.propagate = False
    _logging_level[:] = [(level_name, logger.level, len(logger.handlers))]
