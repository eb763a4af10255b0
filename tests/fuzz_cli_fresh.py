"""A fresh fuzz of the command line (issue 26's acceptance): bad files, values and manifests.

    python tests/fuzz_cli_fresh.py [--jobs 2] [--verbose]

Builds every case from a few classes (each file-taking place given each kind of bad file, each
setting given each kind of bad value, manifest lines and config files of every wrong shape, extra
arguments), runs each as ``python -m ptxbackend ...`` in a scratch directory with a time limit of
20 s, and counts tracebacks, hangs and files touched outside the cache and the named output.  It
prints the counts per class and exits 1 unless all three are 0.  Not collected by pytest (its name);
tests/test_cli_fuzz.py holds the cases found this way, one a row.
"""

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG_S = 20
KERNEL = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
RECORD = {"key": "ab" * 32, "source": KERNEL, "options": [], "target": "compute_75", "compiler": "nvcc",
          "name": "k.cu"}

# Bad things to hand a command where it takes a file, all made in the scratch directory: a case must
# never name a real system file or device, which a broken check (as root) would replace.
BAD_FILES = ["missing", "a-dir", "fifo", "zero-device", "null-device", "full-device", "empty", "binary", "", "-",
             "loop-link", "link-to-fifo", "huge-sparse", "name\nwith newline", "x" * 5000, "proc-file",
             "not-mine", "bad-utf8-\udcff"]
# Bad values for settings.
BAD_VALUES = ["", "   ", "maybe", "-1", "nan", "inf", "1e400", "9" * 400 + "T", "\x01", "x" * 10000, "[::1",
              "redis://[::1", "0", "é", "{t}/nope", "sub/../up"]  # paths stay inside the scratch dir
KNOB_VARIABLES = ["PTXBACKEND_TARGET", "PTXBACKEND_COMPILER", "PTXBACKEND_NVCC", "PTXBACKEND_NVRTC",
                  "PTXBACKEND_DEVICE_CC", "PTXBACKEND_CACHE_DIR", "PTXBACKEND_CACHE_MAX_SIZE",
                  "PTXBACKEND_CUBIN_CACHE", "PTXBACKEND_LOCK_TIMEOUT", "PTXBACKEND_COMPILE_TIMEOUT",
                  "PTXBACKEND_LOG", "PTXBACKEND_REMOTE", "PTXBACKEND_REMOTE_MODE", "PTXBACKEND_REMOTE_TIMEOUT",
                  "PTXBACKEND_COMPILER_CHECK", "PTXBACKEND_DEPS_RECHECK", "PTXBACKEND_DISABLE",
                  "PTXBACKEND_JIT_CACHE_MAXSIZE", "PTXBACKEND_LIBCUDA", "PTXBACKEND_CONFIG", "PTXBACKEND_RECORD"]
MANIFEST_LINES = [
    "not json", "[]", "null", "5", '"text"', "{}", json.dumps(dict(RECORD, source=5)),
    json.dumps(dict(RECORD, source=None)), json.dumps(dict(RECORD, options=[["-O3"]])),
    json.dumps(dict(RECORD, options=[{"a": 1}])), json.dumps(dict(RECORD, options="-O3")),
    json.dumps(dict(RECORD, key=5)), json.dumps(dict(RECORD, target=None)), json.dumps(dict(RECORD, target=[1])),
    json.dumps(dict(RECORD, compiler="/bin/sh")), json.dumps(dict(RECORD, name=7)),
    json.dumps(dict(RECORD, options=["-ccbin", "{t}/evil.sh"])),
    json.dumps(dict(RECORD, options=["-ccbin={t}/evil.sh"])),
    json.dumps(dict(RECORD, options=["--compiler-bindir", "{t}/evil.sh"])),
    json.dumps(dict(RECORD, options=["--options-file", "{t}/opts"])),
    json.dumps(dict(RECORD, options=["-Xcompiler", "-B{t}"])),
    json.dumps(dict(RECORD, options=["--keep", "--keep-dir", "{t}"])),
    json.dumps(dict(RECORD, options=["-o", "{t}/written"])),
    json.dumps(dict(RECORD, target="sm_1")), json.dumps(dict(RECORD, source="not cuda")),
    '{"source": "\\ud800"}', "\xff\xfe garbage",
]
CONFIG_TEXTS = ["[ptxbackend\n", "[PTXBACKEND]\ntarget = compute_75\n", "\ufeff[ptxbackend]\ntarget = compute_75\n",
                "[ptxbackend]\ntarget = %(x)s\n", "[ptxbackend]\ncache_max_size = " + "9" * 400 + "\n",
                "[ptxbackend]\nnvcc = {t}/evil.sh\n", "[ptxbackend]\ntarget\n", "no section at all\n",
                "[ptxbackend]\n" + "".join("k%d = v\n" % i for i in range(2000)), "\x00\x01\x02",
                "[ptxbackend]\nlog = loud\n", "[ptxbackend]\ncache_dir =    \n"]
FILE_PLACES = [
    ("compile FILE", lambda f: ["compile", f, "--device-cc", "7.5"], None),
    ("compile -o FILE", lambda f: ["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", f], "output"),
    ("warm MANIFEST", lambda f: ["warm", f, "--device-cc", "7.5"], None),
    ("cache import FILE", lambda f: ["cache", "import", f], None),
    ("cache export FILE", lambda f: ["cache", "export", f, "--force"], "output"),
    ("warm --driver-jit-bundle FILE", lambda f: ["warm", "--libs", "cudnn", "--driver-jit-bundle", f], "output"),
    ("warm --libs FILE", lambda f: ["warm", "--libs", f], None),
]
COMMANDS_FOR_VALUES = [["cache", "info"], ["compile", "{t}/k.cu", "--device-cc", "7.5"]]
EXTRA_ARGUMENTS = [["cache", "info", "/etc/passwd"], ["cache", "list", "x"], ["cache", "verify", "x"],
                   ["cache", "prune", "x"], ["cache", "clear", "x"], ["cache", "push", "x"], ["doctor", "x"],
                   ["demo", "x"], ["warm", "--libs", ",,,"], ["warm", "--libs", " "], ["compile"],
                   ["compile", "a", "b"], ["cache", "export"], ["cache", "import", "--from-fleet", "x"],
                   ["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", "{t}/k.cu"],
                   ["compile", "{t}/k.cu", "--device-cc", "7.5", "-o", "-"], ["cache", "export", "-"],
                   ["cache", "export", "{t}/cache/inside.tgz"], ["--bogus"], ["cache", "info", "--max-size", "x"]]


def cases():
    """(class, argv, env, named output or None) for every case."""
    found = []
    for place, make, output in FILE_PLACES:
        for bad in BAD_FILES:
            path = bad if bad in ("", "-") else "{t}/" + bad
            found.append((place, make(path), {}, path if output else None))
    for variable in KNOB_VARIABLES:
        for value in BAD_VALUES:
            if variable in ("PTXBACKEND_CONFIG", "PTXBACKEND_RECORD") and value.startswith("{t}"):
                continue  # files are the file classes' job
            command = COMMANDS_FOR_VALUES[len(found) % 2]
            found.append(("setting " + variable, command, {variable: value}, None))
    for variable in ("PTXBACKEND_CONFIG", "PTXBACKEND_RECORD"):
        for bad in ("fifo", "a-dir", "zero-device", "huge-sparse", "loop-link"):
            path = "{t}/" + bad
            found.append(("file in " + variable, ["compile", "{t}/k.cu", "--device-cc", "7.5"], {variable: path},
                          None))
    for number, line in enumerate(MANIFEST_LINES):
        found.append(("manifest line", ["warm", "{t}/manifest-%d.jsonl" % number, "--device-cc", "7.5"], {}, None))
    for number, _text in enumerate(CONFIG_TEXTS):
        found.append(("config file", ["cache", "info"], {"PTXBACKEND_CONFIG": "{t}/config-%d.ini" % number}, None))
    for argv in EXTRA_ARGUMENTS:
        found.append(("arguments", argv, {}, None))
    return found


def make_files(tmp):
    def write(name, data, mode=0o600):
        path = os.path.join(tmp, name)
        with open(path, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)
    write("k.cu", KERNEL.encode())
    write("empty", b"")
    write("binary", bytes(range(256)) * 16)
    write("name\nwith newline", KERNEL.encode())
    write("evil.sh", ("#!/bin/sh\ntouch %s/evil-ran\nexec gcc \"$@\"\n" % tmp).encode(), 0o700)
    write("opts", b"-ccbin %s/evil.sh\n" % tmp.encode())
    os.mkdir(os.path.join(tmp, "a-dir"))
    os.mkfifo(os.path.join(tmp, "fifo"))
    if os.geteuid() == 0:  # copies of the real nodes (null, zero, full): the real ones are never named
        for name, minor in (("null-device", 3), ("zero-device", 5), ("full-device", 7)):
            os.mknod(os.path.join(tmp, name), stat.S_IFCHR | 0o666, os.makedev(1, minor))
    else:
        for name in ("null-device", "zero-device", "full-device"):
            os.symlink("/dev/" + name.split("-")[0], os.path.join(tmp, name))  # cannot be replaced: not root
    os.symlink("/proc/self/status", os.path.join(tmp, "proc-file"))
    write("not-mine", b"root's file\n", 0o644)
    os.symlink("loop-link", os.path.join(tmp, "loop-link"))
    os.symlink("fifo", os.path.join(tmp, "link-to-fifo"))
    with open(os.path.join(tmp, "huge-sparse"), "wb") as handle:
        handle.truncate(2 << 30)
    for number, line in enumerate(MANIFEST_LINES):
        write("manifest-%d.jsonl" % number, (line.replace("{t}", tmp) + "\n").encode("utf-8", "surrogatepass"))
    for number, text in enumerate(CONFIG_TEXTS):
        write("config-%d.ini" % number, text.replace("{t}", tmp).encode("utf-8"))


def snapshot(tmp):
    found = {}
    for base, dirs, names in os.walk(tmp):
        if base == tmp:
            dirs[:] = [d for d in dirs if d not in ("cache", "home")]
        for name in names + dirs:
            path = os.path.join(base, name)
            st = os.lstat(path)
            digest = None
            if stat.S_ISREG(st.st_mode) and st.st_size < (1 << 20):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            found[path] = (stat.S_IFMT(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode), digest)
    for system in ("/dev/null", "/dev/zero", "/dev/full", "/etc/passwd"):
        st = os.lstat(system)
        found[system] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime)
    return found


def run_case(case):
    group, argv, env, output = case
    tmp = tempfile.mkdtemp(prefix="ptxbackend-fuzz-")
    try:
        make_files(tmp)
        fill = lambda text: text.replace("{t}", tmp)  # noqa: E731
        full_env = dict((k, v) for k, v in os.environ.items() if not k.startswith("PTXBACKEND_")
                        or k.startswith("PTXBACKEND_TEST_"))
        full_env.update(PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=os.path.join(tmp, "cache"),
                        XDG_CONFIG_HOME=os.path.join(tmp, "home"), HOME=os.path.join(tmp, "home"))
        for key, value in env.items():
            full_env[key] = fill(value).replace("\udcff", "\\xff").replace("\x00", "")
        args = [fill(a).encode("utf-8", "surrogateescape") if "\udcff" in a else fill(a) for a in argv]
        before = snapshot(tmp)
        try:
            # Run inside the scratch directory: a relative path in a case lands there, where it is seen.
            proc = subprocess.run([sys.executable, "-m", "ptxbackend"] + args, env=full_env, cwd=tmp,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=HANG_S)
            out = (proc.stdout + proc.stderr).decode("utf-8", "replace")
            code, hung = proc.returncode, False
        except subprocess.TimeoutExpired as exc:
            out, code, hung = ((exc.stdout or b"") + (exc.stderr or b"")).decode("utf-8", "replace"), None, True
        after = snapshot(tmp)
        allowed = set()
        if output and code == 0:
            allowed.add(os.path.abspath(fill(output)))
        cache = os.path.join(tmp, "cache")
        if env.get("PTXBACKEND_RECORD") and code == 0:  # the manifest named to be appended to
            allowed.add(os.path.join(tmp, fill(env["PTXBACKEND_RECORD"])))
        if env.get("PTXBACKEND_CACHE_DIR", "").strip():  # a relative one is a cache inside the scratch dir
            cache = os.path.normpath(os.path.join(tmp, fill(env["PTXBACKEND_CACHE_DIR"])))
        touched = sorted(p for p in set(before) | set(after)
                         if before.get(p) != after.get(p) and p not in allowed
                         and not (p + os.sep).startswith(cache.rstrip(os.sep) + os.sep)
                         and not cache.startswith(p + os.sep))  # the directories leading to the cache
        return {"class": group, "argv": argv, "env": env, "code": code, "hung": hung,
                "traceback": "Traceback" in out, "touched": touched, "tail": out.strip()[-300:]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--verbose", action="store_true", help="print every case's outcome")
    args = parser.parse_args()
    all_cases = cases()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_case, all_cases))
    by_class = {}
    for result in results:
        row = by_class.setdefault(result["class"], [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += result["code"] == 0
        row[2] += result["traceback"]
        row[3] += result["hung"]
        row[4] += bool(result["touched"])
        bad = result["traceback"] or result["hung"] or result["touched"]
        if bad or args.verbose:
            print("%s %r %r -> %s%s%s%s\n    %s" % ("BAD" if bad else "ok ", result["argv"], result["env"],
                                                   result["code"], " TRACEBACK" if result["traceback"] else "",
                                                   " HANG" if result["hung"] else "",
                                                   " TOUCHED %s" % result["touched"] if result["touched"] else "",
                                                   result["tail"].replace("\n", "\n    ")[-300:]))
    print("%-32s %6s %8s %10s %6s %8s" % ("class", "cases", "exit 0", "tracebacks", "hangs", "touched"))
    totals = [0, 0, 0, 0, 0]
    for name, row in sorted(by_class.items()):
        print("%-32s %6d %8d %10d %6d %8d" % ((name,) + tuple(row)))
        totals = [a + b for a, b in zip(totals, row)]
    print("%-32s %6d %8d %10d %6d %8d" % (("all",) + tuple(totals)))
    return 1 if any(totals[2:]) else 0


if __name__ == "__main__":
    sys.exit(main())
