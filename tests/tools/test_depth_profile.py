"""``scripts/depth_profile.py`` (the depth study's tables in docs/results.md): each of its three modes runs on real
Fashion-MNIST images through ``main`` and prints tables whose numbers are what the constructions promise; bad input
is one line and exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _scripts import load_script

REPO = Path(__file__).resolve().parents[2]
FASHION = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
pytestmark = pytest.mark.skipif(not FASHION.exists(), reason="Debian's dataset-fashion-mnist is not installed "
                                                              "(scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def depth_profile():
    return load_script("scripts/depth_profile.py")


def _rows(text: str, variant: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {variant} |")]


def test_vit_term_split_propagated_solve_holds_the_pos_pos_term(depth_profile, capsys):
    assert depth_profile.main(["--images", "8", "--variant", "default", "--variant", "propagated"]) == 0
    out = capsys.readouterr().out
    tables = {name: [line.split() for line in block.strip().splitlines()[1:]]
              for name, block in re.findall(r"\n(\w+) \(impulse seed 0.*?\)\n(.*?)(?=\n\n|\Z)", out, re.S)}
    assert set(tables) == {"default", "propagated"} and all(len(t) == 6 for t in tables.values())
    pos_only = {name: [float(r[8]) for r in t] for name, t in tables.items()}  # mass with the pos-pos term alone
    assert pos_only["default"][0] == pos_only["propagated"][0]  # block 0 is solved on the same input
    # the released solve designs every block for block 0's input: deep blocks lose it; the propagated solve keeps it
    assert max(pos_only["default"][3:]) < 0.5 and min(pos_only["propagated"][1:]) > 0.9


def test_maps_mode_swin_bias_construction_holds_its_target_mass_in_every_block(depth_profile, capsys):
    assert depth_profile.main(["--recipe", "cpu_fmnist_swin", "--maps", "--images", "8"]) == 0
    rows = _rows(capsys.readouterr().out, "default")
    assert [int(r[1]) for r in rows] == list(range(6))
    assert all(abs(float(r[2]) - 0.75) < 0.01 for r in rows)  # target_mass 0.75 on the pseudo-input, by construction
    assert all(0.5 < float(r[3].split("±")[0]) < 1.0 for r in rows)  # held on real images


def test_mixer_mode_one_tap_keeps_its_mass_on_the_designed_taps(depth_profile, capsys):
    assert depth_profile.main(["--recipe", "cpu_fmnist_mixer", "--images", "4", "--mixer", "one_tap"]) == 0
    rows = _rows(capsys.readouterr().out, "one_tap")
    assert len(rows) >= 2 and all(float(r[2]) > 0.99 and float(r[3]) > 0.99 for r in rows)


@pytest.mark.parametrize("argv, says", [
    (["--variant", "sideways"], "unknown name 'sideways'"),
    (["--variant", "default:gain_qk"], "is not key=value"),
    (["--maps", "--recipe", "no_such_recipe"], "no_such_recipe"),
    (["--images", "0"], "--images must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(depth_profile, capsys, argv, says):
    assert depth_profile.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and err.startswith("depth_profile: ")


def test_mixer_strength_mode_compares_the_token_branch_with_pytorchs_init(depth_profile, capsys):
    assert depth_profile.main(["--recipe", "cpu_fmnist_mixer", "--mixer-strength", "--images", "4", "--variant",
                               "torch", "--variant", "default:layout=one_tap", "--variant",
                               "default:layout=one_tap,gain_in=0.17"]) == 0
    out = capsys.readouterr().out
    first = {v: [float(c) for c in _rows(out, v)[0][2:]] for v in
             ("torch", "default:layout=one_tap", "default:layout=one_tap,gain_in=0.17")}
    assert all(len(_rows(out, v)) == 6 for v in first)
    # block 0: the one-tap kernel is one unit tap (row norm 1), PyTorch's a small random one; gain_in scales it
    assert first["default:layout=one_tap"][0] > 0.99 and first["torch"][0] < 0.3
    assert abs(first["default:layout=one_tap,gain_in=0.17"][0] - 0.17) < 0.01
    assert first["default:layout=one_tap"][1] > 3 * first["torch"][1]  # its branch dominates the stream at block 0


def test_saturation_mode_bounds_the_softmax_slope_by_the_largest_weight(depth_profile, capsys):
    """Per row ``1 − max p ≤ 1 − Σp² ≤ 1 − (max p)²``, so the means obey ``1 − mean(max) ≤ slope ≤ 1 − mean(max)²``;
    the first variant's gradient ratios are 1 by definition; the ridge-1.0 calibrated start (0.84-0.97 on the offset)
    is far more saturated in the last block than the released one."""
    strong = "calibration:calibration_ridge=1.0"
    assert depth_profile.main(["--saturation", "--images", "8", "--variant", "default", "--variant", strong]) == 0
    out = capsys.readouterr().out
    rows = {v: [[float(c) for c in r[2:]] for r in _rows(out, v)] for v in ("default", strong)}
    assert all(len(r) == 6 for r in rows.values())
    for largest, slope, _ in rows["default"] + rows[strong]:
        assert 1 - largest - 1e-3 <= slope <= 1 - largest ** 2 + 1e-3
    assert all(ratio == 1.0 for *_, ratio in rows["default"])
    assert rows[strong][5][1] < 0.5 * rows["default"][5][1]


def test_softmax_rows_are_the_weights_the_attention_forward_uses(depth_profile):
    """The recomputed weights, applied to the block's own values and projection, give the module's output."""
    import torch

    model = depth_profile.build("cpu_fmnist_vit_smallimg").eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 50, attn.qkv.in_features)
    p = depth_profile.softmax_rows(x, attn)
    assert torch.allclose(p.sum(-1), torch.ones(p.shape[:-1]), atol=1e-5)
    b, n, d = x.shape
    v = torch.nn.functional.linear(x, attn.qkv.weight, attn.qkv.bias).reshape(b, n, 3, attn.num_heads, -1)[:, :, 2]
    out = attn.proj((p @ v.transpose(1, 2)).transpose(1, 2).reshape(b, n, d))
    with torch.no_grad():
        assert torch.allclose(out, attn(x), atol=1e-5)
