"""Fault injection into a running ``FtRuntime``, by PID: what the chaos benchmark and the recovery tests do.

Each function records a ``FaultRecord`` on the runtime (``rt.faults``) before it strikes; the runtime's own
recovery paths fill in when the fault was detected and when the system was whole again. Nothing here decides
anything about recovery: a killed process is noticed the way a real crash would be.

    kill_replica(rt, rid)      SIGKILL a rollout replica's actor process (its vLLM engine dies with it)
    corrupt_replica(rt, rid)   the replica's next output carries out-of-vocabulary token ids
    kill_relay(rt, relay_id)   SIGKILL a relay (the master too); returns once the chain is rebuilt
    kill_pool(rt)              SIGKILL the partial-response pool; returns once the restarted pool answers
    kill_trainer(rt)           SIGKILL the trainer process; the runtime's trainer watch restarts it
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class FaultRecord:
    kind: str
    target: str
    t_kill: float
    t_detect: Optional[float] = None
    t_recovered: Optional[float] = None
    detail: dict = field(default_factory=dict)

    @property
    def recovery_s(self) -> Optional[float]:
        return None if self.t_recovered is None else self.t_recovered - self.t_kill


async def kill_replica(rt: Any, rid: int) -> FaultRecord:
    f = FaultRecord("rollout", f"replica{rid}", time.time(), detail={"pid": rt.pids[rid][0]})
    rt.faults.append(f)
    os.kill(rt.pids[rid][0], signal.SIGKILL)
    return f


async def corrupt_replica(rt: Any, rid: int) -> FaultRecord:
    """The replica's next output carries out-of-vocabulary token ids (a broken engine, not a dead one)."""
    f = FaultRecord("garbage", f"replica{rid}", time.time(), detail={"pid": rt.pids[rid][0]})
    rt.faults.append(f)
    await rt.replicas[rid].inject_garbage.remote(1)
    return f


async def relay_pid(rt: Any, relay_id: str) -> int:
    import ray

    h = ray.get_actor(await rt.relay_group.actor_name.remote(relay_id), namespace=rt.s.namespace)
    return await h.__ray_call__.remote(lambda self_: os.getpid())


async def kill_relay(rt: Any, relay_id: str, kind: str = "relay") -> FaultRecord:
    pid = await relay_pid(rt, relay_id)
    f = FaultRecord(kind, relay_id, time.time(), detail={"pid": pid})
    rt.faults.append(f)
    os.kill(pid, signal.SIGKILL)
    while True:
        ev = [e for e in await rt.relay_group.events.remote()
              if relay_id in e.get("dropped", ()) and "t_rebuilt" in e]
        if ev:
            f.t_detect, f.t_recovered = ev[0]["t_detect"], ev[0]["t_rebuilt"]
            f.detail["master_changed"] = ev[0]["master_changed"]
            return f
        await asyncio.sleep(0.02)


async def kill_pool(rt: Any) -> FaultRecord:
    pid = await rt.pool.__ray_call__.remote(lambda p: os.getpid())
    f = FaultRecord("pool", "pool", time.time(), detail={"pid": pid})
    rt.faults.append(f)
    os.kill(pid, signal.SIGKILL)
    while True:
        try:
            got = await asyncio.wait_for(rt.pool.__ray_call__.remote(lambda p: (os.getpid(), len(p),
                                                                                  p.recovered)), 5)
            if got[0] != pid:
                f.t_recovered = time.time()
                f.detail.update(entries_recovered=got[2])
                return f
        except Exception:  # noqa: BLE001 - the pool is restarting; ask again
            await asyncio.sleep(0.05)


async def kill_trainer(rt: Any) -> FaultRecord:
    f = FaultRecord("trainer", "trainer", time.time(), detail={"pid": rt.trainer_pid})
    rt.faults.append(f)
    os.kill(rt.trainer_pid, signal.SIGKILL)
    return f
