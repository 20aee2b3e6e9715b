"""compile_effort(): the compiler's effort inside a with block, the previous level back afterwards."""

import jax
import jax.numpy as jnp
import pytest

from spmd_course.utils import compile_effort


def test_sets_the_level_inside_and_restores_the_one_before():
    assert jax.config.jax_optimization_level == "UNKNOWN"
    with compile_effort("O0"):
        assert jax.config.jax_optimization_level == "O0"
        with compile_effort("O2"):  # nests: the inner block's level, then the outer one's again
            assert jax.config.jax_optimization_level == "O2"
        assert jax.config.jax_optimization_level == "O0"
    assert jax.config.jax_optimization_level == "UNKNOWN"


@pytest.mark.parametrize("default", [None, "default", "UNKNOWN"])
def test_the_compilers_default_has_three_spellings(default):
    with compile_effort("O1"), compile_effort(default):
        assert jax.config.jax_optimization_level == "UNKNOWN"


def test_restores_the_level_when_the_block_raises():
    with pytest.raises(RuntimeError, match="inside"), compile_effort("O0"):
        raise RuntimeError("inside")
    assert jax.config.jax_optimization_level == "UNKNOWN"


def test_a_compile_inside_the_block_is_made_at_that_level():
    """jit's cache key holds the level, so the same function compiles once per level and keeps both."""
    f = jax.jit(lambda x: jnp.sin(x) * 2)
    x = jnp.ones(4)
    f(x)
    with compile_effort("O0"):
        f(x)
    assert f._cache_size() == 2
    with compile_effort("O0"):
        f(x)
    assert f._cache_size() == 2


@pytest.mark.parametrize("bad", ["O4", "o0", "fast", 0])
def test_an_unknown_level_names_the_ones_it_takes(bad):
    with pytest.raises(ValueError, match="O0, O1, O2, O3, or None"), compile_effort(bad):
        pass
    assert jax.config.jax_optimization_level == "UNKNOWN"
