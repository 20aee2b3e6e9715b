"""spmd_course.utils.timing: the step-time model read op by op from compiled programs.

Small programs: CPU (8 simulated devices) and TPU topologies compiled ahead of time (v5e:2x4, v5e:4x4,
v5e:16x16, two v5e:16x16 slices, v5p, v6e; skipped where libtpu is absent). Every expected figure is
written from the chip table and the shapes, so a wrong rate, trip count, byte count or overlap fails.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import collectives
from spmd_course.utils.capture import quiet
from spmd_course.utils.timing import CHIPS, StepEstimate, chip_of, collective_seconds, estimate_step

V5E = CHIPS["v5e"]
BF16 = jnp.bfloat16


def _topology(name, **kwargs):
    from jax.experimental import topologies

    from spmd_course.utils.tpu import tpu_compiler_available

    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)
    with quiet():
        return topologies.get_topology_desc(topology_name=name, platform="tpu", **kwargs).devices


def _mesh(devices, shape, names):
    return Mesh(np.asarray(devices).reshape(shape), names, axis_types=(AxisType.Auto,) * len(shape))


def _compile(f, mesh, *specs, out=None):
    args = [jax.ShapeDtypeStruct(shape, BF16, sharding=NamedSharding(mesh, spec)) for shape, spec in specs]
    with quiet():
        return jax.jit(f, out_shardings=out).lower(*args).compile()


def _layers(ws, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]


def _parts_add_up(e: StepEstimate) -> None:
    total = e.compute + e.memory + e.comm_exposed + e.host_exposed
    assert e.seconds == pytest.approx(total, rel=1e-9)


# --- the chip table -------------------------------------------------------------------------------------

def test_chip_table_figures_and_detection(tpu_devices):
    assert (V5E.peak_flops, V5E.hbm_bandwidth, V5E.hbm_bytes) == (197e12, 819e9, int(15.75 * 2**30))
    assert V5E.link_bandwidth * V5E.links * 2 == 400e9  # "400 GB/s bidirectional" over 4 ports
    assert chip_of(_mesh(tpu_devices, (4, 2), ("data", "model"))) is V5E
    assert chip_of(_mesh(_topology("v5p:2x2x1"), (4,), ("x",))) is CHIPS["v5p"]
    assert chip_of(_mesh(_topology("v6e:2x2"), (4,), ("x",))) is CHIPS["v6e"]


def test_unknown_chip_names_the_known_ones():
    cpu = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    with pytest.raises(ValueError, match=r"no published figures for a 'cpu' device; known chips: v5e"):
        chip_of(cpu)
    with pytest.raises(ValueError, match=r"unknown chip 'v9'; known chips: v5e, v5p, v6e, H100"):
        estimate_step("HloModule m, num_partitions=8", cpu, chip="v9")
    with pytest.raises(TypeError, match=r"expected a jax\.sharding\.Mesh"):
        chip_of({"data": 8})


def test_wraparound_rule():
    assert V5E.axis_bandwidth(16, 16) == 2 * V5E.axis_bandwidth(4, 4) == 2 * 50e9  # a ring, and a line
    assert V5E.axis_bandwidth(4, 16) == 50e9  # 4 chips of a 16-chip ring: a line of them
    v5p = CHIPS["v5p"]
    assert v5p.axis_bandwidth(4, 4) == v5p.axis_bandwidth(8, 8) == 2 * 100e9 and v5p.axis_bandwidth(2, 2) == 100e9
    h100 = CHIPS["H100"]
    assert h100.axis_bandwidth(8, 8) == 450e9  # NVSwitch: every link, whatever the group


def test_collective_seconds_ring_formulas():
    mib = 2**20
    ring = [(16, 16)]
    assert collective_seconds("all-gather", 16 * mib, ring, V5E) == pytest.approx(15 * mib / 100e9)
    assert collective_seconds("all-reduce", 16 * mib, ring, V5E) == pytest.approx(2 * 15 * mib / 100e9)
    assert collective_seconds("reduce-scatter", mib, ring, V5E) == pytest.approx(15 * mib / 100e9)
    assert collective_seconds("all-to-all", 16 * mib, ring, V5E) == pytest.approx(15 / 4 * 16 * mib / 100e9)
    assert collective_seconds("collective-permute", mib, ring, V5E) == pytest.approx(mib / 50e9)
    both = collective_seconds("all-gather", 256 * mib, [(16, 16), (16, 16)], V5E)  # two axes' links at once
    assert both == pytest.approx(255 * mib / 200e9)
    dcn = collective_seconds("all-reduce", 256 * mib, [(16, 16), (16, 16)], V5E, slices=2)
    assert dcn == pytest.approx(2 * 255 / 256 * 256 * mib / 200e9 + 2 * 1 / 2 * mib / V5E.dcn_bandwidth)
    with pytest.raises(ValueError, match="unknown collective 'allgather'"):
        collective_seconds("allgather", 1, ring, V5E)


# --- loops: every trip ----------------------------------------------------------------------------------

def test_scan_counts_every_layer_on_cpu_from_known_trip_count():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    compiled = _compile(_layers, mesh, ((5, 256, 256), P()), ((512, 256), P("data")))
    assert '"known_trip_count":{"n":"5"}' in compiled.as_text()
    e = estimate_step(compiled, mesh, chip="v5e")
    assert e.flops == 5 * 2 * 64 * 256 * 256  # 5 layers of [64, 256] @ [256, 256] per device
    (matmul,) = [op for op in e.timeline if op.flops]
    assert (matmul.trips, matmul.loop != "") == (5, True)
    _parts_add_up(e)


def test_scan_counts_every_layer_on_tpu_from_its_counter(tpu_devices):
    mesh = _mesh(tpu_devices, (8,), ("data",))
    compiled = _compile(_layers, mesh, ((6, 512, 512), P()), ((4096, 512), P("data")))
    assert "known_trip_count" not in compiled.as_text()  # the TPU program: trips from the counter only
    e = estimate_step(compiled, mesh, use_cycles=False)  # the roofline alone: compute is FLOPs / peak
    assert e.flops == 6 * 2 * 512 * 512 * 512
    assert e.compute == pytest.approx(e.flops / V5E.peak_flops)
    _parts_add_up(e)
    costed = estimate_step(compiled, mesh)  # the default: the compiler's cycles where they exceed the roofline
    (matmul,) = [op for op in costed.timeline if op.flops]
    assert matmul.cycles and matmul.seconds == pytest.approx(max(matmul.cycles / V5E.clock_hz,
                                                                  matmul.flops / V5E.peak_flops,
                                                                  matmul.bytes / V5E.hbm_bandwidth))
    assert costed.compute >= e.compute and costed.flops == e.flops
    _parts_add_up(costed)


def _fsdp_block(p, x, dy):
    def block(p, x):
        return x + (jax.nn.silu(x @ p["w1"]) * (x @ p["w3"])) @ p["w2"]

    y, pull = jax.vjp(block, p, x)
    return y, *pull(dy)


def test_fsdp_windowed_reduce_scatter_loop_counts_both_trips(tpu_devices):
    d, ff, tokens = 1024, 4096, 8 * 1024
    mesh = _mesh(tpu_devices, (8,), ("data",))
    w = {"w1": ((d, ff), P("data", None)), "w3": ((d, ff), P("data", None)), "w2": ((ff, d), P(None, "data"))}
    args = [{k: jax.ShapeDtypeStruct(s, BF16, sharding=NamedSharding(mesh, spec)) for k, (s, spec) in w.items()}]
    args += [jax.ShapeDtypeStruct((tokens, d), BF16, sharding=NamedSharding(mesh, P("data")))] * 2
    with quiet():
        compiled = jax.jit(_fsdp_block, out_shardings=(args[1].sharding, {k: v.sharding for k, v in args[0].items()},
                                                       args[1].sharding)).lower(*args).compile()
    text = compiled.as_text()
    assert text.count("windowed_dot_general_body_rs") >= 3 and "known_trip_count" not in text
    found = collectives(compiled)
    permutes = [op for op in found.ops if op.kind == "collective-permute"]
    assert sorted({op.trips for op in permutes}) == [1, 2]  # 4 per trip of each loop, 1 after it
    assert found.count("collective-permute") == 3 * (4 * 2 + 1)  # 9 per gradient, not the 5 stated
    e = estimate_step(compiled, mesh)
    shard = d * ff // 8 * 2  # one gradient's shard, bf16
    assert e.comm_bytes == 3 * (8 * shard) + 27 * shard  # three weight gathers (whole), 27 permutes (a shard)
    assert e.flops == 6 * 3 * d * ff * tokens / 8  # forward and backward: 6 per parameter per token
    _parts_add_up(e)


def test_pipeline_and_expert_collectives_are_timed_every_trip(tpu_devices):
    """The collectives of notebooks 18-20's programs: a collective-permute inside a loop (a pipeline's or a
    ring's send) is timed once per trip, over one link; an all-to-all (experts' dispatch) by its ring share."""
    mesh = _mesh(tpu_devices, (8,), ("x",))
    ring = [(i, (i + 1) % 8) for i in range(8)]

    def body(a):
        a = jax.lax.fori_loop(0, 5, lambda i, a: jnp.tanh(jax.lax.ppermute(a, "x", ring)), a)
        return jax.lax.all_to_all(a, "x", 0, 0, tiled=True)

    f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    compiled = _compile(f, mesh, ((8 * 512, 1024), P("x")))
    e = estimate_step(compiled, mesh)
    mib = 512 * 1024 * 2  # one device's block, bf16
    timed = {op.kind: op for op in e.timeline if op.lane == "x"}
    permute, a2a = timed["collective-permute"], timed["all-to-all"]
    assert (permute.trips, permute.bytes, a2a.trips, a2a.bytes) == (5, mib, 1, mib)
    assert permute.seconds == pytest.approx(mib / V5E.link_bandwidth)  # one link, whatever the ring's size
    assert a2a.seconds == pytest.approx(collective_seconds("all-to-all", mib, [(2, 2), (4, 4)], V5E))
    assert a2a.seconds == pytest.approx(7 / 4 * mib / (2 * V5E.link_bandwidth))  # (n-1)/4 over the 2x4's links
    assert e.comm_bytes == 5 * mib + mib
    assert e.comm_exposed + e.comm_hidden == pytest.approx(5 * permute.seconds + a2a.seconds)
    _parts_add_up(e)


# --- overlap --------------------------------------------------------------------------------------------

_ASYNC = """HloModule m, num_partitions=8
ENTRY %main (x: bf16[128,1024], w: bf16[1024,1024]) -> (bf16[1024,1024], bf16[1024,1024]) {
  %x = bf16[128,1024]{1,0} parameter(0)
  %w = bf16[1024,1024]{1,0} parameter(1)
  %ags = (bf16[128,1024]{1,0}, bf16[1024,1024]{1,0}) all-gather-start(%x), replica_groups=[1,8]<=[8], dimensions={0}
  %d = bf16[1024,1024]{1,0} dot(%w, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %agd = bf16[1024,1024]{1,0} all-gather-done(%ags)
  ROOT %t = (bf16[1024,1024]{1,0}, bf16[1024,1024]{1,0}) tuple(%d, %agd)
}"""


def test_async_collective_hides_behind_the_work_between_start_and_done():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    comm = 7 / 8 * 2 * 2**20 / 50e9  # an axis of 8 CPU devices on a v5e: a line, one link's rate
    matmul = 2 * 1024**3 / V5E.peak_flops  # compute-bound: 3 MiB read and written take less
    asynchronous = estimate_step(_ASYNC, mesh, chip="v5e")
    synchronous = estimate_step(_ASYNC.replace("all-gather-start", "all-gather").replace(
        "%agd = bf16[1024,1024]{1,0} all-gather-done(%ags)", "%agd = bf16[1024,1024]{1,0} bitcast(%ags)").replace(
        "(bf16[128,1024]{1,0}, bf16[1024,1024]{1,0}) all-gather", "bf16[1024,1024]{1,0} all-gather"), mesh, chip="v5e")
    gather = next(op for op in asynchronous.timeline if op.kind == "all-gather")
    assert gather.seconds == pytest.approx(comm) and gather.lane == "data"
    assert asynchronous.comm_exposed == pytest.approx(comm - matmul)  # the matmul ran while it transferred
    assert asynchronous.comm_hidden == pytest.approx(matmul)
    assert synchronous.comm_exposed == pytest.approx(comm) and synchronous.comm_hidden == 0
    assert synchronous.seconds - asynchronous.seconds == pytest.approx(matmul)
    _parts_add_up(asynchronous)
    _parts_add_up(synchronous)


def test_tpu_async_collectives_of_a_real_program_are_read(tpu_devices):
    mesh = _mesh(tpu_devices, (4, 2), ("data", "model"))
    compiled = _compile(jax.grad(lambda ws, x: _layers(ws, x).sum()), mesh, ((6, 256, 256), P(None, None, "model")),
                        ((64, 256), P("data")))
    e = estimate_step(compiled, mesh)
    transfers = [op for op in e.timeline if op.lane not in ("compute", "hbm")]
    assert {op.lane for op in transfers} == {"data", "model"} and all(op.trips == 6 for op in transfers)
    assert all(0 <= op.exposed <= op.seconds + 1e-15 for op in transfers)
    _parts_add_up(e)


# --- links: wraparound, several axes, DCN ---------------------------------------------------------------

def _gather_seconds(devices, shape, names, spec):
    """The collective that replicates a (4096, 1024) bf16 array laid out at ``spec``."""
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)  # physical order
    compiled = _compile(lambda a: a * 2, mesh, ((4096, 1024), spec), out=NamedSharding(mesh, P()))
    (gather,) = [op for op in estimate_step(compiled, mesh).timeline if op.lane not in ("compute", "hbm")]
    return gather


def test_wraparound_halves_a_short_axis_time_on_v5e(tpu_pod):
    whole = 4096 * 1024 * 2
    line = _gather_seconds(_topology("v5e:4x4"), (4, 4), ("x", "y"), P("x"))  # an axis of 4: no wraparound
    ring = _gather_seconds(_topology("v5e:16x16"), (16, 16), ("x", "y"), P("x"))  # an axis of 16: a ring
    assert line.kind == ring.kind == "all-gather"
    assert line.seconds == pytest.approx(3 / 4 * whole / 50e9) and line.lane == "x"
    assert ring.seconds == pytest.approx(15 / 16 * whole / 100e9)


def test_a_collective_over_two_torus_axes_uses_both_axes_links(tpu_pod):
    whole = 4096 * 1024 * 2
    both = _gather_seconds(_topology("v5e:16x16"), (16, 16), ("x", "y"), P(("x", "y")))
    share = {"all-gather": 255 / 256, "all-reduce": 2 * 255 / 256}[both.kind]  # over 256 it sums a padded copy
    assert both.lane == "x+y" and both.seconds == pytest.approx(share * whole / 200e9)  # 4 links, both ways


def test_dcn_between_slices():
    devices = sorted(_topology("v5e:16x16", num_slices=2), key=lambda d: (d.slice_index, d.id))
    mesh = _mesh(devices, (2, 256), ("slice", "data"))
    compiled = _compile(lambda a: a * 2, mesh, ((1024, 1024), P("slice")), out=NamedSharding(mesh, P()))
    (gather,) = [op for op in estimate_step(compiled, mesh).timeline if op.kind == "all-gather"]
    assert gather.lane == "dcn"  # the program of one slice sends it to the other through the host's NICs
    assert gather.seconds == pytest.approx(1 / 2 * 1024 * 1024 * 2 / V5E.dcn_bandwidth)  # one slice's chip: its half


# --- host offload ---------------------------------------------------------------------------------------

def test_host_offload_transfers_go_over_pcie(tpu_devices):
    from jax.ad_checkpoint import checkpoint_name

    def f(w, x):
        def block(x):
            return jnp.tanh(checkpoint_name(jnp.tanh(x @ w), "h") @ w)
        policy = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=["h"], offload_src="device",
            offload_dst="pinned_host")
        return jax.checkpoint(block, policy=policy)(x).sum()

    mesh = _mesh(tpu_devices[:1], (1,), ("x",))
    compiled = _compile(jax.grad(f), mesh, ((1024, 1024), P()), ((2048, 1024), P()))
    assert "S(5)" in compiled.as_text()  # host memory space
    e = estimate_step(compiled, mesh)
    moves = [op for op in e.timeline if op.lane == "host"]
    assert sorted(op.kind for op in moves) == ["from host", "to host"]
    assert all(op.seconds == pytest.approx(2048 * 1024 * 2 / V5E.host_bandwidth) for op in moves)
    assert e.host_exposed + e.host_hidden == pytest.approx(sum(op.seconds for op in moves))
    _parts_add_up(e)


# --- the per-op model against the TPU compiler's estimated_cycles ---------------------------------------

def test_compute_bound_matmul_agrees_with_estimated_cycles_within_5_percent(tpu_devices):
    clock = V5E.peak_flops / (4 * 128 * 128 * 2)  # 4 MXUs of 128 x 128, a multiply and an add: 1.5 GHz
    assert V5E.clock_hz == clock and CHIPS["v5p"].clock_hz == CHIPS["v5p"].peak_flops / (8 * 128 * 128 * 2)
    mesh = _mesh(tpu_devices[:1], (1,), ("x",))
    for m in (4096, 8192):
        compiled = _compile(jnp.matmul, mesh, ((m, 4096), P()), ((4096, 4096), P()))
        (op,) = [op for op in estimate_step(compiled, mesh, use_cycles=False).timeline if op.flops]
        assert op.flops == 2 * m * 4096 * 4096 and op.kind == "compute"
        assert op.cycles / clock == pytest.approx(op.seconds, rel=0.05)


# --- bad input ------------------------------------------------------------------------------------------

def test_two_slices_are_read_slice_by_slice_whatever_the_first_axis():
    """A 2-slice mesh whose outer axis is data 2 (DCN) x 2 (ICI) = 4, as the planner builds it for data inside a
    slice, is timed; a mesh that interleaves the slices' devices cannot map partition ids to devices, and says so."""
    from types import SimpleNamespace

    def mesh(slice_of):
        devices = np.array([SimpleNamespace(id=i, slice_index=slice_of(i)) for i in range(16)]).reshape(4, 4)
        return SimpleNamespace(devices=devices, shape={"data": 4, "fsdp": 4}, size=16)

    estimate = estimate_step(_ASYNC, mesh(lambda i: i // 8), chip="v5e")
    assert estimate.seconds > 0
    with pytest.raises(ValueError, match="does not order its devices slice by slice: make the slices its outermost"):
        estimate_step(_ASYNC, mesh(lambda i: i % 2), chip="v5e")


def test_bad_input_gets_clear_errors():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    with pytest.raises(TypeError, match="pass the compiled program, not the function"):
        estimate_step(jax.jit(jnp.sin), mesh, chip="v5e")
    with pytest.raises(TypeError, match=r"needs the jax\.sharding\.Mesh"):
        estimate_step(_ASYNC, {"data": 8}, chip="v5e")
    small = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
    with pytest.raises(ValueError, match=r"runs on 8 devices .* pass the mesh the program was compiled with"):
        estimate_step(_ASYNC, small, chip="v5e")
    unreadable = "\n".join([
        "HloModule m, num_partitions=8",
        "%body (p: f32[8]) -> f32[8] {", "  ROOT %p = f32[8]{0} parameter(0)", "}",
        "%cond (p: f32[8]) -> pred[] {", "  %p = f32[8]{0} parameter(0)", "  ROOT %c = pred[] constant(true)", "}",
        "ENTRY %main (x: f32[8]) -> f32[8] {", "  %x = f32[8]{0} parameter(0)",
        "  ROOT %spin = f32[8]{0} while(%x), condition=%cond, body=%body", "}",
    ])
    with pytest.raises(ValueError, match="cannot read the trip count of loop 'spin' \\(body 'body'\\)"):
        estimate_step(unreadable, mesh, chip="v5e")
    printed = str(estimate_step(_ASYNC, mesh, chip="v5e"))
    assert printed.startswith("estimated step on a v5e chip, at published peak rates") and "hidden" in printed


def test_the_walk_reads_each_group_spelling_whole():
    """estimate_step caches a collective's links by the spelling of its groups, so that spelling must be read whole
    (two different groups must never share a key): every form inspecting._groups reads."""
    from spmd_course.utils.timing import _GROUP_SPEC

    for spec in ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}",
                 "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([4,2]T(1,0)) {'axis_0'}",
                 "replica_groups=[2,4]<=[4,2]T(1,0)", "replica_groups=[4,2]<=[8]", "replica_groups={{0,1},{2,3}}",
                 "replica_groups={}", "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"):
        line = f"%x = f32[8]{{0}} all-reduce(f32[8]{{0}} %y), channel_id=3, {spec}, to_apply=%add"
        assert _GROUP_SPEC.search(line).group(0) == spec


def test_an_async_collective_fusions_handed_on_buffers_are_not_hbm_traffic(tpu_pod):
    """The TPU compiler fuses an all-gather with the matmul it overlaps (an ``async_collective_fusion``): the fusion
    takes the gather's buffers and hands them back (``output_to_operand_aliasing``), f32[64,512,2048] each in
    notebook 17's FSDP x TP program. Those bytes are the gather's, moved by the links: counted as HBM traffic of
    the matmul they made it 832 MiB and a millisecond of memory time a trip."""
    import gzip
    from pathlib import Path

    from jax.sharding import AxisType

    text = gzip.decompress((Path(__file__).resolve().parent.parent / "data" / "mesh_shape" /
                            "FSDP_x_TP.hlo.gz").read_bytes()).decode()
    mesh = jax.make_mesh((8, 8), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=tpu_pod)
    step = estimate_step(text, mesh)
    fused = [op for op in step.timeline if op.name.startswith("fusion.4") and "async_collective_fusion" in
             next(line for line in text.splitlines() if f" %{op.name} = " in line)]
    assert fused and max(op.bytes for op in fused) < 64 * 2**20
