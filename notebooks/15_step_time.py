# %% [markdown]
# # 15 · Step time: compute, memory and communication
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/15_step_time.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/15_step_time.ipynb)
#
# Notebooks 07 to 14 counted bytes, but a step costs seconds: a TPU v5e chip does 241 FLOPs in the time it
# reads one byte of its memory and 1,970 in the time it sends one along a ring of chips. Whether arithmetic,
# memory or communication bounds a step, and whether communication hides, decides what a strategy costs.
#
# **You need:** notebooks 04 (compiling for a TPU topology ahead of time), 07 to 11 (DP, TP, FSDP, 2-D)
# and 13 (mixed precision, rematerialisation and their TPU compiles), `jax.jit(f).lower(...).compile()`, `compiled.cost_analysis()`,
# `jax.checkpoint` and the course's `collectives()`.
#
# You will estimate a step's time before running it, from the compiled program and three published
# numbers per chip, for one layer of an 8-billion-parameter model on a v5e slice under five strategies.
# Notebook 16 holds the same estimate against published runs.
#
# **You will learn**
# - the roofline: compute, memory and communication time per chip, and what makes a matmul
#   compute-bound (arithmetic intensity)
# - how to read FLOPs, bytes and collectives from `compiled.cost_analysis()` and `collectives()`, and
#   where the compiler's figures mislead (loops)
# - when a collective hides behind compute, the per-device batch below which FSDP's gathers dominate,
#   and the width below which tensor parallelism's sums do
# - how to record a trace with `jax.profiler.trace` and find the collectives in it.

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
import gzip
import json
import shutil
import tempfile
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (CHIPS, NOT_ANSWERED, collectives, compile_effort, draw_roofline, draw_step_terms,
                               draw_timeline, estimate_step, quiet, schedule, tpu_compiler_available)
from spmd_course.utils.published_rows import PROGRAMS

ok, why = tpu_compiler_available()


def costs(compiled):
    """`compiled.cost_analysis()` as one dict (a list of one dict on older JAX)."""
    found = compiled.cost_analysis()
    return found[0] if isinstance(found, list) else found

# %% [markdown]
# ## 1. The roofline
#
# A step does three kinds of work on each chip: arithmetic, reading and writing its memory (HBM), and
# sending data to other chips. Each has a peak rate, so each gives a lower bound on the time:
#
# | work | lower bound on its time |
# |---|---|
# | compute | FLOPs / peak FLOP/s |
# | memory | bytes read and written in HBM / HBM bandwidth |
# | communication | bytes sent / link bandwidth (ICI within a slice, the data-centre network, DCN, between slices) |
#
# If the chip overlapped the three perfectly, a step would take the largest of them, and with no overlap
# it would take their sum. Both bounds assume peak rates, so both are estimates. The figures per chip, as
# published (read 2026-11-25):
#
# | chip | bf16 peak | HBM bandwidth | ICI, both directions, per chip | DCN per chip | source |
# |---|---|---|---|---|---|
# | TPU v5e | 197 TFLOP/s | 819 GB/s | 400 GB/s over 4 ports | 2 x 100 Gb/s per 8-chip host | [cloud.google.com/tpu/docs/v5e](https://cloud.google.com/tpu/docs/v5e) |
# | TPU v5p | 459 TFLOP/s | 2,765 GB/s | 1,200 GB/s over 6 ports | 50 Gb/s | [cloud.google.com/tpu/docs/v5p](https://cloud.google.com/tpu/docs/v5p) |
# | TPU v6e | 918 TFLOP/s | 1,600 GB/s | 800 GB/s over 4 ports | 4 x 200 Gb/s per 8-chip host | [cloud.google.com/tpu/docs/v6e](https://cloud.google.com/tpu/docs/v6e) |
# | H100 SXM | 989 TFLOP/s (1,979 with 2:4 sparsity) | 3,350 GB/s | NVLink 900 GB/s | | [NVIDIA H100 datasheet](https://www.nvidia.com/en-us/data-center/h100/) |
#
# A collective along one mesh axis of a TPU torus uses that axis's two links, one per direction, so a
# chip on a ring sends at its ICI figure divided by its port count (v5e: 400 / 4 = 100 GB/s, 50 GB/s to
# each neighbour). That needs a ring: on a v5e or v6e an axis shorter than 16 chips has no wraparound
# link, so it is a line and sends at half that rate. An H100 sends half its NVLink figure to any group of
# its node. The course keeps these figures in one table, `utils.timing.CHIPS`, read here:

# %%
print(f"{'chip':<6}{'FLOPs per HBM byte':>20}{'FLOPs per ICI byte':>20}  (a ring along one axis)")
for name, chip in CHIPS.items():
    ring = chip.axis_bandwidth(16, 16)  # a full 16-chip axis: a ring
    print(f"{name:<6}{chip.peak_flops / chip.hbm_bandwidth:>20.0f}{chip.peak_flops / ring:>20.0f}")
V5E = CHIPS["v5e"]
PEAK, HBM, LINK = V5E.peak_flops, V5E.hbm_bandwidth, V5E.axis_bandwidth(16, 16)
assert round(PEAK / HBM) == 241 and round(PEAK / LINK) == 1970  # the figures this page's prose uses
assert V5E.axis_bandwidth(8, 8) == LINK / 2  # an 8-chip v5e axis has no wraparound: a line, half a ring's rate

# %% [markdown]
# These ratios are the chip's **critical intensities**. A v5e does 241 FLOPs in the time it reads one
# byte of HBM, and 1,970 in the time it sends one byte along a ring (50 GB/s to each of two neighbours).
# Work whose **arithmetic intensity** (FLOPs per byte moved) is above the first ratio keeps the chip busier
# than its memory, and above the second, busier than its links too.
#
# The scaling book ([jax-ml.github.io/scaling-book/tpus](https://jax-ml.github.io/scaling-book/tpus/),
# read 2026-11-28) prints other values for the same ratios. Both divide the peak by W, everything a chip
# sends along one axis (both directions of its two links), so only the link figure differs:
#
# | figure | scaling book | this course | why they differ |
# |---|---|---|---|
# | v5e FLOPs per HBM byte | 240 (8.1e11 B/s) | 241 (819 GB/s) | rounding |
# | v5e C/W on a ring | about 2,190 (W = 9e10) | 1,970 (W = 1e11) | one link, one way: the book's 45 GB/s against Google's 400 GB/s / 4 ports / 2 directions = 50 GB/s |
# | v5e C/W on a line (no wraparound) | 4,378 (4.5e10) | 3,940 (5e10) | the same 10%, one direction's worth in both |
# | v5p C/W on a ring | 2,550 (W = 1.8e11) | 2,295 (W = 2e11) | 90 GB/s one way against 1,200 GB/s / 6 ports / 2 directions = 100 GB/s |
#
# The gap is 10% on both chips, so it changes no rule below, only where each crossover falls. The course
# keeps Google's pages as its one source per chip, so every figure traces back to them.

# %%
BOOK = {"v5e": (1.97e14, 4.5e10), "v5p": (4.59e14, 9e10)}  # the scaling book: bf16 FLOP/s, ICI per link one way
for name, (c_book, link_book) in BOOK.items():
    chip = CHIPS[name]
    theirs, ours = c_book / (2 * link_book), chip.peak_flops / chip.axis_bandwidth(16, 16)
    print(f"{name}: C/W on a ring {theirs:,.0f} in the scaling book, {ours:,.0f} here "
          f"(a link sends {link_book / 1e9:.0f} GB/s one way there, {chip.link_bandwidth / 1e9:.0f} GB/s here)")
    assert chip.axis_bandwidth(16, 16) == 2 * chip.link_bandwidth  # the book's W: both directions of the links
    assert 0.85 < ours / theirs < 0.95  # only the link figure differs, by 10%
assert round(PEAK / V5E.axis_bandwidth(8, 8)) == 3940  # a line, the table's third row (the book: 4,378)

# %% [markdown]
# A bf16 matmul `[B, D] @ [D, F]` does `2BDF` FLOPs and moves `2(BD + DF + BF)` bytes. For `D` and `F`
# much larger than `B`, its intensity is about `B`: the rows of the batch are what reuse each weight
# once it is read. The TPU compiler counts the same, for one v5e chip:

# %%
D, F = 4096, 14336
print(f"{'B':>6}{'FLOPs':>12}{'bytes':>12}{'intensity':>10}  on a v5e")
for B in (64, 256, 1024, 4096):
    flops, moved = 2 * B * D * F, 2 * (B * D + D * F + B * F)
    bound = "compute-bound" if flops / moved > PEAK / HBM else "memory-bound"
    print(f"{B:>6}{flops:>12.3g}{moved:>12.3g}{flops / moved:>10.0f}  {bound}")
ridge_rows = PEAK / HBM * D * F / (D * F - PEAK / HBM * (D + F))  # the B at which 2BDF / 2(BD + DF + BF) = PEAK / HBM
print(f"the matmul turns compute-bound above {ridge_rows:.0f} rows")
assert 255 < ridge_rows < 265  # "about 260 rows": above 241, since the weight is read and the result written
if ok:
    with quiet():  # quiet() (utils.capture) hides libtpu's start-up lines, which say nothing about this program
        chip = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices[:1]
        one = jax.sharding.SingleDeviceSharding(chip[0])
        x, w = (jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=one) for s in ((1024, D), (D, F)))
        found = costs(jax.jit(jnp.matmul).lower(x, w).compile())
    print(f"TPU compiler, B = 1024: {found['flops']:.3g} FLOPs, {found['bytes accessed']:.3g} bytes, "
          f"{found['bytes accessed'] / (2 * (1024 * D + D * F + 1024 * F)):.1f} x the formula's")
    assert found["flops"] == 2 * 1024 * D * F
    assert found["bytes accessed"] >= 2 * (1024 * D + D * F + 1024 * F)  # at least every operand once
else:
    print(why)

# %% [markdown]
# The FLOPs agree exactly. The bytes do not, because the TPU compiler's `bytes accessed` counts what each
# tile of the matmul reads: here four times one read of each operand and one write of the result, a factor
# that changes with the shapes. So the `memory` times below come from `estimate_step`, which counts each
# operand and result once, where it lives in HBM. Below about 260 rows a v5e waits on its memory (260, not
# the ridge's 241, because the weight is read and the result written too). Training batches have thousands
# of tokens per chip, so their matmuls are compute-bound and the question becomes communication.
#
# ## 2. Five strategies at real size
#
# | | here |
# |---|---|
# | model | the feed-forward (FF) block of Llama 3 8B: `d = 4096`, `d_ff = 14336`, gated (three matrices), 176 million parameters (81% of a layer's), bf16, 32 layers |
# | slice | a v5e-8 (`v5e:2x4`) |
# | batch | 8 sequences of 2,048 tokens |
#
# A whole step loops over layers, which takes minutes to compile and misleads `cost_analysis()`, because
# it counts a loop's body once. So compile **one block's forward and backward pass** per strategy, and
# multiply by the layer count. Each compiles in under a second at the
# compiler's least effort, `O0`. At `O0` every collective is scheduled synchronously, but the matmuls and
# collectives are those of the default effort (the one `jax.jit` uses on a TPU), so what this section
# counts holds: the assert after the table checks FLOPs and bytes against formulas that do not depend on
# the effort. Section 3 reads the default effort's schedule from a stored program.

# %%
D, FF, SEQ, LAYERS, BATCH = 4096, 14336, 2048, 32, 8
P_BLOCK = 3 * D * FF  # w1 and w3 are (D, FF), w2 is (FF, D)


def ff_block(p, x):
    return x + (jax.nn.silu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"]


def block_step(p, x, dy, remat=False):
    """One block's forward pass and its backward pass, dy being the gradient arriving from above.

    With `remat`, the backward pass recomputes the block's forward pass instead of reading it back."""
    y, pull = jax.vjp(jax.checkpoint(ff_block) if remat else ff_block, p, x)
    dp, dx = pull(dy)
    return y, dp, dx


def specs(fsdp, tp):
    """Weight specs: `tp` splits the hidden dimension (w1, w3 by columns, w2 by rows), `fsdp` the other."""
    return {"w1": P(fsdp, tp), "w3": P(fsdp, tp), "w2": P(tp, fsdp)}


STRATEGIES = {  # mesh, weight specs, batch spec
    "DP": (((8,), ("data",)), specs(None, None), P("data")),
    "FSDP": (((8,), ("data",)), specs("data", None), P("data")),
    "TP": (((8,), ("model",)), specs(None, "model"), P()),
    "2-D": (((4, 2), ("data", "model")), specs(None, "model"), P("data")),
    "FSDP x TP": (((4, 2), ("data", "model")), specs("data", "model"), P("data")),
}


def compile_block(devices, mesh_shape, weight_specs, batch_spec, d=D, ff=FF, tokens=BATCH * SEQ, remat=False,
                  effort="O0"):
    """One block's step, compiled for `devices`; `effort="O0"` is the compiler's least effort, None its default."""
    shape, names = mesh_shape
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)
    sizes = {"w1": (d, ff), "w3": (d, ff), "w2": (ff, d)}
    p = {k: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, weight_specs[k]))
         for k, s in sizes.items()}
    x = jax.ShapeDtypeStruct((tokens, d), jnp.bfloat16, sharding=NamedSharding(mesh, batch_spec))
    out = (x.sharding, {k: v.sharding for k, v in p.items()}, x.sharding)
    with compile_effort(effort), quiet():  # None: the compiler's default
        return jax.jit(partial(block_step, remat=remat), out_shardings=out).lower(p, x, x).compile(), mesh


if ok:
    with quiet():
        v5e_8 = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    blocks = {name: compile_block(v5e_8, *s) for name, s in STRATEGIES.items()}  # O0, the least effort
else:
    print(why)

# %% [markdown]
# The table's columns, per chip, for 32 layers on a v5e (`estimate_step` and `collectives()` count every
# loop by its trips, `cost_analysis()` a loop's body once):
#
# | column | what it is |
# |---|---|
# | TFLOP/chip | matmul FLOPs, op by op |
# | 6NT | `6 x parameters x tokens` / chips: 2 for the forward matmuls, 4 for the backward's two |
# | compiler | `cost_analysis()`'s FLOPs |
# | compute, memory, comm | FLOPs / peak, HBM traffic (operands and results outside on-chip memory) / HBM bandwidth, ring bytes sent (`collectives()`) / link |
# | op by op | `estimate_step`'s step: the program in its scheduled order, transfers hidden where the schedule lets them, over this slice's links as they are (a v5e-8's axes are lines, not rings) |

# %%
def estimate(compiled, mesh, p_block=P_BLOCK, layers=LAYERS, tokens=BATCH * SEQ, per_token=6):
    """Seconds of compute, memory and communication per step: the compiled block's figures x layers.

    `per_token`: FLOPs per parameter per token, 6 for a forward and a backward pass."""
    # use_cycles=False: the roofline of each op, because the blocks are compiled at O0, whose cycle counts are
    # not a scheduled program's (notebook 16 times default-effort programs with them)
    found, sent, step = costs(compiled), collectives(compiled), estimate_step(compiled, mesh, use_cycles=False)
    return {
        "flops": step.flops, "compiler flops": found["flops"], "6NT": per_token * p_block * tokens / mesh.size,
        "loops": any(op.in_loop for op in sent.ops), "sent": sent.estimated_bytes, "collectives": sent,
        "compute": layers * step.flops / PEAK,
        "memory": layers * step.hbm_bytes / HBM,
        "comm": layers * sent.estimated_bytes / LINK,
        "op by op": layers * step.seconds, "step": step,
    }


if ok:
    est = {name: estimate(*blocks[name]) for name in STRATEGIES}
    print(f"{'':<10}{'TFLOP/chip':>11}{'6NT':>7}{'compiler':>9}{'compute':>9}{'memory':>8}{'comm':>8}  bound by"
          f"{'op by op':>10}")
    for name, e in est.items():
        bound = max(("compute", "memory", "comm"), key=e.get)
        print(f"{name:<10}{e['flops'] / 1e12:>11.2f}{e['6NT'] / 1e12:>7.2f}{e['compiler flops'] / 1e12:>9.2f}"
              f"{e['compute']:>8.2f}s{e['memory']:>7.2f}s{e['comm']:>7.2f}s  {bound:<8}{e['op by op']:>9.2f}s"
              + ("  (loop inside)" if e["loops"] else ""))
    for name, e in est.items():  # every matmul counted, loops by their trips: 6NT within 1%
        assert abs(e["flops"] / e["6NT"] - 1) < 0.01, name
    assert est["FSDP"]["compiler flops"] < 0.9 * est["FSDP"]["flops"]  # cost_analysis: the loop's body once
    assert all(max(("compute", "memory", "comm"), key=e.get) == "compute" for e in est.values())
    assert min(est["TP"]["comm"], est["FSDP"]["comm"]) > est["DP"]["comm"]  # both send more than DP (see below)
else:
    print(why)

# %% [markdown]
# No estimate counts attention (its projections and `S x S` scores add about a third again), the
# optimizer update, the embedding or the loss.
#
# Every strategy divides the same work by 8, 2 TFLOP per chip per block, and its matmuls counted op by op
# match `6NT` within 1%. FSDP's `cost_analysis()` reports less, because the TPU compiler turned each weight
# gradient's reduce-scatter into a loop that overlaps pieces of the matmul with the transfer of others (a
# *collective matmul*, `windowed_dot_general_body_rs`). The loop runs twice, and `cost_analysis()` counts
# its body once.
#
# What each sends differs: DP all-reduces every gradient, FSDP gathers the bf16 weights and reduce-scatters
# the gradients, TP all-reduces activations, and 2-D and FSDP x TP pay for both over smaller groups. Two
# compiled figures differ from the textbook ring, and both are the compiler's doing (the hidden cell below
# checks them):
#
# | strategy | textbook ring, per block | compiled | why |
# |---|---|---|---|
# | FSDP | `3.5N` bytes, as DP | `4N` bytes (672 MiB) | each gradient's loop sends 4 pieces per trip, twice, and 1 after it: 9 pieces of a shard where a ring sends 7 |
# | TP | 2 all-reduces of `[t, d]` | 3 | the backward pass sums the two partial input gradients, from `w1` and from `w3`, separately instead of adding them first |
#
# With this batch the two come out equal, 704 MB per block, both more than DP's 616 MB: three sums of
# `[16384, 4096]` happen to weigh what four copies of the block's weights weigh.
#
# **Pop quiz.** FSDP and TP send the same 704 MB per block over the same 8 chips. Which of the two does
# `estimate_step` make wait longer for its transfers?
#
# <details><summary>Answer</summary>
#
# FSDP, about 1.6 times longer, because its bytes travel differently. The 8-chip axis of a 2x4 slice spans
# both torus axes, so an all-gather or an all-reduce over it uses the links of both at once, 100 GB/s per
# chip. FSDP's gradient loop sends its pieces with `collective-permute`s, each to one neighbour over one
# link, so at 50 GB/s. The cell below asserts it.
#
# </details>
#
# The bars stack each strategy's terms on one seconds axis: matmul FLOPs, HBM time beyond them, and the
# transfers the step waits for, which at `O0` are all of them because every collective is synchronous.
# `draw_step_terms` uses the timeline's greys, because colour means device in this course.

# %%
if ok:
    steps = {name: e["step"] for name, e in est.items()}
    exposed = {name: LAYERS * s.comm_exposed for name, s in steps.items()}
    print("exposed communication per step: " + ", ".join(f"{name} {t:.2f} s" for name, t in exposed.items()))
    assert est["FSDP"]["sent"] == est["TP"]["sent"]  # the same bytes ...
    assert exposed["FSDP"] > 1.5 * exposed["TP"]  # ... but FSDP's permutes use one link: the quiz's answer
    fsdp_permutes = [op for op in steps["FSDP"].timeline if op.kind == "collective-permute"]
    assert fsdp_permutes and not any(op.kind == "collective-permute" for op in steps["TP"].timeline)
    assert sum(op.exposed * op.trips for op in fsdp_permutes) > 0.5 * steps["FSDP"].comm_exposed  # the permutes wait
    rate = {op.kind: op.bytes / op.seconds for op in steps["FSDP"].timeline  # bytes moved per second, per op
            if op.kind in ("collective-permute", "all-gather") and op.seconds > 0}
    assert np.isclose(rate["collective-permute"], V5E.link_bandwidth)  # one link: 50 GB/s
    assert rate["collective-permute"] < 0.6 * rate["all-gather"]  # a gather over the axis uses both torus axes
    compute = [s.compute for s in steps.values()]
    assert max(compute) / min(compute) < 1.01  # every bar starts with the same matmul time
    by_step = sorted(steps, key=lambda name: steps[name].seconds)
    assert by_step[0] == min(exposed, key=exposed.get) == "2-D"  # the least exposed communication wins
    assert min(est, key=lambda name: est[name]["sent"]) == "2-D"  # 2-D also sends the fewest bytes
    assert by_step[-1] == max(exposed, key=exposed.get) == "FSDP"
    assert max(LAYERS * s.memory for s in steps.values()) < 0.1  # HBM beyond FLOPs: under a tenth of a second
else:
    print(why)
terms_fig = draw_step_terms(steps, scale=LAYERS, title="five strategies for the FF block on a TPU v5e-8, "
                            "32 layers at O0, estimated op by op") if ok else None
terms_fig

# %% [markdown]
# Every bar starts with the same 350 ms of matmuls, so what follows them decides the order. 2-D is the
# fastest, because it sends the fewest bytes, over groups of 4 and 2. FSDP is the slowest, because of its
# single-link permutes. HBM time beyond the FLOPs stays under a tenth of a second in every strategy.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The TPU compiler's exact figures, §2: what each strategy sends per block
if ok:
    fsdp, dp, tp = (est[name]["collectives"] for name in ("FSDP", "DP", "TP"))
    permutes = [op for op in fsdp.ops if op.kind == "collective-permute"]
    print(f"FSDP: {fsdp.count('all-gather')} weight gathers and {fsdp.count('collective-permute')} collective-permutes "
          f"({sum(op.in_loop for op in permutes)} stated in loop bodies that run {max(op.trips for op in permutes)} "
          f"times), {est['FSDP']['sent'] / 2**20:,.0f} MiB; DP {est['DP']['sent'] / 2**20:,.0f} MiB; "
          f"TP {tp.count('all-reduce')} all-reduces, {est['TP']['sent'] / 2**20:,.0f} MiB")
    assert fsdp.count("collective-permute") == 3 * (4 * 2 + 1)  # per gradient: 4 per trip, 2 trips, 1 after
    assert est["FSDP"]["sent"] == 2 * (2 * P_BLOCK)  # 4N bytes: 7/8 of the weights gathered, 9/8 scattered
    assert est["DP"]["sent"] == 2 * 7 / 8 * (2 * P_BLOCK)  # 3.5N bytes: a ring all-reduce of the gradients
    assert tp.count("all-reduce") == 3  # one in the forward pass, two in the backward pass
    assert est["TP"]["sent"] == 3 * 2 * 7 / 8 * (2 * BATCH * SEQ * D)  # each a ring all-reduce of [t, d] in bf16
else:
    print(why)

# %% [markdown]
# ## 3. When communication hides
#
# A collective can run while the chip computes something it does not depend on. It costs nothing extra
# if its time is below that compute:
#
# `bytes sent / W  <  FLOPs it can overlap / C`, with C the peak FLOP/s and W the link bandwidth.
#
# What it can overlap is limited by what waits for what: a forward pass's transfers cannot hide behind a
# backward pass that needs their result. So compare each pass's bytes with that pass's FLOPs.
#
# **FSDP.** In the forward pass each chip gathers the block's weights, `(n-1)/n x 2N` bytes in bf16, while
# it computes the forward matmuls, `2N x t` FLOPs for `t` tokens per chip. The gathers hide when
# **t > (n-1)/n x C/W**, about C/W: 1,970 tokens per chip on a large v5e axis, 1,720 on 8 chips. The
# backward pass reduce-scatters the gradients (`9/8 x 2N` bytes as compiled here) against `4N x t` FLOPs,
# which needs only `t > (9/16) C/W`. The forward pass binds, and the per-device batch is what matters,
# not the model size.
#
# **TP.** In the forward pass each chip all-reduces the block's output, `[t, d]` in bf16, so a ring sends
# `2(M-1)/M x 2td` bytes, while it computes `6 d d_ff t / M` FLOPs (three matmuls) on an axis of `M` chips.
# The `t` cancels: the sum hides when **d_ff / M > (2/3)(M-1)/M x C/W**, whatever the batch. The backward
# pass sends two such sums (the compiler's third all-reduce) against twice the FLOPs, which gives the same
# rule. A v5e asks for `d_ff / M` above about 1,150 on 8 chips and 1,310 on a large axis. 8-way TP of this
# block gives 1,792, a margin of 1.6, and 16-way (896) would not hide. So TP axes stay small, and TP is
# chosen for memory, not bytes.
#
# The scaling book's rules ([jax-ml.github.io/scaling-book/training](https://jax-ml.github.io/scaling-book/training/))
# have the same shape with simpler factors:
#
# | rule | scaling book | here | why they differ |
# |---|---|---|---|
# | FSDP's gathers hide | `t > C/W` (2,550 on a v5p) | `t > (n-1)/n x C/W` | the book rounds the ring's `(n-1)/n` to 1 |
# | TP's sums hide | `d_ff / M > C/W` | `d_ff / M > (2/3)(M-1)/M x C/W` | the book's block has two matrices, `4 d d_ff t / M` FLOPs per sum, this gated block three (`6`), so here the threshold is 2/3 of the book's |
#
# Pooling the whole step's bytes against its FLOPs gives looser rules, `(2/3) C/W` for FSDP and `(4/9) C/W`
# for TP, because it lets forward transfers hide behind the backward pass. `per_pass` checks the per-pass
# rules on the compiled programs. It splits `estimate_step`'s timeline by each op's `op_name`, where
# `transpose(jvp())` marks the backward pass (FSDP's weight gathers, named after the weights, belong to the
# forward pass).

# %%
RING = {"all-gather": 7 / 8, "all-reduce": 2 * 7 / 8, "collective-permute": 1.0}  # bytes sent per byte, 8 chips


def per_pass(e, backward):
    """(FLOPs, ring bytes sent) of one pass of a compiled block, every loop trip counted."""
    flops = sent = 0.0
    for op in e["step"].timeline:
        late = "transpose(" in op.op_name
        if op.lane == "compute" and late == backward:
            flops += op.flops * op.trips
        elif op.kind in RING and late == backward:
            sent += RING[op.kind] * op.bytes * op.trips
    return flops, sent


if ok:
    tokens = BATCH * SEQ // 8
    print(f"{'':<6}{'pass':<10}{'hides above':>13}{'rule':>9}")
    for backward, rule in ((False, 7 / 8), (True, 9 / 16)):
        flops, sent = per_pass(est["FSDP"], backward)
        crossover = tokens * (sent / LINK) / (flops / PEAK)  # the tokens per chip where the two times meet
        print(f"{'FSDP':<6}{'backward' if backward else 'forward':<10}{crossover:>13,.0f}{rule * PEAK / LINK:>9,.0f}"
              "  tokens per chip")
        assert abs(crossover / (rule * PEAK / LINK) - 1) < 0.05
    for backward in (False, True):
        flops, sent = per_pass(est["TP"], backward)
        ratio, rule = (flops / PEAK) / (sent / LINK), FF / 8 / (2 / 3 * 7 / 8 * PEAK / LINK)
        print(f"{'TP':<6}{'backward' if backward else 'forward':<10}{ratio:>13.2f}{rule:>9.2f}"
              "  compute / communication, at any batch")
        assert abs(ratio / rule - 1) < 0.05
else:
    print(why)

# %% [markdown]
# Each pass meets its rule within 5%, so with every loop trip and the compiler's third all-reduce counted,
# nothing is left unexplained. Hiding also needs the schedule to allow it. A compiled program lists its
# instructions in the order the chip runs them, and whatever runs between an asynchronous collective's
# `...-start` and `...-done` overlaps the transfer. At `O0` nothing runs there, so read the schedule at the
# default effort, the one a run gets.
#
# That compile takes 10-15 s of CPU, more than this page's budget. So the course stores the text
# (`compiled.as_text()`) of `compile_block(..., effort=None)` in `data/step_time`, and
# `tests/test_15_step_time.py` compiles it again to check it is the same program. The course's tools read
# that text as they read a compiled program. Set `COMPILE_HERE = True` to compile it yourself. `utils.schedule` lists the step in the order it runs,
# with the matmuls inside each asynchronous collective's window:

# %%
COMPILE_HERE = False  # True: compile FSDP's block at the default effort here (10-15 s of CPU)
if ok:
    mesh_8 = blocks["FSDP"][1]
    if COMPILE_HERE:
        fsdp_default = compile_block(v5e_8, *STRATEGIES["FSDP"], effort=None)[0]  # None: the default effort
    else:
        fsdp_default = gzip.decompress((PROGRAMS.parent / "step_time" / "fsdp_block_v5e-2x4.hlo.gz").read_bytes()).decode()
    assert collectives(fsdp_default).counts == est["FSDP"]["collectives"].counts  # the same collectives as at O0
    fsdp_steps = schedule(fsdp_default, mesh_8)
    w = [(s.kind, s.overlaps) for s in fsdp_steps if s.asynchronous]
    print(f"FSDP {len(w):>2} asynchronous collectives, {sum(n > 0 for _, n in w):>2} with matmuls inside: "
          + ", ".join(sorted({k for k, _ in w})))
    assert any(s.overlaps > 0 for s in fsdp_steps)  # FSDP's transfers overlap its matmuls
else:
    print(why)

# %% [markdown]
# The TPU compiler overlaps FSDP's traffic in its own way: it cuts each weight gradient's reduce-scatter
# into a ring of `collective-permute`s, each started before a matmul on one piece and finished after it (a
# *collective matmul*, which makes the loops of section 2). The weights' gathers stay `all-gather`s,
# started early. A sum is different, because it needs the matmul that produces it. Within one block, DP's
# gradient all-reduce has no later work left to hide behind, although across layers it can overlap the
# next layer's backward pass. TP's sums cannot hide by rescheduling either, because each waits for the
# matmul that produces it and the next matmul waits for it. MaxText's scripts turn on libtpu flags for this
# (`--xla_tpu_enable_async_collective_fusion`, `--xla_tpu_overlap_compute_collective_tc` and others, set
# in `LIBTPU_INIT_ARGS`). Read the schedule before assuming a collective hides.
#
# Drawn on a time axis, FSDP's step at the default effort has one lane for the chip's work and one for
# the transfers over `data`, each op as long as `estimate_step` times it. A transfer is hatched where it
# runs beside a matmul and black where the chip waits for it, so the black is what communication costs.
# Each gradient's reduce-scatter loop is drawn once, framed and marked with its trip count.

# %%
if ok:
    assert all(s.overlaps > 0 for s in fsdp_steps if s.kind == "collective-permute")  # every ring step hides
    fsdp_step = estimate_step(fsdp_default, mesh_8, use_cycles=False)  # the roofline of each op, as in section 2
    assert fsdp_step.flops == est["FSDP"]["flops"]
    print(f"FSDP block on a v5e-8: {fsdp_step.seconds * 1e3:.2f} ms estimated, {fsdp_step.comm_hidden * 1e3:.2f} ms "
          f"of collectives hidden behind work, {fsdp_step.comm_exposed * 1e3:.2f} ms exposed")
    assert fsdp_step.comm_hidden > 0  # part of the traffic runs beside matmuls, as the schedule promised
else:
    print(why)
fsdp_fig = draw_timeline(fsdp_step, title="one FSDP block's step on a TPU v5e-8 (default effort), estimated "
                         "op by op") if ok else None
fsdp_fig

# %% [markdown]
# The same step's ops on a roofline: each op that reads HBM sits at its arithmetic intensity (FLOPs per
# byte of HBM traffic) and the FLOP/s `estimate_step` gives it, under the v5e's two roofs (ops without
# FLOPs, elementwise work and copies, have no place on it). Every matmul sits right of the ridge, on the
# flat roof, because 2,048 tokens per chip reuse each weight 2,048 times. The star is the whole step: below
# the roof by what memory-bound ops and exposed transfers cost it.

# %%
if ok:
    ridge = PEAK / HBM
    matmuls = [op for op in fsdp_step.timeline if op.lane == "compute" and op.flops > 0 and op.bytes > 0]
    print(f"{len(matmuls)} ops with FLOPs; intensity from {min(op.flops / op.bytes for op in matmuls):,.0f} to "
          f"{max(op.flops / op.bytes for op in matmuls):,.0f} FLOPs per byte, ridge {ridge:.0f}; the step reaches "
          f"{fsdp_step.flops / fsdp_step.seconds / PEAK:.0%} of peak")
    big = max(matmuls, key=lambda op: op.flops)
    assert big.flops / big.bytes > ridge  # the largest matmul is compute-bound ...
    assert fsdp_step.flops / fsdp_step.seconds < PEAK  # ... and the whole step attains less than the peak
roof_fig = draw_roofline(fsdp_step, title="one FSDP block's step on a TPU v5e-8: each op on the roofline") if ok else None
roof_fig

# %% [markdown]
# Where does each strategy stop hiding? Hold the block and the chip fixed and vary the tokens per chip
# `t`. Matmul time grows with `t`. FSDP's bytes do not, because the weights are the same size at any batch,
# while TP's do, because it sums activations. A pass whose transfers hide behind its matmuls takes
# `max(matmul time, transfer time)`, here from `per_pass`'s compiled FLOPs and bytes scaled to each `t`.
# FSDP meets its compute floor at the forward rule, `(7/8) C/W` = 1,724 tokens. TP's ratio does not change
# with `t`, so it stays on the floor at every batch (its `d_ff / M` is above `(2/3)(7/8) C/W`).

# %%
if ok:
    t_chip = np.geomspace(128, 16384, 385)
    sweep = {}
    for name, t_compiled in (("FSDP", BATCH * SEQ // 8), ("TP", BATCH * SEQ)):  # TP: every chip sees the batch
        step_s = floor_s = 0.0
        for backward in (False, True):
            flops, sent = per_pass(est[name], backward)
            compute = flops / PEAK * t_chip / t_compiled
            comm = sent / LINK * (t_chip / t_compiled if name == "TP" else 1.0)
            step_s, floor_s = step_s + np.maximum(compute, comm), floor_s + compute
        sweep[name] = step_s / floor_s  # 1: communication hidden; above 1: the step waits for it
    hides = t_chip[np.argmax(sweep["FSDP"] <= 1 + 1e-9)]
    print(f"FSDP reaches its compute floor at {hides:,.0f} tokens per chip (rule (7/8) C/W = {7 / 8 * PEAK / LINK:,.0f}); "
          f"at 512 tokens it takes {np.interp(512, t_chip, sweep['FSDP']):.2f}x its matmul time. "
          f"TP: {sweep['TP'].min():.2f}x to {sweep['TP'].max():.2f}x at every batch")
    assert abs(hides / (7 / 8 * PEAK / LINK) - 1) < 0.05  # the per-pass rule, from the compiled bytes
    assert np.allclose(sweep["TP"], 1.0)  # TP hides at any batch here: d_ff / M = 1,792 > (2/3)(7/8) C/W
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, style in (("FSDP", "-"), ("TP", "--")):
        ax.plot(t_chip, sweep[name], style, color="black", label=f"{name}, 8 chips, this block")
    ax.axvline(7 / 8 * PEAK / LINK, color="0.5", linestyle=":", linewidth=1)
    ax.text(7 / 8 * PEAK / LINK * 1.05, sweep["FSDP"].max() * 0.9, "FSDP's rule: t = (7/8) C/W", fontsize=8)
    ax.set(xscale="log", xlabel="tokens per chip, t", ylabel="estimated step / matmul time",
           title="when each strategy stops hiding its communication (TPU v5e, bf16)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
sweep_fig = fig if ok else None
sweep_fig

# %% [markdown]
# ## 4. A profiler trace
#
# `jax.profiler.trace` records what every device ran, when, and for how long. Record two steps of a small
# data-parallel train step on this kernel's 8 devices into a temporary folder. With
# `create_perfetto_trace=True` it also writes `perfetto_trace.json.gz`, plain JSON.

# %%
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
w = jax.device_put(jnp.ones((256, 256)), NamedSharding(mesh, P()))
xb = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P("data")))
train_step = jax.jit(lambda w, x: w - 0.1 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w))
train_step(w, xb).block_until_ready()  # compile before recording

folder = Path(tempfile.mkdtemp())
try:
    with quiet(), jax.profiler.trace(folder, create_perfetto_trace=True):
        for _ in range(2):
            w = train_step(w, xb)
        w.block_until_ready()
    written = sorted(p.name for p in folder.rglob("*") if p.is_file())
    (perfetto,) = folder.rglob("perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(perfetto.read_bytes()))["traceEvents"]
finally:
    shutil.rmtree(folder)
print("written:", written)
ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
sums = [e for e in ops if e["args"]["hlo_op"].startswith("all-reduce")]
print(f"{len(ops)} operations on the devices' timelines, {len(sums)} of them all-reduces, on devices "
      f"{sorted({int(e['args'].get('device_ordinal', e['pid'])) for e in sums})}")  # a GPU trace may lack the ordinal
assert {"perfetto_trace.json.gz"} <= set(written) and any(n.endswith(".xplane.pb") for n in written)

# %% [markdown]
# The trace holds one timeline per device, with the gradient's all-reduce once per step. Durations mean
# little here, because these devices are simulated on the CPU. On a TPU or GPU the same call records the
# accelerator's timeline. To look at it, keep the folder (pass your own path)
# and drop `perfetto_trace.json.gz` on [ui.perfetto.dev](https://ui.perfetto.dev), or open the folder in
# XProf (`xprof --logdir=FOLDER`, or TensorBoard's profile plugin) for its trace viewer and op profile.
# Communication that hides shows as a collective beside a matmul, and communication that does not shows
# as a gap in the compute.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: the trace's all-reduces
if CPU:  # another backend's trace names its operations its own way
    assert len(sums) == 2 * 8  # one gradient all-reduce per step on each of the 8 devices
    assert {e["args"]["hlo_module"] for e in sums} == {sums[0]["args"]["hlo_module"]}  # all from the train step
    print(f"CPU trace: {len(sums)} all-reduces, 2 steps x 8 devices, all from {sums[0]['args']['hlo_module']}")

# %% [markdown]
# ## Takeaways
# - A step takes at least the largest of FLOPs / peak FLOP/s, HBM bytes / HBM bandwidth and bytes sent /
#   link bandwidth, per chip, and at most their sum. Each is an estimate that assumes peak rates.
# - A matmul's intensity is about its rows per weight: a v5e needs about 240 to outrun its HBM, about
#   2,000 to outrun its links.
# - Count a loop by its trips: `cost_analysis()` counts a loop's body once, even the loops the compiler
#   makes itself (FSDP's gradient reduce-scatter). `estimate_step` and `collectives()` count every trip.
#   Check the FLOPs against `6 x parameters x tokens`.
# - Compare each pass's bytes with that pass's FLOPs. FSDP's gathers hide above about `C/W` tokens per chip.
#   TP's sums hide when `d_ff / M` is above about `(2/3) C/W`, whatever the batch, so keep TP axes small.
# - The same bytes can cost different times: a `collective-permute` uses one link, while an all-gather or
#   all-reduce over a mesh axis uses every torus link that axis spans.
# - The estimate finds the bound and which term sets it. A profiler trace of the real run finds the rest.
#   `jax.profiler.trace(..., create_perfetto_trace=True)` writes a file for ui.perfetto.dev.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1: predict a step's compute time.** A 1.3-billion-parameter model trains with data
# parallelism on 8 H100s, a global batch of 64 sequences of 2,048 tokens, in float32 without tensor
# cores (67 TFLOP/s per GPU). How many seconds of compute does one step take per GPU, at peak?

# %%
from spmd_course.exercises import ex15_step_time as ex

answer_1 = NOT_ANSWERED  # seconds, a float
ex.compute_seconds.check(answer_1);

# %% [markdown]
# **Exercise 2: the crossover batch.** Under data parallelism on a v6e slice, each chip all-reduces
# every gradient of an `N`-parameter model in bf16 over a ring of 16 chips, during a backward pass that
# does `4N` FLOPs per token. Above how many tokens per chip does that all-reduce take less time than the
# backward pass? Use section 1's figures for the v6e (918 TFLOP/s and 200 GB/s sent per chip).

# %%
answer_2 = NOT_ANSWERED  # tokens per chip
ex.crossover_tokens.check(answer_2);

# %% [markdown]
# **Exercise 3: count a loop by its trips.** Section 2's FSDP program, `blocks["FSDP"][0]`, reduce-scatters
# each weight gradient in a loop the compiler wrote. `collectives(program).ops` lists each collective
# instruction once, a loop body's too, with `in_loop` and `trips` (how many times it runs per step). How many
# `collective-permute`s does one step run on each chip? Read it from the ops, not from `count()`.

# %%
answer_3 = NOT_ANSWERED  # collective-permutes per step, an int
ex.loop_permutes.check(answer_3);

# %% [markdown]
# **Next:** [16 · The estimate held against published runs](16_published_runs.ipynb)
