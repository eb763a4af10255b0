"""CuPy v2-v14: the argument binder and option handling against the real function the hook replaces.

The sources are ``cupy/cuda/compiler.py`` of the wheels of the last release of each line the hook
claims: 7.8.0 and 9.6.0 (v2-v9: ``compile_with_cache``), 10.6.0, 11.6.0, 12.3.0, 13.6.0 and 14.2.0 (v10+:
``_compile_module_with_cache``), most of which install on neither CI Python: ``python
tests/cupy_sources.py DIR`` fetches them (CI does) and PTXBACKEND_TEST_CUPY_SOURCES=DIR points here.
Nothing of CuPy is copied into these tests: the signature of the replaced function, the options
``_compile_with_cache_cuda`` and NVRTC's compile add and CuPy's relocatable-device-code flags are read
from those files with ``ast``, so a release that moves or renames a parameter fails here.
"""

import ast
import inspect
import io
import os
import types

import pytest

import cupy_sources
from conftest import _missing
from ptxbackend.hook import cupy_integration as ci

DEBUG_VARIABLE = "CUPY_CUDA_COMPILE_WITH_DEBUG"
SRC = 'extern "C" __global__ void k() {}'
V2V9 = ("7.8.0", "9.6.0")
V10 = ("10.6.0", "11.6.0", "12.3.0", "13.6.0", "14.2.0")
ALL = V2V9 + V10
V14 = ("14.2.0",)  # v14.1 dropped cache_dir and made arch and the rest keyword-only
BEFORE_V14 = tuple(v for v in ALL if v not in V14)

# What each file must declare, so that a wrong file is caught: (name, kind, default) per parameter.
POSITIONAL = [("source", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
              ("options", "POSITIONAL_OR_KEYWORD", ()), ("arch", "POSITIONAL_OR_KEYWORD", None),
              ("cache_dir", "POSITIONAL_OR_KEYWORD", None), ("extra_source", "POSITIONAL_OR_KEYWORD", None),
              ("backend", "POSITIONAL_OR_KEYWORD", "nvrtc")]
KEYWORD_ONLY = [("enable_cooperative_groups", "KEYWORD_ONLY", False), ("name_expressions", "KEYWORD_ONLY", None),
                ("log_stream", "KEYWORD_ONLY", None), ("jitify", "KEYWORD_ONLY", False)]
EXPECTED_PARAMETERS = dict([("7.8.0", POSITIONAL)] + [(v, POSITIONAL + KEYWORD_ONLY) for v in ALL[1:-1]] + [
    ("14.2.0", POSITIONAL[:2] + [("arch", "KEYWORD_ONLY", None), ("extra_source", "KEYWORD_ONLY", None),
                                 ("backend", "KEYWORD_ONLY", "nvrtc")]
     + KEYWORD_ONLY + [("to_ltoir", "KEYWORD_ONLY", False)])])
# Stands for the include options CuPy 13 works out at run time (`options += _get_extra_include_dir_opts()`).
INCLUDES = ("-I/site-packages/nvidia/cuda_runtime/include",)


class Source(object):
    """One CuPy version's compiler.py, parsed."""

    def __init__(self, version, path):
        self.version = version
        self.path = path
        with open(path, "rb") as handle:
            self.tree = ast.parse(handle.read(), path)
        self.gen = "v2-v9" if version in V2V9 else "v10+"
        self.entry = ci._entry_point(self.gen)  # the function the hook replaces
        self.compile_with_cache = self.function_like(self.entry)
        self.signature = inspect.signature(self.compile_with_cache)

    @property
    def defined(self):
        """Every name the module defines at its top level or in a function or class."""
        names = set(n.name for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        return names

    def definition(self, name):
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        pytest.fail("%s defines no module-level function %s" % (self.path, name))

    def function_like(self, name):
        """A function with exactly the signature of CuPy's ``name`` that returns its arguments."""
        node = self.definition(name)
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            ast.literal_eval(default)  # literals only: nothing of CuPy is evaluated
        template = ast.parse("def %s():\n    return dict(locals())\n" % name)
        template.body[0].args = node.args
        namespace = {}
        exec(compile(template, self.path, "exec"), namespace)
        return namespace[name]

    def function(self, name, namespace):
        """CuPy's own ``name`` (for a small pure helper), executed in ``namespace``."""
        exec(compile(ast.Module(body=[self.definition(name)], type_ignores=[]), self.path, "exec"), namespace)
        return namespace[name]


@pytest.fixture(scope="module", params=ALL)
def cupy(request):
    root = os.environ.get("PTXBACKEND_TEST_CUPY_SOURCES")
    path = os.path.join(root, request.param, "compiler.py") if root else ""
    if not os.path.isfile(path):
        _missing("CuPy %s's compiler.py (run `python tests/cupy_sources.py DIR` and set "
                 "PTXBACKEND_TEST_CUPY_SOURCES=DIR)" % request.param)
    if cupy_sources.sha256_of(path) != cupy_sources.WHEELS[request.param][2]:
        pytest.fail("%s is not the compiler.py of the CuPy %s wheel (sha256 differs from "
                    "tests/cupy_sources.py's pin)" % (path, request.param))
    return Source(request.param, path)


def compiler_module(source, is_hip=False, nvrtc=(11, 7)):
    """A stand-in ``cupy.cuda.compiler`` (the real one imports CuPy's compiled extensions) holding the
    replaced function, under its name (v2-v9 have no _compile_module_with_cache, none has nvcc), and what
    the hook reads of the module besides: NVRTC's version, CuPy 13's extra include options."""
    module = types.ModuleType("cupy.cuda.compiler")
    setattr(module, source.entry, source.compile_with_cache)
    module._get_nvrtc_version = lambda: nvrtc
    if "_get_extra_include_dir_opts" in source.defined:
        module._get_extra_include_dir_opts = lambda: INCLUDES
    # _needs_cupy reads `runtime.is_hip` (the real module's `runtime` is cupy.cuda.runtime, a compiled
    # extension that cannot be imported here); CUDA's answer, or HIP's.
    module.runtime = types.SimpleNamespace(is_hip=is_hip)
    return module


def test_signature_is_cupys(cupy):
    parameters = [(p.name, p.kind.name, p.default) for p in cupy.signature.parameters.values()]
    assert parameters == EXPECTED_PARAMETERS[cupy.version]
    assert cupy.compile_with_cache(SRC) == dict((n, SRC if d is inspect.Parameter.empty else d)
                                                for n, _, d in parameters)


def test_generation(cupy):
    defined = cupy.defined
    assert "nvcc" not in defined
    if cupy.gen == "v2-v9":
        assert "compile_with_cache" in defined and "_compile_module_with_cache" not in defined
    else:
        assert "_compile_module_with_cache" in defined
    assert ci.generation(compiler_module(cupy)) == cupy.gen


def test_v10_public_name_calls_the_replaced_one(cupy):
    """CuPy 10-12 keep ``compile_with_cache`` as a deprecated wrapper that looks the replaced function up
    at call time, so the hook serves it without replacing it too; 13 removed it."""
    if cupy.gen == "v2-v9" or "compile_with_cache" not in cupy.defined:
        assert cupy.gen == "v2-v9" or cupy.version in ("13.6.0", "14.2.0")
        return
    node = cupy.definition("compile_with_cache")
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == cupy.entry]
    assert [n for n in node.body if isinstance(n, ast.Return) and n.value in calls], \
        "%s: compile_with_cache no longer returns %s(...)" % (cupy.path, cupy.entry)


def test_names_the_hook_reads_from_cupys_module_are_there(cupy):
    """What the hook uses of ``cupy.cuda.compiler`` besides the replaced function: ``function`` (to load
    a kernel as CuPy does), ``runtime`` (HIP, the device's context), ``_get_nvrtc_version``; from 9 on,
    ``_use_ptx``, ``_get_arch`` and ``device``, read with getattr before a call goes to CuPy: renamed, they
    would silently leave CuPy building SASS the GPU cannot run."""
    wanted = {"function", "runtime", "_get_nvrtc_version"}
    if cupy.version != "7.8.0":
        wanted |= {"_use_ptx", "_get_arch", "device"}
    assert wanted - cupy.defined == set(), cupy.path


def test_every_parameter_is_understood(cupy):
    assert ci._unknown_parameters(cupy.signature) == ()


CALLS = [  # (id, args, kwargs, raises TypeError on): bound by ptxbackend exactly as by CuPy
    ("source", (SRC,), {}, ()),
    ("positional", (SRC, ("-O",), "80", "/tmp/x", "extra", "nvrtc"), {}, V14),
    # what cupy/_core/core.pyx passes in v10-v13 (v14: arch=..., extra_source=..., backend=...)
    ("core-v10", (SRC, ("-O",), None, None, "extra", "nvrtc"), {"enable_cooperative_groups": False,
                                                               "name_expressions": None, "log_stream": None,
                                                               "jitify": False}, ("7.8.0",) + V14),
    ("core-v14", (SRC, ("-O",)), {"arch": None, "extra_source": "extra", "backend": "nvrtc",
                                  "enable_cooperative_groups": False, "name_expressions": None,
                                  "log_stream": None, "jitify": False}, ("7.8.0",)),
    ("arch-positional", (SRC, ("-O",), "80"), {}, V14),
    ("keywords", (), {"source": SRC, "options": ("-O",), "arch": "80", "backend": "nvcc"}, ()),
    ("mixed", (SRC, ("-O",)), {"cache_dir": "/tmp/x", "extra_source": "extra"}, V14),
    ("keyword-only", (SRC,), {"jitify": True, "name_expressions": ("k",), "log_stream": None,
                              "enable_cooperative_groups": True}, ("7.8.0",)),
    ("to_ltoir", (SRC,), {"to_ltoir": True}, BEFORE_V14),
    ("too-many-positional", (SRC, (), None, None, None, "nvrtc", False), {}, ALL),  # 9.6+: keyword-only
    ("unknown-keyword", (SRC,), {"bogus": 1}, ALL),
    ("duplicate", (SRC, ("-O",)), {"options": ()}, ALL),
    ("duplicate-source", (SRC,), {"source": SRC}, ALL),
    ("missing-source", (), {"options": ()}, ALL),
    ("nothing", (), {}, ALL),
]


@pytest.mark.parametrize("args, kwargs, fails_on", [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_binder_binds_as_cupy(cupy, args, kwargs, fails_on):
    bind = ci._binder(cupy.signature)
    try:
        expected = cupy.compile_with_cache(*args, **kwargs)
    except TypeError:
        assert cupy.version in fails_on, "CuPy %s refuses this call" % cupy.version
        with pytest.raises(TypeError):
            bind(args, kwargs)
        return
    assert cupy.version not in fails_on, "CuPy %s accepts this call" % cupy.version
    assert dict(bind(args, kwargs)) == expected


NEEDS_CUPY = [  # (id, kwargs, versions having those arguments, None (served) or a word of the reason)
    ("plain", {}, ALL, None),
    ("options", {"options": ("-DN=1", "--use_fast_math")}, ALL, None),
    ("nvcc", {"backend": "nvcc"}, ALL, None),
    ("arch", {"arch": "80"}, ALL, None),  # ptxbackend builds for its own target
    ("extra_source", {"extra_source": "// CuPy's headers"}, ALL, None),  # a cache-key input only
    ("cache_dir", {"cache_dir": "/tmp/x"}, BEFORE_V14, None),
    ("rdc", {"options": ("-rdc=true",)}, ALL, "relocatable"),
    ("jitify-option", {"options": ("-DCUPY_USE_JITIFY",)}, ALL, "jitify"),  # 7.8: harmless
    ("jitify", {"jitify": True}, ALL[1:], "jitify"),
    ("name_expressions", {"name_expressions": ("k",)}, ALL[1:], "name_expressions"),
    ("log_stream", {"log_stream": io.StringIO()}, ALL[1:], "log_stream"),
    ("cooperative-groups", {"enable_cooperative_groups": True}, ALL[1:], "cooperative"),
    ("to_ltoir", {"to_ltoir": True}, V14, "LTO"),
    ("hipcc", {"backend": "hipcc"}, ALL, "backend"),
    ("keyword-only-defaults", {"enable_cooperative_groups": False, "name_expressions": None,
                               "log_stream": None, "jitify": False}, ALL[1:], None),
    ("v14-defaults", {"to_ltoir": False}, V14, None),
]


@pytest.mark.parametrize("kwargs, versions, reason", [c[1:] for c in NEEDS_CUPY], ids=[c[0] for c in NEEDS_CUPY])
def test_needs_cupy(cupy, kwargs, versions, reason):
    bind = ci._binder(cupy.signature)
    if cupy.version not in versions:  # an argument this CuPy lacks: refused, as CuPy refuses it
        with pytest.raises(TypeError):
            cupy.compile_with_cache(SRC, **kwargs)
        with pytest.raises(TypeError):
            bind((SRC,), kwargs)
        return
    call = bind((SRC,), kwargs)
    got = ci._needs_cupy(compiler_module(cupy), ci._unknown_parameters(cupy.signature), call)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_cupys_rdc_flags_and_hip_go_to_cupy(cupy):
    flags = [ast.literal_eval(n.value) for n in cupy.tree.body if isinstance(n, ast.Assign)
             and [getattr(t, "id", None) for t in n.targets] == ["_rdc_flags"]]
    assert len(flags) == 1 and flags[0], "%s: no `_rdc_flags = (...)` at module level" % cupy.path
    unknown = ci._unknown_parameters(cupy.signature)
    for flag in flags[0]:
        call = ci._binder(cupy.signature)((SRC, ("-DN=1", flag)), {})
        assert "relocatable" in (ci._needs_cupy(compiler_module(cupy), unknown, call) or ""), flag
    call = ci._binder(cupy.signature)((SRC,), {})
    assert ci._needs_cupy(compiler_module(cupy, is_hip=True), unknown, call) == "HIP"


def _strings(node):
    return [ast.literal_eval(n) for n in ast.walk(node) if type(n).__name__ in ("Str", "Constant")]


def _added_options(cupy):
    """``(added, debug_test)``: ``added(debug)`` is what ``_compile_with_cache_cuda`` appends to the
    options at its top level, in its order, with its CUPY_CUDA_COMPILE_WITH_DEBUG branch taken or not;
    ``debug_test`` is that branch's condition.  Other branches (cooperative groups, jitify, LTO IR) are
    calls the hook hands to CuPy."""
    function = cupy.definition("_compile_with_cache_cuda")

    def appended(statement):
        if not (isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add)
                and getattr(statement.target, "id", None) == "options"):
            return ()
        value = statement.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "_get_extra_include_dir_opts" \
                and not value.args and not value.keywords:
            return INCLUDES  # CuPy 13: -I of the CUDA headers of a conda or wheel install (CUDA >= 12.2)
        try:
            return tuple(ast.literal_eval(value))
        except ValueError:
            pytest.fail("%s:%d: options += something ptxbackend does not add" % (cupy.path, statement.lineno))

    branches = [s for s in function.body if isinstance(s, ast.If) and DEBUG_VARIABLE in _strings(s.test)]
    if not sum((appended(s) for s in function.body), ()) or len(branches) != 1:
        pytest.fail("%s: _compile_with_cache_cuda no longer has the expected shape (`options += (...)` at "
                    "its top level, one `if ...%s...:` branch)" % (cupy.path, DEBUG_VARIABLE))
    if not sum((appended(s) for s in branches[0].body), ()):
        pytest.fail("%s: the %s branch adds no constant options" % (cupy.path, DEBUG_VARIABLE))

    def added(debug):
        options = ()
        for statement in function.body:
            options += appended(statement)
            if statement is branches[0] and debug:
                options += sum((appended(s) for s in statement.body), ())
        return options
    return added, branches[0].test


def test_options_added_as_cupy_adds_them(cupy, monkeypatch):
    added, _ = _added_options(cupy)
    module = compiler_module(cupy)
    for kind in ("nvrtc", "nvcc"):
        monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
        assert ci._cupy_options(module, cupy.gen, kind) == added(False)
        monkeypatch.setenv(DEBUG_VARIABLE, "1")
        assert ci._cupy_options(module, cupy.gen, kind) == added(True)


@pytest.mark.parametrize("value", [
    None, "", "1", "0", "2", " 1", "01", "true", "1.0",
    "+1", "\u00b2",
])
def test_debug_variable_read_as_cupy_reads_it(cupy, monkeypatch, value):
    added, test = _added_options(cupy)
    # CuPy's own condition, evaluated with CuPy's own reader of the variable.
    namespace = {"os": os}
    cupy.function("_get_bool_env_variable", namespace)
    if value is None:
        monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEBUG_VARIABLE, value)
    condition = eval(compile(ast.Expression(body=test), cupy.path, "eval"), namespace)
    assert ci._cupy_options(compiler_module(cupy), cupy.gen, "nvrtc") == added(bool(condition))


DEFAULT_DEVICE = "--device-as-default-execution-space"
# The NVRTC versions each line runs with: CuPy 10 predates CUDA 12, CuPy 14 requires it.
NVRTC = dict([(v, ((11, 7), (12, 0))) for v in ALL] + [("10.6.0", ((11, 7),)), ("14.2.0", ((12, 0), (13, 0)))])


def test_nvrtc_options_added_as_cupy_adds_them(cupy, monkeypatch):
    """The option CuPy 11+ adds inside its NVRTC compile (below the replaced function), under the
    condition CuPy tests (NVRTC >= 12 in 11-13, any non-HIP compile in 14), evaluated here."""
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    added, _ = _added_options(cupy)
    tests = [n.test for n in ast.walk(cupy.tree) if isinstance(n, ast.If)
             and any(DEFAULT_DEVICE in _strings(s) for s in n.body if isinstance(s, ast.AugAssign))]
    assert len(tests) == (0 if cupy.version in ("7.8.0", "9.6.0", "10.6.0") else 1), cupy.path
    for nvrtc in NVRTC[cupy.version]:
        namespace = {"major_version": nvrtc[0], "minor_version": nvrtc[1],
                     "runtime": types.SimpleNamespace(is_hip=False)}
        cupys = tests and eval(compile(ast.Expression(body=tests[0]), cupy.path, "eval"), namespace)
        expected = added(False) + ((DEFAULT_DEVICE,) if cupys else ())
        assert ci._cupy_options(compiler_module(cupy, nvrtc=nvrtc), cupy.gen, "nvrtc") == expected, nvrtc
        assert ci._cupy_options(compiler_module(cupy, nvrtc=nvrtc), cupy.gen, "nvcc") == added(False)


def test_replacement_looks_like_cupys_function(cupy):
    original = cupy.compile_with_cache
    replacement = ci._make_replacement(compiler_module(cupy), cupy.gen, original)
    assert replacement is not original
    assert (replacement.__name__, replacement.__qualname__, replacement.__doc__) == \
        (cupy.entry, original.__qualname__, original.__doc__)
    assert inspect.signature(replacement) == cupy.signature
    # Calls ptxbackend does not serve reach the original unchanged (no GPU or compiler involved).
    assert replacement(SRC, ("-rdc=true",), backend="nvcc") == original(SRC, ("-rdc=true",), backend="nvcc")
    if cupy.version != "7.8.0":
        assert replacement(SRC, name_expressions=("k",)) == original(SRC, name_expressions=("k",))
    with pytest.raises(TypeError) as ours:
        replacement(SRC, bogus=1)
    with pytest.raises(TypeError) as theirs:
        original(SRC, bogus=1)
    assert str(ours.value) == str(theirs.value)  # CuPy's function words the error
