"""Prompt uids that a resumed run draws again (``laminar.fleet.detached``).

verl names each prompt it fetches with a random uid. A resumed run re-issues the prompts that were running at its
checkpoint under their uids, but draws the prompts fetched after the checkpoint again from the restored dataloader,
in the same order, under new random uids; the responses a detached fleet finished for those while the trainer was
down would never be found. With the fleet detached the uids are ``{lineage}-p{k}``: ``k`` counts the prompts this
lineage fetched, and the count is saved with each checkpoint (beside verl's dataloader state, which fixes the order),
so the prompt drawn k-th after a resume is named as it was before the kill. ``lineage`` is random per fresh run and
kept across resumes, so two runs never share a uid; a checkpoint without the file (written without a detached
fleet) starts a new lineage: its prompts are regenerated, never confused.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Optional

FILE = "laminar_uids.json"


class StableUids:
    def __init__(self, lineage: Optional[str] = None, fetched: int = 0) -> None:
        self.lineage = lineage or uuid.uuid4().hex[:12]
        self.fetched = int(fetched)

    def take(self, n: int) -> list[str]:
        """The next ``n`` uids (no underscore: verl's trajectory keys are ``{uid}_{session}``)."""
        out = [f"{self.lineage}-p{self.fetched + i}" for i in range(n)]
        self.fetched += n
        return out

    def save(self, step_dir: str) -> None:
        os.makedirs(step_dir, exist_ok=True)
        with open(os.path.join(step_dir, FILE), "w") as f:
            json.dump({"lineage": self.lineage, "fetched": self.fetched}, f)

    @classmethod
    def load(cls, step_dir: str) -> Optional["StableUids"]:
        """The counter saved with a checkpoint, or None when the checkpoint has none."""
        try:
            with open(os.path.join(step_dir, FILE)) as f:
                state = json.load(f)
        except FileNotFoundError:
            return None
        return cls(str(state["lineage"]), int(state["fetched"]))
