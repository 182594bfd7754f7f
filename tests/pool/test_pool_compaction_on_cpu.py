"""The pool's log is compacted by bytes: with long responses a compaction rewrites the live entries only after the
log grew by several times their size, so rewriting costs a fraction of what the streams append."""

from verl_laminar.pool.partial import PartialPool


def test_compactions_rewrite_less_than_the_streams_append(tmp_path):
    path = str(tmp_path / "pool.log")
    pool = PartialPool(path)  # the default ratio, 4
    live = [f"k{i}" for i in range(200)]
    for k in live:
        pool.open(k, k, 0, [1] * 16, {})
    offsets = dict.fromkeys(live, 0)
    fresh = 0
    for step in range(6000):  # 64-token chunks round robin; one response ends every 5 chunks
        k = live[step % len(live)]
        pool.append(k, 0, [7] * 64, [-0.5] * 64, offset=offsets[k])
        offsets[k] += 64
        if step % 5 == 4:
            done = live.pop(0)
            pool.close(done)
            fresh += 1
            live.append(f"n{fresh}")
            offsets[live[-1]] = 0
            pool.open(live[-1], live[-1], 0, [1] * 16, {})
    s = pool.stats()
    assert s["compactions"] >= 1
    # a rule by record count (4 records per open entry) rewrote about four times what was appended here
    assert s["rewritten_bytes"] < 0.5 * s["log_bytes_written"], s
    want = {t.key: len(t.tokens) for t in pool}
    pool.shutdown()
    assert {t.key: len(t.tokens) for t in PartialPool(path)} == want  # nothing lost by compacting
