"""The FT trainer's model state in verl's form: an FSDP2-sharded policy, AdamW, verl's checkpoint manager and loss.

Layout on disk is verl's (what ``trainer.resume_mode=auto`` reads):

    <ckpt_dir>/latest_checkpointed_iteration.txt      verl's tracker: the newest complete step
    <ckpt_dir>/global_step_<N>/actor/                 verl's ``FSDPCheckpointManager`` files: sharded model,
                                                       optimizer (AdamW moments) and extra state (RNG, scheduler)
    <ckpt_dir>/global_step_<N>/laminar_trained.json   Laminar's part: every group trained up to step N

Crash safety: a step is written completely (the manager's files, then the trained-group list, fsynced) before
the tracker is replaced atomically; a process killed mid-save leaves the tracker on the previous step, and
the next save of the same step overwrites the torn directory. This is verl's own order (its trainer writes
the tracker after the save) with an atomic rename added.

The loss is verl's: GRPO advantages from ``compute_grpo_outcome_advantage`` and the clipped token ratio from
``compute_policy_loss_vanilla`` (clip-higher 0.2 / 0.28 as in the Laminar recipes), against the generating
policy's log-probs. One process, world size 1, gloo: the same FSDP2 path verl trains with on CPU.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from typing import Any, Iterator, Optional

logger = logging.getLogger(__name__)

TRAINED_FILE = "laminar_trained.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_group() -> None:
    """A world of one on gloo (loopback only): what verl's checkpoint manager and FSDP2 need."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)


def step_dir(ckpt_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir, f"global_step_{step}")


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for fn in files:
            with open(os.path.join(root, fn), "rb") as fh:
                os.fsync(fh.fileno())


class VerlPolicyState:
    """Model + optimizer + checkpoints, restored from the newest verl checkpoint in ``ckpt_dir`` if any."""

    def __init__(self, model_dir: str, ckpt_dir: str, lr: float, clip_low: float = 0.2, clip_high: float = 0.28,
                 keep: int = 2) -> None:
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.workers.config import ActorConfig

        if keep < 2:
            raise ValueError(f"keep={keep}: keep at least 2 checkpoints (the current one and the one being written)")
        self.ckpt_dir, self.keep = ckpt_dir, keep
        os.makedirs(ckpt_dir, exist_ok=True)
        init_single_process_group()
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.manager = FSDPCheckpointManager(model, self.opt, None, processing_class=None,
                                             checkpoint_config={"save_contents": ["model", "optimizer", "extra"],
                                                                "load_contents": ["model", "optimizer", "extra"]})
        # verl's actor config carries the clip range into verl's policy loss
        self.actor_cfg = ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                                     clip_ratio=clip_low, clip_ratio_low=clip_low, clip_ratio_high=clip_high)
        self.step, self.trained = 0, {}
        self.resumed_from: Optional[str] = None
        self._load_latest()

    # ---- checkpoints ----
    def _load_latest(self) -> None:
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        path = find_latest_ckpt_path(self.ckpt_dir)
        if path is None:
            return
        self.manager.load_checkpoint(os.path.join(path, "actor"))
        with open(os.path.join(path, TRAINED_FILE)) as f:
            meta = json.load(f)
        self.step, self.trained = int(meta["step"]), {k: int(v) for k, v in meta["trained"].items()}
        self.resumed_from = path
        logger.info("resumed from verl checkpoint %s: step %d, %d groups trained", path, self.step,
                    len(self.trained))

    def save(self, step: int, trained: dict[str, int]) -> str:
        from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

        path = step_dir(self.ckpt_dir, step)
        shutil.rmtree(path, ignore_errors=True)  # a torn save of this step by a killed process
        self.manager.save_checkpoint(os.path.join(path, "actor"), global_step=step, max_ckpt_to_keep=None)
        with open(os.path.join(path, TRAINED_FILE), "w") as f:
            json.dump({"step": step, "trained": trained}, f)
        _fsync_tree(path)
        tracker = get_checkpoint_tracker_filename(self.ckpt_dir)
        tmp = tracker + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(step))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, tracker)
        self.step, self.trained = step, trained
        self._prune(step)
        return path

    def _prune(self, current: int) -> None:
        steps = []
        for d in os.listdir(self.ckpt_dir):
            if d.startswith("global_step_") and d[len("global_step_"):].isdigit():
                steps.append(int(d[len("global_step_"):]))
        for s in sorted(x for x in steps if x <= current)[:-self.keep]:
            shutil.rmtree(step_dir(self.ckpt_dir, s), ignore_errors=True)

    # ---- weights for the relays ----
    def full_weights(self) -> Iterator[tuple[str, Any]]:
        """Unsharded tensors by HF name (vLLM ties ``lm_head`` to the embedding itself)."""
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        for k, v in self.model.state_dict().items():
            if tied and k == "lm_head.weight":
                continue
            v = v.full_tensor() if hasattr(v, "full_tensor") else v
            yield k, v.detach()

    # ---- one GRPO step with verl's advantage and loss ----
    def train_step(self, seqs: list[tuple[list[int], int, list[float], float, int]], micro_batch: int) -> dict:
        """``seqs``: (prompt+response ids, response start, rollout log-probs, reward, group index)."""
        import numpy as np
        import torch
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla

        resp_lens = [len(ids) - start for ids, start, _, _, _ in seqs]
        width = max(resp_lens)
        scores = torch.zeros(len(seqs), width)
        mask = torch.zeros(len(seqs), width)
        for i, ((_, _, _, reward, _), n) in enumerate(zip(seqs, resp_lens)):
            mask[i, :n] = 1
            scores[i, n - 1] = reward  # outcome reward on the last response token, as verl's reward managers do
        adv, _ = compute_grpo_outcome_advantage(scores, mask, np.array([s[4] for s in seqs]))
        tokens = int(mask.sum())
        self.actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=tokens)
        self.opt.zero_grad(set_to_none=True)
        total, clipfrac = 0.0, 0.0
        for i in range(0, len(seqs), micro_batch):
            for k in range(i, min(i + micro_batch, len(seqs))):
                ids, start, old_lp, _, _ = seqs[k]
                n = resp_lens[k]
                x = torch.tensor([ids])
                logits = self.model(input_ids=x).logits[0, start - 1:-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, x[0, start:].unsqueeze(-1)).squeeze(-1)
                loss, metrics = compute_policy_loss_vanilla(
                    torch.tensor([old_lp]), lp.unsqueeze(0), adv[k:k + 1, :n], mask[k:k + 1, :n],
                    loss_agg_mode="token-mean", config=self.actor_cfg)
                loss.backward()  # token-mean over the whole step: batch_num_tokens is the step's token count
                total += float(loss.detach())
                clipfrac += metrics["actor/pg_clipfrac"] * n / tokens
        self.opt.step()
        return {"loss": total, "pg_clipfrac": clipfrac, "tokens": tokens,
                "prompt_tokens": sum(s[1] for s in seqs), "trajectories": len(seqs)}
