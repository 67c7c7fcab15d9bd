"""Every recipe builds its backbone on the meta device with the parameter count its header promises.

The recipe files stay real: this reads each YAML, takes ``model.backbone`` / ``backbone_kwargs`` and the dataset's class
count from the registry, and builds the model with ``torch.device("meta")`` (no memory, no init cost). Reference counts
are the well-known ImageNet-1K sizes; a recipe with another class count is compared after swapping its classifier head
for a 1000-class one. (``tests/cli/test_cli.py`` runs every recipe with ``fast_dev_run`` on a shrunken model.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
import yaml

import impulsevit.models  # noqa: F401 - registers convmixer_cifar* with timm
from impulsevit.data.sources.registry import get_dataset

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
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
    """The recipe's backbone on the meta device, built as ``ImageClassifier`` builds it: the data's ``image_size`` is
    the input size (``impulsevit.training.backbone.timm_kwargs``). ``model_cfg`` gets the resolved ``timm_kwargs``."""
    from impulsevit.training.backbone import timm_kwargs

    cfg = yaml.safe_load(recipe.read_text())
    model_cfg, data_args = cfg["model"], cfg["data"]["init_args"]
    dataset = data_args.get("dataset")
    num_classes = get_dataset(dataset).num_classes if dataset else data_args["num_classes"]
    kwargs = timm_kwargs(model_cfg["backbone"], model_cfg.get("backbone_kwargs"), num_classes,
                         data_args.get("image_size"))
    with torch.device("meta"):
        model = timm.create_model(model_cfg["backbone"], **kwargs)
    return model, {**model_cfg, "timm_kwargs": kwargs}, num_classes


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_builds_on_meta_with_the_expected_parameter_count(recipe):
    model, model_cfg, num_classes = _build_meta(recipe)
    assert all(p.is_meta for p in model.parameters())
    count = sum(p.numel() for p in model.parameters())
    assert count > 0
    ref = REFERENCE_1K.get(model_cfg["backbone"])
    if ref is None or model_cfg["timm_kwargs"].get("img_size", 224) != 224:
        return  # CPU / ConvMixer recipes: small models with no published reference size
    head = model.get_classifier()
    as_1k = count - sum(p.numel() for p in head.parameters()) + (head.in_features + 1) * 1000
    assert abs(as_1k - ref) / ref < 0.005, f"{recipe.stem}: {as_1k / 1e6:.2f} M vs reference {ref / 1e6:.2f} M"


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_paper_numbers_are_top1_of_registered_methods(recipe):
    """``impulsevit study`` prints a recipe's ``# paper:`` numbers beside the measured means, keyed by init method:
    every key must be a method the registry knows (else the column stays empty) and every value a top-1 in %."""
    import impulsevit.init as ii
    from impulsevit.study import paper_numbers

    numbers = paper_numbers(recipe)
    assert set(numbers) <= set(ii.methods()), f"{recipe.name}: unknown methods {set(numbers) - set(ii.methods())}"
    assert all(0 < v <= 100 for v in numbers.values()), f"{recipe.name}: {numbers} are not percentages"
    method = yaml.safe_load(recipe.read_text())["model"].get("init", {}).get("method", "impulse")
    assert method in ii.methods(), f"{recipe.name}: model.init.method {method!r} is not registered"


def test_the_quickstart_header_and_the_readme_give_the_same_measurement():
    """The recipe header's measured wall time and accuracies are the README's "Quick start" numbers (one measurement
    quoted twice, not two)."""
    import re

    root = Path(__file__).resolve().parents[2]
    header = "\n".join(ln for ln in (root / "recipes" / "quickstart.yaml").read_text().splitlines()
                       if ln.startswith("#"))
    readme = (root / "README.md").read_text()
    quick = readme[readme.index("**Quick start**"):].split("\n\n")[0]
    walls = re.findall(r"(\d+ min \d+ s)", header)
    accs = [f"{float(a) * 100:.1f} %" for a in re.findall(r"0\.(?:\d{3})", header)]
    assert walls and accs
    assert all(w in quick for w in walls), (walls, quick)
    assert all(a in quick for a in accs), (accs, quick)
