"""CuPy v2-v9: the argument binder and option handling against the real ``compile_with_cache``.

The sources are ``cupy/cuda/compiler.py`` of the CuPy 7.8.0 (cupy-cuda80) and 9.6.0 (cupy-cuda111)
wheels, which install on neither CI Python: ``python tests/cupy_sources.py DIR`` fetches them (CI does)
and PTXBACKEND_TEST_CUPY_SOURCES=DIR points here.  Nothing of CuPy is copied into these tests: the
signature of ``compile_with_cache``, the options ``_compile_with_cache_cuda`` adds and CuPy's
relocatable-device-code flags are read from those files with ``ast``.
"""

import ast
import inspect
import io
import os
import types

import pytest

import cupy_sources
from conftest import _missing
from ptxbackend import cupy_integration as ci

DEBUG_VARIABLE = "CUPY_CUDA_COMPILE_WITH_DEBUG"
SRC = 'extern "C" __global__ void k() {}'
BOTH = ("7.8.0", "9.6.0")

# What each file must declare, so that a wrong file is caught: (name, kind, default) per parameter.
POSITIONAL = [("source", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
              ("options", "POSITIONAL_OR_KEYWORD", ()), ("arch", "POSITIONAL_OR_KEYWORD", None),
              ("cache_dir", "POSITIONAL_OR_KEYWORD", None), ("extra_source", "POSITIONAL_OR_KEYWORD", None),
              ("backend", "POSITIONAL_OR_KEYWORD", "nvrtc")]
EXPECTED_PARAMETERS = {
    "7.8.0": POSITIONAL,
    "9.6.0": POSITIONAL + [("enable_cooperative_groups", "KEYWORD_ONLY", False),
                           ("name_expressions", "KEYWORD_ONLY", None), ("log_stream", "KEYWORD_ONLY", None),
                           ("jitify", "KEYWORD_ONLY", False)],
}


class Source(object):
    """One CuPy version's compiler.py, parsed."""

    def __init__(self, version, path):
        self.version = version
        self.path = path
        with open(path, "rb") as handle:
            self.tree = ast.parse(handle.read(), path)
        self.compile_with_cache = self.function_like("compile_with_cache")
        self.signature = inspect.signature(self.compile_with_cache)

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


@pytest.fixture(scope="module", params=BOTH)
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


def compiler_module(source, is_hip=False):
    """A stand-in ``cupy.cuda.compiler``: the real modules have no _compile_module_with_cache, no nvcc."""
    module = types.ModuleType("cupy.cuda.compiler")
    module.compile_with_cache = source.compile_with_cache
    # _needs_cupy reads `runtime.is_hip` (the real module's `runtime` is cupy.cuda.runtime, a compiled
    # extension that cannot be imported here); CUDA's answer, or HIP's.
    module.runtime = types.SimpleNamespace(is_hip=is_hip)
    return module


def test_signature_is_cupys(cupy):
    parameters = [(p.name, p.kind.name, p.default) for p in cupy.signature.parameters.values()]
    assert parameters == EXPECTED_PARAMETERS[cupy.version]
    assert cupy.compile_with_cache(SRC) == dict((n, SRC if d is inspect.Parameter.empty else d)
                                                for n, _, d in parameters)


def test_generation_is_v2_v9(cupy):
    defined = set(n.name for n in ast.walk(cupy.tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    for node in cupy.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    assert "compile_with_cache" in defined
    assert "_compile_module_with_cache" not in defined and "nvcc" not in defined
    assert ci.generation(compiler_module(cupy)) == "v2-v9"


def test_every_parameter_is_understood(cupy):
    assert ci._unknown_parameters(cupy.signature) == ()


CALLS = [  # (id, args, kwargs, raises TypeError on): bound by ptxbackend exactly as by CuPy
    ("source", (SRC,), {}, ()),
    ("positional", (SRC, ("-O",), "80", "/tmp/x", "extra", "nvrtc"), {}, ()),
    ("keywords", (), {"source": SRC, "options": ("-O",), "arch": "80", "backend": "nvcc"}, ()),
    ("mixed", (SRC, ("-O",)), {"cache_dir": "/tmp/x", "extra_source": "extra"}, ()),
    ("keyword-only", (SRC,), {"jitify": True, "name_expressions": ("k",), "log_stream": None,
                              "enable_cooperative_groups": True}, ("7.8.0",)),
    ("too-many-positional", (SRC, (), None, None, None, "nvrtc", False), {}, BOTH),  # 9.6: keyword-only
    ("unknown-keyword", (SRC,), {"bogus": 1}, BOTH),
    ("duplicate", (SRC, ("-O",)), {"options": ()}, BOTH),
    ("duplicate-source", (SRC,), {"source": SRC}, BOTH),
    ("missing-source", (), {"options": ()}, BOTH),
    ("nothing", (), {}, BOTH),
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
    ("plain", {}, BOTH, None),
    ("options", {"options": ("-DN=1", "--use_fast_math")}, BOTH, None),
    ("nvcc", {"backend": "nvcc"}, BOTH, None),
    ("rdc", {"options": ("-rdc=true",)}, BOTH, "relocatable"),
    ("jitify-option", {"options": ("-DCUPY_USE_JITIFY",)}, BOTH, "jitify"),  # 7.8: harmless
    ("jitify", {"jitify": True}, ("9.6.0",), "jitify"),
    ("name_expressions", {"name_expressions": ("k",)}, ("9.6.0",), "name_expressions"),
    ("log_stream", {"log_stream": io.StringIO()}, ("9.6.0",), "log_stream"),
    ("cooperative-groups", {"enable_cooperative_groups": True}, ("9.6.0",), "cooperative"),
    ("keyword-only-defaults", {"enable_cooperative_groups": False, "name_expressions": None,
                               "log_stream": None, "jitify": False}, ("9.6.0",), None),
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
    """``(always, debug, debug_test)``: the constant options ``_compile_with_cache_cuda`` adds
    unconditionally, those it adds under its CUPY_CUDA_COMPILE_WITH_DEBUG branch, that branch's test."""
    function = cupy.definition("_compile_with_cache_cuda")

    def added(statement):
        if isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add) \
                and getattr(statement.target, "id", None) == "options":
            try:
                return tuple(ast.literal_eval(statement.value))
            except ValueError:
                pytest.fail("%s:%d: options += something not constant" % (cupy.path, statement.lineno))
        return ()

    always = sum((added(s) for s in function.body), ())
    branches = [s for s in function.body if isinstance(s, ast.If) and DEBUG_VARIABLE in _strings(s.test)]
    if not always or len(branches) != 1:
        pytest.fail("%s: _compile_with_cache_cuda no longer has the expected shape (`options += (...)` at "
                    "its top level, one `if ...%s...:` branch)" % (cupy.path, DEBUG_VARIABLE))
    debug = sum((added(s) for s in branches[0].body), ())
    if not debug:
        pytest.fail("%s: the %s branch adds no constant options" % (cupy.path, DEBUG_VARIABLE))
    return always, debug, branches[0].test


def test_options_added_as_cupy_adds_them(cupy, monkeypatch):
    always, debug, _ = _added_options(cupy)
    module = compiler_module(cupy)
    for kind in ("nvrtc", "nvcc"):
        monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
        assert ci._cupy_options(module, "v2-v9", kind) == always
        monkeypatch.setenv(DEBUG_VARIABLE, "1")
        assert ci._cupy_options(module, "v2-v9", kind) == always + debug


@pytest.mark.parametrize("value", [
    None, "", "1", "0", "2", " 1", "01", "true", "1.0",
    "+1", "\u00b2",
])
def test_debug_variable_read_as_cupy_reads_it(cupy, monkeypatch, value):
    always, debug, test = _added_options(cupy)
    # CuPy's own condition, evaluated with CuPy's own reader of the variable.
    namespace = {"os": os}
    cupy.function("_get_bool_env_variable", namespace)
    if value is None:
        monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEBUG_VARIABLE, value)
    condition = eval(compile(ast.Expression(body=test), cupy.path, "eval"), namespace)
    assert ci._cupy_options(compiler_module(cupy), "v2-v9", "nvrtc") == always + (debug if condition else ())


def test_replacement_looks_like_cupys_function(cupy):
    original = cupy.compile_with_cache
    replacement = ci._make_replacement(compiler_module(cupy), "v2-v9", original)
    assert replacement is not original
    assert (replacement.__name__, replacement.__qualname__, replacement.__doc__) == \
        ("compile_with_cache", original.__qualname__, original.__doc__)
    assert inspect.signature(replacement) == cupy.signature
    # Calls ptxbackend does not serve reach the original unchanged (no GPU or compiler involved).
    assert replacement(SRC, ("-rdc=true",), backend="nvcc") == original(SRC, ("-rdc=true",), backend="nvcc")
    if cupy.version == "9.6.0":
        assert replacement(SRC, name_expressions=("k",)) == original(SRC, name_expressions=("k",))
    with pytest.raises(TypeError) as ours:
        replacement(SRC, bogus=1)
    with pytest.raises(TypeError) as theirs:
        original(SRC, bogus=1)
    assert str(ours.value) == str(theirs.value)  # CuPy's function words the error
