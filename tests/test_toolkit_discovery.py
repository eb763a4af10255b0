"""Where nvcc is found: the default toolkit folder off PATH, and error messages naming the real origin."""

import os

import pytest

from ptxbackend.compilers import nvcc as nvcc_module
from ptxbackend.errors import CompilerNotFoundError


def _fake_toolkit(tmp_path, nvcc13):
    # The layout installers make (bin/nvcc), its nvcc the real one through a symlink.
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(nvcc13), str(root / "bin" / "nvcc"))
    return str(root)


def test_a_toolkit_at_the_default_place_off_path_is_found(tmp_path, monkeypatch, nvcc13):
    root = _fake_toolkit(tmp_path, nvcc13)
    monkeypatch.setattr(nvcc_module, "_DEFAULT_TOOLKIT", root)
    for name in ("PTXBACKEND_NVCC", "CUDA_PATH", "CUDA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = nvcc_module.find_nvcc()
    assert found == os.path.join(root, "bin", "nvcc")
    assert nvcc_module.NvccCompiler.locate() == found


def test_nvcc_from_the_variable_is_named_as_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVCC", str(tmp_path / "nope"))
    with pytest.raises(CompilerNotFoundError, match=r"given by the environment \(PTXBACKEND_NVCC\)"):
        nvcc_module.find_nvcc(str(tmp_path / "nope"))
