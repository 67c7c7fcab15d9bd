"""Why impulse structure fades with depth: each block's attention logits on real images split into position–position,
position–content, content–position and content–content terms (:func:`split_logits`, :func:`logit_terms`).

**The split.** Let ``x_l`` be the residual stream entering block ``l`` on a batch of images and ``p_l`` the stream of
the same forward on an all-zero image (a normalised pipeline's zero is the dataset's mean colour: no image content),
so ``p_l`` is what the network makes of the position embedding, the class token and every bias alone, *propagated
through the blocks before l*. The content part is ``c_l = x_l − p_l``: everything the image adds, its interactions
through earlier attention and MLPs included. The pre-norm is not linear in ``x``, but it is affine once each token's
own scale is fixed: ``LN(x) = γ ⊙ (x − mean(x)) / σ(x) + β`` with ``σ(x) = sqrt(var(x) + eps)`` of the real token. With
that real ``σ(x)`` the normed input splits exactly,

    u = LN(x) = u_p + u_c,   u_p = γ ⊙ (p − mean(p)) / σ(x) + β,   u_c = γ ⊙ (c − mean(c)) / σ(x),

and the qkv bias goes with ``u_p`` (``q_p = W_q u_p + b_q``, ``q_c = W_q u_c``; the same for ``k``), so the scaled
logits ``s·q·k`` are exactly ``s·q_p·k_p + s·q_p·k_c + s·q_c·k_p + s·q_c·k_c``. This choice (rather than the batch
mean of ``LN(x)`` as the positional part) keeps the positional part free of the mean image, and it shows the dilution
directly: image content raises ``σ(x)``, which shrinks ``u_p`` and with it the position–position term, while the
content terms are added noise. On the zero image ``c = 0`` and the three content terms vanish.

The RMS of each term is taken over images, heads, patch-token queries and all keys *after centring each query's row
over the keys* (a softmax ignores a row's constant; the centring is linear, so the centred terms still add up to the
centred logits).

Applies to the ``vit`` family (:func:`impulsevit.init.vit_layout.vit_layout`: timm fused-qkv ``Attention`` blocks with
a ``norm1`` that is an ``nn.LayerNorm``, an absolute ``pos_embed``). Not supported: RMSNorm / other pre-norms, relative
or rotary position encodings (EVA-02, Swin: the split of a bias or a rotation is another construction), Mixer (see
``FAMILIES.md``). Under FSDP2 every rank calls it (the parameters are gathered with ``read_full``, a collective).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import nn

from impulsevit.init.api import read_full
from impulsevit.init.capture import module_calls
from impulsevit.init.diagnostics import summarize
from impulsevit.init.vit_layout import VitLayout, vit_layout

__all__ = ["TERMS", "LayerTerms", "TermTable", "split_logits", "logit_terms"]

TERMS = ("pos_pos", "pos_content", "content_pos", "content_content")
"""The four terms of ``s·(q_p + q_c)·(k_p + k_c)``, query part first."""


@dataclasses.dataclass
class LayerTerms:
    """One block's term split on a batch of real images (means over heads; see the module docstring).

    Attributes:
        layer: block index.
        pos_pos, pos_content, content_pos, content_content: key-centred RMS of each term of the scaled logits (logit
            units: nats of softmax odds).
        logits: key-centred RMS of the full logits.
        pos_share: RMS of ``u_p`` over RMS of ``u`` (the normed input), over patch tokens and images.
        mass: mean mass on the head's target offset on the images (:func:`impulsevit.init.diagnostics.summarize`).
        mass_pos: the same with the position–position term alone as the logits (content removed, the real ``σ(x)``
            kept): below ``mass_zero`` when the content's share of the norm has shrunk the positional signal.
        mass_zero: the same on the zero image (the positional stream propagated alone; its own ``σ``).
    """

    layer: int
    pos_pos: float
    pos_content: float
    content_pos: float
    content_content: float
    logits: float
    pos_share: float
    mass: float
    mass_pos: float
    mass_zero: float


class TermTable(list):
    """A list of :class:`LayerTerms`, printable as a table (``str(table)``) and as Markdown (:meth:`markdown`)."""

    HEADER = ("layer", "pos-pos", "pos-cont", "cont-pos", "cont-cont", "logits", "pos share", "mass",
              "mass pos-only", "mass zero-image")

    def rows(self) -> list[list[str]]:
        return [[str(t.layer), *(f"{getattr(t, k):.2f}" for k in (*TERMS, "logits")), f"{t.pos_share:.2f}",
                 *(f"{v:.3f}" for v in (t.mass, t.mass_pos, t.mass_zero))] for t in self]

    def table(self) -> str:
        widths = [max(len(h), 6) for h in self.HEADER]
        lines = [" ".join(h.rjust(w) for h, w in zip(self.HEADER, widths, strict=True))]
        lines += [" ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in self.rows()]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.HEADER) + " |", "|" + "---|" * len(self.HEADER)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> list[dict[str, float]]:
        return [dataclasses.asdict(t) for t in self]


@dataclasses.dataclass
class _Streams:
    """Per block: the stream entering it ``x`` ``(B, T, D)`` and its ``norm1`` output ``u``."""

    x: list[torch.Tensor]
    u: list[torch.Tensor]


def _capture(model: nn.Module, images: torch.Tensor) -> _Streams:
    """Each block's ``norm1`` input and output in the eval-mode forward of ``images`` (float32; mode restored)."""
    calls = module_calls(model, [b.norm1 for b in model.blocks.children()], images)
    return _Streams([c.args[0].float() for c in calls], [c.output.float() for c in calls])


def _check_norms(model: nn.Module, layout: VitLayout) -> list[nn.LayerNorm]:
    norms = [getattr(b, "norm1", None) for b in model.blocks.children()]
    for i, norm in enumerate(norms):
        if not isinstance(norm, nn.LayerNorm):
            raise ValueError(f"{layout.model}.blocks.{i}.norm1 is {type(norm).__name__}, not a LayerNorm: the "
                             "logit term split needs an affine pre-norm (see impulsevit.init.logit_terms)")
    return norms  # type: ignore[return-value]


def _heads(t: torch.Tensor, h: int, d: int) -> torch.Tensor:
    """``(B, T, h·d)`` → ``(B, h, T, d)``."""
    return t.reshape(t.shape[0], t.shape[1], h, d).transpose(1, 2)


def _layer_split(norm: nn.LayerNorm, attn: nn.Module, x: torch.Tensor, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four terms ``(B, h, T, T)`` of one block (module docstring), plus ``"full"`` from ``u_p + u_c``."""
    eps = norm.eps
    # read_full: under FSDP2 the forward has resharded the parameters again by now (a collective: every rank calls it)
    gamma = read_full(norm.weight).float() if norm.weight is not None else x.new_ones(x.shape[-1])
    beta = read_full(norm.bias).float() if norm.bias is not None else x.new_zeros(x.shape[-1])
    sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    c = x - p
    u_p = gamma * (p - p.mean(-1, keepdim=True)) / sigma + beta
    u_c = gamma * (c - c.mean(-1, keepdim=True)) / sigma
    width = attn.num_heads * attn.head_dim
    w = read_full(attn.qkv.weight).float()
    b = read_full(attn.qkv.bias).float() if attn.qkv.bias is not None else x.new_zeros(3 * width)
    h, d = attn.num_heads, attn.head_dim
    q_p = _heads(u_p @ w[:width].T + b[:width], h, d)
    k_p = _heads(u_p @ w[width:2 * width].T + b[width:2 * width], h, d)
    q_c, k_c = _heads(u_c @ w[:width].T, h, d), _heads(u_c @ w[width:2 * width].T, h, d)
    s = float(getattr(attn, "scale", d**-0.5))
    return {
        "pos_pos": s * q_p @ k_p.transpose(-2, -1),
        "pos_content": s * q_p @ k_c.transpose(-2, -1),
        "content_pos": s * q_c @ k_p.transpose(-2, -1),
        "content_content": s * q_c @ k_c.transpose(-2, -1),
        "u_p": u_p,
        "u_c": u_c,
    }


def split_logits(model: nn.Module, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per block, the four terms of the attention logits on ``images`` (module docstring), float32.

    Args:
        model: a timm ViT (``vit`` family, LayerNorm pre-norm).
        images: ``(B, C, H, W)``, normalised as the model's inputs are.

    Returns:
        Per block a dict: :data:`TERMS` → ``(B, h, T, T)`` scaled logits (rows = queries, prefix tokens first), and
        ``"u_p"`` / ``"u_c"`` ``(B, T, D)``, the positional and content parts of ``norm1``'s output, and ``"u"``, the
        output as the forward computed it (``u_p + u_c = u`` to float tolerance).

    Raises:
        ValueError: the model is not a supported ViT or a ``norm1`` is not a LayerNorm.
    """
    layout = vit_layout(model, need_pos_embed=False)
    norms = _check_norms(model, layout)
    with torch.no_grad():
        real = _capture(model, images)
        zero = _capture(model, torch.zeros_like(images[:1]))
        out = []
        for i, (norm, attn) in enumerate(zip(norms, layout.attns, strict=True)):
            split = _layer_split(norm, attn, real.x[i], zero.x[i])
            split["u"] = real.u[i]
            out.append(split)
    return out


def _key_centred_rms(t: torch.Tensor, queries: slice) -> float:
    rows = t[:, :, queries]
    return float((rows - rows.mean(-1, keepdim=True)).pow(2).mean().sqrt())


def _mean_mass(logits: torch.Tensor, offsets: Sequence[tuple[int, int]], grid: tuple[int, int], prefix: int) -> float:
    maps = torch.softmax(logits, dim=-1).mean(0)
    return summarize([maps], [list(offsets)], grid=grid, num_prefix=prefix).mean("target_mass")


def logit_terms(
    model: nn.Module, images: torch.Tensor, offsets: Sequence[Sequence[tuple[int, int]]]
) -> TermTable:
    """Per block, the scale of each logit term on ``images`` beside the mass on the target offset (module docstring).

    Args:
        model: a timm ViT after its init (``vit`` family, LayerNorm pre-norm, a known patch grid).
        images: ``(B, C, H, W)`` real images, normalised as the model's inputs are.
        offsets: per layer, per head ``(dy, dx)`` (``InitReport.offsets``; one row is used for every layer).

    Returns:
        A :class:`TermTable`, one :class:`LayerTerms` per block. Costs two forwards (the batch and one zero image) and
        a few ``(B, h, T, T)`` products per block.
    """
    layout = vit_layout(model, need_pos_embed=False)
    if layout.grid is None:
        raise ValueError(f"{layout.model}: unknown token grid (no patch_embed.grid_size)")
    if len(offsets) not in (1, len(layout.attns)):
        raise ValueError(f"offsets has {len(offsets)} layers, {layout.model} has {len(layout.attns)} blocks")
    grid, prefix = layout.grid, layout.num_prefix
    queries = slice(prefix, prefix + grid[0] * grid[1])
    table = TermTable()
    zero_terms = split_logits(model, torch.zeros_like(images[:1]))
    for i, split in enumerate(split_logits(model, images)):
        full = sum(split[k] for k in TERMS)
        layer_offsets = offsets[0 if len(offsets) == 1 else i]
        u_rms = split["u"][:, queries].pow(2).mean().sqrt()
        table.append(LayerTerms(
            layer=i,
            **{k: _key_centred_rms(split[k], queries) for k in TERMS},
            logits=_key_centred_rms(full, queries),
            pos_share=float(split["u_p"][:, queries].pow(2).mean().sqrt() / u_rms) if u_rms > 0 else math.nan,
            mass=_mean_mass(full, layer_offsets, grid, prefix),
            mass_pos=_mean_mass(split["pos_pos"], layer_offsets, grid, prefix),
            mass_zero=_mean_mass(zero_terms[i]["pos_pos"], layer_offsets, grid, prefix),
        ))
    return table
