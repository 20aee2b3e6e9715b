# %% [markdown]
# # 16 · The estimate held against published runs
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/16_published_runs.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/16_published_runs.ipynb)
#
# A step-time estimate is worth what it predicts, and the only public measurements at a real scale are
# published rows such as MaxText's. Timed op by op with no constant fitted, the course's estimate lands
# within 15% of the step implied by 11 of MaxText's 14 rows of 2023, and the three misses have reasons.
#
# **You need:** notebooks 13 (rematerialisation, HBM and compiler effort) and 15 (the roofline,
# `estimate_step` and its timeline); `compiled.memory_analysis()`.
#
# You will read a published row as it was measured: the model of its date, from the repository's
# history, and the FLOP formula MaxText used that month. Then you will time the stored full-size
# program, hold every row of 2023 against its implied step, and see why eight rows seem not to fit in HBM
# although MaxText ran them.
#
# **You will learn**
# - what a published row gives (TFLOP/s per chip and MFU), and why its step time is implied, not measured;
# - why a row must be compared on the model and the FLOP formula of its date;
# - MFU against HFU: what remat adds to the FLOPs a chip runs;
# - where the estimate misses, and why;
# - why `memory_analysis()`'s sum is not the HBM a TPU program needs, and where to read the allocation.

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
import numpy as np

from spmd_course.utils import NOT_ANSWERED, draw_roofline, tpu_compiler_available
from spmd_course.utils.published_rows import MISSES, ROWS, TARGET, V5E_ROWS, estimate_row, load_program

ok, why = tpu_compiler_available()

# %% [markdown]
# ## 1. A published row, read at its date
#
# MaxText, Google's reference JAX trainer, publishes throughput with its configurations. Its TPU v5e table
# gives a 16-billion-parameter model **120 TFLOP/s per chip, 61.10% MFU, on one v5e-256**. That row was
# measured in October 2023 and never re-measured, and MaxText's default model changed in February 2024, so
# the model to compare with is the one of October 2023, read from the repository's history at the commit
# that published the row. `utils.published_rows` holds it, with the FLOP formula MaxText used that month.
# MaxText publishes no step time: its TFLOP/s are its own FLOP count over its measured step, so the step
# time a row gives is **implied** by the published MFU, not measured.
#
# That FLOP count is a formula, and it has changed, so a row is compared under the formula of its date:
#
# | in use | MaxText's model FLOPs per chip per step (N parameters, T tokens, L layers, H heads of dh, S long) |
# |---|---|
# | June to November 2023 (the v5e table) | `6NT + 12 H L dh S T`: attention counted as if every query saw every key |
# | November 2023 to May 2024 (the v5p table) | `6NT + 6 H L dh S T`: attention halved for the causal mask |
# | May 2024 to July 2025 | each matmul counted from its shape, attention not halved |
# | since July 2025 (PR #1988, `calculate_tflops_training_per_device`) | the same, attention halved again |
#
# MFU (model FLOP utilisation) divides that count by the step and the chip's peak. It leaves out what
# the chip recomputes: with full remat the backward pass runs each layer's forward again, so the chip's
# own rate, its hardware FLOP utilisation (HFU), is higher than the MFU. Even with matrix units that never
# pause, MFU cannot pass the model's FLOPs over the FLOPs the chip runs. The cell below prints both.

# %%
row = next(r for r in V5E_ROWS if r.global_parameter_scale == 16 and r.num_slices == 1)
m = row.model
print(f"{row.name}: published {row.published_tflops_per_chip:.0f} TFLOP/s per chip, MFU {row.published_mfu:.2%}; "
      f"commit {row.source.commit[:9]} ({row.source.date})")
print(f"model then: d = {m.d_model}, {m.num_heads} heads of {m.head_dim}, d_ff = {m.d_ff} ({m.activation}, "
      f"{'gated' if m.gated else 'not gated'}), {m.num_layers} layers, vocabulary {m.vocab_size:,}, tied embeddings "
      f"{m.tied_embeddings}; {row.num_params / 1e9:.2f}B parameters")
print(f"{row.per_device_batch} x {m.seq_len} tokens per chip, remat {row.remat}, FSDP over {row.chips} chips; "
      f"formula of the date: {row.formula} (attention counted non-causally)")
print(f"MaxText's FLOPs per chip per step: {row.maxtext_flops():.4g}; step implied by {row.published_mfu:.2%} MFU: "
      f"{row.implied_step_seconds():.2f} s")
assert (m.d_model, m.num_heads * m.head_dim, m.d_ff, m.gated) == (5120, 8192, 32768, False)  # not 2024's dims

# %% [markdown]
# ## 2. The full-size program, timed op by op
#
# Compiling the whole step at this size takes 75-200 s of CPU, too long for this page. So the course compiles
# every published row once, at full size and at the default compiler effort, for its own slice, and keeps the
# compiled program's text in `data/published_rows` (`make published-rows` compiles them again and checks they
# still give the same estimate). The time model reads that text exactly as it reads a program compiled here:
# it walks the 32 layers' loop 32 times, because the trip count is in the program.

# %%
if ok:
    full = estimate_row(row)  # the stored full-size program, timed op by op
    est = full.estimate
    print(est)
    print(f"memory_analysis's arguments + temporaries per chip: {full.sum_bytes / 2**30:.1f} GiB of the chip's "
          f"{est.chip.hbm_bytes / 2**30:.2f} GiB (an over-estimate on TPU: see the end of this section)")
    print(f"MFU by MaxText's formula of {row.source.date[:7]}: estimated {full.mfu:.1%}, published "
          f"{row.published_mfu:.2%}; estimated step / implied step = {full.ratio:.2f}")
    print(f"the chip runs {est.flops / row.maxtext_flops():.2f}x the FLOPs MaxText counts: estimated HFU "
          f"{est.flops / est.seconds / est.chip.peak_flops:.1%}, MFU {full.mfu:.1%}")
    assert est.flops > 1.15 * row.maxtext_flops()  # full remat: the chip runs more FLOPs than MaxText counts
    assert TARGET[0] <= full.ratio <= TARGET[1] and round(full.ratio - 1, 2) == 0.14  # 14% slower, inside the target
    draw_roofline(est)
else:
    print(why)

# %% [markdown]
# The estimate is **14% slower** than the implied step, not faster, although every rate in it is the chip's
# peak. Two things make it so. The chip runs more FLOPs than MaxText counts, because full remat recomputes
# each layer's forward pass in the backward one. And a matmul fusion is timed by the compiler's own cycle
# count where that is longer than its roofline: the compiler knows how its schedule fills the matrix units,
# and for the attention matmuls of this row (head dimension 256, scores in float32) it expects up to twice the
# roofline. On the roofline picture every point is one op of the step: the big feed-forward matmuls sit at
# the ridge's right, compute-bound, and the elementwise work sits on the slope, bound by HBM.
#
# ## 3. Every row MaxText published in 2023
#
# One row could be luck. The same model times every row MaxText published for v5e and v5p in 2023, each with
# the model, mesh, batch and remat of its date, and no constant fitted to any of them:

# %%
if ok:
    table = [estimate_row(r) for r in ROWS]
    for e in table:
        print(e.line() + ("" if e.inside else "   outside: " + MISSES[e.row.name][:60] + "..."))
    inside = [e for e in table if e.inside]
    ratio = {e.row.name: e.ratio for e in table}
    over = [e.row.name for e in table if e.sum_bytes > e.estimate.chip.hbm_bytes]
    print(f"{len(inside)} of {len(table)} rows within {TARGET[0]}-{TARGET[1]} of the implied step; memory_analysis's "
          f"sum per chip is above the chip's HBM on {len(over)}: {', '.join(over)}")
    assert len(table) == 14 and len(inside) == 11  # eleven of fourteen
    assert {e.row.name for e in table if not e.inside} == set(MISSES) == {
        "v5e 32B 1x v5e-256", "v5e 128B 1x v5e-256", "v5e 128B 2x v5e-256"}  # the three misses, each with its reason
    assert all(1.20 <= ratio[f"v5e 128B {n}x v5e-256"] < 1.30 for n in (1, 2))  # the 128B rows: 20-29% slow
    assert round(ratio["v5e 32B 1x v5e-256"] - 1, 2) == 0.16  # the 32B one-slice row: 16% slow
    assert [n.split()[0] for n in over].count("v5e") == 5 and [n.split()[0] for n in over].count("v5p") == 3
else:
    print(why)

# %% [markdown]
# | what the table shows | why |
# |---|---|
# | eleven of fourteen rows land within 15% of the implied step | per-op time (roofline or compiler cycles), every loop trip, overlap read from the schedule |
# | the two 128B rows are 20-29% slow | they use tensor parallelism over 16 chips, whose matmuls run as windowed loops of collective-permutes; the model hides a permute only behind the ops before its first use, and leaves 3.9 s exposed |
# | the 32B one-slice row is 16% slow | the compiler's cycle counts for its matmuls are longer than that run achieved |
# | five v5e rows and three v5p rows seem to need more HBM than the chip has | they do not: the figure summed is `memory_analysis()`'s, whose `temp_size_in_bytes` on TPU is not the HBM the compiler allocates. The compiler refuses a program that does not fit, and it accepted all fourteen |
#
# So the estimate predicts a plan's step within about 15% where its communication is what the model reads
# right, and says which term dominates. A profiler trace of the real run (notebook 15 §4) is where the
# last 15% is found.

# %% [markdown]
# ## 4. Do they fit? `memory_analysis()` against the HBM allocated
#
# The memory column needs a closer look, because eight rows seem not to fit on chips where MaxText ran
# them. The figure summed there is `memory_analysis()`'s arguments + outputs - aliased + temporaries. On
# TPU, `temp_size_in_bytes` counts more than the temporaries the compiler places in HBM, and the gap is
# not a fixed share: the HBM allocated is 8 to 31% below the sum on these fourteen rows (the hidden cell
# below checks that range). The HBM it places is `total_allocation_bytes` (jax 0.12), which is the
# `default` space of the compiler's own memory report (`compiler_options={"xla_dump_to": DIR}`, file
# `*memory-usage-report.txt`). Every stored program records it, as for these two rows:
#
# | row | `memory_analysis()`'s sum | HBM the compiler allocates | the chip |
# |---|---|---|---|
# | v5e 32B 1x | 17.95 GiB | 12.70 GiB | 15.75 GiB |
# | v5p 32B 1x | 105.4 GiB | 90.0 GiB | 95.73 GiB |
#
# So the compiler's program fits, and the builder is not the cause either. The largest buffers in those two
# allocations are ones MaxText's code of that date kept as well, because it made the same choices:
#
# | buffer (per chip) | v5e 32B 1x (full remat) | v5p 32B 1x (minimal remat) | why it is there, in MaxText's code too |
# |---|---|---|---|
# | each layer's saved input `bf16[32, batch, 2048, d]` | 5.00 GiB of 12.70 | | full remat keeps only the layer's input, for all 32 layers of the scan |
# | matmul outputs saved for the backward pass | | 66 GiB of 90.0: feed-forward hidden 32, q, k and v 24, an output projection 10 | minimal remat saves every matmul without batch dimensions (`checkpoint_dots_with_no_batch_dims`), for all 32 layers |
# | the tied embedding gathered whole in float32, `f32[32768, 10240]` | 1.25 GiB | 0.31 GiB (split over 4) | the logits are computed in float32 from the tied embedding (`attend_dtype=float32`) |
# | float32 logits `f32[batch, 2048, 32768]` | 1.00 GiB | 2.00 GiB | the same float32 logits |
#
# MaxText's October 2023 dot-product attention kept its scores in bfloat16, where this builder used float32.
# The builder now copies that for the `"dot"` rows. Measured on the v5e 32B row, it changes the estimate by
# +0.3% and the allocation by 32 KiB, because the compiler never stores the float32 scores: it fuses them into
# the softmax. The hidden cell below reads the buffers from the stored programs.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The TPU compiler's exact figures, §4: HBM allocated against memory_analysis's sum, and the largest buffers
if ok:
    GIB = 2**30
    bf16, f32 = 2, 4
    stored = {e.row.name: e for e in table if e.allocated_bytes is not None}  # rows whose allocation is recorded
    below = [1 - e.allocated_bytes / e.sum_bytes for e in stored.values()]
    print(f"the allocation is {min(below):.0%} to {max(below):.0%} below memory_analysis's sum on {len(below)} rows")
    assert len(below) == 14 and min(below) > 0.08 and max(below) < 0.31  # below on every row
    assert max(below) - min(below) > 0.15  # and by no fixed share: the gap varies by more than 15 points
    for e in stored.values():
        if e.row.name in over:
            print(f"{e.row.name}: memory_analysis's sum {e.sum_bytes / GIB:.2f} GiB, the compiler's allocation "
                  f"{e.allocated_bytes / GIB:.2f} GiB, the chip {e.estimate.chip.hbm_bytes / GIB:.2f} GiB")
    assert {"v5e 32B 1x v5e-256", "v5p 32B 1x v5p-128"} <= set(stored) & set(over)  # over by the sum...
    assert all(e.allocated_bytes <= e.estimate.chip.hbm_bytes for e in stored.values())  # ...yet every one fits

    texts = {name: load_program(e.row)[0] for name, e in stored.items() if name in over}

    def buffer(row_name: str, dtype: str, *dims: int) -> float:
        """GiB of one array whose shape the row's stored program holds (an error if it does not)."""
        text = texts[row_name]
        shape = f"{dtype}[{','.join(map(str, dims))}]"
        assert shape in text, shape
        return np.prod(dims) * {"bf16": bf16, "f32": f32}[dtype] / GIB

    v5e = stored["v5e 32B 1x v5e-256"]
    m, b = v5e.row.model, v5e.row.per_device_batch  # FSDP over all 256 chips: the chip's own 4 sequences
    saved = buffer(v5e.row.name, "bf16", m.num_layers, b, m.seq_len, m.d_model)
    table_f32 = buffer(v5e.row.name, "f32", m.vocab_size, m.d_model)
    logits = buffer(v5e.row.name, "f32", b, m.seq_len, m.vocab_size)
    print(f"v5e 32B 1x: saved layer inputs {saved:.2f} GiB ({saved / (v5e.allocated_bytes / GIB):.0%} of the "
          f"allocation), float32 embedding {table_f32:.2f} GiB, float32 logits {logits:.2f} GiB")
    assert (saved, table_f32, logits) == (5.0, 1.25, 1.0)

    v5p = stored["v5p 32B 1x v5p-128"]
    m, t = v5p.row.model, 4  # tensor parallelism 4, FSDP 32: each chip holds 32 sequences, features split 4 ways
    b = v5p.row.per_device_batch * v5p.row.chips // (v5p.row.chips // t)
    hidden = buffer(v5p.row.name, "bf16", m.num_layers, b, m.seq_len, m.d_ff // t)
    qkv = 3 * buffer(v5p.row.name, "bf16", m.num_layers, b, m.seq_len, m.num_heads // t, m.head_dim)
    out = buffer(v5p.row.name, "bf16", m.num_layers, b, m.seq_len, m.d_model // t)
    dots = hidden + qkv + out
    table_f32 = buffer(v5p.row.name, "f32", m.vocab_size // t, m.d_model)
    logits = buffer(v5p.row.name, "f32", b, m.seq_len, m.vocab_size // t)
    print(f"v5p 32B 1x: matmul outputs saved by minimal remat {dots:.0f} GiB (hidden {hidden:.0f}, q/k/v {qkv:.0f}, "
          f"output projection {out:.0f}), {dots / (v5p.allocated_bytes / GIB):.0%} of the allocation; float32 "
          f"embedding {table_f32:.2f} GiB, float32 logits {logits:.2f} GiB")
    assert (hidden, qkv, out) == (32.0, 24.0, 10.0) and dots / (v5p.allocated_bytes / GIB) > 0.7
    assert (round(table_f32, 2), logits) == (0.31, 2.0)
else:
    print(why)

# %% [markdown]
# ## Takeaways
# - A published row gives TFLOP/s per chip and MFU, not a step time. Its step is **implied**: the row's
#   own FLOP count over its TFLOP/s.
# - Compare a row on the model that was measured, read from the source's history at the row's date, and
#   under the FLOP formula of that date: MaxText used four FLOP formulas between June 2023 and today (section 1's table).
# - MFU counts the model's FLOPs; the chip also runs what remat recomputes, so its HFU is higher: with
#   full remat the chip runs each layer's forward pass twice.
# - Timed op by op, with the compiler's cycle counts where they exceed the roofline and every loop trip
#   counted, 11 of MaxText's 14 rows of 2023 land within 15% of their implied step, with no constant
#   fitted. The misses are the rows whose tensor-parallel transfers the model leaves exposed, and one
#   whose matmuls ran faster than the compiler's cycle counts.
# - On TPU, `memory_analysis()`'s sum is not the HBM a program needs: read the compiler's allocation
#   (`total_allocation_bytes` on jax 0.12, or the `default` space of its memory report).

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1: the implied step.** A row publishes 150 TFLOP/s per chip for a 7-billion-parameter model
# on TPU v5e chips (197 TFLOP/s peak), 4 sequences of 2,048 tokens per chip. Its trainer counts
# `6 N T` FLOPs per chip per step (N parameters, T tokens per chip; leave attention out). What step
# time, in seconds, does the row imply?

# %%
from spmd_course.exercises import ex16_published_runs as ex

answer_1 = NOT_ANSWERED  # seconds, a float
ex.implied_step.check(answer_1);

# %% [markdown]
# **Exercise 2: MFU against HFU.** A run with full remat reports 60% MFU, counted as `6 N T`. Full remat
# runs each layer's forward pass once more in the backward pass, so the chip runs about `8 N T` FLOPs.
# What is its hardware FLOP utilisation (HFU), as a fraction?

# %%
answer_2 = NOT_ANSWERED  # a fraction, e.g. 0.5
ex.hardware_utilisation.check(answer_2);

# %% [markdown]
# **Next:** [17 · Choosing a mesh shape](17_mesh_shape.ipynb)
