"""Attention locality over training: the metrics of :mod:`impulsevit.init.locality` on hand-built maps with known
answers, and the :class:`AttentionEvolution` callback on a real tiny run through the CLI (its JSON files, TensorBoard
scalars and images at init and at every epoch; identical numbers for two runs with the same seed; the references
kept across a resume)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _cli_helpers import TINY, run_cli, scalars
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from impulsevit.init.locality import locality, offset_masses, offsets_within

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

H, W = 5, 6


def one_tap(offset: tuple[int, int], prefix: int = 0, prefix_mass: float = 0.0) -> torch.Tensor:
    """``(1, T, T)``: every patch query attends to the patch at ``offset``; a query whose target is off the grid
    attends to the opposite neighbour (also at distance ``|offset|``); ``prefix_mass`` goes to the first prefix
    token."""
    dy, dx = offset
    n = H * W
    a = torch.zeros(1, prefix + n, prefix + n)
    for q in range(n):
        r, c = divmod(q, W)
        tr, tc = r + dy, c + dx
        if not (0 <= tr < H and 0 <= tc < W):
            tr, tc = r - dy, c - dx
        a[0, prefix + q, prefix + tr * W + tc] = 1.0 - prefix_mass
        if prefix:
            a[0, prefix + q, 0] = prefix_mass
    a[0, :prefix, 0] = 1.0
    return a


def test_one_tap_map_has_distance_one_and_full_mass_on_its_offset():
    (head,), = locality([one_tap((1, 0))], (H, W), references=[[(1, 0)]])
    assert head.distance == pytest.approx(1.0)
    assert head.offset_mass == pytest.approx(1.0) and head.best_mass == pytest.approx(1.0)
    assert head.best_offset == (1, 0) and head.offset_shift == 0.0
    assert head.entropy == pytest.approx(0.0, abs=1e-6) and head.prefix_share == 0.0


def test_moved_head_reports_its_new_offset_and_the_shift():
    (head,), = locality([one_tap((0, -2))], (H, W), references=[[(1, 0)]])
    assert head.best_offset == (0, -2) and head.offset_mass == pytest.approx(0.0)
    assert head.offset_shift == pytest.approx(math.sqrt(1 + 4))
    assert head.distance == pytest.approx(2.0)


def test_uniform_map_has_maximal_entropy_and_no_preferred_offset():
    n = H * W + 1
    (head,), = locality([torch.full((1, n, n), 1.0 / n)], (H, W), num_prefix=1)
    assert head.entropy == pytest.approx(math.log(n), rel=1e-6)
    assert head.prefix_share == pytest.approx(1.0 / n)
    masses = offset_masses(torch.full((1, n, n), 1.0 / n), (H, W), num_prefix=1)
    assert torch.allclose(masses, torch.full_like(masses, 1.0 / n))


def test_prefix_share_and_offsets_table():
    (head,), = locality([one_tap((0, 1), prefix=1, prefix_mass=0.25)], (H, W), num_prefix=1)
    assert head.prefix_share == pytest.approx(0.25) and head.best_offset == (0, 1)
    assert head.best_mass == pytest.approx(0.75) and head.reference is None and math.isnan(head.offset_shift)
    assert offsets_within(1) == [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 0), (0, 1), (1, -1), (1, 0), (1, 1)]
    assert offset_masses(one_tap((1, 1)), (H, W), radius=9).shape == (1, 25)  # radius 2: the most a 5 x 6 grid fits


def _run(tmp_path, name: str, *extra: str):
    return run_cli("fit", "--recipe", str(TINY), f"--runs_dir={tmp_path}", f"--name={name}", *extra)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evolution")
    _run(root, "a")
    _run(root, "b")
    return root


def _image_tags(event_file) -> list[str]:
    ea = EventAccumulator(str(event_file), size_guidance={"images": 0})
    ea.Reload()
    return ea.Tags()["images"]


def _records(run_dir) -> dict[int, dict]:
    files = sorted((run_dir / "attention").glob("*.json"))
    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in files}


def test_callback_records_init_and_every_epoch(two_runs):
    recs = _records(two_runs / "a")
    assert sorted(recs) == [0, 4, 8]  # tiny recipe: 4 steps per epoch, 2 epochs
    assert [recs[s]["point"] for s in (0, 4, 8)] == ["init", "epoch_1", "epoch_2"]
    init = recs[0]["sources"]
    assert recs[0]["reference_kind"] == "init_offsets"
    for source in ("images", "pseudo_input"):
        layers = init[source]["layers"]
        assert len(layers) == 2 and all(len(layer) == 2 for layer in layers)  # depth 2, 2 heads
        for layer in layers:
            for head in layer:
                assert head["offset_shift"] == 0.0 or source == "images"
                assert 0.0 <= head["prefix_share"] <= 1.0 and head["distance"] > 0
    # at init the pseudo-input attention is the designed one-tap convolution: (almost) all mass on the offset
    assert min(h["offset_mass"] for layer in init["pseudo_input"]["layers"] for h in layer) > 0.9
    assert init["images"]["num_prefix"] == 1 and init["images"]["grid"] == [8, 8]
    # the logit-term split per layer, at every point; its mass is the images' mass on the reference offsets
    terms = recs[0]["logit_terms"]
    assert [t["layer"] for t in terms] == [0, 1] and all(len(recs[s]["logit_terms"]) == 2 for s in (4, 8))
    for t in terms:
        assert min(t[k] for k in ("pos_pos", "pos_content", "content_pos", "content_content", "logits")) > 0
        assert 0.0 <= t["mass"] <= 1.0 and 0.0 <= t["mass_zero"] <= 1.0
    assert terms[0]["mass_zero"] > 0.9  # block 0 on the zero image: the designed structure (plus biases)
    assert [s for s, _ in scalars(two_runs / "a", "attention_evolution/logit_terms/pos_pos/layer_01")] == [0, 4, 8]
    logged = scalars(two_runs / "a", "attention_evolution/images/distance/layer_00")
    assert [s for s, _ in logged] == [0, 4, 8]
    assert [v for _, v in logged] == pytest.approx([recs[s]["sources"]["images"]["means"]["distance"][0]
                                                    for s in (0, 4, 8)])
    assert len(scalars(two_runs / "a", "attention_evolution/pseudo_input/offset_mass/layer_01")) == 3
    images = [t for f in (two_runs / "a").glob("events.out.tfevents.*") for t in _image_tags(f)]
    assert "attention_evolution/images/layer_00" in images and "attention_evolution/images/layer_01" in images


def test_same_seed_same_numbers(two_runs):
    a, b = _records(two_runs / "a"), _records(two_runs / "b")
    assert a == b


def test_resume_keeps_references_and_skips_the_init_point(two_runs, tmp_path):
    """Interrupted after epoch 1 and resumed: the init point is not measured again (the resumed weights are not the
    initial ones), the final point equals the uninterrupted run's (same references, same probe images), and the run
    keeps exactly one record per point (a record of the same point at another step is removed)."""
    stop = '--trainer.callbacks=[{"class_path": "_cli_helpers.StopAfterEpoch", "init_args": {"epoch": 0}}]'
    _run(tmp_path, "c", stop)
    assert sorted(_records(tmp_path / "c")) == [0, 4]
    first = (tmp_path / "c" / "attention" / "step_00000000.json").read_text()
    # what an earlier life of the run left for a point the resumed run reaches at another step (e.g. one that trained
    # past its last checkpoint with a loader that does not resume mid-epoch): it must not stay as a second epoch_2
    stale = json.loads(first) | {"point": "epoch_2", "epoch": 1, "step": 7}
    (tmp_path / "c" / "attention" / "step_00000007.json").write_text(json.dumps(stale))
    _run(tmp_path, "c", "--resume", "auto")
    recs, ref = _records(tmp_path / "c"), _records(two_runs / "a")
    assert sorted(recs) == [0, 4, 8]  # exactly one record per point
    assert [recs[s]["point"] for s in (0, 4, 8)] == ["init", "epoch_1", "epoch_2"]
    assert (tmp_path / "c" / "attention" / "step_00000000.json").read_text() == first
    assert recs[8]["sources"] == ref[8]["sources"]


def test_without_a_logger_nothing_is_written(tmp_path):
    """A plain ``Trainer(logger=False)`` has no run directory: the callback records (returns) but writes no file into
    the default root (the working directory by default)."""
    import lightning as L

    from impulsevit.callbacks import AttentionEvolution
    from impulsevit.data.loading.synthetic import SyntheticDataModule
    from impulsevit.training.module import ImageClassifier

    model = ImageClassifier("vit_tiny_patch16_224", {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 1,
                                                     "num_heads": 2}, num_classes=4)
    data = SyntheticDataModule(num_classes=4, image_size=16, num_train=16, num_val=8, batch_size=8)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(model, data)
    evo = next(c for c in trainer.callbacks if isinstance(c, AttentionEvolution))
    assert evo.references  # it measured (init and the epoch)
    assert not (tmp_path / "attention").exists() and not list(tmp_path.rglob("step_*.json"))
