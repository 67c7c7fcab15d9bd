"""Why impulse structure fades with depth: the attention-logit term split per block on real images, at init.

Builds the model of a recipe (default ``cpu_fmnist_vit_smallimg``: its ``model.backbone``, ``model.backbone_kwargs``,
``data.image_size``, 10 classes), initialises it with ``impulse`` (seed ``--seed``) once per ``--variant`` and prints,
per block, :func:`impulsevit.init.logit_terms.logit_terms` on the first ``--images`` Fashion-MNIST test images
(Debian's ``dataset-fashion-mnist``, normalised with the dataset's registered mean / std as the recipe's pipeline
does). ``--figure PATH`` draws the mass per block (real images and the zero image) of every variant and the term
scales of the first (PNG, written atomically).

Run: ``python scripts/depth_profile.py [--figure docs/results/depth_terms.png] [--markdown]`` (about 40 s on one
core). ``--recipe cpu_fmnist_mixer --mixer [LAYOUT ...]`` prints the Mixer's analogue instead
(:func:`mixer_profile`); ``--mixer-strength`` how strong its token-mixing branch starts, per block, against
PyTorch's init (:func:`mixer_strength`). ``--saturation`` prints, for ViT variants, how saturated each block's
softmax starts on real images and how much gradient its ``W_q`` / ``W_k`` get at the first step
(:func:`saturation`). ``--maps`` prints, for any family with attention-map diagnostics (EVA-02,
Swin, the rotary and relative-bias ViTs, where the term split does not apply), the mean mass on the target offset
per block on the pseudo-input and on the real images, from the model's own attention (:func:`maps_profile`). A
variant is ``name`` or ``name:key=value,key=value`` of impulse options (``propagated:gain_qk=10``); the
``calibration`` variants are calibrated on the first ``calibration_images`` Fashion-MNIST *training* images and
measured on the test images. Exit 2 with
one line on bad input (an unknown recipe, a missing dataset, a malformed variant, an unknown option).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

VARIANTS = {"default": {}, "propagated": {"pseudo_input": "propagated"},
            "calibration": {"pseudo_input": "calibration"}}


def parse_variant(text: str) -> tuple[str, dict]:
    """``name`` or ``name:key=value,...`` → ``(label, impulse options)``; values parsed as YAML scalars."""
    name, _, rest = text.partition(":")
    if name not in VARIANTS:
        raise ValueError(f"--variant {text!r}: unknown name {name!r}, expected one of {sorted(VARIANTS)}")
    options = dict(VARIANTS[name])
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--variant {text!r}: {item!r} is not key=value")
        options[key] = yaml.safe_load(value)
    return text, options


def fashion_mnist(n: int, size: int, split: str = "test") -> torch.Tensor:
    """The first ``n`` Fashion-MNIST images of ``split`` (Debian's copy), ``(n, 3, size, size)``, normalised with the
    dataset's registered mean / std as the datamodule does."""
    from impulsevit.data.sources.formats import read_fashion_mnist
    from impulsevit.data.sources.registry import get_dataset

    source = read_fashion_mnist(None, split)
    imgs = torch.tensor(source.images[:n]).float().reshape(-1, 1, 28, 28) / 255
    if size != 28:
        imgs = torch.nn.functional.interpolate(imgs, size=(size, size), mode="bilinear", align_corners=False)
    info = get_dataset("fashion_mnist")
    return (imgs.repeat(1, 3, 1, 1) - info.mean[0]) / info.std[0]


def build(recipe: str) -> torch.nn.Module:
    import impulsevit.models  # noqa: F401  (registers the project's timm models: mixer_any, convmixer_cifar)
    from impulsevit.run.recipes import resolve_recipe
    from impulsevit.training.backbone import create_backbone, timm_kwargs

    cfg = yaml.safe_load(resolve_recipe(recipe).read_text())
    model, data = cfg["model"], cfg["data"]["init_args"]
    kwargs = timm_kwargs(model["backbone"], model.get("backbone_kwargs"), 10, data.get("image_size"))
    return create_backbone(model["backbone"], kwargs)


def profile(recipe: str, variants: list[tuple[str, dict]], images: torch.Tensor, seed: int) -> dict:
    """Per variant: the :class:`~impulsevit.init.logit_terms.TermTable` and the pseudo-input mass per block."""
    import impulsevit.init as ii
    from impulsevit.init.logit_terms import logit_terms

    out = {}
    for label, options in variants:
        torch.manual_seed(0)
        model = build(recipe)
        wanted = ii.calibration_size(model, "impulse", options)
        calibration = fashion_mnist(wanted, image_size(model), "train") if wanted else None
        report = ii.initialize(model, "impulse", generator=seed, calibration=calibration, **options)
        table = logit_terms(model, images, report.offsets)
        out[label] = table
    return out


def mixer_profile(recipe: str, layouts: list[str], images: torch.Tensor, seed: int) -> str:
    """Markdown: per Mixer layout and block, the token MLP's composite response on real inputs
    (:func:`impulsevit.init.mixer.mixer_token_jacobians`) against its pseudo-input kernel (the response at the zero
    input, :func:`impulsevit.init.mixer.mixer_token_kernel`): offset mass of the mean response and, averaged, of one
    response per image (first channel), gain ``‖mean J‖/‖K‖``, cosine(mean J, K), mean ``‖J − K‖/‖K‖`` per input."""
    import impulsevit.init as ii
    from impulsevit.init.mixer import mixer_kernel_summary, mixer_token_jacobians, mixer_token_kernel

    lines = ["| layout | block | offset mass, mean response | offset mass, per input | gain | cosine to K | "
             "per-input ‖J − K‖/‖K‖ |", "|---|---|---|---|---|---|---|"]
    for layout in layouts:
        torch.manual_seed(0)
        model = build(recipe)
        report = ii.initialize(model, "impulse", generator=seed, layout=layout)
        grid = tuple(model.stem.grid_size)
        channels = model.blocks[0].norm1.normalized_shape[0]
        for block, (kernel, jac, offsets) in enumerate(
            zip(mixer_token_kernel(model), mixer_token_jacobians(model, images), report.offsets, strict=True)
        ):
            k, mean = kernel.float(), jac.mean(0)
            mass = mixer_kernel_summary([mean.double()], grid, offsets)[0]["offset_mass"]
            firsts = jac[::channels].double()
            per = sum(mixer_kernel_summary([j], grid, offsets)[0]["offset_mass"] for j in firsts) / len(firsts)
            gain = float(mean.norm() / k.norm())
            cos = float((mean * k).sum() / (mean.norm() * k.norm()))
            dev = float(((jac - k).flatten(1).norm(dim=1) / k.norm()).mean())
            lines.append(f"| {layout} | {block} | {mass:.3f} | {per:.3f} | {gain:.2f} | {cos:.3f} | {dev:.2f} |")
    return "\n".join(lines)


def maps_profile(recipe: str, variants: list[tuple[str, dict]], images: torch.Tensor, seed: int) -> str:
    """Markdown: per variant and block, the mean mass on each head's target offset
    (:func:`impulsevit.init.diagnostics.summarize`, interior patch queries) on the pseudo-input the family's solve
    designs for (``attention_maps(model, None)``) and on ``images`` (the real forward, biases and residual stream
    included), means over heads; the std over heads beside the real-image mean."""
    import impulsevit.init as ii
    from impulsevit.init.diagnostics import attention_maps, summarize

    lines = ["| variant | block | mass, pseudo-input | mass, real images (mean ± std over heads) |",
             "|---|---|---|---|"]
    for label, options in variants:
        torch.manual_seed(0)
        model = build(recipe)
        report = ii.initialize(model, "impulse", generator=seed, **options)
        model.eval()
        pseudo = summarize(attention_maps(model, None), report.offsets)
        real = summarize(attention_maps(model, images), report.offsets)
        for block in range(len(report.offsets)):
            p = [h.target_mass for h in pseudo if h.layer == block]
            r = torch.tensor([h.target_mass for h in real if h.layer == block])
            lines.append(f"| {label} | {block} | {sum(p) / len(p):.3f} | {r.mean():.3f} ± {r.std(correction=0):.3f} |")
    return "\n".join(lines)


def fashion_mnist_labels(n: int, split: str = "test") -> torch.Tensor:
    """The labels of :func:`fashion_mnist`'s images, ``(n,)`` int64."""
    from impulsevit.data.sources.formats import read_fashion_mnist

    return torch.as_tensor(read_fashion_mnist(None, split).labels[:n]).long()


def softmax_rows(x: torch.Tensor, attn: torch.nn.Module) -> torch.Tensor:
    """The attention weights of a timm ``Attention`` on its input ``x (B, L, D)``: ``(B, h, L, L)``, rows summing to
    1 over the keys (recomputed from ``qkv``, ``q_norm`` / ``k_norm`` and ``scale``, as its fused forward does)."""
    b, n, d = x.shape
    h = attn.num_heads
    q, k, _ = torch.nn.functional.linear(x, attn.qkv.weight, attn.qkv.bias).reshape(
        b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    return torch.softmax((q @ k.transpose(-2, -1)) * attn.scale, dim=-1)


def saturation(recipe: str, variants: list[tuple[str, dict]], images: torch.Tensor, labels: torch.Tensor,
               seed: int) -> str:
    """Markdown: per ViT variant and block, how saturated the softmax starts on ``images`` and what that does to the
    first gradient step of ``W_q`` and ``W_k``.

    Columns: the mean largest attention weight of a patch query (means over images, heads and patch queries); the
    mean softmax slope ``1 − Σ_j p_j²`` (the trace of the softmax's Jacobian ``diag(p) − p pᵀ``: how much a change of
    the logits moves the weights; 0 for a one-hot row); and ``‖∂L/∂W_q‖_F + ‖∂L/∂W_k‖_F``, the cross-entropy loss's
    gradient on ``labels`` at init in eval mode (no dropout), relative to the first variant's same block. The
    classifier head is the init's, so this is the gradient of the first optimizer step."""
    import impulsevit.init as ii
    from impulsevit.init.capture import module_calls

    lines = ["| variant | block | largest attention weight | softmax slope 1 − Σp² | ‖∇W_q‖ + ‖∇W_k‖ vs first |",
             "|---|---|---|---|---|"]
    first: list[float] = []
    for index, (label, options) in enumerate(variants):
        torch.manual_seed(0)
        model = build(recipe)
        wanted = ii.calibration_size(model, "impulse", options)
        calibration = fashion_mnist(wanted, image_size(model), "train") if wanted else None
        ii.initialize(model, "impulse", generator=seed, calibration=calibration, **options)
        model.eval()
        attns = [block.attn for block in model.blocks]
        prefix = int(getattr(model, "num_prefix_tokens", 0))
        calls = module_calls(model, attns, images)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        for block, (attn, call) in enumerate(zip(attns, calls, strict=True)):
            with torch.no_grad():  # the normed tokens the block's attention received; patch queries only
                p = softmax_rows(call.args[0], attn)[:, :, prefix:]
            d = attn.qkv.in_features
            grad = attn.qkv.weight.grad
            norm = float(grad[:d].norm() + grad[d:2 * d].norm())
            if index == 0:
                first.append(norm)
            lines.append(f"| {label} | {block} | {float(p.amax(-1).mean()):.3f} | "
                         f"{float((1 - (p * p).sum(-1)).mean()):.3f} | {norm / first[block]:.2f} |")
    return "\n".join(lines)


def image_size(model: torch.nn.Module) -> int:
    """The model's input side in pixels (ViT-style ``patch_embed`` or the Mixer's ``stem``)."""
    embed = getattr(model, "patch_embed", None) or getattr(model, "stem", None)
    if embed is None or getattr(embed, "img_size", None) is None:
        raise ValueError(f"{type(model).__name__}: no patch_embed.img_size or stem.img_size to size the images by")
    return int(embed.img_size[0])


def mixer_strength(recipe: str, variants: list[tuple[str, dict]], images: torch.Tensor, seed: int) -> str:
    """Markdown: per variant and block, how strong the token-mixing branch starts — the mean row norm of its
    pseudo-input kernel (:func:`impulsevit.init.mixer.mixer_token_kernel`, ``mean_t ‖K[t, :]‖``) and, on ``images``,
    the norm of the token MLP's output over the norm of the residual stream entering the block (eval mode). A
    variant named ``torch`` is PyTorch's constructor init (the ``torch`` method); any other is ``impulse`` with its
    options."""
    import impulsevit.init as ii
    from impulsevit.init.capture import module_calls
    from impulsevit.init.mixer import mixer_token_kernel, mixer_token_mlps

    lines = ["| variant | block | kernel row norm | token branch / stream, real images |", "|---|---|---|---|"]
    for label, options in variants:
        torch.manual_seed(0)
        model = build(recipe)
        if label == "torch":
            ii.initialize(model, "torch", generator=seed)
        else:
            ii.initialize(model, "impulse", generator=seed, **options)
        kernels = mixer_token_kernel(model)
        blocks, mlps = list(model.blocks), [mlp for _, mlp in mixer_token_mlps(model)]
        calls = module_calls(model, [*blocks, *mlps], images)
        streams = [c.args[0] for c in calls[:len(blocks)]]
        outputs = [c.output for c in calls[len(blocks):]]
        for block, (k, x, y) in enumerate(zip(kernels, streams, outputs, strict=True)):
            row = float(k.float().norm(dim=1).mean())
            lines.append(f"| {label} | {block} | {row:.2f} | {float(y.norm() / x.norm()):.2f} |")
    return "\n".join(lines)


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from impulsevit.io import atomic_write

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (label, table) in enumerate(results.items()):
        layers = [t.layer for t in table]
        color = f"C{i}"
        ax0.plot(layers, [t.mass for t in table], "-o", color=color, label=f"{label}: real images")
        ax0.plot(layers, [t.mass_zero for t in table], "--s", color=color, label=f"{label}: zero image")
        if i == 0:
            for k, style in (("pos_pos", "-o"), ("pos_content", "-^"), ("content_pos", "-v"),
                             ("content_content", "-s")):
                ax1.plot(layers, [getattr(t, k) for t in table], style, label=k.replace("_", "–"))
    ax0.set(xlabel="block", ylabel="mean mass on the target offset", ylim=(0, 1.05),
            title="structure through depth, at init")
    ax0.legend(fontsize=7)
    first = next(iter(results))
    ax1.set(xlabel="block", ylabel="key-centred RMS (logit units)", title=f"logit terms ({first})")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


BAD_INPUT = (ValueError, TypeError, FileNotFoundError, KeyError, AttributeError)
"""What a bad recipe, variant, option or missing dataset raises here: one line and exit 2 (:func:`bad_input`)."""


def bad_input(exc: BaseException) -> int:
    """Print ``exc`` as the one ``depth_profile: ...`` line on stderr; the exit status 2."""
    print(f"depth_profile: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2


def checked_variants(recipe: str, texts: list[str], allow_torch: bool = False) -> tuple[list[tuple[str, dict]],
                                                                                      torch.nn.Module]:
    """``(variants, the recipe's model)``: each ``--variant`` parsed (:func:`parse_variant`; ``torch``, PyTorch's
    init, only with ``allow_torch``) and every impulse variant's options checked on the model before any work."""
    from impulsevit.init.api import check_options_for

    variants = [("torch", {}) if allow_torch and v == "torch" else parse_variant(v) for v in texts]
    model = build(recipe)
    for label, options in variants:
        if not (allow_torch and label == "torch"):
            check_options_for(model, "impulse", options)
    return variants, model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="cpu_fmnist_vit_smallimg")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", action="append", help="default, propagated, or name:key=value,... (repeatable)")
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--mixer", nargs="*", metavar="LAYOUT",
                    help="instead: the Mixer table of the recipe (e.g. --recipe cpu_fmnist_mixer --mixer factored "
                         "one_tap)")
    ap.add_argument("--maps", action="store_true",
                    help="instead: the mass on the target offset per block from the model's own attention, for any "
                         "family (e.g. --recipe cpu_fmnist_eva02 --maps --variant default "
                         "--variant default:mass_rule=worst_case)")
    ap.add_argument("--mixer-strength", action="store_true",
                    help="instead: the token-mixing branch's starting strength per block, for Mixer variants (e.g. "
                         "--recipe cpu_fmnist_mixer --mixer-strength --variant torch "
                         "--variant default:layout=one_tap)")
    ap.add_argument("--saturation", action="store_true",
                    help="instead: per ViT variant and block, the softmax's saturation on real images and the first "
                         "step's W_q/W_k gradient (e.g. --variant default --variant calibration:calibration_ridge=1.0)")
    args = ap.parse_args(argv)
    table = next((name for name in ("saturation", "mixer_strength", "maps") if getattr(args, name)), None)
    if table is not None:
        try:
            strength = table == "mixer_strength"
            variants, model = checked_variants(args.recipe, args.variant or ["torch" if strength else "default"],
                                               allow_torch=strength)
            images = fashion_mnist(args.images, image_size(model))
            if table == "saturation":
                print(saturation(args.recipe, variants, images, fashion_mnist_labels(args.images), args.seed))
            elif strength:
                print(mixer_strength(args.recipe, variants, images, args.seed))
            else:
                print(maps_profile(args.recipe, variants, images, args.seed))
        except BAD_INPUT as e:
            return bad_input(e)
        return 0
    if args.mixer is not None:
        try:
            model = build(args.recipe)
            images = fashion_mnist(args.images, image_size(model))
            print(mixer_profile(args.recipe, args.mixer or ["factored", "one_tap"], images, args.seed))
        except BAD_INPUT as e:
            return bad_input(e)
        return 0
    try:
        if args.images < 1:
            raise ValueError(f"--images must be >= 1, got {args.images}")
        variants, model = checked_variants(args.recipe, args.variant or ["default", "propagated"])
        images = fashion_mnist(args.images, image_size(model))
        results = profile(args.recipe, variants, images, args.seed)
    except BAD_INPUT as e:
        return bad_input(e)
    for label, table in results.items():
        print(f"\n{label} (impulse seed {args.seed}, {args.images} Fashion-MNIST test images, {args.recipe})")
        print(table.markdown() if args.markdown else table.table())
    if args.figure:
        figure(results, args.figure)
        print(f"\nwrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
