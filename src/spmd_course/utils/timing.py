"""How long one step takes: the compiled program read op by op, each op timed at a chip's published rates.

:func:`estimate_step` walks the compiled per-device program (``compiled.as_text()``) in the order the
compiler scheduled it, runs every loop body as many times as its trip count (read from the program),
and times each instruction:

- an op that computes (a fusion, a matmul, a copy, a custom call...) by its roofline,
  ``max(FLOPs / peak, HBM bytes / HBM bandwidth)``. FLOPs are the matmuls' (``dot`` and ``convolution``,
  which is how the TPU compiler writes a matmul inside a fusion), from their shapes; elementwise work
  counts only through its bytes. HBM bytes are the operands and results that live in HBM: a TPU layout
  ending in ``S(1)`` is on-chip VMEM and is skipped; a stacked operand only sliced (``dynamic-slice``)
  counts the slice, an in-place ``dynamic-update-slice`` the update.
- a collective by its bytes over the links its groups use (:func:`collective_seconds`);
- a transfer to or from host memory (layout ``S(5)``) over the host link (PCIe);
- an asynchronous collective or copy (``-start``/``-done``, ``async-start``, the TPU's
  ``AsyncCollectiveStart`` chains) runs beside the ops scheduled between its start and its done: it costs
  only what it exceeds them by (``exposed``); a synchronous one costs its whole time. Transfers on the same
  lane (one mesh axis, the host link) queue behind each other.

The roofline and the TPU compiler's own per-op figure: every matmul fusion of a TPU program carries
``"estimated_cycles"`` in its ``backend_config`` (``as_text()`` has it; no dump needed), kept here in
:attr:`TimedOp.cycles`. Read at the v5e's 1.5 GHz (197e12 / (4 MXUs x 128 x 128 x 2)), against FLOPs / peak
(jax 0.12.0.1, libtpu 0.0.50.1, bf16, one chip unless said)::

    matmul                                       cycles      time    FLOPs/peak   ratio
    [8192,4096] @ [4096,4096]                 2,148,824   1.43 ms     1.40 ms     1.03
    [4096,4096] @ [4096,4096]                 1,083,068   0.72 ms     0.70 ms     1.03
    [2048,2048] @ [2048,2048]                   143,032   95.4 us     87.2 us     1.09
    [1024,1024] @ [1024,4096]                    81,844   54.6 us     43.6 us     1.25
    [128,4096] @ [4096,4096]                     41,093   27.4 us     21.8 us     1.26
    [8,4096] @ [4096,4096]                       13,048    8.7 us      1.4 us     6.4  (its weight's read: 41 us)
    [1024,1024] @ [1024,4096], inside an        764,448    510 us     43.6 us    11.7
      FSDP block's step on v5e:2x4

Large compute-bound matmuls agree within 3% (``tests/test_timing.py`` checks 5%). Smaller ones cost more
cycles than FLOPs / peak (tiles the MXU fills only partly, the fused epilogue), and the cycles ignore HBM: the
memory-bound row is below its weight's read. So by default (``use_cycles=True``) a matmul fusion takes
``max(FLOPs / peak, cycles / clock, HBM bytes / bandwidth)``: the compiler's schedule of the matrix units,
never faster than the chip's published rates. In the full-size MaxText programs (``utils.published_rows``)
the cycles run 1.0-1.4x the roofline for the feed-forward matmuls and up to 2.2x for attention's, and they
move every published row's estimate from 0.71-1.10 of the implied step to 0.88-1.29 (11 of 14 rows inside
0.85-1.15). ``use_cycles=False`` gives the pure roofline, a floor; use it for a program compiled below the
default effort (``jax_optimization_level`` O0), whose cycle counts are not a scheduled program's: MaxText's 16B
row compiled at O0 comes out at 96.5 s with them and 9.1 s without, against 12.1 s at the default effort.
Non-matmul fusions and collectives carry no cycles; a chip without a known clock (:attr:`Chip.clock_hz`) uses
the roofline.

No efficiency constant: every rate is the chip's published figure (:data:`CHIPS`). A custom call's FLOPs are
the ones its kernel declares: a Pallas kernel lowered with a ``cost_estimate`` (JAX's TPU flash attention
forward has one) carries it in its ``backend_config``; one without (its backward kernels) counts by its bytes.
On TPU a synchronous ``collective-permute`` is a transfer over one link that the core does not wait for until
its result is used: the compiler schedules the windowed matmul loops' independent matmul between the two, so
it is timed like an asynchronous one ending at its first user, and its two directions queue separately.
Not modelled: latency per hop, contention between transfers on different lanes, f32 matmuls' lower rate
(counted at the bf16 peak), vector-unit time.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .inspecting import (
    _BITS,
    _KIND,
    _axes,
    _event,
    _groups,
    _hlo_text,
    _Instr,
    _parse_module,
    _Printed,
    _trip_count,
    _tuple_elements,
    format_bytes,
)

__all__ = ["CHIPS", "Chip", "StepEstimate", "TimedOp", "chip_of", "collective_seconds", "estimate_step"]


@dataclass(frozen=True)
class Chip:
    """One accelerator's published figures, per chip.

    ``peak_flops``: dense bf16 FLOP/s; ``hbm_bandwidth``: bytes/s; ``hbm_bytes``: usable HBM as the compiler
    reports it; ``link_bandwidth``: bytes/s one ICI (or NVLink) link carries in one direction; ``links``:
    links per chip; ``torus``: dimensions of the torus (0: a switch, any group uses every link);
    ``wrap_multiple``: a torus axis whose full length is a multiple of this (and at least it) has a
    wraparound link, so a ring along it uses both directions of both links; a shorter axis is a line, half
    that; ``dcn_bandwidth``: bytes/s one chip sends between slices (its host's NICs shared by its chips);
    ``host_bandwidth``: bytes/s between the chip and its host's memory (PCIe); ``device_kind``: what
    ``jax.Device.device_kind`` says; ``source``: where the figures come from; ``clock_hz``: the matrix units'
    clock, ``peak_flops / (MXUs x 128 x 128 x 2)``, which turns the TPU compiler's ``estimated_cycles`` into
    seconds (None where the MXU count is not published: the cycles are then not used).
    """

    name: str
    device_kind: str
    peak_flops: float
    hbm_bandwidth: float
    hbm_bytes: int
    link_bandwidth: float
    links: int
    torus: int
    wrap_multiple: int
    dcn_bandwidth: float
    host_bandwidth: float
    source: str
    clock_hz: float | None = None

    def axis_bandwidth(self, length: int, full_length: int) -> float:
        """Bytes/s one chip sends along one torus axis to a group of ``length`` chips on an axis of
        ``full_length``: both directions of its two links on a ring (the group is the whole axis and the
        axis wraps), one direction's worth on a line (scaling-book: no wraparound doubles a collective)."""
        if self.torus == 0:  # a switch: every link serves every group
            return self.links * self.link_bandwidth
        ring = length == full_length and full_length >= self.wrap_multiple and full_length % self.wrap_multiple == 0
        return (2 if ring else 1) * self.link_bandwidth

GiB = 2**30
# Figures as published (read 2026-11-27): cloud.google.com/tpu/docs/{v5e,v5p,v6e} for peak, HBM, ICI per chip
# ("bidirectional", divided here by 2 directions and the port count: v5e 400 GB/s over 4 ports = 50 GB/s per link
# one way) and DCN (v5e: 2 x 100 Gb/s per 8-chip host; v5p: 50 Gb/s per chip; v6e: 4 x 200 Gb/s per 8-chip host);
# the scaling-book ("How to think about TPUs") for the wraparound rule and PCIe (1.5e10 B/s per chip, v6e 3.2e10);
# usable HBM as the TPU compiler reports it when a program does not fit ("exceeds available HBM (15.75G)").
# H100 SXM: NVIDIA's datasheet (989 TFLOP/s dense bf16, 3.35 TB/s, 80 GB, NVLink 900 GB/s over 18 links, both
# directions), PCIe Gen5 x16 (64 GB/s one way), one 400 Gb/s InfiniBand NIC per GPU.
CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", "TPU v5 lite", 197e12, 819e9, int(15.75 * GiB), 50e9, 4, 2, 16, 200e9 / 8 / 8, 15e9,
                "cloud.google.com/tpu/docs/v5e", clock_hz=197e12 / (4 * 128 * 128 * 2)),  # 4 MXUs: 1.5 GHz
    "v5p": Chip("v5p", "TPU v5", 459e12, 2765e9, int(95.73 * GiB), 100e9, 6, 3, 4, 50e9 / 8, 15e9,
                "cloud.google.com/tpu/docs/v5p", clock_hz=459e12 / (8 * 128 * 128 * 2)),  # 2 cores x 4 MXUs
    "v6e": Chip("v6e", "TPU v6 lite", 918e12, 1600e9, int(31.24 * GiB), 100e9, 4, 2, 16, 4 * 200e9 / 8 / 8, 32e9,
                "cloud.google.com/tpu/docs/v6e"),
    "H100": Chip("H100", "NVIDIA H100 80GB HBM3", 989e12, 3350e9, 80 * 10**9, 25e9, 18, 0, 1, 400e9 / 8, 64e9,
                 "nvidia.com/en-us/data-center/h100 (SXM)"),
}


def chip_of(mesh: Any) -> Chip:
    """The :class:`Chip` a mesh's devices are, from their ``device_kind``; a ValueError naming the known
    chips for any other (pass ``chip=`` to :func:`estimate_step` to time a program for a chip by name)."""
    devices = getattr(mesh, "devices", None)
    if devices is None:
        raise TypeError(f"expected a jax.sharding.Mesh; got {type(mesh).__name__}")
    kind = str(np.asarray(devices).flat[0].device_kind)
    for chip in CHIPS.values():
        if kind == chip.device_kind:
            return chip
    known = ", ".join(f"{c.name} ({c.device_kind!r})" for c in CHIPS.values())
    raise ValueError(f"no published figures for a {kind!r} device; known chips: {known}. Pass chip='v5e' (or "
                     "another name) to time the program as if it ran on that chip")


_SHARE = {  # bytes one chip sends per byte of its result, on a ring of n (an estimate: the textbook algorithms)
    "all-gather": lambda n: (n - 1) / n,
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "reduce-scatter": lambda n: n - 1,
    "all-to-all": lambda n: (n - 1) / 4,  # a bidirectional ring: each byte travels a quarter of it
    "collective-permute": lambda n: 1.0,
}


def collective_seconds(kind: str, result_bytes: float, axes: list[tuple[int, int]], chip: Chip,
                       slices: int = 1) -> float:
    """Seconds one collective takes on ``chip``, estimated from the bytes a ring sends.

    ``result_bytes``: its per-device result; ``axes``: ``(length, full_length)`` for each torus axis its
    group spans within a slice (length: the group's extent along the axis; full: the slice's), whose links
    it uses together (:meth:`Chip.axis_bandwidth`, summed); ``slices``: how many slices the group spans, the
    DCN part then being the same collective across slices on what each chip holds after the part within
    its slice (all-gather, all-reduce: ``result / chips in the slice``; reduce-scatter: ``result``).

    Per chip, a ring sends: all-gather (n-1)/n x result, all-reduce 2(n-1)/n x, reduce-scatter (n-1) x,
    all-to-all (n-1)/4 x (each byte travels a quarter of the ring on average), collective-permute 1 x over
    one link. Group size n counts every chip of the group.
    """
    if kind not in _SHARE:
        raise ValueError(f"unknown collective {kind!r}; expected one of {sorted(_SHARE)}")
    inside = math.prod(length for length, _ in axes) if axes else 1
    seconds = 0.0
    if inside > 1:
        if kind == "collective-permute":
            bandwidth = chip.link_bandwidth if chip.torus else chip.links * chip.link_bandwidth
        else:
            bandwidth = sum(chip.axis_bandwidth(length, full) for length, full in axes if length > 1)
        seconds += _SHARE[kind](inside) * result_bytes / bandwidth
    if slices > 1:
        across = result_bytes if kind in ("reduce-scatter", "collective-permute") else result_bytes / inside
        seconds += _SHARE[kind](slices) * across / chip.dcn_bandwidth
    return seconds


@dataclass(frozen=True)
class TimedOp:
    """One instruction of the step, timed (:func:`estimate_step`).

    ``lane``: ``'compute'`` for the chip's own work, the mesh axes a collective spans (``'data'``,
    ``'data+model'``; ``'dcn'`` is added where it crosses slices), ``'host'`` for transfers to and from
    host memory, ``'hbm'`` for the TPU's own prefetches between HBM and VMEM. ``kind``: ``'compute'`` (bound
    by FLOPs), ``'memory'`` (bound by HBM bytes), a collective's kind, ``'to host'``/``'from host'``, or
    ``'prefetch'``. ``start``/``end``: seconds from the step's start (a loop body's ops: its first trip);
    ``seconds``: its own time, once; ``exposed``: what it adds to the step per run (a transfer hidden
    behind compute adds less than its ``seconds``); ``flops``/``bytes``: per run (HBM bytes of an op,
    the result bytes of a transfer); ``trips``: runs per call; ``loop``: the innermost loop it sits in;
    ``op_name``: the ``metadata`` op_name (``jit(f)/transpose(jvp())/dot_general`` is a backward matmul);
    ``cycles``: the TPU compiler's ``estimated_cycles`` where it wrote one.
    """

    name: str
    kind: str
    lane: str
    start: float
    end: float
    seconds: float
    exposed: float
    flops: float = 0.0
    bytes: float = 0.0
    trips: int = 1
    loop: str = ""
    op_name: str = ""
    cycles: int | None = None

    @property
    def hidden(self) -> bool:
        """A transfer that ran entirely beside other work."""
        return self.lane != "compute" and self.exposed == 0.0 and self.seconds > 0.0


@dataclass(frozen=True)
class StepEstimate(_Printed):
    """The estimated time of one call of a compiled program (:func:`estimate_step`), per chip.

    ``seconds`` = ``compute`` + ``memory`` + ``comm_exposed`` + ``host_exposed``: ``compute`` is every
    matmul's FLOPs / peak (or the compiler's cycles for it, where longer: see the module's text);
    ``memory`` what ops bound by HBM take beyond their FLOPs' time (plus prefetches
    left exposed); ``comm_exposed``/``comm_hidden``: collectives' time that adds to the step, and that
    ran beside other work; ``host_*`` the same for host transfers. ``flops``, ``hbm_bytes`` and
    ``comm_bytes`` (collectives' result bytes) count every loop trip. ``timeline``: each op in scheduled
    order (a loop body's ops once, with their ``trips``).
    """

    chip: Chip
    seconds: float
    compute: float
    memory: float
    comm_exposed: float
    comm_hidden: float
    host_exposed: float
    host_hidden: float
    flops: float
    hbm_bytes: float
    comm_bytes: float
    timeline: tuple[TimedOp, ...]

    def __str__(self) -> str:
        rows = [("compute (FLOPs / peak)", self.compute), ("memory-bound, beyond compute", self.memory),
                ("communication, exposed", self.comm_exposed), ("communication, hidden", self.comm_hidden),
                ("host transfers, exposed", self.host_exposed), ("host transfers, hidden", self.host_hidden)]
        lines = [f"estimated step on a {self.chip.name} chip, at published peak rates: {self.seconds * 1e3:.3f} ms"]
        lines += [f"  {label:<30}{value * 1e3:>10.3f} ms" for label, value in rows if value or "hidden" not in label]
        lines.append(f"  {self.flops:.3g} FLOPs, {format_bytes(self.hbm_bytes)} of HBM traffic, "
                     f"{format_bytes(self.comm_bytes)} of collective results per chip (every loop trip counted)")
        return "\n".join(lines)


_ARRAY_LAYOUT = re.compile(r"(?P<dtype>[a-z]+[0-9]*[a-z0-9]*)\[(?P<dims>[0-9,]*)\](?P<layout>\{[^{}]*\})?")
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "partition-id", "replica-id", "after-all",
         "opt-barrier", "add-dependency", "domain"}
_HOST_SPACE = 5  # a TPU layout's S(5): host memory
_HOST_CALLS = ("MoveToHost", "MoveToDevice")
_GROUP_SPEC = re.compile(  # every spelling of a collective's groups that inspecting._groups reads, whole
    r"(?:replica_groups|source_target_pairs)=(?:mesh\[[^\]]*\](?:, device_ids=\S+)?\s*\{[^}]*\}"
    r"|\[\d+,\d+\]<=\[[\d,]+\](?:T\([\d,]+\))?|\{(?:\{[\d,]*\},?)*\})")
_MEGASCALE = '_xla_host_transfer_handler_name="xla_megascale_runtime"'  # DCN: send/recv between slices


@functools.lru_cache(maxsize=1 << 16)  # a program repeats its types many times; parsing them is the walk's cost
def _spaced(type_text: str) -> tuple[tuple[int, int], ...]:
    """(bytes, memory space) of each array of an HLO type; space 0 is HBM, 1 VMEM, 5 host memory."""
    out = []
    for m in _ARRAY_LAYOUT.finditer(re.sub(r"/\*.*?\*/", "", type_text)):
        if m.group("dtype") not in _BITS:
            continue
        size = math.prod(int(d) for d in m.group("dims").split(",") if d) * _BITS[m.group("dtype")] // 8
        space = re.search(r"S\((\d+)\)", m.group("layout") or "")
        out.append((size, int(space.group(1)) if space else 0))
    return tuple(out)


def _hbm(type_text: str) -> int:
    return sum(size for size, space in _spaced(type_text) if space == 0)


def _shape(type_text: str) -> list[int]:
    m = _ARRAY_LAYOUT.search(type_text)
    return [int(d) for d in m.group("dims").split(",") if d] if m else []


def _matmul_flops(i: _Instr, where: dict[str, _Instr]) -> float:
    """FLOPs of a ``dot`` (2 x result x contracted sizes) or a ``convolution`` (2 x result x the kernel's
    size per output feature: its input features times its window), from the operands' shapes."""
    out = math.prod(_shape(i.type))
    if i.opcode == "dot" and i.operands and i.operands[0] in where:
        lhs = _shape(where[i.operands[0]].type)
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", i.attrs)
        return 2.0 * out * math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m else 0.0
    if i.opcode == "convolution" and len(i.operands) > 1 and all(o in where for o in i.operands[:2]):
        return _convolution_flops(i, _shape(where[i.operands[0]].type), _shape(where[i.operands[1]].type))
    return 0.0


def _convolution_flops(i: _Instr, lhs: list[int], kernel: list[int]) -> float:
    """2 x (batch x output features x input features per group) x, per spatial dimension, the (output
    position, window tap) pairs that land on the input rather than on padding. The TPU compiler packs two
    matmuls into one convolution with a window of 2 and a padding of 1 on each side: half its taps are padding."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", i.attrs)
    out = _shape(i.type)
    if not labels or len(labels.group(1)) != len(lhs) or len(labels.group(2)) != len(kernel) or len(
            labels.group(3)) != len(out):
        return 0.0
    left, right, result = labels.groups()
    window = re.search(r"window=\{([^}]*)\}", i.attrs)
    fields = dict(re.findall(r"(\w+)=(\S+)", window.group(1))) if window else {}

    def per_dim(key: str, default: int) -> list[int]:
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * len(result.replace(
            "b", "").replace("f", ""))

    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else None
    strides, lhs_dilate, rhs_dilate = per_dim("stride", 1), per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
    taps = 1
    for d, digit in enumerate(sorted(c for c in result if c.isdigit())):
        size_in, size_w, size_out = lhs[left.index(digit)], kernel[right.index(digit)], out[result.index(digit)]
        low = pads[d][0] if pads else 0
        last = (size_in - 1) * lhs_dilate[d]
        taps *= sum(1 for o in range(size_out) for k in range(size_w)
                    if 0 <= (at := o * strides[d] + k * rhs_dilate[d] - low) <= last and at % lhs_dilate[d] == 0)
    return 2.0 * out[result.index("b")] * out[result.index("f")] * kernel[right.index("i")] * taps


_TPU_LAYOUT = ":T("  # a TPU program's tiled layouts: f32[8,128]{1,0:T(8,128)}


def _direction(i: _Instr) -> str:
    """Which way a collective-permute's pairs mostly go (' +': to higher ids, ' -': lower), because the two
    directions of a link (and a ring's two neighbours) carry data at the same time without queueing."""
    pairs = [tuple(int(x) for x in m.groups()) for m in re.finditer(r"\{(\d+),(\d+)\}", i.line)]
    up = sum(t > s for s, t in pairs)
    return " +" if up * 2 >= len(pairs) else " -"


_KERNEL_COST = re.compile(r'"cost_estimate":\{"flops":"(\d+)"')


def _flops(i: _Instr, where: dict[str, _Instr], comps: dict[str, list[_Instr]]) -> float:
    """Matmul FLOPs of an instruction, looking inside fusions (nested ones too)."""
    if i.opcode in ("dot", "convolution"):
        return _matmul_flops(i, where)
    if i.opcode == "custom-call" and (m := _KERNEL_COST.search(i.attrs)):
        return float(m.group(1))  # a Pallas kernel's own count (pallas_call's cost_estimate)
    total = 0.0
    for _, callee in i.called if i.opcode == "fusion" else []:
        inner = comps.get(callee, [])
        at = {x.name: x for x in inner}
        total += sum(_flops(x, at, comps) for x in inner)
    return total


def _bytes(i: _Instr, where: dict[str, _Instr], comps: dict[str, list[_Instr]]) -> float:
    """HBM bytes an instruction reads and writes: operands and results in HBM (not VMEM, not host). Inside a
    fusion, an operand only ``dynamic-slice``d counts its slices, one updated in place by a
    ``dynamic-update-slice`` counts nothing, and such a result counts only its update."""
    fused = comps.get(dict(i.called).get("calls", ""), []) if i.opcode == "fusion" else []
    params = {int(m.group(1)): x for x in fused if x.opcode == "parameter"
              and (m := re.search(r"parameter\((\d+)\)", x.line))}
    root = next((x for x in fused if x.line.lstrip().startswith("ROOT")), None)
    total = 0.0
    for k, name in enumerate(i.operands):
        source = where.get(name)
        if source is None:
            continue
        full = _hbm(source.type)
        param = params.get(k)
        users = [x for x in fused if param is not None and param.name in x.operands]
        if users and all(x is root or x.opcode in _KIND for x in users):
            full = 0  # a buffer only handed on, or moved by a collective fused here (an async collective fusion)
        elif users and all(x.opcode == "dynamic-slice" and x.operands[0] == param.name for x in users):
            full = min(full, sum(_hbm(x.type.split("{")[0]) for x in users))
        elif any(x.opcode == "dynamic-update-slice" and x.operands[0] == param.name for x in users):
            full = 0
        total += full
    at = {x.name: x for x in fused}
    parts = _tuple_elements(i.type)
    made = [at.get(o) for o in root.operands] if root is not None and root.opcode == "tuple" else [root]
    for k, part in enumerate(parts):
        maker = made[k] if k < len(made) else None
        if maker is not None and (maker.opcode == "parameter" or maker.opcode in _KIND):
            continue  # an operand handed back, or a collective's result (its bytes are the collective's)
        if maker is not None and maker.opcode == "dynamic-update-slice" and len(maker.operands) > 1 and _hbm(part):
            update = at.get(maker.operands[1])
            total += _hbm(update.type.split("{")[0]) if update is not None else 0
        else:
            total += _hbm(part)
    return total


@dataclass
class _Run:
    """The state of one walk through a computation: the clock, when each transfer lane frees up, the
    parts of the time, and the timeline."""

    now: float = 0.0
    lanes: dict[str, float] | None = None
    parts: dict[str, float] | None = None
    timeline: list[TimedOp] | None = None

    def __post_init__(self) -> None:
        self.lanes, self.timeline = {}, []
        self.parts = dict.fromkeys(("compute", "memory", "comm_exposed", "comm_hidden", "host_exposed", "host_hidden",
                                    "flops", "hbm_bytes", "comm_bytes"), 0.0)


class _Program:
    """A parsed program, the mesh it runs on and the chip: times computations (:func:`estimate_step`)."""

    def __init__(self, text: str, mesh: Any, chip: Chip, use_cycles: bool = True) -> None:
        self.use_cycles = use_cycles
        self.comps, roots = _parse_module(text)
        self.entry = roots[0] if roots else ""
        self.chip = chip
        self.sizes = {str(k): int(v) for k, v in dict(mesh.shape).items()}
        self.n = math.prod(self.sizes.values())
        self.devices = list(np.asarray(mesh.devices).reshape(-1))
        coords = [getattr(d, "coords", None) for d in self.devices]
        self.coords = np.array(coords) if all(c is not None for c in coords) else None
        self.slices = [getattr(d, "slice_index", None) or 0 for d in self.devices]
        self.nslices = len(set(self.slices))
        self.seen: dict[str, tuple[list[tuple[int, int]], int, str]] = {}  # group spelling -> where()

    def where(self, op: _Instr) -> tuple[list[tuple[int, int]], int, str]:
        """:meth:`links` and the lane (mesh axes, ``+dcn`` between slices) of a collective, computed once per
        spelling of its groups: a large program repeats a few group spellings thousands of times."""
        spec = _GROUP_SPEC.search(op.line)
        key = spec.group(0) if spec else None
        if key is None or key not in self.seen:
            axes, slices = self.links(op)
            lane = "+".join(_axes(op, self.sizes, self.n)) or "collective"
            found = (axes, slices, lane + ("+dcn" if slices > 1 else ""))
            if key is None:
                return found
            self.seen[key] = found
        return self.seen[key]

    def links(self, op: _Instr) -> tuple[list[tuple[int, int]], int]:
        """The torus axes ``(length, full length)`` a collective's first group spans in one slice, and how
        many slices it spans. Without device coordinates (CPU devices), each mesh axis counts as a torus axis."""
        group = [g for g in _groups(op.line, self.n)[0] if g < self.n]
        if "source_target_pairs=" in op.line:
            group = [g for pair in _groups(op.line, self.n)[:1] for g in pair]
        slices = len({self.slices[g] for g in group})
        if self.coords is not None:
            first = self.slices[group[0]]
            inside = [g for g in group if self.slices[g] == first]
            mine = self.coords[[g for g in range(self.n) if self.slices[g] == first]]
            full = mine.max(axis=0) - mine.min(axis=0) + 1
            spans = [len(set(self.coords[inside][:, d])) for d in range(self.coords.shape[1])]
        else:
            where = np.array(np.unravel_index(group, list(self.sizes.values()))).T
            full = np.array(list(self.sizes.values()))
            spans = [len(set(where[:, d])) for d in range(len(full))]
        return [(s, int(f)) for s, f in zip(spans, full, strict=True) if s > 1], slices

    def walk(self, comp: str, run: _Run, trips: int, loop: str) -> None:
        body = self.comps.get(comp, [])
        where = {i.name: i for i in body}
        pending: dict[str, list[tuple[int, str, bool]]] = {}  # where a transfer is waited for -> (its entry,
        chip = self.chip                                      # part, whether that is its done rather than a user)
        for at, i in enumerate(body):
            waits = pending.pop(i.name, [])
            for k, part, _ in waits:  # an asynchronous transfer ends: wait for what is left of it
                started = run.timeline[k]
                exposed = max(0.0, started.end - run.now)
                run.now += exposed
                run.timeline[k] = TimedOp(**{**started.__dict__, "exposed": exposed})
                run.parts[f"{part}_exposed" if part != "memory" else "memory"] += exposed
                if part != "memory":
                    run.parts[f"{part}_hidden"] += max(0.0, started.seconds - exposed)
            if any(is_done for *_, is_done in waits):
                continue
            if i.opcode == "send" and _MEGASCALE in i.attrs:
                continue  # the sending half of a collective between slices: timed at its recv
            if i.opcode in _FREE or i.opcode.endswith("-done") or (
                    i.opcode == "custom-call" and "AllocateBuffer" in i.attrs):
                continue
            if i.opcode == "while":
                self.loop(i, body, run, trips)
                continue
            if i.opcode in ("call", "conditional"):
                self.branches(i, run, trips, loop)
                continue
            name = m.group(1) if (m := re.search(r'op_name="([^"]*)"', i.attrs)) else ""
            event = _event(i, body, at, self.comps)
            transfer = None  # (kind, lane, bytes, seconds, part, where it is waited for, whether that is a done)
            if event.kind is not None:
                axes, slices, lane = self.where(event.op)
                size = sum(s for s, _ in _spaced(event.result))
                done = event.done if event.asynchronous else None
                if event.kind == "collective-permute" and not event.asynchronous and _TPU_LAYOUT in i.type:
                    # a TPU collective-permute is a DMA over one link: the core goes on until the result is used
                    done = next((x.name for x in body[at + 1:] if i.name in x.operands), None)
                transfer = (event.kind, lane, size, collective_seconds(event.kind, size, axes, chip, slices),
                            "comm", done, done == event.done)
            elif i.opcode == "recv" and _MEGASCALE in i.attrs:  # a collective between slices, over DCN
                m = re.search(r'_xla_megascale_transfer_type="(\w+)"', i.attrs)
                kind = (m.group(1).lower().replace("_", "-") if m else "")
                kind = kind if kind in _SHARE else "collective-permute"
                size = (_spaced(i.type) or [(0, 0)])[0][0]
                done = next((x.name for x in body[at + 1:] if x.opcode == "recv-done" and i.name in x.operands), None)
                seconds = collective_seconds(kind, size, [], chip, self.nslices)
                transfer = (kind, "dcn", size, seconds, "comm", done, True)
            elif i.opcode == "copy-start":
                parts = _tuple_elements(i.type)
                (size, to), (_, source) = (_spaced(parts[0]) or [(0, 0)])[0], (_spaced(parts[1]) or [(0, 0)])[0]
                done = next((x.name for x in body[at + 1:] if x.opcode == "copy-done" and i.name in x.operands), None)
                if _HOST_SPACE in (to, source):
                    transfer = ("to host" if to == _HOST_SPACE else "from host", "host", size,
                                size / chip.host_bandwidth, "host", done, True)
                else:
                    transfer = ("prefetch", "hbm", size, size / chip.hbm_bandwidth, "memory", done, True)
            elif i.opcode == "custom-call" and any(f'"{t}"' in i.attrs for t in _HOST_CALLS):
                size = _hbm(i.type) or sum(s for s, _ in _spaced(i.type))
                transfer = ("to host" if "MoveToHost" in i.attrs else "from host", "host", size,
                            size / chip.host_bandwidth, "host", None, True)
            if transfer is not None:
                kind, lane, size, seconds, part, done, is_done = transfer
                queue = lane + _direction(i) if kind == "collective-permute" else lane
                start = max(run.now, run.lanes.get(queue, 0.0))
                run.lanes[queue] = start + seconds
                if part == "comm":
                    run.parts["comm_bytes"] += size
                timed = TimedOp(i.name, kind, lane, start, start + seconds, seconds, 0.0, 0.0, size, trips, loop,
                                name)
                if done is not None:
                    pending.setdefault(done, []).append((len(run.timeline), part, is_done))
                    run.timeline.append(timed)
                    continue
                exposed = start + seconds - run.now
                run.now = start + seconds
                run.parts[f"{part}_exposed" if part != "memory" else "memory"] += exposed
                run.timeline.append(TimedOp(**{**timed.__dict__, "exposed": exposed}))
                continue
            flops, moved = _flops(i, where, self.comps), _bytes(i, where, self.comps)
            compute, memory = flops / chip.peak_flops, moved / chip.hbm_bandwidth
            cycles = m.group(1) if (m := re.search(r'"estimated_cycles":"(\d+)"', i.attrs)) else None
            if self.use_cycles and cycles is not None and chip.clock_hz:
                compute = max(compute, int(cycles) / chip.clock_hz)  # the MXU schedule, as the compiler costs it
            seconds = max(compute, memory)
            run.timeline.append(TimedOp(i.name, "compute" if compute >= memory else "memory", "compute", run.now,
                                        run.now + seconds, seconds, seconds, flops, moved, trips, loop, name,
                                        int(cycles) if cycles is not None else None))
            run.now += seconds
            run.parts["compute"] += compute
            run.parts["memory"] += seconds - compute
            run.parts["flops"] += flops
            run.parts["hbm_bytes"] += moved

    def loop(self, i: _Instr, caller: list[_Instr], run: _Run, trips: int) -> None:
        """Time a loop: its body once on a fresh clock, then that, its trip count times."""
        count = _trip_count(i, self.comps, caller)
        body = dict(i.called).get("body", "")
        if count is None:
            raise ValueError(f"cannot read the trip count of loop {i.name!r} (body {body!r}): it has no "
                             "known_trip_count and its condition is not a counter compared with a constant, so its "
                             "time cannot be estimated")
        inner = _Run()
        self.walk(body, inner, trips * count, i.name)
        for op in inner.timeline:
            run.timeline.append(TimedOp(**{**op.__dict__, "start": op.start + run.now, "end": op.end + run.now}))
        for key, value in inner.parts.items():
            run.parts[key] += value * count
        run.lanes = {lane: max(t, run.now + inner.now * count) for lane, t in run.lanes.items()}
        run.now += inner.now * count

    def branches(self, i: _Instr, run: _Run, trips: int, loop: str) -> None:
        """A call runs its computation; a conditional is timed by its longest branch (an upper bound)."""
        best: _Run | None = None
        for _, callee in i.called:
            trial = _Run()
            self.walk(callee, trial, trips, loop)
            best = trial if best is None or trial.now > best.now else best
        if best is None:
            return
        for op in best.timeline:
            run.timeline.append(TimedOp(**{**op.__dict__, "start": op.start + run.now, "end": op.end + run.now}))
        for key, value in best.parts.items():
            run.parts[key] += value
        run.now += best.now


def estimate_step(compiled: Any, mesh: Any, *, chip: str | Chip | None = None,
                  use_cycles: bool = True) -> StepEstimate:
    """Estimate how long one call of a compiled program takes per chip, op by op (see the module's text).

    ``compiled``: ``jax.jit(f).lower(*args).compile()`` (a TPU topology compiled ahead of time, or any
    backend) or its ``as_text()``; ``mesh``: the ``Mesh`` it was compiled for (its devices say which chip
    each partition id is, where it sits in the torus and in which slice); ``chip``: a name of :data:`CHIPS`
    or a :class:`Chip`, by default the mesh's own (:func:`chip_of`); ``use_cycles``: time a matmul fusion by
    the compiler's ``estimated_cycles`` where they exceed its roofline (False: the roofline alone, a floor at
    the chip's peak rates). Raises a ValueError for a loop whose
    trip count cannot be read, a mesh of another size than the program's, or an unknown chip.
    """
    text = _hlo_text(compiled)
    if not hasattr(mesh, "devices") or not hasattr(mesh, "shape"):
        raise TypeError(f"estimate_step needs the jax.sharding.Mesh the program was compiled for; "
                        f"got {type(mesh).__name__}")
    if isinstance(chip, str):
        if chip not in CHIPS:
            raise ValueError(f"unknown chip {chip!r}; known chips: {', '.join(CHIPS)}")
        chip = CHIPS[chip]
    chip = chip if isinstance(chip, Chip) else chip_of(mesh)
    n = int(m.group(1)) if (m := re.search(r"num_partitions=(\d+)", text)) else 1
    program = _Program(text, mesh, chip, use_cycles)
    per_slice = len(program.slices) // program.nslices
    if any(len(set(program.slices[i:i + per_slice])) > 1 for i in range(0, len(program.slices), per_slice)):
        raise ValueError(f"the mesh spans {program.nslices} slices but does not order its devices slice by slice: "
                         "make the slices its outermost axis (jax.experimental.mesh_utils.create_hybrid_device_mesh "
                         "does), so that each slice's partition ids are its devices in mesh order")
    if n * program.nslices != mesh.size:
        raise ValueError(f"the program runs on {n} devices (num_partitions) per slice, the mesh {dict(mesh.shape)} "
                         f"on {mesh.size} in {program.nslices} slice(s): pass the mesh the program was compiled with")
    run = _Run()
    program.walk(program.entry, run, 1, "")
    p = run.parts
    return StepEstimate(chip, run.now, p["compute"], p["memory"], p["comm_exposed"], p["comm_hidden"],
                        p["host_exposed"], p["host_hidden"], p["flops"], p["hbm_bytes"], p["comm_bytes"],
                        tuple(run.timeline))
