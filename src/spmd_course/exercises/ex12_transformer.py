"""Exercises of notebook 12: logical-axis rules, and what a strategy costs."""

from __future__ import annotations

import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from spmd_course.utils.exercises import Exercise, answer_errors, plain

NAMES = ("batch", "vocab", "embed", "heads", "mlp")

# Logical names of the notebook's arrays, and the spec each must get under FSDP x tensor on
# the (4, 2) mesh ('data', 'model').
_WANT = {
    "batch of tokens": (("batch", None), P("data", None)),
    "tokens/embedding": (("vocab", "embed"), P("model", "data")),
    "positions/embedding": ((None, "embed"), P(None, "data")),
    "attn/query/kernel": (("embed", "heads"), P("data", "model")),
    "attn/out/kernel": (("heads", "embed"), P("model", "data")),
    "mlp/up/kernel": (("embed", "mlp"), P("data", "model")),
    "mlp/down/kernel": (("mlp", "embed"), P("model", "data")),
    "head/kernel": (("embed", "vocab"), P("data", "model")),
    "norm/scale": (("embed",), P("data")),
}


def _specs(rules: tuple) -> dict[str, P]:
    """What nnx.get_partition_spec gives each annotated array with these rules in force."""
    with nnx.use_eager_sharding(False):
        tree = {key: nnx.Param(np.zeros((8,) * len(names), np.float32), out_sharding=names)
                for key, (names, _) in _WANT.items()}
    with nnx.logical_axis_rules(rules):
        specs = nnx.get_partition_spec(tree)
    return {key: var.get_value() for key, var in specs.items()}


def _canonical(spec: P) -> tuple:
    """A spec as a tuple with every entry written one way: None, an axis name, or a tuple of two or more."""
    entries = []
    for entry in spec:
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return tuple(entries)


def _check_rules(rules: object) -> None:
    rules = plain(rules)  # lists become tuples: a target of several axes may be written either way
    assert isinstance(rules, tuple), (
        f"give a tuple of (logical name, mesh axis or None) pairs; got {type(rules).__name__}")
    assert all(isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) for pair in rules), (
        "each rule is a pair such as ('embed', 'data') or ('embed', None)")
    twice = sorted({name for name, _ in rules if [n for n, _ in rules].count(name) > 1})
    assert not twice, (
        f"{twice} has more than one rule. The two readers of the table disagree on which counts: "
        "nnx.logical_axis_rules takes the last, flax.linen.logical_to_mesh_axes (used here for the batch) the "
        "first. Give each name one rule")
    for name, target in rules:
        ok = target is None or isinstance(target, str) or (
            isinstance(target, tuple) and all(isinstance(a, str) for a in target))
        assert ok, f"the rule for {name!r} maps it to {target!r}; give a mesh axis name such as 'data', or None"
    missing = [name for name in NAMES if name not in {pair[0] for pair in rules}]
    assert not missing, f"no rule for {missing}: NNX would pass the name through to the mesh, which has no such axis"
    axes = {a for _, target in rules for a in ((target,) if isinstance(target, str) else target or ())}
    assert axes <= {"data", "model"}, (
        f"the (4, 2) mesh has the axes 'data' and 'model'; your rules name {sorted(axes - {'data', 'model'})}")
    with answer_errors("nnx.get_partition_spec with your rules"):
        got = _specs(rules)
    for key, (names, want) in _WANT.items():
        assert _canonical(got[key]) == _canonical(want), (
            f"{key} {names} becomes {got[key]}, but FSDP x tensor wants {want}: 'embed' and 'batch' over "
            "'data', the rest over 'model'")


fsdp_tensor_rules = Exercise(
    title="Exercise 1: FSDP x tensor rules",
    checker=_check_rules,
    solution=(("batch", "data"), ("vocab", "model"), ("embed", "data"), ("heads", "model"), ("mlp", "model")),
    wrong=(
        (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"), ("mlp", "model")),  # plain 2-D
        (("batch", "fsdp"), ("vocab", None), ("embed", "fsdp"), ("heads", None), ("mlp", None)),  # 1-D FSDP
        (("batch", "model"), ("vocab", "data"), ("embed", "model"), ("heads", "data"), ("mlp", "data")),  # swapped
        (("batch", "data"), ("embed", "data"), ("heads", "model"), ("mlp", "model")),  # forgot 'vocab'
        (("batch", ("data", "model")), ("vocab", "model"), ("embed", "data"), ("heads", "model"),
         ("mlp", "model")),  # the batch over both axes: it is split over 'data' only
        (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"), ("mlp", "model"),
         ("embed", "data")),  # the 2-D table with a second 'embed' rule appended: NNX and linen read it differently
    ),
    hint="start from the 2-D table and change one rule: which logical name does FSDP split?",
    explanation=(
        "Only 'embed' changes from the 2-D table, and every parameter has an 'embed' dimension, so every "
        "parameter is now split over 'data'. The matrices that also have a 'vocab', 'heads' or 'mlp' "
        "dimension are split 8 ways: 'data' along 'embed', 'model' along the other. The layer norms and the "
        "position table have only 'embed': they are split 4 ways, over 'data', and repeated along 'model'."
    ),
)


def _fsdp_bytes(d_ff: int) -> int:
    d, layers, vocab, seq = 64, 1, 32, 16
    n_params = layers * (4 * d * d + 2 * d * d_ff) + 2 * vocab * d + (2 * layers + 1) * 2 * d + seq * d
    return 12 * n_params // 8 + 8


def _check_fsdp_bytes(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    want = _fsdp_bytes(512)
    n_params = (want - 8) * 8 // 12
    assert n != _fsdp_bytes(256), "that is the size with D_FF = 256, the notebook's; redo the count with 512"
    assert n != 4 * n_params // 8 + 8, "that counts the parameters only: Adam keeps two more arrays of the same size"
    assert n != 12 * n_params + 8, "that is what every device holds under data parallel: FSDP splits it 8 ways"
    assert n != want - 8, "almost: add the 8 bytes of step counters, which every device keeps whole"
    assert n == want, (
        f"{n} is not it: count the parameters with D_FF = 512 (the two MLP matrices grow), "
        "times 3 arrays (parameters, Adam's mu and nu) x 4 bytes, divided by 8 devices, plus 8"
    )


fsdp_bytes = Exercise(
    title="Exercise 2: FSDP bytes per device",
    checker=_check_fsdp_bytes,
    solution=_fsdp_bytes(512),
    wrong=(_fsdp_bytes(256), _fsdp_bytes(512) - 8, 4 * 87_424 // 8 + 8, 12 * 87_424 + 8, 131_136.0),
    hint="only the MLP matrices change (2 matrices of 64 x D_FF in the one block); then 12 bytes per parameter / 8 + 8",
    explanation=(
        "87,424 parameters (32,768 more than with D_FF = 256) x 12 bytes / 8 devices + 8 = 131,144 bytes: "
        "FSDP divides everything by 8, because every parameter has an 'embed' dimension."
    ),
)


def _check_residual(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, f"give a pair (group_size, bytes); got {answer!r}"
    group, nbytes = answer
    assert group == 4, (
        f"group size {group}: the residual stream is summed over the 'model' axis, which now has 4 devices")
    assert nbytes != 32 * 16 * 64 * 4, "that is the full batch: 'batch' is still split over 'data'"
    assert nbytes != 8 * 16 * 64 * 4, "that is 32/4 rows, the (4, 2) mesh's share: 'data' has 2 devices now"
    assert nbytes == 16 * 16 * 64 * 4, (
        f"{nbytes} bytes is not it: rows = 32 / (size of 'data'), times 16 positions x 64 x 4 bytes")


residual_allreduce = Exercise(
    title="Exercise 3: the residual all-reduce on a (2, 4) mesh",
    checker=_check_residual,
    solution=(4, 16 * 16 * 64 * 4),
    wrong=((2, 8 * 16 * 64 * 4), (4, 32 * 16 * 64 * 4), (2, 16 * 16 * 64 * 4), (4, 8 * 16 * 64 * 4)),
    hint="the sum runs over the 'model' axis; each device holds the rows of the batch that its 'data' index owns",
    explanation=(
        "(4, 65,536): each partial residual stream, f32[32@data,16,64]{U:model}, is summed by the 4 devices of "
        "the 'model' axis, and each holds 32 / 2 = 16 rows of 16 x 64 float32 = 64 KiB. A wider model axis "
        "means bigger groups and more rows per device."
    ),
)
