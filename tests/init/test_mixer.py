"""MLP-Mixer impulse init: the effective linear token-mixing kernel, measured by probing the real token MLP with
one-hot token inputs, sits on the chosen offsets (zero padding at the grid border); layouts and validation."""

import math

import pytest
import torch
from timm.models.mlp_mixer import MlpMixer, ResBlock

import impulsevit.init as ii
from impulsevit.init.impulse import impulse_indicator, impulse_offsets
from impulsevit.init.mixer import mixer_kernel_summary, mixer_token_kernel

GRID = (8, 8)  # img 32, patch 4 -> N = 64 tokens


def make(embed_dim: int = 64, token_ratio: float = 4.0, blocks: int = 2) -> MlpMixer:
    torch.manual_seed(0)
    return MlpMixer(img_size=32, patch_size=4, num_classes=10, embed_dim=embed_dim, num_blocks=blocks,
                    mlp_ratio=(token_ratio, 2.0)).eval()


def expected_kernel(offsets, tap: float) -> torch.Tensor:
    """K[t, s] = tap for every offset o with s = t + o on the grid (zero padding, no wrap)."""
    h, w = GRID
    k = torch.zeros(h * w, h * w, dtype=torch.float64)
    for r in range(h):
        for c in range(w):
            for dy, dx in offsets:
                if 0 <= r + dy < h and 0 <= c + dx < w:
                    k[r * w + c, (r + dy) * w + c + dx] += tap
    return k


def test_blocks_layout_kernel_is_sum_of_impulses():
    model = make()  # S = 256 = 4 blocks of N = 64
    report = ii.initialize(model, "impulse", generator=0)
    offsets = impulse_offsets(4)
    assert report.family == "mixer" and report.offsets == [offsets, offsets]
    assert report.options["num_offsets"] == 4 and report.options["gain_out"] == pytest.approx(0.5)
    kernels = mixer_token_kernel(model)
    for k in kernels:
        # GELU'(0) = 1/2, gain_in 1, gain_out 1/sqrt(4): every tap 0.25, border rows lose off-grid taps
        assert torch.allclose(k, expected_kernel(offsets, 0.25), atol=1e-6)
    for row in mixer_kernel_summary(kernels, GRID, offsets):
        assert row["offset_mass"] >= 0.95 and row["hit_rate"] == 1.0
        assert row["entropy"] == pytest.approx(math.log(4), abs=1e-6)


def test_real_forward_small_inputs_is_the_convolution():
    """The token MLP inside the block (transposed over channels, as MixerBlock applies it) on small inputs."""
    model = make()
    ii.initialize(model, "impulse")
    x = 1e-3 * torch.randn(2, 64, 5, dtype=torch.float64)  # (batch, tokens, channels)
    mlp = model.blocks[0].mlp_tokens.double()
    with torch.no_grad():
        y = mlp(x.transpose(1, 2)).transpose(1, 2)
    k = expected_kernel(impulse_offsets(4), 0.25)
    lin = k @ x
    assert float((y - lin).abs().max()) < 0.01 * float(lin.abs().max())  # GELU's quadratic term: ~0.2 % here


@pytest.mark.parametrize(
    "token_ratio,layout,n_off",
    [(3.0, "blocks", 3), (1.5, "factored", 9), (1.5, "blocks", 1), (4.0, "blocks", 2)],
)
def test_kernel_concentrated_on_offsets(token_ratio, layout, n_off):
    """Remainder hidden units (S not a multiple of N) and the factored layout keep the kernel on the offsets."""
    model = make(token_ratio=token_ratio)
    s = model.blocks[0].mlp_tokens.fc1.out_features
    kwargs = {"layout": layout} if (layout, n_off) != ("blocks", 2) else {"num_offsets": 2}
    fc1_before = model.blocks[0].mlp_tokens.fc1.weight.detach().clone()
    report = ii.initialize(model, "impulse", base="keep", **kwargs)
    offsets = impulse_offsets(n_off)
    assert report.offsets[0] == offsets
    kernels = mixer_token_kernel(model)
    for row in mixer_kernel_summary(kernels, GRID, offsets):
        assert row["offset_mass"] >= 0.95 and row["hit_rate"] >= 0.95
    tap = 0.5 / math.sqrt(n_off)
    assert torch.allclose(kernels[0], expected_kernel(offsets, tap), atol=1e-6)
    used = 64 if layout == "factored" else 64 * n_off
    if s > used:  # remainder: fc1 rows untouched, fc2 columns zero (alive: they still get gradients)
        assert torch.equal(model.blocks[0].mlp_tokens.fc1.weight[used:], fc1_before[used:])
        assert not model.blocks[0].mlp_tokens.fc2.weight[:, used:].any()
        remainder = f"{s - used} remainder hidden units (fc1 kept, fc2 columns zero)"
        assert any(n.endswith(remainder) for n in report.notes) or layout == "factored"
    assert any("identity" in note for note in report.notes) == (layout == "blocks" and n_off == 1)


def test_fc1_only_layout_leaves_fc2():
    model = make()
    fc2 = model.blocks[1].mlp_tokens.fc2.weight.detach().clone()
    ii.initialize(model, "impulse", layout="fc1_only", base="keep")
    w1 = model.blocks[1].mlp_tokens.fc1.weight.detach()
    assert torch.equal(model.blocks[1].mlp_tokens.fc2.weight, fc2)
    assert set(w1.unique().tolist()) == {0.0, 1.0} and torch.all(w1.sum(1) <= 1)
    # block 1 of fc1 (offset "up"): hidden unit for token (r, c) reads token (r-1, c)
    assert w1[64 + 2 * 8 + 3, 1 * 8 + 3] == 1.0 and w1[64 + 0 * 8 + 3].sum() == 0  # top row: no neighbour above
    kernels = mixer_token_kernel(model)
    assert mixer_kernel_summary(kernels, GRID, impulse_offsets(4))[1]["offset_mass"] < 0.5  # fc2 random: not a conv


def test_validation_errors_leave_model_untouched():
    small = make(token_ratio=0.5)  # S = 32 < N = 64
    before = {k: v.clone() for k, v in small.state_dict().items()}
    with pytest.raises(ValueError, match=r"MlpMixer: token-mixing hidden size S=32 < N=64"):
        ii.initialize(small, "impulse")
    assert all(torch.equal(before[k], v) for k, v in small.state_dict().items())
    with pytest.raises(ValueError, match=r"num_offsets=5 must be in \[1, S//N=4\]"):
        ii.initialize(make(), "impulse", num_offsets=5)
    with pytest.raises(ValueError, match=r"option 'layout' of init method 'impulse' \(mixer\) must be one of"):
        ii.initialize(make(), "impulse", layout="diagonal")
    resmlp = MlpMixer(img_size=32, patch_size=4, embed_dim=64, num_blocks=1, block_layer=ResBlock, mlp_ratio=4,
                      num_classes=10)
    with pytest.raises(ValueError, match=r"MlpMixer: block 0 \(ResBlock\) has no plain timm Mlp"):
        ii.initialize(resmlp, "impulse")
    with pytest.raises(ValueError, match="cannot be applied to MlpMixer"):
        ii.initialize(make(), "mimetic")


def test_trains_and_stays_finite():
    model = make().train()
    ii.initialize(model, "impulse")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    fc2_cols = model.blocks[0].mlp_tokens.fc2.weight.detach().clone()
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(model.blocks[0].mlp_tokens.fc2.weight, fc2_cols)


def test_registered_token_kernel_maps():
    model = make()
    report = ii.initialize(model, "impulse")
    maps = ii.attention_maps(model)
    assert maps.grid == GRID and maps.source == "token-kernel" and maps[0].shape == (1, 64, 64)
    assert torch.allclose(maps[0].sum(-1), torch.ones(1, 64))
    # one "head" per block: scored on its first offset (self) -> 1/4 of the mass, argmax ties resolved by index
    s = ii.summarize(maps, [[o[0]] for o in report.offsets])
    assert all(h.target_mass == pytest.approx(0.25, abs=1e-6) for h in s)
    # every row spreads over its on-grid taps only: 4 (interior) down to 2 (corner) equal taps
    assert all(math.log(2) < h.entropy < math.log(4) + 1e-6 for h in s)


def test_kernel5_factored_covers_25_offsets():
    model = make(token_ratio=1.5)
    report = ii.initialize(model, "impulse", layout="factored", kernel_size=5)
    offsets = ii.kernel_offsets(5)
    assert report.offsets[0] == offsets and report.options["num_offsets"] == 25
    assert torch.allclose(mixer_token_kernel(model)[0], expected_kernel(offsets, 0.5 / 5), atol=1e-6)


@pytest.mark.parametrize("token_ratio", [0.75, 1.5, 4.0])  # S < N, N < S < 2N, S = 4N
def test_one_tap_layout_is_one_tap_per_block_carried_by_every_hidden_unit(token_ratio):
    """``layout='one_tap'``: block ``b``'s composite (linear part, one-hot probing of the real token MLP) is exactly
    one tap at ``impulse_offsets(depth)[b]`` with gain 1 (zero padding at the border), where ``factored`` is a 9-tap
    box; every hidden unit serves a token (no zero fc2 column) and no two units are alike."""
    model = make(token_ratio=token_ratio, blocks=3)
    report = ii.initialize(model, "impulse", layout="one_tap", generator=0)
    offsets = impulse_offsets(3)
    assert report.offsets == [[o] for o in offsets]
    s = model.blocks[0].mlp_tokens.fc1.out_features
    served = min(s, GRID[0] * GRID[1])
    for block, kernel in enumerate(mixer_token_kernel(model)):
        expected = expected_kernel([offsets[block]], 1.0)
        expected[served:] = 0  # tokens no unit serves (S < N)
        assert torch.allclose(kernel, expected, atol=1e-6)
        mlp = model.blocks[block].mlp_tokens
        assert (mlp.fc2.weight != 0).any(0).all()  # every hidden unit has an output
        fc1 = mlp.fc1.weight.detach()
        assert torch.unique(fc1[fc1.any(1)], dim=0).shape[0] == int(fc1.any(1).sum())
    assert "[+0.00 +0.00 +0.00 | +0.00 +1.00 +0.00 | +0.00 +0.00 +0.00]" in report.notes[-1]
    box = make(token_ratio=token_ratio, blocks=3) if token_ratio >= 1 else None
    if box is not None:
        notes = ii.initialize(box, "impulse", layout="factored", generator=0).notes
        assert "[+0.17 +0.17 +0.17 | +0.17 +0.17 +0.17 | +0.17 +0.17 +0.17]" in notes[-1]


def test_one_tap_permutation_control_has_no_locality_and_the_same_norms():
    """``tap='permutation'`` (a control): each block's composite is ``g`` times a permutation matrix, not the shift;
    every fc1 row keeps one nonzero of the same magnitudes as the shift layout at the same seed (the draws differ only
    by the permutation, drawn before the magnitudes)."""
    n = GRID[0] * GRID[1]
    model = make(blocks=3)
    ii.initialize(model, "impulse", layout="one_tap", tap="permutation", gain_in=0.5, generator=0)
    shift = make(blocks=3)
    ii.initialize(shift, "impulse", layout="one_tap", gain_in=0.5, generator=0)
    for kernel, reference in zip(mixer_token_kernel(model), mixer_token_kernel(shift)):
        assert torch.allclose(kernel.abs().sum(1), torch.full((n,), 0.5, dtype=kernel.dtype), atol=1e-5)  # one tap
        assert torch.equal((kernel.abs() > 1e-3).sum(0), torch.ones(n, dtype=torch.long))  # each input read once
        assert not torch.allclose(kernel, reference, atol=1e-3)
    for block in range(3):
        fc1 = model.blocks[block].mlp_tokens.fc1.weight.detach()
        assert torch.equal((fc1 != 0).sum(1), torch.ones(fc1.shape[0], dtype=torch.long))


def test_one_tap_combine_add_keeps_the_torch_base_and_adds_the_tap():
    """``combine='add'``: fc1 / fc2 are the ``torch`` method's values for the seed plus the ``replace`` layout's
    one-tap weights (same draws), and the token MLP's biases stay the base's (not zero)."""
    torch_model, replaced, added = make(blocks=2), make(blocks=2), make(blocks=2)
    ii.initialize(torch_model, "torch", generator=0)
    ii.initialize(replaced, "impulse", layout="one_tap", gain_in=0.3, gain_out=0.3, generator=0)
    report = ii.initialize(added, "impulse", layout="one_tap", gain_in=0.3, gain_out=0.3, combine="add", generator=0)
    for block in range(2):
        base, one, both = (m.blocks[block].mlp_tokens for m in (torch_model, replaced, added))
        for lin in ("fc1", "fc2"):
            w = getattr(both, lin).weight.detach()
            assert torch.allclose(w, getattr(base, lin).weight.detach() + getattr(one, lin).weight.detach(), atol=1e-6)
            assert torch.equal(getattr(both, lin).bias, getattr(base, lin).bias)
            assert getattr(base, lin).bias.abs().sum() > 0 and getattr(one, lin).bias.abs().sum() == 0
        channels = added.blocks[block].mlp_channels.fc1.weight
        assert torch.equal(channels, torch_model.blocks[block].mlp_channels.fc1.weight)
    assert "added to the base's token MLP (torch)" in " ".join(report.notes)
    with pytest.raises(ValueError, match="'combine' .*needs layout='one_tap' or 'factored'"):
        ii.initialize(make(), "impulse", layout="blocks", combine="add", generator=0)
    with pytest.raises(ValueError, match="'tap' .*needs layout='one_tap'"):
        ii.initialize(make(), "impulse", layout="factored", tap="permutation", generator=0)


def test_factored_combine_add_is_the_torch_base_plus_the_kernel():
    """``layout='factored', combine='add'``: fc1's first N rows gain ``gain_in·I`` and fc2's first N columns gain the
    3×3 kernel ``gain_out·Σ_o S_o`` on top of the ``torch`` values for the seed; the rest and the biases stay the
    base's."""
    torch_model, added = make(blocks=2), make(blocks=2)
    ii.initialize(torch_model, "torch", generator=0)
    ii.initialize(added, "impulse", layout="factored", gain_in=0.2, gain_out=0.1, combine="add", generator=0)
    grid = torch_model.stem.grid_size
    n = grid[0] * grid[1]
    kernel = sum(impulse_indicator(grid[0], grid[1], o) for o in impulse_offsets(9)).float()
    for block in range(2):
        base, both = (m.blocks[block].mlp_tokens for m in (torch_model, added))
        d1 = both.fc1.weight.detach() - base.fc1.weight.detach()
        d2 = both.fc2.weight.detach() - base.fc2.weight.detach()
        assert torch.allclose(d1[:n], 0.2 * torch.eye(n), atol=1e-6) and d1[n:].abs().max() < 1e-6
        assert torch.allclose(d2[:, :n], 0.1 * kernel, atol=1e-6) and d2[:, n:].abs().max() < 1e-6
        for lin in ("fc1", "fc2"):
            assert torch.equal(getattr(both, lin).bias, getattr(base, lin).bias)


def test_token_jacobians_on_real_inputs():
    """The composite response on real inputs: one Jacobian per image and channel, equal to central differences of
    the token MLP at the input the forward gave it (captured here independently), with the kernel's support."""
    from _real_images import real_images

    from impulsevit.init.mixer import mixer_token_jacobians

    model = make(embed_dim=32)
    report = ii.initialize(model, "impulse", generator=0, layout="factored")
    model.train()
    images = real_images(2, 32)
    captured = []
    hook = model.blocks[1].mlp_tokens.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    jacobians = mixer_token_jacobians(model, images)
    hook.remove()
    assert model.training and len(jacobians) == 2 and jacobians[1].shape == (2 * 32, 64, 64)
    mlp, eps = model.blocks[1].mlp_tokens, 1e-3
    u = captured[0].reshape(-1, 64)[5].double()
    with torch.no_grad():
        probe = eps * torch.eye(64, dtype=torch.float64)
        fd = (mlp.double()(u + probe) - mlp(u - probe)).T / (2 * eps)  # column s = response to token s
        mlp.float()
    torch.testing.assert_close(jacobians[1][5].double(), fd, rtol=1e-3, atol=1e-5)
    assert not torch.allclose(jacobians[1][5], jacobians[1][6])  # a response per input, not the zero-input kernel
    kernel = mixer_token_kernel(model)[1]
    for j in jacobians[1][:4]:  # the construction's support holds on every input
        assert mixer_kernel_summary([j.double()], GRID, report.offsets[1])[0]["offset_mass"] > 0.999
    assert not torch.allclose(jacobians[1].mean(0).double(), kernel, rtol=1e-2, atol=1e-4)
