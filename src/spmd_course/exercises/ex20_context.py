"""Exercises of notebook 20: context parallelism (ring attention, the zig-zag layout, the online softmax)."""

from __future__ import annotations

import numpy as np

from spmd_course.utils.exercises import Exercise, answer_errors, plain

# Exercise 1: keys and values of one layer, 8 heads of 128 in bf16, 131,072 tokens, a context axis of 8.
_WHOLE = 2 * 131072 * 8 * 128 * 2  # keys and values, 2 bytes each: 512 MiB
_BLOCK = _WHOLE // 8  # one device's share: 64 MiB


def _check_kv_bytes(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, (
        f"give a pair (bytes of one ring block, bytes after the all-gather); got {answer!r}"
    )
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in answer), (
        f"give whole numbers of bytes; got {answer!r}"
    )
    block, whole = answer
    assert (block, whole) != (_WHOLE, _BLOCK), "swapped: the all-gather is the one that holds every token"
    assert (block, whole) != (_BLOCK // 2, _WHOLE // 2), "keys *and* values: two arrays, not one"
    assert (block, whole) != (2 * _BLOCK, 2 * _WHOLE), "bf16 is 2 bytes per element, not 4"
    assert whole == _WHOLE, (
        f"all-gathered: {whole} is not it. Every device holds all 131,072 tokens' keys and values: "
        "2 arrays x 131,072 x 8 x 128 elements of 2 bytes"
    )
    assert block == _BLOCK, (
        f"one ring block: {block} is not it. A block is one device's share of the sequence, 131,072 / 8 tokens, "
        "of keys and values"
    )


kv_bytes = Exercise(
    title="Exercise 1: a ring block against the gathered keys and values",
    checker=_check_kv_bytes,
    solution=(_BLOCK, _WHOLE),
    wrong=((_WHOLE, _BLOCK), (_BLOCK // 2, _WHOLE // 2), (2 * _BLOCK, 2 * _WHOLE), (_BLOCK, _BLOCK),
           (_WHOLE // 64, _WHOLE)),
    hint="keys and values are 2 arrays of tokens x 8 x 128 elements, 2 bytes each; a block has 1/8 of the tokens",
    explanation=(
        "64 MiB against 512 MiB. The ring holds its own block and the one arriving (128 MiB), whatever the "
        "sequence length per device; the all-gather's 512 MiB grows with the whole sequence."
    ),
)


# Exercise 2: a balanced assignment of 2n chunks to n devices under a causal mask.
def _visible_work(pair: tuple[int, int], n: int) -> int:
    """Chunk pairs (query chunk, key chunk) a device's two query chunks see: chunk c sees chunks 0..c."""
    return sum(c + 1 for c in pair)


def _check_chunks(answer: object) -> None:
    assert callable(answer), f"give a function chunks_of(n); got {answer!r}"
    for n in (2, 4, 8, 16):
        with answer_errors(f"chunks_of({n})"):
            got = plain(answer(n))
        assert isinstance(got, list | tuple) and len(got) == n, (
            f"chunks_of({n}) must give {n} pairs, one per device; got {got!r}"
        )
        pairs = []
        for d, pair in enumerate(got):
            pair = plain(pair)
            assert isinstance(pair, list | tuple) and len(pair) == 2 and all(
                isinstance(c, int) and not isinstance(c, bool) for c in pair), (
                f"chunks_of({n})[{d}] must be a pair of chunk indices; got {pair!r}"
            )
            pairs.append(tuple(pair))
        held = sorted(c for pair in pairs for c in pair)
        assert held == list(range(2 * n)), (
            f"chunks_of({n}): every chunk 0..{2 * n - 1} must be held by exactly one device; the devices hold {held}"
        )
        work = [_visible_work(pair, n) for pair in pairs]
        assert len(set(work)) == 1, (
            f"chunks_of({n}) = {pairs}: under a causal mask chunk c sees chunks 0..c, so the devices see "
            f"{work} chunk pairs: not the same work. Pair a chunk from the front with one from the back"
        )


def _solution_chunks(n):
    return [(d, 2 * n - 1 - d) for d in range(n)]


balanced_chunks = Exercise(
    title="Exercise 2: the zig-zag layout",
    checker=_check_chunks,
    solution=_solution_chunks,
    wrong=(
        lambda n: [(2 * d, 2 * d + 1) for d in range(n)],  # contiguous
        lambda n: [(d, d + n) for d in range(n)],  # striped: not mirrored
        lambda n: [(d, d) for d in range(n)],  # a chunk twice
        lambda n: [(d, 2 * n - 1 - d) for d in range(n - 1)],  # one device short
        lambda n: [(d, 2 * n - d) for d in range(n)],  # off by one: chunk 2n does not exist
    ),
    hint="chunk c sees c + 1 chunks (itself and those before it); give each device a pair whose sizes add up "
    "to the same total",
    explanation=(
        "Chunks d and 2n - 1 - d (or any pairs summing to 2n - 1): every device sees 2n + 1 chunk pairs, so the "
        "lockstep ring never waits for one busy device."
    ),
)


# Exercise 3: merge two partial softmax results (m, total, acc) over disjoint key sets.
def _partial(scores: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = scores.max(-1)
    p = np.exp(scores - m[:, None])
    return m, p.sum(-1), p @ values


def _check_merge(answer: object) -> None:
    assert callable(answer), f"give a function merge(a, b); got {answer!r}"
    rng = np.random.default_rng(7)
    for shift in (0.0, 30.0, -30.0):  # the second half's scores far larger, or far smaller
        scores = rng.standard_normal((5, 12))
        scores[:, 6:] += shift
        values = rng.standard_normal((12, 3))
        a, b = _partial(scores[:, :6], values[:6]), _partial(scores[:, 6:], values[6:])
        with answer_errors("merge(a, b)"):
            got = answer(a, b)
        assert isinstance(got, tuple | list) and len(got) == 3, (
            f"merge(a, b) must return the triple (m, total, acc); got {type(got).__name__}"
        )
        m, total, acc = (np.asarray(x, dtype=float) for x in got)
        assert m.shape == (5,) and total.shape == (5,) and acc.shape == (5, 3), (
            f"merge returned shapes {m.shape}, {total.shape}, {acc.shape}; expected (5,), (5,), (5, 3), like its "
            "inputs"
        )
        want = _partial(scores, values)
        exact = np.exp(scores - scores.max(-1, keepdims=True))
        exact = exact / exact.sum(-1, keepdims=True) @ values
        assert np.allclose(m, want[0]), "m must be the largest score over both halves"
        assert np.allclose(acc / total[:, None], exact, rtol=1e-6, atol=1e-9), (
            f"acc / total is not the attention over all 12 keys (second half's scores shifted by {shift:+g}): "
            "rescale each half's total and acc from its own maximum to the common one"
        )
        assert np.allclose(total, want[1]) and np.allclose(acc, want[2]), (
            "acc / total is right, but total and acc must be measured against the common maximum m, as the notebook's "
            "running state is, so that a third block can be merged in"
        )


def _solution_merge(a, b):
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    m = np.maximum(m1, m2)
    r1, r2 = np.exp(m1 - m), np.exp(m2 - m)
    return m, l1 * r1 + l2 * r2, acc1 * r1[:, None] + acc2 * r2[:, None]


def _merge_no_rescale(a, b):
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    return np.maximum(m1, m2), l1 + l2, acc1 + acc2


def _merge_rescale_sums_only(a, b):
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    m = np.maximum(m1, m2)
    return m, l1 * np.exp(m1 - m) + l2 * np.exp(m2 - m), acc1 + acc2


def _merge_normalized(a, b):  # right ratio, but total and acc against another reference than the common maximum
    m, total, acc = _solution_merge(a, b)
    return m, total / total, acc / total[:, None]


merge_partials = Exercise(
    title="Exercise 3: the online softmax's merge",
    checker=_check_merge,
    solution=_solution_merge,
    wrong=(_merge_no_rescale, _merge_rescale_sums_only, _merge_normalized,
           lambda a, b: a, lambda a, b: (np.minimum(a[0], b[0]), *_solution_merge(a, b)[1:])),
    hint="take m = max(m1, m2); each half's total and acc were summed against its own maximum, so multiply them by "
    "exp(m_half - m) before adding",
    explanation=(
        "The merge is associative and commutative, so ring attention may take the blocks in any order, and the "
        "same merge tiles the keys inside one device."
    ),
)
