"""The first publish is warm on the path a run takes: ``LaminarTrainer._publish`` -> verl's actor
``update_weights`` -> the relay engine's ``send_weights``, with the engine built as verl builds it
(``CheckpointEngineRegistry.new`` with the ``engine_kwargs`` the start checks derive, ``expected_bytes``
sized by the preflight's own model-size reader). Nobody calls ``prepare()`` here, as nobody does in a run.

Only the lookup of the master relay is replaced (an in-process relay instead of the Ray group); the
warming, the writer and the publisher are the real ones. ``cold_publishes`` counts publishes that were
gathered in a private host copy first; it must stay 0.
"""

import asyncio
import json
import types

import pytest
import torch
from safetensors.torch import save_file
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.workers.engine_workers import ActorRolloutRefWorker

from laminar_testing import recording_handle
from verl_laminar.models.sizes import model_sizes
from verl_laminar.relay.publish import Publisher
from verl_laminar.relay.relay import Relay
from verl_laminar.relay.tensors import read_tensors
from verl_laminar.relay.verl_backend import BACKEND
from verl_laminar.trainer import laminar_trainer as lt


@pytest.fixture
def relay(tmp_path):
    r = Relay("master", root=str(tmp_path / "master"))
    yield r
    r.close(destroy=True)


TIED = {"tied": False}  # the model of the running test ties its word embeddings (the trainer then names the head)


def _weights(step: int):
    torch.manual_seed(step)
    # the embedding (6 MiB in bf16) is larger than the slack a prepared buffer has (WARM_SLACK_BYTES), so a size
    # that left out the tied head would publish cold
    out = {"model.embed_tokens.weight": torch.randn(2048, 1536), "layer.weight": torch.randn(64, 1536),
           "layer.bias": torch.randn(64), "norm.weight": torch.randn(1536)}
    if TIED["tied"]:  # what verl's actor yields for a tied model: the embedding under the LM head's name too
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _expected_bytes(tmp_path) -> int:
    """What the start checks put in ``engine_kwargs.laminar.expected_bytes`` for this model in bf16 (a tied
    checkpoint stores the embedding once)."""
    folder = tmp_path / "model"
    folder.mkdir()
    stored = {k: v.clone() for k, v in _weights(0).items() if k != "lm_head.weight"}
    save_file(stored, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": TIED["tied"]}))
    return model_sizes(str(folder)).version_bytes("bfloat16")


class _Worker:
    """What verl's ``ActorRolloutRefWorker.update_weights`` reads of its worker on the checkpoint-engine path."""

    def __init__(self, engine):
        self.checkpoint_engine = engine
        self.step = 0
        self.config = types.SimpleNamespace(rollout=types.SimpleNamespace(
            checkpoint_engine=types.SimpleNamespace(backend=BACKEND)))
        self.actor = types.SimpleNamespace(engine=types.SimpleNamespace(get_per_tensor_param=self._params))

    def _params(self, **_):
        return iter(_weights(self.step).items()), None


class _WorkerGroup:
    """The trainer's ``actor_rollout_wg``: one rank (the master), its call run in this process."""

    def __init__(self, worker):
        self.worker = worker

    def update_weights(self, global_steps, mode):
        self.worker.step = global_steps
        return [asyncio.run(ActorRolloutRefWorker.update_weights(self.worker, global_steps=global_steps, mode=mode))]


def _trainer(engine, monkeypatch):
    monkeypatch.setattr(lt, "ray", types.SimpleNamespace(get=lambda refs: refs))  # results are already values
    published = []
    return types.SimpleNamespace(
        config=types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(rollout=types.SimpleNamespace(
            checkpoint_engine=types.SimpleNamespace(backend=BACKEND)))),
        actor_rollout_wg=_WorkerGroup(_Worker(engine)),
        accounting=types.SimpleNamespace(throughput=types.SimpleNamespace(publish=lambda v, t: published.append(v))),
        _files=types.SimpleNamespace(write=lambda records, flush: None))


def _engine(relay, expected_bytes):
    kwargs = {"dtype": "bfloat16"} | ({"expected_bytes": expected_bytes} if expected_bytes is not None else {})
    engine = CheckpointEngineRegistry.new(BACKEND, is_master=True, bucket_size=16 << 20, **kwargs)
    handle = recording_handle(relay)
    publisher = Publisher(handle)
    engine._get_publisher = lambda: publisher  # the master relay found in-process instead of through the group
    return engine, handle, publisher


@pytest.mark.parametrize("tied", [False, True])
def test_version_0_through_the_trainer_is_warm(relay, tmp_path, monkeypatch, tied):
    """Tied word embeddings too (the tiny fixtures', Qwen2.5 up to 3B): the version carries the LM head beside the
    embedding, so its size is the checkpoint's plus the embedding once more (a run measured version 0 of the tiny
    fixture cold before the size counted it)."""
    monkeypatch.setitem(TIED, "tied", tied)
    engine, handle, publisher = _engine(relay, _expected_bytes(tmp_path))
    trainer = _trainer(engine, monkeypatch)
    for version in (0, 1):
        out = lt.LaminarTrainer._publish(trainer, version)
        assert out["laminar/relay/version"] == version
        assert out["laminar/relay/cold_publishes"] == 0, f"version {version} took the cold path"
        assert "begin_publish" not in handle.calls and "publish_prepared" in handle.calls
        handle.calls.clear()
        assert relay.wait_version(version, 10)
        m, view = relay.reader().open(version)
        got = dict(read_tensors(m, view))
        for name, t in _weights(version).items():
            assert torch.equal(got[name], t.to(torch.bfloat16)), (version, name)
        del got, view
    assert engine.cold_publishes == 0
    publisher.close()


def test_without_a_known_size_the_counter_moves(relay, monkeypatch):
    """The counter's other side: no ``expected_bytes`` -> version 0 is gathered first, and counted."""
    engine, handle, publisher = _engine(relay, None)
    trainer = _trainer(engine, monkeypatch)
    out = lt.LaminarTrainer._publish(trainer, 0)
    assert out["laminar/relay/cold_publishes"] == 1 and "begin_publish" in handle.calls
    handle.calls.clear()
    out = lt.LaminarTrainer._publish(trainer, 1)  # the next one reuses version 0's size
    assert out["laminar/relay/cold_publishes"] == 1 and "begin_publish" not in handle.calls
    assert relay.wait_version(1, 10)
    publisher.close()
