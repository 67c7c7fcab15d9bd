"""The scaling model on paper (impulsevit/cluster/scaling.py) on hand-computed cases, and `impulsevit submit`'s warning
when a GPU job asks for fewer CPUs per task than the recipe's GPUs consume."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from impulsevit.cli.submit import build, cpu_warning, main
from impulsevit.cluster import scaling

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_ring_allreduce_by_hand():
    # 8 GPUs: 2 * 7/8 = 1.75 x bytes; 100 M bf16 gradients = 200 MB; at 25 GB/s: 1.75 * 0.2 / 25 = 14 ms
    assert scaling.ring_allreduce_seconds(100_000_000, 8, 25.0, 2) == pytest.approx(0.014)
    assert scaling.ring_allreduce_seconds(100_000_000, 8, 25.0, 4) == pytest.approx(0.028)  # fp32: twice the bytes
    assert scaling.ring_allreduce_seconds(100_000_000, 2, 50.0, 2) == pytest.approx(0.004)  # 2 * 1/2 * 0.2 GB / 50
    assert scaling.ring_allreduce_seconds(10**9, 1, 1.0) == 0.0
    with pytest.raises(ValueError, match="num_gpus"):
        scaling.ring_allreduce_seconds(1, 0, 1.0)


def test_staging_loader_cores_and_cpus_by_hand():
    assert scaling.staging_seconds(1.1e12, 2.0) == pytest.approx(550.0)  # 1.1 TB at 2 GB/s
    assert scaling.loader_cores(4950.0, 990.0) == pytest.approx(5.0)
    assert scaling.cpus_per_task_needed(4950.0, 990.0) == 5 + 2  # exactly 5 cores: no sixth
    assert scaling.cpus_per_task_needed(4951.0, 990.0) == 6 + 2
    with pytest.raises(ValueError, match="per_core"):
        scaling.loader_cores(1.0, 0.0)


def test_params_and_gpu_figures():
    # ViT-B/16 with a 1000-class head: timm's 86,567,656 parameters
    assert scaling.num_params("vit_base_patch16_224", 1000) == 86_567_656
    assert scaling.num_params("convmixer_cifar", 10) is None
    # each GPU's anchor is the published figure itself; the others scale by timm's relative speeds
    assert scaling.gpu_images_per_s("vit_base_patch16_224", "a100") == pytest.approx(1030.0)
    assert scaling.gpu_images_per_s("vit_small_patch16_224", "h100") == pytest.approx(7716.0)
    assert scaling.gpu_images_per_s("vit_tiny_patch16_224", "a100") == pytest.approx(1030.0 * 2293.54 / 390.86)
    assert scaling.gpu_images_per_s("vit_tiny_patch16_224", "v100") is None
    # a measured figure (gpu_check.sh) replaces the cited one of its GPU only
    measured = {"h100": ("vit_base_patch16_224", 2000.0)}
    assert scaling.gpu_images_per_s("vit_tiny_patch16_224", "h100", measured) == pytest.approx(2000 * 2293.54 / 390.86)
    assert scaling.gpu_images_per_s("vit_base_patch16_224", "a100", measured) == pytest.approx(1030.0)


def test_bound_of_a_layout_by_hand():
    layout = scaling.RecipeLayout(name="r", backbone="vit_base_patch16_224", image_size=224, nodes=2, gpus_per_node=8,
                                  batch_per_gpu=103, dataset="imagenet", grad_bytes=2)
    # A100: 1030 img/s -> 0.1 s per 103-image step; loader: (128 - 16) / 8 = 14 cores x 990 img/s
    b = scaling.bound(layout, "a100", 1000)
    assert b.compute_s == pytest.approx(0.1) and b.loader_img_s == pytest.approx(14 * 990)
    assert b.link == "ib-hdr" and b.allreduce_s == pytest.approx(2 * 15 / 16 * 86_567_656 * 2 / 25e9)
    assert b.bound == "GPU" and b.step_s == pytest.approx(0.1) and b.cpus_per_task == math.ceil(1030 / 990) + 2
    # 2 cores per node left for loading: the loader bounds it
    starved = scaling.bound(layout, "a100", 1000, node_cores=18)
    assert starved.bound == "loader" and starved.loader_img_s == pytest.approx(990 / 4)
    # fp32 gradients over PCIe on one node of 8: 2 * 7/8 * 346 MB / 32 GB/s = 18.9 ms; still below the step
    one_node = scaling.RecipeLayout(**{**layout.__dict__, "nodes": 1, "grad_bytes": 4})
    assert scaling.bound(one_node, "a100", 1000, link="pcie4").allreduce_s == pytest.approx(
        1.75 * 86_567_656 * 4 / 32e9)
    assert scaling.bound(scaling.RecipeLayout(**{**layout.__dict__, "image_size": 32}), "a100", 1000) is None


def test_recipe_layouts_read_from_the_recipes():
    layout = scaling.read_recipe_layout(RECIPES / "deit_base_in1k.yaml")
    assert (layout.backbone, layout.nodes, layout.gpus_per_node, layout.batch_per_gpu, layout.grad_bytes) == (
        "vit_base_patch16_224", 2, 8, 64, 2)
    changed = scaling.read_recipe_layout(RECIPES / "deit_base_in1k.yaml",
                                         ["--model.backbone=vit_tiny_patch16_224", "--data.init_args.batch_size=32"])
    assert changed.backbone == "vit_tiny_patch16_224" and changed.batch_per_gpu == 32
    assert changed.grad_bytes == 2 and scaling.read_recipe_layout(
        RECIPES / "deit_base_in1k.yaml", ["--trainer.strategy=fsdp2"]).grad_bytes == 4  # fsdp2 reduces in fp32
    assert scaling.read_recipe_layout(RECIPES / "tiny_synthetic.yaml") is None  # a CPU recipe


def test_a_recipe_without_plain_gpu_counts_has_no_layout_and_no_warning(tmp_path):
    recipe = tmp_path / "auto.yaml"
    recipe.write_text((RECIPES / "deit_tiny_in1k.yaml").read_text().replace("devices: 8", "devices: auto"))
    assert scaling.read_recipe_layout(recipe) is None
    assert _warning(tmp_path, "--recipe", str(recipe), "--constraint", "h100", "--cpus-per-task", "1") is None


def test_gpu_from_constraint():
    assert scaling.gpu_from_constraint("h100&ib") == "h100"
    assert scaling.gpu_from_constraint("A100") == "a100" and scaling.gpu_from_constraint(None) == "a100"


def _argv(tmp_path: Path, *args: str) -> list[str]:
    return ["--recipe", "deit_tiny_in1k", "--nodes", "1", "--gpus-per-node", "8", "--runs-dir", str(tmp_path),
            "--slurm-config", str(tmp_path / "none.yaml"), "--dry-run", *args]


def _warning(tmp_path: Path, *args: str) -> str | None:
    """The warning `impulsevit submit` prints for these arguments (without parsing the fit configuration)."""
    job, opts, _ = build(_argv(tmp_path, *args))
    return cpu_warning(job, opts)


def test_submit_warns_when_cpus_per_task_are_below_the_recipes_need(tmp_path, capsys):
    need = scaling.cpus_per_task_needed(scaling.gpu_images_per_s("vit_tiny_patch16_224", "h100"))
    assert main(_argv(tmp_path, "--constraint", "h100", "--cpus-per-task", str(need - 1))) == 0  # warned, not refused
    out = capsys.readouterr()
    (line,) = [ln for ln in out.err.splitlines() if "CPUs per task" in ln]
    assert line.startswith("impulsevit submit: warning: recipe deit_tiny_in1k needs ") and f" {need} CPUs" in line
    assert f"--cpus-per-task is {need - 1}" in line and "H100" in line
    assert f"#SBATCH --cpus-per-task={need - 1}" in out.out  # the script is still printed with the request
    # enough CPUs: no warning
    assert _warning(tmp_path, "--constraint", "h100", "--cpus-per-task", str(need)) is None
    # the recipe's own default (10 workers + 2) is enough for an A100, not for an H100
    assert _warning(tmp_path) is None
    assert "--cpus-per-task is 12," in _warning(tmp_path, "--constraint", "h100")
    # the site's default counts as the request
    (tmp_path / "site.yaml").write_text("cpus-per-task: 4\n")
    assert "--cpus-per-task is 4," in _warning(tmp_path, "--slurm-config", str(tmp_path / "site.yaml"))
    # a CPU job, and a model without a figure (ConvMixer at 32 px), get none
    assert _warning(tmp_path, "--gpus-per-node", "0", "--cpus-per-task", "1") is None
    assert _warning(tmp_path, "--recipe", "convmixer_256_8_k3_impulse", "--cpus-per-task", "1") is None


def test_resample_on_device_lowers_the_cpus_a_recipe_needs(tmp_path):
    """With ``data.resample_on=device`` the workers only decode and copy, so one core feeds more images: the model
    uses that rate for the recipe (read from the file or an override) and the warning stops suggesting the switch."""
    rate = scaling.gpu_images_per_s("vit_tiny_patch16_224", "h100")
    need = scaling.cpus_per_task_needed(rate)
    need_device = scaling.cpus_per_task_needed(rate, scaling.LOADER_IMG_S_PER_CORE_DEVICE_RESAMPLE)
    assert need_device < need == 19 and need_device == math.ceil(rate / 2505.0) + 2
    layout = scaling.read_recipe_layout(RECIPES / "deit_tiny_in1k.yaml", ["--data.init_args.resample_on=device"])
    assert layout.resample_on == "device" and layout.loader_per_core == 2505.0
    assert scaling.bound(layout, "h100", 1000).cpus_per_task == need_device
    assert scaling.bound(scaling.read_recipe_layout(RECIPES / "deit_tiny_in1k.yaml"), "h100", 1000).bound == "loader"
    assert scaling.bound(layout, "h100", 1000).bound == "GPU"  # 12 cores per GPU now feed it
    # the same through the file: a recipe that sets it
    recipe = tmp_path / "tiny_device.yaml"
    text = (RECIPES / "deit_tiny_in1k.yaml").read_text()
    recipe.write_text(text.replace("    dataset: imagenet\n", "    dataset: imagenet\n    resample_on: device\n", 1))
    assert scaling.read_recipe_layout(recipe).resample_on == "device"
    warned = scaling.cpu_request_warning(scaling.read_recipe_layout(RECIPES / "deit_tiny_in1k.yaml"), "h100", 12)
    assert warned and "data.resample_on=device needs fewer" in warned
    assert scaling.cpu_request_warning(layout, "h100", 12) is None  # 12 >= need_device


def test_stream_network_needs_the_first_epoch_bytes_and_whole_chunks_once_the_cache_is_short():
    from impulsevit.cluster.scaling import stream_network_gb_s

    assert stream_network_gb_s(1000, 100e3) == (0.1, 0.0)  # 1000 img/s x 100 kB; a cache holding the set: no network
    first, later = stream_network_gb_s(1000, 100e3, cache_fraction=0.5, chunk_bytes=64e6)
    assert first == 0.1 and later == 0.5 * 1000 * 64e6 / 1e9  # each miss costs a whole chunk
    with pytest.raises(ValueError):
        stream_network_gb_s(1000, 0)


def test_block_streaming_fetches_a_nodes_share_once_with_a_cache_of_its_live_blocks():
    from impulsevit.cluster.scaling import block_streaming

    s = block_streaming(1_000_000, 1e11, nodes=4, gpus_per_node=2, gpu_img_s=500, block_size=10_000,
                        chunk_bytes=1e7)
    assert s.bytes_per_node_epoch == 2 * 125_000 * 1e5  # a quarter of the set per node
    assert s.cache_bytes_per_node == 2 * 3 * 10_000 * 1e5 and s.cache_fraction == 0.06
    assert s.node_img_s == 1000 and s.node_gb_s == 0.1 and s.store_gets_per_s == 40  # 4 nodes x 0.1 GB/s / 10 MB
    small = block_streaming(1_000_000, 1e11, nodes=4, gpus_per_node=2, gpu_img_s=500, block_size=10**9)
    assert small.cache_bytes_per_node == 3 * small.bytes_per_node_epoch  # a block never exceeds a rank's share
    with pytest.raises(ValueError, match="positive"):
        block_streaming(0, 1e11, nodes=1, gpus_per_node=1, gpu_img_s=1)
