"""Exercises of notebook 11: the FSDP step's gradient traffic, and the step written by hand in shard_map."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain
from spmd_course.utils.inspecting import collectives

_N = 8  # devices on the 'fsdp' axis


_RS = (_N - 1) * 8 * 256 * 4  # 57,344
_AR = 2 * (_N - 1) * 64 * 256 * 4 // _N  # 114,688


def _check_gradient_traffic(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, f"give a pair (reduce-scatter, all-reduce); got {answer!r}"
    rs, ar = answer
    assert (rs, ar) != (_AR, _RS), "swapped: the reduce-scatter is the cheaper one"
    assert rs == _RS, (
        f"reduce-scatter: {rs!r} is not it. Each device ends with a (8, 256) block; in a ring it sends N-1 = 7 "
        "blocks of that size"
    )
    assert ar == _AR, (
        f"all-reduce: {ar!r} is not it. A ring all-reduce is a reduce-scatter followed by an all-gather: "
        "2(N-1)/N times the (64, 256) result"
    )


gradient_traffic = Exercise(
    title="Exercise 1: reduce-scatter against all-reduce",
    checker=_check_gradient_traffic,
    solution=(_RS, _AR),
    wrong=((_AR, _RS), (65_536, 65_536), (8 * 256 * 4, 64 * 256 * 4), (_RS, _RS), (2 * _RS, 2 * _AR)),
    hint="ring-formula estimates: a reduce-scatter sends (N-1) x its result, an all-reduce 2(N-1)/N x its result; "
    "the results are (8, 256) and (64, 256) float32",
    explanation=(
        "57,344 against 114,688 bytes (56 and 112 KiB): f32[64,256]{U:fsdp} -> reduce-scatter -> f32[64@fsdp,256] "
        "is half of an all-reduce (a reduce-scatter plus an all-gather), so keeping only a slice of an "
        "all-reduce's result wastes the all-gather half."
    ),
)


# Exercise 2: FSDP by hand in shard_map, for notebook 10's model (64 -> 256 -> 10, a batch of 64 examples).
_SIZES = {"linear1": (64, 256), "linear2": (256, 10)}
_KERNEL_SHAPES = tuple(_SIZES.values())


def _mlp_loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """The MLP's mean cross-entropy over the examples it is given (whole parameters)."""
    h = jax.nn.relu(x @ params["linear1"]["kernel"] + params["linear1"]["bias"])
    logits = h @ params["linear2"]["kernel"] + params["linear2"]["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _fsdp_inputs() -> tuple[dict, jax.Array, jax.Array]:
    """Parameters, 64 examples and their labels: small, fixed numbers (the checker's own, not the notebook's)."""
    rng = np.random.default_rng(10)
    params = {name: {"kernel": jnp.asarray(rng.normal(size=shape, scale=shape[0] ** -0.5), jnp.float32),
                     "bias": jnp.asarray(rng.normal(size=shape[1], scale=0.1), jnp.float32)}
              for name, shape in _SIZES.items()}
    x = jnp.asarray(rng.normal(size=(64, 64)), jnp.float32)
    return params, x, jnp.asarray(rng.integers(0, 10, size=64), jnp.int32)


def _rtol() -> float:
    """1e-4 on CPU; accelerators multiply float32 at lower precision by default (TF32, bf16 passes)."""
    return 1e-4 if jax.default_backend() == "cpu" else 1e-2


def _check_fsdp_by_hand(step: object) -> None:
    assert callable(step), f"give a function fsdp_loss_and_grads(params, x, y); got {step!r}"
    n = _N
    assert len(jax.devices()) >= n, f"this exercise needs {n} devices; run the notebook's setup cell first"
    mesh = jax.make_mesh((n,), ("fsdp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
    specs = {name: {"kernel": PartitionSpec("fsdp", None), "bias": PartitionSpec()} for name in _SIZES}
    params, x, y = _fsdp_inputs()
    sharded = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    rows = NamedSharding(mesh, PartitionSpec("fsdp"))
    x_rows, y_rows = jax.device_put(x, rows), jax.device_put(y, rows)
    per_device = jax.shard_map(step, mesh=mesh, in_specs=(specs, PartitionSpec("fsdp"), PartitionSpec("fsdp")),
                               out_specs=(PartitionSpec(), specs))
    with answer_errors("your function, run by jax.shard_map on 8 devices (params: each kernel's block of rows, "
                       "the biases whole; x and y: the device's 8 examples),"):
        compiled = jax.jit(per_device).lower(sharded, x_rows, y_rows).compile()
        loss, grads = compiled(sharded, x_rows, y_rows)
    want_loss, want = jax.jit(jax.value_and_grad(_mlp_loss))(params, x, y)
    assert jax.tree.structure(grads) == jax.tree.structure(want), (
        f"return (loss, grads) with grads shaped like params ({{'linear1': {{'kernel', 'bias'}}, 'linear2': ...}}); "
        f"got {jax.tree.structure(grads)}"
    )
    for name in _SIZES:
        for part in ("kernel", "bias"):
            got, ref = np.asarray(grads[name][part]), np.asarray(want[name][part])
            own = (ref.shape[0] // n, ref.shape[1]) if part == "kernel" else ref.shape
            assert got.shape == ref.shape, (
                f"{name}/{part}: the gradients put together from all devices have shape {got.shape}, not "
                f"{ref.shape}: return each device's own {own} block of the summed gradient"
            )
            scale = float(np.vdot(got, ref) / np.vdot(ref, ref))
            assert np.allclose(got, ref, rtol=_rtol(), atol=_rtol() / 10 * np.abs(ref).max()), (
                f"{name}/{part}: the gradient is {scale:.3g} times the full-batch gradient"
                if (abs(scale - round(scale)) < 0.01 and round(scale) not in (0, 1)) or abs(scale * n - 1) < 0.01
                else f"{name}/{part}: the gradient differs from the full-batch gradient (largest error "
                f"{np.abs(got - ref).max():.3g})"
            )
    assert np.allclose(float(loss), float(want_loss), rtol=_rtol()), (
        f"the loss is {float(loss):.5g}, but the mean over all 64 examples is {float(want_loss):.5g}"
    )
    ops = collectives(compiled).ops
    gathered = {shape for op in ops if op.kind == "all-gather" for shape in op.shapes}
    summed_whole = {shape for op in ops if op.kind == "all-reduce" for shape in op.shapes} & set(_KERNEL_SHAPES)
    scattered = {shape for op in ops if op.kind == "reduce-scatter" for shape in op.shapes}
    assert not summed_whole, (
        f"the values are right, but the program all-reduces whole kernel gradients {sorted(summed_whole)}: every "
        "device receives the whole sum, 2(N-1)/N of the kernel, and then keeps 1/N of it. FSDP's gradient sum "
        "is a reduce-scatter, which sends half as much"
    )
    missing = [shape for shape in _KERNEL_SHAPES if shape not in gathered]
    assert not missing, f"the program never gathers the kernels {missing} whole; FSDP computes with whole weights"
    blocks = [(rows // n, cols) for rows, cols in _KERNEL_SHAPES]
    assert all(block in scattered for block in blocks), (
        f"the program has no reduce-scatter to the kernel blocks {blocks}; found reduce-scatters to "
        f"{sorted(scattered)}"
    )


def _solution_fsdp_by_hand(params, x, y):
    # 1. all-gather: each kernel whole, from every device's block of rows (the biases are whole already)
    whole = {name: {"kernel": jax.lax.all_gather(layer["kernel"], "fsdp", axis=0, tiled=True),
                    "bias": layer["bias"]} for name, layer in params.items()}

    # 2. compute: the loss of all 64 examples is the mean of the 8 devices' losses
    def loss_fn(whole):
        h = jax.nn.relu(x @ whole["linear1"]["kernel"] + whole["linear1"]["bias"])
        logits = h @ whole["linear2"]["kernel"] + whole["linear2"]["bias"]
        return jax.lax.pmean(optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), "fsdp")

    loss, grads = jax.value_and_grad(loss_fn)(whole)
    # 3. reduce-scatter: add up the 8 devices' kernel gradients, and keep only this device's block of rows.
    # (A bias is invariant, whole on every device, so its gradient comes back already summed: notebook 06 §10.)
    for layer in grads.values():
        layer["kernel"] = jax.lax.psum_scatter(layer["kernel"], "fsdp", scatter_dimension=0, tiled=True)
    return loss, grads


def _fsdp_through_the_gather(params, x, y):
    """Also right: differentiate through the all-gathers. The transpose of all_gather is psum_scatter, so
    autodiff writes the reduce-scatters itself."""
    def loss_fn(params):
        w1, w2 = (jax.lax.all_gather(params[name]["kernel"], "fsdp", tiled=True) for name in ("linear1", "linear2"))
        h = jax.nn.relu(x @ w1 + params["linear1"]["bias"])
        logits = h @ w2 + params["linear2"]["bias"]
        return jax.lax.pmean(optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), "fsdp")

    return jax.value_and_grad(loss_fn)(params)


def _local_loss(whole, x, y):
    h = jax.nn.relu(x @ whole["linear1"]["kernel"] + whole["linear1"]["bias"])
    logits = h @ whole["linear2"]["kernel"] + whole["linear2"]["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _gather(params, axis=0, tiled=True):
    return {name: {"kernel": jax.lax.all_gather(layer["kernel"], "fsdp", axis=axis, tiled=tiled),
                   "bias": layer["bias"]} for name, layer in params.items()}


def _scatter_kernels(grads, how):
    return {name: {"kernel": how(layer["kernel"]), "bias": layer["bias"]} for name, layer in grads.items()}


def _own_rows(g):
    rows = g.shape[0] // jax.lax.axis_size("fsdp")
    return jax.lax.dynamic_slice_in_dim(g, jax.lax.axis_index("fsdp") * rows, rows, axis=0)


def _wrong_psum_then_slice(params, x, y):
    """psum instead of psum_scatter, then each device slices its rows: right numbers, twice the traffic."""
    loss, grads = jax.value_and_grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(_gather(params))
    return loss, _scatter_kernels(grads, lambda g: _own_rows(jax.lax.psum(g, "fsdp")))


def _wrong_psum_no_slice(params, x, y):
    """psum instead of psum_scatter: every device returns the whole summed kernel gradient."""
    loss, grads = jax.value_and_grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(_gather(params))
    return loss, _scatter_kernels(grads, lambda g: jax.lax.psum(g, "fsdp"))


def _wrong_not_scaled(params, x, y):
    """The device's own mean loss differentiated, then summed: the sum of 8 means, not their mean."""
    grads = jax.grad(_local_loss)(_gather(params), x, y)
    loss = jax.lax.pmean(_local_loss(_gather(params), x, y), "fsdp")
    return loss, _scatter_kernels(grads, lambda g: jax.lax.psum_scatter(g, "fsdp", tiled=True))


def _wrong_mean_of_grads(params, x, y):
    """The pmap habit: average the gradients of the averaged loss again, which divides the kernels' twice."""
    loss, grads = jax.value_and_grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(_gather(params))
    return loss, _scatter_kernels(grads, lambda g: jax.lax.psum_scatter(g, "fsdp", tiled=True) / _N)


def _wrong_gather_axis(params, x, y):
    """Blocks of rows gathered along dimension 1: an (8, 2048) kernel that no longer multiplies x."""
    loss, grads = jax.value_and_grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(_gather(params, axis=1))
    return loss, _scatter_kernels(grads, lambda g: jax.lax.psum_scatter(g, "fsdp", scatter_dimension=1, tiled=True))


def _wrong_untiled(params, x, y):
    """all_gather without tiled=True stacks the blocks on a new axis: (8, 8, 256), not (64, 256)."""
    loss, grads = jax.value_and_grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(_gather(params,
                                                                                                    tiled=False))
    return loss, _scatter_kernels(grads, lambda g: jax.lax.psum_scatter(g, "fsdp"))


def _wrong_scatter_dimension(params, x, y):
    """The sum scattered along dimension 1: each device keeps columns, but its block of the kernel is rows."""
    loss, grads = jax.value_and_grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(_gather(params))
    return loss, _scatter_kernels(grads, lambda g: jax.lax.psum_scatter(g, "fsdp", scatter_dimension=1,
                                                                        tiled=True))


def _wrong_local_loss(params, x, y):
    """The device's own loss returned as the batch's: it differs from device to device, so out_specs=P() refuses it."""
    whole = _gather(params)
    grads = jax.grad(lambda w: jax.lax.pmean(_local_loss(w, x, y), "fsdp"))(whole)
    return _local_loss(whole, x, y), _scatter_kernels(grads, lambda g: jax.lax.psum_scatter(g, "fsdp", tiled=True))


fsdp_by_hand = Exercise(
    title="Exercise 2: FSDP by hand in shard_map",
    checker=_check_fsdp_by_hand,
    solution=_solution_fsdp_by_hand,
    wrong=(_wrong_psum_then_slice, _wrong_psum_no_slice, _wrong_not_scaled, _wrong_mean_of_grads, _wrong_gather_axis,
           _wrong_untiled, _wrong_scatter_dimension, _wrong_local_loss),
    hint=(
        "three steps inside the function: (1) jax.lax.all_gather(kernel, 'fsdp', tiled=True) for each kernel; "
        "(2) jax.value_and_grad of the batch's loss, which is jax.lax.pmean of the device's mean loss over "
        "'fsdp' (check_vma is on, so differentiate the loss your program computes, as in notebook 06 §10); "
        "(3) jax.lax.psum_scatter(kernel_gradient, 'fsdp', tiled=True) keeps this device's rows of the sum"
    ),
    explanation=(
        "The program gathers each kernel whole, as notebook 11's compiled step does, and reduce-scatters each "
        "kernel's gradient, as the TPU compiler does with that step: every device sends (N-1)/N of a kernel "
        "for the gather and the same for the scatter, where an all-reduce would send twice as much and keep "
        "only 1/N of it."
    ),
)
