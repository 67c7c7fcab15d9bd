"""The resampler equals Pillow byte for byte in every case it handles: random crop boxes of random images, enlarged
and reduced along either axis (both pass orders), a window of the resized image (the eval centre crop) and the
horizontal flip, for both filters. The reference is Pillow itself, run one axis at a time in the order
:func:`~impulsevit.data.loading.resample.vertical_first` picks (a single-axis ``Image.resize`` is exactly one of
Pillow's passes), so the shrink-both cases, where Pillow 13 may order the passes differently, are exact too."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from impulsevit.data.loading import resample as rs
from impulsevit.data.loading.resample import BICUBIC, BILINEAR, resample_crop, resize_short_crop_center, vertical_first

PIL_FILTER = {BICUBIC: Image.Resampling.BICUBIC, BILINEAR: Image.Resampling.BILINEAR}


def pillow_two_pass(img: np.ndarray, top: int, left: int, h: int, w: int, oh: int, ow: int, kind: int) -> np.ndarray:
    """Pillow's resize of ``img[top:top+h, left:left+w]`` to ``(oh, ow)``, one axis at a time in our pass order."""
    im = Image.fromarray(img).crop((left, top, left + w, top + h))
    first = (w, oh) if vertical_first(h, w, oh, ow) else (ow, h)
    return np.asarray(im.resize(first, PIL_FILTER[kind]).resize((ow, oh), PIL_FILTER[kind]))


def check(rng: np.random.Generator, H: int, W: int, h: int, w: int, oh: int, ow: int, kind: int, window: bool,
          flip: bool) -> None:
    img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    top, left = int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))
    ot = int(rng.integers(0, oh)) if window else 0
    ol = int(rng.integers(0, ow)) if window else 0
    nh = int(rng.integers(1, oh - ot + 1)) if window else oh
    nw = int(rng.integers(1, ow - ol + 1)) if window else ow
    ref = pillow_two_pass(img, top, left, h, w, oh, ow, kind)[ot:ot + nh, ol:ol + nw]
    if flip:
        ref = ref[:, ::-1]
    out = np.zeros((nh, nw, 3), np.uint8)
    resample_crop(img, top, left, h, w, oh, ow, ot, ol, out, kind, flip)
    np.testing.assert_array_equal(out, ref, err_msg=str((H, W, top, left, h, w, oh, ow, ot, ol, nh, nw, kind, flip)))


@pytest.mark.parametrize("kind", [BICUBIC, BILINEAR], ids=["bicubic", "bilinear"])
def test_random_boxes_equal_pillow(kind):
    """Small random shapes (1-90 px, so row blocks and lane blocks end at every offset), every combination of
    enlarging / reducing / keeping each axis, windows and flips."""
    rng = np.random.default_rng(kind)
    for trial in range(300):
        H, W = (int(v) for v in rng.integers(1, 90, 2))
        h, w = int(rng.integers(1, H + 1)), int(rng.integers(1, W + 1))
        oh = h if trial % 7 == 0 else int(rng.integers(1, 140))
        ow = w if trial % 5 == 0 else int(rng.integers(1, 140))
        check(rng, H, W, h, w, oh, ow, kind, window=trial % 3 == 0, flip=trial % 2 == 1)


@pytest.mark.parametrize("kind", [BICUBIC, BILINEAR], ids=["bicubic", "bilinear"])
def test_training_sized_boxes_equal_pillow(kind):
    """Boxes of ``short256`` images resized to 224 px, as the training decoder draws them: several row blocks of
    the horizontal pass and several lane blocks of the vertical pass, in both pass orders, flipped or not."""
    assert 224 * 3 > 2 * rs.LANES and 200 > 2 * rs.HPASS_ROWS  # the shapes below span several blocks of both kinds
    rng = np.random.default_rng(10 + kind)
    for h, w in [(120, 90), (200, 150), (256, 300), (250, 180), (180, 250), (256, 256), (40, 330), (224, 224)]:
        check(rng, 256, 343, h, w, 224, 224, kind, window=False, flip=bool(rng.integers(0, 2)))


@pytest.mark.parametrize("shape", [(256, 343), (343, 256), (300, 300), (180, 240)])
def test_eval_centre_crop_equals_pillow(shape):
    """The eval transform (shorter side to 256, centre 224): Pillow's resize of the whole image, then the crop."""
    rng = np.random.default_rng(20)
    img = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    height, width = shape
    new_h, new_w = (256, 256 * width // height) if height <= width else (256 * height // width, 256)
    for kind in (BICUBIC, BILINEAR):
        ref = pillow_two_pass(img, 0, 0, height, width, new_h, new_w, kind)
        top, left = int(round((new_h - 224) / 2.0)), int(round((new_w - 224) / 2.0))
        out = np.zeros((224, 224, 3), np.uint8)
        resize_short_crop_center(img, height, width, 0.875, out, kind)
        np.testing.assert_array_equal(out, ref[top:top + 224, left:left + 224])
