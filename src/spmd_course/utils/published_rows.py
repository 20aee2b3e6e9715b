"""MaxText's published TPU performance rows, each with the model, mesh and FLOP formula of its date.

Why: a step-time model is checked against a published MFU only if it is run on the model that was
measured. MaxText's defaults changed after these tables were published (``base.yml`` took Llama-like
dims in February 2024, commit ``3b2ac81``), and so did the formula that turns a step time into TFLOP/s
(four times, below). So each row here is read from MaxText's git history at the commit that first
published its figures: the run script it names, ``base.yml``, ``pyconfig.py``'s scaling rule for
``global_parameter_scale``, the model code, and the FLOP formula in ``train.py``/``maxtext_utils.py``.

Nothing here reads MaxText at run time: the rows are data, and :func:`maxtext_flops_per_device` is the
formula. A published TFLOP/s figure is ``maxtext_flops_per_device / step_seconds``, and MFU is that over
the chip's peak; so a step time MaxText would have measured is *implied* by a row
(:meth:`PublishedRow.implied_step_seconds`), never published as such.

The formula's history (``calculate_training_tflops``, later ``calculate_tflops_training_per_device``):

============================ ========================= =============================================
formula key                  in use                    FLOPs per device per step (T = B·S tokens)
============================ ========================= =============================================
``palm_noncausal``           2023-06-02 .. 2023-11-08  6·N·T + 12·H·L·dh·S·T  (N: every parameter)
``palm_causal``              2023-11-08 .. 2024-05-08  6·N·T + 6·H·L·dh·S·T
``per_matrix_noncausal``     2024-05-08 .. 2025-07-22  3·(L·(ffn + qkv + out) + embedding) + 3·L·4·B·S²·H·dh
``per_matrix_causal``        2025-07-22 ..             the same with attention halved (PR #1988)
============================ ========================= =============================================

So attention was counted non-causally before PR #1988 only from May 2024; from November 2023 to May
2024 it was already halved. The v5e table (October 2023) uses ``palm_noncausal``, the v5p table
(December 2023) ``palm_causal``.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .inspecting import memory_per_device
from .train_step import DecoderConfig, Parallelism, lower_train_step, make_mesh

__all__ = ["FORMULAS", "MISSES", "PROGRAMS", "ROWS", "TARGET", "V5E_ROWS", "V5P_ROWS", "PublishedRow", "RowEstimate",
           "Source", "compile_row", "estimate_row", "formula_at", "load_program", "maxtext_2023_model",
           "maxtext_flops_per_device", "save_program"]

REPO = "AI-Hypercomputer/maxtext"

# key -> (first commit, its date, where the function lived)
FORMULAS: dict[str, tuple[str, str, str]] = {
    "palm_noncausal": ("0e650131c472bac58c15084a1eb0c6638e4671cf", "2023-06-02",
                       "MaxText/train.py: calculate_training_tflops"),
    "palm_causal": ("64ee4e93811e4de8ad6785710f881aa9879e0884", "2023-11-08",
                    "MaxText/train.py: calculate_training_tflops (maxtext_utils.py from 7e5ee2f 2024-03-11)"),
    "per_matrix_noncausal": ("353fb837cf6ecea9bf416341e568c5fc7153ccf0", "2024-05-08",
                             "MaxText/maxtext_utils.py: calculate_tflops_training_per_device"),
    "per_matrix_causal": ("2adc3bab1cea2e5a335b9e4c053c868155da2089", "2025-07-22",
                          "MaxText/maxtext_utils.py (PR #1988); now src/maxtext/utils/maxtext_utils.py"),
}

PEAK_TFLOPS = {"v5e": 197.0, "v5p": 459.0}  # bf16 per chip: MaxText's MFU = TFLOP/s / this (120.37/197 = 61.1%)


def formula_at(date: str) -> str:
    """The key of the formula MaxText used on ``date`` (ISO ``YYYY-MM-DD``); an error before June 2023."""
    if date < FORMULAS["palm_noncausal"][1]:
        raise ValueError(f"{date}: MaxText counted no attention FLOPs before 2023-06-02; no formula here")
    return [key for key, (_, since, _) in FORMULAS.items() if since <= date][-1]


def maxtext_flops_per_device(model: DecoderConfig, *, per_device_batch: float, formula: str,
                             num_params: int | None = None) -> float:
    """The model FLOPs per device per step that MaxText's formula ``formula`` gives.

    ``palm_*`` multiply MaxText's logged parameter count (every leaf of the params tree, so norms and
    any extras count; pass it as ``num_params``, default ``model.num_params()``) by 6 per token;
    ``per_matrix_*`` count each matmul (ffn, q/k/v, output projection, one embedding) ×2 forward ×3
    training. Attention scores are 4·S²·H·dh per sequence per layer forward (×3), halved by the causal ones.
    A mixture of experts (``num_experts``) counts ``experts_per_token`` experts' feed-forward and the router.
    """
    if formula not in FORMULAS:
        raise ValueError(f"formula must be one of {tuple(FORMULAS)}, got {formula!r}")
    b, s, layers = per_device_batch, model.seq_len, model.num_layers
    h, kv, dh, d, f = model.num_heads, model.kv_heads, model.head_dim, model.d_model, model.d_ff
    attention = 3 * 4 * b * s * s * h * dh * layers
    if formula.startswith("palm"):
        n = model.num_params() if num_params is None else num_params
        weights = 6 * n * b * s
    else:
        ffn = 2 * b * s * f * d * (2 if model.gated else 1) + 2 * b * s * f * d
        if model.num_experts:  # each token through its k experts, and the router
            ffn = ffn * model.experts_per_token + 2 * b * s * d * model.num_experts
        qkv = 2 * b * s * d * (h + 2 * kv) * dh
        out = 2 * b * s * d * h * dh
        weights = 3 * ((ffn + qkv + out) * layers + 2 * b * s * d * model.vocab_size)
    return weights + (attention / 2 if formula in ("palm_causal", "per_matrix_causal") else attention)


def maxtext_2023_model(scale: int) -> DecoderConfig:
    """MaxText's default model of 2023 at ``global_parameter_scale=scale``.

    ``base.yml`` (unchanged from October to December 2023): ``base_emb_dim 2560``, ``base_num_heads 8``,
    ``head_dim 256``, ``base_mlp_dim 8192``, ``base_num_decoder_layers 16``, ``mlp_activations ["relu"]``,
    ``logits_via_embedding True``, ``vocab_size 32_768``, ``max_target_length 2048``. ``pyconfig.py``'s
    ``get_individual_scales``: with ``k = log2(scale)`` and ``(q, r) = divmod(k, 3)``, heads and mlp
    double ``q + (r > 0)`` times, embed ``q + (r > 1)`` times, layers ``q`` times. The layer is parallel
    (attention and MLP read one RMS-normed input); the embedding is read by a one-hot matmul
    (``use_iota_embed=true`` in every run script) and the tied logits matmul runs in float32
    (``attend_dtype=jnp.float32``); weights are float32, activations bfloat16.
    """
    k = int(math.log2(scale))
    if scale < 1 or 2**k != scale:
        raise ValueError(f"global_parameter_scale must be a power of 2, got {scale}")
    q, r = divmod(k, 3)
    heads_mlp, emb, layers = q + (r > 0), q + (r > 1), q
    return DecoderConfig(num_layers=16 * 2**layers, d_model=2560 * 2**emb, num_heads=8 * 2**heads_mlp,
                         head_dim=256, d_ff=8192 * 2**heads_mlp, vocab_size=32_768, seq_len=2048,
                         activation="relu", gated=False, tied_embeddings=True, parallel_block=True,
                         iota_embed=True, dtype="bfloat16", weight_dtype="float32", logits_in_fp32=True)


@dataclass(frozen=True)
class Source:
    """Where a row's figures and configuration were read: one commit of ``AI-Hypercomputer/maxtext``."""

    commit: str  # full hash of the commit that first published these figures
    date: str  # its commit date, UTC
    table: str  # the file holding the table at that commit
    script: str  # the run script the table names
    files: tuple[str, ...]  # model, config and formula files read at that commit
    note: str = ""


@dataclass(frozen=True)
class PublishedRow:
    """One published measurement and everything that was measured.

    ``published_tflops_per_chip`` and ``published_mfu`` are MaxText's own figures (its formula over its
    measured step time); no step time was published. ``attention`` names the kernel that ran
    (``"dot"``: XLA with materialised scores, ``"flash"``: the Pallas TPU kernel); ``attention_causal``
    says whether the kernel skipped masked blocks. ``extra_params`` are parameters MaxText counted that
    :class:`DecoderConfig` leaves out (October 2023: T5 relative-position biases, 32 per head per layer).
    """

    name: str
    chip: str
    topology: str
    num_slices: int
    published_tflops_per_chip: float
    published_mfu: float
    model: DecoderConfig
    global_parameter_scale: int
    per_device_batch: int
    remat: str
    parallelism: Parallelism
    attention: str
    attention_causal: bool
    position: str
    extra_params: int
    optimizer: str
    libtpu_flags: str
    formula: str
    source: Source

    @property
    def chips(self) -> int:
        return math.prod(int(n) for n in self.topology.split(":")[1].split("x")) * self.num_slices

    @property
    def peak_tflops(self) -> float:
        return PEAK_TFLOPS[self.chip]

    @property
    def num_params(self) -> int:
        """The parameter count MaxText logged for this model (``calculate_num_params_from_pytree``)."""
        return self.model.num_params() + self.extra_params

    @property
    def tokens_per_chip(self) -> int:
        return self.per_device_batch * self.model.seq_len

    def maxtext_flops(self) -> float:
        """Model FLOPs per chip per step under the formula MaxText used on the row's date."""
        return maxtext_flops_per_device(self.model, per_device_batch=self.per_device_batch,
                                        formula=self.formula, num_params=self.num_params)

    def mfu(self, step_seconds: float) -> float:
        """MFU that MaxText's formula of the row's date gives for ``step_seconds`` (a fraction)."""
        if step_seconds <= 0:
            raise ValueError(f"step_seconds must be positive, got {step_seconds}")
        return self.maxtext_flops() / step_seconds / (self.peak_tflops * 1e12)

    def implied_step_seconds(self) -> float:
        """The step time the published MFU implies (implied, not measured: MaxText published no step time)."""
        return self.maxtext_flops() / (self.published_mfu * self.peak_tflops * 1e12)


_V5E_FLAGS = ("--xla_tpu_enable_data_parallel_all_reduce_opt=true "
              "--xla_tpu_data_parallel_opt_different_sized_ops=true "
              "--xla_tpu_enable_async_collective_fusion=true "
              "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
              "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
              "--xla_tpu_overlap_compute_collective_tc=true "
              "--xla_enable_async_all_gather=true")
_V5P_FLAGS = ("--xla_tpu_megacore_fusion_allow_ags=false --xla_enable_async_collective_permute=true "
              "--xla_tpu_enable_ag_backward_pipelining=true " + _V5E_FLAGS.replace(
                  "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true ", ""))
_ADAMW = "optax.adamw(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1) after clip_by_global_norm(1.0); f32 state"

_OCT24 = Source(
    commit="ebb226da831210cf6d6ff774aef937689bb1d612", date="2023-10-24", table="README.md",
    script="MaxText/configs/largest_job/{size}.sh",
    files=("MaxText/configs/base.yml", "MaxText/pyconfig.py", "MaxText/layers.py", "MaxText/train.py"),
    note=("The 16B 1x MFU first read 67.10% (a typo for 120 TFLOP/s on a 197 peak), fixed to 61.10% in 9bc243c "
          "(2023-10-27). The script at this commit sets no enable_flash_attention (base.yml: False), so the "
          "run used layers.py's dot_product_attention; 5ebcd67 (2023-10-27) added enable_flash_attention=true "
          "to it without changing these figures. An earlier 2x figure (16B 114 / 57.8%, 32B 113 / 57.3%, "
          "f70c643, 2023-08-30) was replaced here."))
_OCT27 = Source(
    commit="9bc243c9536bbd80268be23f6374a164fa36efbe", date="2023-10-27", table="README.md",
    script="MaxText/configs/largest_job/{size}.sh",
    files=("MaxText/configs/base.yml", "MaxText/pyconfig.py", "MaxText/layers.py", "MaxText/train.py",
           "v5e_high_performance.md"),
    note=("Scripts from 5ebcd67 (same day): enable_flash_attention=true, i.e. the Pallas kernel called with "
          "causal=False (layers.py), so every score was computed, as the formula of the date counts them."))
_OCT31 = Source(
    commit="e47fa1b5d377ee1043e663f1414024f4d0f12df0", date="2023-10-31", table="README.md",
    script="MaxText/configs/largest_job/{size}.sh", files=_OCT27.files,
    note="The 32-slice rows first appear here, in the table that merged the four sizes.")
_DEC15 = Source(
    commit="76bd53b0f44caf989c88189afadeb1062f9254f0", date="2023-12-15", table="MaxText/configs/v5p/README.md",
    script="MaxText/configs/v5p/{size}.sh",
    files=("MaxText/configs/base.yml", "MaxText/pyconfig.py", "MaxText/layers/models.py",
           "MaxText/layers/attentions.py", "MaxText/layers/embeddings.py", "MaxText/train.py",
           "MaxText/accelerator_to_spec_map.py"),
    note=("Copied into README.md by 04262f3 (2024-03-22); there the 128B v5p-512 row reads 315 / 68.53% and "
          "256B and 1024B rows changed, after base.yml's February 2024 change, so those re-measured figures "
          "belong to another model. Attention: flash, causal=True (attentions.py), RoPE."))


def _v5e(size: int, slices: int, tflops: float, mfu: float, batch: int, source: Source, *,
         tensor: int = 1, flash: bool = True) -> PublishedRow:
    s = Source(**{**source.__dict__, "script": source.script.format(size=f"{size}b")})
    return PublishedRow(
        name=f"v5e {size}B {slices}x v5e-256", chip="v5e", topology="v5e:16x16", num_slices=slices,
        published_tflops_per_chip=tflops, published_mfu=mfu, model=maxtext_2023_model(size),
        global_parameter_scale=size, per_device_batch=batch, remat="full",
        parallelism=Parallelism(ici_fsdp=-1 if tensor == 1 else 256 // tensor, ici_tensor=tensor, dcn_data=-1),
        attention="flash" if flash else "dot", attention_causal=False,
        position="T5 relative-position bias (ignored by the flash kernel)",
        extra_params=32 * maxtext_2023_model(size).num_heads * maxtext_2023_model(size).num_layers,
        optimizer=_ADAMW, libtpu_flags=_V5E_FLAGS, formula="palm_noncausal", source=s)


def _v5p(size: int, pod: int, slices: int, tflops: float, mfu: float, batch: int, remat: str,
         tensor: int) -> PublishedRow:
    topology = {128: "v5p:4x4x4", 256: "v5p:4x4x8", 512: "v5p:4x8x8"}[pod]
    s = Source(**{**_DEC15.__dict__, "script": _DEC15.script.format(size=f"{size}b")})
    return PublishedRow(
        name=f"v5p {size}B {slices}x v5p-{pod}", chip="v5p", topology=topology, num_slices=slices,
        published_tflops_per_chip=tflops, published_mfu=mfu, model=maxtext_2023_model(size),
        global_parameter_scale=size, per_device_batch=batch, remat=remat,
        parallelism=Parallelism(ici_fsdp=-1, ici_tensor=tensor, dcn_data=-1),
        attention="flash", attention_causal=True, position="RoPE", extra_params=0,
        optimizer=_ADAMW, libtpu_flags=_V5P_FLAGS, formula="palm_causal", source=s)


V5E_ROWS: tuple[PublishedRow, ...] = (
    _v5e(16, 1, 120, 0.6110, 6, _OCT24, flash=False),
    _v5e(32, 1, 132, 0.6686, 4, _OCT24, flash=False),
    _v5e(64, 1, 118, 0.5990, 2, _OCT27),
    _v5e(128, 1, 110, 0.5606, 1, _OCT27, tensor=16),
    _v5e(16, 2, 117, 0.5937, 6, _OCT24, flash=False),
    _v5e(32, 2, 128, 0.6481, 4, _OCT24, flash=False),
    _v5e(64, 2, 112, 0.5666, 2, _OCT27),
    _v5e(128, 2, 110, 0.5582, 1, _OCT27, tensor=16),
    _v5e(16, 32, 108, 0.5465, 6, _OCT31),
)
V5P_ROWS: tuple[PublishedRow, ...] = (
    _v5p(32, 128, 1, 328, 0.7147, 8, "minimal", 4),
    _v5p(64, 128, 1, 323, 0.7031, 4, "minimal", 4),
    _v5p(128, 256, 1, 315, 0.6868, 2, "minimal", 8),
    _v5p(128, 512, 1, 316, 0.6883, 2, "minimal", 8),
    _v5p(32, 128, 2, 319, 0.6943, 8, "minimal", 4),
)
ROWS: tuple[PublishedRow, ...] = V5E_ROWS + V5P_ROWS


# --- the rows' compiled programs, and the time model held against them ----------------------------------

PROGRAMS = Path(__file__).resolve().parents[3] / "data" / "published_rows"  # the clone's data/
"""Where each row's compiled program is kept: ``<name>.hlo.gz`` (``compiled.as_text()``) and ``index.json`` (the
compiler's memory analysis, with ``allocated_bytes``, the HBM its buffer assignment allocates, where the jax that
compiled it reports it; the versions that compiled it and the compile's CPU seconds). A full-size compile
takes 75-200 s of CPU a row, so the notebooks and ``make test`` read these; ``make published-rows`` compiles
every row again, checks the stored programs still estimate the same, and rewrites them with ``--update``."""

TARGET = (0.85, 1.15)
"""The estimated step over the step a row's published MFU implies: inside this, a row is predicted."""

MISSES: dict[str, str] = {
    "v5e 32B 1x v5e-256": (
        "1.16, at the edge: the roofline alone gives 0.92, and the compiler's cycle counts add 3.0 s to the "
        "matmuls; this row's chips ran them faster than the compiler's cost model says"),
    "v5e 128B 1x v5e-256": (
        "tensor parallelism over 16 chips: its matmuls run as windowed loops of collective-permutes, and the "
        "model leaves 3.9 s of them exposed (a permute hides only behind the ops before its first use in the "
        "same trip); without that the ratio is 1.03, so the compiler overlaps more of them than the model says"),
    "v5e 128B 2x v5e-256": "the same windowed tensor-parallel loops as the one-slice row: 3.8 s exposed, 0.95 without",
}
"""Rows outside :data:`TARGET`, each with its reason (the test fails if a row moves in or out)."""


@dataclass(frozen=True)
class RowEstimate:
    """A published row against the time model: ``estimate`` (:class:`utils.timing.StepEstimate`) of the row's
    compiled program; ``mfu``: MaxText's formula of the row's date over the estimated step; ``ratio``: the
    estimated step over the implied one (= published MFU / estimated MFU).

    Memory per chip, two figures that differ on TPU (see :class:`utils.inspecting.Memory`):
    ``sum_bytes`` is ``memory_analysis()``'s arguments + outputs - aliased + temporaries, an over-estimate
    (its ``temp_size_in_bytes`` is not the HBM allocated for temporaries: v5e 32B 1x sums to 17.95 GiB on a
    15.75 GiB chip, yet the compiler accepted the program); ``allocated_bytes`` is the HBM the compiler's
    buffer assignment allocates (``total_allocation_bytes``, its memory-usage report's ``default`` space,
    12.70 GiB for that row), or None where the stored program was saved without it. ``hbm_bytes`` is the
    allocation where known, else the sum."""

    row: PublishedRow
    estimate: Any
    mfu: float
    ratio: float
    sum_bytes: int
    allocated_bytes: int | None = None

    @property
    def hbm_bytes(self) -> int:
        return self.sum_bytes if self.allocated_bytes is None else self.allocated_bytes

    @property
    def inside(self) -> bool:
        return TARGET[0] <= self.ratio <= TARGET[1]

    def line(self) -> str:
        r, e = self.row, self.estimate
        hbm = (f"sum {self.sum_bytes / 2**30:5.1f} GiB" + ("" if self.allocated_bytes is None else
                                                            f", allocated {self.allocated_bytes / 2**30:5.1f}"))
        return (f"{r.name:21s} {r.source.date} {r.source.commit[:7]}  est {e.seconds:6.2f} s  implied "
                f"{r.implied_step_seconds():6.2f} s  MFU {self.mfu:6.1%} vs {r.published_mfu:6.2%}  x{self.ratio:.2f}  "
                + hbm)


def _key(row: PublishedRow) -> str:
    return row.name.replace(" ", "_")


def compile_row(row: PublishedRow):
    """Compile a row's training step at full size for its TPU topology (libtpu; minutes of CPU).

    A ``"dot"`` row keeps its scores and softmax in bfloat16, as MaxText's ``dot_product_attention`` did in
    October 2023 (``layers.py`` at ``ebb226d``: ``float32_logits=False``, which ``DecoderLayer`` left unset).
    Measured on v5e 32B 1x, that changes the estimated step by +0.3% and the HBM allocated by 32 KiB: the
    compiler fuses the float32 scores into the softmax and never stores them."""
    mesh = make_mesh(row.topology, row.parallelism, num_slices=row.num_slices)
    return lower_train_step(row.model, mesh, per_device_batch=row.per_device_batch, remat=row.remat,
                            attention=row.attention, causal=row.attention_causal or row.attention == "dot",
                            scores_in_fp32=row.attention != "dot").compile()


def save_program(row: PublishedRow, compiled: Any, *, cpu_seconds: float, folder: Path = PROGRAMS) -> None:
    """Store a row's compiled program and its memory analysis (gzip without a timestamp: same bytes each time)."""
    import jax

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{_key(row)}.hlo.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(compiled.as_text().encode())
    m = memory_per_device(compiled)
    index_file = folder / "index.json"
    index = json.loads(index_file.read_text()) if index_file.exists() else {}
    allocated = {} if m.allocated is None else {"allocated_bytes": m.allocated}  # jax 0.12+ reports it
    index[row.name] = dict(
        argument_bytes=m.argument, output_bytes=m.output, alias_bytes=m.alias, temp_bytes=m.temp, **allocated,
        compile_cpu_seconds=round(cpu_seconds), jax=jax.__version__, compiler_effort="default")
    index_file.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")


def load_program(row: PublishedRow, folder: Path = PROGRAMS) -> tuple[str, dict]:
    """A row's stored program text and its index entry; a FileNotFoundError naming ``make published-rows``."""
    path = folder / f"{_key(row)}.hlo.gz"
    if not path.exists():
        raise FileNotFoundError(f"no compiled program for {row.name!r} in {folder}: run `make published-rows` "
                                "(it compiles every row at full size, minutes each)")
    return gzip.decompress(path.read_bytes()).decode(), json.loads((folder / "index.json").read_text())[row.name]


def estimate_row(row: PublishedRow, compiled: Any = None, *, folder: Path = PROGRAMS) -> RowEstimate:
    """Time a row's program with :func:`utils.timing.estimate_step`: ``compiled`` if given, else the stored one."""
    from .timing import estimate_step

    if compiled is None:
        text, entry = load_program(row, folder)
        total = entry["argument_bytes"] + entry["output_bytes"] - entry["alias_bytes"] + entry["temp_bytes"]
        allocated = entry.get("allocated_bytes")
    else:
        m = memory_per_device(compiled)
        text, total, allocated = compiled, m.total, m.allocated
    mesh = make_mesh(row.topology, row.parallelism, num_slices=row.num_slices)
    estimate = estimate_step(text, mesh, chip=row.chip)
    mfu = row.mfu(estimate.seconds)
    return RowEstimate(row, estimate, mfu, row.published_mfu / mfu, total, allocated)
