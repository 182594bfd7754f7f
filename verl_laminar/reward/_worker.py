"""Body of one reward worker process (see pool.py).

Protocol on the pipe: the worker sends ("ready", None) or ("load_error", message) once; then for every
kwargs dict it receives it answers ("ok", result) or ("raised", "ExcType: message"). It exits on None or EOF.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import traceback
from multiprocessing.connection import Connection

from verl_laminar.reward import fn_spec

logger = logging.getLogger(__name__)


def worker_main(conn: Connection, spec: fn_spec.ScoreFnSpec) -> None:
    try:
        fn = fn_spec.load(spec)
    except Exception as e:  # fault-tolerance boundary: a bad score_fn is reported to the parent, not raised here
        conn.send(("load_error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            kwargs = conn.recv()
        except EOFError:
            return
        if kwargs is None:
            return
        try:
            result = fn(**kwargs)
            if inspect.isawaitable(result):
                # An async score function gets its own short-lived loop in this process.
                result = asyncio.run(result)
        except Exception as e:  # fault-tolerance boundary: the user's reward function may raise anything
            last = traceback.extract_tb(e.__traceback__)[-1:]
            where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
            conn.send(("raised", f"{type(e).__name__}: {e}{where}"[:1000]))
            continue
        try:
            conn.send(("ok", result))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            conn.send(("raised", f"result cannot be sent back ({type(e).__name__}: {e})"[:1000]))
