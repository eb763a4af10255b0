"""Where nvcc comes from, as its error messages name it."""

import os

import pytest

from ptxbackend.compilers import nvcc as nvcc_module
from ptxbackend.errors import CompilerNotFoundError


def test_nvcc_from_the_variable_is_named_as_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXBACKEND_NVCC", str(tmp_path / "nope"))
    with pytest.raises(CompilerNotFoundError, match=r"given by the environment \(PTXBACKEND_NVCC\)"):
        nvcc_module.find_nvcc(str(tmp_path / "nope"))
