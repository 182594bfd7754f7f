"""A checkpointing GRPO trainer process for the fault-tolerant runtime: killed, it restarts where it stopped.

Dataflow (one step):
    ledger.lease(k groups)  -> GRPO advantages per group (reward standardised within the group)
                            -> clipped policy-gradient loss against the rollout log-probs, one SGD step
                            -> checkpoint: weights + step + every group it has trained, written to a new
                               directory, fsynced, then made current by an atomic rename of a pointer file
                            -> ledger.commit(step, groups)   (after the checkpoint, so a commit is never
                               ahead of what a restart would load)
                            -> publish the weights as version ``step`` to the master relay
Restart: the new process loads the newest checkpoint, tells the ledger which groups it trained
(``TrainLedger.recover``: leased-but-untrained groups go back to the buffer), republishes its version
if the relay does not have it, and continues. Nothing is trained twice and nothing is lost.

This is a small torch trainer, not verl's FSDP trainer: verl's TaskRunner owns the rollout replicas,
so killing verl's trainer kills the rollouts with it (see docs/fault_tolerance.md). The optimizer is
plain SGD, which keeps no state: the checkpoint is the weights and the trained-group list.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional

logger = logging.getLogger(__name__)

POINTER = "latest"


@dataclass(frozen=True)
class TrainerSettings:
    model_dir: str
    ckpt_dir: str
    ledger_name: str
    relay_group: str
    namespace: Optional[str] = None
    groups_per_step: int = 2
    lr: float = 1e-3
    clip: float = 0.2
    micro_batch: int = 4
    lease_timeout_s: float = 2.0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.groups_per_step < 1 or self.micro_batch < 1:
            raise ValueError(f"groups_per_step={self.groups_per_step} and micro_batch={self.micro_batch} must be "
                             ">= 1")


def latest_checkpoint(ckpt_dir: str) -> Optional[str]:
    try:
        with open(os.path.join(ckpt_dir, POINTER)) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(ckpt_dir, name)


def save_checkpoint(ckpt_dir: str, step: int, state: dict, trained: dict[str, int], keep: int = 2) -> str:
    """Write step ``step`` completely, then switch the pointer (a crash leaves the previous one current)."""
    from safetensors.torch import save_file

    name = f"step-{step:06d}"
    tmp = os.path.join(ckpt_dir, f".tmp-{name}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, os.path.join(tmp, "model.safetensors"))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump({"step": step, "trained": trained}, f)
    for fn in os.listdir(tmp):
        with open(os.path.join(tmp, fn), "rb") as fh:
            os.fsync(fh.fileno())
    final = os.path.join(ckpt_dir, name)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    ptr = os.path.join(ckpt_dir, f".{POINTER}.tmp")
    with open(ptr, "w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(ptr, os.path.join(ckpt_dir, POINTER))
    steps = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step-"))
    for old in steps[:-keep]:
        shutil.rmtree(os.path.join(ckpt_dir, old), ignore_errors=True)
    return final


def grpo_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """Reward standardised within its group (GRPO); a group whose rewards are all equal teaches nothing."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
    return [(r - mean) / (std + eps) for r in rewards]


class CheckpointedTrainer:
    def __init__(self, settings: TrainerSettings) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.s = settings
        torch.set_num_threads(settings.threads)
        os.makedirs(settings.ckpt_dir, exist_ok=True)
        self.model = AutoModelForCausalLM.from_pretrained(settings.model_dir, torch_dtype=torch.float32)
        self.step, self.trained = 0, {}
        ckpt = latest_checkpoint(settings.ckpt_dir)
        if ckpt is not None:
            from safetensors.torch import load_file

            self.model.load_state_dict(load_file(os.path.join(ckpt, "model.safetensors")), strict=False)
            with open(os.path.join(ckpt, "meta.json")) as f:
                meta = json.load(f)
            self.step, self.trained = int(meta["step"]), {k: int(v) for k, v in meta["trained"].items()}
            logger.info("trainer resumed from %s: step %d, %d groups trained", ckpt, self.step, len(self.trained))
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=settings.lr)
        self._engine: Any = None
        self.started_s = time.time()

    # ---- plumbing ----
    def _ledger(self) -> Any:
        import ray

        return ray.get_actor(self.s.ledger_name, namespace=self.s.namespace)

    def _relay_engine(self) -> Any:
        if self._engine is None:
            from verl_laminar.relay.verl_backend import RelayCheckpointEngine

            self._engine = RelayCheckpointEngine(is_master=True, group_name=self.s.relay_group,
                                                 namespace=self.s.namespace, timeout_s=60.0)
        return self._engine

    def _weights(self):
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        for k, v in self.model.state_dict().items():
            if tied and k == "lm_head.weight":
                continue  # vLLM ties it to the embedding itself
            yield k, v.detach()

    def publish(self, version: int) -> None:
        import asyncio

        engine = self._relay_engine()
        engine._last_version = max(engine._last_version, version - 1)
        asyncio.run(engine.send_weights(self._weights(), global_steps=version))

    def relay_newest(self) -> Optional[int]:
        import ray

        group = ray.get_actor(self.s.relay_group, namespace=self.s.namespace)
        master = ray.get(group.master.remote(), timeout=30)
        relay = ray.get_actor(ray.get(group.actor_name.remote(master), timeout=30), namespace=self.s.namespace)
        return ray.get(relay.newest.remote(), timeout=30)

    # ---- lifecycle ----
    def recover(self) -> dict:
        """Reconcile the ledger with this checkpoint and make sure its version is on the relays."""
        import ray

        out = ray.get(self._ledger().recover.remote(self.trained), timeout=60)
        newest = self.relay_newest()
        if self.step > 0 and (newest is None or newest < self.step):
            self.publish(self.step)  # the previous process died between its checkpoint and its publish
            out["republished"] = self.step
        out["step"] = self.step
        return out

    def train_step(self, groups: list) -> dict:
        import torch

        seqs = []  # (ids, response start, rollout log-probs, advantage)
        for g in groups:
            trajs = sorted(g.trajectories, key=lambda t: t.key)
            adv = grpo_advantages([float(t.payload["reward"]) for t in trajs])
            for t, a in zip(trajs, adv):
                p = t.payload
                seqs.append((list(p["prompt_ids"]) + list(p["token_ids"]), len(p["prompt_ids"]),
                             list(p["log_probs"]), a))
        tokens = sum(len(s[0]) - s[1] for s in seqs)
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(0, len(seqs), self.s.micro_batch):
            for ids, start, old_lp, adv in seqs[i:i + self.s.micro_batch]:
                x = torch.tensor([ids])
                logits = self.model(input_ids=x).logits[0, start - 1:-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, x[0, start:].unsqueeze(-1)).squeeze(-1)
                ratio = torch.exp(lp - torch.tensor(old_lp))
                a = torch.full_like(ratio, adv)
                obj = torch.minimum(ratio * a, torch.clamp(ratio, 1 - self.s.clip, 1 + self.s.clip) * a)
                loss = -obj.sum() / max(1, tokens)
                loss.backward()
                total += float(loss)
        self.opt.step()
        return {"loss": total, "tokens": tokens, "trajectories": len(seqs)}

    def run(self, max_steps: Optional[int] = None) -> int:
        """Train until ``max_steps`` steps exist or the ledger closes; returns the last step."""
        import ray

        from verl_laminar.buffer.experience import BufferClosed, BufferTimeout

        ledger = self._ledger()
        while max_steps is None or self.step < max_steps:
            try:
                groups = ray.get(ledger.lease.remote(self.s.groups_per_step, self.s.lease_timeout_s))
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, BufferTimeout):
                    continue
                if isinstance(e.cause, BufferClosed):
                    break
                raise
            t0 = time.time()
            info = self.train_step(groups)
            step = self.step + 1
            trained = dict(self.trained, **{g.group_id: step for g in groups})
            save_checkpoint(self.s.ckpt_dir, step, dict(self._weights()), trained)
            self.step, self.trained = step, trained
            ray.get(ledger.commit.remote(step, [g.group_id for g in groups], info["tokens"]))
            self.publish(step)
            logger.info("step %d: %d trajectories, %d tokens, loss %.4f, %.2f s", step, info["trajectories"],
                        info["tokens"], info["loss"], time.time() - t0)
        return self.step


class TrainerActor(CheckpointedTrainer):
    """Ray actor shell: one process; killing it (SIGKILL by PID) is the trainer-failure fault."""

    def pid(self) -> int:
        return os.getpid()
