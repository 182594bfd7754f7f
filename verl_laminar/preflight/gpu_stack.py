"""Preflight rows for the GPU stack: the attention kernel verl's FSDP model will load, and the CUDA driver vs torch.

* ``gpu.attention``: verl builds the FSDP model with ``attn_implementation`` from
  ``actor_rollout_ref.model.override_config`` and defaults to ``flash_attention_2``, which needs the flash-attn
  package (verl's ``fsdp`` extra; verl's image has it). Without it the actor fails at init, minutes into the job.
* ``gpu.driver``: torch's CUDA build needs a driver of the same CUDA major version (minor-version compatibility
  covers the rest): verl 0.9.1's torch 2.11.0 is a CUDA 13.0 build, which needs driver 580 or newer, while many
  fleets run 535/550 (CUDA 12.2/12.4). ``torch.cuda`` then fails on every node.

Both are facts of the host the preflight runs on. On a host without a GPU (a login node, CI) a missing flash-attn
or driver is a warning saying where to run the check, never a failure; a CPU job needs neither.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from verl_laminar.preflight.report import FAIL, OK, WARN, Report

ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
VERL_DEFAULT_ATTN = "flash_attention_2"  # verl/workers/config/model.py (0.9.1)
# the oldest Linux driver of each CUDA major version (NVIDIA's CUDA toolkit release notes)
MIN_DRIVER = {11: "450", 12: "525", 13: "580"}


@dataclass(frozen=True)
class StackFacts:
    gpu_visible: bool  # torch sees a CUDA device on this host
    flash_attn: bool  # the flash_attn package is importable
    torch_cuda: Optional[str]  # torch.version.cuda ("13.0"); None: a CPU build
    driver_cuda: Optional[str]  # the newest CUDA the driver supports ("12.4"); None: no driver here


def driver_cuda_version() -> Optional[str]:
    """The CUDA version the installed driver supports (``cuDriverGetVersion``), or None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    out = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(out)) != 0 or out.value <= 0:
        return None
    return f"{out.value // 1000}.{out.value % 1000 // 10}"


def gather() -> StackFacts:
    import torch

    return StackFacts(gpu_visible=bool(torch.cuda.is_available()),
                      flash_attn=importlib.util.find_spec("flash_attn") is not None,
                      torch_cuda=torch.version.cuda, driver_cuda=driver_cuda_version())


def attention_row(report: Report, cfg: DictConfig, facts: StackFacts) -> None:
    attn = OmegaConf.select(cfg, ATTN_KEY) or VERL_DEFAULT_ATTN
    if "flash_attention" not in str(attn):
        report.add("gpu.attention", OK, f"{attn} (no flash-attn needed)")
    elif facts.flash_attn:
        report.add("gpu.attention", OK, f"{attn}, flash-attn importable")
    else:
        fix = (f"install flash-attn 2.8.3 (verl's fsdp extra: pip install 'verl[fsdp]==0.9.1' with verl's wheel "
               f"index, or use verl's image), or set {ATTN_KEY}=sdpa")
        where = "" if facts.gpu_visible else " on this host (no GPU here: run the preflight on a GPU node to be sure)"
        report.add("gpu.attention", FAIL if facts.gpu_visible else WARN,
                   f"{attn} but flash_attn is not importable{where}", fix)


def driver_row(report: Report, facts: StackFacts) -> None:
    if facts.torch_cuda is None:
        report.add("gpu.driver", WARN, "torch is a CPU build: a GPU job needs torch's CUDA build",
                   "install the GPU stack: pip install 'verl-laminar[gpu]' (torch 2.11.0, CUDA 13.0)")
        return
    need = int(facts.torch_cuda.split(".")[0])
    if facts.driver_cuda is None:
        status = FAIL if facts.gpu_visible else WARN
        report.add("gpu.driver", status, f"torch built for CUDA {facts.torch_cuda}; no CUDA driver on this host",
                   f"run the preflight on a GPU node; CUDA {need} needs driver >= {MIN_DRIVER.get(need, '?')}")
    elif int(facts.driver_cuda.split(".")[0]) < need:
        report.add("gpu.driver", FAIL, f"torch built for CUDA {facts.torch_cuda}, but the driver supports CUDA "
                   f"{facts.driver_cuda} only",
                   f"upgrade the driver to >= {MIN_DRIVER.get(need, '?')}, or install a torch built for CUDA "
                   f"{facts.driver_cuda.split('.')[0]} (then vLLM and flash-attn builds for it too)")
    else:
        report.add("gpu.driver", OK, f"torch CUDA {facts.torch_cuda}, driver supports CUDA {facts.driver_cuda}")


def check_gpu_stack(report: Report, cfg: DictConfig, cpu_job: bool, facts: Optional[StackFacts] = None) -> None:
    """The two rows for a GPU job (a CPU job gets one row saying they do not apply)."""
    if cpu_job:
        report.add("gpu.stack", OK, "CPU job: sdpa attention and the CPU torch build (no flash-attn, no driver)")
        return
    facts = facts or gather()
    report.facts["gpu_stack"] = facts.__dict__
    attention_row(report, cfg, facts)
    driver_row(report, facts)
