"""Every user-visible knob is documented in one place: docs/configuration.md."""

import os
import re

from conftest import REPO


def test_every_environment_variable_is_documented():
    used = set()
    sources = [os.path.join(REPO, name) for name in ("_ptxbackend_boot.py", "_ptxbackend_pth.py", "_ptxbackend_env.py")]
    for base, _dirs, files in os.walk(os.path.join(REPO, "ptxbackend")):
        sources.extend(os.path.join(base, f) for f in files if f.endswith(".py"))
    for path in sources:
        with open(path) as handle:
            used.update(re.findall(r"PTXBACKEND_[A-Z0-9_]*[A-Z0-9]", handle.read()))
    with open(os.path.join(REPO, "docs", "configuration.md")) as handle:
        documented = set(re.findall(r"PTXBACKEND_[A-Z0-9_]*[A-Z0-9]", handle.read()))
    assert used and used - documented == set()
