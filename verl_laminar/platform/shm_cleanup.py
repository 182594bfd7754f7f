"""Remove POSIX shared-memory segments that vLLM's CPU engine leaves behind when Ray kills it at shutdown.

Only segments whose owner process is gone are removed: a segment is kept while any live process maps it, so
running jobs are never disturbed.

    python -m verl_laminar.platform.shm_cleanup
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

SHM = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")


def _mapped_shm_names() -> set[str]:
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
        except OSError:  # process exited or is not ours to read
            continue
    return names


def cleanup() -> list[str]:
    if not SHM.is_dir():
        return []
    in_use = _mapped_shm_names()
    removed = []
    for path in SHM.iterdir():
        if path.name.startswith(PREFIXES) and path.name not in in_use and path.stat().st_uid == os.getuid():
            try:
                os.unlink(path)
                removed.append(path.name)
            except OSError as e:
                logger.warning("could not remove %s: %s", path, e)
    logger.info("removed %d stale shared-memory segments", len(removed))
    return removed


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cleanup()
