"""An interactive explorer of one array's layout: type a mesh, a shape and a spec, see where the blocks go.

:func:`explore` puts ipywidgets text boxes over the course's own helpers (``draw_sharding``, ``type_string``,
``shard_table``). :func:`layout` reads the boxes into a ``jax.ShapeDtypeStruct`` (nothing allocated, so any
size works); what it cannot use raises a ValueError whose one line names the fix.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from jax.typing import DTypeLike

from .drawing import draw_sharding
from .inspecting import format_bytes, shard_table
from .layout import check_spec, short_dtype, spec_entries, type_string

__all__ = ["DEFAULTS", "describe", "explore", "layout", "parse_axis_names", "parse_shape", "parse_spec"]

DEFAULTS = {"mesh_shape": "4, 2", "axis_names": "data, model", "shape": "128, 512", "dtype": "float32",
            "spec": "'data', 'model'"}
"""What the boxes hold when the explorer opens."""


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    """``"128, 512"`` or ``"(128, 512)"`` -> ``(128, 512)``; ``""`` is a scalar. Sizes of 0 are allowed, as in JAX."""
    try:
        shape = tuple(int(t) for t in text.strip().strip("()[]").replace(",", " ").split())
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a list of whole numbers: write it like 128, 512") from None
    if any(n < 0 for n in shape):
        raise ValueError(f"{what} {shape} has a negative size: every size is 0 or more")
    return shape


def parse_axis_names(text: str) -> tuple[str, ...]:
    """``"data, model"`` or ``"('data', 'model')"`` -> ``('data', 'model')``."""
    names = tuple(t.strip("'\"") for t in text.strip().strip("()[]").replace(",", " ").split())
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ValueError(f"mesh axis name {bad[0]!r} is not a plain name: use letters, digits and _, like data, model")
    return names


def _entry(node: ast.expr, text: str) -> str | tuple[str, ...] | None:
    """One entry of P(...): None, an axis name (quoted or bare), or a tuple of different axis names."""
    if isinstance(node, ast.Constant) and (node.value is None or (isinstance(node.value, str) and node.value)):
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Tuple | ast.List) and node.elts:
        names = [_entry(e, text) for e in node.elts]
        if all(isinstance(n, str) for n in names):
            if len(set(names)) < len(names):
                raise ValueError(f"in {text!r}, {ast.unparse(node)} names a mesh axis twice: list each axis once")
            return tuple(names)  # type: ignore[arg-type]
    raise ValueError(f"in {text!r}, {ast.unparse(node)} is not an entry of P(...): write an axis name such as "
                     "'data', a tuple of names such as ('data', 'model'), or None (sizes go in the mesh shape)")


def parse_spec(text: str) -> PartitionSpec:
    """What goes inside ``P(...)``, read without ``eval``: ``"'data', None"`` -> ``P('data', None)``.

    ``"('data', 'model')"`` is one entry, as in ``P(('data', 'model'))``: one dimension over both axes.
    Bare names are axis names (``data, model``); ``P(...)`` around the text is allowed; ``""`` is ``P()``.
    """
    body = text.strip()
    wrapped = re.fullmatch(r"(?:P|PartitionSpec)\((.*)\)", body, re.DOTALL)
    body = wrapped[1] if wrapped else body
    try:
        call = ast.parse(f"P({body})", mode="eval").body
    except SyntaxError:
        call = None
    if not isinstance(call, ast.Call) or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        raise ValueError(f"cannot read {text!r} as the inside of P(...): write it like 'data', None")
    return PartitionSpec(*[_entry(a, text) for a in call.args])


_NAMES = ("bool", "int2", "int4", "int8", "int16", "int32", "int64", "uint2", "uint4", "uint8", "uint16", "uint32",
          "uint64", "float4_e2m1fn", "float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float32", "float64",
          "complex64", "complex128")
_SHORT = {short_dtype(name): name for name in _NAMES if hasattr(jnp, name)}
"""The short names the type strings print (``bf16``, ``i4``) -> the element types' full names."""


def _numpy_name(text: str | None) -> str | None:
    """numpy's full name for the type ``text`` names (``"i4"`` -> ``"int32"``), or None if numpy has none."""
    try:
        return None if text is None else np.dtype(text).name
    except TypeError:
        return None


def _element_type(dtype: DTypeLike | None) -> np.dtype:
    """The numeric element type that ``dtype`` names, as typed: a dtype, a numpy name such as ``"bfloat16"``
    (``jnp.`` in front is allowed), or the short name the type strings print, such as ``"bf16"``.

    numpy's byte-count codes that read differently as type strings (``"i4"``: int32 to numpy, int4 in
    ``i4[8]``) are refused, because either reading would surprise someone.
    """
    text = re.sub(r"^(?:jax\.numpy|jnp|numpy|np)\.", "", dtype.strip()) if isinstance(dtype, str) else None
    numpy_name = _numpy_name(text)
    if text in _SHORT and numpy_name not in (None, _SHORT[text]):
        raise ValueError(f"{dtype!r} means {_SHORT[text]} in JAX's type strings but {numpy_name} to numpy: "
                         f"write {_SHORT[text]} or {numpy_name}")
    try:
        element = None if dtype is None else jnp.dtype(dtype if text is None else _SHORT.get(text, text))
    except TypeError:
        element = None
    if element is None or not (jnp.issubdtype(element, jnp.number) or element == jnp.bool_):
        raise ValueError(f"{dtype!r} is not a numeric element type: use float32, bfloat16, int8 or another one")
    return element


def layout(mesh_shape: str, axis_names: str, shape: str, spec: str, dtype: DTypeLike = "float32",
           devices: Sequence[Any] | None = None) -> jax.ShapeDtypeStruct:
    """The array the boxes describe: a ``ShapeDtypeStruct`` laid out on a mesh of Auto axes.

    The mesh takes the first ``prod(mesh shape)`` of ``devices`` (default ``jax.devices()``). Raises a
    ValueError that names the fix for text it cannot read, a mesh that does not fit, a non-numeric
    element type or a spec the mesh cannot carry (:func:`utils.layout.check_spec`). A 64-bit type becomes
    the type JAX would create (float64 -> float32 while ``jax_enable_x64`` is off), so the bytes are the ones
    a learner's array holds.
    """
    sizes, names = parse_shape(mesh_shape, "mesh shape"), parse_axis_names(axis_names)
    if not sizes or 0 in sizes:
        raise ValueError(f"mesh shape {sizes} needs one size of at least 1 per axis, such as 4, 2")
    if len(names) != len(sizes):
        raise ValueError(f"the mesh shape {sizes} has {len(sizes)} axes but {len(names)} names {names}: "
                         "give one name per size")
    if len(set(names)) < len(names):
        raise ValueError(f"the mesh axis names {names} repeat a name: give every axis its own "
                         "(jax.make_mesh would quietly build fewer axes)")
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("no devices were given: leave devices out to use jax.devices()")
    need = math.prod(sizes)
    if need > len(devices):
        example = ", ".join(map(str, (len(devices),) + (1,) * (len(sizes) - 1)))
        raise ValueError(f"the mesh {sizes} needs {need} devices but {len(devices)} are here: make the sizes "
                         f"multiply to at most {len(devices)}, such as {example}")
    element = jax.dtypes.canonicalize_dtype(_element_type(dtype))
    mesh = jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(sizes), devices=devices[:need])
    array_shape, partition = parse_shape(shape), parse_spec(spec)
    check_spec(partition, dict(mesh.shape), len(array_shape))
    return jax.ShapeDtypeStruct(array_shape, element, sharding=NamedSharding(mesh, partition))


def describe(x: jax.ShapeDtypeStruct) -> str:
    """The type string, the bytes each device holds against the array's, and any dimension split unevenly.

    Sub-byte types (int4) are priced at their bits, packed (two int4 to a byte), and each device's block
    rounds up to whole bytes, because a buffer is a whole number of bytes: 3 int4 elements hold 2 B. That is
    what XLA's compiled programs hold (``memory_analysis()`` on both jax lines), while ``jax.Array.nbytes``
    counts 1 B per int4 element. The rounding can make the blocks sum to more than the packed array.
    """
    bits = jax.dtypes.itemsize_bits(x.dtype)

    def packed(elements: int) -> int:  # whole bytes for `elements` of `bits` bits each, rounded up
        return -(-elements * bits // 8)

    held = {d: packed(b // x.dtype.itemsize) for d, b in shard_table(x).bytes_per_device.items()}
    total = packed(math.prod(x.shape))
    groups: dict[int, list[int]] = {}
    for device, nbytes in sorted(held.items()):
        groups.setdefault(nbytes, []).append(device)
    if len(groups) == 1:
        per = f"each of the {len(held)} devices holds {format_bytes(next(iter(groups)))}"
    else:
        per = "; ".join(f"devices {ids} hold {format_bytes(n)} each" for n, ids in sorted(groups.items(), reverse=True))
    lines = [type_string(x), f"{per}: {sum(held.values()) / max(total, 1):.3g}x the {format_bytes(total)} array "
             f"in all{f' ({bits} bits an element, packed; a block rounds up to whole bytes)' if bits < 8 else ''}"]
    mesh_sizes = dict(x.sharding.mesh.shape)
    for dim, (n, axes) in enumerate(zip(x.shape, spec_entries(x.sharding.spec, len(x.shape)), strict=True)):
        k = math.prod(mesh_sizes[a] for a in axes)
        if n % k:
            lines.append(f"dimension {dim} ({n}) does not split into {k} equal blocks: jax.device_put refuses this "
                         f"layout, while inside jit XLA pads every block to {-(-n // k)}")
    return "\n".join(lines)


def _show(mesh_shape: str, axis_names: str, shape: str, dtype: str, spec: str,
          devices: Sequence[Any] | None = None) -> None:
    """What the explorer prints for its boxes: the description and the picture, or the one-line fix."""
    from IPython.display import display

    try:
        x = layout(mesh_shape, axis_names, shape, spec, dtype, devices)
        text = describe(x)
        figure = draw_sharding(x, show_bytes=jax.dtypes.itemsize_bits(x.dtype) >= 8)
    except ValueError as err:
        print(f"Cannot show this layout: {err}")
        return
    typed = _element_type(dtype)
    if typed != x.dtype:
        text += (f"\n{typed.name} becomes {x.dtype.name} because jax_enable_x64 is off, as in "
                 f"jnp.zeros(..., {typed.name!r}): turn it on with jax.config.update('jax_enable_x64', True)")
    print(text)
    display(figure)


def explore(*, devices: Sequence[Any] | None = None) -> Any:
    """Text boxes for the mesh shape, axis names, array shape, dtype and spec; the output follows each edit.

    Returns the ipywidgets ``interactive`` to display (its ``kwargs_widgets`` are the boxes). A box is read
    when you press Enter. Without ipywidgets it prints how to get them and shows the default layout.
    """
    try:
        import ipywidgets as w
    except ImportError:
        print("The explorer needs ipywidgets: pip install ipywidgets, then restart the kernel. The default layout:")
        _show(**DEFAULTS, devices=devices)
        return None
    labels = {"mesh_shape": "mesh shape", "axis_names": "axis names", "shape": "array shape", "dtype": "dtype",
              "spec": "P( ... )"}
    boxes = {name: w.Text(value=DEFAULTS[name], description=labels[name], continuous_update=False,
                          style={"description_width": "90px"}) for name in DEFAULTS}
    ui = w.interactive(_show, **boxes, devices=w.fixed(devices))
    ui.children = (w.HTML("Type, then press Enter. The spec box holds what goes inside <code>P(...)</code>: "
                          "<code>'data', None</code> or <code>('data', 'model')</code>."), *ui.children)
    return ui
