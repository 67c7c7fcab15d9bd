"""Which of timm's ViT-like models ``impulse`` applies to, and the attention structure it reaches there.

:func:`smallest_models` walks timm's registry (``timm.list_models``) for the families in :data:`FAMILIES`, groups the
names by family pattern and by the timm module that defines them (``vision_transformer``, ``eva``, ``beit``, ...),
builds every candidate on the ``meta`` device (no memory, no weights, no download) and keeps the smallest of each group
by parameter count. :func:`check_model` then builds that model for real (``pretrained=False``, on CPU), runs
``initialize(model, "impulse")`` and records either the structure on the pseudo-input (mean over layers of the shift
heads' interior argmax hit rate and target mass, and the identity head's mass, from
:func:`impulsevit.init.summarize`; ConvMixer: the share of one-hot spatial filters) or the refusal message. A refusal
must be a ``ValueError`` / ``TypeError``; anything else propagates — the coverage check treats it as a crash.

``scripts/init_coverage.py`` writes the table into ``impulsevit/init/README.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["FAMILIES", "CoverageRow", "smallest_models", "check_model", "markdown_table", "probe_images",
           "real_structure"]

FAMILIES: tuple[str, ...] = ("vit_*", "deit3_*", "deit*", "eva*", "beit*", "swin*", "mixer*", "convmixer*")
"""timm name patterns, in assignment order (a name belongs to the first pattern it matches: ``deit3_*`` before
``deit*``)."""


@dataclasses.dataclass(frozen=True)
class CoverageRow:
    """One model's result.

    Attributes:
        pattern: the family pattern it was selected for; ``module``: the timm module defining it.
        model: timm name; ``params``: parameter count (millions); ``candidates``: names in the group.
        applies: ``True`` when ``impulse`` initialised it; ``family``: the adapter that did (``vit``, ``swin``, ...).
        structure: what it reaches on the pseudo-input (empty on refusal).
        message: the refusal (``ValueError`` / ``TypeError`` text), empty when it applies.
        real: structure on real images at init, first / last block: the mean over heads of the attention mass on
            each head's init offset (``AttentionEvolution``'s ``offset_mass``,
            :func:`impulsevit.init.locality.locality`) from the model's own forward on :func:`probe_images`;
            empty on refusal, a reason when not measurable.
    """

    pattern: str
    module: str
    model: str
    params: float
    candidates: int
    applies: bool
    family: str
    structure: str
    message: str
    real: str = ""


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def smallest_models(patterns: Sequence[str] = FAMILIES) -> list[tuple[str, str, str, float, int]]:
    """The smallest registered model per (pattern, timm module): ``(pattern, module, name, params_millions,
    candidates)``, sorted by pattern order then module. Builds every candidate on the meta device (about a minute
    for all of :data:`FAMILIES`); models that cannot be built with default arguments are skipped."""
    import timm

    module_of = {name: module for module in timm.list_modules() for name in timm.list_models(module=module)}
    groups: dict[tuple[str, str], list[str]] = {}
    seen: set[str] = set()
    for pat in patterns:
        for name in timm.list_models(pat):
            if name in seen:
                continue
            seen.add(name)
            groups.setdefault((pat, module_of.get(name, "?")), []).append(name)
    out = []
    for (pat, module), names in groups.items():
        sized = []
        for name in names:
            try:
                with torch.device("meta"):
                    sized.append((_param_count(timm.create_model(name, pretrained=False)), name))
            except Exception:  # noqa: BLE001 - a registry entry that needs extra arguments is simply not a candidate
                continue
        if sized:
            params, name = min(sized)
            out.append((pat, module, name, params / 1e6, len(names)))
    order = {p: i for i, p in enumerate(patterns)}
    return sorted(out, key=lambda r: (order[r[0]], r[1]))


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


FASHION_MNIST = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
"""Debian's ``dataset-fashion-mnist`` test images: the real images of the coverage column."""


def probe_images(n: int = 2, size: int = 224, seed: int = 0) -> torch.Tensor:
    """``(n, 3, size, size)`` real images, per-image standardised: Fashion-MNIST test images 100.. (Debian
    ``dataset-fashion-mnist``) upsampled; where not installed, smooth random images (low-pass filtered noise)."""
    import gzip
    from pathlib import Path

    import torch.nn.functional as F

    if Path(FASHION_MNIST).exists():
        with gzip.open(FASHION_MNIST, "rb") as f:
            f.read(16)
            raw = f.read(28 * 28 * (n + 100))
        imgs = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(-1, 1, 28, 28).float()[100:100 + n] / 255
    else:
        g = torch.Generator().manual_seed(seed)
        imgs = F.avg_pool2d(torch.rand(n, 1, 36, 36, generator=g), 9, stride=1)
    imgs = F.interpolate(imgs, size=(size, size), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    mean, std = imgs.mean((1, 2, 3), keepdim=True), imgs.std((1, 2, 3), keepdim=True)
    return (imgs - mean) / std.clamp_min(1e-6)


def _input_size(model: nn.Module) -> tuple[int, int]:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    size = cfg.get("input_size", (3, 224, 224))
    img = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img is not None:
        size = (3, *((img, img) if isinstance(img, int) else img))
    return int(size[1]), int(size[2])


def real_structure(model: nn.Module, report, images: torch.Tensor | None = None) -> str:
    """First / last block mean mass on the init offsets on real images (see :class:`CoverageRow`.real)."""
    if report.family == "convmixer":
        return "n/a (no attention; filters are input-independent)"
    if images is None:
        h, w = _input_size(model)
        images = probe_images(2, h) if h == w else torch.nn.functional.interpolate(probe_images(2, max(h, w)),
                                                                                     size=(h, w))
    if report.family == "swin":
        from impulsevit.init.swin import swin_summary

        rows = [[r["target_mass"] for r in block] for block in swin_summary(model, images, report.offsets)]
    elif report.family in ("relbias", "swinv2"):
        from impulsevit.init.relbias import relbias_summary

        rows = [[h[2] for h in layer] for layer in relbias_summary(model, report.offsets, images)]
    else:
        from impulsevit.init.diagnostics import attention_maps
        from impulsevit.init.locality import locality

        maps = attention_maps(model, images)
        heads = locality(maps, tuple(maps.grid), int(maps.num_prefix), report.offsets)
        rows = [[h.offset_mass for h in layer] for layer in heads]
    if report.family == "mixer":
        return f"mass on offsets: first {_mean(rows[0]):.2f}, last {_mean(rows[-1]):.2f} (kernel, input-independent)"
    return f"first {_mean(rows[0]):.2f}, last {_mean(rows[-1]):.2f}"


def _structure(model: nn.Module, report) -> str:
    """Pseudo-input structure: per adapter family, means over layers (shift heads / self heads separately)."""
    from impulsevit.init.diagnostics import attention_maps, summarize

    if report.family == "convmixer":
        from impulsevit.init.convmixer import convmixer_filter_summary, convmixer_filter_taps

        one_hot = [s["one_hot"] for s in convmixer_filter_summary(convmixer_filter_taps(model))]
        return f"one-hot spatial filters: {_mean(one_hot):.2f}"
    if report.family == "mixer":
        from impulsevit.init.mixer import mixer_kernel_summary, mixer_token_kernel

        kernels = mixer_token_kernel(model)
        grid = tuple(model.stem.grid_size)
        rows = [mixer_kernel_summary([k], grid, offs)[0] for k, offs in zip(kernels, report.offsets, strict=True)]
        return (f"token-mixing kernel on its offsets: mass {_mean([r['offset_mass'] for r in rows]):.2f}, "
                f"argmax hit {_mean([r['hit_rate'] for r in rows]):.2f}")
    if report.family in ("relbias", "swinv2"):
        from impulsevit.init.relbias import relbias_summary

        heads = [h for layer in relbias_summary(model, report.offsets) for h in layer]
    elif report.family == "swin":
        from impulsevit.init.swin import swin_summary

        heads = [(off, r["hit_rate"], r["target_mass"]) for offs, block in zip(report.offsets, swin_summary(
            model, offsets=report.offsets), strict=True) for off, r in zip(offs, block, strict=True)]
    else:
        heads = [(s.offset, s.hit_rate, s.target_mass) for s in summarize(attention_maps(model), report.offsets)]
    shift = [h for h in heads if h[0] != (0, 0)]
    ident = [h for h in heads if h[0] == (0, 0)]
    parts = []
    if shift:
        parts.append(f"shift heads: interior hit {_mean([h[1] for h in shift]):.2f}, "
                     f"target mass {_mean([h[2] for h in shift]):.2f}")
    if ident:
        parts.append(f"self heads: mass {_mean([h[2] for h in ident]):.2f}")
    return "; ".join(parts)


def check_model(name: str, *, pattern: str = "", module: str = "", params: float = float("nan"),
                candidates: int = 1, seed: int = 0) -> CoverageRow:
    """Build timm model ``name`` (``pretrained=False``, CPU; the weights impulse does not write come from timm's init
    under ``torch.manual_seed(seed)``, so a row is the same on every run) and try ``impulse`` with default options.

    Raises:
        Any exception other than the ``ValueError`` / ``TypeError`` refusal of ``initialize`` (a crash).
    """
    import timm

    from impulsevit.init.api import initialize

    with torch.random.fork_rng(devices=[]):  # the caller's global RNG state is left as it was
        torch.manual_seed(seed)
        model = timm.create_model(name, pretrained=False)
    if params != params:  # nan: count here
        params = _param_count(model) / 1e6
    try:
        report = initialize(model, "impulse", generator=seed)
    except (ValueError, TypeError) as e:
        return CoverageRow(pattern, module, name, params, candidates, False, "", "", f"{type(e).__name__}: {e}")
    try:
        real = real_structure(model, report)
    except (ValueError, TypeError) as e:  # diagnostics that cannot measure this model: say why
        real = f"not measured: {e}"
    return CoverageRow(pattern, module, name, params, candidates, True, report.family, _structure(model, report), "",
                       real)


def markdown_table(rows: Sequence[CoverageRow]) -> str:
    """The coverage table as markdown (one line per row)."""
    lines = ["| family | timm module (models) | smallest model | params (M) | impulse | structure on the pseudo-input "
             "/ refusal | structure on real images at init (first/last block) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = f"applies ({r.family})" if r.applies else "refuses"
        detail = r.structure if r.applies else "`" + r.message.replace("|", "\\|").replace("`", "'") + "`"
        real = r.real.replace("|", "\\|") if r.applies else ""
        lines.append(f"| `{r.pattern}` | {r.module} ({r.candidates}) | `{r.model}` | {r.params:.1f} | {verdict} | "
                     f"{detail} | {real} |")
    return "\n".join(lines)
