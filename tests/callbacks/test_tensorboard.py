"""TensorBoard event files of a real (tiny) fit: scalars (loss, accuracy, lr, throughput, per-head init statistics),
the hparams (incl. the init method and its resolved options), the InitReport text and the attention-map images."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

from impulsevit import ImageClassifier
from impulsevit.callbacks import AttentionMapLogger, ThroughputLogger
from impulsevit.data.loading.synthetic import SyntheticDataModule

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("tb")
    model = ImageClassifier("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2,
                                                         weight_init="skip"),
                            num_classes=4, init={"method": "impulse", "seed": 3, "options": {"gain_qk": 6.0}},
                            optimizer={"lr": 1e-3}, mixup={}, ema_decay=0.9)
    dm = SyntheticDataModule(num_classes=4, image_size=32, num_train=48, num_val=16, batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, log_every_n_steps=1, num_sanity_val_steps=0,
                        logger=TensorBoardLogger(root, name="run"), enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[ThroughputLogger(window_size=2), AttentionMapLogger(every_n_epochs=1)])
    trainer.fit(model, dm)
    (path,) = list(root.rglob("events.out.tfevents.*"))
    out: dict = {"scalars": {}, "images": {}, "text": {}, "hparams": []}
    for ev in EventFileLoader(str(path)).Load():
        for v in ev.summary.value:
            plugin = v.metadata.plugin_data.plugin_name
            if plugin == "hparams" and v.tag == "_hparams_/session_start_info":
                data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
                out["hparams"].append({k: val.WhichOneof("kind") and getattr(val, val.WhichOneof("kind"))
                                       for k, val in data.session_start_info.hparams.items()})
            elif plugin == "images":  # EventFileLoader migrates images to tensors [width, height, png bytes]
                width, height, png = tensor_util.make_ndarray(v.tensor)[:3]
                assert png.startswith(b"\x89PNG")
                out["images"].setdefault(v.tag, []).append((ev.step, int(width), int(height)))
            elif plugin == "text":
                out["text"][v.tag] = tensor_util.make_ndarray(v.tensor).item().decode()
            elif plugin == "scalars" or v.HasField("simple_value"):
                val = v.simple_value if v.HasField("simple_value") else float(tensor_util.make_ndarray(v.tensor))
                out["scalars"].setdefault(v.tag, []).append((ev.step, val))
    return out


def test_training_scalars(events: dict) -> None:
    s = events["scalars"]
    for tag in ("train/loss", "train/acc1", "val/loss", "val/acc1", "val/acc5", "val_ema/acc1", "lr/pg1", "lr/pg2"):
        assert tag in s, tag
    assert len(s["train/loss"]) == 12  # 6 steps per epoch x 2 epochs, logged every step
    assert len(s["val/acc1"]) == 2 and all(0.0 <= v <= 1.0 for _, v in s["val/acc1"])
    assert s["lr/pg1"][0][1] < s["lr/pg1"][3][1]  # warmup (LearningRateMonitor: one tag per param group)


def test_throughput_scalars(events: dict) -> None:
    s = events["scalars"]
    ips = [v for _, v in s["train/device/samples_per_sec"]]
    assert ips and all(v > 0 for v in ips)
    flops = [v for _, v in s["train/device/flops_per_sec"]]  # FLOPs measured on a meta-device copy
    assert flops and all(v > 0 for v in flops)


def test_init_hparams(events: dict) -> None:
    merged: dict = {}
    for h in events["hparams"]:
        merged.update(h)
    assert merged["init/method"] == "impulse" and merged["init/seed"] == 3
    assert merged["init/family"] == "vit"
    assert merged["init/options/gain_qk"] == 6.0 and merged["init/options/gain_pos"] == 18.0  # resolved defaults
    assert merged["backbone"] == "vit_tiny_patch16_224"
    assert merged["resolved/lr"] == pytest.approx(1e-3) and merged["resolved/global_batch_size"] == 8


def test_report_and_summary_text(events: dict) -> None:
    t = events["text"]
    report = next(v for k, v in t.items() if k.startswith("init/report"))
    assert "init=impulse family=vit" in report and "gain_qk" in report
    summary = next(v for k, v in t.items() if k.startswith("init/attention/summary"))
    assert "target_mass" in summary and "(+0,+0)" in summary and "(-1,+0)" in summary


def test_attention_images_and_per_head_stats(events: dict) -> None:
    imgs = events["images"]
    assert {"init/attention/layer_00", "init/attention/layer_01", "attention/layer_00"} <= set(imgs)
    step, width, height = imgs["init/attention/layer_00"][0]
    assert step == 0
    # 4 query rows x 2 heads, 8x8 grid upscaled x6 with 1-px separators
    assert (width, height) == (2 * 49 + 1, 4 * 49 + 1)
    assert len(imgs["attention/layer_00"]) == 2  # once per epoch
    s = events["scalars"]
    # impulse: head 0 attends to itself, head 1 to the token above, with most of the mass at init
    assert s["init/attention/target_mass/layer_00/head_00"][0][1] > 0.9
    assert s["init/attention/hit_rate/layer_01/head_01"][0][1] == 1.0
    assert s["init/attention/distance/layer_00/head_01"][0][1] > s["init/attention/distance/layer_00/head_00"][0][1]
