"""Resuming a migrated trajectory: what the target replica is asked for, and how the pieces join.

Pure: no ray/torch/vllm/verl. A repack migration aborts a request on its source replica, keeps the
tokens (and rollout log-probs) the source had streamed back, and resumes on the target with
prompt + partial response as the new prefix, the same sampling parameters and the remaining token
budget. The trajectory the trainer sees is the concatenation, in order, of every piece; its version
is the version both replicas served (repack never crosses versions, see ``policy.repack``).

Tokens the source generated after the last one it streamed back are dropped, not resumed: the target
regenerates from the last token the client saw, so no token is counted twice or skipped. A request under a
whole-response constraint (a regex or grammar) is not resumed but restarted from its prompt (``resumable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

# Sampling keys that constrain a response from its first token (vLLM's structured outputs, the older guided_* keys,
# an OpenAI-style response_format). A resumed piece would apply the constraint to the continuation alone, as if it
# were a whole response, so such a request restarts from its prompt on the target instead (``resumable``).
CONSTRAINED_KEYS = frozenset({"structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                              "guided_decoding", "response_format"})


def resumable(sampling_params: Mapping[str, Any]) -> bool:
    """Whether a migrated request may continue from its partial response (no whole-response constraint)."""
    return not any(sampling_params.get(k) is not None for k in CONSTRAINED_KEYS)


class MigrationError(ValueError):
    """A resume that would change the trajectory (wrong version, over budget, mismatched pieces)."""


@dataclass(frozen=True)
class Piece:
    """What one replica generated for a trajectory before it finished or was aborted."""

    token_ids: tuple[int, ...]
    log_probs: Optional[tuple[float, ...]]  # rollout log-probs, one per token; None when not requested
    version: int
    replica_id: int
    finished: bool  # False: aborted by a migration, to be resumed elsewhere

    def __post_init__(self) -> None:
        if self.log_probs is not None and len(self.log_probs) != len(self.token_ids):
            raise MigrationError(f"piece from replica {self.replica_id}: {len(self.token_ids)} tokens but "
                                 f"{len(self.log_probs)} log-probs")


@dataclass
class Response:
    """One response being generated, possibly across replicas; ``pieces`` in generation order."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: Mapping[str, Any] = field(default_factory=dict)  # everything but max_tokens / min_tokens
    min_tokens: int = 0
    pieces: list[Piece] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise MigrationError(f"{self.request_id}: max_tokens={self.max_tokens} must be >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise MigrationError(f"{self.request_id}: min_tokens={self.min_tokens} must be in [0, max_tokens]")
        for k in ("max_tokens", "min_tokens"):
            if k in self.sampling:
                raise MigrationError(f"{self.request_id}: pass {k} as a field, not in sampling, so a resume "
                                     "can lower it")

    @property
    def generated(self) -> int:
        return sum(len(p.token_ids) for p in self.pieces)

    @property
    def done(self) -> bool:
        return bool(self.pieces) and self.pieces[-1].finished

    @property
    def migrations(self) -> int:
        return sum(1 for p in self.pieces if not p.finished)

    @property
    def version(self) -> Optional[int]:
        return self.pieces[0].version if self.pieces else None

    def add(self, piece: Piece) -> None:
        if self.done:
            raise MigrationError(f"{self.request_id}: a piece arrived after the trajectory finished")
        if self.pieces and piece.version != self.pieces[0].version:
            raise MigrationError(f"{self.request_id}: piece of version {piece.version} after version "
                                 f"{self.pieces[0].version}; a trajectory must come from one version")
        if self.pieces and (piece.log_probs is None) != (self.pieces[0].log_probs is None):
            raise MigrationError(f"{self.request_id}: pieces disagree on whether log-probs were requested")
        if self.generated + len(piece.token_ids) > self.max_tokens:
            raise MigrationError(f"{self.request_id}: {self.generated} + {len(piece.token_ids)} tokens exceed "
                                 f"max_tokens={self.max_tokens}")
        self.pieces.append(piece)

    def next_request(self) -> tuple[list[int], dict[str, Any]]:
        """Prompt ids and sampling parameters for the next piece: the prefix so far, the budget left."""
        if self.done:
            raise MigrationError(f"{self.request_id}: already finished")
        n = self.generated
        if n >= self.max_tokens:
            raise MigrationError(f"{self.request_id}: no token budget left ({n} of {self.max_tokens})")
        params = dict(self.sampling)
        params["max_tokens"] = self.max_tokens - n
        if self.min_tokens:
            params["min_tokens"] = max(0, self.min_tokens - n)
        return list(self.prompt_ids) + self.token_ids(), params

    def token_ids(self) -> list[int]:
        return [t for p in self.pieces for t in p.token_ids]

    def log_probs(self) -> Optional[list[float]]:
        if not self.pieces or self.pieces[0].log_probs is None:
            return None
        return [lp for p in self.pieces for lp in p.log_probs]


def join(pieces: Sequence[Piece]) -> tuple[list[int], Optional[list[float]], int]:
    """Token ids, log-probs and version of a finished trajectory assembled from ``pieces``."""
    if not pieces or not pieces[-1].finished:
        raise MigrationError("a trajectory is complete only when its last piece finished")
    if any(p.finished for p in pieces[:-1]):
        raise MigrationError("only the last piece of a trajectory may be a finished one")
    versions = {p.version for p in pieces}
    if len(versions) != 1:
        raise MigrationError(f"pieces of versions {sorted(versions)}: a trajectory must come from one version")
    lps = None if pieces[0].log_probs is None else [lp for p in pieces for lp in p.log_probs]
    return [t for p in pieces for t in p.token_ids], lps, pieces[0].version
