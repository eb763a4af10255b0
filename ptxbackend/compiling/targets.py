"""Compute targets: parsing target strings and choosing what to build.

A *target* is what the compiler is asked to emit:

* ``compute_86``: PTX for virtual architecture 8.6; the driver JIT-compiles it
  for whatever GPU loads it (any compute capability >= 8.6).
* ``sm_86``: SASS (a cubin) for compute capability 8.6 only.
* ``sm_61,compute_61``: a fatbin carrying both, so one image serves an old GPU
  natively and newer ones through the JIT.

The policy words ``auto`` and ``native`` are resolved against the device's
compute capability and the architectures the installed compiler knows.
"""

import re

from ..errors import TargetError

AUTO = "auto"
NATIVE = "native"

_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")
_CC_RE = re.compile(r"^(\d{1,2})\.(\d)(\+ptx)?$")


# Above every compute capability NVIDIA has made (12.x in 2026), with room for the next generations.
MAX_CC = 199


def format_cc(arch):
    """``86`` -> ``'8.6'``, ``120`` -> ``'12.0'``."""
    return "%d.%d" % (arch // 10, arch % 10)


def parse_cc(text):
    """Parse a compute capability given as ``9.0``, ``90`` or ``sm_90`` into ``90``."""
    raw = str(text).strip().lower()
    match = _CC_RE.match(raw)
    value = None
    if match and not match.group(3):
        value = int(match.group(1)) * 10 + int(match.group(2))
    else:
        match = _ARCH_RE.match(raw)
        if match and not match.group(3):
            value = int(match.group(2))
        elif raw.isdigit() and 2 <= len(raw) <= 3:
            value = int(raw)
    if value is not None and 10 <= value <= MAX_CC:
        return value
    if value is not None:
        raise TargetError(
            "%r is not the compute capability of any NVIDIA GPU (1.0 to %s); check the number "
            "(PTXBACKEND_DEVICE_CC / --device-cc)" % (text, format_cc(MAX_CC)))
    raise TargetError(
        "%r is not a compute capability; write it as 9.0, 90 or sm_90 "
        "(PTXBACKEND_DEVICE_CC / --device-cc)" % (text,))


class Target(object):
    """A concrete build target: one or more ``(kind, arch, suffix)`` parts.

    ``kind`` is ``'sm'`` (SASS) or ``'compute'`` (PTX); ``arch`` is an int such
    as 86; ``suffix`` is ``''`` or an architecture-specific ``'a'``/``'f'``.
    """

    __slots__ = ("parts",)

    def __init__(self, parts):
        seen = []
        for part in parts:
            if part not in seen:
                seen.append(part)
        if not seen:
            raise TargetError("a target needs at least one architecture")
        self.parts = tuple(seen)

    @property
    def output_kind(self):
        """``'ptx'``, ``'cubin'`` or ``'fatbin'``."""
        if len(self.parts) > 1:
            return "fatbin"
        return "ptx" if self.parts[0][0] == "compute" else "cubin"

    @property
    def virtual_archs(self):
        return tuple(p[1] for p in self.parts if p[0] == "compute")

    @property
    def real_archs(self):
        return tuple(p[1] for p in self.parts if p[0] == "sm")

    def runs_on(self, device_cc):
        """Whether some part of this target can execute on a device of ``device_cc``.

        SASS runs on the same major version with an equal or higher minor; PTX
        runs on anything at least as new (the driver JIT-compiles it).
        Architecture-specific (``a``/``f``) code is only trusted on the exact arch.
        """
        for kind, arch, suffix in self.parts:
            if suffix:
                if arch == device_cc:
                    return True
            elif kind == "sm":
                if arch // 10 == device_cc // 10 and arch <= device_cc:
                    return True
            elif arch <= device_cc:
                return True
        return False

    def part_for(self, device_cc):
        """The part a device of ``device_cc`` would use (SASS preferred, as the driver does)."""
        sass = [p for p in self.parts if p[0] == "sm" and Target([p]).runs_on(device_cc)]
        if sass:
            return "%s_%d%s" % max(sass, key=lambda p: p[1])
        ptx = [p for p in self.parts if p[0] == "compute" and Target([p]).runs_on(device_cc)]
        if ptx:
            return "%s_%d%s" % max(ptx, key=lambda p: p[1])
        return None

    def __str__(self):
        return ",".join("%s_%d%s" % part for part in self.parts)

    def __repr__(self):
        return "Target(%r)" % str(self)

    def __eq__(self, other):
        return isinstance(other, Target) and self.parts == other.parts

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self.parts)


def parse_target(spec):
    """Parse a target string.

    Returns ``'auto'``, ``'native'`` or a :class:`Target`.  Accepted forms:
    ``auto``, ``native``, ``compute_XY``, ``sm_XY``, ``X.Y`` (same as
    ``sm_XY``), ``X.Y+PTX`` (``sm_XY,compute_XY``) and comma-separated lists
    of these for a fatbin.
    """
    if isinstance(spec, Target):
        return spec
    text = str(spec).strip().lower()
    if text in (AUTO, NATIVE):
        return text
    parts = []
    for item in [t.strip() for t in text.replace(";", ",").split(",")]:
        if not item:
            continue
        match = _ARCH_RE.match(item)
        if match:
            parts.append((match.group(1), int(match.group(2)), match.group(3)))
            continue
        match = _CC_RE.match(item)
        if match:
            arch = int(match.group(1)) * 10 + int(match.group(2))
            parts.append(("sm", arch, ""))
            if match.group(3):
                parts.append(("compute", arch, ""))
            continue
        raise TargetError(
            "unknown target %r in %r. Use auto, native, compute_XY (PTX, e.g. compute_75), sm_XY "
            "(cubin), X.Y, X.Y+PTX, or a comma list such as sm_61,compute_61 "
            "(fatbin)." % (item, str(spec)))
    if not parts:
        raise TargetError("empty target %r; use auto, or e.g. compute_75" % (str(spec),))
    return Target(parts)


def _range_text(identity):
    archs = sorted(set(identity.virtual_archs) | set(identity.real_archs))
    if not archs:
        return "no architectures"
    return "sm_%d..sm_%d" % (archs[0], archs[-1])


def choose_target(spec, identity, device_cc):
    """Resolve ``spec`` to a concrete :class:`Target`.

    Args:
        spec: a target string or :class:`Target`.
        identity: the compiler's :class:`~ptxbackend.compilers.CompilerIdentity`
            (what it can emit).
        device_cc: the device's compute capability as an int (86), or ``None``
            when unknown (then ``auto``/``native`` cannot be resolved).

    Returns:
        ``(target, reason)`` where ``reason`` explains the choice in one line.
    """
    parsed = parse_target(spec)
    tool = "%s %s" % (identity.kind, identity.version)
    if parsed in (AUTO, NATIVE):
        if device_cc is None:
            raise TargetError(
                "target %r needs the device's compute capability, and no CUDA device was "
                "found. On a build box, say which GPU the kernels are for: "
                "PTXBACKEND_DEVICE_CC=7.5 (or --device-cc 7.5 / device_cc='7.5'), or give "
                "an explicit target such as compute_75." % parsed)
        if device_cc in identity.real_archs:
            return (Target([("sm", device_cc, "")]),
                    "%s knows sm_%d: native SASS, no JIT at load" % (tool, device_cc))
        if parsed == NATIVE:
            raise TargetError(
                "target 'native' needs SASS for the device (compute capability %s), but %s "
                "can emit only %s. Use target 'auto' (PTX that the driver JIT-compiles) or "
                "a newer toolkit." % (format_cc(device_cc), tool, _range_text(identity)))
        older = [a for a in identity.virtual_archs if a <= device_cc]
        if older:
            best = max(older)
            return (Target([("compute", best, "")]),
                    "%s does not know sm_%d; PTX for compute_%d, JIT-compiled by the driver"
                    % (tool, device_cc, best))
        raise TargetError(
            "no target of %s runs on this device: the device has compute capability %s "
            "(sm_%d), the toolkit only knows %s, all newer than the device. Remedy: use "
            "a toolkit that still supports sm_%d (point PTXBACKEND_NVCC or PTXBACKEND_NVRTC "
            "at it), or build on another machine and import the cache there."
            % (tool, format_cc(device_cc), device_cc, _range_text(identity), device_cc))
    if device_cc is not None and not parsed.runs_on(device_cc):
        raise TargetError(
            "target %s cannot run on the device (compute capability %s): SASS runs only "
            "on its own major version, PTX only on devices at least as new. %s"
            % (parsed, format_cc(device_cc), _suggestion(identity, device_cc)))
    unknown = [p for p in parsed.parts if not p[2]
               and p[1] not in (identity.virtual_archs if p[0] == "compute" else identity.real_archs)]
    if unknown and identity.archs_reliable:
        raise TargetError(
            "%s cannot build %s: it knows %s. %s" % (tool, ",".join("%s_%d%s" % p for p in unknown),
                                                     _range_text(identity), _suggestion(identity, device_cc)))
    return parsed, "explicit target %s" % parsed


def _suggestion(identity, device_cc):
    """What to use instead: only a target this compiler can build *and* the device can run."""
    runnable = [a for a in identity.virtual_archs if device_cc is None or a <= device_cc]
    if runnable:
        return ("Use a target it can build that runs there, e.g. compute_%d (the driver JIT-compiles it), "
                "or leave the target at 'auto'." % max(runnable))
    return ("No target it can build runs on compute capability %s: use a toolkit that still supports "
            "it (PTXBACKEND_NVCC, or NVRTC with PTXBACKEND_COMPILER=nvrtc)." % format_cc(device_cc))
