"""Named, version-guarded patches for verl call sites that have no extension seam.

Every patch here is listed in the repository's ``patches/README.md`` ledger (target, why, upstream fix,
remove-when). A patch is applied at most once per process, only for the verl versions it was verified on;
on any other version it refuses loudly instead of silently patching code it has never seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)

VERIFIED_VERL_VERSIONS = ("0.9.1",)


class PatchVersionError(RuntimeError):
    pass


@dataclass(frozen=True)
class Patch:
    name: str
    target: str  # dotted path of what is replaced
    apply: Callable[[], None]
    verl_versions: tuple[str, ...] = VERIFIED_VERL_VERSIONS


_APPLIED: dict[str, Patch] = {}


def apply_patch(patch: Patch) -> bool:
    """Apply ``patch`` once; returns False when it was already applied in this process."""
    if patch.name in _APPLIED:
        return False
    import verl

    if verl.__version__ not in patch.verl_versions:
        raise PatchVersionError(
            f"patch {patch.name!r} targets {patch.target} and was verified on verl {patch.verl_versions}, "
            f"but verl {verl.__version__} is installed. Re-check the target against the new verl source, then "
            f"extend the version guard (or remove the patch if verl fixed it upstream); see patches/README.md."
        )
    patch.apply()
    _APPLIED[patch.name] = patch
    logger.debug("applied patch %s -> %s", patch.name, patch.target)
    return True


def applied_patches() -> list[str]:
    return sorted(_APPLIED)
