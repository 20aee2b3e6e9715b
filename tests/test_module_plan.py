"""The planner for a learner's own Flax NNX module (utils.module_plan): abstract build, logical names to mesh
axes, the exact state formula, refusal without compiling, compiled ranking on v5e:2x4 at O0, bad input.

The compiled tests plan a two-matrix module of 0.4M parameters (about 2 s of CPU a compile at O0)."""

import jax
import pytest
from flax import nnx

from spmd_course.utils import module_plan
from spmd_course.utils.module_plan import (
    AS_WRITTEN,
    LOGICAL_RULES,
    ModuleModel,
    abstract_module,
    guess_module_seconds,
    module_specs,
    plan_module,
)
from spmd_course.utils.planner import Candidate
from spmd_course.utils.timing import CHIPS
from spmd_course.utils.tpu import tpu_compiler_available

SEQ, VOCAB = 128, 512


class Mixer(nnx.Module):
    """Embedding, one labelled feed-forward and a norm without names; logits through the tied embedding."""

    def __init__(self, rngs: nnx.Rngs, vocab: int = VOCAB, d: int = 256, f: int = 512, up_names=("embed", "mlp")):
        part = nnx.with_partitioning
        self.embed = nnx.Embed(vocab, d, embedding_init=part(nnx.initializers.normal(), ("vocab", "embed")),
                               rngs=rngs)
        self.up = nnx.Linear(d, f, use_bias=False, kernel_init=part(nnx.initializers.lecun_normal(), up_names),
                             rngs=rngs)
        self.down = nnx.Linear(f, d, use_bias=False,
                               kernel_init=part(nnx.initializers.lecun_normal(), ("mlp", "embed")), rngs=rngs)
        self.norm = nnx.RMSNorm(d, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        return self.embed.attend(x + self.down(jax.nn.silu(self.up(self.norm(x)))))


def make():
    return Mixer(nnx.Rngs(0))


ARGS = dict(seq_len=SEQ, vocab_size=VOCAB, chip="v5e", topology="v5e:2x4", global_batch_tokens=16 * SEQ)


@pytest.fixture(scope="module")
def tpu_compiler():
    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)


def test_the_module_is_built_abstractly():
    _, params, _ = abstract_module(make)
    values = [v.get_value() for _, v in nnx.to_flat_state(params)]
    assert values and all(isinstance(v, jax.ShapeDtypeStruct) for v in values)


def test_logical_names_map_to_the_mesh_by_the_rules():
    _, params, _ = abstract_module(make)
    specs = dict(nnx.to_flat_state(module_specs(params, {"data": 1, "fsdp": 2, "tensor": 4})))
    assert tuple(specs[("up", "kernel")].get_value()) == ("fsdp", "tensor")
    assert tuple(specs[("embed", "embedding")].get_value()) == ("tensor", "fsdp")
    assert tuple(specs[("norm", "scale")].get_value()) == ()  # no names: replicated
    other = module_specs(params, {"data": 1, "fsdp": 2, "tensor": 4}, {**LOGICAL_RULES, "mlp": None})
    assert tuple(dict(nnx.to_flat_state(other))[("up", "kernel")].get_value()) == ("fsdp", None)


def test_state_is_exact_from_each_parameters_split(monkeypatch):
    """Parameters, two moments and the gradients: 16 bytes a float32 parameter over its split; unnamed ones whole."""
    monkeypatch.setattr(module_plan, "_lower", lambda *a, **k: pytest.fail("compiled"))
    ranking = plan_module(make, **ARGS, meshes=[(8, 1, 1), (1, 8, 1)], max_compiles=0)
    by_mesh = {(p.candidate.data, p.candidate.fsdp): p for p in ranking if p.candidate.accumulation == 1}
    n, norm = 512 * 256 + 2 * 256 * 512, 256
    assert by_mesh[8, 1].formula_bytes == 16 * (n + norm)
    assert by_mesh[1, 8].formula_bytes == 16 * (n // 8 + norm)
    assert ranking.model == ModuleModel("Mixer", n + norm, SEQ, VOCAB)
    assert {p.status for p in ranking} == {"not compiled"} and {p.candidate.remat for p in ranking} == {AS_WRITTEN}


def test_state_over_hbm_is_refused_without_compiling(monkeypatch):
    monkeypatch.setattr(module_plan, "_lower", lambda *a, **k: pytest.fail("compiled"))
    huge = plan_module(lambda: Mixer(nnx.Rngs(0), vocab=2**20, d=16384), **{**ARGS, "vocab_size": 2**20})
    assert len(huge) > 0 and all(p.status == "refused" and not p.compiled for p in huge)
    assert "parameters and moments alone" in huge[0].note
    with pytest.raises(ValueError, match="no plan fits"):
        _ = huge.best


def test_the_guess_charges_micro_steps_and_tensor_traffic():
    chip, kw = CHIPS["v5e"], dict(params=10**6, param_bytes=4 * 10**6, tokens=256, embed=256)
    one, four = (Candidate(1, 8, 1, 1, AS_WRITTEN, b, 2 // b) for b in (2, 1))
    assert guess_module_seconds(four, chip, **kw) > guess_module_seconds(one, chip, **kw)  # gathers per micro-step
    tensor = Candidate(1, 1, 8, 1, AS_WRITTEN, 2, 1)
    data = Candidate(8, 1, 1, 1, AS_WRITTEN, 2, 1)
    assert guess_module_seconds(tensor, chip, **kw) > guess_module_seconds(data, chip, **kw) > 0


@pytest.mark.usefixtures("tpu_compiler")
def test_candidates_are_compiled_ranked_and_explained(monkeypatch):
    from spmd_course.utils import planner

    arguments, compile_at = {}, planner._compile  # plan_module compiles through the planner's own compile

    def compile_and_note(lowered, effort):  # each program's argument bytes: the weights and moments it holds
        compiled = compile_at(lowered, effort)
        arguments[len(arguments)] = compiled.memory_analysis().argument_size_in_bytes
        return compiled

    monkeypatch.setattr(planner, "_compile", compile_and_note)
    ranking = plan_module(make, **ARGS, meshes=[(8, 1, 1), (1, 8, 1), (2, 1, 4)], effort="O0")
    fits = ranking.fitting
    assert len(fits) == 3 and all(p.compiled and p.candidate.per_device_batch == 2 for p in fits)
    steps = [p.step_seconds for p in fits]
    assert steps == sorted(steps) and ranking.best is fits[0]
    assert {p.status for p in ranking if not p.fits} == {"skipped"}  # the 1 x 2 micro-batches of each mesh
    assert len(arguments) == 3 and min(arguments.values()) < max(arguments.values()) / 4  # FSDP's are split
    fsdp = next(p for p in fits if p.candidate.fsdp == 8)
    assert fsdp.formula_bytes < next(p for p in fits if p.candidate.data == 8).formula_bytes / 4
    assert ranking.best.candidate.label() in ranking.why and "as written" in str(ranking)


@pytest.mark.parametrize("kwargs, message", [
    (dict(make=nnx.Linear(2, 2, rngs=nnx.Rngs(0))), "pass a function that builds the module"),
    (dict(make=lambda: Mixer(nnx.Rngs(0), up_names=("embed", "hidden"))), "no rule for the logical name 'hidden'"),
    (dict(make=lambda: Mixer(nnx.Rngs(0), up_names=("embed",))), "one name \\(or None\\) per dimension"),
    (dict(make=lambda: Mixer(nnx.Rngs(0), f=500), meshes=[(1, 1, 8)]), "does not divide over tensor=8"),
    (dict(meshes=[(2, 2, 1)]), "multiply to the 8 chips"),
    (dict(global_batch_tokens=16 * SEQ + 1), "multiple of 128"),
    (dict(global_batch_tokens=4 * SEQ), "do not split over 8 chips"),
    (dict(seq_len=0), "seq_len must be a positive integer"),
    (dict(chip="h200"), "unknown chip"),
    (dict(rules={**LOGICAL_RULES, "mlp": "model"}), "the planner's mesh axes are"),
])
def test_bad_input_names_the_fix(kwargs, message):
    args = {"make": make, **ARGS, "max_compiles": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_module(**args)


@pytest.mark.usefixtures("tpu_compiler")
def test_a_module_that_does_not_return_logits_names_the_fix():
    with pytest.raises(ValueError, match="must return logits"):
        plan_module(make, **{**ARGS, "vocab_size": 1000}, meshes=[(8, 1, 1)], effort="O0")


def test_the_shared_optimizer_clips_and_decays_the_weights():
    import jax.numpy as jnp
    import optax

    from spmd_course.utils.train_step import optimizer

    tx, params = optimizer(1e-3), {"w": jnp.ones(3)}
    decay, _ = tx.update({"w": jnp.zeros(3)}, tx.init(params), params)
    assert jnp.allclose(decay["w"], -1e-3 * 0.1)  # no gradient: AdamW's weight decay of 0.1 alone
    unit = {"w": jnp.array([0.6, 0.8, 0.0])}  # norm 1
    _, state = tx.update(unit, tx.init(params), params)  # a second step: Adam's first is blind to the scale
    big, _ = tx.update({"w": jnp.array([300.0, 400.0, 0.0])}, state, params)
    same, _ = tx.update(unit, state, params)
    assert jnp.allclose(big["w"], same["w"])  # clipped to norm 1 first, so the same update
    unclipped, _ = optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1).update(
        {"w": jnp.array([300.0, 400.0, 0.0])}, state[1], params)
    assert not jnp.allclose(unclipped["w"], same["w"])  # the check above can fail


def test_an_h100_target_without_a_gpu_stops_before_building_the_module():
    try:
        jax.devices("gpu")
        pytest.skip("a GPU is visible: the H100 target compiles here")
    except RuntimeError:
        pass
    with pytest.raises(RuntimeError, match="needs a visible NVIDIA GPU"):
        plan_module(lambda: pytest.fail("built the module"), **{**ARGS, "chip": "H100", "topology": "H100:1x1x8"})
