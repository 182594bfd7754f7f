"""Small helpers of the partial-response pool's log and stats (kept apart so ``partial.py`` stays one concern)."""

from __future__ import annotations

import os
from typing import Any


def rss_bytes() -> int:
    """This process's resident set (Linux ``/proc``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Counted:
    """A text file's ``write`` that adds what it wrote to ``sizes[key]`` (the records are ASCII JSON: chars = bytes)."""

    def __init__(self, f: Any, key: str, sizes: dict[str, int]) -> None:
        self.f, self.key, self.sizes = f, key, sizes

    def write(self, text: str) -> None:
        self.f.write(text)
        self.sizes[self.key] = self.sizes.get(self.key, 0) + len(text)
