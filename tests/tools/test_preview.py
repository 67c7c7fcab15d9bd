"""``impulsevit data preview``'s PNG: small images enlarged to a visible size (nearest neighbour), labelled with their
class names."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from impulsevit.cli.data_preview import main
from impulsevit.tools.preview import MIN_TILE, render_grid


def test_small_images_are_enlarged_with_square_pixels_and_labelled():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(4, 3, 28, 28, generator=g)
    labels = torch.tensor([0, 1, 2, 1])
    img = np.asarray(render_grid(images, labels, ["ankle boot", "bag", "coat"]))
    scale = MIN_TILE // 28  # 4: 28 px -> 112 px
    tile = img[2:2 + 28 * scale, 2:2 + 28 * scale]
    expected = (images[0].clamp(0, 1).mul(255).round().byte().permute(1, 2, 0).numpy()
                .repeat(scale, axis=0).repeat(scale, axis=1))
    assert np.array_equal(tile, expected)
    assert img.shape[1] == 2 * (28 * scale + 2) + 2  # 2 per row
    strip = img[2 + 28 * scale + 2:2 + 28 * scale + 14, 2:2 + 28 * scale]  # under the first tile: its name
    assert (strip < 128).any() and (strip > 200).any()
    unlabelled = np.asarray(render_grid(images, labels, None))  # the label number instead of a name
    assert unlabelled.shape == img.shape and not np.array_equal(unlabelled, img)


def test_preview_png_of_digits_is_visible(tmp_path, capsys):
    assert main(["preview", "--recipe", "cpu_digits_vit", "--split", "val", "--num", "4", "--out", str(tmp_path),
                 "--data.init_args.backend=torchvision", "--data.init_args.num_workers=0"]) == 0
    result = torch.load(tmp_path / "val.pt", weights_only=False)
    size = result["images"].shape[-1]
    with Image.open(tmp_path / "val.png") as im:
        assert im.width >= 2 * MIN_TILE > 2 * size  # was 2 * (size + 2) + 2 px wide
