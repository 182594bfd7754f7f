"""Remove POSIX shared-memory segments that vLLM's CPU engine leaves behind when Ray kills it at shutdown.

Only old segments that no live process maps are removed. The age floor matters: a multiprocessing semaphore
exists, unmapped, between its creation by a parent and its opening by a spawned child; deleting it then
kills the child's start-up (vLLM's engine died that way when a cleanup ran beside a starting job).

    python -m verl_laminar.platform.shm_cleanup
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

SHM = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")
MIN_AGE_S = 30 * 60


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


def cleanup(min_age_s: float = MIN_AGE_S) -> list[str]:
    if not SHM.is_dir():
        return []
    in_use = _mapped_shm_names()
    now = time.time()
    removed = []
    for path in SHM.iterdir():
        if not path.name.startswith(PREFIXES) or path.name in in_use:
            continue
        st = path.stat()
        if st.st_uid == os.getuid() and now - st.st_mtime > min_age_s:
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
