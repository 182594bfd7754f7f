"""The preflight checks: everything a run would trip over in its first hour, found without devices.

Two callers, one set of checks:
* ``python -m verl_laminar.preflight <overrides>`` composes the config and runs all rows, the construction of verl's
  trainer class included (every assert verl and Laminar make before touching a device);
* every ``+laminar=enabled`` run calls :func:`start_checks` from the trainer's constructor: the estimates
  (bucket, memory, chain, timeouts) with the same thresholds, raising :class:`PreflightError` on a failing row.

A row is ``ok``, ``warn`` (works, but look) or ``fail`` (would break; ``detail`` names the key and the fix).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import shutil
from typing import Any, Callable, Iterator, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_laminar.preflight.fleet import check_fleet
from verl_laminar.preflight.placement import Placement, check_placement, check_split, placement  # noqa: F401
from verl_laminar.preflight.report import (  # noqa: F401  (re-exported: callers import them from checks)
    BUCKET_KEY,
    CUDA_RESERVE_BYTES,
    FAIL,
    GIB,
    OK,
    UTIL_KEY,
    WARN,
    Options,
    PreflightError,
    Report,
    Row,
    _gb,
    _get,
    trainer_mode,
)

logger = logging.getLogger(__name__)


# ---- weights ----
def check_weights(report: Report, cfg: DictConfig, opts: Options, ipc: bool) -> Optional[int]:
    """Version size and the bucket rule; returns the version's bytes (None when the sizes are unknown)."""
    from verl_laminar.models.sizes import ModelSizeError, model_sizes

    path = str(_get(cfg, "actor_rollout_ref.model.path", ""))
    dtype = str(_get(cfg, "actor_rollout_ref.rollout.dtype", "bfloat16"))
    try:
        sizes = model_sizes(path, opts.model_config)
    except (ModelSizeError, OSError, KeyError) as e:
        report.add("weights.version", FAIL, f"model {path!r}: sizes unknown", str(e))
        return None
    version = sizes.version_bytes(dtype)
    name, largest = sizes.largest(dtype)
    report.facts.update(model=path, model_sizes_from=sizes.source, parameters=sizes.parameters, dtype=dtype,
                        version_bytes=version, largest_tensor=name, largest_tensor_bytes=largest)
    report.add("weights.version", OK, f"{sizes.parameters / 1e9:.2f} B parameters, {_gb(version)} per version in "
               f"{dtype} (sizes from {sizes.source})")
    mode = trainer_mode(cfg)
    if mode == "sync" and bool(_get(cfg, "actor_rollout_ref.hybrid_engine", True)):
        report.add("weights.bucket", OK, "colocated rollouts: weights move inside each GPU (no bucket transfer)")
        return version
    bucket = int(float(_get(cfg, BUCKET_KEY, 2048)) * 1024**2)
    util = float(_get(cfg, UTIL_KEY, 0.5))
    report.facts.update(bucket_bytes=bucket, gpu_memory_utilization=util)
    value = f"largest tensor {name} {_gb(largest)} vs bucket {_gb(bucket)}"
    if not ipc:
        # host shared-memory path (no CUDA IPC): a tensor must fit the bucket verl allocates
        if largest > bucket:
            need_mb = -(-largest // 1024**2)
            report.add("weights.bucket", FAIL, value, f"without CUDA IPC a tensor travels inside one bucket; set "
                       f"{BUCKET_KEY}={need_mb} or more")
        else:
            report.add("weights.bucket", OK, value)
        return version
    # CUDA: verl's sender keeps one bucket on the rollout GPU and sends a larger tensor on its own (Laminar copies
    # it to the device first); both live outside vLLM's share of the GPU
    headroom = opts.gpu_memory_gib * GIB * (1.0 - util) - CUDA_RESERVE_BYTES
    need = bucket + (largest if largest > bucket else 0)
    report.facts.update(gpu_headroom_bytes=int(headroom), bucket_transfer_bytes=need)
    value += f"; needs {_gb(need)} beside vLLM's {util:.2f} of {opts.gpu_memory_gib:g} GiB (free {_gb(headroom)})"
    if need > headroom:
        max_util = 1.0 - (need + CUDA_RESERVE_BYTES) / (opts.gpu_memory_gib * GIB)
        fix = (f"lower {UTIL_KEY} to {max_util:.2f} or less" if max_util > 0.3 else
               "use GPUs with more memory or a higher tensor_model_parallel_size")
        if largest > bucket:
            fix += f" (a bucket of {-(-largest // 1024**2)} MiB would carry the largest tensor with no extra copy)"
        report.add("weights.bucket", FAIL if opts.memory_estimate_fails else WARN, value,
                   f"the weight transfer would run a {opts.gpu_memory_gib:g} GiB rollout GPU out of memory at the "
                   f"first refresh: {fix} (preflight: --gpu-memory-gib for another GPU size)")
    elif largest > bucket:
        report.add("weights.bucket", WARN, value, f"{name} is sent on its own through a device copy; "
                   f"{BUCKET_KEY}={-(-largest // 1024**2)} would carry it in the bucket")
    else:
        report.add("weights.bucket", OK, value)
    return version


# ---- relays (Laminar only) ----
def node_role(opts: Options, single_host: bool) -> str:
    if opts.node_role != "auto":
        return opts.node_role
    if single_host:
        return "master"  # one host: its relay is the master, and the rollouts read from it
    from verl_laminar.platform.cpu import no_accelerator_present

    return "none" if no_accelerator_present() else "rollout"


def check_relays(report: Report, cfg: DictConfig, lam: Any, opts: Options, p: Placement, version: int) -> None:
    from verl_laminar.policy.relay_memory import relay_host_bytes
    from verl_laminar.policy.timeouts import broadcast_time_s, refresh_deadlines

    keep = int(lam.relay.keep_versions)
    need = {role: relay_host_bytes(version, keep, role) for role in ("rollout", "master", "trainer")}
    # laminar.replace: while a dead replica's groups wait for a replacement, every relay holds their version beyond
    # keep_versions, when there is room for it (RelayStore.hold); without room those groups are lost instead
    held = 1 if lam.replace.enabled else 0
    parking = {role: relay_host_bytes(version, keep, role, held) for role in need}
    report.facts.update(relay_host_bytes=need, relay_host_bytes_parking=parking, keep_versions=keep, relays=p.relays)
    report.add("relay.host_memory", OK, f"per rollout node {_gb(need['rollout'])} ({need['rollout'] / version:.2f}x "
               f"the version), master node {_gb(need['master'])}, trainer-only nodes {_gb(need['trainer'])} "
               f"(laminar.relay.keep_versions={keep})" + (f"; {_gb(parking['rollout'])} and "
                                                         f"{_gb(parking['master'])} while a dead replica's groups "
                                                         "are parked" if held else ""))
    role = node_role(opts, p.single_host)
    if role in ("rollout", "master"):
        free = shutil.disk_usage(opts.shm_path).free if os.path.isdir(opts.shm_path) else 0
        report.facts["shm_free_bytes"] = free
        value = f"{opts.shm_path} free {_gb(free)} on this node ({role}), needs {_gb(need[role])}"
        if free < need[role]:
            report.add("relay.dev_shm", FAIL, value, f"enlarge {opts.shm_path} to at least {_gb(need[role])} "
                       "(docker run --shm-size, Kubernetes emptyDir medium: Memory with sizeLimit) or lower "
                       "laminar.relay.keep_versions")
        elif free < parking[role]:
            report.add("relay.dev_shm", WARN, value + f", {_gb(parking[role])} to park a dead replica's groups",
                       f"enlarge {opts.shm_path} to {_gb(parking[role])}: with less, the groups of a dead replica "
                       "that no live replica serves are lost (refilled by verl) instead of waiting for its "
                       "replacement")
        else:
            report.add("relay.dev_shm", OK, value)
    else:
        report.add("relay.dev_shm", WARN, f"this node hosts no relay (role {role})",
                   f"each rollout node needs {_gb(need['rollout'])} free in /dev/shm and the master's node "
                   f"{_gb(need['master'])}: run the preflight there with --node-role rollout (or master)")
    settings = lam.refresh_settings()
    if opts.link_gbps is not None:
        settings = dataclasses.replace(settings, link_gbps=float(opts.link_gbps))
    link = settings.link_gbps
    t_chain = broadcast_time_s(version, p.relays, link)
    t_hop = broadcast_time_s(version, 2, link)  # one copy over one hop: what a pull from a neighbour takes
    deadlines = refresh_deadlines(version, p.relays, settings)
    report.facts.update(link_gbps=link, broadcast_s=t_chain, hop_copy_s=t_hop,
                        wait_readable_s=deadlines.wait_readable_s, load_s=deadlines.load_s, retries=deadlines.retries)
    report.add("relay.broadcast", OK, f"T*(p={p.relays}) = {t_chain:.1f} s for {_gb(version)} at {link:g} Gbit/s "
               "per hop")
    check_delta(report, lam, version, t_chain)
    report.add("refresh.timeouts", OK, f"a replica waits up to {deadlines.wait_readable_s:.0f} s without a new "
               f"chunk, loads within {deadlines.load_s:.0f} s, {deadlines.retries} retries")
    # the checkpoint engine's own timeout bounds every relay call, a pull of a whole version from the upstream
    # relay (when the local one died) included: it must outlast one copy over one hop
    given = _get(cfg, ENGINE_TIMEOUT_KEY)
    engine_timeout = float(given) if given is not None else engine_timeout_s(deadlines, t_hop)
    report.facts["engine_timeout_s"] = engine_timeout
    value = f"{ENGINE_TIMEOUT_KEY.rsplit('.', 1)[1]} {engine_timeout:.0f} s vs one hop's copy {t_hop:.0f} s"
    if engine_timeout < t_hop:
        report.add("relay.engine_timeout", FAIL, value, f"{ENGINE_TIMEOUT_KEY}={given} is shorter than one copy "
                   f"of a version over one hop at {link:g} Gbit/s: remove it (derived from the chain cost model) or "
                   f"set it to {math.ceil(engine_timeout_s(deadlines, t_hop))} or more")
    else:
        report.add("relay.engine_timeout", OK, value + ("" if given is not None else " (derived)"))


def check_delta(report: Report, lam: Any, version: int, t_chain: float) -> None:
    """laminar.relay.delta: what goes down the chain. The deadlines above price whole versions, which a delta
    never exceeds (auto sends whichever is smaller) and which every fallback sends."""
    from verl_laminar.relay.delta import MAX_DELTA_SHARE

    mode, keep = lam.relay.delta, int(lam.relay.keep_versions)
    report.facts["relay_delta"] = mode
    if mode == "off":
        report.add("relay.delta", OK, "off: every version goes whole")
    elif keep < 2:
        report.add("relay.delta", WARN, f"auto with laminar.relay.keep_versions={keep}: a relay rebuilds version n "
                   "from its n - 1 beside it, so every version goes whole",
                   "set laminar.relay.keep_versions=2 (one more copy of the model in each node's /dev/shm) for "
                   "deltas, or laminar.relay.delta=off to say so")
    else:
        report.add("relay.delta", OK, f"auto: a version whose delta is at most {MAX_DELTA_SHARE:.0%} of it "
                   f"({_gb(int(MAX_DELTA_SHARE * version))}) goes as a delta, taking about that share of "
                   f"T* = {t_chain:.1f} s (at lr 1e-6 ~1% of bf16 values change a step: docs/relay.md); each "
                   f"relay keeps its last delta, up to {_gb(int(MAX_DELTA_SHARE * version))} of /dev/shm beyond "
                   "relay.host_memory; the deadlines assume whole versions")


def check_transport(report: Report, lam: Any, role: str) -> None:
    """laminar.relay.transport=mooncake needs Mooncake's Transfer Engine on every relay node; without it each relay
    fails at start, after the cluster has been allocated. Checked on this node, as relay.dev_shm is."""
    relay = lam.relay
    if relay.transport != "mooncake":
        report.add("relay.transport", OK, f"{relay.transport} (nothing to install)")
        return
    from verl_laminar.relay.mooncake import MooncakeUnavailable, load_engine_class

    value = f"mooncake, protocol {relay.protocol}" + (f", device {relay.device}" if relay.device else "")
    try:
        load_engine_class()
    except MooncakeUnavailable as e:
        if role in ("rollout", "master"):
            report.add("relay.transport", FAIL, value + f": not importable on this node ({role})", str(e))
        else:  # a head node or laptop need not have it: only the relay nodes do
            report.add("relay.transport", WARN, value + f": not importable here (role {role}, no relay)",
                       f"{e}; run the preflight on a relay node with --node-role rollout (or master)")
        return
    report.add("relay.transport", OK, value + ": Mooncake's Transfer Engine imports on this node")


REQUEST_IDS_ENV = "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"
REQUEST_IDS_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{REQUEST_IDS_ENV}"


def check_request_ids(report: Report, cfg: DictConfig, lam: Any, environ: Optional[dict] = None) -> None:
    """Repack aborts a request on its old replica by the id Laminar gave it; vLLM keeps that id only with
    ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION`` set (``+laminar=enabled`` sets it in the job's runtime_env). Without
    it every abort fails and a moved tail blocks its replica's refresh until it ends."""
    if not lam.repack.enabled:
        report.add("repack.request_ids", OK, "repack off (no aborts)")
        return
    environ = os.environ if environ is None else environ
    value = _get(cfg, REQUEST_IDS_KEY)
    where = REQUEST_IDS_KEY
    if value is None:
        value, where = environ.get(REQUEST_IDS_ENV), f"${REQUEST_IDS_ENV}"
    try:
        kept = value is not None and int(str(value)) != 0
    except ValueError:
        kept = False
    if kept:
        report.add("repack.request_ids", OK, f"vLLM keeps Laminar's request ids ({where}={value})")
        return
    report.add("repack.request_ids", FAIL, f"{REQUEST_IDS_ENV} is {value!r}: vLLM suffixes request ids and every "
               "repack abort would fail", f"set ++{REQUEST_IDS_KEY}='1' (what +laminar=enabled sets), or "
               "laminar.repack.enabled=false")


ENGINE_TIMEOUT_KEY = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.laminar.timeout_s"
EXPECTED_BYTES_KEY = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.laminar.expected_bytes"


def engine_timeout_s(deadlines: Any, hop_copy_s: float) -> float:
    """The relay checkpoint engine's call timeout when the user sets none: the router's readable-wait deadline
    (already a multiple of the chain's time), and never less than three copies over one hop."""
    return max(deadlines.wait_readable_s, 3.0 * hop_copy_s)


# ---- the whole run ----
@contextlib.contextmanager
def _row(report: Report, check: str, ok_value: str = "passed") -> Iterator[None]:
    """Run one check; an exception becomes its failing row (the message is verl's or ours, with the fix)."""
    n = len(report.rows)
    try:
        yield
    except Exception as e:  # noqa: BLE001 - any construction-time error is exactly what the preflight reports
        report.add(check, FAIL, type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else repr(e))
        return
    if len(report.rows) == n:
        report.add(check, OK, ok_value)


_IN_PREFLIGHT = False  # the trainer's own start checks are not repeated inside the preflight's construction


def in_preflight() -> bool:
    return _IN_PREFLIGHT


def construct_trainer(cfg: DictConfig) -> None:
    """Build verl's trainer class for ``trainer.v1.trainer_mode`` as TaskRunnerV1 does, without ``init()``: every
    check verl (and Laminar's trainer) makes in a constructor runs, and nothing touches a device or Ray."""
    global _IN_PREFLIGHT
    from verl.trainer.ppo.v1 import get_trainer_cls

    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        OmegaConf.update(cfg, "transfer_queue.enable", True, force_add=True)
    OmegaConf.resolve(cfg)
    _IN_PREFLIGHT = True
    try:
        get_trainer_cls(trainer_mode(cfg))(config=cfg)
    finally:
        _IN_PREFLIGHT = False


def run_checks(cfg: DictConfig, opts: Optional[Options] = None,
               platform: Optional[Callable[[Report, DictConfig], bool]] = None) -> Report:
    """Every check on a composed config; ``platform`` adds the platform row and returns whether the job is CPU."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_laminar.data.validate import check_data_files

    opts = opts or Options()
    report = Report()
    mode = trainer_mode(cfg)
    report.facts["trainer_mode"] = mode
    cpu_job = platform(report, cfg) if platform is not None else False
    lam = None
    prepared = cfg
    if mode == "laminar":
        # the trainer/rollout split of a colocated recipe, and why; verl checks the split config, as in a run
        # (patches.laminar_split applies it before main_ppo's validate_config)
        prepared = copy.deepcopy(cfg)
        plan = check_split(report, cfg)
        if plan is not None:
            from verl_laminar.config.split import write_split

            write_split(prepared, plan)
    with _row(report, "verl.validate_config"):
        validate_config(config=prepared, use_reference_policy=need_reference_policy(prepared),
                        use_critic=need_critic(prepared))
    with _row(report, "data.files"):
        check_data_files(cfg)
    if mode == "laminar":
        from verl_laminar.config import prepare as settings

        with _row(report, "laminar.config"):
            lam = settings.prepare_config(prepared)
            report.facts["parameter_sync_step"] = int(_get(prepared, settings.SYNC_STEP_KEY))
    if opts.construct_trainer:
        with _row(report, "trainer.construct", f"{mode} trainer constructed (verl's and Laminar's asserts)"):
            construct_trainer(cfg)
    p = placement(prepared, single_host=cpu_job)  # after the split: the devices the run will have
    check_placement(report, prepared, p)
    if lam is not None:
        check_transport(report, lam, node_role(opts, p.single_host))
        check_request_ids(report, prepared, lam)
        check_fleet(report, prepared, lam)
    version = check_weights(report, prepared, opts, ipc=not cpu_job)
    if lam is not None and version is not None:
        check_relays(report, prepared, lam, opts, p, version)
    return report


def start_checks(cfg: DictConfig, lam: Any, opts: Optional[Options] = None) -> Report:
    """The estimates at the start of a ``+laminar=enabled`` run (the config is already prepared); raises
    :class:`PreflightError` naming every failing row, logs the table otherwise."""
    from verl_laminar.platform.cpu import cpu_platform_requested

    opts = opts or Options(construct_trainer=False, memory_estimate_fails=False)
    cpu_job = cpu_platform_requested()
    report = Report()
    p = placement(cfg, single_host=cpu_job)
    check_placement(report, cfg, p)
    check_transport(report, lam, node_role(opts, p.single_host))
    check_request_ids(report, cfg, lam)
    check_fleet(report, cfg, lam)
    version = check_weights(report, cfg, opts, ipc=not cpu_job)
    if version is not None:
        check_relays(report, cfg, lam, opts, p, version)
    if report.failed:
        raise PreflightError("laminar preflight failed at start:\n" + report.table())
    # workers build their checkpoint engine from this config: give them the derived timeout, and the version's
    # size so that the first publish already copies into a prepared (pinned, on CUDA) buffer
    derived = {ENGINE_TIMEOUT_KEY: float(math.ceil(report.facts.get("engine_timeout_s", 0))) or None,
               EXPECTED_BYTES_KEY: report.facts.get("version_bytes")}
    with open_dict(cfg):
        for key, value in derived.items():
            if value is not None and _get(cfg, key) is None:
                OmegaConf.update(cfg, key, value, force_add=True)
    logger.info("laminar preflight at start:\n%s", report.table())
    return report
