"""The compiler's effort for the programs compiled inside one ``with`` block.

JAX's global option ``jax_optimization_level``: ``"O0"`` least effort (on a TPU nothing is placed in VMEM,
so HBM is higher) to ``"O3"``; ``"UNKNOWN"`` is the compiler's default, what users run. Neither jax line has
a context manager for it, and the per-compile option takes a name on 0.12 but an integer on 0.10.2,
so this sets the option and restores it, once for the course.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

LEVELS = ("O0", "O1", "O2", "O3")


@contextmanager
def compile_effort(level: str | None) -> Iterator[None]:
    """Compile everything inside the block at ``level``, then restore the level that was set before.

    ``level``: ``"O0"`` (least effort) to ``"O3"``; ``None``, ``"default"`` or ``"UNKNOWN"`` for the
    compiler's default. Only compiles inside the block see it: a program compiled earlier keeps its own
    effort (the level is part of jit's cache key, so calling it again recompiles nothing).
    """
    if level is None or level in ("default", "UNKNOWN"):
        value = "UNKNOWN"
    elif level in LEVELS:
        value = level
    else:
        raise ValueError(f"compile_effort({level!r}): use one of {', '.join(LEVELS)}, or None (or 'default') "
                         "for the compiler's default effort")
    import jax

    before = jax.config.jax_optimization_level
    jax.config.update("jax_optimization_level", value)
    try:
        yield
    finally:
        jax.config.update("jax_optimization_level", before)
