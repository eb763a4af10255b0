"""CuPy integration on a machine without a GPU, against a real CuPy (cupy-cuda13x imports without one).

Only two steps of the served path need a GPU: making CuPy's context current and
loading the image.  Where a test must get past them on a CPU it replaces those
two functions of ptxbackend's own module (``_use_cupy_context``, ``_load``) and
says so; CuPy itself is never replaced or mocked.  Whether CuPy's original
function ran is observed with ``sys.setprofile`` on its code object, which works
whether that call then succeeds (GPU) or fails (no GPU here).
"""

import io
import inspect
import logging
import os
import sys
import types

import pytest

from conftest import gpu_available, run_python
from ptxbackend.hook import cupy_integration as ci

KERNEL = r'''
extern "C" __global__ void ptxb_scale(float* x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = exp(x[i]) * 2.0f;
}
'''


def _import_compiler():
    pytest.importorskip("cupy")
    import cupy.cuda.compiler
    return cupy.cuda.compiler


@pytest.fixture
def compiler():
    """Real ``cupy.cuda.compiler`` with CuPy's original function in place (the hook may have
    replaced it when cupy was imported); the state before the test is restored after it."""
    module = _import_compiler()
    was_installed = ci.installed()
    ci.uninstall()
    ci._warned.clear()
    del ci._config_problem[:]
    yield module
    del ci._config_problem[:]
    ci.uninstall()
    if was_installed:
        ci.install()


@pytest.fixture
def records(monkeypatch):
    """Every record of the 'ptxbackend' logger (it does not propagate, so caplog cannot see it)."""
    monkeypatch.setenv("PTXBACKEND_LOG", "debug")
    logger = logging.getLogger("ptxbackend")
    found = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = found.append
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield found
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def _messages(found, level):
    return [r.getMessage() for r in found if r.levelno == level]


class CupyEntered(Exception):
    """Raised at the first line of CuPy's function, so that nothing it would do runs."""


def run_watching(code, fn, *args, **kwargs):
    """Call ``fn``; return (the arguments ``code`` was entered with or None, the exception, the result).

    With ``stop=True`` the call ends as ``code`` is entered: this proves which function a call
    reached without paying for (or, with no GPU, failing in) what CuPy would then do.
    """
    stop = kwargs.pop("stop", False)
    entered = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code is code and not entered:
            entered.append(dict(frame.f_locals))
            if stop:
                raise CupyEntered()

    sys.setprofile(profiler)
    try:
        result, error = fn(*args, **kwargs), None
    except CupyEntered:
        result, error = None, None
    except Exception as exc:
        result, error = None, exc
    finally:
        sys.setprofile(None)
    return (entered[0] if entered else None), error, result


def _cache_files(suffix):
    found = []
    for base, _dirs, files in os.walk(os.environ["PTXBACKEND_CACHE_DIR"]):
        found.extend(os.path.join(base, name) for name in files if name.endswith(suffix))
    return found


# --------------------------------------------------------------------------- install / uninstall

def test_importing_the_integration_does_not_import_cupy():
    out = run_python("import sys, ptxbackend.hook.cupy_integration as ci\n"
                     "print('cupy' in sys.modules, ci.status())", env={"PTXBACKEND_DISABLE": "1"})
    assert out.strip() == ("False {'cupy_version': None, 'generation': None, 'replaced': [], "
                           "'compiler': None}")


def test_install_replaces_and_uninstall_restores_the_very_same_object(compiler):
    original = compiler._compile_module_with_cache
    assert original.__code__.co_filename.endswith(os.path.join("cupy", "cuda", "compiler.py"))
    assert not ci.installed() and ci.status()["replaced"] == []

    assert ci.install() is True
    replacement = compiler._compile_module_with_cache
    assert replacement is not original and replacement._ptxbackend_original is original
    assert ci.installed()
    import cupy
    assert ci.status() == {"cupy_version": cupy.__version__, "generation": "v10+",
                           "replaced": ["cupy.cuda.compiler._compile_module_with_cache"], "compiler": "nvrtc"}

    ci.uninstall()
    assert compiler._compile_module_with_cache is original
    assert not ci.installed() and ci.status()["replaced"] == []


def test_install_twice_wraps_once(compiler):
    original = compiler._compile_module_with_cache
    ci.install()
    first = compiler._compile_module_with_cache
    ci.install()
    ci.on_import(compiler)
    ci.on_import(sys.modules["cupy.cuda"])
    assert compiler._compile_module_with_cache is first
    assert first._ptxbackend_original is original
    ci.uninstall()
    assert compiler._compile_module_with_cache is original


def test_on_import_respects_PTXBACKEND_DISABLE(compiler, monkeypatch):
    original = compiler._compile_module_with_cache
    monkeypatch.setenv("PTXBACKEND_DISABLE", "1")
    ci.on_import(compiler)
    ci.on_import(sys.modules["cupy.cuda"])
    assert compiler._compile_module_with_cache is original

    monkeypatch.delenv("PTXBACKEND_DISABLE")
    ci.on_import(sys.modules["cupy.cuda"])
    assert compiler._compile_module_with_cache._ptxbackend_original is original


def test_status_reports_the_compiler_the_user_chose(compiler, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_COMPILER", "nvcc")
    assert ci.status()["compiler"] == "nvcc"


def test_on_import_never_raises_and_warns_once(compiler, records):
    class Broken(types.ModuleType):
        @property
        def _compile_module_with_cache(self):
            raise RuntimeError("boom\nsecond line")

    original = compiler._compile_module_with_cache
    ci.on_import(Broken("cupy.cuda.compiler"))
    assert compiler._compile_module_with_cache is original
    warnings = _messages(records, logging.WARNING)
    assert len(warnings) == 1 and "RuntimeError: boom" in warnings[0] and "\n" not in warnings[0]


# --------------------------------------------------------------------------- what goes to CuPy

@pytest.mark.parametrize("kwargs, reason", [
    ({"name_expressions": ["ptxb_scale"]}, "name_expressions"),
    ({"jitify": True}, "jitify"),
    ({"options": ("-DCUPY_USE_JITIFY",)}, "jitify"),
    ({"enable_cooperative_groups": True}, "cooperative groups"),
    ({"options": ("-rdc=true",)}, "relocatable device code"),
    ({"log_stream": io.StringIO()}, "log_stream"),
    ({"to_ltoir": True}, "LTO IR"),
    ({"backend": "hiprtc"}, "backend='hiprtc'"),
])
def test_calls_ptxbackend_does_not_serve_go_to_cupys_own_function(compiler, records, kwargs, reason):
    original = compiler._compile_module_with_cache
    ci.install()
    entered, error, _result = run_watching(original.__code__, compiler._compile_module_with_cache,
                                           KERNEL, stop=True, **kwargs)
    assert error is None
    assert entered["source"] == KERNEL
    assert all(entered[name] is value for name, value in kwargs.items())  # handed over as given
    assert any(reason in m and "CuPy compiles this kernel itself" in m
               for m in _messages(records, logging.DEBUG))
    assert _messages(records, logging.WARNING) == []
    assert _cache_files(".ptx") == [] and _cache_files(".cubin") == []


def test_a_call_cupy_would_reject_gets_cupys_own_error(compiler):
    ci.install()
    with pytest.raises(TypeError, match=r"_compile_module_with_cache\(\) got an unexpected keyword"):
        compiler._compile_module_with_cache(KERNEL, bogus=1)


@pytest.mark.skipif(gpu_available(), reason="on a GPU ptxbackend serves this call")
def test_a_call_ptxbackend_cannot_serve_goes_to_cupy_with_one_warning(compiler, records):
    original = compiler._compile_module_with_cache
    ci.install()
    for _ in range(2):
        entered, error, _result = run_watching(original.__code__, compiler._compile_module_with_cache, KERNEL,
                                               stop=True)
        assert error is None and entered["source"] == KERNEL
    warnings = _messages(records, logging.WARNING)
    assert len(warnings) == 1 and "CuPy's own compiler takes over" in warnings[0]


@pytest.mark.parametrize("variable, value", [
    ("PTXBACKEND_TARGET", "compute_9000x"),
    ("PTXBACKEND_CACHE_MAX_SIZE", "lots"),
    ("PTXBACKEND_CONFIG", "/nonexistent/ptxbackend-config.ini"),
    ("PTXBACKEND_CACHE_DIR", "   "),
])
def test_a_configuration_problem_is_one_warning_and_cupys_own_compiler(compiler, monkeypatch, records, nvcc13,
                                                                       variable, value):
    monkeypatch.setattr(ci, "_use_cupy_context", lambda module: None)  # needs a GPU
    monkeypatch.setenv("PTXBACKEND_COMPILER", "nvcc")
    monkeypatch.setenv("PTXBACKEND_NVCC", nvcc13)
    monkeypatch.setenv(variable, value)
    original = compiler._compile_module_with_cache
    ci.install()
    for _ in range(3):
        entered, raised, _result = run_watching(original.__code__, compiler._compile_module_with_cache, KERNEL,
                                                stop=True)
        assert raised is None and entered is not None and entered["source"] == KERNEL
    warnings = [m for m in _messages(records, logging.WARNING) if "configuration problem" in m]
    assert len(warnings) == 1


# --------------------------------------------------------------------------- what ptxbackend serves

def test_cupys_own_entry_point_compiles_through_ptxbackend(compiler, nvcc13, monkeypatch):
    """core.compile_with_cache prepends CuPy's headers and adds its -I/--std options; the kernel
    must compile with them for compute_75 and come back as CuPy's Module, without CuPy compiling."""
    import cupy
    from cupy._core import core
    loaded = []

    def load(module, artifact):  # needs a GPU; CuPy's Module itself can be made without one
        loaded.append(artifact)
        return module.function.Module()

    monkeypatch.setattr(ci, "_use_cupy_context", lambda module: None)
    monkeypatch.setattr(ci, "_load", load)
    for name, value in (("PTXBACKEND_COMPILER", "nvcc"), ("PTXBACKEND_NVCC", nvcc13),
                        ("PTXBACKEND_TARGET", "compute_75"), ("PTXBACKEND_DEVICE_CC", "9.0")):
        monkeypatch.setenv(name, value)
    original = compiler._compile_module_with_cache
    ci.install()

    entered, error, module = run_watching(original.__code__, core.compile_with_cache, KERNEL, stop=True)
    assert error is None and entered is None
    assert isinstance(module, cupy.cuda.function.Module)
    artifact = loaded[0]
    assert (artifact.kind, str(artifact.target), artifact.cache_hit) == ("ptx", "compute_75", False)
    assert b".target sm_75" in artifact.image and b"ptxb_scale" in artifact.image
    assert _cache_files(".ptx") == [artifact.path]
    assert os.sep + "compute_75" + os.sep in artifact.path
    options = artifact.store.read(artifact.name, artifact.key, "ptx")[1]["options"]
    assert options == list(core.assemble_cupy_compiler_options(())) + ["-ftz=true"]

    core.compile_with_cache(KERNEL)
    assert loaded[1].cache_hit and loaded[1].key == artifact.key


def test_the_options_cupy_adds_inside_the_replaced_function(compiler, monkeypatch):
    monkeypatch.delenv("CUPY_CUDA_COMPILE_WITH_DEBUG", raising=False)
    assert ci._cupy_options(compiler, "v10+", "nvrtc") == ("-ftz=true", "--device-as-default-execution-space")
    assert ci._cupy_options(compiler, "v10+", "nvcc") == ("-ftz=true",)
    assert ci._cupy_options(compiler, "v2-v9", "nvrtc") == ("-ftz=true",)
    assert ci._cupy_options(compiler, "v1", "nvcc") == ()
    monkeypatch.setenv("CUPY_CUDA_COMPILE_WITH_DEBUG", "1")
    assert ci._cupy_options(compiler, "v10+", "nvrtc") == (
        "-ftz=true", "--device-debug", "--generate-line-info", "--device-as-default-execution-space")


# --------------------------------------------------------------------------- older generations

# Stand-ins with the module layout and signatures of Chainer 1.x's CuPy and CuPy v2-v9 (the real
# ones are Cython builds that need CUDA); `cupy/cuda/__init__.py` re-exports compile_with_cache
# after the start-up hook has handed `cupy.cuda.compiler` over, as it happens at import.
_OLD_COMPILER = {
    "v1": "def nvcc(source, options=(), arch=None):\n    pass\n\n"
          "def compile_with_cache(source, options=(), arch=None, cache_dir=None):\n"
          "    return 'stock'\n",
    "v2-v9": "def compile_with_cache(source, options=(), arch=None, cache_dir=None, extra_source=None,\n"
             "                       backend='nvrtc', *, enable_cooperative_groups=False,\n"
             "                       name_expressions=None, log_stream=None, jitify=False):\n"
             "    return 'stock'\n",
}
_OLD_PACKAGE = ("from cupy.cuda import compiler\n"
                "from ptxbackend.hook import cupy_integration\n"
                "cupy_integration.on_import(compiler)\n"
                "from cupy.cuda.compiler import compile_with_cache\n")
_OLD_CHECK = r'''
import cupy.cuda, cupy.cuda.compiler as compiler
from ptxbackend.hook import cupy_integration as ci
ours = compiler.compile_with_cache
original = ours._ptxbackend_original
print(ci.status()["generation"], ci.status()["replaced"], ci.status()["compiler"])
print(cupy.cuda.compile_with_cache is ours)
print(ours("k", ("-rdc=true",)), ours("k"))   # delegated; then ptxbackend fails without CuPy's runtime
ci.uninstall()
print(compiler.compile_with_cache is original, cupy.cuda.compile_with_cache is original, ci.installed())
print(ci.install(), cupy.cuda.compile_with_cache is compiler.compile_with_cache)
'''


@pytest.mark.parametrize("gen", ["v1", "v2-v9"])
def test_older_generations_replace_both_names_and_restore_them(tmp_path, gen):
    package = tmp_path / "cupy" / "cuda"
    package.mkdir(parents=True)
    (tmp_path / "cupy" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(_OLD_PACKAGE)
    (package / "compiler.py").write_text(_OLD_COMPILER[gen])
    env = {"PYTHONPATH": "%s%s%s" % (tmp_path, os.pathsep, os.path.dirname(os.path.dirname(ci.__file__)))}
    lines = run_python(_OLD_CHECK, env=env).splitlines()
    compiler = "nvcc" if gen == "v1" else "nvrtc"
    assert lines == [
        "%s ['cupy.cuda.compiler.compile_with_cache', 'cupy.cuda.compile_with_cache'] %s" % (gen, compiler),
        "True",
        "stock stock",
        "True True False",
        "True True",
    ]


def _v1_compile_with_cache(source, options=(), arch=None, cache_dir=None):
    pass


def _v14_compile(source, options=(), *, arch=None, **kwargs):
    pass


def _v14_2_compile(source, options=(), *, arch=None, extra_source=None, backend='nvrtc',
                   enable_cooperative_groups=False, name_expressions=None, log_stream=None, jitify=False,
                   to_ltoir=False):
    pass


def _keyword_only_required(source, *, cache_dir, jitify=False):
    pass


@pytest.mark.parametrize("function", [_v1_compile_with_cache, _v14_compile, _v14_2_compile,
                                      _keyword_only_required])
@pytest.mark.parametrize("args, kwargs", [
    (("src",), {}), (("src", ("-DX",)), {}), (("src", (), "sm_61", "/c"), {}),
    (("src",), {"cache_dir": "/c", "options": ["-DY"]}), ((), {"source": "s"}),
    ((), {}), (("s", (), None, None, "extra"), {}), (("s",), {"source": "t"}), (("s",), {"bogus": 1}),
    (("s",), {"arch": "90", "jitify": True}), (("s",), {"cache_dir": "/c"}), (("s",), {"kwargs": 1}),
    (("s", ()), {"backend": "nvcc", "to_ltoir": True, "arch": None}),
])
def test_the_argument_binder_agrees_with_inspect(function, args, kwargs):
    """The fast binder gives what Signature.bind gives, errors included (v1-v9 and v14 shapes)."""
    signature = inspect.signature(function)
    try:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        expected = dict(bound.arguments)
    except TypeError:
        expected = TypeError
    try:
        got = dict(ci._binder(signature)(args, kwargs))
    except TypeError:
        got = TypeError
    assert got == expected


# --------------------------------------------------------------------------- what CuPy builds when it compiles itself

@pytest.mark.parametrize("built, device, runs", [
    ("86", "90", False), ("80", "86", True), ("90", "90", True), ("87", "86", False), ("75", "80", False),
    ("100", "103", True), ("90", "100", False), ("61", "61", True),
])
def test_sass_runs_only_on_its_own_major_version_and_not_older_gpus(built, device, runs):
    assert ci._sass_runs_on(built, device) is runs


def _cupy9_like_compiler(device_cc, use_ptx=False):
    """A module shaped like CuPy 9's compiler where it matters here: its ``_use_ptx`` switch, its
    ``_get_arch()`` (min(GPU, the newest architecture its table knows for NVRTC 11.x: '86')), the
    device it asks, and a ``compile_with_cache`` that says what it would build."""
    module = types.ModuleType("cupy9_like_compiler")
    module._use_ptx = use_ptx
    module._get_arch = lambda: min(device_cc, "86")
    module.device = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(compute_capability=device_cc))

    def compile_with_cache(source, options=(), arch=None, cache_dir=None, extra_source=None, backend="nvrtc",
                           enable_cooperative_groups=False, name_expressions=None, log_stream=None,
                           jitify=False):
        return "compute_%s PTX" % module._get_arch() if module._use_ptx else "sm_%s cubin" % module._get_arch()
    module.compile_with_cache = compile_with_cache
    return module


@pytest.mark.parametrize("device_cc, built", [("90", "compute_86 PTX"), ("86", "sm_86 cubin"),
                                              ("80", "sm_80 cubin")])
def test_a_delegated_kernel_is_built_as_ptx_where_cupys_sass_could_not_run(device_cc, built, records):
    module = _cupy9_like_compiler(device_cc)
    ours = ci._make_replacement(module, "v2-v9", module.compile_with_cache)
    assert ours(KERNEL, jitify=True) == built  # jitify: always CuPy's own compiler
    assert module._use_ptx is (device_cc == "90")
    flipped = [m for m in _messages(records, logging.DEBUG) if "it builds PTX instead" in m]
    assert len(flipped) == (1 if device_cc == "90" else 0)


def test_the_switch_is_left_alone_where_cupy_has_none_or_it_cannot_ask_the_gpu():
    module = _cupy9_like_compiler("90")
    del module._use_ptx  # CuPy v2-v8: no such switch (they build PTX, or link it for the device)
    ci._let_cupy_build_runnable_code(module)
    assert not hasattr(module, "_use_ptx")
    module = _cupy9_like_compiler("90")

    def no_gpu():
        raise RuntimeError("cudaErrorNoDevice")
    module.device = types.SimpleNamespace(Device=no_gpu)
    ci._let_cupy_build_runnable_code(module)
    assert module._use_ptx is False


def test_a_kernel_ptxbackend_fails_to_serve_is_built_as_ptx_by_cupy_too(records):
    # This stand-in has no runtime or function module for ptxbackend to load through, so serving fails
    # (on any machine) and the call falls back to CuPy's own function.
    module = _cupy9_like_compiler("90")
    ours = ci._make_replacement(module, "v2-v9", module.compile_with_cache)
    assert ours(KERNEL) == "compute_86 PTX"
    assert any("could not serve a CuPy kernel" in m for m in _messages(records, logging.DEBUG))


class _Runtime(object):
    """CuPy's runtime module as _use_cupy_context sees it: the current device, and the call that makes
    its context current (counted)."""

    def __init__(self, device, has_get_device=True):
        self.device, self.asked = device, 0
        if has_get_device:
            self.getDevice = lambda: self.device

    def memGetInfo(self):
        self.asked += 1
        return (1, 1)


@pytest.mark.parametrize("current, cupy_device, has_get_device, asks", [
    (1, 1, True, 0),      # CuPy's device's context is current: nothing to do
    (None, 0, True, 1),   # no context yet (CuPy makes them lazily): CuPy makes it
    (0, 1, True, 1),      # another device's context is current: CuPy makes its own current
    (0, 0, False, 1),     # a runtime without getDevice: always ask
])
def test_cupys_context_is_made_current_only_when_it_is_not(monkeypatch, current, cupy_device, has_get_device,
                                                           asks):
    runtime = _Runtime(cupy_device, has_get_device)
    monkeypatch.setattr(ci.driver, "context_device", lambda: current)
    ci._use_cupy_context(type("compiler", (), {"runtime": runtime}))
    assert runtime.asked == asks


def test_cupys_context_is_made_current_when_the_driver_cannot_say(monkeypatch):
    def no_driver():
        raise ci.driver.DriverError("no libcuda")
    runtime = _Runtime(0)
    monkeypatch.setattr(ci.driver, "context_device", no_driver)
    ci._use_cupy_context(type("compiler", (), {"runtime": runtime}))
    assert runtime.asked == 1
