"""The preflight's repack.request_ids row: with repack on, vLLM must keep Laminar's request ids
(VLLM_DISABLE_REQUEST_ID_RANDOMIZATION in the job's runtime_env or the environment), or every repack abort fails."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_laminar.config import LaminarConfig
from verl_laminar.preflight.checks import FAIL, OK, REQUEST_IDS_KEY, Report, check_request_ids

ON = LaminarConfig()
OFF = LaminarConfig.from_omegaconf({"repack": {"enabled": False}})


def row(cfg_value, lam=ON, environ=None):
    cfg = OmegaConf.create({})
    if cfg_value is not None:
        OmegaConf.update(cfg, REQUEST_IDS_KEY, cfg_value, force_add=True)
    report = Report()
    check_request_ids(report, cfg, lam, environ=environ or {})
    (only,) = report.rows
    assert only.check == "repack.request_ids"
    return only


@pytest.mark.parametrize("value", ["1", 1, "2"])
def test_ids_kept_by_the_runtime_env_pass(value):
    assert row(value).status == OK


@pytest.mark.parametrize("value", [None, "0", 0, "yes"])
def test_ids_suffixed_fail_and_name_the_key_to_set(value):
    r = row(value)
    assert r.status == FAIL and REQUEST_IDS_KEY in r.detail and "repack.enabled=false" in r.detail


def test_the_environment_counts_when_the_runtime_env_is_silent():
    assert row(None, environ={"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION": "1"}).status == OK


def test_repack_off_needs_nothing():
    assert row(None, lam=OFF).status == OK
