"""A decoder-only transformer's training step, compiled ahead of time at full size for a TPU topology.

Why: to check a step-time or memory model against a published measurement, the course compiles the
measured model itself (billions of parameters on hundreds of chips) without allocating anything. Every
parameter, optimizer moment and batch is a ``jax.ShapeDtypeStruct`` carrying its ``NamedSharding``, so
``jax.jit(step).lower(...)`` gives the program MaxText-style training runs: embedding, the layers under
``jax.lax.scan`` (so a 64-layer model compiles as fast as a 1-layer one, and the loop's trip count
matters when reading ``cost_analysis``), loss, gradient, global-norm clipping and an AdamW update.

What is modelled, and what is not:

- feed-forward: gated (``act(x W0) * (x W1)``, Llama) or not (``act(x W)``, MaxText's 2023 default);
  attention with ``num_kv_heads`` key/value heads (GQA); a sequential block (Llama) or a parallel one
  (attention and feed-forward read the same normed input, as MaxText's 2023 ``DecoderLayer`` does);
  tied or untied output embedding; an embedding read by gather or by a one-hot matmul (``iota_embed``);
  RMS norms; f32 master weights cast to the activation dtype at each matmul.
- attention is plain XLA dot-product attention with a causal mask: the scores are materialised, as
  MaxText's ``dot_product`` path does, not computed blockwise by a flash kernel; in float32 unless
  ``scores_in_fp32=False`` (bfloat16, as that path had them in October 2023). Rotary or relative
  position terms, and that path's layer norms on queries and keys, are left out (elementwise work, no
  matmul FLOPs).
- the mesh has MaxText's axes ``('data', 'fsdp', 'tensor')``; weights are sharded by MaxText's logical
  rules (``embed`` on fsdp; heads, mlp and vocab on tensor), the batch over data and fsdp. Several slices
  (``num_slices``) put the DCN axis outside the ICI axis of the same name, as MaxText's hybrid mesh does.
- context parallelism, opt-in (``Parallelism(ici_context=n)``): a fourth axis, ``'context'``, splits every
  sequence's tokens (activations, logits and the batch's second dimension) ``n`` ways, and, as MaxText's
  rules do, the weights' ``embed`` dimension over fsdp and context together. Queries stay split; keys and
  values are gathered whole for the attention (the partitioner writes the all-gather over ``context``,
  MaxText's all-gather context parallelism). A sequence is then ``n`` chips' work, so ``per_device_batch``
  counts sequences per group of ``n`` chips (MaxText's fractional ``per_device_batch_size`` times ``n``): a
  chip holds ``per_device_batch x seq_len / n`` tokens, and the step ``per_device_batch x chips / n``
  sequences, which is what lets a sequence too long for one chip be trained.
- mixture of experts, opt-in (``DecoderConfig(num_experts=E, experts_per_token=k, capacity_factor=c)``):
  each layer's feed-forward is ``E`` experts behind a top-``k`` router, with a capacity per expert of
  ``ceil(c x k x seq_len / E)`` tokens of each sequence (a sequence is a routing group; tokens past it are
  dropped), dispatched and combined by one-hot einsums (GShard's layer, no load-balancing loss term).
  ``Parallelism(ici_expert=n)`` adds an ``'expert'`` axis: the experts are split over it, and the batch and
  the dense weights' ``embed`` too (MaxText's rules), so the partitioner writes an all-to-all to send each
  expert its tokens and one to bring them back.

:class:`DecoderConfig` and :class:`Parallelism` check their input and say what to change; a planner can
build a config from a learner's numbers and call :func:`lower_train_step`.

Cost on a 2-core machine (libtpu 0.0.50.1, jax 0.12.0.1), MaxText's 16B row (32 layers, 256 chips of
``v5e:16x16``, 12,288 tokens per chip, full remat): lowering 0.5 s CPU; compiling 112 s CPU with the
flash kernel and 128 s with ``"dot"`` at the default effort, 26 s at ``jax_optimization_level="O0"``;
peak RSS 1.1 GB. ``memory_analysis()``'s arguments + temporaries for it: 14.1 GB (flash, default), 16.2 GB
(dot, default), 16.6 GB (flash, O0), against the chip's 16 GB. On TPU that sum over-states the HBM: the
compiler's own allocation (``total_allocation_bytes``) is what must fit, e.g. 12.70 GiB where the 32B row
sums to 17.95 GiB (see :class:`utils.published_rows.RowEstimate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import mesh_utils, topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .capture import quiet
from .tpu import tpu_compiler_available

__all__ = ["AXES", "AXES_WITH_CONTEXT", "REMAT_POLICIES", "DecoderConfig", "Parallelism", "lower_train_step",
           "make_mesh", "optimizer"]

AXES = ("data", "fsdp", "tensor")
AXES_WITH_CONTEXT = ("data", "fsdp", "context", "tensor")  # the mesh of Parallelism(ici_context > 1)
OPTIONAL_AXES = ("context", "expert")  # a mesh has AXES and any of these (make_mesh's order: before tensor)
BATCH = ("data", "fsdp")
ACTIVATIONS = ("relu", "gelu", "silu")
DTYPES = ("bfloat16", "float32")
# MaxText's remat_policy names (2023: full, minimal, proj, none) plus save_dots and host offload.
REMAT_POLICIES = ("none", "full", "minimal", "save_dots", "offload")
Remat = Literal["none", "full", "minimal", "save_dots", "offload"]
# "dot": XLA einsums with the S x S scores in HBM; "flash": the Pallas TPU flash-attention kernel MaxText
# called (jax.experimental.pallas.ops.tpu.flash_attention), blockwise, its FLOPs invisible to cost_analysis.
ATTENTION_KERNELS = ("dot", "flash")
Attention = Literal["dot", "flash"]


def _positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder-only transformer (what a published row or a learner's plan names).

    ``activation`` with ``gated=True`` is a GLU feed-forward (three matrices, Llama's SwiGLU is
    ``"silu"``); ``gated=False`` is the classic two-matrix one (MaxText's 2023 default was ``"relu"``).
    ``tied_embeddings`` reads the logits through the input embedding (MaxText's ``logits_via_embedding``).
    ``logits_in_fp32`` does that last matmul in float32 (MaxText 2023: ``attend_dtype=float32``).
    ``weight_dtype`` is the master copy and the optimizer state; ``dtype`` is what matmuls run in.
    ``num_experts > 0`` makes every feed-forward a mixture of that many experts of hidden size ``d_ff``,
    ``experts_per_token`` of them per token, each taking at most ``ceil(capacity_factor x experts_per_token x
    seq_len / num_experts)`` tokens of a sequence.
    """

    num_layers: int
    d_model: int
    num_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    seq_len: int
    num_kv_heads: int | None = None  # None: as many as num_heads (multi-head attention)
    activation: str = "silu"
    gated: bool = True
    tied_embeddings: bool = False
    parallel_block: bool = False
    iota_embed: bool = False
    dtype: str = "bfloat16"
    weight_dtype: str = "float32"
    logits_in_fp32: bool = True
    scan_layers: bool = True
    num_experts: int = 0  # 0: a dense feed-forward
    experts_per_token: int = 2
    capacity_factor: float = 1.25

    def __post_init__(self) -> None:
        _positive("DecoderConfig", num_layers=self.num_layers, d_model=self.d_model, num_heads=self.num_heads,
                  head_dim=self.head_dim, d_ff=self.d_ff, vocab_size=self.vocab_size, seq_len=self.seq_len)
        if self.num_kv_heads is not None:
            _positive("DecoderConfig", num_kv_heads=self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise ValueError(f"DecoderConfig: num_heads={self.num_heads} is not a multiple of "
                                 f"num_kv_heads={self.num_kv_heads}; each key/value head serves a whole group")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"DecoderConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        for name in ("dtype", "weight_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"DecoderConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.num_experts != 0 and (not isinstance(self.num_experts, (int, np.integer)) or self.num_experts < 1):
            raise ValueError(f"DecoderConfig.num_experts must be 0 (dense) or a positive integer, got "
                             f"{self.num_experts!r}")
        if self.num_experts:
            _positive("DecoderConfig", experts_per_token=self.experts_per_token)
            if self.experts_per_token > self.num_experts:
                raise ValueError(f"DecoderConfig: experts_per_token={self.experts_per_token} exceeds num_experts="
                                 f"{self.num_experts}; a token chooses among the experts there are")
            if not self.capacity_factor > 0:
                raise ValueError(f"DecoderConfig.capacity_factor must be > 0 (1 to 1.25 is usual), got "
                                 f"{self.capacity_factor!r}")

    @property
    def capacity(self) -> int:
        """Each expert's slots per sequence (0 for a dense model)."""
        if not self.num_experts:
            return 0
        return math.ceil(self.capacity_factor * self.experts_per_token * self.seq_len / self.num_experts)

    def _ffn_params(self, active: bool = False) -> int:
        """One layer's feed-forward parameters: every expert's and the router's, or (``active``) those a token
        multiplies by: its ``experts_per_token`` experts and the router."""
        one = (3 if self.gated else 2) * self.d_model * self.d_ff
        if not self.num_experts:
            return one
        return (self.experts_per_token if active else self.num_experts) * one + self.d_model * self.num_experts

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def layer_params(self) -> int:
        """Parameters of one layer: q, k, v, o projections, the feed-forward matrices, the RMS norm scales."""
        attention = self.d_model * (self.num_heads + 2 * self.kv_heads) * self.head_dim
        attention += self.num_heads * self.head_dim * self.d_model
        norms = (1 if self.parallel_block else 2) * self.d_model
        return attention + self._ffn_params() + norms

    def num_params(self) -> int:
        """All parameters: layers, input embedding, output embedding unless tied, final norm."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.d_model
        return self.num_layers * self.layer_params() + embeddings + self.d_model

    def matmul_params(self) -> int:
        """The parameters that a token multiplies by (the 6·N·T count): no norms, no input gather.

        The input embedding is a gather unless it is also the output matrix (tied), or ``iota_embed``
        (then the one-hot matmul is real work, but the usual count still charges it once). A mixture of
        experts counts the experts a token uses (``experts_per_token``) and the router.
        """
        per_layer = self.layer_params() - (1 if self.parallel_block else 2) * self.d_model
        per_layer -= self._ffn_params() - self._ffn_params(active=True)
        return self.num_layers * per_layer + self.vocab_size * self.d_model


@dataclass(frozen=True)
class Parallelism:
    """How many ways each mesh axis splits, inside a slice (ICI) and across slices (DCN).

    MaxText's convention: one axis of each kind may be ``-1``, which takes whatever the others leave
    (by default ``ici_fsdp=-1``: FSDP over every chip of a slice; ``dcn_data=-1``: data parallel over slices).
    ``ici_context`` (fixed, default 1) splits each sequence over a ``'context'`` mesh axis inside a slice, and
    ``ici_expert`` a mixture of experts' experts over an ``'expert'`` axis; the ICI axes of :meth:`resolve`
    then share the slice's chips divided by both.
    """

    ici_data: int = 1
    ici_fsdp: int = -1
    ici_tensor: int = 1
    dcn_data: int = -1
    dcn_fsdp: int = 1
    dcn_tensor: int = 1
    ici_context: int = 1
    ici_expert: int = 1

    def resolve(self, devices_per_slice: int, num_slices: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """The ICI and DCN shapes over ``AXES`` with every ``-1`` filled; a clear error if they do not fit.
        With ``ici_context`` or ``ici_expert > 1`` the ICI shape splits the chips that those axes leave."""
        _positive("Parallelism", ici_context=self.ici_context, ici_expert=self.ici_expert)
        extra = self.ici_context * self.ici_expert
        if devices_per_slice % extra:
            raise ValueError(f"Parallelism: ici_context={self.ici_context} x ici_expert={self.ici_expert} does not "
                             f"divide the {devices_per_slice} chips per slice; choose divisors of them")
        ici = self._fill("ici", (self.ici_data, self.ici_fsdp, self.ici_tensor), devices_per_slice // extra,
                         "chips per slice" if extra == 1 else "chips per slice left by ici_context x ici_expert")
        dcn = self._fill("dcn", (self.dcn_data, self.dcn_fsdp, self.dcn_tensor), num_slices, "slices")
        return ici, dcn

    @staticmethod
    def _fill(kind: str, shape: tuple[int, int, int], total: int, what: str) -> tuple[int, int, int]:
        names = [f"{kind}_{a}" for a in AXES]
        given = dict(zip(names, shape, strict=True))
        if any(s == 0 or s < -1 for s in shape) or shape.count(-1) > 1:
            raise ValueError(f"Parallelism: {given}: each must be positive, and at most one -1")
        known = math.prod(s for s in shape if s != -1)
        if -1 in shape:
            if total % known:
                raise ValueError(f"Parallelism: {total} {what} cannot be split {known} ways by "
                                 f"{given}; make the product of the fixed axes divide {total}")
            shape = tuple(total // known if s == -1 else s for s in shape)
        if math.prod(shape) != total:
            filled = dict(zip(names, shape, strict=True))
            raise ValueError(f"Parallelism: {filled} multiply to {math.prod(shape)}, but there are {total} "
                             f"{what}; set one of them to -1 or change them to multiply to {total}")
        return shape  # type: ignore[return-value]


def make_mesh(topology: str, parallelism: Parallelism = Parallelism(), *, num_slices: int = 1,
              allow_split_physical_axes: bool = False) -> Mesh:
    """A mesh with axes ``('data', 'fsdp', 'tensor')`` over a TPU topology's compile-only devices, or
    ``('data', 'fsdp', 'context', 'tensor')`` where ``parallelism.ici_context > 1``; ``'expert'`` likewise
    before ``'tensor'`` where ``parallelism.ici_expert > 1``.

    ``topology`` is a ``get_topology_desc`` name (``"v5e:16x16"``, ``"v5p:4x4x4"``); ``num_slices > 1``
    describes that many slices joined by DCN (``get_topology_desc(..., num_slices=n)``), and the mesh
    puts the DCN split outside the ICI split of each axis (``create_hybrid_device_mesh``), as MaxText does.
    ``mesh_utils`` maps each mesh axis onto whole torus axes (on ``v5e:4x4`` a mesh axis of 8 raises
    NotImplementedError); ``allow_split_physical_axes=True`` lets an axis take part of one (MaxText's
    option of the same name). Needs libtpu; nothing runs on the devices.
    """
    _positive("make_mesh", num_slices=num_slices)
    ok, why = tpu_compiler_available()  # also sets libtpu's environment before it loads
    if not ok:
        raise RuntimeError(f"make_mesh({topology!r}) needs the TPU compiler: {why}")
    with quiet():
        kwargs = {"num_slices": num_slices} if num_slices > 1 else {}
        devices = topologies.get_topology_desc(topology, "tpu", **kwargs).devices
    ici, dcn = parallelism.resolve(len(devices) // num_slices, num_slices)
    axes = AXES
    for name, size in (("context", parallelism.ici_context), ("expert", parallelism.ici_expert)):
        if size > 1:  # inside tensor, outside data and fsdp: (data, fsdp, [context], [expert], tensor)
            axes, ici, dcn = (*axes[:-1], name, axes[-1]), (*ici[:-1], size, ici[-1]), (*dcn[:-1], 1, dcn[-1])
    split = {"allow_split_physical_axes": True} if allow_split_physical_axes else {}
    if num_slices == 1:
        grid = mesh_utils.create_device_mesh(ici, devices, **split)
    else:
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, **split)
    return Mesh(grid, axes)


def _policy(remat: str):
    cp = jax.checkpoint_policies
    return {"full": cp.nothing_saveable, "minimal": cp.checkpoint_dots_with_no_batch_dims,
            "save_dots": cp.dots_saveable,
            "offload": cp.offload_dot_with_no_batch_dims(offload_src="device", offload_dst="pinned_host")}[remat]


def _param_specs(cfg: DecoderConfig, context: bool = False,
                 expert: bool = False) -> dict[str, tuple[tuple[int, ...], P]]:
    """Each parameter's shape and MaxText's sharding of it (layers stacked on axis 0 for the scan).
    ``context``/``expert``: the mesh has that axis. Both split ``embed`` with fsdp (MaxText's rules), except
    that the experts' own weights are split over ``expert`` by expert instead (replicated without the axis)."""
    def spec_on_mesh(spec: P) -> P:
        own = "expert" in spec  # an expert's weight: the expert axis splits the experts, not embed
        embed = ("fsdp", *(("context",) if context else ()), *(("expert",) if expert and not own else ()))
        return P(*((embed if len(embed) > 1 else "fsdp") if a == "fsdp" else
                   (a if a != "expert" or expert else None) for a in spec))

    return {k: (shape, spec_on_mesh(spec)) for k, (shape, spec) in _logical_specs(cfg).items()}


def _logical_specs(cfg: DecoderConfig) -> dict[str, tuple[tuple[int, ...], P]]:
    """The specs on MaxText's three axes, experts' weights on ``'expert'`` (:func:`_param_specs` fits a mesh)."""
    L, d, h, kv, dh, f = cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.d_ff
    specs = {
        "wq": ((L, d, h, dh), P(None, "fsdp", "tensor", None)),
        "wk": ((L, d, kv, dh), P(None, "fsdp", "tensor", None)),
        "wv": ((L, d, kv, dh), P(None, "fsdp", "tensor", None)),
        "wo": ((L, h, dh, d), P(None, "tensor", None, "fsdp")),
        "w_in": ((L, d, f), P(None, "fsdp", "tensor")),
        "w_out": ((L, f, d), P(None, "tensor", "fsdp")),
        "norm_attn": ((L, d), P(None, "fsdp")),
        "embedding": ((cfg.vocab_size, d), P("tensor", "fsdp")),
        "final_norm": ((d,), P("fsdp")),
    }
    if cfg.gated:
        specs["w_gate"] = ((L, d, f), P(None, "fsdp", "tensor"))
    if cfg.num_experts:  # every expert's matrices, experts on axis 1; and the router
        e = cfg.num_experts
        for name in ("w_in", "w_gate") if cfg.gated else ("w_in",):
            specs[name] = ((L, e, d, f), P(None, "expert", "fsdp", "tensor"))
        specs["w_out"] = ((L, e, f, d), P(None, "expert", "tensor", "fsdp"))
        specs["router"] = ((L, d, e), P(None, "fsdp", None))
    if not cfg.parallel_block:
        specs["norm_ffn"] = ((L, d), P(None, "fsdp"))
    if not cfg.tied_embeddings:
        specs["unembedding"] = ((d, cfg.vocab_size), P("fsdp", "tensor"))
    return specs


def _check_fits(cfg: DecoderConfig, mesh: Mesh, per_device_batch: int) -> None:
    """Every sharded dimension divides its axes (jit refuses uneven argument shardings); say which does not."""
    sizes = dict(mesh.shape)
    if cfg.num_heads % sizes["tensor"] or cfg.kv_heads % sizes["tensor"]:
        raise ValueError(f"num_heads={cfg.num_heads} and num_kv_heads={cfg.kv_heads} must both be multiples of "
                         f"tensor={sizes['tensor']} (heads are split over the tensor axis)")
    context = sizes.get("context", 1)
    if cfg.seq_len % context:
        raise ValueError(f"seq_len={cfg.seq_len} is not a multiple of context={context} (each chip of the context "
                         "axis holds an equal share of every sequence); choose a context size that divides it")
    experts = sizes.get("expert", 1)
    if "expert" in sizes and not cfg.num_experts:
        raise ValueError("the mesh has an 'expert' axis but the model is dense: set DecoderConfig.num_experts, or "
                         "use a mesh without 'expert' (Parallelism(ici_expert=1))")
    if cfg.num_experts % experts:
        raise ValueError(f"num_experts={cfg.num_experts} is not a multiple of expert={experts} (each chip of the "
                         "expert axis holds the same number of experts); choose an expert axis that divides them")
    for name, (shape, spec) in _param_specs(cfg, "context" in sizes, "expert" in sizes).items():
        for dim, axes in zip(shape, spec, strict=True):
            ways = math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
            if dim % ways:
                raise ValueError(f"{name} {shape}: a dimension of {dim} does not divide over the {ways}-way "
                                 f"{spec} split of mesh {sizes}; change the config or the parallelism")
    if per_device_batch * mesh.size // context % (sizes["data"] * sizes["fsdp"] * experts):
        raise ValueError(f"global batch {per_device_batch * mesh.size // context} does not divide over data x fsdp"
                         + (" x expert" if "expert" in sizes else ""))


def _rms(x: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * scale).astype(dtype)


def _act(name: str):
    return {"relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu}[name]


def lower_train_step(cfg: DecoderConfig, mesh: Mesh, *, per_device_batch: int, remat: Remat = "full",
                     attention: Attention = "dot", causal: bool = True, scores_in_fp32: bool = True,
                     learning_rate: float = 3e-5) -> jax.stages.Lowered:
    """The lowered training step ``(params, opt_state, tokens) -> (params, opt_state, loss)``.

    Nothing is allocated: parameters, AdamW moments and tokens are ``ShapeDtypeStruct``s with their
    shardings, and params and optimizer state are donated (updated in place, as MaxText's state is).
    ``remat`` is applied to each layer: ``"full"`` saves only the layer input, ``"minimal"`` saves every
    matmul without batch dimensions (MaxText's name), ``"save_dots"`` every matmul, ``"offload"`` moves
    the no-batch-dim matmul outputs to host memory, ``"none"`` keeps everything.
    ``attention="flash"`` runs MaxText's Pallas kernel (512-blocks) per shard under ``shard_map``;
    ``causal=False`` computes every score, as MaxText's flash call did until November 2023.
    ``scores_in_fp32`` (``attention="dot"`` only): the scores and their softmax in float32 (the usual choice
    for stability); ``False`` keeps them in ``cfg.dtype``, as MaxText's ``dot_product_attention`` did in
    October 2023 (``float32_logits`` defaulted to False and its ``DecoderLayer`` did not set it).
    ``per_device_batch``: sequences per chip (per group of ``context`` chips where the mesh has that axis).
    Call ``.compile()`` on the result (libtpu does the work; no TPU is needed).
    """
    _positive("lower_train_step", per_device_batch=per_device_batch)
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {remat!r}")
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {ATTENTION_KERNELS}, got {attention!r}")
    if attention == "flash" and cfg.kv_heads != cfg.num_heads:
        raise ValueError("attention='flash' here takes multi-head attention only (num_kv_heads == num_heads); "
                         "use attention='dot' for grouped key/value heads")
    if not set(AXES) <= set(mesh.axis_names) <= set(AXES) | set(OPTIONAL_AXES):
        raise ValueError(f"the mesh must have axes {AXES}, and may have {OPTIONAL_AXES} (use make_mesh), got "
                         f"{mesh.axis_names}")
    seq = "context" if "context" in mesh.axis_names else None  # the axis that splits each sequence's tokens
    ex = "expert" if "expert" in mesh.axis_names else None  # the axis that splits the experts
    batch_axes = (*BATCH, ex) if ex else BATCH  # the expert axis splits the batch too (MaxText's rules)
    if seq and attention == "flash":
        raise ValueError("attention='flash' here has no context axis (its kernel sees whole sequences); use "
                         "attention='dot', or a mesh without 'context'")
    _check_fits(cfg, mesh, per_device_batch)

    dtype, wdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.weight_dtype)
    logits_dtype = jnp.float32 if cfg.logits_in_fp32 else dtype
    group = cfg.num_heads // cfg.kv_heads
    act = _act(cfg.activation)

    def pin(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def constrain(x, *spec):  # BATCH stands for every axis that splits the batch
        return pin(x, *(batch_axes if a == BATCH else a for a in spec))

    def experts_ffn(h, w):
        """The mixture of experts on h (batch, seq, d): route, dispatch to (experts, batch, slots, d), the
        experts' matmuls where the experts are, combine back."""
        e, k, slots = cfg.num_experts, cfg.experts_per_token, cfg.capacity
        b, s_len = h.shape[:2]
        probs = jax.nn.softmax(jnp.einsum("bsd,de->bse", h, w["router"]).astype(jnp.float32), axis=-1)
        top_p, top_e = jax.lax.top_k(probs, k)
        gates = (top_p / top_p.sum(-1, keepdims=True)).astype(dtype)
        queue = jax.nn.one_hot(top_e.reshape(b, s_len * k), e, dtype=jnp.int32)  # choices in token order
        slot = ((jnp.cumsum(queue, axis=1) - 1) * queue).sum(-1).reshape(b, s_len, k)  # place in its queue
        in_slot = jax.nn.one_hot(jnp.where(slot < slots, slot, slots), slots, dtype=dtype)  # zeros: dropped
        choice = jax.nn.one_hot(top_e, e, dtype=dtype)
        dispatch = jnp.einsum("bske,bskc->bsec", choice, in_slot)
        combine = jnp.einsum("bske,bskc,bsk->bsec", choice, in_slot, gates)
        sent = pin(jnp.einsum("bsec,bsd->ebcd", dispatch, h), ex, BATCH, None, None)  # all-to-all over ex
        hidden = act(jnp.einsum("ebcd,edf->ebcf", sent, w["w_in"]))
        if cfg.gated:
            hidden = hidden * jnp.einsum("ebcd,edf->ebcf", sent, w["w_gate"])
        hidden = pin(hidden, ex, BATCH, None, "tensor")
        done = constrain(jnp.einsum("ebcf,efd->ebcd", hidden, w["w_out"]), None, BATCH, None, None)  # back
        return jnp.einsum("bsec,ebcd->bsd", combine, done)

    def dot_attention(q, k, v):
        b, s = q.shape[:2]
        q = q.reshape(b, s, cfg.kv_heads, group, cfg.head_dim)
        scores = jnp.einsum("bqngk,bsnk->bngqs", q, k)
        if scores_in_fp32:
            scores = scores.astype(jnp.float32) / np.sqrt(cfg.head_dim)
        else:  # MaxText's 2023 dot path: bf16 scores, bf16 softmax
            scores = scores / jnp.asarray(np.sqrt(cfg.head_dim), scores.dtype)
        if causal:
            scores = jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -1e10)
        probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
        return jnp.einsum("bngqs,bsnk->bqngk", probs, v).reshape(b, s, cfg.num_heads, cfg.head_dim)

    def flash(q, k, v):
        from jax.experimental.pallas.ops.tpu import flash_attention as fa

        block = min(512, cfg.seq_len)
        sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1,
                              block_q_major_dkv=block, block_k_major_dkv=block, block_k_dkv=block,
                              block_q_dkv=block, block_k_major_dq=block, block_k_dq=block, block_q_dq=block)

        def kernel(q, k, v):  # [b, h, s, k] per shard
            return fa.flash_attention(q, k, v, causal=causal, sm_scale=1 / np.sqrt(cfg.head_dim),
                                      block_sizes=sizes)

        spec = P(BATCH, "tensor", None, None)
        sharded = jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
        heads_first = [t.transpose(0, 2, 1, 3) for t in (q, k, v)]
        return sharded(*heads_first).transpose(0, 2, 1, 3)

    def layer(x, w):
        cast = {k: v.astype(dtype) for k, v in w.items()}
        x = constrain(x, BATCH, seq, "tensor")
        h = _rms(x, w["norm_attn"], dtype)
        q = jnp.einsum("bsd,dhk->bshk", h, cast["wq"])
        k = jnp.einsum("bsd,dhk->bshk", h, cast["wk"])
        v = jnp.einsum("bsd,dhk->bshk", h, cast["wv"])
        q = constrain(q, BATCH, seq, "tensor", None)
        if seq:  # every query sees every key: gather the keys and values over the context axis
            k, v = constrain(k, BATCH, None, "tensor", None), constrain(v, BATCH, None, "tensor", None)
        o = flash(q, k, v) if attention == "flash" else dot_attention(q, k, v)
        attn = jnp.einsum("bshk,hkd->bsd", o, cast["wo"])
        if not cfg.parallel_block:
            x = x + attn
            h = _rms(x, w["norm_ffn"], dtype)
        if cfg.num_experts:
            ffn = experts_ffn(h, cast)
        else:
            hidden = act(jnp.einsum("bsd,df->bsf", h, cast["w_in"]))
            if cfg.gated:
                hidden = hidden * jnp.einsum("bsd,df->bsf", h, cast["w_gate"])
            hidden = constrain(hidden, BATCH, seq, "tensor")
            ffn = jnp.einsum("bsf,fd->bsd", hidden, cast["w_out"])
        out = x + ffn + (attn if cfg.parallel_block else 0)
        return constrain(out.astype(dtype), BATCH, seq, "tensor")

    body = layer if remat == "none" else jax.checkpoint(layer, policy=_policy(remat))
    specs = _param_specs(cfg, seq is not None, ex is not None)
    stacked = [k for k, (shape, _) in specs.items() if len(shape) and k not in
               ("embedding", "final_norm", "unembedding")]

    def loss_fn(params, tokens, targets):
        table = params["embedding"]
        if cfg.iota_embed:
            one_hot = jax.nn.one_hot(tokens, cfg.vocab_size, dtype=dtype)
            x = jnp.einsum("bsv,vd->bsd", one_hot, table.astype(dtype))
        else:
            x = table.astype(dtype)[tokens]
        layers = {k: params[k] for k in stacked}
        if cfg.scan_layers:
            x, _ = jax.lax.scan(lambda c, w: (body(c, w), None), x, layers)
        else:
            for i in range(cfg.num_layers):
                x = body(x, {k: v[i] for k, v in layers.items()})
        x = _rms(x, params["final_norm"], dtype)
        out = table.T if cfg.tied_embeddings else params["unembedding"]
        logits = jnp.einsum("bsd,dv->bsv", x.astype(logits_dtype), out.astype(logits_dtype))
        logits = constrain(logits, BATCH, seq, "tensor").astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.sum(log_probs * jax.nn.one_hot(targets, cfg.vocab_size, dtype=jnp.float32), -1))

    tx = optimizer(learning_rate)

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = {k: jax.ShapeDtypeStruct(shape, wdtype, sharding=NamedSharding(mesh, spec))
              for k, (shape, spec) in specs.items()}
    opt_state = jax.eval_shape(tx.init, params)
    shardings = {k: p.sharding for k, p in params.items()}

    def with_sharding(leaf):
        # the moments mirror params' tree; scalars (step counts) are replicated
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, P()))

    opt_state = jax.tree.map(with_sharding, opt_state)
    opt_state = _moments_like(opt_state, params, shardings, mesh)
    batch = per_device_batch * mesh.size // dict(mesh.shape).get("context", 1)  # a sequence per `context` chips
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len), jnp.int32, sharding=NamedSharding(mesh, P(batch_axes, seq)))
    step = jax.jit(train_step, donate_argnums=(0, 1))
    return step.lower(params, opt_state, tokens, tokens)


def optimizer(learning_rate: float = 3e-5) -> optax.GradientTransformation:
    """The training step's optimizer: global-norm clipping at 1.0, then AdamW (MaxText's defaults: b1 0.9,
    b2 0.95, eps 1e-8, weight decay 0.1). Shared with :func:`utils.module_plan.plan_module`'s step."""
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(learning_rate, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))


def _moments_like(opt_state, params, shardings, mesh: Mesh):
    """Give every optimizer leaf shaped like a parameter that parameter's sharding (AdamW's mu and nu)."""

    def fix(node):
        if isinstance(node, dict) and node.keys() == params.keys():
            return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in node.items()}
        return node

    return jax.tree.map(fix, opt_state, is_leaf=lambda n: isinstance(n, dict) and n.keys() == params.keys())

