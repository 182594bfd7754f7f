"""Small helpers of the partial-response pool's log and stats (kept apart so ``partial.py`` stays one concern)."""

from __future__ import annotations

import base64
import json
import os
from array import array
from typing import Any


def rss_bytes() -> int:
    """This process's resident set (Linux ``/proc``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Counted:
    """A binary file's ``write`` of one record (``encode``) that adds its bytes to ``sizes[key]``."""

    def __init__(self, f: Any, key: str, sizes: dict[str, int]) -> None:
        self.f, self.key, self.sizes = f, key, sizes

    def write(self, rec: dict) -> None:
        line = encode(rec)
        self.f.write(line)
        self.sizes[self.key] = self.sizes.get(self.key, 0) + len(line)


# ---- the log's records ----
# A chunk's tokens and log-probs travel as packed arrays in base64 (int32 ids, float64 log-probs): JSON-encoding
# them number by number was about 70% of the pool's time per append (42 us against 8 us for a 64-token chunk), and
# float64 keeps every value exact, -inf included (JSON has no infinity; Python's json writes a non-standard one).
_PACKED = (("tokens", "tokens_i32", "i"), ("logprobs", "logprobs_f64", "d"))


def _pack(values: Any, code: str) -> str:
    # ids are range-checked where they enter (``PartialPool.append``), before the entry changes
    return base64.b64encode(array(code, values).tobytes()).decode("ascii")


def encode(rec: dict) -> bytes:
    """One log line: ``rec`` as compact JSON with its ``tokens`` / ``logprobs`` packed."""
    out = dict(rec)
    for name, packed, code in _PACKED:
        if name in out:
            out[packed] = _pack(out.pop(name), code)
    return (json.dumps(out, separators=(",", ":")) + "\n").encode("ascii")


def decode(line: bytes) -> dict:
    """A record from one log line (packed or, as older logs wrote them, plain JSON lists)."""
    rec = json.loads(line)
    for name, packed, code in _PACKED:
        if packed in rec:
            a = array(code)
            a.frombytes(base64.b64decode(rec.pop(packed)))
            rec[name] = a.tolist()
    return rec
