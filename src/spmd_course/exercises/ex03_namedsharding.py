"""Exercises of notebook 03: bytes on the mesh, replica ids, and a sharding rule for a pytree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import NOT_ANSWERED, Exercise, answer_errors, plain


def _mesh_4x2() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))


# Exercise 1 ---------------------------------------------------------------------------------------------

def _measured_mesh_bytes() -> int:
    a = jax.device_put(np.zeros((512, 1024), jnp.bfloat16), NamedSharding(_mesh_4x2(), PartitionSpec(None, "model")))
    return sum(s.data.nbytes for s in a.addressable_shards)


def _check_mesh_bytes(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    array = 512 * 1024 * 2
    truth = _measured_mesh_bytes()
    assert truth == 4 * array  # the checker's own premise, measured
    if n == array:
        raise AssertionError(f"{n} bytes is the array once; but 'data' is not in the spec, so each block has copies")
    if n == truth // 8:
        raise AssertionError(f"{n} bytes is what one device holds; the question asks for all 8 together")
    if n == 2 * truth:  # 8 copies of 2-byte elements, or 4 copies of 4-byte ones: the same number
        raise AssertionError(
            f"{n} bytes is 8x the bfloat16 array: every device holding all of it (that would be P()), or 4-byte "
            "elements. Here each device holds only its half of the columns, and bfloat16 has 2 bytes"
        )
    assert n == truth, (
        f"{n} bytes is not it: each of the 8 devices holds its own (512, 512) block of 2-byte elements"
    )


mesh_bytes = Exercise(
    title="Exercise 1: bytes on the whole mesh",
    checker=_check_mesh_bytes,
    solution=4 * 512 * 1024 * 2,
    wrong=(512 * 1024 * 2, 512 * 512 * 2, 8 * 512 * 1024 * 2, 2 * 512 * 1024 * 2),
    hint="work out one device's block first (which dimension is split, over how many devices?), then add up all 8",
    explanation=(
        "Each device holds (512, 512) x 2 bytes = 512 KiB; 8 devices hold 4 MiB, 4x the 1 MiB array, "
        "because the 4 devices along 'data' (not in the spec) each keep a copy of every block."
    ),
)


# Exercise 2 ---------------------------------------------------------------------------------------------

def _mesh_rev() -> jax.sharding.Mesh:
    """The notebook's mesh_rev: the 8 devices in reverse id order, rows [7, 6], [5, 4], [3, 2], [1, 0]."""
    devices = sorted(jax.devices(), key=lambda d: d.id)[:8][::-1]
    return Mesh(np.array(devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def _first_replicas_truth() -> set[int]:
    a = jax.device_put(np.zeros((128, 512), np.float32), NamedSharding(_mesh_rev(), PartitionSpec("data", None)))
    return {s.device.id for s in a.addressable_shards if s.replica_id == 0}


def _check_first_replicas(ids: object) -> None:
    ids = plain(ids)  # Device objects become their ids
    assert isinstance(ids, frozenset | tuple), f"give a set of device ids such as {{0, 5}}; got {ids!r}"
    assert all(isinstance(i, int) and not isinstance(i, bool) for i in ids), f"device ids are integers; got {ids!r}"
    ids = set(ids)
    truth = _first_replicas_truth()
    if ids == {0, 2, 4, 6}:
        raise AssertionError(
            "{0, 2, 4, 6} is the lower device id of each pair; but copies are numbered in mesh order, not by "
            "device id: replica 0 of a block is the copy at 'model' index 0, in the mesh's left column"
        )
    if ids == {6, 7}:
        raise AssertionError(
            "devices 7 and 6 hold the same block (rows 0:32): they are its replicas 0 and 1. P('data', None) "
            "makes 4 row blocks, and each has a replica 0"
        )
    if ids == {7}:
        raise AssertionError("device 7 is replica 0 of rows 0:32; the other three row blocks have a replica 0 too")
    assert ids == truth, (
        f"{sorted(ids)} is not it: P('data', None) gives each mesh row one block; its copies are numbered "
        "0, 1 along 'model', in mesh order"
    )


first_replicas = Exercise(
    title="Exercise 2: which shards are replica 0",
    checker=_check_first_replicas,
    solution={1, 3, 5, 7},
    wrong=({0, 2, 4, 6}, {6, 7}, {7}, {0, 1}, {0, 1, 2, 3}),
    hint="each mesh row holds one block; which position along 'model' holds the first copy?",
    explanation=(
        "P('data', None) makes 4 row blocks, one per mesh row: devices 7 and 6 hold rows 0:32, 5 and 4 rows "
        "32:64, and so on. A block's copies are numbered along the axis the spec leaves out, 'model', in mesh "
        "order: replica 0 is the copy at 'model' index 0, the mesh's left column, devices 7, 5, 3, 1. Not the "
        "lower device id of each pair: copies follow mesh position, not device ids."
    ),
)


# Exercise 3 ---------------------------------------------------------------------------------------------

def _test_tree() -> dict:
    def z(shape):  # host arrays: the rule only looks at names and shapes
        return np.zeros(shape, np.float32)

    return {
        "embed": {"embedding": z((1000, 64))},
        "positions": {"embedding": z((64, 64))},  # 2-D with 64 rows like the kernels: only the name tells them apart
        "block": {
            "attn": {"kernel": z((64, 192)), "bias": z((192,))},
            "heads": {"kernel": z((64, 4, 16))},  # a 3-D kernel (DenseGeneral): not 2-D, so replicated
            "mlp": {"kernel": z((64, 256)), "bias": z((256,))},
            "out": {"kernel": z((256, 64)), "bias": z((64,))},  # the down-projection: 64 columns like the tables
            "norm": {"scale": z((64,))},
        },
        "head": {"kernel": z((64, 10)), "bias": z((10,))},
    }


def _check_kernel_rule(rule: object) -> None:
    assert callable(rule), f"give a function rule(path, leaf) that returns a PartitionSpec; got {rule!r}"
    mesh = _mesh_4x2()
    tree = _test_tree()
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    shardings = []
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path)
        with answer_errors(f"your rule, called as rule(path, leaf) for {name},"):
            spec = rule(path, leaf)
        assert spec is not NOT_ANSWERED, f"rule returned NOT_ANSWERED for {name}: write its body"
        if isinstance(spec, NamedSharding):  # accept a sharding too; only its spec is compared
            spec = spec.spec
        assert isinstance(spec, PartitionSpec), f"rule returned {spec!r} for {name}; return a PartitionSpec"
        assert len(spec) <= leaf.ndim, (
            f"{name} {tuple(leaf.shape)} has {leaf.ndim} dimension(s), but your rule gives it {spec} with "
            f"{len(spec)} entries: give at most one entry per dimension"
        )
        want = NamedSharding(mesh, _solution_rule(path, leaf))
        with answer_errors(f"{name}: NamedSharding(mesh, {spec}) on the mesh ('data', 'model')"):
            have = NamedSharding(mesh, spec)  # raises if the spec names an axis the mesh lacks, or one twice
        assert have.is_equivalent_to(want, leaf.ndim), (
            f"{name} {tuple(leaf.shape)}: your rule gives {spec}, expected {want.spec}"
        )
        shardings.append(have)
    placed = jax.device_put(tree, jax.tree.unflatten(treedef, shardings))
    assert placed["block"]["mlp"]["kernel"].sharding.shard_shape((64, 256)) == (64, 128)


def _solution_rule(path, leaf):
    if getattr(path[-1], "key", None) == "kernel" and leaf.ndim == 2:
        return PartitionSpec(None, "model")
    return PartitionSpec()


def _wrong_by_rank(path, leaf):  # forgets the name: shards the embedding table too
    return PartitionSpec(None, "model") if leaf.ndim == 2 else PartitionSpec()


def _wrong_first_dim(path, leaf):  # splits the input dimension instead of the last one
    return PartitionSpec("model", None) if leaf.ndim == 2 and path[-1].key == "kernel" else PartitionSpec()


def _wrong_shape0_threshold(path, leaf):  # notebook 03's online snippet: tests shape[0], splits shape[1]
    path_str = "/".join(str(p) for p in path)
    return PartitionSpec(None, "model") if "kernel" in path_str and leaf.shape[0] > 256 else PartitionSpec()


def _wrong_always(path, leaf):  # one spec for everything: breaks on 1-D leaves
    return PartitionSpec(None, "model")


def _wrong_rows_64(path, leaf):  # a shape test instead of the name: 64 rows is not what makes a kernel
    return PartitionSpec(None, "model") if leaf.ndim == 2 and leaf.shape[0] == 64 else PartitionSpec()


def _wrong_any_rank(path, leaf):  # the name without the rank: splits the 3-D kernel too
    return PartitionSpec(None, "model") if getattr(path[-1], "key", None) == "kernel" else PartitionSpec()


def _wrong_not_64_columns(path, leaf):  # a shape test: the tables have 64 columns, but so does a down-projection
    return PartitionSpec(None, "model") if leaf.ndim == 2 and leaf.shape[-1] != 64 else PartitionSpec()


def _wrong_wide_and_short(path, leaf):  # a shape test: "a non-square 2-D leaf with under 100 rows"
    wide = leaf.ndim == 2 and leaf.shape[0] != leaf.shape[1] and leaf.shape[0] < 100
    return PartitionSpec(None, "model") if wide else PartitionSpec()


kernel_rule = Exercise(
    title="Exercise 3: a sharding rule for tree_map_with_path",
    checker=_check_kernel_rule,
    solution=_solution_rule,
    wrong=(_wrong_by_rank, _wrong_first_dim, _wrong_shape0_threshold, _wrong_always, _wrong_rows_64, _wrong_any_rank,
           _wrong_not_64_columns, _wrong_wide_and_short),
    hint="the leaf's name is path[-1].key; test it and leaf.ndim, and return P(None, 'model') or P()",
    explanation=(
        "Kernels of shape (in, out) are split along 'out' over 'model'; the embedding tables are 2-D but not "
        "kernels, so the name test keeps them replicated along with biases and norms, and the rank test keeps "
        "the 3-D kernel whole."
    ),
)
