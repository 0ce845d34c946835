import random

from aotc.memory import ALIGN, Lifetime, plan_memory


def test_disjoint_lifetimes_share_and_overlapping_ones_do_not():
    bufs = [Lifetime("a", 1000, 0, 1), Lifetime("b", 1000, 1, 2), Lifetime("c", 1000, 2, 3)]
    offsets, total = plan_memory(bufs)
    assert offsets["a"] != offsets["b"] and offsets["b"] != offsets["c"]
    assert offsets["a"] == offsets["c"]
    assert total == 2 * 1024


def test_random_plans_never_overlap_live_buffers():
    rng = random.Random(0)
    for _ in range(200):
        bufs = []
        for i in range(rng.randint(1, 12)):
            first = rng.randint(0, 10)
            bufs.append(Lifetime(f"t{i}", rng.randint(1, 5000), first, first + rng.randint(0, 5)))
        offsets, total = plan_memory(bufs)
        for a in bufs:
            assert offsets[a.key] % ALIGN == 0
            assert offsets[a.key] + a.nbytes <= total
            for b in bufs:
                if a is b or a.last < b.first or b.last < a.first:
                    continue
                ea, eb = offsets[a.key] + a.nbytes, offsets[b.key] + b.nbytes
                assert ea <= offsets[b.key] or eb <= offsets[a.key], (a, b)
        peak = max(sum(b.nbytes for b in bufs if b.first <= t <= b.last) for t in range(16))
        assert total >= peak


def test_buffers_keep_off_recently_read_bytes_where_that_costs_no_workspace():
    # a is read last at call 2; c, written at call 3, would land on a's bytes at distance 0.
    bufs = [
        Lifetime("big", 4096, 0, 0),
        Lifetime("a", 1000, 1, 2),
        Lifetime("b", 1000, 2, 3),
        Lifetime("c", 1000, 3, 4),
    ]
    plain, plain_total = plan_memory(bufs, reuse_distance=0)
    assert plain["c"] == plain["a"]
    spaced, total = plan_memory(bufs, reuse_distance=2)
    assert total == plain_total
    ends = {k: spaced[k] + 1024 for k in spaced}
    assert ends["c"] <= spaced["a"] or ends["a"] <= spaced["c"]


def test_reuse_distance_never_grows_the_workspace():
    bufs = [Lifetime("a", 1000, 0, 1), Lifetime("b", 1000, 1, 2), Lifetime("c", 1000, 2, 3)]
    offsets, total = plan_memory(bufs, reuse_distance=2)
    assert total == 2 * 1024 and offsets["a"] == offsets["c"]
