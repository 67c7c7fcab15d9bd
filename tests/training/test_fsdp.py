"""FSDP2 (``fsdp2`` = ModelParallelStrategy + fully_shard) on 2 CPU processes with gloo, under ``bf16-mixed`` as the
GPU recipes run it (bf16 params via ``MixedPrecisionPolicy``, the init attention maps logged on the unsharded bf16
parameters): the init is computed on full tensors and each rank holds the right shard of it, training runs and its
losses track ``ddp_bf16`` on the same data, a resumed run restores instead of re-initializing."""

from __future__ import annotations

import pytest
import timm
import torch
from dist_worker import load, run_worker

import impulsevit.init as ii

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fsdp_out(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("fsdp")
    proc = run_worker(out, "--strategy", "fsdp2", "--phases",
                      "impulse,impulse:resume,impulse:propagated,impulse:calibration", "--log-attention",
                      "--precision", "bf16-mixed")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def ddp_bf16_out(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("ddp_bf16")
    proc = run_worker(out, "--strategy", "ddp_bf16", "--phases", "impulse", "--precision", "bf16-mixed")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def single_process_init(calibration: torch.Tensor | None = None, **options) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)  # a different constructor draw: the init must not depend on it
    m = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2,
                          weight_init="skip", num_classes=4)
    ii.initialize(m, "impulse", generator=0, calibration=calibration, **options)
    return {n: p.detach().to(torch.float64) for n, p in m.named_parameters()}


def test_shards_match_single_process_init(fsdp_out) -> None:
    ref = single_process_init()
    ranks = load(fsdp_out, "impulse")
    for rank, rec in enumerate(ranks):
        assert rec["initializer"]["applied"]
        for name, full in ref.items():
            local = rec["local"][name]
            assert "Shard(dim=0)" in local["placements"], (name, local["placements"])
            chunks = full.chunk(2, dim=0)
            want = chunks[rank] if rank < len(chunks) else full[:0]
            torch.testing.assert_close(local["tensor"].to(torch.float64), want, rtol=1e-5, atol=1e-6, msg=name)
        for name, full in rec["init_full"].items():  # the gathered model equals the single-process init
            torch.testing.assert_close(full, ref[name], rtol=1e-5, atol=1e-6, msg=name)
    # rank 1 really holds a different slice than rank 0
    assert not torch.equal(ranks[0]["local"]["blocks.0.attn.qkv.weight"]["tensor"],
                           ranks[1]["local"]["blocks.0.attn.qkv.weight"]["tensor"])


def test_propagated_pseudo_input_under_fsdp2_matches_single_process_init(fsdp_out) -> None:
    """``pseudo_input='propagated'`` runs its block forwards on the gathered full tensors (the sharded blocks' hooks
    are not called): the gathered model equals the single-process init, and it differs from the default."""
    ref, default = single_process_init(pseudo_input="propagated"), single_process_init()
    for rec in load(fsdp_out, "impulse:propagated"):
        assert rec["initializer"]["applied"]
        for name, full in rec["init_full"].items():
            torch.testing.assert_close(full, ref[name], rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.allclose(ref["blocks.1.attn.qkv.weight"], default["blocks.1.attn.qkv.weight"])


def test_calibration_under_fsdp2_matches_single_process_init_on_the_same_images(fsdp_out) -> None:
    """``pseudo_input='calibration'``: rank 0 reads 16 training images and broadcasts them, every rank solves on the
    gathered tensors: each rank's model equals the single-process init on the datamodule's first 16 images."""
    from impulsevit.data.loading.synthetic import SyntheticDataModule

    dm = SyntheticDataModule(num_classes=4, image_size=32, num_train=64, num_val=16, batch_size=8)
    dm.setup("fit")
    images = dm.calibration_images(16)
    ref = single_process_init(calibration=images, pseudo_input="calibration", calibration_images=16)
    for rec in load(fsdp_out, "impulse:calibration"):
        assert rec["initializer"]["applied"]
        for name, full in rec["init_full"].items():
            torch.testing.assert_close(full, ref[name], rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.allclose(ref["blocks.1.attn.qkv.weight"], single_process_init()["blocks.1.attn.qkv.weight"])


def test_training_runs(fsdp_out) -> None:
    r0, r1 = load(fsdp_out, "impulse")
    assert r0["global_step"] == 2 and r0["opt_ok"] and r1["opt_ok"]
    assert all(torch.isfinite(torch.tensor(r0["losses"] + r1["losses"])))
    for name in r0["final_full"]:
        assert torch.equal(r0["final_full"][name], r1["final_full"][name])
    assert not torch.equal(r0["final_full"]["head.weight"], r0["init_full"]["head.weight"])


def test_bf16_losses_track_ddp_bf16(fsdp_out, ddp_bf16_out) -> None:
    """Same init, data and steps: FSDP2 (bf16 params, fp32 reduce-scatter) and DDP (fp32 params under bf16 autocast,
    bf16 all-reduce) differ only in bf16 rounding, so every rank's losses agree to bf16 precision."""
    for fsdp, ddp in zip(load(fsdp_out, "impulse"), load(ddp_bf16_out, "impulse"), strict=True):
        assert len(fsdp["losses"]) == len(ddp["losses"]) == 2
        torch.testing.assert_close(torch.tensor(fsdp["losses"]), torch.tensor(ddp["losses"]), rtol=2e-2, atol=0)


def test_resume_restores_instead_of_reinit(fsdp_out) -> None:
    first, resumed = load(fsdp_out, "impulse"), load(fsdp_out, "impulse:resume")
    for r in (0, 1):
        assert resumed[r]["start_step"] == 2 and resumed[r]["global_step"] == 4
        assert "resumed from" in resumed[r]["initializer"]["skipped_reason"]
        for name, t in first[r]["final_full"].items():
            assert torch.equal(resumed[r]["init_full"][name], t), name


def test_ema_with_fsdp2_is_a_clear_error(tmp_path) -> None:
    proc = run_worker(tmp_path, "--strategy", "fsdp2", "--devices", "1", "--phases", "impulse", "--ema-decay", "0.99")
    assert proc.returncode != 0
    assert "model.ema_decay=0.99 is not supported" in proc.stderr
