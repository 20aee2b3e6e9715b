"""Code saved from the notebooks: notebooks/07_data_parallel.py, notebooks/08_tensor_parallel.py, notebooks/11_transformer.py. GENERATED, do not edit.

Each part is a notebook cell tagged 'save'. Edit the cell in its notebook, then run
`python tools/notebooks.py save`; tests/test_saved_code.py fails while this file is out of date.
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
import numpy as np
from flax.linen import with_logical_constraint


# --- from notebooks/07_data_parallel.py
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


key_x, key_teacher = jax.random.split(jax.random.key(0))
x = jax.random.normal(key_x, (64, 64))
w_teacher = jax.random.normal(key_teacher, (64, 10))
y = jnp.argmax(x @ w_teacher, axis=-1).astype(jnp.int32)


def step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


train_step = nnx.jit(step, donate_argnums=(0, 1))  # model and optimizer are updated in place


# --- from notebooks/07_data_parallel.py
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


# --- from notebooks/11_transformer.py
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
