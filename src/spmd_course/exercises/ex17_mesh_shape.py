"""Exercises of notebook 17: reading and choosing a mesh shape and a layout."""

from __future__ import annotations

from spmd_course.utils.exercises import Exercise, answer_errors, plain

# Notebook 17's model: d_model 512, one block, d_ff 2048, vocabulary 512, sequences of 32.
N_SPLIT = 1 * (4 * 512**2 + 2 * 512 * 2048) + 2 * 512 * 512  # matrices with 'heads', 'mlp' or 'vocab'
N_EMBED_ONLY = 3 * 2 * 512 + 32 * 512  # layer norms and the position table
SHAPES = [(64, 1), (32, 2), (16, 4), (8, 8), (1, 64)]


def _is_whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _two_d(data: int, model: int) -> int:
    return 12 * (N_SPLIT // model + N_EMBED_ONLY) + 8


def _fsdp_tp(data: int, model: int) -> int:
    return 12 * (N_SPLIT // (data * model) + N_EMBED_ONLY // data) + 8


def _check_state_bytes(answer: object) -> None:
    answer = plain(answer)  # 12 * (n_split / 16 + n_embed_only) + 8 is a whole float: that is fine
    assert isinstance(answer, tuple) and len(answer) == 2, (
        f"give a pair (bytes under 2-D, bytes under FSDP x TP); got {answer!r}")
    two_d, fsdp_tp = answer
    assert _is_whole(two_d) and _is_whole(fsdp_tp), f"give two whole numbers of bytes; got {answer!r}"
    if (two_d, fsdp_tp) == (_fsdp_tp(4, 16), _two_d(4, 16)):
        raise AssertionError("the two are swapped: FSDP x TP, which splits 'embed' too, holds less")
    assert two_d != _two_d(16, 4), "that divides by 4, the data axis: under the 2-D table 'data' repeats the state"
    assert two_d != 12 * (N_SPLIT + N_EMBED_ONLY) // 16 + 8, (
        "the layer norms and the position table have only 'embed', which the 2-D table never splits")
    assert two_d != 4 * (N_SPLIT // 16 + N_EMBED_ONLY) + 8, "that is the parameters only: Adam adds two moments"
    assert two_d == _two_d(4, 16), (
        f"2-D: {two_d} is not it: 12 bytes x (n_split / 16 + n_embed_only) + 8, with the model axis = 16")
    assert fsdp_tp != 12 * (N_SPLIT // 64 + N_EMBED_ONLY) + 8, (
        "the 'embed'-only parameters are split over 'data' (4 ways) under FSDP x TP")
    assert fsdp_tp != 12 * (N_SPLIT + N_EMBED_ONLY) // 64 + 8, (
        "the 'embed'-only parameters have no 'model' dimension: they are split 4 ways, not 64")
    assert fsdp_tp == _fsdp_tp(4, 16), (
        f"FSDP x TP: {fsdp_tp} is not it: 12 x (n_split / 64 + n_embed_only / 4) + 8 (the matrices over both "
        "axes, the rest over 'data')")


state_bytes = Exercise(
    title="Exercise 1: the state on a (4, 16) mesh",
    checker=_check_state_bytes,
    solution=(_two_d(4, 16), _fsdp_tp(4, 16)),
    wrong=(
        (_fsdp_tp(4, 16), _two_d(4, 16)),  # swapped
        (_two_d(16, 4), _fsdp_tp(4, 16)),  # 2-D divided by the data axis (4)
        (_two_d(4, 16), 12 * (N_SPLIT // 64 + N_EMBED_ONLY) + 8),  # FSDP x TP, 'embed'-only left whole
        (_two_d(4, 16), 12 * (N_SPLIT + N_EMBED_ONLY) // 64 + 8),  # everything / 64
        (4 * (N_SPLIT // 16 + N_EMBED_ONLY) + 8, _fsdp_tp(4, 16)),  # parameters only
    ),
    hint="2-D: only 'model' (16) divides, and only the matrices; FSDP x TP: the matrices by 64, the rest by 4",
    explanation=(
        f"2-D: 12 x (3,670,016 / 16 + 19,456) + 8 = {_two_d(4, 16):,} bytes, whatever the data axis; "
        f"FSDP x TP: 12 x (3,670,016 / 64 + 19,456 / 4) + 8 = {_fsdp_tp(4, 16):,} bytes, 1/4 of the matrices' "
        "2-D share and 1/4 of the rest."
    ),
)


# Tables of (footprint bytes, collectives per step) the checker tries a learner's choose() on, with the
# budget and the layout a correct choice returns. They are the checker's own: its verdict never depends on
# the footprints this machine's compiler happened to measure.
_CASES = (
    ({"data": (70, 1), "2-D": (14, 9), "tensor": (59, 10), "FSDP": (27, 21), "FSDP x TP": (9, 30)}, 16, "2-D"),
    ({"data": (70, 1), "2-D": (14, 9), "tensor": (59, 10), "FSDP": (27, 21), "FSDP x TP": (9, 30)}, 10,
     "FSDP x TP"),
    ({"data": (70, 1), "2-D": (14, 9), "tensor": (59, 10), "FSDP": (27, 21), "FSDP x TP": (9, 30)}, 100, "data"),
    ({"data": (70, 1), "2-D": (14, 9), "tensor": (59, 10), "FSDP": (27, 21), "FSDP x TP": (9, 30)}, 8, None),
    ({"a": (20, 5), "b": (12, 5), "c": (30, 1)}, 25, "b"),  # a tie on collectives: the smaller footprint
    ({"a": (16, 3), "b": (10, 4)}, 16, "a"),  # a footprint equal to the budget fits
    ({"only": (5, 7)}, 5, "only"),
)


def _check_choose(choose: object) -> None:
    assert callable(choose), f"give your function choose (without calling it); got {type(choose).__name__}"
    for table, budget, want in _CASES:
        with answer_errors(f"choose({table}, {budget})"):
            got = choose(dict(table), budget)
        if want is not None and got != want and table[want][0] == budget:
            raise AssertionError(f"choose({table}, {budget}) returned {got!r}, but {want!r} fits: its footprint "
                                 "equals the budget, and 'at most the budget' includes it")
        if want is None:
            assert got is None, f"choose({table}, {budget}) returned {got!r}; nothing fits, so it should return None"
            continue
        assert got is not None, f"choose({table}, {budget}) returned None, but {want!r} fits"
        assert isinstance(got, str), f"return the layout's name, such as {want!r}; got {got!r}"
        assert got in table, f"choose returned {got!r}, which is not in the table"
        assert table[got][0] <= budget, (
            f"choose({table}, {budget}) returned {got!r}, whose footprint {table[got][0]} is over the budget")
        fits = [name for name, (size, _) in table.items() if size <= budget]
        fewest = min(table[name][1] for name in fits)
        assert table[got][1] == fewest, (
            f"choose({table}, {budget}) returned {got!r} with {table[got][1]} collectives; among the layouts "
            f"that fit, one needs only {fewest}")
        assert got == want, (
            f"choose({table}, {budget}) returned {got!r}; on a tie in collectives take the smaller footprint")


def _choose(table, budget):
    fits = [name for name, (size, _) in table.items() if size <= budget]
    return min(fits, key=lambda name: (table[name][1], table[name][0])) if fits else None


choose_layout = Exercise(
    title="Exercise 2: choose a layout",
    checker=_check_choose,
    solution=_choose,
    wrong=(
        lambda table, budget: min(table, key=lambda name: table[name][0]),  # the smallest footprint, always
        lambda table, budget: min(table, key=lambda name: table[name][1]),  # fewest collectives, ignoring memory
        lambda table, budget: min((n for n in table if table[n][0] < budget),
                                  key=lambda n: (table[n][1], table[n][0]), default=None),  # strictly under
        lambda table, budget: min((n for n in table if table[n][0] <= budget), key=lambda n: table[n][1]),  # no None
        lambda table, budget: min((n for n in table if table[n][0] <= budget), key=lambda n: table[n][1],
                                  default=None),  # no tie-break
    ),
    hint="keep the layouts whose footprint is at most the budget; of those, the fewest collectives, then the "
         "smaller footprint; None if none is left",
    explanation=(
        "Memory decides first: a layout that does not fit cannot run. Among those that fit, fewer collectives "
        "(and then less memory) is the better bet. Run it on section 3's table with a few "
        "budgets to see the answer change."
    ),
)


def _check_divisibility(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, (
        f"give two lists of shapes, (lowers, whole_heads); got {answer!r}")
    for label, part in zip(("lowers", "whole heads"), answer, strict=True):
        assert isinstance(part, tuple | frozenset) and all(
            isinstance(s, tuple) and len(s) == 2 and all(_is_whole(v) for v in s) for s in part
        ), f"{label}: give a list of mesh shapes such as [(32, 2), (16, 4)]; got {part!r}"
    lowers, whole = (set(part) for part in answer)
    want_lowers = {(d, m) for d, m in SHAPES if 96 % d == 0}
    want_whole = {(d, m) for d, m in want_lowers if 16 % m == 0}
    assert lowers == want_lowers, (
        f"lowers: {sorted(lowers)}. The batch of 96 must divide into 'data' blocks: 96 / d must be whole")
    assert whole == want_whole, (
        f"whole heads: {sorted(whole)}. A device holds whole heads when 'model' divides the 16 heads "
        "(and the shape lowers at all)")


divisibility = Exercise(
    title="Exercise 3: 16 heads, a batch of 96",
    checker=_check_divisibility,
    solution=([(32, 2), (16, 4), (8, 8), (1, 64)], [(32, 2), (16, 4), (8, 8)]),
    wrong=(
        (SHAPES, [(64, 1), (32, 2), (16, 4), (8, 8)]),  # forgot the batch
        ([(32, 2), (16, 4), (8, 8), (1, 64)], [(32, 2), (16, 4), (8, 8), (1, 64)]),  # 64 splits 16 heads
        ([(32, 2), (16, 4), (8, 8)], [(32, 2), (16, 4), (8, 8)]),  # (1, 64) lowers: 96 / 1 is whole
    ),
    hint="the batch constrains 'data' (96 / d whole); the heads constrain 'model' (16 / m whole)",
    explanation=(
        "96 is not divisible by 64, so (64, 1) raises IndivisibleError; the other four lower. Of those, (1, 64) "
        "splits each of the 16 heads over 4 devices (extra score all-reduces, no error); the rest keep whole heads."
    ),
)
