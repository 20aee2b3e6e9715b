"""Every exercise's checker accepts its reference solution and rejects every listed wrong answer.

This is what keeps a checker from rotting: if a library change makes the reference
answer fail, or makes the checker accept anything, this test fails. A wrong answer
must be rejected by an AssertionError (a verdict with a message for the learner),
not by the checker crashing on it. Right answers written another common way must be
accepted too, and every checker must follow the mesh, not the device ids, where
jax.make_mesh orders devices as a TPU host does.
"""

import importlib
import math
import pkgutil
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course import exercises
from spmd_course.exercises import (
    ex00_setup,
    ex01_meshes,
    ex02_partitionspec,
    ex03_namedsharding,
    ex04_propagation_resharding,
)
from spmd_course.utils.exercises import NOT_ANSWERED, Exercise, Outcome, Verdict, near, plain, positive_number
from spmd_course.utils.inspecting import collectives


def _all_exercises() -> list[tuple[str, Exercise]]:
    found = []
    for info in sorted(pkgutil.iter_modules(exercises.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"spmd_course.exercises.{info.name}")
        for name, value in sorted(vars(module).items()):
            if isinstance(value, Exercise):
                found.append((f"{info.name}.{name}", value))
    return found


EXERCISES = _all_exercises()


def test_every_notebook_with_exercises_has_at_least_two():
    per_module: dict[str, int] = {}
    for qualname, _ in EXERCISES:
        per_module[qualname.split(".")[0]] = per_module.get(qualname.split(".")[0], 0) + 1
    assert per_module, "no exercises found"
    assert all(n >= 2 for n in per_module.values()), per_module


def _describe(outcome: Outcome) -> str:
    return f"{outcome.verdict.value}: {type(outcome.error).__name__}: {outcome.error}" if outcome.error else "no error"


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_reference_solution_passes(qualname, exercise, capsys):
    outcome = exercise.outcome(exercise.solution)
    assert outcome.verdict is Verdict.CORRECT, f"{qualname} rejects its own solution ({_describe(outcome)})"
    assert exercise.check(exercise.solution) is True
    assert capsys.readouterr().out.startswith(f"[{exercise.title}] correct.")


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_wrong_answers_fail_with_a_message(qualname, exercise, capsys):
    problems = []
    for i, wrong in enumerate(exercise.wrong):
        outcome = exercise.outcome(wrong)
        if outcome.verdict is not Verdict.WRONG:
            problems.append(f"wrong[{i}] {wrong!r}: {_describe(outcome)}")
        elif not str(outcome.error).strip():
            problems.append(f"wrong[{i}] {wrong!r}: rejected by an AssertionError with no message for the learner")
    assert not problems, f"{qualname}: wrong answers not rejected by an AssertionError:\n" + "\n".join(problems)
    assert exercise.check(exercise.wrong[0]) is False
    assert capsys.readouterr().out.startswith(f"[{exercise.title}] not yet: ")


def _raises_name_error(*args, **kwargs):
    return undefined_name  # noqa: F821 - a learner's typo


# Answers of the wrong kind, or functions that fail: each checker must answer them with a message, not crash.
ODD_ANSWERS = {
    "None": None, "a string": "nonsense", "a float": 3.5, "a negative int": -1, "True": True,
    "a mixed list": [1, "a"], "a dict": {"a": 1}, "a function returning None": lambda *a, **k: None,
    "a function returning a string": lambda *a, **k: "x", "a function that raises": _raises_name_error,
}


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_answers_of_the_wrong_kind_get_a_message(qualname, exercise):
    problems = []
    for label, odd in ODD_ANSWERS.items():
        outcome = exercise.outcome(odd)
        if outcome.verdict is not Verdict.WRONG:
            problems.append(f"{label}: {_describe(outcome)}")
    assert not problems, f"{qualname} does not reject every odd answer with a message:\n" + "\n".join(problems)


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_placeholder_gets_a_nudge(qualname, exercise, capsys):
    assert exercise.verdict(NOT_ANSWERED) is Verdict.NOT_ANSWERED
    assert exercise.check(NOT_ANSWERED) is False
    assert "not answered yet" in capsys.readouterr().out


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_the_hint_appears_after_a_wrong_answer_not_before(qualname, exercise, capsys):
    assert exercise.hint, f"{qualname} has no hint to give after a wrong answer"
    exercise.check(NOT_ANSWERED)
    before = capsys.readouterr().out
    assert exercise.hint not in before and "Hint" not in before, f"{qualname} shows its hint before any try"
    exercise.check(exercise.solution)
    assert exercise.hint not in capsys.readouterr().out
    exercise.check(exercise.wrong[0])
    assert f"Hint: {exercise.hint}" in capsys.readouterr().out, f"{qualname} gives no hint after a wrong answer"


def _toy(checker) -> Exercise:
    return Exercise(title="Toy", checker=checker, solution=1, wrong=(2,), hint="think")


# The toy checkers raise AssertionError themselves: pytest rewrites assert statements in this file.
def _is_one(answer):
    if answer != 1:
        raise AssertionError(f"{answer} is not 1")


def _crashes_on_strings(answer):
    if answer + 0 != 1:  # a str answer raises TypeError here: the checker never validated its kind
        raise AssertionError("not 1")


def test_four_verdicts_are_told_apart(capsys):
    ex = _toy(_crashes_on_strings)
    assert [ex.verdict(a) for a in (1, 2, NOT_ANSWERED, "1")] == [
        Verdict.CORRECT, Verdict.WRONG, Verdict.NOT_ANSWERED, Verdict.CHECKER_ERROR]
    outcome = ex.outcome("1")
    assert isinstance(outcome.error, TypeError)
    assert ex.outcome(2).error.args == ("not 1",)
    assert capsys.readouterr().out == ""  # outcome and verdict never print


def test_check_reports_a_checker_error_as_the_checkers_failure(capsys):
    assert _toy(_crashes_on_strings).check("1") is False
    out = capsys.readouterr().out
    assert out.startswith("[Toy] checker error: the checker itself failed")
    assert "TypeError" in out and "test_exercises.py:" in out
    assert "not yet" not in out and "Hint" not in out


def test_check_prints_the_checkers_message_and_the_hint(capsys):
    assert _toy(_is_one).check(2) is False
    assert capsys.readouterr().out == "[Toy] not yet: 2 is not 1\nHint: think\n"
    assert _toy(_is_one).check(1) is True
    assert capsys.readouterr().out.startswith("[Toy] correct.")


def test_interrupts_are_not_swallowed():
    def interrupted(answer):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _toy(interrupted).check(1)


def test_an_exercise_needs_a_wrong_answer_and_a_callable_checker():
    with pytest.raises(ValueError, match="at least one wrong answer"):
        Exercise(title="T", checker=_is_one, solution=1)
    with pytest.raises(TypeError, match="checker must be a function"):
        Exercise(title="T", checker=None, solution=1, wrong=(2,))


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_reveal_prints_the_solution(qualname, exercise, capsys):
    exercise.reveal()
    out = capsys.readouterr().out
    assert "reference solution" in out and len(out.splitlines()) >= 2


# Notebook 24's checkers compute torch_xla's spec strings without torch_xla (exercises.ex24_pytorch_xla.spec_string),
# so they run everywhere. Where torch_xla is installed (.venv-xla: `make test-xla`), hold them to what it prints.
SPEC_STRING_CASES = [
    ((8, 8, 16), (None, "data", "model")),
    ((8,), ("data",)),
    ((8,), (("data", "model"),)),
    ((8, 16), ("model", None)),  # exercise 2's answer
    ((8, 16), (None, "model")),  # exercise 3's question
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchax, inside torch_xla, imports old JAX names
def test_ex24_pytorch_xla_spec_strings_are_what_torch_xla_prints():
    import os

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "8")
    torch = pytest.importorskip("torch")
    torch_xla = pytest.importorskip("torch_xla")
    import jax
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from spmd_course.exercises import ex24_pytorch_xla as ex24

    shardy = jax.config.jax_use_shardy_partitioner  # every mark_sharding switches it off: restore it after
    try:
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
        for shape, spec in SPEC_STRING_CASES:
            t = torch.zeros(shape).to(torch_xla.device())
            xs.mark_sharding(t, mesh, spec)
            assert torch_xla._XLAC._get_xla_sharding_spec(t) == ex24.spec_string(spec, shape), (shape, spec)
        assert ex24.spec_string(ex24.spec_from_string.solution, (8, 16)) == ex24._TARGET
        assert ex24.spec_string((None, "model"), (8, 16)) == ex24.string_from_spec.solution
    finally:
        jax.config.update("jax_use_shardy_partitioner", shardy)


# --- plain: one spelling for every right answer ---------------------------------------------------------------------


def test_plain_writes_numbers_the_python_way():
    assert plain(np.int64(7)) == 7 and type(plain(np.int64(7))) is int
    assert type(plain(16384.0)) is int and type(plain(np.float32(2.0))) is int  # whole floats are counts
    assert plain(np.float32(0.5)) == 0.5 and type(plain(np.float32(0.5))) is float
    assert plain(True) is True and plain(np.bool_(False)) is False  # a bool is never taken for 1 or 0
    assert plain(jnp.int32(3)) == 3 and type(plain(jnp.int32(3))) is int  # a 0-d JAX array is its number
    assert math.isnan(plain(float("nan"))) and plain(float("inf")) == float("inf")  # not whole: left as floats


def test_plain_writes_collections_one_way():
    assert plain([1, np.int64(2)]) == (1, 2)
    assert plain(np.arange(4).reshape(2, 2)) == ((0, 1), (2, 3))
    assert plain({np.int64(1), 2}) == frozenset({1, 2})
    assert plain({"all-gather": np.int64(1)}) == {"all-gather": 1}
    assert plain([{1, 2}, [3, 4.0]]) == (frozenset({1, 2}), (3, 4))
    assert plain({d for d in jax.devices()[:2]}) == frozenset(d.id for d in jax.devices()[:2])  # Devices are ids


def test_plain_leaves_everything_else_alone():
    spec, fn = P("data", None), len
    assert plain(spec) is spec and plain(fn) is fn and plain("4") == "4" and plain(None) is None
    assert plain((spec, P())) == (spec, P())
    assert plain(3 + 0j) == 3 + 0j  # not a real number: a checker rejects it


# Right answers written another common way: each must be accepted (numpy numbers, whole floats from `/`, numpy
# arrays, lists for tuples and sets, Device objects for ids). Where an answer names devices, it is the one for
# the devices in id order, the order conftest.py sets up.
_DEVICES = {d.id: d for d in jax.devices()}
_ex = {name: importlib.import_module(f"spmd_course.exercises.{name}")
       for name in {q.split(".")[0] for q, _ in EXERCISES}}

def _to_columns_unconstrained_waypoint(v):  # the waypoint keeps rows split and leaves the columns to the compiler
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    v = jax.lax.with_sharding_constraint(v, jax.NamedSharding(mesh, P("data", P.UNCONSTRAINED)))
    v = jax.lax.with_sharding_constraint(v, jax.NamedSharding(mesh, P("data", "model")))
    return jax.lax.with_sharding_constraint(v, jax.NamedSharding(mesh, P(None, "model")))


ALSO_RIGHT = {
    "ex00_setup.bytes_per_device": [np.int64(16384), 16384.0, 256 / 4 * 128 / 2 * 4],
    "ex01_meshes.device_at": [np.int64(5), 5.0],
    "ex01_meshes.model_group": [[4, 5, 6, 7], np.array([4, 5, 6, 7])],
    "ex02_partitionspec.predict_shard_shape": [np.array([64, 12, 8]), [64, 12, 8], (64.0, 96 / 8, 8)],
    "ex02_partitionspec.rows_32_64": [[4, 6], np.array([6, 4]), {_DEVICES[4], _DEVICES[6]}],
    "ex03_namedsharding.mesh_bytes": [np.int64(4194304), 4194304.0],
    "ex03_namedsharding.first_replicas": [{np.int64(i) for i in (1, 3, 5, 7)}, [7, 5, 3, 1],
                                          np.array([1, 3, 5, 7]), {_DEVICES[i] for i in (1, 3, 5, 7)}],
    "ex04_propagation_resharding.predict_collective": [{"all-gather": np.int64(1), "all-reduce": 0}],
    "ex04_propagation_resharding.predict_bytes": [np.float64(458752.0), 448 * 1024],
    "ex04_propagation_resharding.read_groups": [np.arange(8).reshape(4, 2).T, ((0, 2, 4, 6), (1, 3, 5, 7))],
    "ex05_constraints_explicit.rows_matmul": [lambda a, b: jnp.einsum("ij,jk->ik", a, b, out_sharding=P("data"))],
    "ex06_shard_map.column_sums": [jax.jit(_ex["ex06_shard_map"].column_sums.solution),
                                   _ex["ex06_shard_map"]._column_sums_pmean,
                                   _ex["ex06_shard_map"]._column_sums_both_axes],
    "ex03_namedsharding.kernel_rule": [
        lambda path, leaf: P(None, "model") if "kernel" in jax.tree_util.keystr(path) and leaf.ndim == 2
        else P()],
    "ex05_constraints_explicit.to_columns": [_to_columns_unconstrained_waypoint],
    "ex06_shard_map.ring_source": [np.int64(0), _DEVICES[0]],
    "ex07_data_parallel.dp_specs": [[P("data"), P()], (P("data", None), P(None))],
    "ex07_data_parallel.wider_allreduce_bytes": [np.int64(153640)],
    "ex07_data_parallel.sixteen_devices": [[128, 76844], (np.int64(128), np.int64(76844))],
    "ex08_tensor_parallel.tp_allreduce_bytes": [np.int64(40960)],
    "ex09_2d_parallel.gradient_group_size": [np.int64(4), 4.0],
    "ex10_fsdp.adam_bytes_per_device": [np.int64(42064)],
    "ex11_fsdp_step.gradient_traffic": [[57344, 114688], (7 * 8 * 256 * 4, 2 * 7 / 8 * 64 * 256 * 4)],
    "ex11_fsdp_step.fsdp_by_hand": [_ex["ex11_fsdp_step"]._fsdp_through_the_gather],  # autodiff writes the scatters
    "ex16_published_runs.implied_step": [np.float64(6 * 7e9 * 8192 / 150e12), 2.29],
    "ex16_published_runs.hardware_utilisation": [np.float64(0.8), 4 / 5],
    "ex12_transformer.fsdp_bytes": [np.int64(131144)],
    "ex12_transformer.residual_allreduce": [[4, 65536], (np.int64(4), np.int64(65536))],
    "ex13_training_memory.zero_bytes": [tuple(np.int64(b) for b in _ex["ex13_training_memory"].zero_bytes.solution),
                                        [4 * 7e9 + 12 * 7e9 / 64, 2 * 7e9 + 14 * 7e9 / 64, 16 * 7e9 / 64]],
    "ex13_training_memory.zero_specs": [lambda stage: list(_ex["ex13_training_memory"].zero_specs.solution(stage))],
    "ex14_sequence_batch.activation_bytes": [(np.int64(134217728), np.int64(16777216)),
                                             [8 * 2048 * 4096 * 2.0, 8 * 2048 * 4096 * 2 / 8]],
    "ex19_experts.a2a_bytes": [(448 * 2**20, 448 * 2**20 * 63 / 64), [np.int64(469762048), 462422016.0]],
    "ex19_experts.collapsed_balance": [8, np.float32(8.0), np.int64(8)],
    "ex18_pipeline.bubble_fraction": [Fraction(3, 15), np.float64(0.2), np.float32(0.2)],
    "ex18_pipeline.micro_batches_needed": [[63, 16], (np.int64(63), np.int64(16))],
    "ex18_pipeline.stage_layers": [lambda s, p, r, n: np.arange(n).reshape(r, p, -1)[:, s].reshape(-1),
                                   lambda s, p, r, n: tuple(c * (n // (p * r)) + j for c in range(s, p * r, p)
                                                            for j in range(n // (p * r)))],
    "ex17_mesh_shape.state_bytes": [(12 * (3670016 / 16 + 19456) + 8, 12 * (3670016 / 64 + 19456 / 4) + 8)],
    "ex17_mesh_shape.divisibility": [(np.array([[32, 2], [16, 4], [8, 8], [1, 64]]), {(32, 2), (16, 4), (8, 8)})],
    "ex15_step_time.compute_seconds": [np.float64(6 * 1.3e9 * 16384 / 67e12), 1.9, np.float32(1.91)],
    "ex15_step_time.crossover_tokens": [np.float64(4303.125), 4300, np.int64(4303), 0.9375 * 918e12 / 200e9],
    "ex15_step_time.loop_permutes": [np.int64(27), 27.0],
    "ex25_plan_a_run.state_per_chip": [np.int64(_ex["ex25_plan_a_run"].state_per_chip.solution),
                                       16 * 8_030_261_248 / 256, np.float32(5.02e8)],
    "ex25_plan_a_run.my_plan": [{**_ex["ex25_plan_a_run"].my_plan.solution, "mesh": [1, 256, 1]},
                                {**_ex["ex25_plan_a_run"].my_plan.solution, "mesh": np.array([1, 256, 1]),
                                 "per_device_batch": np.int64(4), "global_batch_tokens": 4194304.0},
                                {**_ex["ex25_plan_a_run"].my_plan.solution, "mesh": (2, 128, 1)}],
    "ex22_pmap_vs_spmd.migrate_to_jit": [list(_ex["ex22_pmap_vs_spmd"].migrate_to_jit.solution)],
    "ex22_pmap_vs_spmd.pmean_factor": [np.float32(2.0), np.int64(2), 2.0],
    "ex26_published_plans.published_slowdown": [np.float64(_ex["ex26_published_plans"].published_slowdown.solution),
                                                 round(_ex["ex26_published_plans"].published_slowdown.solution, 3)],
    "ex26_published_plans.losing_term": [["memory", 2.015], ("memory", np.float64(2.0150))],
    "ex24_pytorch_xla.linear_weight_spec": [P("model"), P(("model",), None)],
    "ex24_pytorch_xla.string_from_spec": ["{devices=[1, 2, 4] 0, 2, 4, 6, 1, 3, 5, 7 last_tile_dim_replicate}",
                                          " {devices=[1,2,4]0,2,4,6,1,3,5,7  last_tile_dim_replicate} "],
    "ex20_context.kv_bytes": [(np.int64(67108864), np.int64(536870912)), [2**26, 2.0**29]],
    "ex20_context.balanced_chunks": [lambda n: [(2 * n - 1 - d, d) for d in range(n)],
                                     lambda n: np.stack([np.arange(n), 2 * n - 1 - np.arange(n)], axis=1)],
    "ex20_context.merge_partials": [
        lambda a, b: (np.maximum(a[0], b[0]),
                      *(x * np.exp(m - np.maximum(a[0], b[0])).reshape(-1, *[1] * (x.ndim - 1)) + y *
                        np.exp(n - np.maximum(a[0], b[0])).reshape(-1, *[1] * (y.ndim - 1))
                        for x, y, m, n in ((a[1], b[1], a[0], b[0]), (a[2], b[2], a[0], b[0]))))],
}


@pytest.mark.parametrize("qualname", sorted(ALSO_RIGHT))
def test_right_answers_written_another_way_are_accepted(qualname):
    exercise = dict(EXERCISES)[qualname]
    problems = [f"{answer!r}: {_describe(outcome)}" for answer in ALSO_RIGHT[qualname]
                if (outcome := exercise.outcome(answer)).verdict is not Verdict.CORRECT]
    assert not problems, f"{qualname} rejects right answers:\n" + "\n".join(problems)


# On a TPU host jax.make_mesh orders devices as the chips are wired, not by id: a v5e-8 gives [0, 1, 2, 3, 7, 6, 5, 4].
# Every checker must then still accept its solution, unless the answer names devices: those must follow the mesh.
PHYSICAL_ORDER = (0, 1, 2, 3, 7, 6, 5, 4)
ON_PHYSICAL_ORDER = {
    "ex02_partitionspec.rows_32_64": {5, 7},  # mesh positions (2, 0) and (3, 0)
    "ex06_shard_map.ring_source": 4,  # device 6 sits at (2, 1) and receives from (3, 1)
}


@pytest.fixture
def physical_order(monkeypatch):
    make_mesh = jax.make_mesh

    def physical(axis_shapes, axis_names, *args, devices=None, **kwargs):
        if devices is None and math.prod(axis_shapes) == len(PHYSICAL_ORDER):
            devices = [_DEVICES[i] for i in PHYSICAL_ORDER]
        return make_mesh(axis_shapes, axis_names, *args, devices=devices, **kwargs)

    jax.clear_caches()  # a solution traced on the id-order mesh would otherwise be reused, mesh and all
    monkeypatch.setattr(jax, "make_mesh", physical)
    assert jax.make_mesh((4, 2), ("a", "b")).device_ids.ravel().tolist() == list(PHYSICAL_ORDER)
    yield
    monkeypatch.undo()
    jax.clear_caches()


def test_checkers_follow_the_mesh_not_the_device_ids(physical_order):
    problems = []
    for qualname, exercise in EXERCISES:
        answer = ON_PHYSICAL_ORDER.get(qualname, exercise.solution)
        if (outcome := exercise.outcome(answer)).verdict is not Verdict.CORRECT:
            problems.append(f"{qualname} rejects {answer!r}: {_describe(outcome)}")
        if qualname in ON_PHYSICAL_ORDER and exercise.verdict(exercise.solution) is not Verdict.WRONG:
            problems.append(f"{qualname} accepts the id-order answer {exercise.solution!r} on another order")
    assert not problems, "\n".join(problems)


# --- single exercises of 00-02: bad input, numpy integers ---------------------------------------------------------


def test_ex00_rejects_a_spec_longer_than_the_array():
    with pytest.raises(AssertionError, match="3 entries"):
        ex00_setup.columns_spec.checker(P(None, "data", None))


def test_exercises_accept_numpy_integers():
    assert ex00_setup.bytes_per_device.check(np.int64(16384))
    assert ex02_partitionspec.predict_shard_shape.check(tuple(np.array([64, 12, 8])))
    assert ex01_meshes.model_group.check(jax.make_mesh((2, 4), ("d", "m"), axis_types=(AxisType.Auto,) * 2)
                                         .device_ids[1])


# --- ex03: the once-wrong cases (a hint that blamed the dtype; copies said to follow device ids) ------------------

def test_ex03_eight_times_the_array_is_not_blamed_on_the_dtype_alone():
    eight_copies = 8 * 512 * 1024 * 2  # P(): every device holds the whole bfloat16 array (= 4 copies of f32)
    with pytest.raises(AssertionError) as caught:
        ex03_namedsharding.mesh_bytes.checker(eight_copies)
    assert "P()" in str(caught.value) and "2 bytes" in str(caught.value)


def test_ex03_replica_zero_follows_mesh_position_not_device_id():
    reversed_mesh = Mesh(np.array(jax.devices())[::-1].reshape(4, 2), ("data", "model"),
                         axis_types=(AxisType.Explicit,) * 2)
    a = jax.device_put(np.zeros((128, 512), np.float32), NamedSharding(reversed_mesh, P("data", None)))
    first = {s.device.id for s in a.addressable_shards if s.replica_id == 0}
    assert first == set(reversed_mesh.device_ids[:, 0].tolist()) == {7, 5, 3, 1}  # the mesh's left column
    assert ex03_namedsharding.first_replicas.solution == first
    with pytest.raises(AssertionError, match="mesh order, not by device id"):
        ex03_namedsharding.first_replicas.checker({0, 2, 4, 6})  # the lower id of each pair: the once-wrong reading
    assert "mesh position, not device ids" in ex03_namedsharding.first_replicas.explanation


# --- ex04: the premises (the groups it asks about, its byte estimate on any backend) ------------------------------

def test_ex04_the_groups_it_asks_about_are_an_all_gather_over_data():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    a = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=NamedSharding(mesh, P("model", "data")))
    b = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(lambda a, b: a @ b).lower(a, b).compile()
    (op,) = collectives(compiled).ops
    line = next(s for s in compiled.as_text().splitlines() if f"%{op.name} = " in s)
    assert op.kind == "all-gather" and op.group_size == 4
    assert "replica_groups=[2,4]<=[4,2]T(1,0)" in line
    groups = [sorted(g) for g in ex04_propagation_resharding.read_groups.solution]
    assert groups == mesh.device_ids.T.tolist()  # the mesh's columns: devices that differ only in 'data'


def test_ex04_the_byte_estimate_counts_float32_whatever_the_gather_dtype(tpu_devices):
    tpu_mesh = Mesh(np.array(tpu_devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    fsdp = NamedSharding(tpu_mesh, P(("data", "model"), None))
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=fsdp)
    w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=fsdp)
    (op,) = collectives(jax.jit(lambda x, w: x @ w).lower(x, w).compile()).ops
    assert re.match(r"bf16\[256,512\]", op.result_type)  # the TPU gathers w as bfloat16 ...
    assert op.shapes[0] == (256, 512) and op.group_size == 8  # ... with the shape and group the checker reads


def test_positive_number_takes_numbers_the_ways_learners_write_them():
    assert positive_number(np.float32(1.5), "the seconds") == 1.5 and positive_number(16384, "tokens") == 16384.0
    for wrong, says in ((True, "give the seconds as a number"), ("2", "give the seconds as a number"),
                        (None, "give the seconds as a number"), (0, "the seconds is positive"),
                        (-3.0, "the seconds is positive")):
        with pytest.raises(AssertionError, match=says):
            positive_number(wrong, "the seconds")


def test_near_is_relative_to_the_second_number():
    assert near(100.5, 100) and not near(102, 100) and near(101.5, 100, 0.02)
    assert near(-1.0, -1.005) and not near(0.5, 1.0, 0.4)
    with pytest.raises(ValueError, match="must not be 0"):
        near(1.0, 0.0)
