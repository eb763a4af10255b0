"""The command line never shows a traceback for a user's mistake: one clear line (or a few), exit 1 or 2."""

import gzip
import json
import os
import shutil
import signal
import stat
import time
import subprocess
import sys

import pytest

from conftest import REPO


def _files(tmp):
    """Bad input files of every kind a user can hand the commands."""
    (tmp / "empty").write_bytes(b"")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "bad-line.jsonl").write_text('{"source": "x"}\nnot json\n')
    with gzip.open(str(tmp / "not-a-tar.tgz"), "wb") as handle:
        handle.write(b"hello")
    (tmp / "truncated.tgz").write_bytes(gzip.compress(b"x" * 5000)[:40])
    (tmp / "a-dir").mkdir()
    (tmp / "cache-file").write_text("x")
    (tmp / "broken.cu").write_text('extern "C" __global__ void k() { this is not cuda; }\n')
    (tmp / "config.ini").write_text("[ptxbackend\ntarget = \n")
    os.chmod(str(tmp / "config.ini"), 0o600)
    # issue 26
    (tmp / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    os.mkfifo(str(tmp / "fifo"))
    if os.geteuid() == 0:  # a device node of our own: a broken check must never replace the real /dev/null
        os.mknod(str(tmp / "char-device"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (tmp / "upper.ini").write_text("[PTXBACKEND]\ntarget = compute_75\n")
    os.chmod(str(tmp / "upper.ini"), 0o600)
    with open(str(tmp / "huge.ini"), "wb") as handle:  # sparse: 108 MB without writing them
        handle.write(b"[ptxbackend]\n")
        handle.truncate(108 << 20)
    os.chmod(str(tmp / "huge.ini"), 0o600)
    with open(str(tmp / "long-line.jsonl"), "wb") as handle:  # one 100 MiB line, sparse
        handle.truncate(100 << 20)
    with open(str(tmp / "zeros.tgz"), "wb") as handle:  # 2 GiB of zeros, sparse: xz guessing read it all
        handle.truncate(2 << 30)
    (tmp / "evil.sh").write_text("#!/bin/sh\ntouch %s\nexec gcc \"$@\"\n" % (tmp / "evil-ran"))
    os.chmod(str(tmp / "evil.sh"), 0o700)
    for name, record in MANIFESTS.items():
        record = dict(RECORD, **record)
        record["options"] = [o.replace("{t}", str(tmp)) if isinstance(o, str) else o
                             for o in record["options"]]
        (tmp / (name + ".jsonl")).write_text(json.dumps(record) + "\n")
    # Files from outside that another user could have made or changed: a manifest through a link, one
    # others can write; a bundle whose first header declares a gigabyte; a config with a fraction of a byte.
    os.symlink(str(tmp / "key-number.jsonl"), str(tmp / "link.jsonl"))
    (tmp / "shared.jsonl").write_text(json.dumps(RECORD) + "\n")
    os.chmod(str(tmp / "shared.jsonl"), 0o664)
    pax = bytearray(512)
    pax[0:14] = b"././@PaxHeader"
    pax[100:108], pax[108:116], pax[116:124] = b"0000600\0", b"0000000\0", b"0000000\0"
    pax[124:136], pax[136:148], pax[148:156], pax[156:157] = b"10000000000\0", b"00000000000\0", b" " * 8, b"x"
    pax[257:265] = b"ustar\x0000"
    pax[148:156] = ("%06o\0 " % sum(pax)).encode("ascii")
    (tmp / "pax-header.tgz").write_bytes(gzip.compress(bytes(pax) + b"\0" * (1 << 20)))
    (tmp / "half-byte.ini").write_text("[ptxbackend]\ncache_max_size = 0.5\n")
    os.chmod(str(tmp / "half-byte.ini"), 0o600)


# A recorded request, and the ways a manifest line can be wrong (issue 26) or name a program (issue 25).
RECORD = {"key": "ab" * 32, "source": 'extern "C" __global__ void k() {}\n', "options": [],
          "target": "compute_75", "compiler": "nvcc", "name": "k.cu"}
MANIFESTS = {
    "source-number": {"source": 5},
    "source-null": {"source": None},
    "options-list": {"options": [["-O3"]]},
    "options-object": {"options": [{"a": 1}]},
    "options-string": {"options": "-O3"},
    "key-number": {"key": 5},
    "target-list": {"target": ["compute_75"]},
    "compiler-path": {"compiler": "/bin/sh"},
    "ccbin": {"options": ["-ccbin", "{t}/evil.sh"]},
    "ccbin-eq": {"options": ["-ccbin={t}/evil.sh"]},
    "compiler-bindir": {"options": ["--compiler-bindir", "{t}/evil.sh"]},
    "compiler-bindir-eq": {"options": ["--compiler-bindir={t}/evil.sh"]},
    "options-file": {"options": ["--options-file", "{t}/opts.txt"]},
    "optf": {"options": ["-optf={t}/opts.txt"]},
    "xcompiler": {"options": ["-Xcompiler", "-B{t}"]},
    "compiler-options": {"options": ["--compiler-options=-fplugin={t}/evil.so"]},
    "keep-dir": {"options": ["--keep", "--keep-dir", "{t}"]},
    "output-file": {"options": ["-o", "{t}/written"]},
    "run": {"options": ["--run"]},
    # records replay the exact request: nothing relative to wherever warm runs
    "relative-include": {"options": ["-I", "inc"]},
    "source-dir-relative": {"source_dir": "src"},
    "source-dir-shell": {"source_dir": "/tmp/`id`"},
    "source-dir-list": {"source_dir": ["/tmp"]},
}


CASES = [
    (["compile", "{t}/missing.cu"], {}),
    (["compile", "{t}/a-dir"], {}),
    (["compile", "{t}/broken.cu", "--target", "compute_75"], {}),
    (["compile", "{t}/broken.cu", "--target", "sm_1"], {}),
    (["compile", "{t}/broken.cu", "--device-cc", "banana"], {}),
    (["compile", "{t}/broken.cu", "--compiler", "clang"], {}),
    (["cache", "import"], {}),
    (["cache", "import", "{t}/missing.tgz"], {}),
    (["cache", "import", "{t}/binary.bin"], {}),
    (["cache", "import", "{t}/not-a-tar.tgz"], {}),
    (["cache", "import", "{t}/truncated.tgz"], {}),
    (["cache", "import", "{t}/a-dir"], {}),
    (["cache", "export", "{t}/no-such-dir/out.tgz"], {}),
    (["cache", "prune", "--max-size", "lots"], {}),
    (["cache", "frobnicate"], {}),
    (["cache", "info"], {"PTXBACKEND_CACHE_DIR": "{t}/cache-file"}),
    (["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/config.ini"}),
    (["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/no-such-config.ini"}),
    (["doctor"], {"PTXBACKEND_CONFIG": "{t}/a-dir"}),
    (["cache", "info"], {"PTXBACKEND_LOG": "loud"}),
    (["cache", "info"], {"PTXBACKEND_CACHE_MAX_SIZE": "-1"}),
    (["cache", "info"], {"PTXBACKEND_LOCK_TIMEOUT": "forever"}),
    (["warm"], {}),
    (["warm", "--driver-jit-bundle", "{t}/jit.tgz"], {}),
    (["cache", "import", "--from-fleet"], {}),
    (["cache", "import", "--from-fleet", "{t}/empty"], {}),
    (["cache", "push"], {}),
    (["warm", "{t}/missing.jsonl"], {}),
    (["warm", "{t}/binary.bin"], {}),
    (["warm", "{t}/bad-line.jsonl"], {}),
    (["warm", "{t}/not-a-tar.tgz"], {}),
    (["doctor", "--bogus"], {}),
    (["demo", "--device-cc", "x.y"], {}),
    (["no-such-command"], {}),
    # issue 26: what traced back
    (["cache", "info"], {"PTXBACKEND_CACHE_MAX_SIZE": "9" * 30 + "T"}),
    (["cache", "info"], {"PTXBACKEND_CACHE_MAX_SIZE": "9" * 400 + ".5T"}),
    (["compile", "/dev/zero"], {}),
    (["warm", "/dev/zero"], {}),
    (["warm", "--libs", "/etc/passwd"], {}),
    # what hung
    (["compile", "{t}/fifo"], {}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", "{t}/fifo"], {}),
    (["cache", "import", "{t}/fifo"], {}),
    (["cache", "import", "/dev/zero"], {}),
    (["cache", "import", "{t}/zeros.tgz"], {}),
    (["warm", "{t}/fifo"], {}),
    (["compile", "{t}/huge.ini"], {}),
    (["warm", "{t}/long-line.jsonl"], {}),
    (["warm", "{t}/zeros.tgz"], {}),
    (["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/huge.ini"}),
    # what succeeded where it should not
    (["cache", "export", "{t}/fifo", "--force"], {}),
    (["cache", "export", "{t}/cache/bundle.tgz"], {}),
    (["cache", "export", "{t}/cache"], {}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", "{t}/k.cu"], {}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", ""], {}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", "{t}/a-dir"], {}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", "{t}/char-device"], {}),
    (["cache", "export", "{t}/char-device", "--force"], {}),
    (["warm", "--libs", ",,,"], {}),
    (["warm", "--libs", " , "], {}),
    (["cache", "info", "/etc/passwd"], {}),
    (["cache", "list", "extra"], {}),
    (["cache", "verify", "{t}/k.cu"], {}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5"], {"PTXBACKEND_NVRTC": "/nope.so"}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5"], {"PTXBACKEND_CACHE_DIR": "   "}),
    (["cache", "info"], {"PTXBACKEND_CACHE_DIR": "   "}),
    (["compile", "{t}/k.cu", "--device-cc", "7.5"], {"PTXBACKEND_TARGET": " "}),
    (["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/upper.ini"}),
    (["doctor"], {"PTXBACKEND_DISABLE": "maybe"}),
    (["doctor"], {"PTXBACKEND_LIBCUDA": "/nope.so"}),
    (["doctor"], {"PTXBACKEND_CACHE_MAX_SIZE": "9" * 30 + "T"}),
    # a remote URL that does not parse (the library turns the store off; the CLI says so, exit 1)
    (["cache", "push"], {"PTXBACKEND_REMOTE": "redis://[::1"}),
    (["doctor"], {"PTXBACKEND_REMOTE": "redis://[::1"}),
    # misleading
    (["cache", "export", "-"], {}),
    (["compile", "-", "--device-cc", "7.5", "-o", "-"], {}),
    (["warm", "--driver-jit-bundle", "{t}/fifo", "--libs", "cudnn"], {}),
    # files from outside: manifests others could change, a bundle header declaring 1 GiB, sizes
    (["warm", "{t}/link.jsonl"], {}),
    (["warm", "{t}/shared.jsonl"], {}),
    (["cache", "import", "{t}/pax-header.tgz"], {}),
    (["cache", "prune", "--max-size", "0.5"], {}),
    (["cache", "prune"], {"PTXBACKEND_CACHE_MAX_SIZE": "0.5"}),
    (["cache", "prune"], {"PTXBACKEND_CONFIG": "{t}/half-byte.ini"}),
    (["cache", "prune", "--max-size", "0.0001K"], {}),
    # wrong success: a blank --cache-dir is refused as PTXBACKEND_CACHE_DIR is ('' is not "the default")
    (["cache", "info", "--cache-dir", ""], {}),
    (["cache", "verify", "--cache-dir", "   "], {}),
] + [(["warm", "{t}/%s.jsonl" % name], {}) for name in sorted(MANIFESTS)]

# Where the message must name the thing that is wrong.
SAYS = {
    "compile /dev/zero": "/dev/zero",
    "compile {t}/fifo": "FIFO",
    "cache export -": "standard output",
    "cache export {t}/cache/bundle.tgz": "inside the cache directory",
    "compile {t}/k.cu --device-cc 7.5 -o {t}/k.cu": "itself",
    "compile {t}/k.cu --device-cc 7.5 -o ": "empty file name",
    "cache info /etc/passwd": "takes no FILE",
    "warm {t}/ccbin.jsonl": "-ccbin",
    "warm {t}/compiler-bindir-eq.jsonl": "--compiler-bindir",
    "warm {t}/key-number.jsonl": "'key'",
    "compile {t}/k.cu --device-cc 7.5 PTXBACKEND_NVRTC": "/nope.so",
    "cache info PTXBACKEND_CONFIG={t}/huge.ini": "a ptxbackend config file is a few lines",
    "cache push PTXBACKEND_REMOTE": "not a valid URL",
    "cache info PTXBACKEND_CONFIG={t}/upper.ini": "[PTXBACKEND]",
    "compile {t}/huge.ini": "more than the",
    "warm {t}/long-line.jsonl": "a line of more than",
    "warm {t}/zeros.tgz": "more than the",
    "cache import {t}/zeros.tgz": "not a ptxbackend bundle",
    "cache export {t}/fifo --force": "FIFO",
    "compile {t}/k.cu --device-cc 7.5 -o {t}/fifo": "FIFO",
    "warm {t}/link.jsonl": "symbolic link",
    "warm {t}/shared.jsonl": "writable by group or others",
    "warm {t}/relative-include.jsonl": "relative path",
    "warm {t}/source-dir-relative.jsonl": "'source_dir'",
    "warm {t}/source-dir-shell.jsonl": "'source_dir'",
    "warm {t}/source-dir-list.jsonl": "'source_dir'",
    "cache import {t}/pax-header.tgz": "extension header of 1073741824 bytes",
    "cache prune --max-size 0.5": "fraction of a byte",
    "cache prune PTXBACKEND_CACHE_MAX_SIZE=0.5": "fraction of a byte",
    "cache prune PTXBACKEND_CONFIG={t}/half-byte.ini": "fraction of a byte",
    "cache prune --max-size 0.0001K": "less than one byte",
    "cache info --cache-dir ": "only spaces",
    "cache verify --cache-dir    ": "only spaces",
}

# A flag given to an action it means nothing to is refused, not silently ignored (a "wrong success").
FLAG_CASES = [
    (["cache", "info", "--max-size", "1M"], "cache info does not take --max-size (it goes with prune)"),
    (["cache", "list", "--repair"], "cache list does not take --repair"),
    (["cache", "import", "{t}/b.tgz", "--force"], "cache import does not take --force"),
    (["cache", "import", "{t}/b.tgz", "--no-jit"], "cache import does not take --no-jit"),
    (["cache", "prune", "--from-fleet"], "cache prune does not take --from-fleet"),
    (["cache", "verify", "--max-size", "0"], "cache verify does not take --max-size"),
    (["warm", "{t}/m.jsonl", "--force"], "--force goes with --driver-jit-bundle"),
    (["warm", "{t}/m.jsonl", "--jobs", "2"], "--jobs goes with --libs"),
    (["warm", "--device-cc", "7.5", "--libs", "cudnn"], "--device-cc goes with a MANIFEST or --from-fleet"),
    (["cache", "stats", "--repair"], "cache stats does not take --repair (it goes with verify)"),
    (["cache", "push", "--max-size", "1M"], "cache push does not take --max-size (it goes with prune)"),
    (["cache", "clear", "--json"], "cache clear does not take --json"),
    (["cache"], "cache needs an ACTION: info, list, stats"),
]
CASES += [(argv, {}) for argv, _text in FLAG_CASES]
SAYS.update((" ".join(argv), text) for argv, text in FLAG_CASES)


def _snapshot(tmp):
    """Every file under ``tmp`` outside the cache: its kind, size, mode and content digest."""
    import hashlib
    found = {}
    for base, dirs, names in os.walk(str(tmp)):
        if os.path.abspath(base) == str(tmp):
            dirs[:] = [d for d in dirs if d not in ("cache", "config-home")]
        for name in names + dirs:
            path = os.path.join(base, name)
            st = os.lstat(path)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read(1 << 20)).hexdigest()
            found[path] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mode, digest)
    return found


@pytest.mark.parametrize("argv,env", CASES, ids=[" ".join(a) + (" " + " ".join(e) if e else "")
                                                  for a, e in CASES])
def test_bad_input_gives_a_short_error_and_no_traceback(tmp_path, argv, env):
    if "{t}/char-device" in argv and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    _files(tmp_path)
    before = _snapshot(tmp_path)
    fill = lambda text: text.replace("{t}", str(tmp_path))  # noqa: E731
    full_env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    full_env.update({k: fill(v) for k, v in env.items()})
    # A hang is a failure of its own (a FIFO, /dev/zero, a huge config), not a stuck test run.
    proc = subprocess.run([sys.executable, "-m", "ptxbackend"] + [fill(a) for a in argv], env=full_env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    # Nothing outside the cache is written, replaced or run (evil.sh would leave evil-ran).
    assert _snapshot(tmp_path) == before
    said = [text for marker, text in SAYS.items()
            if marker in (" ".join(argv), " ".join(argv + sorted(env)),
                          " ".join(argv + ["%s=%s" % item for item in sorted(env.items())]))]
    for text in said:
        assert text in proc.stderr + proc.stdout, (text, proc.stderr)
    if argv == ["doctor"]:  # a report, not an error: its problems are listed on stdout
        assert "PROBLEM: " in proc.stdout and sorted(env)[0] in proc.stdout, proc.stdout
        return
    if argv[:2] == ["warm", "--libs"] and "," not in argv[2]:  # a failed library is a line of the report
        assert "FAILED" in proc.stdout and len(proc.stdout.strip().splitlines()) <= 3, proc.stdout
        return
    assert proc.stderr.strip(), "no message at all"
    # argparse's usage line plus its error, or our single line (a compile error carries its log).
    limit = 60 if "broken.cu" in " ".join(argv) and "--target" in argv and "compute_75" in argv else 6
    assert len(proc.stderr.strip().splitlines()) <= limit, proc.stderr
    if "PTXBACKEND_REMOTE" in env:  # the command's own error, not the library's warning as well
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- issue 26: the rows a parametrized case cannot show ------------------------------------------------

def _run(tmp, *argv, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp / "cache"))
    env.update(kwargs.pop("env", {}))
    if "input" not in kwargs:
        kwargs["stdin"] = subprocess.DEVNULL
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(argv), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=kwargs.pop("timeout", 120),
                          **kwargs)


@pytest.fixture
def hanging_nvcc(tmp_path, nvcc13):
    """A wrapper that answers nvcc's probes but never returns from a compile (its child sleeps on)."""
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    # The sleep's pid is recorded: a child of nvcc that only a kill of the whole group stops.
    wrapper.write_text('#!/bin/sh\ncase "$*" in *" -o "*) sleep 1000 & echo $! > %s; wait; exit 0;; esac\n'
                       'exec %s "$@"\n' % (tmp_path / "started", nvcc13))
    os.chmod(str(wrapper), 0o755)
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    return str(wrapper)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with open("/proc/%d/stat" % pid) as handle:  # a zombie is gone for our purpose
        return handle.read().split(")")[-1].split()[0] != "Z"


def test_a_compiler_that_never_returns_is_stopped_by_the_compile_timeout(tmp_path, hanging_nvcc):
    started = time.time()
    proc = _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--device-cc", "7.5",
                env={"PTXBACKEND_NVCC": hanging_nvcc, "PTXBACKEND_COMPILE_TIMEOUT": "2"}, timeout=60)
    assert proc.returncode == 1 and "PTXBACKEND_COMPILE_TIMEOUT" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and time.time() - started < 30
    assert not _alive(int((tmp_path / "started").read_text())), "the compiler's process was left running"
    assert not list((tmp_path / "cache").rglob("*.lock")), "a failed compile left its lock file"


def test_ctrl_c_during_a_compile_is_one_line_and_exit_130(tmp_path, hanging_nvcc):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"),
               PTXBACKEND_NVCC=hanging_nvcc)
    # A shell starts a background job (`.ci/run &`) with SIGINT ignored, and the ignoring is inherited:
    # Python then installs no Ctrl-C handler at all. The child must start as a terminal's job would.
    proc = subprocess.Popen([sys.executable, "-m", "ptxbackend", "compile", str(tmp_path / "k.cu"), "--device-cc",
                             "7.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not (tmp_path / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "started").exists(), "the compile never started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip() == "ptxbackend: interrupted", err
    time.sleep(0.2)
    assert not _alive(int((tmp_path / "started").read_text())), "Ctrl-C left the compiler running"


def test_cache_list_with_a_closed_stdout_says_so(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run("%s -m ptxbackend cache list >&-" % sys.executable, shell=True, env=env,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 1 and "standard output is closed" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_fifo_as_the_record_manifest_is_refused_without_a_hang_or_a_lock_file(tmp_path, nvcc13):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    os.mkfifo(str(tmp_path / "record.fifo"))
    proc = _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--device-cc", "7.5",
                env={"PTXBACKEND_RECORD": str(tmp_path / "record.fifo")}, timeout=60)
    assert proc.returncode == 0 and "cannot record" in proc.stderr, proc.stderr
    proc = _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--device-cc", "7.5",
                env={"PTXBACKEND_RECORD": os.devnull}, timeout=60)  # a device: recorded nowhere, said
    assert proc.returncode == 0 and "cannot record" in proc.stderr, proc.stderr
    proc = _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--device-cc", "7.5",
                env={"PTXBACKEND_RECORD": str(tmp_path / "m.jsonl")}, timeout=60)
    assert proc.returncode == 0 and (tmp_path / "m.jsonl").read_text().count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("m.", "record"))) == \
        ["m.jsonl", "record.fifo"], "a .lock beside the record target"


def test_a_failed_compile_leaves_no_lock_file(tmp_path, nvcc13):
    (tmp_path / "broken.cu").write_text("this is not cuda\n")
    proc = _run(tmp_path, "compile", str(tmp_path / "broken.cu"), "--device-cc", "7.5")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert not list((tmp_path / "cache").rglob("*.lock"))


def test_export_leaves_no_lock_file_beside_its_target(tmp_path):
    (tmp_path / "out").mkdir()
    proc = _run(tmp_path, "cache", "export", str(tmp_path / "out" / "b.tgz"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(str(tmp_path / "out"))) == ["b.tgz"]


def test_looking_at_a_directory_that_holds_no_cache_makes_none(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "notes.txt").write_text("not a cache\n")
    proc = _run(tmp_path, "cache", "info")
    assert proc.returncode == 0 and "no ptxbackend cache in it yet" in proc.stdout, proc.stdout
    assert sorted(os.listdir(str(tmp_path / "cache"))) == ["notes.txt"]
    proc = _run(tmp_path, "cache", "verify", "--cache-dir", str(tmp_path / "nonexistent" / "deeper"))
    assert proc.returncode == 0 and "nothing to verify" in proc.stdout, proc.stdout
    assert not (tmp_path / "nonexistent").exists()


def test_a_report_to_a_full_disk_is_one_line_and_exit_1(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run("%s -m ptxbackend doctor > /dev/full" % sys.executable, shell=True, env=env,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        "ptxbackend: error: cannot write the output: No space left on device (standard output)"], proc.stderr


def test_doctor_opens_with_its_verdict(tmp_path):
    proc = _run(tmp_path, "doctor", env={"PTXBACKEND_NVRTC": str(tmp_path / "nope.so")})
    first = proc.stdout.splitlines()[0]
    assert first.startswith("verdict: 1 problem") and "nope.so" in first, proc.stdout
    from ptxbackend.cli import doctor
    assert doctor.verdict({"problems": [], "warnings": []}) == "verdict: OK"
    assert doctor.verdict({"problems": [], "warnings": ["w1", "w2"]}) == "verdict: 2 warnings; first: w1"


def test_a_huge_compiler_log_is_cut_and_kept_whole_in_a_private_file(tmp_path, nvcc13):
    (tmp_path / "bad.cu").write_text("".join("@ garbage %d $ `x` ;\n" % i for i in range(100000)))
    proc = _run(tmp_path, "compile", str(tmp_path / "bad.cu"), "--device-cc", "7.5")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(lines) <= 70 and any("lines left out" in line for line in lines), len(lines)
    saved = lines[-1].rsplit(": ", 1)[1]
    try:
        assert lines[-1].startswith("ptxbackend: the whole compiler log (")
        assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
        with open(saved) as handle:
            assert len(handle.read().splitlines()) > 100
    finally:
        os.unlink(saved)


def test_demo_shows_the_ptx_route_when_the_toolkit_builds_native_code(tmp_path, nvcc13):
    proc = _run(tmp_path, "demo", "--device-cc", "7.5", "--compiler", "nvcc")
    assert proc.returncode == 0, proc.stderr
    assert "image:    cubin" in proc.stdout and "The PTX route" in proc.stdout, proc.stdout
    assert "image:    ptx" in proc.stdout and "the driver JIT-compiles compute_75 at load" in proc.stdout


def test_bash_completion_is_made_from_the_parser_and_completes(tmp_path):
    proc = _run(tmp_path, "completion", "bash")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "ptxbackend.bash"
    script.write_text(proc.stdout)

    def complete(*words):
        line = "source %s; COMP_WORDS=(ptxbackend %s); COMP_CWORD=%d; _ptxbackend; echo \"${COMPREPLY[*]}\"" % (
            script, " ".join("'%s'" % w for w in words), len(words))
        return subprocess.run(["bash", "-c", line], stdout=subprocess.PIPE, universal_newlines=True,
                              check=True).stdout.split()
    assert complete("ca") == ["cache"]
    assert complete("cache", "st") == ["stats"]
    assert complete("cache", "stats", "--ze") == ["--zero"]
    assert complete("completion", "") == ["bash", "zsh", "--help"]
    from ptxbackend.cli.commands import build_parser
    actions = build_parser()._subparsers._group_actions[0].choices["cache"]._subparsers._group_actions[0].choices
    assert complete("cache", "") == sorted(actions) + ["--help"]
    for action, action_parser in actions.items():  # each action completes its own flags, and only those
        own = [o for a in action_parser._actions if a.help != "==SUPPRESS==" for o in a.option_strings
               if o.startswith("--")]
        assert sorted(complete("cache", action, "--")) == sorted(own), action
    assert complete("cache", "prune", "--cache-dir", "/tmp", "--ma") == ["--max-size"]
    assert complete("cache", "info", "--ma") == [] and complete("cache", "verify", "--re") == ["--repair"]
    zsh = _run(tmp_path, "completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef ptxbackend") and "bashcompinit" in zsh.stdout


def test_json_output_of_compile_and_the_cache_actions(tmp_path, nvcc13):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')

    def run_json(*argv, **kwargs):
        proc = _run(tmp_path, *argv, **kwargs)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    compiled = run_json("compile", str(tmp_path / "k.cu"), "--device-cc", "7.5", "--json")
    assert compiled["kind"] == "cubin" and compiled["cache_hit"] is False and compiled["bytes"] > 0
    assert run_json("compile", str(tmp_path / "k.cu"), "--device-cc", "7.5", "--json")["cache_hit"] is True
    info = run_json("cache", "info", "--json")
    assert info["entries"] >= 1 and info["exists"] and info["producers"] == ["nvcc-13.0.88"]
    listed = run_json("cache", "list", "--json")
    assert any(e["path"].endswith(".cubin") for e in listed["entries"])
    assert run_json("cache", "verify", "--json")["bad"] == []
    exported = run_json("cache", "export", str(tmp_path / "b.tgz"), "--json")
    assert exported["exported"] >= 1 and exported["bytes"] == os.path.getsize(str(tmp_path / "b.tgz"))
    imported = run_json("cache", "import", str(tmp_path / "b.tgz"), "--json",
                        env={"PTXBACKEND_CACHE_DIR": str(tmp_path / "other")})
    assert imported["added"] == exported["exported"] and imported["present"] == 0
    assert run_json("cache", "info", "--json", env={"PTXBACKEND_CACHE_DIR": str(tmp_path / "none")})["exists"] is False


def test_concurrent_imports_of_one_bundle_count_each_entry_once(tmp_path, nvcc13):
    src = tmp_path / "src"
    code = "import ptxbackend\nfor i in range(24):\n    ptxbackend.compile('extern \"C\" __global__ void k(float* y) " \
           "{ y[0] = %d; }' % i, target='compute_75', compiler='nvcc')\n"
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(src)),
                   check=True, timeout=600)
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(src))
    subprocess.run([sys.executable, "-m", "ptxbackend", "cache", "export", str(tmp_path / "b.tgz")], env=env,
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    for attempt in range(3):
        env["PTXBACKEND_CACHE_DIR"] = str(tmp_path / ("dst%d" % attempt))
        procs = [subprocess.Popen([sys.executable, "-m", "ptxbackend", "cache", "import", str(tmp_path / "b.tgz"),
                                   "--json"], env=env, stdout=subprocess.PIPE, universal_newlines=True)
                 for _ in range(4)]
        found = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        assert sum(f["added"] for f in found) == 24, found
        assert all(f["added"] + f["present"] == 24 for f in found), found


def test_a_full_output_disk_names_the_output_and_the_remedy_not_a_temporary_file(tmp_path, nvcc13):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    assert _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--device-cc", "7.5").returncode == 0
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.call(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(full)],
                       stderr=subprocess.DEVNULL) != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        (full / "filler").write_bytes(b"x" * 4096)  # what is left is less than any bundle
    except OSError:
        pass
    try:
        proc = _run(tmp_path, "cache", "export", str(full / "b.tgz"))
    finally:
        subprocess.call(["umount", str(full)])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "ptxbackend: error: no space left on the file system of %s: free some, or write " \
        "elsewhere (the output)" % (full / "b.tgz"), proc.stderr


def test_warm_libs_names_each_library_once():
    from ptxbackend.cli.commands import _library_names
    assert _library_names(",".join(["cudnn"] * 5000 + ["cublas", " cudnn ", ""])) == ["cudnn", "cublas"]


def test_cache_info_creates_no_directory(tmp_path):
    proc = _run(tmp_path, "cache", "info")
    assert proc.returncode == 0 and "not created yet" in proc.stdout, proc.stdout
    proc = _run(tmp_path, "cache", "list")
    assert proc.returncode == 0 and not (tmp_path / "cache").exists()


def test_compile_writes_its_output_as_a_new_regular_file_and_reads_stdin(tmp_path, nvcc13):
    source = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
    (tmp_path / "out.ptx").write_text("old")
    proc = _run(tmp_path, "compile", "-", "--target", "compute_75", "-o", str(tmp_path / "out.ptx"),
                input=source)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.ptx").read_text().lstrip().startswith("//")


def test_a_source_without_the_cu_ending_compiles(tmp_path, nvcc13):
    (tmp_path / "kernel.txt").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    proc = _run(tmp_path, "compile", str(tmp_path / "kernel.txt"), "--target", "compute_75")
    assert proc.returncode == 0 and "Don't know" not in proc.stderr, proc.stderr


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path):
    config = tmp_path / "config.ini"
    config.write_bytes(b"\xef\xbb\xbf[ptxbackend]\ntarget = compute_61\n")
    os.chmod(str(config), 0o600)
    proc = _run(tmp_path, "doctor", "--json", env={"PTXBACKEND_CONFIG": str(config)})
    assert json.loads(proc.stdout)["settings"]["target"] == {"value": "compute_61", "from": str(config)}


def test_doctor_reads_like_a_checklist(tmp_path, nvcc13):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    assert _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--target", "compute_75").returncode == 0
    out = _run(tmp_path, "doctor", env={"PTXBACKEND_LIBCUDA": "/nope.so", "CUDA_CACHE_MAXSIZE": ""}).stdout
    assert "None" not in out and "(1 entry," in out, out
    lines = out.splitlines()
    settings = lines[lines.index("settings:") + 1:lines.index("environment only:")]
    assert len(set(line.rindex("(") for line in settings)) == 1, "the source column is not aligned"
    for name in ("PTXBACKEND_DISABLE", "PTXBACKEND_RECORD", "PTXBACKEND_LIBCUDA", "PTXBACKEND_CONFIG",
                 "PTXBACKEND_JIT_CACHE_MAXSIZE"):
        assert name in out
    assert any(line.startswith("driver: not available: ") and "/nope.so" in line for line in lines), out
    assert any(line.startswith("PROBLEM: ") and "PTXBACKEND_LIBCUDA" in line for line in lines), out


def test_the_hook_says_once_that_an_unknown_disable_value_leaves_it_on(tmp_path):
    env = dict(os.environ, PTXBACKEND_DISABLE="maybe", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", "import _ptxbackend_pth as h; h.install(); h.install()"],
                          env=env, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.stderr.count("PTXBACKEND_DISABLE='maybe'") == 1, proc.stderr


def test_setup_py_install_records_the_hook_files_and_byte_compiles_the_hook(tmp_path):
    """pip 21 on Python 3.6 without `wheel` runs `setup.py install`: `pip uninstall` removes what the
    record lists, and the hook module imported at every start must have its .pyc even under
    PYTHONDONTWRITEBYTECODE (distutils skips every module then)."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("setup.py", "setup.cfg", "MANIFEST.in", "README.md", "_ptxbackend_pth.py", "_ptxbackend_boot.py",
                 "_ptxbackend_env.py",
                 "ptxbackend.pth", "ptxbackend.start"):
        shutil.copy(os.path.join(REPO, name), str(source / name))
    shutil.copytree(os.path.join(REPO, "ptxbackend"), str(source / "ptxbackend"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    record = tmp_path / "record.txt"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "setup.py", "-q", "install", "--root", str(tmp_path / "root"),
                           "--record", str(record), "--single-version-externally-managed"], cwd=str(source),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    names = [os.path.basename(line) for line in record.read_text().splitlines()]
    assert "ptxbackend.pth" in names and "ptxbackend.start" in names
    compiled = [line for line in record.read_text().splitlines()
                if os.path.basename(line).startswith("_ptxbackend_pth.") and line.endswith(".pyc")]
    assert compiled and all(os.path.isfile(str(tmp_path / "root") + path) for path in compiled), compiled


@pytest.mark.parametrize("argv", [["cache", "push"], ["doctor"]])
def test_a_fleet_store_that_does_not_answer_is_named_once_and_failed_once(tmp_path, argv):
    key = tmp_path / "fleet.key"
    key.write_bytes(os.urandom(32))
    os.chmod(str(key), 0o600)
    proc = _run(tmp_path, *argv, env={"PTXBACKEND_REMOTE": "redis://127.0.0.1:1/0",  # nothing listens on 1
                                      "PTXBACKEND_REMOTE_KEY_FILE": str(key)})
    text = proc.stdout + proc.stderr
    # doctor: an unreachable store is a warning (exit 0 unless something else is a problem)
    assert proc.returncode == (1 if argv[0] == "cache" else proc.returncode) and "Traceback" not in text, text
    assert "does not answer" in text or "cache push to the fleet store" in text, text
    assert "fleet store fleet store" not in text and "the fleet store fleet" not in text, text
    assert "failed: failed" not in text and "(failed: " not in text, text


def test_cache_push_of_entries_to_a_store_that_does_not_answer_is_one_line(tmp_path, nvcc13):
    key = tmp_path / "fleet.key"
    key.write_bytes(os.urandom(32))
    os.chmod(str(key), 0o600)
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n')
    assert _run(tmp_path, "compile", str(tmp_path / "k.cu"), "--device-cc", "7.5").returncode == 0
    proc = _run(tmp_path, "cache", "push", env={"PTXBACKEND_REMOTE": "redis://127.0.0.1:1/0",
                                               "PTXBACKEND_REMOTE_KEY_FILE": str(key)})
    # the command's own error only, not the library's fail-open warning as well
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if line.startswith("ptxbackend: error: cache push")], \
        proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_cache_flags_before_the_action_still_work_as_in_0_4_0(tmp_path):
    """Each action has its own flags now; `cache --cache-dir D info` (flags first) still means the same."""
    other = tmp_path / "other"
    proc = _run(tmp_path, "cache", "--cache-dir", str(other), "--json", "info")
    assert proc.returncode == 0 and json.loads(proc.stdout)["cache_dir"] == str(other), proc.stderr
    proc = _run(tmp_path, "cache", "--max-size", "1M", "info")
    assert proc.returncode == 2 and "cache info does not take --max-size (it goes with prune)" in proc.stderr
    proc = _run(tmp_path, "cache", "--json")
    assert proc.returncode == 2 and "cache needs an ACTION" in proc.stderr, proc.stderr
