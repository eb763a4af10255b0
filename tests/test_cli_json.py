"""`--json` on the commands that report (one JSON document on stdout, the exit code unchanged), and the
progress a long command shows on a terminal."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, requires_gpu, run_on_terminal

KERNEL = 'extern "C" __global__ void k(float* y) { y[0] = %d; }\n'


def _run(env, *argv):
    return subprocess.run([sys.executable, "-m", "ptxbackend"] + list(argv), env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)


def _env(tmp_path, **changes):
    env = dict(os.environ, PYTHONPATH=REPO, PTXBACKEND_CACHE_DIR=str(tmp_path / "cache"))
    env.update(changes)
    return env


def _manifest(tmp_path, sources):
    path = tmp_path / "kernels.jsonl"
    path.write_text("".join(json.dumps({"source": source, "options": [], "target": "compute_75",
                                        "compiler": "nvcc", "name": "k%d.cu" % i}) + "\n"
                            for i, source in enumerate(sources)))
    return str(path)


def test_warm_json_gives_each_kernel_and_library_and_keeps_the_exit_code(tmp_path, nvcc13):
    env = _env(tmp_path)
    manifest = _manifest(tmp_path, [KERNEL % 1, KERNEL % 2, 'extern "C" __global__ void k() { nope }\n'])
    proc = _run(env, "warm", manifest, "--device-cc", "7.5", "--json")
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr  # a failed kernel: exit 1, as in text
    found = json.loads(proc.stdout)
    kernels = found["kernels"]
    assert (kernels["total"], kernels["compiled"], kernels["cached"], kernels["failed"]) == (3, 2, 0, 1), kernels
    assert [k["result"] for k in kernels["results"]] == ["compiled", "compiled", "failed"]
    assert [k["name"] for k in kernels["results"]] == ["k0.cu", "k1.cu", "k2.cu"]
    assert "k2.cu" in kernels["results"][2]["error"] and kernels["results"][0]["error"] is None
    assert found["ok"] is False and found["failed"] == 1 and found["libraries"] is None
    assert found["cache_dir"] == str(tmp_path / "cache") and kernels["jit_stored"] is False

    good = _manifest(tmp_path, [KERNEL % 1, KERNEL % 2])
    proc = _run(env, "warm", good, "--device-cc", "7.5", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["kernels"]["cached"] == 2 and json.loads(
        proc.stdout)["ok"] is True, proc.stdout

    # a library that cannot be warmed is a result of its own, and the manifest's results are still there
    proc = _run(env, "warm", good, "--device-cc", "7.5", "--libs", "/etc/passwd", "--json")
    assert proc.returncode == 1, proc.stderr
    found = json.loads(proc.stdout)
    library, = found["libraries"]
    assert library["name"] == "/etc/passwd" and library["ok"] is False and "not an ELF file" in library["error"]
    assert found["kernels"]["cached"] == 2 and found["failed"] == 1 and found["ok"] is False


def test_prune_json_says_what_was_removed_and_the_bytes_freed(tmp_path, nvcc13):
    env = _env(tmp_path)
    assert _run(env, "warm", _manifest(tmp_path, [KERNEL % i for i in range(3)]), "--device-cc", "7.5").returncode == 0
    listed = json.loads(_run(env, "cache", "list", "--json").stdout)["entries"]
    proc = _run(env, "cache", "prune", "--json")  # the default limit: nothing to remove
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert (found["removed"], found["bytes_freed"], found["max_size"]) == (0, 0, 1 << 30), found
    old = tmp_path / "cache" / "v1" / "nvcc-11.2.152" / "compute_86" / "ab"
    old.mkdir(parents=True)
    (old / ("ab" * 32 + ".ptx")).write_bytes(b"PTXB\x01\x00 an entry of schema 1")
    found = json.loads(_run(env, "cache", "prune", "--max-size", "1", "--json").stdout)
    assert found["removed"] == len(listed) and found["bytes_freed"] == sum(e["bytes"] for e in listed), found
    assert found["max_size"] == 1 and found["old_layouts_removed"] == [str(tmp_path / "cache" / "v1")]
    assert found["unknown"] == [] and found["cache_dir"] == str(tmp_path / "cache")


def test_json_where_there_is_no_cache_has_the_keys_of_a_cache(tmp_path):
    env = _env(tmp_path, PTXBACKEND_CACHE_DIR=str(tmp_path / "none"))
    verify = json.loads(_run(env, "cache", "verify", "--json").stdout)
    assert verify == {"cache_dir": str(tmp_path / "none"), "exists": False, "verified": 0, "repaired": False,
                      "bad": []}
    info = json.loads(_run(env, "cache", "info", "--json").stdout)
    assert info["entries"] == 0 and info["bytes"] == 0 and info["producers"] == [] and "bad" not in info
    listed = json.loads(_run(env, "cache", "list", "--json").stdout)
    assert listed == {"cache_dir": str(tmp_path / "none"), "exists": False, "entries": []}
    assert not (tmp_path / "none").exists()


def _fleet(valkey, tmp_path):
    key = tmp_path / "fleet.key"
    key.write_bytes(os.urandom(32).hex().encode())
    os.chmod(str(key), 0o600)
    return _env(tmp_path, PTXBACKEND_REMOTE=valkey.url, PTXBACKEND_REMOTE_KEY_FILE=str(key),
                PTXBACKEND_REMOTE_NAMESPACE="cli-json-%s" % tmp_path.name, PTXBACKEND_REMOTE_TIMEOUT="5")


def test_push_json_and_its_progress_on_a_terminal(valkey, tmp_path, nvcc13):
    env = _fleet(valkey, tmp_path)
    offline = dict(env)
    del offline["PTXBACKEND_REMOTE"]
    assert _run(offline, "warm", _manifest(tmp_path, [KERNEL % i for i in range(3)]),
                "--device-cc", "7.5").returncode == 0
    proc = _run(env, "cache", "push", "--json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    found = json.loads(proc.stdout)
    # three entries, their dependency sets' and producer's files: all of it, counted once each
    assert found["pushed"] >= 4 and found["bytes"] > 0 and found["withheld"] == 0, found
    assert found["cache_dir"] == str(tmp_path / "cache") and "fleet store" in found["remote"]
    proc, terminal = run_on_terminal(["cache", "push"], env)
    assert proc.returncode == 0 and "cache push [" in terminal and "%d/" % found["pushed"] in terminal, terminal
    assert proc.stdout.startswith("pushed %d files" % found["pushed"])
    quiet = _run(env, "cache", "push")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def _help(*argv):
    proc = _run(dict(os.environ, PYTHONPATH=REPO), *(list(argv) + ["--help"]))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def test_cache_help_lists_each_action_with_its_own_flags_and_an_action_help_only_its_own():
    from ptxbackend.cli.commands import _CACHE_ACTIONS, _CACHE_FLAGS
    whole = _help("cache")
    listing = whole[whole.index("each action, what it does and its flags:"):].splitlines()[1:]
    for action, what in _CACHE_ACTIONS:
        row = [i for i, line in enumerate(listing) if line.split()[:1] == [action]]
        assert len(row) == 1 and what in listing[row[0]], (action, whole)
        flags = listing[row[0] + 1]
        own = _help("cache", action)
        for _dest, flag, owners in _CACHE_FLAGS:
            # in the listing and in the action's own help exactly when the action takes it
            assert (flag in flags) == (action in owners), (action, flag, flags)
            assert (flag in own) == (action in owners), (action, flag, own)
        assert "--cache-dir" in flags and "--cache-dir" in own
        assert ("FILE" in own) == (action in ("export", "import")), own


def test_warm_help_says_which_flags_go_with_a_manifest_and_which_with_libs():
    text = _help("warm")
    kernels = text[text.index("with a MANIFEST or --from-fleet"):text.index("with --libs")]
    libraries = text[text.index("with --libs"):]
    assert "--device-cc" in kernels and "--from-fleet" in kernels and "--jobs" not in kernels
    for flag in ("--jobs", "--driver-jit-bundle", "--force"):
        assert flag in libraries, flag
    assert "--device-cc" not in libraries


def test_prune_and_clear_where_there_is_no_cache_make_none(tmp_path):
    env = _env(tmp_path, PTXBACKEND_CACHE_DIR=str(tmp_path / "none"))
    for action in ("prune", "clear"):
        proc = _run(env, "cache", action)
        assert proc.returncode == 0 and "nothing to %s" % action in proc.stdout, proc.stdout + proc.stderr
    found = json.loads(_run(env, "cache", "prune", "--json").stdout)
    assert found["exists"] is False and found["removed"] == 0 and found["bytes_freed"] == 0
    assert not (tmp_path / "none").exists()
    (tmp_path / "notes").mkdir()  # a directory of other things is no cache: tidying it makes no v4/ in it
    env["PTXBACKEND_CACHE_DIR"] = str(tmp_path / "notes")
    assert _run(env, "cache", "clear").returncode == 0 and os.listdir(str(tmp_path / "notes")) == []


@pytest.mark.gpu
@requires_gpu
def test_import_json_of_a_driver_jit_bundle(tmp_path):
    from ptxbackend.deploy import jit_bundle
    jit = tmp_path / "ComputeCache"
    (jit / "a" / "3").mkdir(parents=True)
    (jit / "index").write_bytes(b"index" * 100)
    (jit / "a" / "3" / "c0ffee").write_bytes(os.urandom(5000))
    lib = tmp_path / "libcurand.so.10"
    lib.write_bytes(b"\x7fELF library" * 100)
    jit_bundle.pack(str(jit), [str(lib)], str(tmp_path / "jit.tgz"), jit_bundle.this_machine())
    proc = _run(_env(tmp_path), "cache", "import", str(tmp_path / "jit.tgz"), "--json")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["imported"] == str(tmp_path / "jit.tgz") and found["added"] is None
    assert found["driver_jit"]["libraries"] == ["libcurand.so.10"] and found["driver_jit"]["files"] == 2
    assert found["driver_jit"]["bytes"] == 5500 and found["driver_jit"]["into"].startswith(str(tmp_path / "cache"))


def _commands():
    """``{"doctor": parser, ..., "cache info": parser, ...}`` of the program's own parser."""
    from ptxbackend.cli.commands import build_parser
    found = {}
    for name, sub in build_parser()._subparsers._group_actions[0].choices.items():
        if sub._subparsers is None:
            found[name] = sub
        else:
            for action, action_parser in sub._subparsers._group_actions[0].choices.items():
                found["%s %s" % (name, action)] = action_parser
    return found


def _table_rows(text, heading):
    section = text[text.index(heading):]
    section = section[:section.index("\n## ", 1)]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_usage_documents_every_json_command_and_every_commands_exit_codes():
    with open(os.path.join(REPO, "docs", "usage.md")) as handle:
        text = handle.read()
    json_rows = [row.split("|")[1] for row in _table_rows(text, "## Machine-readable output")]
    exit_rows = [row.split("|")[1] for row in _table_rows(text, "## Exit codes of the `ptxbackend` command")]

    def named(command, rows):
        # "`cache prune`, `clear`" names cache prune and cache clear
        words = command.split()
        return [row for row in rows if "`%s`" % command in row or len(words) == 2 and row.strip().startswith(
            "`%s " % words[0]) and "`%s`" % words[1] in row]
    for command, parser in sorted(_commands().items()):
        takes_json = any("--json" in a.option_strings and a.help != "==SUPPRESS==" for a in parser._actions)
        assert len(named(command, json_rows)) == (1 if takes_json else 0), command
        assert len(named(command, exit_rows)) == 1, command


class _Terminal(object):
    def __init__(self):
        self.writes = []

    def isatty(self):
        return True

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass


def test_progress_redraws_a_few_times_a_second_and_ends_its_line_once():
    from ptxbackend.deploy.replay import Progress
    terminal = _Terminal()
    meter = Progress(100000, "cache push", stream=terminal)
    for _ in range(100001):  # one step more than announced (a file that came meanwhile)
        meter.step()
    text = "".join(terminal.writes)
    assert len(terminal.writes) < 200, len(terminal.writes)  # not a write per step
    assert text.endswith("100000/100000 \n") and text.count("\n") == 1, text[-200:]
    counting = _Terminal()
    meter = Progress(None, "cache verify", stream=counting, unit="entries checked")
    for _ in range(5):
        meter.step()
    meter.finish()
    meter.finish()
    assert "".join(counting.writes).endswith("cache verify: 5 entries checked \n")
    assert "".join(counting.writes).count("\n") == 1
    piped = _Terminal()
    piped.isatty = lambda: False
    meter = Progress(3, "warm kernels", stream=piped)
    for _ in range(3):
        meter.step()
    meter.finish()
    assert piped.writes == []  # a log or a pipe gets the result line only
    # a command that fails part way: its error starts a line of its own, not after the bar
    broken = _Terminal()
    meter = Progress(10, "cache export", stream=broken)
    meter.step()
    Progress.end_open_line()
    Progress.end_open_line()
    assert "".join(broken.writes).endswith("1/10 \n") and "".join(broken.writes).count("\n") == 1
    # a line said between two steps (warm's worker notes): on a line of its own, the bar drawn again after
    talk = _Terminal()
    meter = Progress(2, "warm libraries", stream=talk)
    meter.step("cudnn")
    Progress.end_open_line()
    talk.write("  a worker note\n")
    meter.step("cublas")
    assert "".join(talk.writes).endswith("1/2 cudnn\n  a worker note\n\rwarm libraries [%s] 2/2 cublas\n" % ("#" * 30))
