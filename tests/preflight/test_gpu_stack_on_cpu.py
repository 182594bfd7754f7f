"""Preflight rows for the GPU stack (verl_laminar/preflight/gpu_stack.py): flash-attn vs the attention setting, and
the CUDA driver vs torch's CUDA build, from given facts (no GPU needed)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_laminar.preflight.gpu_stack import ATTN_KEY, StackFacts, check_gpu_stack, gather
from verl_laminar.preflight.report import FAIL, OK, WARN, Report

GPU_HOST = StackFacts(gpu_visible=True, flash_attn=True, torch_cuda="13.0", driver_cuda="13.0")


def _rows(cfg=None, cpu_job=False, **facts) -> dict[str, tuple[str, str, str]]:
    report = Report()
    cfg = cfg if cfg is not None else OmegaConf.create({})
    check_gpu_stack(report, cfg, cpu_job, StackFacts(**{**GPU_HOST.__dict__, **facts}))
    return {r.check: (r.status, r.value, r.detail) for r in report.rows}


def _with_attn(value: str):
    cfg = OmegaConf.create({})
    OmegaConf.update(cfg, ATTN_KEY, value, force_add=True)
    return cfg


def test_verls_stack_on_a_gpu_host_passes():
    rows = _rows()
    assert rows["gpu.attention"][0] == OK and "flash_attention_2" in rows["gpu.attention"][1]
    assert rows["gpu.driver"][0] == OK


def test_flash_attention_without_flash_attn_fails_on_a_gpu_host_naming_both_fixes():
    status, _, fix = _rows(flash_attn=False)["gpu.attention"]
    assert status == FAIL and "flash-attn 2.8.3" in fix and f"{ATTN_KEY}=sdpa" in fix


def test_flash_attention_without_flash_attn_only_warns_on_a_host_without_gpu():
    assert _rows(flash_attn=False, gpu_visible=False, driver_cuda=None)["gpu.attention"][0] == WARN


def test_sdpa_needs_no_flash_attn():
    assert _rows(_with_attn("sdpa"), flash_attn=False)["gpu.attention"][0] == OK


@pytest.mark.parametrize("driver, status", [("12.4", FAIL), ("13.0", OK), ("13.2", OK)])
def test_a_cuda_13_torch_needs_a_cuda_13_driver(driver, status):
    row = _rows(driver_cuda=driver)["gpu.driver"]
    assert row[0] == status
    if status == FAIL:
        assert ">= 580" in row[2]


def test_no_driver_fails_on_a_gpu_host_and_warns_elsewhere():
    assert _rows(driver_cuda=None)["gpu.driver"][0] == FAIL
    assert _rows(driver_cuda=None, gpu_visible=False)["gpu.driver"][0] == WARN


def test_a_cpu_torch_build_warns_for_a_gpu_job_and_a_cpu_job_gets_one_ok_row():
    assert _rows(torch_cuda=None)["gpu.driver"][0] == WARN
    assert list(_rows(cpu_job=True)) == ["gpu.stack"]


def test_the_facts_of_this_host_are_read():
    facts = gather()
    assert isinstance(facts.flash_attn, bool) and isinstance(facts.gpu_visible, bool)
