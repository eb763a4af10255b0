"""Target parsing and the auto/native policy, against real compiler identities."""

import re

import pytest

from ptxbackend.compilers.base import CompilerIdentity, archs_from_table
from ptxbackend.compilers.nvcc import nvcc_compiler
from ptxbackend.errors import TargetError
from ptxbackend.compiling.targets import Target, choose_target, parse_cc, parse_target


@pytest.mark.parametrize("text, expected, kind", [
    ("compute_75", "compute_75", "ptx"),
    ("sm_86", "sm_86", "cubin"),
    ("8.6", "sm_86", "cubin"),
    ("8.6+PTX", "sm_86,compute_86", "fatbin"),
    ("sm_61,compute_61", "sm_61,compute_61", "fatbin"),
    (" SM_61 , compute_61 ", "sm_61,compute_61", "fatbin"),
    ("sm_90a", "sm_90a", "cubin"),
    ("12.0", "sm_120", "cubin"),
])
def test_parse_target_forms(text, expected, kind):
    target = parse_target(text)
    assert str(target) == expected
    assert target.output_kind == kind


@pytest.mark.parametrize("text", ["auto", "AUTO", "native"])
def test_policy_words(text):
    assert parse_target(text) == text.lower()


@pytest.mark.parametrize("text", ["sm90", "compute_", "gfx90a", "9", "", ",", "sm_61;;x"])
def test_bad_targets_name_the_accepted_forms(text):
    with pytest.raises(TargetError) as info:
        parse_target(text)
    assert "compute_75" in str(info.value)


@pytest.mark.parametrize("text, cc", [("9.0", 90), ("90", 90), ("sm_86", 86), ("12.1", 121), ("7.5", 75)])
def test_parse_cc(text, cc):
    assert parse_cc(text) == cc


def test_parse_cc_rejects_garbage():
    with pytest.raises(TargetError):
        parse_cc("nine")


def test_runs_on_rules():
    assert Target([("sm", 80, "")]).runs_on(86)
    assert not Target([("sm", 86, "")]).runs_on(90)
    assert Target([("compute", 61, "")]).runs_on(90)
    assert not Target([("compute", 90, "")]).runs_on(86)
    assert parse_target("sm_61,compute_61").part_for(61) == "sm_61"
    assert parse_target("sm_61,compute_61").part_for(75) == "compute_61"
    assert parse_target("sm_61,compute_61").part_for(52) is None


def test_arch_table_matches_the_issue():
    assert max(archs_from_table("8.0.61")) == 62
    assert max(archs_from_table("9.2.148")) == 72
    assert max(archs_from_table("10.1")) == 75
    assert max(archs_from_table("11.0.2")) == 80
    assert max(archs_from_table("11.2.152")) == 86
    assert max(archs_from_table("11.7")) == 87
    assert max(archs_from_table("11.8")) == 90


def test_nvcc13_auto_choices(nvcc13, tmp_path):
    identity = nvcc_compiler(nvcc13, str(tmp_path)).identity
    assert choose_target("auto", identity, 90)[0] == parse_target("sm_90")
    assert choose_target("auto", identity, 120)[0] == parse_target("sm_120")
    with pytest.raises(TargetError) as info:
        choose_target("auto", identity, 61)
    message = str(info.value)
    assert "6.1" in message and "sm_75" in message and "Remedy" in message


@pytest.mark.toolkit
def test_nvcc112_auto_choices(nvcc112, tmp_path):
    identity = nvcc_compiler(nvcc112, str(tmp_path)).identity
    assert identity.version == "11.2.152"
    target, reason = choose_target("auto", identity, 90)
    assert target == parse_target("compute_86")
    assert "JIT" in reason
    assert choose_target("auto", identity, 86)[0] == parse_target("sm_86")
    with pytest.raises(TargetError) as info:
        choose_target("native", identity, 90)
    assert "sm_35..sm_86" in str(info.value)


def test_explicit_target_newer_than_device_is_refused():
    identity = CompilerIdentity("nvcc", "/x", "11.2.152", archs_from_table("11.2"), archs_from_table("11.2"), True)
    with pytest.raises(TargetError) as info:
        choose_target("compute_86", identity, 75)
    assert "7.5" in str(info.value)
    with pytest.raises(TargetError):
        choose_target("sm_80", identity, 90)


def test_explicit_target_unknown_to_toolkit_is_refused_before_compiling():
    identity = CompilerIdentity("nvcc", "/x", "11.2.152", archs_from_table("11.2"), archs_from_table("11.2"), True)
    with pytest.raises(TargetError) as info:
        choose_target("compute_90", identity, None)
    assert "compute_35..." not in str(info.value) and "sm_35..sm_86" in str(info.value)


def test_auto_without_device_says_how_to_name_one():
    identity = CompilerIdentity("nvcc", "/x", "13.0.88", [75, 90], [75, 90], True)
    with pytest.raises(TargetError) as info:
        choose_target("auto", identity, None)
    assert "PTXBACKEND_DEVICE_CC" in str(info.value)


@pytest.mark.parametrize("text", ["99.9", "0.5", "999"])
def test_a_compute_capability_no_gpu_has_is_refused(text):
    with pytest.raises(TargetError, match="not the compute capability of any NVIDIA GPU"):
        parse_cc(text)


@pytest.mark.parametrize("spec,device", [("sm_61", 61), ("compute_61", 61), ("sm_90", 61)])
def test_suggestions_only_name_targets_the_device_can_run(spec, device):
    identity = CompilerIdentity("nvcc", "/x", "13.0.88", [75, 80, 90, 120], [75, 80, 90, 120], True)
    with pytest.raises(TargetError) as info:
        choose_target(spec, identity, device)
    suggested = [int(m) for m in re.findall(r"compute_(\d+)", str(info.value).split("it knows")[-1])]
    assert all(a <= device for a in suggested), str(info.value)
    assert "PTXBACKEND_COMPILER=nvrtc" in str(info.value) or suggested
