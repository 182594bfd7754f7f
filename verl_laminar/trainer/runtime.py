"""Start-up pieces of the Laminar trainer: config preparation, the relay group, the replica handles.

Kept apart from the trainer class so each piece is testable without a Ray cluster or a model.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("LAMINAR_LOGGING_LEVEL", "INFO"))  # start-up decisions belong in the run's record

AGENT_LOOP_MANAGER = "verl_laminar.rollout.agent_loop.LaminarAgentLoopManager"
SYNC_STEP_KEY = "trainer.v1.laminar.parameter_sync_step"
WARMUP_KEY = "trainer.v1.laminar.num_warmup_batches"
GROUPS_PER_BATCH_KEY = "laminar.dispatch.groups_per_batch"

# Runtime keys +laminar=enabled should carry; filled here (and logged) when a config lacks them, so the
# trainer runs on any composition that selected trainer_mode=laminar.
RUNTIME_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class": AGENT_LOOP_MANAGER,
    WARMUP_KEY: 2,
}
CHECKPOINT_ENGINE_KEY = "actor_rollout_ref.rollout.checkpoint_engine"


def derive_parameter_sync_step(config: DictConfig) -> int:
    """Mini-batch updates between two publications: ``train_batch_size / ppo_mini_batch_size``.

    The paper's step is 16 mini-batch updates on 512 prompts, then one publication. verl's separate_async base
    samples ``train_batch_size / parameter_sync_step`` prompts per update and asserts
    ``train_batch_size == parameter_sync_step * ppo_mini_batch_size``, so the value follows from the batch; a
    recipe only sets it to say the same thing twice, and a contradicting value is an error here, not an assert
    deep in verl's constructor.
    """
    batch = int(config.data.train_batch_size)
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    if mini < 1 or batch % mini:
        raise ValueError(
            f"data.train_batch_size={batch} is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size={mini}: "
            "Laminar publishes weights after train_batch_size / ppo_mini_batch_size mini-batch updates; choose a "
            "train_batch_size that is a multiple of ppo_mini_batch_size")
    derived = batch // mini
    given = OmegaConf.select(config, SYNC_STEP_KEY, default=None)
    if given is not None and int(given) != derived:
        raise ValueError(
            f"{SYNC_STEP_KEY}={given}, but data.train_batch_size / actor_rollout_ref.actor.ppo_mini_batch_size = "
            f"{batch} / {mini} = {derived} mini-batch updates per publication; remove {SYNC_STEP_KEY} (it is "
            f"derived from the batch) or set it to {derived}")
    return derived


def prepare_config(config: DictConfig) -> Any:
    """Validate the laminar block and align verl's keys with it; returns the typed ``LaminarConfig``."""
    from verl_laminar.config import validate_and_migrate
    from verl_laminar.data.validate import check_data_files

    lam = validate_and_migrate(config)
    check_data_files(config)
    if bool(OmegaConf.select(config, "actor_rollout_ref.hybrid_engine", default=True)):
        raise ValueError("actor_rollout_ref.hybrid_engine=True: Laminar's rollouts are standalone replicas that "
                         "never pause for training; set actor_rollout_ref.hybrid_engine=False and give them "
                         "devices with actor_rollout_ref.rollout.nnodes / n_gpus_per_node")
    with open_dict(config):
        for key, value in RUNTIME_DEFAULTS.items():
            if OmegaConf.select(config, key, default=None) is None:
                logger.info("laminar: %s not set; using %r", key, value)
                OmegaConf.update(config, key, value, force_add=True)
        manager = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class")
        if manager != AGENT_LOOP_MANAGER:
            raise ValueError(f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager!r}: Laminar needs "
                             f"{AGENT_LOOP_MANAGER} (it pins every request of a group to one replica and version)")
        sync_step = derive_parameter_sync_step(config)
        if OmegaConf.select(config, SYNC_STEP_KEY, default=None) is None:
            logger.info("laminar: %s = train_batch_size / ppo_mini_batch_size = %d (mini-batch updates per "
                        "publication)", SYNC_STEP_KEY, sync_step)
        OmegaConf.update(config, SYNC_STEP_KEY, sync_step, force_add=True)
        # the relay stores and sends each version in the rollout's dtype (verl's FSDP actor keeps fp32 masters:
        # twice the bytes on every node and every hop); the engine casts floating-point tensors to it
        dtype_key = f"{CHECKPOINT_ENGINE_KEY}.engine_kwargs.laminar.dtype"
        if OmegaConf.select(config, dtype_key, default=None) is None:
            OmegaConf.update(config, dtype_key, str(OmegaConf.select(config, "actor_rollout_ref.rollout.dtype",
                                                                     default="bfloat16")), force_add=True)
        # verl's separate_async base reads its own keys; one source of truth: trainer.v1.laminar
        for key in ("parameter_sync_step", "num_warmup_batches"):
            value = OmegaConf.select(config, f"trainer.v1.laminar.{key}")
            OmegaConf.update(config, f"trainer.v1.separate_async.{key}", value, force_add=True)
        check_off_policy_threshold(config, lam.buffer.max_staleness)
        # verl's bound counts steps since submission and drops; Laminar bounds n - j itself (policy.bound)
        OmegaConf.update(config, OFF_POLICY_KEY, None, force_add=True)
    return lam


OFF_POLICY_KEY = "trainer.v1.sampler.max_off_policy_threshold"
VERL_OFF_POLICY_DEFAULT = 8  # verl's trainer/config/ppo_trainer.yaml (a contract test pins it)


def check_off_policy_threshold(config: DictConfig, max_staleness: Optional[int]) -> None:
    """verl's staleness bound drops a trajectory once ``global_steps - submitted + 1 > threshold``; under Laminar
    the bound is ``laminar.buffer.max_staleness`` (admission and the trainer's wait: nothing finished is dropped).
    verl's default passes with a log line; any other value a user set stops the run, naming the Laminar key."""
    value = OmegaConf.select(config, OFF_POLICY_KEY, default=None)
    if value is None or int(value) == VERL_OFF_POLICY_DEFAULT:
        logger.info("laminar: %s (%s) is not used; staleness n - j is %s by laminar.buffer.max_staleness",
                    OFF_POLICY_KEY, value, "unbounded" if max_staleness is None else f"bounded to {max_staleness}")
        return
    raise ValueError(f"{OFF_POLICY_KEY}={value}: under +laminar=enabled the staleness bound is "
                     f"laminar.buffer.max_staleness (set laminar.buffer.max_staleness={max(int(value) - 1, 0)} for "
                     f"about the same bound, without dropping finished trajectories) and remove {OFF_POLICY_KEY}")


def groups_per_batch(config: DictConfig, replicas: int) -> int:
    """A replica's share of one training step unless set: ceil(train_batch_size / replicas)."""
    value: Optional[int] = OmegaConf.select(config, GROUPS_PER_BATCH_KEY, default=None)
    if value is None:
        value = math.ceil(int(config.data.train_batch_size) / replicas)
    if int(value) < 1:
        raise ValueError(f"{GROUPS_PER_BATCH_KEY}={value}: must be >= 1")
    return int(value)


def check_warmup(config: DictConfig, replicas: int, gpb: int) -> None:
    """Enough prompts outstanding that no replica idles while its batch has room (design §8)."""
    need = math.ceil(replicas * gpb / int(config.data.train_batch_size)) + 1
    have = OmegaConf.select(config, WARMUP_KEY)
    if have < need:
        logger.warning("%s=%s < %d: replicas may idle for lack of prompts (%d replicas x %d groups per batch)",
                       WARMUP_KEY, have, need, replicas, gpb)


def replica_handles(replicas: list) -> list:
    """What the router needs of each verl RolloutReplica."""
    from verl_laminar.rollout.router import ReplicaHandles

    return [ReplicaHandles(replica_id=int(r.replica_rank), address=r.server_address, server=r.server_handle,
                           workers=tuple(r.workers)) for r in replicas]


def _node_of(actor: Any) -> str:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def relay_nodes(nodes: list[dict], rollout_node_ids: Optional[Any], master_node_id: str) -> list[tuple[str, str]]:
    """(node id, node ip) of the nodes that get a relay, sorted by node id (pure).

    ``nodes``: ``ray.nodes()``-like dicts (``NodeID``, ``NodeManagerAddress``, ``Alive``). A relay runs on every
    alive node of ``rollout_node_ids`` and on ``master_node_id`` (trainer rank 0's node, the master); other
    trainer nodes never read a version and get none. ``rollout_node_ids=None``: every alive node.
    """
    alive = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes if n.get("Alive")}
    if master_node_id not in alive:
        raise ValueError(f"trainer rank 0's node {master_node_id} is not an alive Ray node; the master relay must "
                         "run there (check `ray status`)")
    wanted = set(alive) if rollout_node_ids is None else {n for n in rollout_node_ids if n in alive}
    return [(nid, alive[nid]) for nid in sorted(wanted | {master_node_id})]


def spawn_relays(trainer_rank0: Any, group_name: Optional[str] = None, replicas: Optional[list] = None,
                 relay: Optional[Any] = None) -> Any:
    """The relay group: one relay per rollout node plus one on trainer rank 0's node, the master.

    ``replicas``: verl's rollout replicas (each with ``.workers``); None puts a relay on every alive node.
    ``relay``: the typed ``laminar.relay`` section (``keep_versions``, ``chunk_mb``, the transport, ``interface``);
    None: their defaults (tcp, bound to each node's Ray address).
    Relays and stores an earlier, crashed run left behind are swept first.
    """
    import ray

    from verl_laminar.relay.group import DEFAULT_GROUP_NAME, RelayGroup, sweep_stale_relays
    from verl_laminar.relay.store import KEEP_VERSIONS

    name = group_name or DEFAULT_GROUP_NAME
    # relay ids name the host-memory stores: unique per run, so two runs on one host never share a store
    run = uuid.uuid4().hex[:8]
    alive = [n for n in ray.nodes() if n["Alive"]]
    master_node = _node_of(trainer_rank0)
    rollout_nodes = None
    if replicas is not None:
        workers = [w for r in replicas for w in r.workers]
        rollout_nodes = set(ray.get([w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                                     for w in workers]))
        gone = rollout_nodes - {n["NodeID"] for n in alive}
        if gone:
            logger.warning("relay group %s: rollout nodes %s are not alive; no relay there", name, sorted(gone))
    chosen = relay_nodes(alive, rollout_nodes, master_node)
    nodes = {f"relay{i}-{run}": node for i, node in enumerate(chosen)}
    master = next(rid for rid, (nid, _) in nodes.items() if nid == master_node)
    sweep_stale_relays(name, [n["NodeID"] for n in alive])
    keep = relay.keep_versions if relay is not None else KEEP_VERSIONS
    chunk_mb = relay.chunk_mb if relay is not None else None
    transport = relay.transport_spec() if relay is not None else None
    interface = relay.interface if relay is not None else None
    # the chunk count of each broadcast comes from the cost model at the link rate the user states
    link_bytes_per_s = relay.link_gbps * 1e9 / 8 if relay is not None else None
    group = ray.remote(RelayGroup).options(name=name, max_concurrency=16, num_cpus=0).remote(name)
    plan = ray.get(group.spawn.remote(nodes, master=master, keep_versions=keep, chunk_mb=chunk_mb,
                                      link_bytes_per_s=link_bytes_per_s, transport=transport, interface=interface))
    logger.info("relay group %s: %d relays (of %d nodes), master %s, keep_versions %d, chunk_mb %s, transport %s, "
                "interface %s, chain %s", name, len(nodes), len(alive), master, keep, chunk_mb,
                transport_label(transport), interface or "node address", plan)
    return group


def transport_label(spec: Optional[Any]) -> str:
    """``tcp``, or ``mooncake/<protocol>[ on <device>]``, for the start-up log of a ``TransportSpec``."""
    if spec is None or spec.kind == "tcp":
        return "tcp"
    return f"mooncake/{spec.protocol}" + (f" on {spec.device}" if spec.device else "")


def replica_relays(group: Any, replicas: list) -> dict:
    """Each replica's machine-local relay actor (the one its CheckpointEngineWorker reads from)."""
    import ray

    out = {}
    for r in replicas:
        relay_id = ray.get(group.relay_on_node.remote(_node_of(r.workers[0])))
        out[r.replica_id] = ray.get_actor(ray.get(group.actor_name.remote(relay_id)))
    return out


def pid_of(actor: Any) -> int:
    import ray

    from verl_laminar.platform.priority import current_pid

    return int(ray.get(actor.__ray_call__.remote(lambda self: current_pid())))


def process_tree(roots: list[int]) -> list[int]:
    """``roots`` and every process they started, as they are now (on this node)."""
    import psutil

    pids: list[int] = []
    for pid in roots:
        try:
            pids += [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return list(dict.fromkeys(pids))


def local_roots(replica: Any) -> list[int]:
    """PIDs of the replica's server and workers that run on this node (a PID means nothing on another node)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    return [pid_of(a) for a in (replica.server, *replica.workers) if _node_of(a) == here]


def replica_pids(replica: Any) -> list[int]:
    """A replica's processes: its server actor, its workers and every process they started (vLLM's engine core)."""
    return process_tree([pid_of(replica.server)] + [pid_of(w) for w in replica.workers])


def kill_replica(replica: Any, pids: Optional[list[int]] = None, hang: bool = False,
                 why: str = "laminar.fault_injection") -> list[int]:
    """SIGKILL a replica as a machine loss would, or with ``hang`` SIGSTOP it as a stuck one looks (fault
    injection, ``laminar.fault_injection``; the hang watch kills a hung one the same way). ``pids``: from
    ``replica_pids``, collected ahead so the signal itself takes microseconds; returns the PIDs signalled."""
    import signal

    pids = replica_pids(replica) if pids is None else pids
    sig = signal.SIGSTOP if hang else signal.SIGKILL
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
    logger.warning("%s: %s replica %d (%s of PIDs %s)", why, "stopped" if hang else "killed", replica.replica_id,
                   sig.name, pids)
    return pids


def cpu_priority_on(laminar: Any, cpu_platform: Optional[Callable[[], bool]] = None) -> bool:
    """Whether the trainer renices its processes (``apply_cpu_priority``): ``laminar.cpu_priority`` and the CPU
    platform (``cpu_platform``: the platform decision, ``platform.cpu.cpu_platform_requested`` unless given)."""
    if not laminar.cpu_priority:
        return False
    if cpu_platform is None:
        from verl_laminar.platform.cpu import cpu_platform_requested

        return bool(cpu_platform_requested())
    return bool(cpu_platform())


def apply_cpu_priority(trainer_workers: list, replica_servers: list) -> dict:
    """Rollouts at nice 19, trainer ranks at nice 0 (when permitted): on a shared CPU host, generation then
    fills the cycles training leaves idle instead of stretching the trainer's step (the critical path)."""
    from verl_laminar.platform.priority import renice_tree

    out = {"rollout": [renice_tree(pid_of(s), 19) for s in replica_servers], "trainer": []}
    for w in trainer_workers:
        try:
            out["trainer"].append(renice_tree(pid_of(w), 0))
        except PermissionError:
            logger.warning("laminar.cpu_priority: no permission to raise the trainer's priority; only the rollouts "
                           "were lowered (nice 19)")
            break
    logger.info("laminar.cpu_priority: rollouts at nice 19 %s, trainer ranks at nice 0 %s", out["rollout"],
                out["trainer"])
    return out


def default_max_batch(measure_cpu: Optional[Callable[[], int]] = None) -> int:
    """B for the rollout hardware when laminar.repack.max_batch_b is null: on the CPU platform what
    ``measure_cpu`` measures on a replica (``rollout.decode_profile``), on a GPU the roofline ridge of the device."""
    from verl_laminar.platform.cpu import cpu_platform_requested
    from verl_laminar.policy.roofline import DEVICES

    if cpu_platform_requested():
        if measure_cpu is None:
            raise ValueError("laminar.repack.max_batch_b is null on the CPU platform and no replica is there to "
                             "measure B on; set laminar.repack.max_batch_b")
        return measure_cpu()
    name = ""
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no device visible to the driver: fall back below
        pass
    spec = next((d for key, d in DEVICES.items() if key in name), DEVICES["H100"])
    if not name or spec.name not in name:
        logger.warning("laminar.repack: rollout GPU %r not in the roofline table %s; B from the %s datasheet "
                       "(set laminar.repack.max_batch_b to override)", name or "unknown", sorted(DEVICES), spec.name)
    # the arithmetic-intensity ridge of a bf16 decode step (policy.roofline.compute_bound_batch, no context)
    return max(1, int(spec.peak_flops * 2 / (2 * spec.hbm_bandwidth)))


def repack_settings(laminar: Any, measure_cpu: Optional[Callable[[], int]] = None) -> Optional[Any]:
    """The router's repack settings from the typed laminar config; None when laminar.repack.enabled=false.
    ``measure_cpu``: B measured on a replica, used on the CPU platform when laminar.repack.max_batch_b is null."""
    from verl_laminar.policy.repack import RepackPolicy
    from verl_laminar.rollout.router import RepackSettings

    r = laminar.repack
    if not r.enabled:
        return None
    return RepackSettings(RepackPolicy(c_max=r.c_max, max_batch=r.max_batch_b or default_max_batch(measure_cpu)),
                          r.interval_s)
