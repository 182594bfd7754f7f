"""Typed, validated view of the ``laminar:`` block that ``+laminar=enabled`` adds to verl's config.

The YAML (``verl_laminar/config/laminar/enabled.yaml``) documents every key; these frozen dataclasses mirror it
one to one, with the same defaults, so that code below the trainer works on plain values instead of an
OmegaConf node. Everything here imports only the standard library and omegaconf: the policies, the simulator and
the tests use it without torch, ray, vLLM or verl.

Every error names the full key, the bad value and what to do instead, because a user meets these messages at
start-up of a cluster job, far from this code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from verl_laminar.config.sections import LaminarConfigError, Section, build

if TYPE_CHECKING:  # the relay and policy packages stay out of this module's imports (see the module docstring)
    from verl_laminar.policy.timeouts import RefreshSettings
    from verl_laminar.relay.transport_spec import TransportSpec

ROOT = "laminar"


@dataclass(frozen=True)
class DispatchConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.dispatch"
    group_size_from_rollout_n: bool = True
    groups_per_batch: Optional[int] = None

    def __post_init__(self) -> None:
        self._require("groups_per_batch", self.groups_per_batch is None or self.groups_per_batch >= 1,
                      "must be null (ceil(data.train_batch_size / replicas)) or an integer >= 1")


@dataclass(frozen=True)
class RefreshConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.refresh"
    policy: Literal["on_batch_end"] = "on_batch_end"
    wait_factor: float = 3.0
    min_wait_s: float = 120.0
    retries: int = 2

    def __post_init__(self) -> None:
        self._require("wait_factor", self.wait_factor >= 1,
                      "must be >= 1: the deadline is this many times the modelled broadcast time, and a "
                      "deadline below the model fails healthy transfers; e.g. 3.0")
        self._require("min_wait_s", self.min_wait_s > 0,
                      "must be > 0 seconds (the shortest refresh deadline, used until the version size is known), "
                      "e.g. 120.0")
        self._require("retries", self.retries >= 0,
                      "must be an integer >= 0 (further attempts of a failed wait or load before the run stops), "
                      "e.g. 2")


@dataclass(frozen=True)
class BufferConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.buffer"
    max_staleness: Optional[int] = None

    def __post_init__(self) -> None:
        self._require(
            "max_staleness",
            self.max_staleness is None or self.max_staleness >= 0,
            "must be null (measured, not bounded, as in the paper) or an integer >= 0 (policy.bound)",
        )


@dataclass(frozen=True)
class RepackConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.repack"
    enabled: bool = True
    interval_s: Optional[float] = None  # null: the platform's default (config.platform_defaults)
    c_max: float = 0.99
    max_batch_b: Optional[int] = None

    def __post_init__(self) -> None:
        self._require("interval_s", self.interval_s is None or self.interval_s > 0,
                      "must be > 0 seconds, or null for the platform's default (5.0 s on GPUs, as the paper repacks; "
                      "1.0 s on the CPU platform)")
        self._require("c_max", 0 < self.c_max <= 1, "must be in (0, 1]; the paper uses 0.99")
        self._require(
            "max_batch_b",
            self.max_batch_b is None or self.max_batch_b >= 1,
            "must be null (derived from the roofline model) or an integer >= 1",
        )


@dataclass(frozen=True)
class RelayConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.relay"
    transport: Literal["tcp", "mooncake"] = "tcp"
    protocol: Literal["tcp", "rdma"] = "tcp"
    device: Optional[str] = None
    interface: Optional[str] = None
    chunk_mb: Optional[float] = None
    keep_versions: int = 2
    link_gbps: float = 10.0
    delta: Literal["off", "auto"] = "auto"

    def __post_init__(self) -> None:
        self._check_transport()
        self._require("interface", self.interface is None or _is_token(self.interface),
                      "must be null (bind the node's address Ray uses) or the name of a network interface or an IPv4 "
                      "address on every relay node, without spaces, e.g. ib0 or 10.0.0.5")
        self._require("link_gbps", self.link_gbps > 0,
                      "must be > 0 Gbit/s, the bandwidth one hop between relays sustains, e.g. 10.0 "
                      "on 10 GbE")
        self._require(
            "chunk_mb",
            self.chunk_mb is None or self.chunk_mb > 0,
            "must be null (chunk count from the broadcast cost model) or a size in MiB > 0",
        )
        self._require(
            "keep_versions",
            self.keep_versions >= 1,
            "must be >= 1 (the newest version); 2 lets a rollout finish loading version n while n+1 arrives",
        )

    def _check_transport(self) -> None:
        """protocol and device configure Mooncake only: with tcp they would be ignored, so a user who asked for
        RDMA would silently get plain TCP."""
        mooncake = self.transport == "mooncake"
        self._require("protocol", self.protocol == "tcp" or mooncake,
                      f"needs {self._key('transport')}=mooncake (it is Mooncake's data protocol; the tcp transport "
                      f"has no RDMA path): set {self._key('transport')}=mooncake and install Mooncake's Transfer "
                      f"Engine, or remove {self._key('protocol')}")
        self._require("device", self.device is None or mooncake,
                      f"needs {self._key('transport')}=mooncake with {self._key('protocol')}=rdma (it names "
                      f"Mooncake's RDMA NICs): set them, or remove {self._key('device')} "
                      f"({self._key('interface')} chooses the network of the tcp transport)")
        self._require("device", self.device is None or _is_token(self.device),
                      "must be null (Mooncake picks the RDMA NICs) or a comma-separated list of RDMA device names "
                      "without spaces, e.g. mlx5_0,mlx5_1")

    def transport_spec(self) -> "TransportSpec":
        """The transport every relay of the group builds (``Relay(transport=...)``)."""
        from verl_laminar.relay.transport_spec import TransportSpec  # stdlib only; imported here to keep the rule above

        return TransportSpec(kind=self.transport, protocol=self.protocol, device=self.device)


def _is_token(value: str) -> bool:
    """A non-empty value without whitespace (a name or address; a space would become part of it)."""
    return value != "" and not any(c.isspace() for c in value)


@dataclass(frozen=True)
class PoolConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.pool"
    enabled: bool = True
    flush_tokens: int = 64
    flush_interval_s: float = 1.0
    batch_tick_s: Optional[float] = 0.05  # null: one pool call per chunk
    log_dir: Optional[str] = None  # null: the driver node's temp dir (node-local disk)
    shards: Optional[int] = None  # null: as many as the fleet's running sequences need (trainer.pool.shard_count)

    def __post_init__(self) -> None:
        self._require("shards", self.shards is None or 1 <= self.shards <= 64,
                      "must be an integer from 1 to 64 (pool actors, each owning whole groups), or null (derived from "
                      "the rollout's GPUs and max_num_seqs)")
        self._require("flush_tokens", self.flush_tokens >= 1, "must be an integer >= 1 (tokens per flush), e.g. 64")
        self._require("flush_interval_s", self.flush_interval_s > 0, "must be > 0 seconds, e.g. 1.0")
        self._require("batch_tick_s", self.batch_tick_s is None or self.batch_tick_s > 0,
                      "must be > 0 seconds (one pool call per tick for all of a rollout process's streams), e.g. "
                      "0.05, or null (one call per chunk)")


@dataclass(frozen=True)
class HeartbeatConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.heartbeat"
    interval_s: float = 1.0
    dead_after_s: Optional[float] = None  # null: the platform's default (config.platform_defaults)

    def __post_init__(self) -> None:
        self._require("interval_s", self.interval_s > 0, "must be > 0 seconds, e.g. 1.0")
        self._require(
            "dead_after_s",
            self.dead_after_s is None or self.dead_after_s > self.interval_s,
            f"must be greater than {self._key('interval_s')}={self.interval_s!r}, or every rollout is declared "
            "dead between two heartbeats; use a few intervals, e.g. 5.0",
        )


@dataclass(frozen=True)
class ReplaceConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.replace"
    enabled: bool = True
    max_replacements: int = 8
    start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        self._require("max_replacements", self.max_replacements >= 0,
                      "must be an integer >= 0 (replacement replicas one run may start), e.g. 8")
        self._require("start_timeout_s", self.start_timeout_s > 0,
                      "must be > 0 seconds (a replacement's start-up: engine and model load), e.g. 600")


@dataclass(frozen=True)
class FleetConfig(Section):
    """Rollouts that outlive the trainer (``docs/fleet_ownership.md``): the replicas and the partial-response pool
    are detached Ray actors, so a killed ``TaskRunner`` leaves their requests in flight running to their end."""

    PATH: ClassVar[str] = f"{ROOT}.fleet"
    detached: bool = False
    drain_timeout_s: float = 300.0
    adopt_agents: tuple[str, ...] = ("single_turn_agent", "laminar_skewed")

    def __post_init__(self) -> None:
        self._require("drain_timeout_s", self.drain_timeout_s > 0,
                      "must be > 0 seconds (how long a restarted trainer lets the fleet it finds finish the "
                      "requests it holds before it ends it), e.g. 300")
        self._require("adopt_agents", all(isinstance(a, str) and a for a in self.adopt_agents),
                      "must be a list of agent-loop names (single-turn loops whose finished responses a restarted "
                      "trainer may adopt from the pool), e.g. [single_turn_agent]")


@dataclass(frozen=True)
class FaultInjectionConfig(Section):
    """Testing only: SIGKILL a rollout replica's processes (replica failover) or the trainer's process (restart
    from verl's checkpoint) mid-run."""

    PATH: ClassVar[str] = f"{ROOT}.fault_injection"
    kill_replica: Optional[int] = None
    kill_after_step: int = 1
    # "kill": SIGKILL (its requests fail at once); "hang": SIGSTOP (only the hang watch can find it); "garbage":
    # it answers out-of-vocabulary ids (the clients' check fences it)
    replica_fault: str = "kill"
    kill_trainer_after_step: Optional[int] = None
    kill_pool_after_step: Optional[int] = None
    # "STEP:KIND[@REPLICA];..." (policy.faults): many faults in one run, as the chaos benchmark injects them
    schedule: str = ""

    def __post_init__(self) -> None:
        from verl_laminar.policy.faults import FaultPlanError, parse_schedule

        try:
            parse_schedule(self.schedule)
        except FaultPlanError as e:
            raise LaminarConfigError(str(e)) from e
        self._require("kill_pool_after_step", self.kill_pool_after_step is None or self.kill_pool_after_step >= 1,
                      "must be null (no fault) or a training step >= 1 (the partial-response pool's process is "
                      "SIGKILLed after that step publishes; Ray restarts it from its log)")
        self._require("kill_trainer_after_step", self.kill_trainer_after_step is None or
                      self.kill_trainer_after_step >= 1,
                      "must be null (no fault) or a training step >= 1 (the trainer dies after that step's "
                      "checkpoint and publication)")
        self._require("kill_replica", self.kill_replica is None or self.kill_replica >= 0,
                      "must be null (no fault) or the rank of a rollout replica (>= 0)")
        self._require("kill_after_step", self.kill_after_step >= 1,
                      "must be a training step >= 1 (the replica dies right after that step publishes)")
        self._require("replica_fault", self.replica_fault in ("kill", "hang", "garbage"),
                      "must be 'kill' (SIGKILL: the replica dies), 'hang' (SIGSTOP: it stops answering) or "
                      "'garbage' (it answers token ids outside the vocabulary; needs laminar.pool.enabled, whose "
                      "server can be corrupted)")


@dataclass(frozen=True)
class RunUntilConfig(Section):
    """End the run once awaited events happened (``policy.until``): ``trainer.total_training_steps`` becomes a
    cap, and either the cap or ``timeout_s`` reached with an event unseen fails the run naming it."""

    PATH: ClassVar[str] = f"{ROOT}.run_until"
    events: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    min_steps: int = 1

    def __post_init__(self) -> None:
        from verl_laminar.policy.until import EVENTS

        self._require("events", all(e in EVENTS for e in self.events),
                      f"must be a list of awaited events, each one of {', '.join(sorted(EVENTS))} ([]: run every "
                      "step of trainer.total_training_steps)")
        self._require("timeout_s", self.timeout_s > 0,
                      "must be > 0 seconds from the trainer's start (the run fails at the first step end after it "
                      "with an awaited event unseen), e.g. 1800")
        self._require("min_steps", self.min_steps >= 1,
                      "must be an integer >= 1: the steps this launch trains before it may end on its events")


@dataclass(frozen=True)
class MetricsConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.metrics"
    staleness_histogram: bool = True


@dataclass(frozen=True)
class TimelineConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.timeline"
    path: Optional[str] = None

    def __post_init__(self) -> None:
        self._require("path", self.path is None or self.path.strip() != "",
                      "must be null (<trainer.default_local_dir>/laminar_timeline.jsonl) or a file path, e.g. "
                      "runs/my_run/laminar_timeline.jsonl")


OffPolicyCorrection = Literal["clipped_token_ratio", "verl_rollout_correction"]


@dataclass(frozen=True)
class OffPolicyConfig(Section):
    PATH: ClassVar[str] = f"{ROOT}.off_policy"
    correction: OffPolicyCorrection = "clipped_token_ratio"


@dataclass(frozen=True)
class LaminarConfig(Section):
    PATH: ClassVar[str] = ROOT
    replicas: Optional[int] = None
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    refresh: RefreshConfig = field(default_factory=RefreshConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    repack: RepackConfig = field(default_factory=RepackConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    replace: ReplaceConfig = field(default_factory=ReplaceConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    fault_injection: FaultInjectionConfig = field(default_factory=FaultInjectionConfig)
    run_until: RunUntilConfig = field(default_factory=RunUntilConfig)
    timeline: TimelineConfig = field(default_factory=TimelineConfig)
    cpu_priority: bool = True
    # where verl's helper actors (TransferQueue storage units, agent-loop and reward workers) start: "task_runner"
    # on the node of verl's TaskRunner (the trainer's loop, router and pool; the driver's node when it has room), so
    # that a rollout machine's loss takes none of them; "spread": verl's round-robin over every node
    helpers: Literal["task_runner", "spread"] = "task_runner"

    def __post_init__(self) -> None:
        self._require(
            "replicas",
            self.replicas is None or self.replicas >= 1,
            "must be null (derived from actor_rollout_ref.rollout resources) or an integer >= 1",
        )

    def refresh_settings(self) -> "RefreshSettings":
        """The refresh deadlines' inputs (``policy.timeouts``) from this block (its keys are range-checked here)."""
        from verl_laminar.policy.timeouts import RefreshSettings  # the policy stays free of this package

        return RefreshSettings(link_gbps=self.relay.link_gbps, wait_factor=self.refresh.wait_factor,
                               min_wait_s=self.refresh.min_wait_s, retries=self.refresh.retries)

    @classmethod
    def from_omegaconf(cls, node: DictConfig | Mapping[str, Any] | None) -> "LaminarConfig":
        """Build from ``cfg.laminar`` (interpolations resolved); missing keys take the defaults above."""
        if node is None:
            return cls()
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        return build(cls, node, ROOT)
