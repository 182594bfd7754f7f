"""Did every mode train the same prompts in the same order? The prompt ids each run scored, against verl's
dataloader order for the part's seed, and one fingerprint of the prefix every mode trained.

    reward record (verl_laminar/reward/recorded.py: one line per scored response, ``extra_info.index``)
        -> scored groups: prompt occurrences with all ``group`` responses scored (every trained group is one; an
           asynchronous run's buffer holds more)
    dataloader order (``dispatch_order``: verl's own sampler and dataset filter, the run's seed and batch size)
        -> covered prefix of each run: the longest prefix of that order whose every occurrence the run trained
        -> stray: occurrences a run trained beyond its covered prefix (in flight at the budget's end, or out of
           order; a run that drew prompts in another order covers almost nothing and strays almost everywhere)
    common prefix L = the smallest covered prefix over the part's modes; fingerprint = sha256 of the ids in
    dataloader order over those L, taken from each run's own covered prefix (equal in every mode by construction
    when each covers L: what is measured is the covered prefixes, their strays, and the counts)

Pure except ``dispatch_order`` and ``read_record`` (files, verl).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

logger = logging.getLogger(__name__)
RULE = ("each run's reward function notes the prompt id (extra_info.index) of every scored response; a prompt "
        "occurrence counts once all its group's responses are scored before the budget's end (every trained group "
        "is among them; an asynchronous run's buffer holds more); verl's dataloader order for the "
        "part's seed (its own sampler and dataset filter) is the dispatch order; a run's covered prefix is the "
        "longest prefix of that order whose every occurrence it trained; the fingerprint is the sha256 of the "
        "ids, comma-joined, over the prefix every mode of the part covered")


def read_record(path: Path) -> list[dict]:
    """The reward record's lines (a torn last line from a killed run is skipped)."""
    out = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def trained_groups(ids: Iterable, group: int) -> Counter:
    """Prompt id -> occurrences trained (responses scored // group)."""
    counts = Counter(str(i) for i in ids)
    return Counter({i: c // group for i, c in counts.items() if c >= group})


def covered_prefix(order: Sequence, groups: Mapping[str, int]) -> int:
    """The longest prefix of ``order`` whose every occurrence is among ``groups`` (occurrences counted)."""
    used: Counter = Counter()
    for n, i in enumerate(order):
        key = str(i)
        used[key] += 1
        if used[key] > groups.get(key, 0):
            return n
    return len(order)


def fingerprint(ids: Sequence) -> str:
    return hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()


@dataclass(frozen=True)
class RunPrompts:
    scored_responses: int
    scored_groups: int  # whole groups scored (an asynchronous run's buffer holds some not trained yet)
    covered_prefix: int
    stray: int  # scored occurrences beyond the covered prefix

    def as_dict(self) -> dict:
        return {"scored_responses": self.scored_responses, "scored_groups": self.scored_groups,
                "covered_prefix": self.covered_prefix, "stray": self.stray}


def run_prompts(ids: Sequence, order: Sequence, group: int) -> RunPrompts:
    groups = trained_groups(ids, group)
    prefix = covered_prefix(order, groups)
    total = sum(groups.values())
    return RunPrompts(scored_responses=len(ids), scored_groups=total, covered_prefix=prefix, stray=total - prefix)


def common_fingerprints(runs: Mapping[str, Sequence], order: Sequence, group: int) -> dict:
    """Per mode: counts, covered prefix and the fingerprint over the prefix every mode covered."""
    per = {m: run_prompts(ids, order, group) for m, ids in runs.items()}
    common = min((p.covered_prefix for p in per.values()), default=0)
    out = {}
    for mode, p in per.items():
        ids = list(order[:p.covered_prefix])[:common]  # this run's own covered prefix, cut to the common length
        out[mode] = {"sha256": fingerprint(ids), "prefix": common, **p.as_dict()}
    return {"common_prefix": common, "equal": len({v["sha256"] for v in out.values()}) <= 1, "modes": out}


def filtered_ids(train_file: Path, tokenizer_dir: Path, max_prompt: int) -> list[str]:
    """The prompt ids (``extra_info.index``) of verl's training dataset, in its order: its own dataset class with
    its overlong-prompt filter (a prompt over ``max_prompt`` tokens is dropped in every mode alike). Slow
    (tokenises every prompt): once per invocation."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = OmegaConf.create({"max_prompt_length": max_prompt, "filter_overlong_prompts": True,
                            "filter_overlong_prompts_workers": 1, "prompt_key": "prompt", "truncation": "error"})
    dataset = RLHFDataset(data_files=[str(train_file)], tokenizer=tok, config=cfg)
    return [str((row.get("extra_info") or {}).get("index")) for row in dataset.dataframe]


def dispatch_order(ids: Sequence[str], seed: int, batch: int, occurrences: int) -> list[str]:
    """The prompt ids in the order verl's trainer dispatches them: its sampler (``data.seed``, shuffled) and its
    dataloader (``batch`` prompts a fetch, the last partial batch dropped), over as many epochs as
    ``occurrences`` needs."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler

    positions = list(range(len(ids)))
    if len(ids) < batch:
        raise ValueError(f"{len(ids)} prompts survive verl's filter, fewer than a batch of {batch}: raise --prompt "
                         "or check the task's train file")
    cfg = OmegaConf.create({"shuffle": True, "seed": seed})
    loader = StatefulDataLoader(dataset=positions, batch_size=batch, drop_last=True,
                                sampler=create_rl_sampler(cfg, positions), collate_fn=list)
    order: list[str] = []
    while len(order) < occurrences:
        for fetched in loader:
            order.extend(ids[p] for p in fetched)
    return order
