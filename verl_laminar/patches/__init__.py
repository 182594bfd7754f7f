"""Named, version-guarded patches for verl call sites that have no extension seam, and the verl version guard.

Every patch here is listed in the repository's ``patches/README.md`` ledger (target, why, upstream fix,
remove-when). A patch is applied at most once per process, only for the verl versions it was verified on;
on any other version it refuses loudly instead of silently patching code it has never seen.

What an untested verl version does to a run (see patches/README.md, "verl versions"):
* verl's own trainers (sync, colocate/separate async) on an accelerator: run unchanged, with one WARNING per
  process naming the installed and the verified versions (none of our patches touches them there);
* a Laminar run (``trainer.v1.trainer_mode=laminar``): fails when the trainer is built (``PatchVersionError``);
* the CPU platform: cannot work without its patches, so it fails at first use (``PatchVersionError``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

logger = logging.getLogger(__name__)

VERIFIED_VERL_VERSIONS = ("0.9.1",)


class PatchVersionError(RuntimeError):
    pass


def installed_verl_version() -> str:
    import verl

    return str(verl.__version__)


def verl_verified(installed: Optional[str] = None, verified: tuple[str, ...] = VERIFIED_VERL_VERSIONS) -> bool:
    return (installed_verl_version() if installed is None else installed) in verified


def unverified_verl_message(what: str, installed: str, verified: tuple[str, ...] = VERIFIED_VERL_VERSIONS) -> str:
    """The error/warning text for ``what`` on an untested verl: both versions and the two ways out."""
    names = " or ".join(verified)
    return (f"{what} needs verl {names}, the version(s) verl_laminar was verified on, but verl {installed} is "
            f"installed. Fix: pip install 'verl=={verified[-1]}'; or re-check every patch in patches/README.md "
            f"against verl {installed}'s source and add {installed!r} to VERIFIED_VERL_VERSIONS in "
            "verl_laminar/patches/__init__.py (and to the patches' verl_versions).")


def require_verified_verl(what: str) -> None:
    """Raise ``PatchVersionError`` naming both versions unless the installed verl is a verified one."""
    installed = installed_verl_version()
    if not verl_verified(installed):
        raise PatchVersionError(unverified_verl_message(what, installed))


_WARNED = False


def warn_if_unverified_verl() -> bool:
    """Log one WARNING per process when verl is untested; returns whether it is verified."""
    global _WARNED
    installed = installed_verl_version()
    if verl_verified(installed):
        return True
    if not _WARNED:
        _WARNED = True
        logger.warning(
            "verl %s is installed; verl_laminar was verified on verl %s only. verl's own trainers run unchanged "
            "(verl_laminar's fixes for them are not applied); the Laminar trainer, the relay checkpoint engine and "
            "the CPU platform refuse to run. Fix: pip install 'verl==%s', or re-check patches/README.md against "
            "verl %s and extend VERIFIED_VERL_VERSIONS.",
            installed, " or ".join(VERIFIED_VERL_VERSIONS), VERIFIED_VERL_VERSIONS[-1], installed)
    return False


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
    installed = installed_verl_version()
    if not verl_verified(installed, patch.verl_versions):
        raise PatchVersionError(unverified_verl_message(f"patch {patch.name!r} (target {patch.target})",
                                                        installed, patch.verl_versions))
    patch.apply()
    _APPLIED[patch.name] = patch
    logger.debug("applied patch %s -> %s", patch.name, patch.target)
    return True


def applied_patches() -> list[str]:
    return sorted(_APPLIED)
