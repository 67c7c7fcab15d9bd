"""Impulse init speed: impulsevit's batched rank-d subspace solve vs the straightforward per-head D×D SVD formulation.

For ViT-Ti/S/B/16 at 224 and ViT-Ti at 32 px / patch 2, in one process:

* ``impulsevit``: ``impulsevit.init.initialize(model, "impulse", generator=seed)`` (the whole call: PyTorch-default
  base init, pos_embed ×18, Q/K solve, mimetic V/proj);
* ``per-head``: the same init written the straightforward way: ``G = PᵀP`` eigendecomposition,
  ``P⁺ = G⁺_r Pᵀ``, then per layer and head a dense ``T_i``, ``B_i = P⁺ T_i P⁺ᵀ`` and one ``D × D`` SVD; V/proj by one
  ``D × D`` SVD per layer. It draws the same random numbers in the same order, so both produce the same model: its
  base init is :func:`~impulsevit.init.baselines.base_values` (``base='torch'``), the function ``impulse`` calls,
  so the check follows that code.

Asserts that every head's ``W_qᵀ W_k`` (and every layer's ``W_vᵀ W_projᵀ``) agree, prints both times (impulsevit: the
median of 3 calls after a warm-up call; per-head: one call), the Q/K-solve times alone, the time of the V/proj balanced
splits alone (the spec's one ``D × D`` SVD per layer, shared by both formulations — the floor of the whole call), and
ends with ``ratio: X`` = per-head time / impulsevit time for ViT-B/16 (the whole init call; with ``--only`` or
``--smoke``, of the model run).

Run: ``.venv/bin/python benchmarks/init_speed.py [--only vit_base_patch16_224] [--smoke]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

import impulsevit.init as ii
from impulsevit.init import impulse as imp
from impulsevit.init.baselines import as_tensor, base_values, write_values
from impulsevit.init.vit_layout import vit_layout

CONFIGS = [
    ("vit_tiny_patch16_224", {}),
    ("vit_small_patch16_224", {}),
    ("vit_tiny_patch2_32", {"img_size": 32, "patch_size": 2}),
    ("vit_base_patch16_224", {}),
]
SMOKE_CONFIGS = [("vit_tiny_patch4_32_depth2", {"img_size": 32, "patch_size": 4, "depth": 2})]
"""``--smoke``: the same code path on a 2-block ViT-Ti of 64 tokens, in seconds (the test suite runs it)."""


def build(name: str, kw: dict) -> torch.nn.Module:
    arch = "vit_tiny_patch16_224" if name.startswith("vit_tiny") else name
    return timm.create_model(arch, weight_init="skip", **kw)


def per_head_impulse(model: torch.nn.Module, g: torch.Generator) -> float:
    """The straightforward formulation of the released algorithm; returns the seconds spent in the Q/K solve."""
    lay = vit_layout(model, need_pos_embed=True)
    (hh, ww), h, d, dim = lay.grid, lay.num_heads, lay.head_dim, lay.dim
    n = hh * ww
    full = {f"{a}.qkv.weight" for a in lay.attn_names} | {f"{a}.proj.weight" for a in lay.attn_names}
    # the base init exactly as impulsevit's base='torch' draws it (its function, so this check follows that code)
    values, _ = base_values(model, g, "torch", full)
    pos = as_tensor(values["pos_embed"]) * 18.0
    values["pos_embed"] = pos
    qk_seconds = 0.0
    t0 = time.perf_counter()
    p = imp.layer_norm_rows(pos[0, lay.patch_rows].double())
    lam, vec = torch.linalg.eigh(p.T @ p)
    lam, vec = lam.flip(0)[:d], vec.flip(1)[:, :d]
    pplus = vec @ torch.diag(1.0 / lam) @ vec.T @ p.T  # D × N
    offsets = imp.impulse_offsets(h)
    qk_seconds += time.perf_counter() - t0
    for a in lay.attn_names:
        t0 = time.perf_counter()
        noise = imp.draw_noise(h, n, g)
        targets = imp.target_logits(hh, ww, offsets, noise)
        qkv = torch.empty(3 * dim, dim)
        for i in range(h):
            b = pplus @ targets[i] @ pplus.T
            u, s, yh = torch.linalg.svd(b)
            f, gk = u[:, :d] * s[:d].sqrt(), yh[:d].T * s[:d].sqrt()
            qkv[i * d : (i + 1) * d] = (7.0 * f / f.norm()).T.float()
            qkv[dim + i * d : dim + (i + 1) * d] = (7.0 * gk / gk.norm()).T.float()
        qk_seconds += time.perf_counter() - t0
        c = imp.draw_value_matrix(dim, g, 0.4, 0.4)  # the same draw: 0.4·Z − 0.4·I
        u, s, yh = torch.linalg.svd(c)
        qkv[2 * dim :] = (u * s.sqrt()).T.float()
        values[f"{a}.proj.weight"] = (s.sqrt()[:, None] * yh).T.float()
        values[f"{a}.qkv.weight"] = qkv
    write_values(model, values)
    return qk_seconds


def impulsevit_qk_only(model: torch.nn.Module, g: torch.Generator) -> float:
    """impulsevit's Q/K solve alone (pseudo-input factorisation, per-layer noise + batched solve), in seconds."""
    lay = vit_layout(model, need_pos_embed=True)
    (hh, ww), h, d = lay.grid, lay.num_heads, lay.head_dim
    t0 = time.perf_counter()
    pi = imp.factor_pseudo_input(imp.layer_norm_rows(model.pos_embed.detach()[0, lay.patch_rows].double()), d)
    offsets = imp.impulse_offsets(h)
    for _ in lay.attns:
        imp.solve_qk(pi, hh, ww, offsets, imp.draw_noise(h, hh * ww, g), d, dtype=torch.float32)
    return time.perf_counter() - t0


def value_proj_only(model: torch.nn.Module, g: torch.Generator) -> float:
    """The V/proj balanced splits alone (one float32 ``D × D`` eigendecomposition per layer, sequential), seconds."""
    lay = vit_layout(model, need_pos_embed=True)
    cs = [imp.draw_value_matrix(lay.dim, g).float() for _ in lay.attns]
    t0 = time.perf_counter()
    for c in cs:
        imp.value_proj_from(c, torch.float32)
    return time.perf_counter() - t0


def check_same(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Max relative difference of every head's W_qᵀW_k and every layer's W_vᵀW_projᵀ between two models."""
    worst = 0.0
    for ba, bb in zip(a.blocks, b.blocks):
        h, d = ba.attn.num_heads, ba.attn.head_dim
        dim = h * d
        wa, wb = ba.attn.qkv.weight.detach().double(), bb.attn.qkv.weight.detach().double()
        for i in range(h):
            qa = wa[i * d : (i + 1) * d].T @ wa[dim + i * d : dim + (i + 1) * d]
            qb = wb[i * d : (i + 1) * d].T @ wb[dim + i * d : dim + (i + 1) * d]
            worst = max(worst, ((qa - qb).norm() / qb.norm()).item())
        va = wa[2 * dim :].T @ ba.attn.proj.weight.detach().double().T
        vb = wb[2 * dim :].T @ bb.attn.proj.weight.detach().double().T
        worst = max(worst, ((va - vb).norm() / vb.norm()).item())
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run a single config (name as printed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--smoke", action="store_true", help="one tiny ViT, in seconds (checks the script, not speed)")
    args = parser.parse_args()
    configs = SMOKE_CONFIGS if args.smoke else CONFIGS
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(
        f"{'model':<24} {'impulsevit s':>12} {'per-head s':>11} {'ratio':>7} {'qk: ours s':>11} {'qk: per-head s':>15}"
        f" {'qk ratio':>9} {'v/proj s':>9} {'max rel diff':>13}"
    )
    ratio = float("nan")
    ii.initialize(build(*configs[0]), "impulse", generator=args.seed)  # warm-up: threads, LAPACK
    for name, kw in configs:
        if args.only and name != args.only:
            continue
        ours, ref = build(name, kw), build(name, kw)
        ii.initialize(ours, "impulse", generator=args.seed)  # warm-up at this size
        seconds = statistics.median(ii.initialize(ours, "impulse", generator=args.seed).seconds for _ in range(3))
        t0 = time.perf_counter()
        ref_qk = per_head_impulse(ref, torch.Generator().manual_seed(args.seed))
        ref_s = time.perf_counter() - t0
        diff = check_same(ours, ref)
        assert diff < 1e-4, f"{name}: impulsevit and the per-head formulation differ (max rel diff {diff:.2e})"
        assert torch.equal(ours.pos_embed, ref.pos_embed), name
        ours_qk = impulsevit_qk_only(ours, torch.Generator().manual_seed(args.seed))
        vp = value_proj_only(ours, torch.Generator().manual_seed(args.seed))
        r = ref_s / seconds
        print(
            f"{name:<24} {seconds:>12.3f} {ref_s:>11.2f} {r:>7.1f} {ours_qk:>11.3f} {ref_qk:>15.2f}"
            f" {ref_qk / ours_qk:>9.1f} {vp:>9.3f} {diff:>13.1e}",
            flush=True,
        )
        if name == "vit_base_patch16_224" or args.only or args.smoke:
            ratio = r
    print(f"ratio: {ratio:.1f}")


if __name__ == "__main__":
    main()
