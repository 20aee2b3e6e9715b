"""Exercises of notebook 07: data parallelism."""

from __future__ import annotations

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain


def _data_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))


def _shard_shape(mesh: jax.sharding.Mesh, spec: PartitionSpec, shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    """The block of `shape` each device holds under `spec`; an AssertionError that says why if it cannot."""
    assert len(spec) <= len(shape), f"{spec} has {len(spec)} entries, but {what} has only {len(shape)} dimensions"
    with answer_errors(f"{spec}, laying out {what} {shape} on the mesh {dict(mesh.shape)},"):
        return NamedSharding(mesh, spec).shard_shape(shape)  # unknown axis, an axis used twice, uneven sizes


def _check_dp_specs(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, (
        f"give a pair (batch spec, parameter spec) such as (P(...), P(...)); got {answer!r}"
    )
    batch_spec, param_spec = answer
    for name, spec in (("batch spec", batch_spec), ("parameter spec", param_spec)):
        assert isinstance(spec, PartitionSpec), f"the {name} must be a PartitionSpec; got {type(spec).__name__}"
    mesh = _data_mesh()
    batch_block = _shard_shape(mesh, batch_spec, (64, 64), "the batch x")
    assert batch_block == (8, 64), (
        f"{batch_spec} gives each device a {batch_block} block of x; data parallelism splits "
        "the examples (dimension 0) and keeps every feature: (8, 64)"
    )
    param_block = _shard_shape(mesh, param_spec, (64, 256), "the kernel")
    assert param_block == (64, 256), (
        f"{param_spec} splits the kernel into {param_block} blocks; in data parallelism every "
        "device holds the whole model"
    )


dp_specs = Exercise(
    title="Exercise 1: the two specs of data parallelism",
    checker=_check_dp_specs,
    solution=(PartitionSpec("data"), PartitionSpec()),
    wrong=(
        (PartitionSpec(None, "data"), PartitionSpec()),  # splits the features, not the examples
        (PartitionSpec("data"), PartitionSpec("data")),  # shards the parameters too (that is FSDP, notebook 10)
        (PartitionSpec(), PartitionSpec()),  # nothing split: every device computes the whole batch
        ("data", None),
        (PartitionSpec("model"), PartitionSpec()),  # an axis this mesh does not have
        (PartitionSpec("data", "data"), PartitionSpec()),  # one mesh axis used for two dimensions
    ),
    hint="the batch is split along its first dimension; a parameter is copied whole to every device",
    explanation=(
        "P('data') (or P('data', None)) gives each device 8 of the 64 examples; P() replicates each parameter. "
        "The compiler then adds the gradient all-reduce by itself."
    ),
)


_WIDER_GRAD_BYTES = (64 * 512 + 512 + 512 * 10 + 10) * 4  # 153,640


def _check_wider_allreduce_bytes(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    assert n != _WIDER_GRAD_BYTES + 4, "that includes the 4-byte loss; the question asks for the gradient bytes only"
    assert n != _WIDER_GRAD_BYTES // 8, (
        "each device does not reduce 1/8 of the gradient: every device needs the whole summed gradient, "
        "because every device holds the whole model"
    )
    assert n != (64 * 512 + 512 * 10) * 4, "you left out the biases: they have gradients too"
    assert n != 2 * 7 * _WIDER_GRAD_BYTES // 8, (
        "that is the ring estimate of what each device sends, 2(N-1)/N x the result; the question asks for the "
        "bytes the all-reduce produces"
    )
    assert n != 2 * _WIDER_GRAD_BYTES, "one gradient per parameter, not two: Adam's moments are not all-reduced"
    assert n == _WIDER_GRAD_BYTES, (
        f"{n} bytes is not it: the all-reduce carries one gradient per parameter, so count the parameters of "
        "both layers (kernels and biases) and multiply by 4 bytes"
    )


wider_allreduce_bytes = Exercise(
    title="Exercise 2: the all-reduce of a wider model",
    checker=_check_wider_allreduce_bytes,
    solution=_WIDER_GRAD_BYTES,
    wrong=(_WIDER_GRAD_BYTES + 4, _WIDER_GRAD_BYTES // 8, (64 * 512 + 512 * 10) * 4, 76_840,
           2 * 7 * _WIDER_GRAD_BYTES // 8, 2 * _WIDER_GRAD_BYTES),
    hint="the all-reduce carries the gradient of every parameter: kernels (in x out) and biases (out), 4 bytes each",
    explanation=(
        "(64*512 + 512 + 512*10 + 10) x 4 = 153,640 bytes: twice the hidden width, about twice the all-reduce. "
        "The batch and the device count do not enter."
    ),
)


def _check_sixteen_devices(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, f"give a pair (global batch, bytes); got {answer!r}"
    global_batch, nbytes = answer
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in answer), (
        f"give two whole numbers (global batch, bytes); got {answer!r}"
    )
    assert global_batch == 16 * 8, (
        f"global batch {global_batch!r} is not it: with the per-device batch fixed at 8, the global batch is "
        "8 x the number of devices"
    )
    assert nbytes != 76_840, "almost: the train step's all-reduce also carries the 4-byte loss"
    assert nbytes == 76_840 + 4, (
        f"{nbytes!r} bytes is not it: the all-reduce carries the gradients of all parameters (76,840 bytes) "
        "and the loss, however many devices there are"
    )


sixteen_devices = Exercise(
    title="Exercise 3: sixteen devices",
    checker=_check_sixteen_devices,
    solution=(128, 76_844),
    wrong=((64, 76_844), (128, 2 * 76_844), (128, 76_840), (128, 76_844 // 16)),
    hint="the per-device batch stays 8; the all-reduce follows the model, not the batch",
    explanation=(
        "128 examples per step, and the same 76,844-byte all-reduce as on 2, 4 or 8 devices. What grows slowly "
        "is the ring-formula estimate of what each device sends, 2(N-1)/N x 76,844 bytes: 1.75x on 8 devices, "
        "1.875x on 16."
    ),
)
