"""The scaling model on paper (``impulsevit/cluster/scaling.py``) for every GPU recipe in recipes/: what one GPU can
consume, the CPUs per task the loader needs for it, the gradient all-reduce per step, the IN-21K staging time, and
which resource bounds each recipe on A100 and H100 nodes. Nothing is measured here; the inputs are cited in
docs/benchmarks.md ("Scaling model") and can be changed on the command line.

    python benchmarks/scaling_model.py [--per-core 990] [--per-core-device 2505] [--a100-cores 128] [--h100-cores 112]
        [--in21k-tb 1.1] [--staging-gb-s 1.25 3 12.5] [--gpu-figure h100:vit_base_patch16_224=IMG_S ...] [--smoke]

Prints three tables (recipes, all-reduce by model and link, IN-21K staging) and, as the last line, ``ratio: X`` =
CPU cores per node that the worst recipe's GPUs need ÷ the cores an H100 node has (above 1: even every core of the
node cannot feed those GPUs at ``--per-core`` img/s per core, so that recipe is loader-bound).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from impulsevit.cluster import scaling
from impulsevit.data import get_dataset

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
GPUS = ("a100", "h100")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-core", type=float, default=scaling.LOADER_IMG_S_PER_CORE,
                   help="loader img/s per worker core at 224 px (benchmarks/loader_speed.py)")
    p.add_argument("--per-core-device", type=float, default=scaling.LOADER_IMG_S_PER_CORE_DEVICE_RESAMPLE,
                   help="the same with data.resample_on=device (the workers decode and copy; the GPU resamples)")
    p.add_argument("--a100-cores", type=int, default=scaling.NODE_CORES["a100"], help="CPU cores of an 8-A100 node")
    p.add_argument("--h100-cores", type=int, default=scaling.NODE_CORES["h100"], help="CPU cores of an 8-H100 node")
    p.add_argument("--in21k-tb", type=float, default=1.1, help="size of the IN-21K train .beton, TB")
    p.add_argument("--staging-gb-s", type=float, nargs="+", default=[1.25, 3.0, 12.5],
                   help="copy bandwidths per node for the staging table, GB/s")
    p.add_argument("--gpu-figure", action="append", default=[], metavar="GPU:MODEL=IMG_S",
                   help="a measured training img/s per GPU (e.g. from benchmarks/gpu_check.sh: "
                        "h100:vit_base_patch16_224=2950) replacing that GPU's cited figure; repeatable")
    p.add_argument("--smoke", action="store_true",
                   help="accepted for the suite's smoke run: this script measures nothing and already takes seconds")
    args = p.parse_args()
    args.anchors = {}
    for spec in args.gpu_figure:
        gpu, _, rest = spec.partition(":")
        model, _, rate = rest.partition("=")
        if gpu not in GPUS or model not in scaling.BACKBONE_TRUNK or not rate.replace(".", "", 1).isdigit():
            p.error(f"--gpu-figure {spec!r}: expected GPU:MODEL=IMG_S with GPU in {GPUS} and MODEL in "
                    f"{sorted(scaling.BACKBONE_TRUNK)}")
        args.anchors[gpu] = (model, float(rate))
    return args


def layouts() -> list[scaling.RecipeLayout]:
    out = [scaling.read_recipe_layout(p) for p in sorted(RECIPES.glob("*.yaml"))]
    return [x for x in out if x is not None]


def main() -> None:
    args = parse()
    cores = {"a100": args.a100_cores, "h100": args.h100_cores}
    print(f"Recipes (per GPU; loader at {args.per_core:,.0f} img/s per core; 2 CPUs per task for training; "
          f"nodes: A100 {cores['a100']} cores, H100 {cores['h100']} cores per 8 GPUs; gradients as the recipe's "
          "strategy: ddp_bf16 = bf16)")
    print("| recipe | model | GPUs | batch/GPU | GPU | img/s per GPU | CPUs per task needed | the same with "
          f"resample_on=device ({args.per_core_device:,.0f} img/s per core) | loader cores per GPU "
          "on the node | step: GPU ms | loader ms | all-reduce ms (link) | bound by |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = (0.0, "")
    in21k: scaling.RecipeLayout | None = None
    no_figure: list[str] = []
    for layout in layouts():
        classes = get_dataset(layout.dataset).num_classes if layout.dataset else 1000
        if layout.dataset == "imagenet21k":
            in21k = layout
        for gpu in GPUS:
            b = scaling.bound(layout, gpu, classes, node_cores=cores[gpu], per_core=args.per_core,
                              anchors=args.anchors)
            if b is None:
                no_figure += [] if layout.name in no_figure else [layout.name]
                continue
            print(f"| {layout.name} | {layout.backbone} | {layout.nodes}x{layout.gpus_per_node} | "
                  f"{layout.batch_per_gpu} | {gpu.upper()} | {b.gpu_img_s:,.0f} | {b.cpus_per_task} | "
                  f"{scaling.cpus_per_task_needed(b.gpu_img_s, args.per_core_device)} | "
                  f"{b.loader_img_s / args.per_core:.0f} | {b.compute_s * 1e3:.1f} | {b.loader_s * 1e3:.1f} | "
                  f"{b.allreduce_s * 1e3:.1f} ({b.link}) | {b.bound} |")
            need = b.cpus_per_task * layout.gpus_per_node / cores[gpu]
            if gpu == "h100" and need > worst[0]:
                worst = (need, layout.name)
    if no_figure:
        print(f"no public throughput figure (model or image size): {', '.join(no_figure)}")

    print("\nRing all-reduce of the gradients per step, ms (2(n-1)/n x bytes / link bandwidth; bf16 / fp32; "
          "1000-class heads, IN-21K head for ViT-B/21k)")
    links = list(scaling.LINK_GB_S)
    print("| model | params | GPUs | " + " | ".join(f"{k} ({scaling.LINK_GB_S[k]:g} GB/s)" for k in links) + " |")
    print("|---|---|---|" + "---|" * len(links))
    for backbone, classes in (("vit_tiny_patch16_224", 1000), ("vit_small_patch16_224", 1000),
                              ("vit_base_patch16_224", 1000), ("vit_base_patch16_224", 19_167)):
        params = scaling.num_params(backbone, classes)
        for n in (8, 16, 32):
            cells = [f"{scaling.ring_allreduce_seconds(params, n, scaling.LINK_GB_S[k], 2) * 1e3:.1f} / "
                     f"{scaling.ring_allreduce_seconds(params, n, scaling.LINK_GB_S[k], 4) * 1e3:.1f}" for k in links]
            print(f"| {backbone} ({classes} classes) | {params / 1e6:.1f} M | {n} | " + " | ".join(cells) + " |")

    size = args.in21k_tb * 1e12
    print(f"\nIN-21K staging: the {args.in21k_tb:g} TB train .beton copied to each node's local disk")
    print("| copy bandwidth per node | staging time |")
    print("|---|---|")
    for gb_s in args.staging_gb_s:
        print(f"| {gb_s:g} GB/s | {scaling.staging_seconds(size, gb_s) / 60:.0f} min |")
    if in21k is not None:
        classes, total = get_dataset("imagenet21k").releases["winter21_whole"]
        images = total - 50 * classes  # the registry holds out 50 images per class as the val split
        rates = {g: scaling.gpu_images_per_s(in21k.backbone, g, args.anchors) for g in GPUS}
        print(f"for comparison, one epoch of {in21k.name} ({images / 1e6:.1f} M images) on its {in21k.gpus} GPUs: "
              + ", ".join(f"{g.upper()} {images / (r * in21k.gpus) / 60:.0f} min" for g, r in rates.items() if r))
    print(f"\nworst recipe on H100 nodes: {worst[1]} needs {worst[0]:.2f}x the node's cores")
    print(f"ratio: {worst[0]:.3f}")


if __name__ == "__main__":
    main()
