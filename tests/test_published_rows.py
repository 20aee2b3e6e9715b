"""MaxText's published rows (utils.published_rows) and the full-size training step (utils.train_step)."""

import dataclasses
import json
import math
import os
import re
import time

import pytest

from spmd_course.utils.effort import compile_effort
from spmd_course.utils.inspecting import memory_per_device
from spmd_course.utils.published_rows import (
    FORMULAS,
    MISSES,
    ROWS,
    TARGET,
    V5E_ROWS,
    V5P_ROWS,
    compile_row,
    estimate_row,
    formula_at,
    maxtext_2023_model,
    maxtext_flops_per_device,
    save_program,
)
from spmd_course.utils.tpu import tpu_compiler_available
from spmd_course.utils.train_step import DecoderConfig, Parallelism, lower_train_step, make_mesh


@pytest.fixture
def tpu_compiler():
    """Skip, with the reason, where libtpu cannot compile TPU programs (loaded here, not at collection)."""
    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)


needs_tpu_compiler = pytest.mark.usefixtures("tpu_compiler")

TINY = dict(d_model=512, num_heads=8, head_dim=64, d_ff=2048, vocab_size=2048, seq_len=256)


def _flops(compiled) -> float:
    cost = compiled.cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


# --- the rows: data sanity ------------------------------------------------------------------------

def test_tables_hold_the_rows_asked_for():
    v5e = {(r.global_parameter_scale, r.num_slices) for r in V5E_ROWS}
    assert {(s, 1) for s in (16, 32, 64, 128)} <= v5e and sum(n > 1 for _, n in v5e) >= 2
    assert {r.global_parameter_scale for r in V5P_ROWS} >= {32, 64, 128}
    assert len({r.name for r in ROWS}) == len(ROWS)


def test_global_parameter_scale_gives_the_2023_dims():
    """pyconfig.get_individual_scales of 2023 on base.yml's 2560/8/8192/16 dims."""
    dims = {s: (m.d_model, m.num_heads, m.d_ff, m.num_layers) for s in (16, 32, 64, 128)
            for m in [maxtext_2023_model(s)]}
    assert dims == {16: (5120, 32, 32768, 32), 32: (10240, 32, 32768, 32),
                    64: (10240, 32, 32768, 64), 128: (10240, 64, 65536, 64)}
    m = maxtext_2023_model(16)
    assert (m.head_dim, m.vocab_size, m.activation, m.gated, m.tied_embeddings) == (256, 32768, "relu", False, True)
    with pytest.raises(ValueError, match="power of 2"):
        maxtext_2023_model(24)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_each_row_has_its_parameter_class(row):
    """A '16B' row's model has 16e9 parameters to within 3%: the dims are the measured model's."""
    assert abs(row.num_params / (row.global_parameter_scale * 1e9) - 1) < 0.03


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_published_mfu_is_the_published_tflops_over_the_peak(row):
    """MaxText's MFU = its TFLOP/s per chip / peak; TFLOP/s is printed rounded to a whole number."""
    assert abs(row.published_tflops_per_chip / row.peak_tflops - row.published_mfu) <= 0.5 / row.peak_tflops


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_each_row_uses_the_formula_of_its_date(row):
    assert row.formula == formula_at(row.source.date)
    assert len(row.source.commit) == 40 and row.source.script.endswith(".sh")


def test_formula_dates():
    assert [formula_at(d) for d in ("2023-10-27", "2023-12-15", "2024-06-01", "2025-08-01")] == list(FORMULAS)
    with pytest.raises(ValueError, match="before 2023-06-02"):
        formula_at("2023-03-01")


def test_16b_flops_by_hand():
    """October 2023: 6·N·T + 12·H·L·dh·S·T, N = every parameter MaxText logged, T = 6 × 2048 tokens."""
    row = next(r for r in V5E_ROWS if r.global_parameter_scale == 16 and r.num_slices == 1)
    layer = 4 * 5120 * 32 * 256 + 2 * 5120 * 32768 + 5120 + 32 * 32  # q k v o, wi wo, one norm, relpos
    n = 32 * layer + 32768 * 5120 + 5120  # tied embedding once, final norm
    assert row.num_params == n
    by_hand = 6 * n * 12288 + 12 * 32 * 32 * 256 * 2048 * 12288
    assert row.maxtext_flops() == by_hand
    assert row.implied_step_seconds() == pytest.approx(by_hand / (0.611 * 197e12))
    assert row.implied_step_seconds() == pytest.approx(10.63, abs=0.01)
    assert row.mfu(row.implied_step_seconds()) == pytest.approx(0.611)


def test_formulas_differ_where_their_history_says():
    m = maxtext_2023_model(32)
    f = {k: maxtext_flops_per_device(m, per_device_batch=8, formula=k) for k in FORMULAS}
    attention = 12 * 32 * 32 * 256 * 2048 * 8 * 2048
    assert f["palm_noncausal"] - f["palm_causal"] == pytest.approx(attention / 2)
    assert f["per_matrix_noncausal"] - f["per_matrix_causal"] == pytest.approx(attention / 2)
    # per-matrix counts the embedding once and no norms: 6 × (matmul params) per token
    assert f["per_matrix_causal"] - attention / 2 == pytest.approx(6 * m.matmul_params() * 8 * 2048)
    with pytest.raises(ValueError, match="formula must be one of"):
        maxtext_flops_per_device(m, per_device_batch=8, formula="megatron")


# --- the builder: bad input -----------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(num_heads=6, num_kv_heads=4), "not a multiple of num_kv_heads"),
    (dict(activation="swish"), "activation must be one of"),
    (dict(d_model=0), "d_model must be a positive integer"),
    (dict(dtype="float16"), "dtype must be one of"),
])
def test_config_refuses_bad_dims(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig(**{"num_layers": 2, **TINY, **kwargs})


@pytest.mark.parametrize(("parallelism", "message"), [
    (Parallelism(ici_fsdp=3), "multiply to 3, but there are 8 chips"),
    (Parallelism(ici_fsdp=-1, ici_tensor=3), "cannot be split 3 ways"),
    (Parallelism(ici_fsdp=-1, ici_data=-1), "at most one -1"),
])
def test_parallelism_refuses_shapes_that_do_not_fit(parallelism, message):
    with pytest.raises(ValueError, match=message):
        parallelism.resolve(8, 1)


@needs_tpu_compiler
def test_builder_refuses_dims_that_do_not_divide_the_mesh():
    mesh = make_mesh("v5e:2x4", Parallelism(ici_fsdp=2, ici_tensor=4))
    with pytest.raises(ValueError, match="must both be multiples of tensor=4"):
        lower_train_step(DecoderConfig(num_layers=1, **{**TINY, "num_heads": 6}), mesh, per_device_batch=1)
    with pytest.raises(ValueError, match="does not divide over"):
        lower_train_step(DecoderConfig(num_layers=1, **{**TINY, "d_ff": 2046}), mesh, per_device_batch=1)
    with pytest.raises(ValueError, match="remat must be one of"):
        lower_train_step(DecoderConfig(num_layers=1, **TINY), mesh, per_device_batch=1, remat="some")
    with pytest.raises(ValueError, match="per_device_batch must be a positive integer"):
        lower_train_step(DecoderConfig(num_layers=1, **TINY), mesh, per_device_batch=0)


@needs_tpu_compiler
def test_multi_slice_mesh_puts_dcn_on_the_data_axis():
    mesh = make_mesh("v5e:2x4", Parallelism(ici_fsdp=-1, dcn_data=-1), num_slices=2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "tensor": 1}
    slices = {d.slice_index for d in mesh.devices[0].flat}  # one slice per data index
    assert len(slices) == 1 and {d.slice_index for d in mesh.devices.flat} == {0, 1}


@needs_tpu_compiler
def test_dot_scores_stay_in_bf16_where_asked():
    """scores_in_fp32=False keeps the scores and the softmax's exponential in bfloat16 (MaxText's 2023 dot path);
    the default computes them in float32. Read from the lowered program (b=4, 8 heads, 256 x 256 scores)."""
    mesh = make_mesh("v5e:2x4", Parallelism(ici_fsdp=-1))
    cfg = DecoderConfig(num_layers=1, **TINY)

    def exponentials(fp32: bool) -> set[str]:
        text = lower_train_step(cfg, mesh, per_device_batch=1, scores_in_fp32=fp32).as_text()
        return set(re.findall(r"stablehlo.exponential %\S+ : tensor<8x8x1x256x256x(\w+)>", text))

    assert exponentials(True) == {"f32"}
    assert exponentials(False) == {"bf16"}


@needs_tpu_compiler
def test_stored_allocation_is_the_rows_hbm(tmp_path):
    """save_program keeps the compiler's HBM allocation beside memory_analysis's sum (jax 0.12+), and
    estimate_row reports the allocation as the row's HBM where it is stored, the sum where it is not."""
    mesh = make_mesh("v5e:2x4", Parallelism(ici_fsdp=-1))
    with compile_effort("O0"):
        compiled = lower_train_step(DecoderConfig(num_layers=1, **TINY), mesh, per_device_batch=1).compile()
    row = dataclasses.replace(ROWS[0], topology="v5e:2x4", parallelism=Parallelism(ici_fsdp=-1), num_slices=1)
    save_program(row, compiled, cpu_seconds=1.0, folder=tmp_path)
    entry = json.loads((tmp_path / "index.json").read_text())[row.name]
    memory = memory_per_device(compiled)
    assert entry["temp_bytes"] == memory.temp
    assert entry.get("allocated_bytes") == memory.allocated  # None (absent) on jax 0.10, which lacks the figure
    stored = estimate_row(row, folder=tmp_path)
    assert stored.sum_bytes == memory.total
    assert stored.hbm_bytes == (memory.total if memory.allocated is None else memory.allocated)
    index = json.loads((tmp_path / "index.json").read_text())
    index[row.name]["allocated_bytes"] = 12345
    (tmp_path / "index.json").write_text(json.dumps(index))
    again = estimate_row(row, folder=tmp_path)
    assert again.hbm_bytes == 12345 and again.sum_bytes == memory.total and "allocated" in again.line()


# --- the builder: FLOPs of a compiled step ---------------------------------------------------------

@needs_tpu_compiler
def test_compiled_flops_are_six_n_t_once_layers_are_counted():
    """cost_analysis counts a scanned layer once; counted L times the step is 6·N·T + attention (no remat).

    Per layer = (2 unrolled layers) - (1 unrolled layer); outside the layers = (1 layer) - (per layer).
    The scanned program of 3 layers reports outside + one layer (the loop trap), and
    outside + 3 × per layer is 6·(matmul params)·T + 12·S·H·dh·L·T (the dot kernel computes every score).
    """
    mesh = make_mesh("v5e:2x4", Parallelism(ici_fsdp=4, ici_tensor=2))

    def flops(layers: int, scan: bool) -> float:  # at the least effort (O0): it counts the same matmuls, 5x faster
        cfg = DecoderConfig(num_layers=layers, scan_layers=scan, **TINY)
        with compile_effort("O0"):
            return _flops(lower_train_step(cfg, mesh, per_device_batch=4, remat="none").compile())

    one, two, scanned = flops(1, False), flops(2, False), flops(3, True)
    per_layer, outside = two - one, 2 * one - two
    assert scanned == pytest.approx(outside + per_layer, rel=0.02)  # the body once, not three times
    cfg = DecoderConfig(num_layers=3, **TINY)
    t = 4 * cfg.seq_len
    expected = 6 * cfg.matmul_params() * t + 12 * cfg.seq_len * cfg.num_heads * cfg.head_dim * 3 * t
    assert outside + 3 * per_layer == pytest.approx(expected, rel=0.03)


# --- every row against the time model ---------------------------------------------------------------

@needs_tpu_compiler
def test_every_row_against_its_published_mfu(capsys):
    """The table: each row's stored full-size program timed by utils.timing, against the step its MFU implies.

    A row inside TARGET is predicted; every row outside is in MISSES with its reason, and no row in MISSES is
    inside (so a fix or a regression of the model shows here). No efficiency constant: rates are published
    peaks, and a matmul takes the compiler's cycle count where it exceeds its roofline.
    """
    table = [estimate_row(row) for row in ROWS]
    with capsys.disabled():
        print("\n" + "\n".join(e.line() + ("" if e.inside else "  (outside: see MISSES)") for e in table))
    outside = {e.row.name for e in table if not e.inside}
    assert outside == set(MISSES), f"rows outside {TARGET}: {sorted(outside)}; listed in MISSES: {sorted(MISSES)}"
    assert sum(e.inside for e in table) >= 11
    for e in table:  # the parts add up, and the estimate is of the whole program: every layer's loop trip counted
        est = e.estimate
        assert est.seconds == pytest.approx(est.compute + est.memory + est.comm_exposed + est.host_exposed)
        assert est.flops > e.row.maxtext_flops() * 0.95  # never fewer FLOPs than MaxText's count (+ remat)


def test_stored_program_is_asked_for_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="make published-rows"):
        estimate_row(ROWS[0], folder=tmp_path)


# --- every row at full size (slow) ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.published  # 75-200 s of CPU a row: `make published-rows` runs them, not make test-slow (CI's budget)
@needs_tpu_compiler
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_row_compiles_at_full_size_as_stored(row, capsys):
    """Compile a row for its topology at the default effort: its estimate matches the stored program's
    (PUBLISHED_ROWS_UPDATE=1, i.e. `make published-rows UPDATE=1`, stores the new program instead)."""
    start = time.process_time()
    compiled = compile_row(row)
    seconds = time.process_time() - start
    fresh = estimate_row(row, compiled)
    with capsys.disabled():
        print(f"\n{fresh.line()}  (compiled in {seconds:.0f} s CPU)")
    if os.environ.get("PUBLISHED_ROWS_UPDATE") == "1":
        save_program(row, compiled, cpu_seconds=seconds)
        return
    stored = estimate_row(row)
    assert fresh.estimate.seconds == pytest.approx(stored.estimate.seconds, rel=0.01)
    assert fresh.sum_bytes == pytest.approx(stored.sum_bytes, rel=0.01)
    if stored.allocated_bytes is not None and fresh.allocated_bytes is not None:
        assert fresh.allocated_bytes == pytest.approx(stored.allocated_bytes, rel=0.01)
    assert math.isfinite(fresh.hbm_bytes) and fresh.hbm_bytes > 0
    if fresh.allocated_bytes is not None:  # the compiler accepted the program: its allocation fits the chip
        assert fresh.allocated_bytes <= fresh.estimate.chip.hbm_bytes
