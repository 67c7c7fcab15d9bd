"""Attention-map images: what each pixel of :func:`attention_grid` shows, and the images, text and scalars that
:func:`log_attention` writes to real TensorBoard event files for an impulse-initialized ViT."""

from __future__ import annotations

import io

import lightning as L
import numpy as np
import torch
from _vit_helpers import vit
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import impulsevit.init as ii
from impulsevit.callbacks.attention_logging import attention_grid, compute_attention, default_queries, log_attention


def _panel(img: torch.Tensor, qi: int, hi: int, h: int, w: int, s: int) -> torch.Tensor:
    y, x = 1 + qi * (h * s + 1), 1 + hi * (w * s + 1)
    return img[:, y : y + h * s, x : x + w * s]


def test_grid_pixels_show_each_heads_attention_for_each_query():
    h, w, s, prefix = 4, 5, 3, 1
    queries = [(1, 2), (2, 0)]
    targets = {(0, 0): (3, 0), (0, 1): (0, 4), (1, 0): (2, 1), (1, 1): (0, 0)}  # (query, head) -> attended cell
    maps = torch.zeros(2, prefix + h * w, prefix + h * w)
    for (qi, hi), (r, c) in targets.items():
        q = prefix + queries[qi][0] * w + queries[qi][1]
        maps[hi, q, prefix + r * w + c] = 0.7
        maps[hi, q, 0] = 0.3  # on the class token: dropped from the image
    img = attention_grid(maps, (h, w), queries, prefix=prefix, cell=3 * max(h, w))
    assert img.shape == (3, 2 * (h * s + 1) + 1, 2 * (w * s + 1) + 1)
    assert img.min() >= 0 and img.max() <= 1
    seps = torch.zeros(img.shape[1:], dtype=torch.bool)
    seps[:: h * s + 1, :] = True
    seps[:, :: w * s + 1] = True
    assert (img[:, seps] == 1).all()  # white separators
    for (qi, hi), (r, c) in targets.items():
        panel = _panel(img, qi, hi, h, w, s)
        qr, qc = queries[qi]
        cells = panel.reshape(3, h, s, w, s)
        target = cells[:, r, :, c, :]
        assert (target == 1).all(), "the attended cell is white (scaled by the panel's maximum)"
        query = cells[:, qr, :, qc, :]
        assert (query[0] == 1).all() and (query[1:, 0, :] == 0).all() and (query[1:, :, 0] == 0).all(), "red outline"
        others = torch.ones(h, w, dtype=torch.bool)
        others[r, c] = others[qr, qc] = False
        assert (cells.permute(1, 3, 0, 2, 4)[others] == 0).all(), "every other cell is black"


def test_log_attention_writes_images_text_and_scalars(tmp_path):
    model = vit(img=28, patch=4, dim=64, depth=2, heads=2)
    report = ii.initialize(model, "impulse", generator=0)
    logger = TensorBoardLogger(tmp_path, name="", version="")
    trainer = L.Trainer(logger=logger, accelerator="cpu", devices=1, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    assert log_attention(trainer, model, "init/attention", 0, offsets=report.offsets)
    logger.experiment.flush()

    (events,) = tmp_path.rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["init/attention/layer_00", "init/attention/layer_01"]
    maps, summary, (prefix, h, w) = compute_attention(model, report.offsets)
    queries = default_queries(h, w)
    for li in range(2):
        png = acc.Images(f"init/attention/layer_{li:02d}")[0].encoded_image_string
        img = torch.from_numpy(np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))).permute(2, 0, 1) / 255
        expect = attention_grid(maps[li], (h, w), queries, prefix=prefix)
        assert img.shape == expect.shape
        torch.testing.assert_close(img, expect, atol=1 / 255 + 1e-6, rtol=0)  # 8-bit PNG of the same grid
    assert "init/attention/summary/text_summary" in acc.Tags()["tensors"]
    scalars = set(acc.Tags()["scalars"])
    assert {f"init/attention/target_mass/layer_{li:02d}/head_{hd:02d}" for li in range(2) for hd in range(2)} <= scalars
