"""Every recipe builds its backbone on the meta device with the parameter count its header promises.

The recipe files stay real: this reads each YAML, takes ``model.backbone`` / ``backbone_kwargs`` and the dataset's class
count from the registry, and builds the model with ``torch.device("meta")`` (no memory, no init cost). Reference counts
are the well-known ImageNet-1K sizes; a recipe with another class count is compared after swapping its classifier head
for a 1000-class one. (``tests/test_cli.py`` runs every recipe with ``fast_dev_run`` on a shrunken model.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
import yaml

import impulsevit.models  # noqa: F401 - registers convmixer_cifar* with timm
from impulsevit.data.registry import get_dataset

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
# ImageNet-1K parameter counts of the reference architectures (timm; DeiT / Swin papers): ViT-B/16 86.6 M, ViT-S/16
# 22.1 M, ViT-Ti/16 5.7 M, Swin-T 28.3 M, Mixer-S/16 18.5 M.
REFERENCE_1K = {
    "vit_base_patch16_224": 86.57e6,
    "vit_small_patch16_224": 22.05e6,
    "vit_tiny_patch16_224": 5.72e6,
    "swin_tiny_patch4_window7_224": 28.29e6,
    "mixer_s16_224": 18.53e6,
}


def _build_meta(recipe: Path) -> tuple[torch.nn.Module, dict, int]:
    cfg = yaml.safe_load(recipe.read_text())
    model_cfg, data_args = cfg["model"], cfg["data"]["init_args"]
    dataset = data_args.get("dataset")
    num_classes = get_dataset(dataset).num_classes if dataset else data_args["num_classes"]
    with torch.device("meta"):
        model = timm.create_model(model_cfg["backbone"], num_classes=num_classes,
                                  **(model_cfg.get("backbone_kwargs") or {}))
    return model, model_cfg, num_classes


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_builds_on_meta_with_the_expected_parameter_count(recipe):
    model, model_cfg, num_classes = _build_meta(recipe)
    assert all(p.is_meta for p in model.parameters())
    count = sum(p.numel() for p in model.parameters())
    assert count > 0
    ref = REFERENCE_1K.get(model_cfg["backbone"])
    if ref is None or (model_cfg.get("backbone_kwargs") or {}).get("img_size", 224) != 224:
        return  # CPU / ConvMixer recipes: small models with no published reference size
    head = model.get_classifier()
    as_1k = count - sum(p.numel() for p in head.parameters()) + (head.in_features + 1) * 1000
    assert abs(as_1k - ref) / ref < 0.005, f"{recipe.stem}: {as_1k / 1e6:.2f} M vs reference {ref / 1e6:.2f} M"


def test_paper_recipes_name_their_paper_numbers_and_layout():
    """The header of every recipe for a paper row states the row, its numbers, the GPU layout, the lr rule and cost."""
    from impulsevit.study import paper_numbers

    paper_rows = [r for r in RECIPES if not r.stem.startswith(("cpu_", "quickstart", "tiny_"))]
    assert len(paper_rows) >= 16  # 3 DeiT IN-1K, ViT-B IN-21K, 6 ViT-Ti small data, Swin, Mixer, 4 ConvMixer
    for r in paper_rows:
        header = r.read_text().split("\nseed_everything")[0]
        for key in ("# reproduces:", "# paper:", "# layout:", "# cost:"):
            assert key in header, f"{r.name}: header lacks {key!r}"
        assert "GPU" in header and "lr" in header, r.name
        numbers = paper_numbers(r)
        if r.stem.startswith(("vit_tiny_", "swin_", "mixer_")):
            assert set(numbers) == {"torch", "impulse"} and numbers["impulse"] > numbers["torch"], r.name
