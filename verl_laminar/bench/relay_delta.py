"""The relay benchmark's delta rows (``laminar.relay.delta``): versions from real training down the same chain, as
deltas (``auto``) and whole (``off``), one after the other on the same testbed.

Versions: the tiny-qwen fixture trained with AdamW at the paper's learning rate (1e-6 by default) on its own SFT
task (the toy-math train split, next-token loss on the solutions), one optimizer step a version. A version is every
parameter cast to bf16 (what the relays carry for a bf16 rollout), in the model's order. A ``--size-mb`` version is
that model's bytes repeated (the last copy cut), so every copy changes as the trained model did: the changed share
is the model's own, measured on its consecutive versions; what a larger model's share would be, this cannot know
(``docs/results/delta_share_*.json`` has the measurement across learning rates and tensor kinds).

Per mode: version 0 goes whole to build every relay's base, then version 1 is timed: broadcast time (publish to the
last relay's commit), bytes on the wire (what every relay sent downstream, the master's first hop included), relay
CPU seconds, and each relay's copy hashed against the source. ``rebuild_s``: one rebuild of the version in this
process as each relay does it before it commits (a copy of the base, ``relay.delta.apply``, the per-chunk digest).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import time
from typing import Optional

from verl_laminar.bench.learn.task import sha256
from verl_laminar.policy.chain import ChainPlan
from verl_laminar.relay import delta
from verl_laminar.relay.netns import NetnsTestbed
from verl_laminar.relay.publish import Publisher
from verl_laminar.relay.serve import RelayProcess
from verl_laminar.relay.transport_spec import TransportSpec

logger = logging.getLogger("verl_laminar.bench.relay")
MODES = ("off", "auto")


def trained_versions(size_bytes: int, n: int = 2, lr: float = 1e-6, batch: int = 16, seed: int = 0,
                     model: Optional[str] = None) -> tuple[list[bytes], dict]:
    """``n`` consecutive versions of ``size_bytes`` from real training (see the module doc), and how they were made."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_laminar.data import toy_math_path
    from verl_laminar.fixtures import model_dir
    from verl_laminar.fixtures.model import _encode, _sft_batch

    path = model or str(model_dir())
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(path)
    net = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    rows = pd.read_parquet(toy_math_path("train")).to_dict("records")
    pairs = _encode(tok, rows[:512])
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    rng = random.Random(seed)

    def snapshot() -> bytes:
        flat = torch.cat([p.detach().to(torch.bfloat16).reshape(-1) for p in net.parameters()])
        return flat.view(torch.uint8).numpy().tobytes()

    versions, losses = [snapshot()], []
    for _ in range(n - 1):
        ids, mask, target = _sft_batch(pairs, rng.sample(range(len(pairs)), batch), pad)
        logits = net(input_ids=ids, attention_mask=mask).logits[:, :-1]
        sel = target[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[sel].float(), ids[:, 1:][sel])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 4))
        versions.append(snapshot())
    model_bytes = len(versions[0])
    copies = -(-size_bytes // model_bytes)
    shares = [_changed_share(a, b) for a, b in zip(versions, versions[1:])]
    out = [(v * copies)[:size_bytes] for v in versions]
    return out, {"model": os.path.basename(path.rstrip("/")), "model_bytes_bf16": model_bytes, "lr": lr,
                 "optimizer": "AdamW", "batch_rows": batch, "losses": losses, "copies": round(size_bytes / model_bytes, 3),
                 "changed_share_model": shares, "changed_share_version": [_changed_share(a, b) for a, b in
                                                                          zip(out, out[1:])]}


def _changed_share(a: bytes, b: bytes) -> float:
    import numpy as np

    x, y = np.frombuffer(a, np.uint16), np.frombuffer(b, np.uint16)
    return round(float(np.count_nonzero(x != y)) / x.size, 6)


def _rebuild_s(base: bytes, target: bytes, chunks: int) -> tuple[float, int]:
    """One encode in memory, then the timed rebuild of ``target`` as a relay does it: a copy of ``base``, the delta
    applied, the per-chunk digest computed for the check."""
    import io

    sink = io.BytesIO()
    size = delta.encode(base, target, sink, 2, len(target))
    if size is None:
        return float("nan"), len(target)
    t0 = time.perf_counter()
    out = bytearray(base)
    delta.apply(sink.getvalue(), out)
    delta.digest(out, -(-len(out) // chunks))
    t = time.perf_counter() - t0
    if hashlib.sha256(out).digest() != hashlib.sha256(target).digest():
        raise RuntimeError("the delta did not rebuild the version exactly")
    return t, size


def run(bed: NetnsTestbed, workdir: str, p: int, chunks: int, versions: list[bytes], transport: str = "tcp",
        sched: str = "rr") -> dict:
    """Both modes on the first ``p`` relays of ``bed``; returns {mode: row} plus the in-process rebuild time."""
    rows: dict = {}
    for mode in MODES:
        rows[mode] = _one(bed, os.path.join(workdir, f"delta-{mode}"), p, chunks, versions, mode,
                          TransportSpec(transport), sched)
    rebuild, size = _rebuild_s(versions[0], versions[1], chunks)
    whole, part = rows["off"], rows["auto"]
    return {"modes": rows, "rebuild_s": round(rebuild, 4), "delta_bytes": size, "version_bytes": len(versions[1]),
            "time_ratio_delta_over_whole": round(part["t_broadcast_s"] / whole["t_broadcast_s"], 4),
            "wire_ratio_delta_over_whole": round(part["wire_bytes"] / max(1, whole["wire_bytes"]), 6)}


def _one(bed: NetnsTestbed, root: str, p: int, chunks: int, versions: list[bytes], mode: str,
         transport: TransportSpec, sched: str) -> dict:
    procs = [RelayProcess(f"r{i}", root=os.path.join(root, f"store{i}"), control=os.path.join(root, f"ctl{i}.sock"),
                          host=bed.ip(i), netns=bed.ns(i), io_timeout_s=120.0, sched=sched, transport=transport,
                          delta=mode) for i in range(p)]
    try:
        for pr in procs:
            pr.wait_ready()
        addrs = {pr.relay_id: tuple(pr.call("address")) for pr in procs}
        plan = ChainPlan(relays=tuple(addrs), chunks=chunks, epoch=0)
        for pr in procs:
            pr.call("set_chain", plan, addrs)
        pub = Publisher(procs[0])
        pub.prepare(len(versions[0]))
        for v, data in enumerate(versions):
            if v == len(versions) - 1:
                stats0 = [pr.call("delta_stats") for pr in procs]
                cpu0 = [pr.call("cpu_stats") for pr in procs]
            pub.publish_parts(v, len(data), [(0, data)], reprepare=False)
            t_pub = time.time()
            for pr in procs:
                if not pr.call("wait_version", v, 600.0):
                    raise TimeoutError(f"relay {pr.relay_id} did not receive version {v} (delta={mode})")
        pub.close()
        last = len(versions) - 1
        done = {pr.relay_id: pr.call("timings", last) for pr in procs}
        cpu = [pr.call("cpu_stats") for pr in procs]
        stats = [pr.call("delta_stats") for pr in procs]
        want = hashlib.sha256(versions[last]).hexdigest()
        bad = [pr.relay_id for pr in procs if sha256(pr.call("describe", last)["path"]) != want]
    finally:
        for pr in procs:
            if pr.alive():
                pr.call("quiesce")
        for pr in procs:
            pr.stop()
        shutil.rmtree(root, ignore_errors=True)
    sent = {k: sum(b[k] - a[k] for a, b in zip(stats0, stats)) for k in ("bytes_delta_sent", "bytes_whole_sent")}
    return {"delta": mode, "relays": p, "chunks": chunks, "bytes": len(versions[last]),
            "t_broadcast_s": round(max(t["t_complete"] for t in done.values()) - t_pub, 4),
            "wire_bytes": sent["bytes_delta_sent"] + sent["bytes_whole_sent"], **sent,
            "sent_as_delta": sum(b["published_delta"] - a["published_delta"] for a, b in zip(stats0, stats)),
            "applied": sum(b["applied"] - a["applied"] for a, b in zip(stats0, stats)),
            "relay_cpu_s": round(sum(b["run_s"] - a["run_s"] for a, b in zip(cpu0, cpu)), 3),
            "integrity": "ok" if not bad else bad}



def summary_lines(deltas: Optional[dict]) -> list[str]:
    if not deltas:
        return []
    made = deltas["versions"]
    out = [f"delta rows: {made['model']} trained at lr {made['lr']:g}, changed share "
           f"{made['changed_share_model'][-1]:.4%}; a {deltas['version_bytes'] >> 20} MiB version"]
    for mode, r in deltas["modes"].items():
        out.append(f"{mode:>9}: {r['t_broadcast_s']:.3f} s, {r['wire_bytes'] / (1 << 20):.2f} MiB on the wire, "
                   f"relay CPU {r['relay_cpu_s']:.3f} s, applied {r['applied']}, {r['integrity']}")
    out.append(f"delta / whole: time {deltas['time_ratio_delta_over_whole']:.3f}, wire "
               f"{deltas['wire_ratio_delta_over_whole']:.5f}; rebuild {deltas['rebuild_s']:.3f} s")
    return out
