"""The compiler's command line is built, never passed through; nvcc runs in a private world.

Each safety check here has a test whose input is otherwise valid, run against the real nvcc with a
canary program (a script that touches a marker) that must never run: a kernel name is never an
option or a shell word, options replayed from data follow one grammar, nvcc's working and temporary
directories are private, children of `warm --libs` start isolated, and SIGTERM / SIGHUP end nvcc's
process group and remove its files as Ctrl-C does.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import REPO
from ptxbackend.compilers import grammar
from ptxbackend.compiling import engine

KERNEL = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'


def canary(tmp_path):
    """A program that, if anything ever runs it, leaves ``ran`` behind; returns (program, marker)."""
    marker = tmp_path / "ran"
    program = tmp_path / "evil.sh"
    program.write_text("#!/bin/sh\ntouch %s\nexit 1\n" % marker)
    program.chmod(0o755)
    return str(program), marker


def _cli(tmp_path, *argv, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    env.update(kwargs.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(argv), env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=kwargs.pop("timeout", 180), **kwargs)


# -- row 1: a kernel name is never an option, never a shell word ---------------------------------------

def test_a_kernel_name_that_reads_as_an_options_file_compiles_the_kernel_and_runs_nothing(tmp_path, nvcc13):
    program, marker = canary(tmp_path)
    (tmp_path / "opts.cu").write_text("-ccbin=%s\n" % program)
    name = "--options-file=%s" % (tmp_path / "opts.cu")
    artifact = engine.compile(KERNEL, name=name, target="compute_75", compiler="nvcc")
    assert not marker.exists(), "the kernel name was read as an option: the canary ran"
    assert b".entry k(" in artifact.image
    assert grammar.source_argument(name).startswith("./")


def test_a_kernel_name_with_shell_characters_runs_nothing(tmp_path, nvcc13):
    _program, marker = canary(tmp_path)
    for name in ("a$(touch %s).cu" % marker, "a`touch %s`.cu" % marker):
        artifact = engine.compile(KERNEL, name=name, target="compute_75", compiler="nvcc")
        assert b".entry k(" in artifact.image
    assert not marker.exists(), "nvcc's shell ran a command from the kernel name"


def test_plain_names_keep_their_spelling_so_their_keys_do_not_change():
    assert grammar.source_argument("k.cu") == "k.cu"
    assert grammar.source_argument("src/k.cu") == "src/k.cu"
    assert grammar.source_argument("/abs/dir/kern.cu") == "kern.cu"
    assert grammar.source_argument("a/../b") == "b.cu"
    assert grammar.source_argument("my kernel.cu") == "my kernel.cu"
    assert grammar.source_argument("") == "kernel.cu"
    assert grammar.source_argument("-dash.cu") == "./-dash.cu"
    assert grammar.source_argument("a$b.cu") == "a_b.cu"


def test_a_kernel_name_longer_than_a_file_name_compiles(tmp_path, nvcc13):
    # Found by the injection fuzzer: a 300-character name was an OSError ("File name too long").
    names = ["x" * 300, "\u00e9" * 300, "/".join(["d"] * 40) + "/k.cu"]
    images = [engine.compile(KERNEL, name=name, target="compute_75", compiler="nvcc").image for name in names]
    assert all(b".entry k(" in image for image in images)
    assert grammar.source_argument("x" * 300) != grammar.source_argument("x" * 301)


def test_cli_compiles_a_file_whose_name_starts_with_a_dash(tmp_path, nvcc13):
    (tmp_path / "-dash.cu").write_text(KERNEL)
    proc = _cli(tmp_path, "compile", "./-dash.cu", "--target", "compute_75", "--compiler", "nvcc",
                "-o", "out.ptx", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert b".entry k(" in (tmp_path / "out.ptx").read_bytes()


# -- row 2: options from data follow one grammar --------------------------------------------------------

# What CuPy v1..v14, Chainer, the hook and the docs produce: never refused.
PRODUCED = [
    [], ["-ftz=true"], ["--device-debug", "--generate-line-info"], ["-I", "/usr/local/cuda/include"],
    ["-I /home/u/site-packages/cupy/_core/include"], ["-I/opt/cuda/include"], ["--include-path=/a b/c"],
    ["-DCUPY_USE_JITIFY"], ["-DN=4", "-DSCALE=3", "-DVAL=1.0f"], ["-D", "X=1"], ["--define-macro=X=(2+3)"],
    ["-arch=compute_75"], ["-arch", "sm_80"], ["--gpu-architecture=compute_61"],
    ["-gencode=arch=compute_75,code=sm_75"], ["-std=c++11"], ["--std=c++17"], ["-std", "c++14"],
    ["--use_fast_math"], ["-lineinfo"], ["-G"], ["-rdc=true"], ["--relocatable-device-code=false"],
    ["--fmad=false"], ["-fmad=true"], ["--ftz=true"], ["--prec-div=false"], ["--prec-sqrt=true"],
    ["--device-as-default-execution-space"], ["-O3"], ["-isystem", "/usr/include/x"], ["-include", "/a/pre.h"],
    ["--pre-include=cuda_fp16.h"], ["-maxrregcount=32"], ["-UX"], ["--expt-relaxed-constexpr"],
]


@pytest.mark.parametrize("options", PRODUCED, ids=lambda o: " ".join(o) or "none")
def test_the_grammar_takes_what_cupy_and_the_docs_produce(options):
    assert grammar.option_problem(options) is None


REFUSED = {
    "dollar": (["-DX=$(touch f)"], "dollar sign"),
    "dollar-separate": (["-D", "X=$(id)"], "dollar sign"),
    "backquote": (["-DX=`id`"], "backquote"),
    "semicolon": (["-I/a;touch f"], "semicolon"),
    "pipe": (["-DX=1|2"], "pipe"),
    "ampersand": (["-DX=1&&id"], "ampersand"),
    "lt": (["-DX=a<b"], "'<'"),
    "gt": (["-I", "/a>b"], "'>'"),
    "single-quote": (["-DX='a'"], "single quote"),
    "double-quote": (['-DX="a"'], "double quote"),
    "backslash": (["-DX=a\\nb"], "backslash"),
    "newline": (["-DVAL=1.0f\n"], "newline"),
    "nul": (["-DX=1\0"], "NUL"),
    "ccbin": (["-ccbin", "/x/evil.sh"], "-ccbin"),
    "options-file": (["--options-file=/x/o"], "--options-file"),
    "xcompiler": (["-Xcompiler", "-fplugin=/x.so"], "-Xcompiler"),
    "output": (["-o", "/x/out"], "'-o'"),
    "keep-dir": (["--keep-dir=/x"], "--keep-dir"),
    "path-is-option": (["-I", "-ccbin=/x"], "not an option"),
    "path-list-item-is-option": (["-I/a,-ccbin=/x"], "not an option"),
    "macro-space": (["-DX=1 2"], "no spaces"),
    "macro-name": (["-D1X=2"], "identifier"),
    "arch": (["-arch=sm_75;id"], "semicolon"),
    "gencode": (["-gencode=arch=compute_75,code=sm_75,x=y"], "arch=compute_XY"),
    "std": (["-std=gnu++17"], "c++11"),
    "not-a-string": ([5], "not a string"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_grammar_refuses_with_one_line_naming_the_problem(case):
    options, says = REFUSED[case]
    why = grammar.option_problem(options)
    assert why is not None and says in why, why
    assert "\n" not in why


def _manifest(tmp_path, **fields):
    record = {"key": "ab" * 32, "source": KERNEL, "options": [], "target": "compute_75", "compiler": "nvcc",
              "name": "k.cu"}
    record.update(fields)
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(record) + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("options", [["-DX=$(touch {m})"], ["-DX=`touch {m}`"], ["-D", "X=$(touch {m})"],
                                     ["-I", "/tmp/$(touch {m})"]])
def test_warm_refuses_a_manifest_option_a_shell_would_run(tmp_path, nvcc13, options):
    _program, marker = canary(tmp_path)
    manifest = _manifest(tmp_path, options=[o.replace("{m}", str(marker)) for o in options])
    proc = _cli(tmp_path, "warm", manifest, "--device-cc", "7.5")
    assert not marker.exists(), "nvcc's shell ran a command from a manifest's options"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "which a shell would read" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_warm_replays_a_manifest_of_produced_options(tmp_path, nvcc13):
    manifest = _manifest(tmp_path, options=["-ftz=true", "-DN=4", "--std=c++17", "-I", str(tmp_path)])
    proc = _cli(tmp_path, "warm", manifest, "--device-cc", "7.5")
    assert proc.returncode == 0 and "1 compiled" in proc.stdout, (proc.stdout, proc.stderr)


def test_a_manifest_name_is_never_an_option(tmp_path, nvcc13):
    program, marker = canary(tmp_path)
    (tmp_path / "opts.cu").write_text("-ccbin=%s\n" % program)
    manifest = _manifest(tmp_path, name="--options-file=%s" % (tmp_path / "opts.cu"))
    proc = _cli(tmp_path, "warm", manifest, "--device-cc", "7.5")
    assert not marker.exists()
    assert proc.returncode == 0 and "1 compiled" in proc.stdout, (proc.stdout, proc.stderr)


# -- row 8: nvcc's private world ------------------------------------------------------------------------

def test_nvcc_runs_with_its_working_and_temporary_directories_private_inside_the_cache(tmp_path, nvcc13):
    seen = tmp_path / "seen"
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text('#!/bin/sh\ncase "$*" in *" -o "*) echo "$(pwd)|$TMPDIR|$(stat -c %%a .)|$(stat -c %%a "$TMPDIR")" '
                       '>> %s;; esac\nexec %s "$@"\n' % (seen, nvcc13))
    wrapper.chmod(0o755)
    os.environ["PTXBACKEND_NVCC"] = str(wrapper)
    try:
        engine.compile(KERNEL, target="compute_75", compiler="nvcc")
    finally:
        del os.environ["PTXBACKEND_NVCC"]
    cwd, tmpdir, cwd_mode, tmp_mode = seen.read_text().splitlines()[0].split("|")
    work = os.path.realpath(str(tmp_path / "cache" / "v4" / "work"))
    assert os.path.dirname(os.path.realpath(cwd)) == work, cwd
    assert os.path.realpath(tmpdir) == os.path.join(os.path.realpath(cwd), "tmp"), tmpdir
    assert cwd_mode == "700" and tmp_mode == "700"
    assert os.listdir(work) == [], "the compile left its private directory behind"


def test_a_stale_private_directory_is_swept_and_a_fresh_one_kept(tmp_path, nvcc13):
    engine.compile(KERNEL, target="compute_75", compiler="nvcc")
    work = tmp_path / "cache" / "v4" / "work"
    stale, fresh = work / "nvcc-stale", work / "nvcc-fresh"
    for path in (stale, fresh):
        (path / "tmp").mkdir(parents=True)
    old = time.time() - 2 * 86400
    os.utime(str(stale), (old, old))
    engine.compile(KERNEL.replace("1.0f", "2.0f"), target="compute_75", compiler="nvcc")
    assert not stale.exists(), "a SIGKILLed compile's directory stays forever"
    assert fresh.exists(), "a running compile's directory was removed"


def test_a_cache_path_with_shell_characters_never_reaches_nvccs_shell(tmp_path, nvcc13, monkeypatch):
    _program, marker = canary(tmp_path)
    cache = tmp_path / ("c$(touch %s)" % marker)
    monkeypatch.setenv("PTXBACKEND_CACHE_DIR", str(cache))
    artifact = engine.compile(KERNEL, target="compute_75", compiler="nvcc")
    assert b".entry k(" in artifact.image
    assert not marker.exists(), "nvcc's shell ran a command from the cache's path"


# -- row 7: children start isolated ---------------------------------------------------------------------

def test_warm_libs_children_never_import_from_the_working_directory_or_pythonpath(tmp_path):
    from ptxbackend.deploy import library_warmup
    marker = tmp_path / "ran"
    for place in ("cwd", "pythonpath"):
        planted = tmp_path / place / "ptxbackend"
        (planted / "deploy").mkdir(parents=True)
        code = "import sys\nopen(%r, 'a').write('%s')\nsys.exit(3)\n" % (str(marker), place)
        for name in ("__init__.py", "deploy/__init__.py", "deploy/library_warmup.py"):
            (planted / name).write_text(code)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "pythonpath"))
    old = os.getcwd()
    os.chdir(str(tmp_path / "cwd"))
    try:
        with pytest.raises(RuntimeError) as info:
            library_warmup._run_child(None, str(tmp_path / "no-such-lib.so"), env)
    finally:
        os.chdir(old)
    assert not marker.exists(), "a child ran a planted ptxbackend package (%s)" % marker.read_text()
    assert "no-such-lib.so" in str(info.value)
    # The real module ran as the child's __main__: a parallel-JIT worker answers with its JSON line.
    from ptxbackend.deploy.children import python_module
    proc = subprocess.run(python_module("ptxbackend.deploy.parallel_jit"), env=env, cwd=str(tmp_path / "cwd"),
                          input=json.dumps({"path": str(tmp_path / "no-such-lib.so"), "ranges": [[0, 4]]}),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert not marker.exists()
    assert "failed" in json.loads(proc.stdout.strip().splitlines()[-1]), (proc.stdout, proc.stderr)


def test_a_childs_import_path_is_its_parents_without_the_working_directory(tmp_path, monkeypatch):
    from ptxbackend.deploy import children
    deps = tmp_path / "deps"  # a dependency the parent found on PYTHONPATH: the child needs it too
    deps.mkdir()
    monkeypatch.chdir(str(tmp_path))
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), str(deps), "relative/dir"])
    assert children.import_path() == [children.package_parent(), str(deps)]


# -- signals: SIGTERM and SIGHUP as Ctrl-C ------------------------------------------------------------

def _slow_kernel():
    """A kernel cicc takes seconds over (template recursion, unrolled)."""
    lines = ["template<int N> struct F { __device__ static float f(float x) "
             "{ return F<N-1>::f(x*1.0001f+N) + F<N-2>::f(x-N)*0.5f; } };",
             "template<> struct F<0> { __device__ static float f(float x) { return x; } };",
             "template<> struct F<1> { __device__ static float f(float x) { return x+1; } };"]
    for i in range(8):
        lines.append('extern "C" __global__ void k%d(float* x) { float a = x[threadIdx.x];\n#pragma unroll\n'
                     'for (int i = 0; i < 16; i++) a = F<%d>::f(a + i); x[threadIdx.x] = a; }' % (i, 16 + i % 3))
    return "\n".join(lines) + "\n"


def _processes():
    """{pid: (ppid, pgid, command name)} of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                text = handle.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            found[int(entry)] = (int(fields[1]), int(fields[2]), name)
    return found


def _wait_for_compiler_group(parent, timeout=60):
    """The process group of the nvcc ``parent`` started, once cicc runs in it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        procs = _processes()
        groups = [pid for pid, (ppid, _g, name) in procs.items() if ppid == parent and name.startswith("nvcc")]
        for group in groups:
            if any(g == group and name == "cicc" for _p, (_pp, g, name) in procs.items()):
                return group
        time.sleep(0.05)
    raise AssertionError("nvcc never started cicc")


def _group_alive(group):
    return [name for _p, (_pp, g, name) in _processes().items() if g == group]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_cli_compile_stopped_by_a_signal_ends_nvccs_group_and_removes_its_files(tmp_path, nvcc13, signum):
    (tmp_path / "slow.cu").write_text(_slow_kernel())
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "ptxbackend", "compile", str(tmp_path / "slow.cu"),
                             "--target", "compute_75", "--compiler", "nvcc"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    try:
        group = _wait_for_compiler_group(proc.pid)
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and "stopped by" in err, err
    time.sleep(0.2)
    assert _group_alive(group) == [], "nvcc's processes outlived the command"
    work = tmp_path / "cache" / "v4" / "work"
    assert not work.exists() or os.listdir(str(work)) == [], "nvcc's private directory stayed"


def test_a_program_stopped_by_sigterm_during_a_compile_leaves_no_nvcc_and_still_dies_by_it(tmp_path, nvcc13):
    code = ("import sys, ptxbackend; sys.stdout.write('go\\n'); sys.stdout.flush(); "
            "ptxbackend.compile(open(%r).read(), target='compute_75', compiler='nvcc')" % str(tmp_path / "slow.cu"))
    (tmp_path / "slow.cu").write_text(_slow_kernel())
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        group = _wait_for_compiler_group(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM  # the program's own fate is unchanged
    time.sleep(0.2)
    assert _group_alive(group) == []
    work = tmp_path / "cache" / "v4" / "work"
    assert not work.exists() or os.listdir(str(work)) == []


def test_cache_export_stopped_by_sigterm_removes_its_temporary_file(tmp_path, nvcc13):
    engine.compile(KERNEL, target="compute_75", compiler="nvcc")
    # The signal arrives while the bundle is being written: sent by the process to itself from inside
    # the writer, so the moment is certain (the handling is the real one).
    code = ("import os, signal, sys\n"
            "from ptxbackend.cache import bundle\n"
            "real = bundle.add_member\n"
            "def add(*a):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(*a)\n"
            "bundle.add_member = add\n"
            "from ptxbackend.cli.commands import main\n"
            "sys.exit(main(['cache', 'export', %r]))\n" % str(tmp_path / "out" / "b.tgz"))
    (tmp_path / "out").mkdir()
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert os.listdir(str(tmp_path / "out")) == [], "export left its temporary file"
