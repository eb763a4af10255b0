"""cuDNN convolution algorithms on this GPU: the self-test's verdicts and the choice steered by them.

An old cuDNN (7.1 for CUDA 8) on a GPU it has no code for can return success from an algorithm whose
kernels cannot run there, and leave the output unwritten (issue 39: forward algorithm 1 on the H200).
``ptxbackend warm --libs cudnn`` runs every algorithm once per direction and data type on small shapes
(:mod:`ptxbackend.deploy.cudnn_selftest`) and files the verdicts here, as data (JSON, private file);
the start-up hook (:mod:`ptxbackend.hook.cudnn_steering`) then replaces an algorithm that was not
verified good with one that was, and ``doctor`` lists what is steered and why.

A verdict file entry names the library (real path, size, mtime: checked, not trusted), the GPU (name and
compute capability) and the driver; an entry that does not match the library loaded and the GPU in use is
not used.
"""

import ctypes
import json
import os

DIRECTIONS = ("forward", "backward_data", "backward_filter")
#: cudnnConvolution*Algo_t names of cuDNN 7 (for messages; values are what the API takes).
ALGO_NAMES = {
    "forward": ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
                "WINOGRAD_NONFUSED"),
    "backward_data": ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"),
    "backward_filter": ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"),
}
#: What a steered call gets instead, first that is verified good and takes this shape: the plain
#: implicit GEMMs first (no workspace, every shape), then the others.
PREFERENCE = {"forward": (0, 2, 1, 6, 7, 4, 5, 3), "backward_data": (0, 1, 3, 2, 5, 4),
              "backward_filter": (0, 1, 3, 2, 5, 6, 4)}
#: cudnnDataType_t -> the name used in verdicts (Chainer's float16 convolutions compute in float).
DTYPES = {0: "float32", 1: "float64", 2: "float16"}
VERDICTS = ("good", "wrong", "failed", "unsupported")
FILE_NAME = "cudnn-algorithms.json"
SCHEMA = 1
_MAX_FILE = 4 << 20


def algo_name(direction, algo):
    names = ALGO_NAMES.get(direction, ())
    return names[algo] if 0 <= algo < len(names) else "algorithm %d" % algo


def library_identity(path):
    """What names a library file without reading 200 MB: real path, size, mtime."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return {"path": real, "size": st.st_size, "mtime_ns": int(st.st_mtime_ns)}


def verdicts_path(meta_dir):
    return os.path.join(meta_dir, FILE_NAME)


def _valid_entry(entry):
    """An entry as data: every field of the expected type, every verdict a known word."""
    if not isinstance(entry, dict):
        return False
    lib, dev, verdicts = entry.get("library"), entry.get("device"), entry.get("verdicts")
    if not (isinstance(lib, dict) and isinstance(lib.get("path"), str) and isinstance(lib.get("size"), int)
            and isinstance(lib.get("mtime_ns"), int)):
        return False
    if not (isinstance(dev, dict) and isinstance(dev.get("name"), str) and isinstance(dev.get("cc"), list)):
        return False
    if not isinstance(verdicts, dict):
        return False
    for direction, by_dtype in verdicts.items():
        if direction not in DIRECTIONS or not isinstance(by_dtype, dict):
            return False
        for dtype, by_algo in by_dtype.items():
            if dtype not in DTYPES.values() or not isinstance(by_algo, dict):
                return False
            for algo, verdict in by_algo.items():
                if not (isinstance(algo, str) and algo.isdigit() and isinstance(verdict, dict)
                        and verdict.get("verdict") in VERDICTS):
                    return False
    return True


def load(meta_dir):
    """The valid entries of the verdict file ([] when there is none or it is not ours)."""
    path = verdicts_path(meta_dir)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if st.st_size > _MAX_FILE or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            return []
        with os.fdopen(fd, "rb") as handle:
            fd = None
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return []
    finally:
        if fd is not None:
            os.close(fd)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), list):
        return []
    return [e for e in data["entries"] if _valid_entry(e)]


def save(meta_dir, entry):
    """File ``entry`` (replacing the one for the same library file and GPU); private, atomic."""
    from ..files import private
    if not _valid_entry(entry):
        raise ValueError("not a cuDNN verdict entry")
    kept = [e for e in load(meta_dir) if not _same_target(e, entry["library"], entry["device"])]
    kept.append(entry)
    private.make_private_dirs(meta_dir)
    path = verdicts_path(meta_dir)
    private.write_atomic(path, json.dumps({"schema": SCHEMA, "entries": kept}, indent=1,
                                          sort_keys=True).encode("utf-8"))
    return path


def _same_target(entry, library, device):
    lib = entry["library"]
    return (lib["path"] == library["path"] and lib["size"] == library["size"]
            and lib["mtime_ns"] == library["mtime_ns"] and entry["device"]["name"] == device["name"]
            and list(entry["device"]["cc"]) == list(device["cc"]))


def find_entry(entries, library, device):
    for entry in entries:
        if _same_target(entry, library, device):
            return entry
    return None


def good_algorithms(entry):
    """{direction: {dtype: set of algorithms verified good}} from one entry."""
    out = {}
    for direction, by_dtype in entry["verdicts"].items():
        for dtype, by_algo in by_dtype.items():
            out.setdefault(direction, {})[dtype] = set(
                int(a) for a, v in by_algo.items() if v["verdict"] == "good")
    return out


def steered(entry):
    """What the hook steers away from, for doctor: [(direction, dtype, algo, verdict, detail, to)]."""
    rows = []
    good = good_algorithms(entry)
    for direction in DIRECTIONS:
        for dtype, by_algo in sorted(entry["verdicts"].get(direction, {}).items()):
            to = [a for a in PREFERENCE[direction] if a in good[direction][dtype]]
            for algo, verdict in sorted(by_algo.items(), key=lambda kv: int(kv[0])):
                if verdict["verdict"] in ("wrong", "failed"):
                    rows.append((direction, dtype, int(algo), verdict["verdict"], verdict.get("detail", ""),
                                 to[0] if to else None))
    return rows


def describe(entry):
    """Lines for doctor: the entry's target, then each algorithm steered away from and why."""
    lines = ["cuDNN %s on %s (sm_%s), self-tested %s: %d algorithm/type pairs steered away from" % (
        entry.get("cudnn_version", "?"), entry["device"]["name"], "".join(str(c) for c in entry["device"]["cc"]),
        entry.get("tested_at", "?"), len(steered(entry)))]
    for direction, dtype, algo, verdict, detail, to in steered(entry):
        lines.append("  %s %s: algorithm %d (%s) %s%s -> %s" % (
            direction, dtype, algo, algo_name(direction, algo), verdict, " (%s)" % detail if detail else "",
            "algorithm %d (%s)" % (to, algo_name(direction, to)) if to is not None else "NO verified algorithm"))
    return lines


class Library(object):
    """The cuDNN calls steering needs, on the library the process loaded (ctypes, no ownership)."""

    def __init__(self, path):
        self.path = path
        self._lib = ctypes.CDLL(path)
        self._nd = self._lib.cudnnGetTensorNdDescriptor
        self._nd.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_int)]
        self._ws = {}
        for direction, name in (("forward", "cudnnGetConvolutionForwardWorkspaceSize"),
                                ("backward_data", "cudnnGetConvolutionBackwardDataWorkspaceSize"),
                                ("backward_filter", "cudnnGetConvolutionBackwardFilterWorkspaceSize")):
            fn = getattr(self._lib, name)
            fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]
            self._ws[direction] = fn

    def dtype(self, tensor_desc):
        """The data type name of a tensor descriptor, or None when cuDNN will not say."""
        dtype, nb = ctypes.c_int(-1), ctypes.c_int(0)
        dims = (ctypes.c_int * 8)()
        strides = (ctypes.c_int * 8)()
        if self._nd(tensor_desc, 8, ctypes.byref(dtype), ctypes.byref(nb), dims, strides) != 0:
            return None
        return DTYPES.get(dtype.value)

    def workspace(self, direction, handle, a, b, conv, c, algo):
        """The workspace ``algo`` needs for these descriptors, or None when cuDNN refuses the shape."""
        size = ctypes.c_size_t(0)
        if self._ws[direction](handle, a, b, conv, c, algo, ctypes.byref(size)) != 0:
            return None
        return size.value


class Steering(object):
    """Replaces a convolution algorithm that was not verified good on this GPU with one that was.

    ``good``: :func:`good_algorithms` of the matching entry.  ``counts``: {(direction, dtype, from, to): n}
    of this process, for tests and benchmarks.
    """

    def __init__(self, library, good):
        self.library = library
        self.good = good
        self.counts = {}

    def choose(self, direction, algo, dtype_desc, handle, a, b, conv, c, workspace_limit):
        """The algorithm to run instead of ``algo`` (``algo`` itself when it is verified good or when no
        verified algorithm takes the shape).  ``a, b, conv, c``: the descriptors in the order of the
        direction's cudnnGetConvolution*WorkspaceSize."""
        by_dtype = self.good.get(direction)
        if not by_dtype:
            return algo
        dtype = self.library.dtype(dtype_desc)
        good = by_dtype.get(dtype)
        if good is None or algo in good:
            return algo
        for candidate in PREFERENCE[direction]:
            if candidate in good:
                need = self.library.workspace(direction, handle, a, b, conv, c, candidate)
                if need is not None and need <= workspace_limit:
                    key = (direction, dtype, algo, candidate)
                    self.counts[key] = self.counts.get(key, 0) + 1
                    return candidate
        key = (direction, dtype, algo, None)
        if key not in self.counts:  # once per process and kind: the result may be wrong, and nothing else says so
            import logging
            logging.getLogger("ptxbackend").warning(
                "ptxbackend: cuDNN %s %s: algorithm %d (%s) was not found good on this GPU by `warm --libs cudnn`, "
                "and no algorithm that was takes this shape within the workspace limit: its result may be wrong",
                direction, dtype, algo, algo_name(direction, algo))
        self.counts[key] = self.counts.get(key, 0) + 1
        return algo


def device_identity(ordinal=None):
    """The current GPU as verdict files name it: ``{"name": "NVIDIA H200", "cc": [9, 0]}``."""
    from . import driver
    if ordinal is None:
        ordinal = driver.current_device()
    return {"name": driver.device_name(ordinal), "cc": list(divmod(driver.compute_capability(ordinal), 10))}
