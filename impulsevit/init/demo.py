"""Demo: impulse and mimetic init of a ViT-Ti/16, with the per-head attention summary.

Builds ``vit_tiny_patch16_224`` (``weight_init='skip'``), initialises it with ``impulse`` and with ``mimetic``, and
prints each :class:`~impulsevit.init.api.InitReport` and the per-head summary (target mass, interior argmax hit rate,
entropy, mean attention distance) of the first layers on the pseudo-input and on random-noise images. CPU, ~10 s.

Run: ``python -m impulsevit.init.demo [--layers 3] [--seed 0]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import timm
import torch

from impulsevit.argparser import ArgumentParser
from impulsevit.errors import ConfigError
from impulsevit.init.api import initialize
from impulsevit.init.diagnostics import attention_maps, summarize
from impulsevit.init.impulse import impulse_offsets


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="impulsevit demo",
                            description="impulse vs mimetic init of ViT-Ti/16: reports and attention summary")
    parser.add_argument("--layers", type=int, default=3, help="layers shown in the summary tables")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=4, help="random-noise images for the real-forward summary")
    parser.add_argument("--img-size", type=int, default=224, help="input size (patch 16; >= 128 keeps N >= head_dim)")
    args = parser.parse_args(argv)
    size = args.img_size
    if args.layers < 1 or args.images < 1 or size < 16 or size % 16:
        raise ConfigError(f"demo needs --layers >= 1, --images >= 1 and an --img-size that is a positive multiple of "
                          f"the patch size 16, got --layers {args.layers} --images {args.images} --img-size {size}")
    noise = torch.randn(args.images, 3, size, size, generator=torch.Generator().manual_seed(args.seed))
    for method in ("impulse", "mimetic"):
        model = timm.create_model("vit_tiny_patch16_224", weight_init="skip", img_size=size)
        try:
            report = initialize(model, method, generator=args.seed)
        except ValueError as e:  # the method's own check of the model's shape: the --img-size given does not fit
            raise ConfigError(f"--img-size {size}: {e} (>= 128 fits every method shown)") from e
        print(report.table())
        # mimetic has no offsets: score its heads against the offsets impulse would give them
        offsets = report.offsets or [impulse_offsets(model.blocks[0].attn.num_heads)]
        for source, images in (("pseudo-input (LN(pos_embed), no bias)", None), ("random-noise images", noise)):
            maps = attention_maps(model, images)
            summary = summarize(
                maps[: args.layers],
                offsets[: args.layers] if len(offsets) > 1 else offsets,
                grid=maps.grid,
                num_prefix=maps.num_prefix,
            )
            print(f"\n{method}: attention on the {source}, first {args.layers} layers")
            print(summary.table())
        print()


if __name__ == "__main__":
    main()
