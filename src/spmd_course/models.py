"""Code saved from the notebooks: notebooks/02_partitionspec.py, notebooks/05_constraints_explicit.py, notebooks/06_shard_map.py, notebooks/07_data_parallel.py, notebooks/08_tensor_parallel.py, notebooks/10_fsdp.py, notebooks/12_transformer.py, notebooks/20_context.py. GENERATED, do not edit.

Each part is a notebook cell tagged 'save'. Edit the cell in its notebook, then run
`python tools/notebooks.py save`; tests/test_saved_code.py fails while this file is out of date.
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
from flax.linen import with_logical_constraint


# --- from notebooks/02_partitionspec.py
def sum_of_cosines(a, layout):
    b = jax.lax.with_sharding_constraint(a * 2, layout)  # here: 10 elements split 4 ways, inside jit
    return jnp.cos(b).sum()


# --- from notebooks/05_constraints_explicit.py
def score(w, b, pin=None):
    """The mean of tanh(b @ w). `pin`: a sharding the batch is constrained to where it enters, or None."""
    if pin is not None:
        b = jax.lax.with_sharding_constraint(b, pin)
    return jnp.mean(jnp.tanh(b @ w))


# --- from notebooks/05_constraints_explicit.py
def chain(x, w1, w2, pin=None):
    """Two layers, relu(x @ w1) @ w2. `pin`: a sharding the hidden activation is constrained to, or None to
    let the compiler choose."""
    h = jax.nn.relu(x @ w1)
    if pin is not None:
        h = jax.lax.with_sharding_constraint(h, pin)
    return h @ w2


# --- from notebooks/05_constraints_explicit.py
def reshard_via(v, *layouts):
    """v constrained to each sharding of `layouts` in turn: the last is where it ends, any before it a waypoint."""
    for layout in layouts:
        v = jax.lax.with_sharding_constraint(v, layout)
    return v


# --- from notebooks/06_shard_map.py
def sums_of_product(xb, wb):
    """One device's rows of x times w, summed over the rows, then added up over `data`."""
    return jax.lax.psum((xb @ wb).sum(axis=0), "data")


# --- from notebooks/07_data_parallel.py
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


@jax.jit  # one compiled program, rather than one per operation (jax.random, @, argmax), each compiled on first use
def teacher_data(key):
    """64 examples of 64 features, labelled by a fixed random "teacher" matrix."""
    key_x, key_teacher = jax.random.split(key)
    x = jax.random.normal(key_x, (64, 64))
    w_teacher = jax.random.normal(key_teacher, (64, 10))
    return x, jnp.argmax(x @ w_teacher, axis=-1).astype(jnp.int32)


x, y = teacher_data(jax.random.key(0))


def step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


train_step = nnx.jit(step, donate_argnums=(0, 1))  # model and optimizer are updated in place


# --- from notebooks/07_data_parallel.py
@nnx.jit  # compiled whole, rather than one small program per operation of the gradient
def first_layer_gradient(model, x, y):
    """dh: the gradient of the course's loss at the MLP's first layer output (before the ReLU), on one device.
    Notebooks 09 and 10 read their pending-sum types from it too."""

    def loss_after_w1(h):  # the rest of the network: ReLU, linear2 and the loss
        return optax.softmax_cross_entropy_with_integer_labels(model.linear2(jax.nn.relu(h)), y).mean()

    return jax.grad(loss_after_w1)(model.linear1(x))


# --- from notebooks/08_tensor_parallel.py
def param_name(path):  # (DictKey('linear1'), DictKey('kernel'), GetAttrKey('value')) -> 'linear1/kernel'
    return "/".join(str(k.key) for k in path if hasattr(k, "key"))


def create(make, layout, mesh):
    """The module `make()` builds, created on `mesh` with each parameter where `layout` (name -> spec) says."""

    @nnx.jit
    def build():
        module = make()
        state = nnx.state(module)
        specs = jax.tree_util.tree_map_with_path(lambda path, _: NamedSharding(mesh, layout[param_name(path)]), state)
        nnx.update(module, jax.lax.with_sharding_constraint(state, specs))
        return module

    return build()


# --- from notebooks/10_fsdp.py
def mlp_and_adam():
    """Notebook 07's MLP with its Adam optimizer, built from the same seed every time."""
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


# --- from notebooks/10_fsdp.py
def path_name(path):
    """'linear1/kernel' for the path of an NNX Variable's array."""
    return jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")


def fsdp_rule(path, leaf, *, mesh, min_size=1024):
    """Where one array of a state lives under FSDP (decides only; moves nothing)."""
    n = mesh.shape["fsdp"]
    if leaf.size > min_size:
        for dim, size in enumerate(leaf.shape):
            if size % n == 0:
                spec = [None] * leaf.ndim
                spec[dim] = "fsdp"  # split this dimension n ways, keep the others whole
                return NamedSharding(mesh, P(*spec))
        print(f"fsdp_rule: {path_name(path)} {leaf.shape} has no dimension divisible by {n}; replicated")
    return NamedSharding(mesh, P())  # small: a full copy on every device


def by_name(tree):
    """{'linear1/kernel': leaf, ...} for a state or a pytree of shardings."""
    return {path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


# --- from notebooks/10_fsdp.py
def create_sharded(shardings):
    """A jitted constructor of `mlp_and_adam()` whose state comes out laid out as `shardings` says."""

    @nnx.jit
    def build():
        model, optimizer = mlp_and_adam()
        state = nnx.state((model, optimizer))
        nnx.update((model, optimizer), jax.lax.with_sharding_constraint(state, shardings))
        return model, optimizer

    return build


# --- from notebooks/12_transformer.py
dense_init = nnx.initializers.lecun_normal()
embed_init = nnx.initializers.normal(0.02)
part = nnx.with_partitioning  # part(init, names): an initializer whose arrays carry logical names
RESIDUAL = ("batch", None, None)  # the residual stream [batch, seq, embed]: split the batch only


def layer_norm(d_model, rngs):
    return nnx.LayerNorm(d_model, scale_init=part(nnx.initializers.ones_init(), ("embed",)),
                         bias_init=part(nnx.initializers.zeros_init(), ("embed",)), rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, d_model, num_heads, *, rngs):
        self.num_heads = num_heads
        qkv = dict(kernel_init=part(dense_init, ("embed", "heads")), use_bias=False, rngs=rngs)
        self.query = nnx.Linear(d_model, d_model, **qkv)
        self.key = nnx.Linear(d_model, d_model, **qkv)
        self.value = nnx.Linear(d_model, d_model, **qkv)
        self.out = nnx.Linear(d_model, d_model, kernel_init=part(dense_init, ("heads", "embed")),
                              use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, s, d = x.shape
        h = self.num_heads
        q, k, v = (f(x).reshape(b, s, h, d // h) for f in (self.query, self.key, self.value))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(d // h))
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)  # causal: no peeking ahead
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return self.out(y.reshape(b, s, d))


class FeedForward(nnx.Module):
    def __init__(self, d_model, d_ff, *, rngs):
        self.up = nnx.Linear(d_model, d_ff, kernel_init=part(dense_init, ("embed", "mlp")), use_bias=False, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, kernel_init=part(dense_init, ("mlp", "embed")), use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    def __init__(self, d_model, num_heads, d_ff, *, rngs):
        self.norm1, self.attn = layer_norm(d_model, rngs), Attention(d_model, num_heads, rngs=rngs)
        self.norm2, self.mlp = layer_norm(d_model, rngs), FeedForward(d_model, d_ff, rngs=rngs)

    def __call__(self, x):
        x = with_logical_constraint(x + self.attn(self.norm1(x)), RESIDUAL)
        return with_logical_constraint(x + self.mlp(self.norm2(x)), RESIDUAL)


class MyTransformer(nnx.Module):
    def __init__(self, d_model=64, num_layers=2, num_heads=8, d_ff=256, vocab_size=32, max_len=16, *, rngs):
        self.tokens = nnx.Embed(vocab_size, d_model, embedding_init=part(embed_init, ("vocab", "embed")), rngs=rngs)
        self.positions = nnx.Embed(max_len, d_model, embedding_init=part(embed_init, (None, "embed")), rngs=rngs)
        self.blocks = nnx.List([Block(d_model, num_heads, d_ff, rngs=rngs) for _ in range(num_layers)])
        self.norm = layer_norm(d_model, rngs)
        self.head = nnx.Linear(d_model, vocab_size, kernel_init=part(dense_init, ("embed", "vocab")),
                               use_bias=False, rngs=rngs)

    def __call__(self, tokens):  # int32[batch, seq] -> logits f32[batch, seq, vocab]
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[1]))
        x = with_logical_constraint(x, RESIDUAL)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# --- from notebooks/20_context.py
MASKED = -1e30  # the score of a masked pair: finite, so that exp(MASKED - m) is 0, never nan


def online_update(state, q, k, v, q_pos, k_pos):
    """Merge one key/value block into the running (max, sum, weighted values) of every query."""
    m, total, acc = state  # m, total: [batch, heads, queries]; acc: [batch, heads, queries, head_dim], float32
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(q.shape[-1])
    visible = q_pos[:, None] >= k_pos[None, :]  # causal: a query sees its own and earlier positions
    s = jnp.where(visible, s, MASKED)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(visible, jnp.exp(s - m_new[..., None]), 0.0)
    rescale = jnp.exp(m - m_new)  # what the old sums were measured against, brought to the new maximum
    total = total * rescale + p.sum(-1)
    acc = acc * rescale[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p.astype(v.dtype), v,
                                                preferred_element_type=jnp.float32)
    return m_new, total, acc


def attend_tiles(state, q, k, v, q_pos, k_pos, tile):
    """online_update over the keys in tiles of `tile` positions (a scan), so scores exist one tile at a time."""
    n = k.shape[1] // tile
    if n <= 1:
        return online_update(state, q, k, v, q_pos, k_pos)
    tiles = (k.reshape(k.shape[0], n, tile, *k.shape[2:]).swapaxes(0, 1),
             v.reshape(v.shape[0], n, tile, *v.shape[2:]).swapaxes(0, 1), k_pos.reshape(n, tile))
    return jax.lax.scan(lambda st, t: (online_update(st, q, *t[:2], q_pos, t[2]), None), state, tiles)[0]


def no_keys_seen(q):
    """No keys seen yet; built from q so that it varies over the mesh axis as q does (inside shard_map)."""
    zeros = jnp.zeros_like(q, jnp.float32).swapaxes(1, 2)  # [batch, heads, queries, head_dim]
    return zeros[..., 0] + MASKED, zeros[..., 0], zeros


def normalized_output(state, dtype):
    _, total, acc = state
    return (acc / total[..., None]).swapaxes(1, 2).astype(dtype)  # back to [batch, queries, heads, head_dim]


def ring_attention(q, k, v, q_pos, k_pos, *, axis, zigzag, tile=1 << 30):
    """Causal attention of this device's queries against every device's keys and values, passed in a ring.

    zigzag=False: each device holds one contiguous block, and skips a block that is all in its future.
    zigzag=True: each device holds chunks c and 2n-1-c of 2n (section 2), and computes half of each block.
    """
    n, me = jax.lax.axis_size(axis), jax.lax.axis_index(axis)
    ring = [(d, (d + 1) % n) for d in range(n)]
    state = attend_tiles(no_keys_seen(q), q, k, v, q_pos, k_pos, tile)  # step 0: my own block
    half = q.shape[1] // 2

    def whole(state, k, v, k_pos):
        return attend_tiles(state, q, k, v, q_pos, k_pos, tile)

    def skip(state, k, v, k_pos):
        return state

    def front_keys(state, k, v, k_pos):  # from an earlier device: only its front chunk is in my past
        return attend_tiles(state, q, k[:, :half], v[:, :half], q_pos, k_pos[:half], tile)

    def back_queries(state, k, v, k_pos):  # from a later device: only my back chunk sees it, all of it
        back = attend_tiles(tuple(a[:, :, half:] for a in state), q[:, half:], k, v, q_pos[half:], k_pos, tile)
        return tuple(jnp.concatenate([a[:, :, :half], b], axis=2) for a, b in zip(state, back, strict=True))

    def ring_step(s, carry):
        state, kv = carry
        kv = jax.lax.ppermute(kv, axis, ring)  # pass my block on, receive my neighbour's
        earlier = (me - s) % n < me  # did this block start on an earlier device?
        state = jax.lax.cond(earlier, *((front_keys, back_queries) if zigzag else (whole, skip)), state, *kv)
        return state, kv

    state, _ = jax.lax.fori_loop(1, n, ring_step, (state, (k, v, k_pos)))
    return normalized_output(state, q.dtype)


def gather_attention(q, k, v, q_pos, k_pos, *, axis, tile=1 << 30):
    """The other way: all-gather every key and value onto every device, then attend to them tile by tile."""
    k, v = (jax.lax.all_gather(a, axis, axis=1, tiled=True) for a in (k, v))
    k_pos = jax.lax.all_gather(k_pos, axis, tiled=True)
    return normalized_output(attend_tiles(no_keys_seen(q), q, k, v, q_pos, k_pos, tile), q.dtype)


def zigzag_order(length, n):
    """Token order that gives device d chunks d and 2n-1-d of 2n equal chunks (read in order, split n ways)."""
    chunks = np.arange(length).reshape(2 * n, length // (2 * n))
    return np.concatenate([np.concatenate([chunks[d], chunks[2 * n - 1 - d]]) for d in range(n)])
