"""How much of a published version changes from the one before: the measurement delta versions start from (issue 44).

``python -m verl_laminar.bench.delta_share --json --results docs/results`` trains the ``tiny-qwen`` fixture with
verl's own sync GRPO (``recipes/cpu/run_sync_grpo.sh``) once per learning rate (the paper's 1e-6 and the CPU
recipes' 1e-4 by default), saving the HF weights after every step, and compares every pair of consecutive versions
as the relays would carry them: each floating-point tensor cast to the rollout's dtype (bf16), as
``prepare_config`` sets ``laminar.dtype`` for the relay engine. Per tensor kind it records the share of elements
whose bf16 value changed and the bytes two sparse encodings would send against the whole version:

* ``coo``: a 4-byte index and the 2-byte value of each changed element (smaller than whole below 1/3 changed);
* ``bitmap``: one bit per element and the 2-byte value of each changed one (smaller than whole below 15/16
  changed, smaller than ``coo`` above 1/32).

Why the share is small at small learning rates: Adam moves each fp32 master weight by about ``lr`` a step, and
its bf16 cast changes only when that crosses a rounding boundary, one bf16 spacing (2^-8 of the value's binade)
apart; so the share grows with ``lr / |w|`` and, summed over steps, with how far each weight drifts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Optional

logger = logging.getLogger("verl_laminar.bench.delta_share")

COO_BYTES_PER_CHANGE = 4 + 2  # int32 index + bf16 value
BITMAP_BITS_PER_ELEMENT = 1
VALUE_BYTES = 2  # bf16
# The kinds a tensor name falls into (the first match wins); Qwen2/Llama names, as verl's HF checkpoint has them.
KINDS = (("embed_tokens", "embedding"), ("lm_head", "lm_head"), ("norm", "norm"), (".bias", "bias"),
         ("q_proj", "attention"), ("k_proj", "attention"), ("v_proj", "attention"), ("o_proj", "attention"),
         ("gate_proj", "mlp"), ("up_proj", "mlp"), ("down_proj", "mlp"))
# The paper's models (parameters), for what a measured share predicts there.
PAPER_MODELS = {"Qwen2.5-7B": 7.62e9, "Qwen2.5-32B": 32.8e9, "Qwen2.5-72B": 72.7e9}


def kind_of(name: str) -> str:
    for needle, kind in KINDS:
        if needle in name:
            return kind
    return "other"


@dataclass
class KindCount:
    elements: int = 0
    changed: int = 0

    def add(self, elements: int, changed: int) -> None:
        self.elements += elements
        self.changed += changed


@dataclass
class PairShare:
    """One pair of consecutive versions: counts per tensor kind and the bytes each encoding would send."""

    version: int  # the newer one
    kinds: dict = field(default_factory=dict)  # kind -> KindCount

    @property
    def elements(self) -> int:
        return sum(k.elements for k in self.kinds.values())

    @property
    def changed(self) -> int:
        return sum(k.changed for k in self.kinds.values())

    def layers_share(self) -> float:
        """The share over the transformer layers (all but the embedding and the LM head): a tiny model's 151k-row
        embedding is 96% of its elements and changes only in the rows of the tokens a step saw, where a 7B-72B
        model's embedding is a few percent of it, so this is the share that carries to the paper's sizes."""
        kinds = [v for k, v in self.kinds.items() if k not in ("embedding", "lm_head")]
        n = sum(k.elements for k in kinds)
        return sum(k.changed for k in kinds) / n if n else 0.0

    def summary(self) -> dict:
        n, c = self.elements, self.changed
        whole = n * VALUE_BYTES
        coo = c * COO_BYTES_PER_CHANGE
        bitmap = (n * BITMAP_BITS_PER_ELEMENT + 7) // 8 + c * VALUE_BYTES
        return {"version": self.version, "elements": n, "changed": c, "changed_share": c / n if n else 0.0,
                "bytes_whole": whole, "bytes_coo": coo, "bytes_bitmap": bitmap,
                "smallest": min((("whole", whole), ("coo", coo), ("bitmap", bitmap)), key=lambda kv: kv[1])[0],
                "layers_changed_share": self.layers_share(),
                "by_kind": {k: {"elements": v.elements, "changed": v.changed,
                                "changed_share": v.changed / v.elements if v.elements else 0.0}
                            for k, v in sorted(self.kinds.items())}}


def compare(prev: Mapping[str, "object"], cur: Mapping[str, "object"], version: int, dtype: str = "bfloat16") -> PairShare:
    """The elements of ``cur`` whose value in ``dtype`` differs from ``prev``'s, per kind. Tensors missing from
    either side, or not floating point, are refused: a version is compared whole or not at all."""
    import torch

    if set(prev) != set(cur):
        raise ValueError(f"version {version}: tensor names differ from the version before "
                         f"(only before: {sorted(set(prev) - set(cur))[:5]}, only after: {sorted(set(cur) - set(prev))[:5]})")
    target = getattr(torch, dtype)
    out = PairShare(version)
    for name in sorted(cur):
        a, b = prev[name], cur[name]
        if a.shape != b.shape or not b.is_floating_point():
            raise ValueError(f"version {version}: {name} is {b.dtype} {tuple(b.shape)}, before {a.dtype} "
                             f"{tuple(a.shape)}: only floating-point tensors of one shape are compared")
        changed = int(torch.count_nonzero(a.to(target) != b.to(target)))
        out.kinds.setdefault(kind_of(name), KindCount()).add(b.numel(), changed)
    return out


def load(path: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"{path}: no safetensors there")
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def comparable(weights: dict) -> dict:
    """The tensors a version carries: rotary ``inv_freq`` buffers (recomputed, never trained) left out."""
    return {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}


def versions(run_dir: Path, base: Path) -> list[tuple[int, Path]]:
    """(version, weights) of a run: the fixture it started from as version 0, then each step's HF save."""
    found = []
    for step_dir in (run_dir / "checkpoints").glob("global_step_*"):
        hf = step_dir / "actor" / "huggingface"
        if hf.is_dir():
            found.append((int(step_dir.name.rsplit("_", 1)[1]), hf))
    return [(0, base)] + sorted(found)


def measure_run(run_dir: Path, base: Path, dtype: str = "bfloat16") -> list[PairShare]:
    seq = versions(run_dir, base)
    if len(seq) < 2:
        raise RuntimeError(f"{run_dir}: no saved step to compare (trainer.save_freq=1 with hf_model saves)")
    pairs, prev = [], comparable(load(seq[0][1]))
    common = None
    for version, path in seq[1:]:
        cur = comparable(load(path))
        common = set(prev) & set(cur) if common is None else common
        pairs.append(compare({k: prev[k] for k in common}, {k: cur[k] for k in common}, version, dtype))
        prev = cur
    return pairs


def predict(share: float) -> dict:
    """Bytes per version at the paper's sizes for a measured changed share (bf16 weights): each encoding, and the
    smallest of them and the whole version (what ``laminar.relay.delta=auto`` would send)."""
    out = {}
    for model, params in PAPER_MODELS.items():
        sizes = {"whole": params * VALUE_BYTES, "coo": params * share * COO_BYTES_PER_CHANGE,
                 "bitmap": params * BITMAP_BITS_PER_ELEMENT / 8 + params * share * VALUE_BYTES}
        best = min(sizes, key=sizes.get)
        out[model] = {**{f"{k}_gb": round(v / 1e9, 2) for k, v in sizes.items()}, "smallest": best,
                      "ratio": round(sizes[best] / sizes["whole"], 4)}
    return out


def train(lr: float, steps: int, out: Path, model: Path, python: str) -> None:
    """verl's sync GRPO on the CPU recipe, saving HF weights after every step."""
    env = {**os.environ, "STEPS": str(steps), "LR": repr(lr), "OUT": str(out), "MODEL": str(model), "PY": python,
           "PYTHONUNBUFFERED": "1"}
    cmd = ["bash", str(Path(__file__).resolve().parents[2] / "recipes" / "cpu" / "run_sync_grpo.sh"),
           "trainer.save_freq=1", "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
           "trainer.logger=[file]"]
    log = out / "train.log"
    out.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        done = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"training at lr {lr} failed (exit {done.returncode}); see {log}")


def result(runs: Iterable[tuple[float, list[PairShare]]], steps: int, model_facts: dict, record: dict) -> dict:
    by_lr = {}
    for lr, pairs in runs:
        rows = [p.summary() for p in pairs]
        shares = [r["changed_share"] for r in rows]
        layers = [r["layers_changed_share"] for r in rows]
        by_lr[repr(lr)] = {"pairs": rows, "changed_share_mean": sum(shares) / len(shares),
                           "changed_share_max": max(shares), "layers_changed_share_mean": sum(layers) / len(layers),
                           "layers_changed_share_max": max(layers),
                           # the layers' share applied to every parameter: embeddings change less (only the rows
                           # of tokens seen), so this errs toward larger deltas
                           "prediction_from_layers_share": predict(max(layers))}
    return {**record, "what": "share of bf16 elements that change between consecutive published versions, from "
                              "verl's sync GRPO on a CPU fixture (one step = one version)",
            "dtype": "bfloat16", "steps": steps, "model": model_facts, "encodings": {
                "coo": f"{COO_BYTES_PER_CHANGE} bytes per changed element (int32 index, bf16 value)",
                "bitmap": "1 bit per element + 2 bytes per changed element"},
            "by_lr": by_lr,
            "cannot_know": ("a 20M-parameter model with a 151k-token embedding, a few steps, Adam's first steps "
                            "(no warm-up schedule): a real model's weight magnitudes, optimizer state and schedule "
                            "set its share; the prediction applies the largest per-step share measured over the transformer "
                            "layers to every parameter of the paper's sizes")}


def main(argv: Optional[list[str]] = None) -> int:
    from verl_laminar.bench.provenance import claim_result_path, provenance

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lr", type=float, action="append", default=None, help="learning rates (default: 1e-6, 1e-4)")
    ap.add_argument("--steps", type=int, default=6, help="training steps (versions) per learning rate")
    ap.add_argument("--model", default=None, help="model folder (default: the tiny-qwen fixture)")
    ap.add_argument("--out", default="runs/delta-share", help="run folder")
    ap.add_argument("--results", default=None, help="also write <results>/delta_share_<date>.json")
    ap.add_argument("--json", action="store_true", help="print the result JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    lrs = args.lr or [1e-6, 1e-4]
    if args.model is None:
        from verl_laminar.fixtures import model_dir

        model = model_dir()
    else:
        model = Path(args.model)
    record = provenance(argv, "verl_laminar.bench.delta_share")
    path = claim_result_path(args.results, "delta_share", record) if args.results else None
    runs = []
    for lr in lrs:
        out = Path(args.out) / f"lr{lr:g}"
        logger.info("training at lr %g for %d steps into %s", lr, args.steps, out)
        train(lr, args.steps, out, model, sys.executable)
        runs.append((lr, measure_run(out, model)))
    manifest = json.loads((model / "MANIFEST.json").read_text()) if (model / "MANIFEST.json").is_file() else {}
    res = result(runs, args.steps, {k: manifest.get(k) for k in ("fixture", "parameters")}, record)
    text = json.dumps(res, indent=2)
    if path is not None:
        path.write_text(text)
    if args.json:
        print(text)
    for lr, row in res["by_lr"].items():
        logger.info("lr %s: changed share mean %.5f, max %.5f; transformer layers mean %.5f, max %.5f", lr,
                    row["changed_share_mean"], row["changed_share_max"], row["layers_changed_share_mean"],
                    row["layers_changed_share_max"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
