"""A DDPM++-style U-Net ``F(x, c_noise)`` for images, in Flax NNX (NHWC).

The architecture follows DDPM++ (Song et al., ICLR 2021, App. H; the ``SongUNet`` of
Karras et al. 2022 in its DDPM++ configuration), simplified:

* a noise embedding (positional or Fourier features of ``c_noise``) followed by a
  two-layer SiLU MLP;
* per resolution level, ``num_res_blocks`` residual blocks
  ``GroupNorm -> SiLU -> conv3x3 -> (+ emb or * (1 + scale) + shift) -> GroupNorm -> SiLU
  -> dropout -> conv3x3``, added to a (1x1-projected) skip and scaled by ``1/sqrt(2)``;
* multi-head self-attention after the residual blocks of the levels whose resolution
  is in ``attn_resolutions`` (and always in the middle block);
* downsampling by a stride-2 3x3 convolution (``ceil(n / 2)`` outputs, so odd sizes
  work: 28 -> 14 -> 7 -> 4) and upsampling by nearest-neighbour doubling cropped to
  the size of the matching encoder feature map, then a 3x3 convolution;
* a zero-initialised output convolution, so ``F = 0`` at initialisation and an
  EDM-preconditioned model starts at ``D(x) = c_skip x``.

Every parameter is an ``nnx.Param`` and the model holds no other state, so
``nnx.split(model, nnx.Param)`` captures it completely.

"Resolution" means the feature-map height (equal to the width for square images).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import is_int, is_real, require
from scorelib.nets.embeddings import embed_labels, label_embedding, make_embedding

_SKIP_SCALE = 1.0 / math.sqrt(2.0)
_MIN_CHANNELS_PER_GROUP = 4


def _groups(ch: int, num_groups: int) -> int:
    """GroupNorm groups for ``ch`` channels: ``min(num_groups, ch // 4)`` (at least 1)."""
    return max(1, min(num_groups, ch // _MIN_CHANNELS_PER_GROUP))


def _conv(cin: int, cout: int, k: int, *, rngs: nnx.Rngs, strides: int = 1, zero: bool = False):
    kw = {"kernel_init": nnx.initializers.zeros} if zero else {}
    return nnx.Conv(cin, cout, (k, k), strides=strides, padding="SAME", rngs=rngs, **kw)


class ResBlock(nnx.Module):
    """Residual block with noise-embedding injection; ``[B, H, W, cin] -> [B, H, W, cout]``."""

    def __init__(self, cin, cout, emb_dim, dropout, num_groups, scale_shift, *, rngs):
        self.norm1 = nnx.GroupNorm(cin, num_groups=_groups(cin, num_groups), rngs=rngs)
        self.conv1 = _conv(cin, cout, 3, rngs=rngs)
        self.scale_shift = scale_shift
        self.emb_proj = nnx.Linear(emb_dim, 2 * cout if scale_shift else cout, rngs=rngs)
        self.norm2 = nnx.GroupNorm(cout, num_groups=_groups(cout, num_groups), rngs=rngs)
        self.dropout = nnx.Dropout(dropout)
        self.conv2 = _conv(cout, cout, 3, rngs=rngs)
        self.skip = _conv(cin, cout, 1, rngs=rngs) if cin != cout else None

    def __call__(self, x, emb, rngs=None):
        """``x: [B, H, W, cin]``, ``emb: [B, emb_dim]`` -> ``[B, H, W, cout]``; ``rngs``
        enables dropout."""
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        e = self.emb_proj(jax.nn.silu(emb))[:, None, None, :]  # [B, 1, 1, cout or 2 cout]
        if self.scale_shift:
            scale, shift = jnp.split(e, 2, axis=-1)
            h = self.norm2(h) * (1.0 + scale) + shift
        else:
            h = self.norm2(h + e)
        h = jax.nn.silu(h)
        if rngs is not None:
            h = self.dropout(h, deterministic=False, rngs=rngs)
        h = self.conv2(h)
        skip = x if self.skip is None else self.skip(x)
        return (h + skip) * _SKIP_SCALE


class Attention(nnx.Module):
    """Multi-head self-attention over the ``H * W`` positions, residual, ``1/sqrt(2)``-scaled."""

    def __init__(self, ch, heads, num_groups, *, rngs):
        self.norm = nnx.GroupNorm(ch, num_groups=_groups(ch, num_groups), rngs=rngs)
        self.qkv = nnx.Linear(ch, 3 * ch, rngs=rngs)
        self.proj = nnx.Linear(ch, ch, rngs=rngs)
        self.heads = heads

    def __call__(self, x):
        """``x: [B, H, W, ch]`` -> ``[B, H, W, ch]``."""
        b, hh, ww, c = x.shape
        dh = c // self.heads
        qkv = self.qkv(self.norm(x)).reshape(b, hh * ww, 3, self.heads, dh)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, N, heads, dh]
        logits = jnp.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(dh)
        weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("bhnm,bmhd->bnhd", weights, v).reshape(b, hh, ww, c)
        return (x + self.proj(out)) * _SKIP_SCALE


class Stage(nnx.Module):
    """A residual block optionally followed by self-attention."""

    def __init__(self, res_block: ResBlock, attn: Attention | None):
        self.res = res_block
        self.attn = attn

    def __call__(self, x, emb, rngs=None):
        """The residual block, then attention if present; shapes as :class:`ResBlock`."""
        h = self.res(x, emb, rngs)
        return h if self.attn is None else self.attn(h)


class Downsample(nnx.Module):
    """Stride-2 3x3 convolution: ``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C]``."""

    def __init__(self, ch, *, rngs):
        self.conv = _conv(ch, ch, 3, strides=2, rngs=rngs)

    def __call__(self, x):
        """``[B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C]``."""
        return self.conv(x)


class Upsample(nnx.Module):
    """Nearest-neighbour x2, cropped to ``size = (H, W)``, then a 3x3 convolution."""

    def __init__(self, ch, *, rngs):
        self.conv = _conv(ch, ch, 3, rngs=rngs)

    def __call__(self, x, size):
        """``x: [B, h, w, C]`` -> ``[B, size[0], size[1], C]`` (``size <= (2h, 2w)``)."""
        x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)[:, : size[0], : size[1]]
        return self.conv(x)


class Level(nnx.Module):
    """The stages of one resolution level and its resampler (``None`` at the end)."""

    def __init__(self, stages, resample):
        self.stages = nnx.List(stages)
        self.resample = resample


class UNet(nnx.Module):
    """DDPM++-style U-Net; same call signature as :class:`scorelib.nets.MLP`.

    Args:
      data_shape: ``(H, W, C)`` of one image.
      channels: base channel count; level ``i`` has ``channels * channel_mult[i]``.
      channel_mult: one multiplier per resolution level (positive ints).
      num_res_blocks: residual blocks per level in the encoder (the decoder has one more).
      attn_resolutions: feature-map heights at which self-attention follows each residual
        block; each must be a height the network reaches (e.g. 28, 14, 7 for 28x28 with
        three levels). The middle block always has attention.
      dropout: dropout rate in ``[0, 1)``, active only when ``rngs`` is passed to the call.
      emb_dim: size of the noise embedding and its MLP (default ``4 * channels``; even).
      embedding: ``'positional'`` or ``'fourier'`` features of ``c_noise``.
      num_groups: upper bound on GroupNorm groups; a layer with ``ch`` channels uses
        ``min(num_groups, ch // 4)`` groups, which must divide ``ch``.
      attn_heads: attention heads; must divide the channels of every attention layer.
      scale_shift: inject the embedding as ``norm(h) * (1 + scale) + shift`` (True) or
        by adding it before the second GroupNorm (False, as in DDPM++).
      num_classes: ``K >= 1``: class-conditional, the embedded label (``K`` the null label,
        zero) added to the noise features before the embedding MLP (EDM's SongUNet,
        ``map_label``); 0 (the default): unconditional.
      rngs: ``nnx.Rngs`` with a ``params`` stream for initialisation.

    Raises:
      ValueError: naming the offending field (``model.data_shape``, ``model.channels``,
        ``model.channel_mult``, ``model.num_res_blocks``, ``model.attn_resolutions``,
        ``model.dropout``, ``model.emb_dim``, ``model.embedding``, ``model.num_groups``,
        ``model.attn_heads``).
    """

    def __init__(
        self,
        data_shape,
        channels: int = 64,
        channel_mult=(1, 2, 2),
        num_res_blocks: int = 2,
        attn_resolutions=(16,),
        dropout: float = 0.1,
        emb_dim: int | None = None,
        embedding: str = "positional",
        num_groups: int = 32,
        attn_heads: int = 1,
        scale_shift: bool = True,
        num_classes: int = 0,
        *,
        rngs: nnx.Rngs,
    ):
        data_shape = tuple(data_shape)
        channel_mult = tuple(channel_mult)
        attn_resolutions = tuple(attn_resolutions)
        emb_dim = 4 * channels if emb_dim is None else emb_dim
        require(
            len(data_shape) == 3 and all(_pos_int(n) for n in data_shape),
            "model.data_shape",
            "(H, W, C) of positive ints",
            data_shape,
        )
        require(_pos_int(channels), "model.channels", "a positive int", channels)
        require(
            len(channel_mult) > 0 and all(_pos_int(m) for m in channel_mult),
            "model.channel_mult",
            "a non-empty sequence of positive ints",
            channel_mult,
        )
        require(_pos_int(num_res_blocks), "model.num_res_blocks", "a positive int", num_res_blocks)
        require(is_real(dropout) and 0.0 <= dropout < 1.0, "model.dropout", "in [0, 1)", dropout)
        require(
            _pos_int(emb_dim) and emb_dim % 2 == 0, "model.emb_dim", "a positive even int", emb_dim
        )
        require(_pos_int(num_groups), "model.num_groups", "a positive int", num_groups)
        require(_pos_int(attn_heads), "model.attn_heads", "a positive int", attn_heads)

        height, _, cin = data_shape
        resolutions = [height]
        for _ in channel_mult[1:]:
            resolutions.append(-(-resolutions[-1] // 2))
        bad = [r for r in attn_resolutions if r not in resolutions]
        require(
            not bad,
            "model.attn_resolutions",
            f"a subset of the reachable resolutions {resolutions} (feature-map heights)",
            attn_resolutions,
        )
        level_ch = [channels * m for m in channel_mult]
        for ch in [channels, *level_ch]:
            g = _groups(ch, num_groups)
            require(
                ch % g == 0,
                "model.num_groups",
                f"such that min(num_groups, ch // 4) = {g} divides every channel count "
                f"(model.channels * model.channel_mult has {ch})",
                num_groups,
            )
        for ch, r in [*zip(level_ch, resolutions, strict=True), (level_ch[-1], None)]:
            if r is None or r in attn_resolutions:
                require(
                    ch % attn_heads == 0,
                    "model.attn_heads",
                    f"a divisor of the attention channels ({ch})",
                    attn_heads,
                )

        self.data_shape = data_shape
        self.embed = make_embedding(embedding, emb_dim, rngs=rngs)
        self.label_emb = label_embedding(num_classes, emb_dim, rngs=rngs)
        self.num_classes = 0 if self.label_emb is None else self.label_emb.num_classes
        self.emb1 = nnx.Linear(emb_dim, emb_dim, rngs=rngs)
        self.emb2 = nnx.Linear(emb_dim, emb_dim, rngs=rngs)
        self.conv_in = _conv(cin, channels, 3, rngs=rngs)

        def stage(ci, co, attn):
            res = ResBlock(ci, co, emb_dim, dropout, num_groups, scale_shift, rngs=rngs)
            return Stage(res, Attention(co, attn_heads, num_groups, rngs=rngs) if attn else None)

        skip_ch, cur, down = [channels], channels, []
        for i, (co, r) in enumerate(zip(level_ch, resolutions, strict=True)):
            stages = []
            for _ in range(num_res_blocks):
                stages.append(stage(cur, co, r in attn_resolutions))
                cur = co
                skip_ch.append(cur)
            last = i == len(level_ch) - 1
            if not last:
                skip_ch.append(cur)
            down.append(Level(stages, None if last else Downsample(cur, rngs=rngs)))
        self.down = nnx.List(down)

        self.mid = nnx.List([stage(cur, cur, True), stage(cur, cur, False)])

        up = []
        for i in reversed(range(len(level_ch))):
            stages = []
            for _ in range(num_res_blocks + 1):
                stages.append(
                    stage(cur + skip_ch.pop(), level_ch[i], resolutions[i] in attn_resolutions)
                )
                cur = level_ch[i]
            up.append(Level(stages, Upsample(cur, rngs=rngs) if i > 0 else None))
        self.up = nnx.List(up)

        self.norm_out = nnx.GroupNorm(cur, num_groups=_groups(cur, num_groups), rngs=rngs)
        self.conv_out = _conv(cur, cin, 3, rngs=rngs, zero=True)

    def _embedding(self, c_noise, labels, b):
        """``[B, emb_dim]``: the embedding MLP of the noise features plus the label's."""
        e = self.embed(c_noise)
        lab = embed_labels(self, labels, b)
        e = e if lab is None else e + lab
        return self.emb2(jax.nn.silu(self.emb1(e)))

    def __call__(self, x, c_noise, labels=None, *, rngs: nnx.Rngs | None = None):
        """``x: [B, H, W, C]``, ``c_noise: [B]``, ``labels: [B]`` int in ``[0, num_classes]``
        or ``None`` (null) -> ``[B, H, W, C]``; ``rngs`` enables dropout.

        Raises:
          ValueError: if ``x`` is not ``[B, *data_shape]`` or ``c_noise`` is not ``[B]``.
        """
        require(
            x.ndim == 4 and tuple(x.shape[1:]) == self.data_shape,
            "x",
            f"of shape [B, *{self.data_shape}]",
            x.shape,
        )
        require(
            c_noise.shape == (x.shape[0],), "c_noise", f"of shape ({x.shape[0]},)", c_noise.shape
        )
        emb = self._embedding(c_noise, labels, x.shape[0])

        h = self.conv_in(x)
        skips = [h]
        for level in self.down:
            for st in level.stages:
                h = st(h, emb, rngs)
                skips.append(h)
            if level.resample is not None:
                h = level.resample(h)
                skips.append(h)
        for st in self.mid:
            h = st(h, emb, rngs)
        for level in self.up:
            for st in level.stages:
                h = st(jnp.concatenate([h, skips.pop()], axis=-1), emb, rngs)
            if level.resample is not None:
                h = level.resample(h, skips[-1].shape[1:3])
        return self.conv_out(jax.nn.silu(self.norm_out(h)))

    def features(self, x, c_noise, labels=None):
        """The encoder's feature maps, one per resolution, for a discriminator head.

        Runs the encoder and the middle block of :meth:`__call__` (no dropout) and returns
        the output of each level's last residual stage (before its downsampling) and of
        the middle block: ``[B, H_l, W_l, C_l]`` for the resolutions in ``resolutions``
        plus the bottleneck (the discriminator inputs of Xu et al. 2025, Table 5).

        Raises:
          ValueError: as :meth:`__call__`.
        """
        require(
            x.ndim == 4 and tuple(x.shape[1:]) == self.data_shape,
            "x",
            f"of shape [B, *{self.data_shape}]",
            x.shape,
        )
        emb = self._embedding(c_noise, labels, x.shape[0])
        h = self.conv_in(x)
        out = []
        for level in self.down:
            for st in level.stages:
                h = st(h, emb)
            out.append(h)
            if level.resample is not None:
                h = level.resample(h)
        for st in self.mid:
            h = st(h, emb)
        out.append(h)
        return out


def _pos_int(v) -> bool:
    return is_int(v) and v > 0
