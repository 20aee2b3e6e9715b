# %% [markdown]
# # 20 · Context parallelism: ring attention for long sequences
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/20_context.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/20_context.ipynb)
#
# Attention compares every token with every earlier one, so at 128k tokens one layer's keys and values
# alone are 512 MiB in bf16 (8 heads of 128), and the scores would be 128k x 128k per head. Sequence
# parallelism (notebook 14) splits the sequence everywhere *except* inside attention; context parallelism
# splits attention too, so that no device ever holds the whole sequence.
#
# **You need:** notebooks 06 (`jax.shard_map`, `ppermute`), 14 (sequence parallelism, and the toy ring of its
# section 4), 13 and 21 (TPU programs compiled ahead of time, HBM and compiler effort) and 15 (`estimate_step`);
# the softmax.
#
# Ring attention keeps each device's queries in place and passes blocks of keys and values around a ring
# of devices, so every query meets every key while no device holds more than two blocks.
#
# **You will learn**
# - how an online softmax (a running maximum and a running sum) lets attention read the keys and values one
#   block at a time and still give exactly the softmax's result;
# - how ring attention passes those blocks around a `context` axis with `jax.lax.ppermute` inside
#   `jax.shard_map`, and why a causal mask makes a plain split of the sequence unbalanced;
# - the zig-zag layout (each device holds a chunk from the front and its mirror from the back) that gives
#   every device the same work, and what it saves in the compiled TPU program's estimated time;
# - what ring attention saves against all-gathering the keys and values: per-device memory against sequence
#   length, read from the TPU compiler at 32k to 128k tokens.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title Setup: 8 devices (the same cell opens every notebook; notebook 00 explains it)
import subprocess
import sys
from pathlib import Path

course = next((p for p in (Path.cwd().parent, Path("spmd-course")) if (p / "src" / "spmd_course").is_dir()), None)
if course is None and "google.colab" in sys.modules:  # a notebook alone on Colab: fetch the course, whole or not at all
    url, tmp = "https://github.com/spmd-course/spmd-sharding-course", "spmd-course.tmp"
    subprocess.run(["rm", "-rf", "spmd-course", tmp], check=True)
    git = subprocess.run(["git", "clone", "-q", "--depth", "1", url, tmp], capture_output=True, text=True)
    assert git.returncode == 0, f"could not fetch the course (is the network on?): {git.stderr}"
    course = Path(tmp).rename("spmd-course")
sys.path[:0] = [str(course.resolve() / "src")] if course else []  # the clone's package, spmd_course
from spmd_course.utils import launch, setup_devices

launch.prepare_runtime()  # Colab: installs what is missing. Binder: shows memory in use. Any: flags untested versions.
SETUP = setup_devices(8)
CPU, RTOL = SETUP.cpu, SETUP.rtol  # compiler facts marked CPU are the CPU compiler's; RTOL: float32 tolerance

# %%
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, compile_effort, draw_ring_steps, estimate_step, format_bytes,
                   memory_per_device, quiet, tpu_compiler_available)

# %% [markdown]
# ## 1. Ring attention: the keys and values travel, the queries stay
#
# Split the sequence over a `context` axis of 8 devices: each holds 1/8 of the queries, keys and values.
# A query needs *every* earlier key, so the key/value blocks must meet every query block. Ring attention
# passes them around: at each step every device sends its current key/value block to the next device with
# `ppermute` (the ring of notebook 14, section 4) and attends to the block it received. After 8 steps every
# query block has seen every key block, and no device held more than one foreign block at a time.
#
# The softmax over all keys cannot be taken block by block as it stands, because its denominator sums over
# every key. The **online softmax** keeps, for each query, three running values: the largest score seen so
# far `m`, the sum `total` of `exp(score - m)`, and the weighted sum `acc` of the values. A new block with a
# larger maximum rescales the old `total` and `acc` by `exp(m_old - m_new)`, so at the end `acc / total` is
# exactly softmax times values, in any block order. The same merge also splits a long block into tiles, which
# keeps the scores of a 16k-token block from being materialized at once (flash attention does this
# inside one device).
#
# Shapes are `(batch, sequence, heads, head_dim)`. Positions travel with the keys, so the causal mask
# `query position >= key position` is right whatever order the tokens are laid out in (section 2 needs it).
# At step `s` device `i` holds the block that started on device `j = i - s` (mod 8). In the plain layout a
# block from a later device is all in the future and is skipped (`jax.lax.cond`); section 2 adds the
# balanced schedule.

# %% tags=["save"]
MASKED = -1e30  # the score of a masked pair: finite, so that exp(MASKED - m) is 0, never nan


def online_update(state, q, k, v, q_pos, k_pos):
    """Merge one key/value block into the running (max, sum, weighted values) of every query."""
    m, total, acc = state  # m, total: [batch, heads, queries]; acc: [batch, heads, queries, head_dim], float32
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(q.shape[-1])
    visible = q_pos[:, None] >= k_pos[None, :]  # causal: a query sees its own and earlier positions
    s = jnp.where(visible, s, MASKED)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(visible, jnp.exp(s - m_new[..., None]), 0.0)
    rescale = jnp.exp(m - m_new)  # what the old sums were measured against, brought to the new maximum
    total = total * rescale + p.sum(-1)
    acc = acc * rescale[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p.astype(v.dtype), v,
                                                preferred_element_type=jnp.float32)
    return m_new, total, acc


def attend_tiles(state, q, k, v, q_pos, k_pos, tile):
    """online_update over the keys in tiles of `tile` positions (a scan), so scores exist one tile at a time."""
    n = k.shape[1] // tile
    if n <= 1:
        return online_update(state, q, k, v, q_pos, k_pos)
    tiles = (k.reshape(k.shape[0], n, tile, *k.shape[2:]).swapaxes(0, 1),
             v.reshape(v.shape[0], n, tile, *v.shape[2:]).swapaxes(0, 1), k_pos.reshape(n, tile))
    return jax.lax.scan(lambda st, t: (online_update(st, q, *t[:2], q_pos, t[2]), None), state, tiles)[0]


def no_keys_seen(q):
    """No keys seen yet; built from q so that it varies over the mesh axis as q does (inside shard_map)."""
    zeros = jnp.zeros_like(q, jnp.float32).swapaxes(1, 2)  # [batch, heads, queries, head_dim]
    return zeros[..., 0] + MASKED, zeros[..., 0], zeros


def normalized_output(state, dtype):
    _, total, acc = state
    return (acc / total[..., None]).swapaxes(1, 2).astype(dtype)  # back to [batch, queries, heads, head_dim]


def ring_attention(q, k, v, q_pos, k_pos, *, axis, zigzag, tile=1 << 30):
    """Causal attention of this device's queries against every device's keys and values, passed in a ring.

    zigzag=False: each device holds one contiguous block, and skips a block that is all in its future.
    zigzag=True: each device holds chunks c and 2n-1-c of 2n (section 2), and computes half of each block.
    """
    n, me = jax.lax.axis_size(axis), jax.lax.axis_index(axis)
    ring = [(d, (d + 1) % n) for d in range(n)]
    state = attend_tiles(no_keys_seen(q), q, k, v, q_pos, k_pos, tile)  # step 0: my own block
    half = q.shape[1] // 2

    def whole(state, k, v, k_pos):
        return attend_tiles(state, q, k, v, q_pos, k_pos, tile)

    def skip(state, k, v, k_pos):
        return state

    def front_keys(state, k, v, k_pos):  # from an earlier device: only its front chunk is in my past
        return attend_tiles(state, q, k[:, :half], v[:, :half], q_pos, k_pos[:half], tile)

    def back_queries(state, k, v, k_pos):  # from a later device: only my back chunk sees it, all of it
        back = attend_tiles(tuple(a[:, :, half:] for a in state), q[:, half:], k, v, q_pos[half:], k_pos, tile)
        return tuple(jnp.concatenate([a[:, :, :half], b], axis=2) for a, b in zip(state, back, strict=True))

    def ring_step(s, carry):
        state, kv = carry
        kv = jax.lax.ppermute(kv, axis, ring)  # pass my block on, receive my neighbour's
        earlier = (me - s) % n < me  # did this block start on an earlier device?
        state = jax.lax.cond(earlier, *((front_keys, back_queries) if zigzag else (whole, skip)), state, *kv)
        return state, kv

    state, _ = jax.lax.fori_loop(1, n, ring_step, (state, (k, v, k_pos)))
    return normalized_output(state, q.dtype)


def gather_attention(q, k, v, q_pos, k_pos, *, axis, tile=1 << 30):
    """The other way: all-gather every key and value onto every device, then attend to them tile by tile."""
    k, v = (jax.lax.all_gather(a, axis, axis=1, tiled=True) for a in (k, v))
    k_pos = jax.lax.all_gather(k_pos, axis, tiled=True)
    return normalized_output(attend_tiles(no_keys_seen(q), q, k, v, q_pos, k_pos, tile), q.dtype)


def zigzag_order(length, n):
    """Token order that gives device d chunks d and 2n-1-d of 2n equal chunks (read in order, split n ways)."""
    chunks = np.arange(length).reshape(2 * n, length // (2 * n))
    return np.concatenate([np.concatenate([chunks[d], chunks[2 * n - 1 - d]]) for d in range(n)])


# %% [markdown]
# Run it on 8 devices for 2 sequences of 256 tokens, 2 heads of 16, against one device's causal attention
# (`jax.nn.dot_product_attention`). Everything along the sequence is split over `context`. The programs
# that run on the CPU are compiled with `FAST_COMPILE`, which skips optimising their machine code
# (notebook 12): their collectives and loops, which is what we read, are decided before that stage.

# %%
mesh = jax.make_mesh((8,), ("context",), axis_types=(AxisType.Auto,))
N = mesh.shape["context"]
B, S, H, D = 2, 256, 2, 16
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # CPU programs: skip optimising machine code
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((B, S, H, D), np.float32) for _ in range(3))


def reference_loss(q, k, v):  # one device's causal attention, and a loss on it to compare gradients (section 2)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return jnp.sum(jnp.tanh(out)), out


reference = jax.jit(jax.value_and_grad(reference_loss, argnums=(0, 1, 2), has_aux=True), compiler_options=FAST_COMPILE)
(_, expected), expected_grads = reference(q, k, v)
seq, pos = P(None, "context"), P("context")


def on_ring(zigzag, mesh=mesh, **options):
    """Ring attention as one jitted function of (q, k, v, q_pos, k_pos), each split over the sequence."""
    return jax.jit(jax.shard_map(partial(ring_attention, axis="context", zigzag=zigzag, **options), mesh=mesh,
                                 in_specs=(seq, seq, seq, pos, pos), out_specs=seq))


plain = np.arange(S)  # token t sits at position t: device d holds tokens 32d ... 32d + 31
ring_program = on_ring(zigzag=False, tile=8).lower(q, k, v, plain, plain).compile(FAST_COMPILE)  # tiles of 8 keys
out = ring_program(q, k, v, plain, plain)
assert_close(out, expected)
ring_ops = collectives(ring_program)
print(ring_ops)
assert {op.kind for op in ring_ops.ops} == {"collective-permute"}
assert ring_ops.count("collective-permute") == (N - 1) * len(ring_ops.ops)  # each block passed N - 1 times
assert sum(op.result_bytes for op in ring_ops.ops) == 2 * B * S // N * H * D * 4 + S // N * 4  # k, v, positions

# %% [markdown]
# Equal to one device's attention. The program holds only collective-permutes, each stated once in the loop
# body and run 7 times (`x7`): the key block and the value block, `f32[2,32,2,16]` each (one device's
# share), and their positions. Each device receives 7 blocks in all, the same bytes as an all-gather of
# the keys and values, but one block at a time.
#
# ## 2. The causal mask unbalances the ring; the zig-zag rebalances it
#
# Under a causal mask the contiguous split is lopsided: device 0 holds the first 32 tokens, which see only
# each other, while device 7's queries see all 256 tokens. A block from a later device is skipped, so device
# 0 works 1 step in 8 and device 7 works all 8. But the ring moves in lockstep (each `ppermute` waits for
# every device), so each step lasts as long as its busiest device, and skipping saves no time at all.
#
# The zig-zag layout cuts the sequence into 16 chunks and gives device *d* chunk *d* and its mirror,
# chunk 15 - *d*. Then at every step after the first, exactly half of the received block is visible: from
# an earlier device, its front chunk (to all my queries); from a later device, all of it, to my back chunk
# only. Every device computes half a block per step. The table below counts, from the positions alone,
# which share of each block's score pairs the mask keeps, and which share the kernel computes:

# %%
def layout_tables(order):
    """Per step and device: which device's block it holds, the visible share of its pairs, its token chunks."""
    place = np.asarray(order).reshape(N, -1)  # place[d]: the positions device d holds
    holds = np.array([[(d - s) % N for d in range(N)] for s in range(N)])
    visible = np.array([[np.mean(place[d][:, None] >= place[j][None, :]) for d, j in enumerate(row)]
                        for row in holds])
    chunk = S // (2 * N)
    labels = [[",".join(str(c) for c in dict.fromkeys(place[j] // chunk)) for j in row] for row in holds]
    return holds, visible, labels


def computed_share(holds, zigzag):
    """The share of each block the kernel computes: step 0 whole; then whole or skipped, or always half."""
    earlier = holds < np.arange(N)  # holds[s, d] < d: the block started on an earlier device
    later_steps = np.where(earlier, 1.0, 0.0) if not zigzag else np.full(holds.shape, 0.5)
    return np.where(np.arange(N)[:, None] == 0, 1.0, later_steps)


zigzag = zigzag_order(S, N)
panels = {}
for name, order, zig in (("contiguous", plain, False), ("zig-zag", zigzag, True)):
    holds, visible, labels = layout_tables(order)
    work = computed_share(holds, zig)
    assert np.all(work >= visible)  # the kernel never skips a pair the mask keeps
    panels[name] = {"holds": holds, "work": work, "labels": [[f"KV {t}" for t in row] for row in labels]}
    print(f"{name:<11} work per device (blocks): {work.sum(0)},  steps' length: {work.max(1).sum():g} blocks")

contiguous_work, zigzag_work = panels["contiguous"]["work"], panels["zig-zag"]["work"]
assert contiguous_work.sum(0).tolist() == list(range(1, N + 1))  # device d works d + 1 blocks
assert contiguous_work.max(1).sum() == N  # yet every step lasts a whole block: device N - 1 is always busy
assert np.all(zigzag_work.sum(0) == (N + 1) / 2) and zigzag_work.max(1).sum() == (N + 1) / 2  # balanced
draw_ring_steps(panels, list(mesh.device_ids), title="the ring's steps: which key/value block each device "
                "holds (colour: the device it started on), and the share computed")

# %% [markdown]
# Each row is one step and time runs down; each colour is a block travelling one device to the right per
# step, labelled with the chunks of tokens it holds. In the contiguous layout the work per device climbs
# from 1 to 8 blocks, and since device 7 works at every step the ring takes 8 block-lengths (the bold
# sum). In the zig-zag layout every device does 4.5 blocks and so does the ring: 8 / 4.5 = 1.8 times less
# time at 8 devices, approaching 2 as the ring grows.
#
# The zig-zag is only a different order of the same tokens: a data loader writes them in that order (and
# their positions, for the mask and rotary embeddings). Check outputs and gradients against one device:

# %%
z = np.argsort(zigzag)  # where each token went: out[:, z] puts the zig-zag output back in token order
zig_ring = on_ring(zigzag=True)


def ring_loss(q, k, v):  # the same loss as reference_loss, on the ring's output
    out = zig_ring(q, k, v, zigzag, zigzag)
    return jnp.sum(jnp.tanh(out)), out


zq, zk, zv = (a[:, zigzag] for a in (q, k, v))
zig_step = jax.jit(jax.value_and_grad(ring_loss, argnums=(0, 1, 2), has_aux=True), compiler_options=FAST_COMPILE)
(_, out), grads = zig_step(zq, zk, zv)
assert_close(np.asarray(out)[:, z], expected)
for got, want in zip(grads, expected_grads, strict=True):
    assert_close(np.asarray(got)[:, z], want)
print("zig-zag ring attention: output and the gradients of q, k and v equal one device's")

# %% [markdown]
# The gradients flow back through the ring by themselves: the transpose of a `ppermute` is the
# `ppermute` the other way, so JAX's backward pass sends the keys' and values' gradients round the ring in
# reverse. (At real size this autodiff would save every tile's scores for the backward pass; production
# kernels recompute them instead, with a custom backward. The TPU programs below are the forward pass.)
#
# > **You will see this online:** load balancing by cutting the sequence into 2n chunks and giving device
# > *d* chunks *d* and *d + n*, "striped":
# > ```python
# > chunks = x.reshape(2 * n, -1)
# > device_d = jnp.concatenate([chunks[d], chunks[d + n]])
# > ```
# > It looks symmetric, but chunk *d + n* is not the mirror of chunk *d*: device *n - 1* holds chunks
# > *n - 1* and *2n - 1*, the last of the sequence, and sees far more keys than device 0. The visible
# > work grows with *d* again. Only mirrored pairs, *d* and *2n - 1 - d*, give every device the same work:

# %%
striped = np.concatenate([np.arange(S).reshape(2 * N, -1)[[d, d + N]].ravel() for d in range(N)])
visible_work = {name: layout_tables(order)[1].sum(0) for name, order in
                (("contiguous", plain), ("striped", striped), ("zig-zag", zigzag))}
for name, w in visible_work.items():
    print(f"{name:<11} visible pairs per device, in blocks: {np.round(w, 2)}  busiest / mean: "
          f"{w.max() / w.mean():.2f}")
assert visible_work["striped"].max() / visible_work["striped"].mean() > 1.2
assert np.allclose(visible_work["zig-zag"], visible_work["zig-zag"].mean())

# %% [markdown]
# ## 3. The real size: 128k tokens on a TPU v5e-8
#
# Compile both ways ahead of time for the 8 chips of a TPU v5e (notebook 21) at 131,072 tokens: one
# attention layer's forward pass with 8 heads of 128, in bf16, keys in tiles of 512. **Effort:** these
# compiles use the compiler's least effort, O0, because the default effort takes 5 to 10 s of CPU per
# program here. At O0 nothing goes to on-chip VMEM, so its HBM is an upper bound. The hidden cell at the
# end of the section gives the default effort's figures at 32k, 64k and 128k tokens (compiled and checked
# by `tests/test_20_context_effort.py`, which reads this notebook's sizes and code).

# %%
TPU_OK, why = tpu_compiler_available()
print(why)
TPU_HEADS, TPU_HEAD_DIM, TPU_TILE = 8, 128, 512
LONG = 131072


def compile_for_tpu(kind, length, effort="O0"):
    """One attention layer's forward pass (`ring`, `ring, contiguous` or `all-gather`) for a v5e-8, and its mesh."""
    with quiet():
        chips = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    tpu_mesh = jax.make_mesh((len(chips),), ("context",), axis_types=(AxisType.Auto,), devices=chips)
    x = jax.ShapeDtypeStruct((1, length, TPU_HEADS, TPU_HEAD_DIM), jnp.bfloat16,
                             sharding=NamedSharding(tpu_mesh, seq))
    p = jax.ShapeDtypeStruct((length,), jnp.int32, sharding=NamedSharding(tpu_mesh, pos))
    if kind == "all-gather":
        f = jax.jit(jax.shard_map(partial(gather_attention, axis="context", tile=TPU_TILE), mesh=tpu_mesh,
                                  in_specs=(seq, seq, seq, pos, pos), out_specs=seq))
    else:
        f = on_ring(zigzag=kind == "ring", mesh=tpu_mesh, tile=TPU_TILE)
    with compile_effort(effort), quiet():
        return f.lower(x, x, x, p, p).compile(), tpu_mesh


def kv_bytes(length):
    """The keys and values of one layer, whole: length x heads x head_dim, bf16, twice."""
    return 2 * length * TPU_HEADS * TPU_HEAD_DIM * 2


if TPU_OK:
    programs = {kind: compile_for_tpu(kind, LONG) for kind in ("ring", "all-gather")}
    memory = {kind: memory_per_device(program) for kind, (program, _) in programs.items()}
    hbm = {kind: m.footprint for kind, m in memory.items()}  # jax 0.10: an estimate, see notebook 21
    for kind, size in hbm.items():
        print(f"{kind:<11} HBM per chip at O0: {format_bytes(size)}"
              + ("" if memory[kind].allocated else " (jax 0.10: arguments + outputs + temporaries, an estimate)"))
    print(f"keys and values, whole: {format_bytes(kv_bytes(LONG))}; one chip's block: "
          f"{format_bytes(kv_bytes(LONG) // N)}")
    assert hbm["all-gather"] - hbm["ring"] > kv_bytes(LONG) / 2  # most of the whole keys and values

# %% [markdown]
# The all-gather holds every key and value on every chip, 512 MiB, where the ring holds its own 64 MiB block
# and the one arriving: at O0 the all-gather needs 352 MiB more per chip. The hidden cell below shows the
# same at the default effort (561 MiB against 897 MiB), and how it scales: from 32k to 128k tokens the
# difference grows from 112 to 336 MiB with the sequence, because the gathered keys and values do. Both
# footprints also grow through each chip's own queries and tile of scores, which depend on the tokens per
# chip: adding chips divides the ring's whole footprint, but never the all-gather's 512 MiB.
#
# Then the ring's collectives, counted by the loop's trips, and the time `estimate_step` gives the program at
# the v5e's published rates (notebook 15):

# %%
if TPU_OK:
    ring_tpu, tpu_mesh = programs["ring"]
    tpu_ops = collectives(ring_tpu)
    print(tpu_ops)
    block = LONG // N * TPU_HEADS * TPU_HEAD_DIM * 2  # one chip's keys (or values): 32 MiB
    assert {op.kind for op in tpu_ops.ops} == {"collective-permute"}
    assert sorted(op.result_bytes for op in tpu_ops.ops)[-2:] == [block, block]
    assert tpu_ops.count("collective-permute") == (N - 1) * len(tpu_ops.ops)  # 7 trips each
    estimate = estimate_step(ring_tpu, tpu_mesh, use_cycles=False)  # compiled at O0: the roofline alone
    print(estimate)
    assert estimate.comm_bytes == tpu_ops.result_bytes  # every trip's blocks, counted by both

# %% [markdown]
# Per chip the ring sends its 32 MiB key and value blocks 7 times each, 448 MiB in all, the bytes an
# all-gather would send. In plain JAX each tile's scores go through HBM, which a fused attention kernel (Pallas's flash or splash attention) avoids, so read the time as what
# this program would take, not what ring attention can reach. The hidden cell also compiles the
# contiguous layout: `estimate_step` times a `cond` by its longer branch, as the lockstep ring runs, so the
# contiguous program counts a whole block per step and the zig-zag half a block, and its estimate is
# 1.7 times the zig-zag's (under 8 / 4.5 because the first, diagonal step is whole in both). The
# effort matters most at 32k tokens, where the default effort's ring needs 48.6 MiB of HBM against 164.8 at
# O0: quote a TPU figure with its effort.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The TPU compiler's exact figures, §3: HBM and estimated time per chip at the default effort
# Compiled by tests/test_20_context_effort.py, which asserts this table (jax 0.12.0.1, libtpu 0.0.50.1):
# (tokens, way) -> (HBM MiB at O0, HBM MiB at the default effort, estimated ms at the default effort)
DEFAULT_EFFORT = {(32768, "ring"): (164.8, 48.6, 15.0), (32768, "all-gather"): (252.6, 160.1, 21.0),
                  (65536, "ring"): (327.3, 240.9, 73.8), (65536, "all-gather"): (503.1, 448.2, 115.6),
                  (131072, "ring"): (652.2, 561.3, 283.1), (131072, "all-gather"): (1004.2, 897.2, 451.6),
                  (131072, "ring, contiguous"): (620.1, 609.8, 485.6)}
print(f"{'tokens':>7}  {'way':<17}{'HBM at O0':>10}{'HBM, default':>14}{'estimate, default':>19}")
for (n, kind), (at_o0, at_default, ms) in DEFAULT_EFFORT.items():
    print(f"{n:>7}  {kind:<17}{at_o0:>6.1f} MiB{at_default:>10.1f} MiB{ms:>15.1f} ms")
if TPU_OK and all(m.allocated is not None for m in memory.values()):  # the compiler's own HBM (jax 0.12+)
    for kind in hbm:  # this notebook's O0 figures, as the table says
        assert abs(hbm[kind] / 2**20 - DEFAULT_EFFORT[LONG, kind][0]) < 0.5
lengths = sorted({n for n, _ in DEFAULT_EFFORT})
extra = {n: DEFAULT_EFFORT[n, "all-gather"][1] - DEFAULT_EFFORT[n, "ring"][1] for n in lengths}
assert np.all(np.diff([extra[n] for n in lengths]) > 0)  # grows with the length
assert extra[LONG] > kv_bytes(LONG) / 2 / 2**20  # at 128k: most of the whole keys and values, in MiB
assert 1.4 < DEFAULT_EFFORT[LONG, "ring, contiguous"][2] / DEFAULT_EFFORT[LONG, "ring"][2] < 2 * N / (N + 1)

# %% [markdown]
# ## 4. Planning it: the context axis in the planner
#
# The course's planner (`utils.planner`, which notebook 25 runs) has a `context` axis
# when asked (`axes=(*AXES, "context")`). Its builder splits every sequence over that axis and gathers
# the keys and values, the all-gather way of this section, and each compiled candidate's gathers are timed
# by `estimate_step`. The axis is what makes fewer sequences than chips possible, for example 32 sequences
# of 128k tokens (4M tokens a step) on the 256 chips of a v5e:16x16. Listing the candidates needs no compiler:

# %%
from spmd_course.utils.planner import activation_bytes, candidates
from spmd_course.utils.timing import CHIPS
from spmd_course.utils.train_step import AXES, DecoderConfig

long_model = DecoderConfig(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128, d_ff=14336,
                           vocab_size=128_256, seq_len=LONG)
try:
    candidates(long_model, chips_per_slice=256, sequences=32, remats=("full",))
    refused = ""
except ValueError as err:  # without a context axis every chip needs a whole sequence
    refused = str(err)
print("without a context axis:", refused)
found = candidates(long_model, chips_per_slice=256, sequences=32, remats=("full",), axes=(*AXES, "context"))
saved = {c.context: activation_bytes(long_model, "full", c.per_device_batch, context=c.context)
         for c in found if c.per_device_batch == 1}  # one sequence per group of `context` chips
print("activations kept per chip, one sequence per group (remat 'full', a formula):",
      ", ".join(f"context {n}: {format_bytes(b)}" for n, b in sorted(saved.items())))
assert refused.startswith("32 sequences a step do not split over 256 chips")
assert min(saved) == 256 // 32  # a sequence needs at least 8 chips
assert saved[16] * 2 == saved[8]  # twice the axis, half a chip's share of the sequence
assert saved[8] > CHIPS["v5e"].hbm_bytes > saved[16]  # at 8, the float32 logits alone overflow a v5e chip

# %% [markdown]
# Without the axis the planner refuses, naming the fix. With it, the smallest context axis is 8 chips,
# one sequence per group of 8, and doubling it halves what each chip keeps of its sequence. At 8 the
# formula's activations exceed a v5e chip's 15.75 GiB, mostly the float32 logits of 16k tokens over a
# 128k vocabulary, so the planner prunes those candidates before compiling anything.

# %% [markdown]
# ## Takeaways
# - Context parallelism splits the sequence inside attention too. Ring attention keeps each device's queries
#   and passes key/value blocks around the `context` axis with `ppermute`, N - 1 times per layer.
# - The online softmax (running maximum, running sum, rescaled accumulator) merges blocks in any order into
#   exactly the softmax; the same merge tiles the keys within one device.
# - Under a causal mask a contiguous split is unbalanced: device *d* has *d + 1* blocks of work, and the
#   lockstep ring runs at the busiest device's pace. The zig-zag layout (chunks *d* and *2n - 1 - d*) gives
#   every device half a block per step, (N + 1) / 2 blocks in all instead of N.
# - Against all-gathering the keys and values, the ring saves the whole sequence's keys and values on every
#   device (512 MiB at 128k tokens here) and sends the same bytes, one block at a time, beside the compute.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** A layer has 8 key/value heads of 128 in bf16, on a `context` axis of 8 devices, for one
# sequence of 131,072 tokens. How many bytes of keys *and* values does one block of the ring hold, and how
# many does each device hold after all-gathering them?

# %%
from spmd_course.exercises import ex20_context as ex

answer_1 = NOT_ANSWERED  # a pair (one ring block, all-gathered), in bytes
ex.kv_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** Write `chunks_of(n)`: for a `context` axis of `n` devices and a sequence cut into `2n`
# chunks, the pair of chunk indices each device holds, as a list of `n` pairs, so that under a causal mask
# every device has the same work. The checker tries several `n`.

# %%
def chunks_of(n):
    ...  # your layout


answer_2 = NOT_ANSWERED  # set it to chunks_of once you have written it
ex.balanced_chunks.check(answer_2);

# %% [markdown]
# **Exercise 3.** Two devices each attended the same queries to a different half of the keys and hold
# `(m, total, acc)`: the largest score, the sum of `exp(score - m)`, and the sum of `exp(score - m) * value`.
# Write `merge(a, b)` that returns the `(m, total, acc)` of both halves together, so that `acc / total` is the
# attention over all the keys. The checker calls it on numpy arrays (`m`, `total`: `[queries]`, `acc`:
# `[queries, head_dim]`).

# %%
def merge(a, b):
    ...  # your merge


answer_3 = NOT_ANSWERED  # set it to merge once you have written it
ex.merge_partials.check(answer_3);

# %% [markdown]
# **Next:** [21 · Compiling for TPU pods you don't have](21_tpu_pods.ipynb)
