"""The coverage check of ``impulse`` over timm's model registry (impulsevit/init/coverage.py, scripts/init_coverage.py):
rows for a few small real timm models (applies with structure / refuses with the reason), the smallest-per-group
selection, and the generated table in the method card."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import timm
import torch
from _scripts import load_script

import impulsevit.init as ii
from impulsevit.init.coverage import check_model, markdown_table, smallest_models

REPO = Path(__file__).resolve().parents[2]


def _numbers(text: str, key: str) -> float:
    return float(re.search(key + r" (\d\.\d+)", text).group(1))


def test_rows_apply_with_structure_or_refuse_with_the_reason():
    vit = check_model("vit_tiny_r_s16_p8_224")  # a hybrid (ResNet stem) ViT-Ti: family vit
    assert vit.applies and vit.family == "vit" and vit.message == ""
    assert _numbers(vit.structure, "interior hit") >= 0.97 and _numbers(vit.structure, "self heads: mass") >= 0.99
    mixer = check_model("mixer_s32_224")
    assert mixer.applies and mixer.family == "mixer" and _numbers(mixer.structure, "mass") >= 0.95
    relpos = check_model("vit_relpos_small_patch16_224")
    assert relpos.applies and relpos.family == "relbias" and _numbers(relpos.structure, "interior hit") == 1.0
    v2 = check_model("swinv2_cr_tiny_224")
    assert v2.applies and v2.family == "swinv2" and _numbers(v2.structure, "interior hit") == 1.0
    table = markdown_table([vit, relpos]).splitlines()
    assert len(table) == 4 and "applies (vit)" in table[2] and "applies (relbias)" in table[3]


def test_rope_model_applies_through_the_rotary_adapter():
    """EVA-02 has an absolute pos_embed *and* rotary embeddings: the rotary adapter (not the ViT pseudo-input solve,
    which the rotation would break) must handle it."""
    model = timm.create_model("eva02_tiny_patch14_224", img_size=28, depth=1)
    report = ii.initialize(model, "impulse", generator=0)
    assert report.family == "rope" and any("coherent rotary phases" in n for n in report.notes)


def test_smallest_model_per_group_by_parameter_count():
    rows = smallest_models(["convmixer*"])
    names = timm.list_models("convmixer*")
    counts = {}
    for n in names:
        with torch.device("meta"):
            counts[n] = sum(p.numel() for p in timm.create_model(n).parameters())
    assert sum(r[4] for r in rows) == len(names)
    for _, _, name, params, _ in rows:
        assert params == pytest.approx(counts[name] / 1e6)
    assert min(counts, key=counts.get) in {r[2] for r in rows}


def test_card_holds_the_generated_table():
    card = (REPO / "impulsevit" / "init" / "README.md").read_text()
    block = card.split("<!-- coverage:begin -->", 1)[1].split("<!-- coverage:end -->", 1)[0]
    assert "python scripts/init_coverage.py --write" in block
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    patterns = {line.split("|")[1].strip().strip("`") for line in rows}
    assert patterns == {"vit_*", "deit3_*", "deit*", "eva*", "beit*", "swin*", "mixer*", "convmixer*"}
    assert all(("applies (" in r) != ("refuses" in r) for r in rows)


def test_script_checks_named_models_and_writes_between_the_markers(tmp_path, capsys):
    script = load_script("scripts/init_coverage.py")
    assert script.main(["--models", "mixer_s32_224"]) == 0
    out = capsys.readouterr().out
    assert "`mixer_s32_224`" in out and "applies (mixer)" in out
    card = tmp_path / "card.md"
    card.write_text(f"intro\n{script.BEGIN}\nold table\n{script.END}\noutro\n")
    script.write_card("| new |", card)
    text = card.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old table" not in text
    assert "| new |" in text and script.COMMAND in text
