"""A decoder-only transformer (GPT): pre-norm blocks, causal attention, tied embeddings.

The shape of nanoGPT's character-level Shakespeare model: learned position
embeddings, layer norm before attention and before the MLP (no biases
anywhere), a GELU MLP four times the width, a final layer norm, and logits
from the token embedding's transpose. No dropout: the runs are short, and
every worker's step stays a deterministic function of its batch.

Parameters are named so that methods can find the blocks: `embed`,
`pos_embed`, `block_0` ... `block_{L-1}`, `ln_f` (Streaming DiLoCo groups
blocks into fragments by these names).

Sizes (`SIZES`): `mini` (2 blocks × 64) is the few-step size of tests, CI
and notebooks; `tiny` (4 × 64) trains on a 2-core CPU in minutes; `small`
is nanoGPT's `shakespeare_char` model (6 layers × 384, 6 heads, context 256,
≈10.7M parameters), for a GPU.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Size:
  """A transformer's shape: blocks, width, heads, and the longest context it takes."""

  layers: int
  width: int
  heads: int
  context: int


SIZES = {
  'mini': Size(layers=2, width=64, heads=4, context=64),
  'tiny': Size(layers=4, width=64, heads=4, context=64),
  'small': Size(layers=6, width=384, heads=6, context=256),
}

_INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
  """Pre-norm causal self-attention and a 4x GELU MLP, each added to the residual stream."""

  width: int
  heads: int

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    t = x_BxTxD.shape[1]
    mask = nn.make_causal_mask(jnp.ones((1, t), bool))
    h = nn.LayerNorm(use_bias=False, name='ln_1')(x_BxTxD)
    h = nn.MultiHeadDotProductAttention(
      num_heads=self.heads, use_bias=False, kernel_init=_INIT, deterministic=True, name='attn'
    )(h, mask=mask)
    x_BxTxD = x_BxTxD + h
    h = nn.LayerNorm(use_bias=False, name='ln_2')(x_BxTxD)
    h = nn.Dense(4 * self.width, use_bias=False, kernel_init=_INIT, name='fc')(h)
    h = nn.Dense(self.width, use_bias=False, kernel_init=_INIT, name='proj')(nn.gelu(h))
    return x_BxTxD + h


class GPT(nn.Module):
  """Decoder-only transformer: tokens [B, T] (T <= context) -> next-token logits [B, T, V].

  Attributes:
    num_classes: the vocabulary size V.
    layers: transformer blocks.
    width: the residual stream's width.
    heads: attention heads (must divide `width`).
    context: the longest sequence (the position embeddings' rows).
  """

  num_classes: int
  layers: int = SIZES['tiny'].layers
  width: int = SIZES['tiny'].width
  heads: int = SIZES['tiny'].heads
  context: int = SIZES['tiny'].context

  def setup(self):
    if self.width % self.heads:
      raise ValueError(f'GPT: heads ({self.heads}) must divide width ({self.width})')

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    t = tokens_BxT.shape[1]
    if t > self.context:
      raise ValueError(f'GPT: sequences of {t} tokens, longer than its context {self.context}')
    embed = nn.Embed(self.num_classes, self.width, embedding_init=_INIT, name='embed')
    pos = self.param('pos_embed', _INIT, (self.context, self.width))
    x = embed(tokens_BxT.astype(jnp.int32)) + pos[:t]
    for i in range(self.layers):
      x = Block(self.width, self.heads, name=f'block_{i}')(x)
    x = nn.LayerNorm(use_bias=False, name='ln_f')(x)
    return embed.attend(x)


def gpt(num_classes: int, size: str = 'tiny', **overrides) -> GPT:
  """The GPT of a named size (`SIZES`), any of its fields overridden.

  Args:
    num_classes: the vocabulary size V.
    size: 'mini', 'tiny' or 'small'.
    **overrides: `GPT` fields to set instead of the size's (e.g. `context`).

  Returns:
    The `GPT`.
  """
  if size not in SIZES:
    raise ValueError(f'unknown GPT size {size!r}; choose one of {sorted(SIZES)}')
  return GPT(num_classes=num_classes, **(dataclasses.asdict(SIZES[size]) | overrides))
