"""A scaling model on paper: what bounds a GPU recipe — the GPUs, the CPU data loader, the gradient all-reduce — and
how long staging its data takes. Pure functions of published and measured numbers; no GPU needed.

Units: images per second (img/s), seconds (s), bytes, gigabytes per second (GB/s = 1e9 bytes/s). GPU figures are
training throughput (forward + backward + optimizer) per GPU at 224 px in 16-bit mixed precision, from public
benchmarks (:data:`GPU_SOURCES`; see docs/benchmarks.md, "Scaling model"). The loader figure is
``benchmarks/loader_speed.py``'s FFCV ``short256`` rate per worker core at 224 px on this project's machine
(:data:`LOADER_IMG_S_PER_CORE`); a GPU node's cores are usually faster, so the model errs towards asking for more.

Used by ``benchmarks/scaling_model.py`` (the table) and ``impulsevit submit`` (:func:`cpu_request_warning`: one line
when ``--cpus-per-task`` is below what the recipe's GPUs need). Not modelled: the all-reduce's overlap with the
backward pass (a step is taken to last as long as its slowest part — perfect overlap), GPU-side augmentation cost,
validation, and models or image sizes without a public figure (the 32 px ConvMixer recipes): those get ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOADER_IMG_S_PER_CORE = 990.0
"""img/s one FFCV worker core delivers for the ``short256`` preset at 224 px (random-resized crop + flip, uint8 batch):
``benchmarks/loader_speed.py`` on this project's 2-core machine, quiet: 1,972 img/s with 2 workers."""

LOADER_IMG_S_PER_CORE_DEVICE_RESAMPLE = 2505.0
"""img/s one FFCV worker core delivers with ``data.resample_on: device`` (the workers decode and copy the crop box;
the GPU resamples): :data:`LOADER_IMG_S_PER_CORE` × 2.53, the lowest of three ratios of the two modes' per-core
rates measured side by side in one ``benchmarks/loader_speed.py`` run each (2.53, 2.62, 3.35; docs/benchmarks.md).
The GPU's share of the work (the resample) is not in this figure."""

TRAINING_PROCESS_CPUS = 2
"""CPUs per task beside the loader workers: the training thread and Lightning's own (as ``impulsevit submit``)."""

# Parameters without the classifier head (timm ``num_classes=0``) and the head's input width: params = trunk +
# (features + 1) x classes.
BACKBONE_TRUNK: dict[str, tuple[int, int]] = {
    "vit_tiny_patch16_224": (5_524_416, 192),
    "vit_small_patch16_224": (21_665_664, 384),
    "vit_base_patch16_224": (85_798_656, 768),
    "mixer_s16_224": (18_015_264, 512),
    "swin_tiny_patch4_window7_224": (27_519_354, 768),
}

# timm's training benchmark, one GPU (RTX 3090, AMP, 224 px): the models' speeds relative to each other
_TIMM_RTX3090_TRAIN_IMG_S = {
    "vit_tiny_patch16_224": 2293.54, "vit_small_patch16_224": 1052.92, "vit_base_patch16_224": 390.86,
    "mixer_s16_224": 1543.23, "swin_tiny_patch4_window7_224": 646.76,
}
# One measured training figure per GPU (model, img/s per GPU, 224 px, 16-bit mixed precision)
_ANCHORS = {"a100": ("vit_base_patch16_224", 1030.0), "h100": ("vit_small_patch16_224", 7716.0)}

GPU_SOURCES: dict[str, str] = {
    "a100": "ViT-B/16 on A100 SXM4 80GB: 1,030 img/s per GPU (fp16, DDP, synthetic data), "
            "https://willgpaik-github-io.pages.dev/portfolio/pytorch-ddp-bench/",
    "h100": "ViT-S-size (ViT-5-Small, 22 M params, 224 px, batch 256) on H100 SXM: 7,716 img/s per GPU (bf16, "
            "torch.compile), https://nvidia-bionemo.github.io/nvSubquadratic/benchmarks.html",
    "ratios": "other models scaled by timm's relative training speeds (RTX 3090, AMP, 224 px), "
              "https://github.com/huggingface/pytorch-image-models/blob/main/results/"
              "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv",
}

NODE_CORES: dict[str, int] = {"a100": 128, "h100": 112}
"""CPU cores of an 8-GPU node: A100 (2 x 64-core EPYC, as MLPerf's Inspur NF5488A5), H100 (2 x 56-core Xeon
Platinum 8480C, the DGX H100 / H200 class); sources in docs/benchmarks.md."""

LINK_GB_S: dict[str, float] = {"nvlink-a100": 300.0, "nvlink-h100": 450.0, "pcie4": 32.0, "ib-hdr": 25.0,
                               "ib-ndr": 50.0}
"""Per-GPU bandwidth, one direction, GB/s: NVLink 3 (A100: 600 GB/s both ways) and 4 (H100: 900), PCIe 4.0 x16,
InfiniBand HDR (200 Gb/s) and NDR (400 Gb/s) with one adapter per GPU. NVLink and PCIe connect GPUs of one node."""


def gpu_images_per_s(backbone: str, gpu: str, anchors: dict[str, tuple[str, float]] | None = None) -> float | None:
    """Training img/s of one ``gpu`` (``"a100"``, ``"h100"``) for ``backbone`` at 224 px in 16-bit mixed precision:
    the GPU's measured anchor figure scaled by timm's relative speed of the two models; ``None`` for a model or GPU
    without a figure. ``anchors`` (``{gpu: (backbone, img/s)}``, e.g. from ``benchmarks/gpu_check.sh``) replaces the
    cited figures of the GPUs it names."""
    table = {**_ANCHORS, **(anchors or {})}
    if gpu not in table or backbone not in _TIMM_RTX3090_TRAIN_IMG_S or table[gpu][0] not in _TIMM_RTX3090_TRAIN_IMG_S:
        return None
    anchor, rate = table[gpu]
    return rate * _TIMM_RTX3090_TRAIN_IMG_S[backbone] / _TIMM_RTX3090_TRAIN_IMG_S[anchor]


def loader_cores(images_per_s: float, per_core: float = LOADER_IMG_S_PER_CORE) -> float:
    """Loader worker cores that deliver ``images_per_s`` at ``per_core`` img/s each (fractional)."""
    if per_core <= 0:
        raise ValueError(f"per_core must be > 0 img/s, got {per_core}")
    return images_per_s / per_core


def cpus_per_task_needed(gpu_images_per_s: float, per_core: float = LOADER_IMG_S_PER_CORE) -> int:
    """CPUs one task (one GPU) needs to keep its GPU fed: whole loader cores + :data:`TRAINING_PROCESS_CPUS`."""
    return math.ceil(loader_cores(gpu_images_per_s, per_core) - 1e-9) + TRAINING_PROCESS_CPUS


def ring_allreduce_seconds(num_params: int, num_gpus: int, link_gb_s: float, bytes_per_value: int = 2) -> float:
    """Bandwidth term of a ring all-reduce of ``num_params`` gradients over ``num_gpus`` GPUs:
    2 (n - 1) / n x bytes / bandwidth (latency ignored). ``bytes_per_value``: 2 for bf16 gradients (``ddp_bf16``),
    4 for fp32 (``ddp``). 0 for one GPU."""
    if num_gpus < 1 or link_gb_s <= 0:
        raise ValueError(f"need num_gpus >= 1 and link_gb_s > 0, got {num_gpus}, {link_gb_s}")
    return 2 * (num_gpus - 1) / num_gpus * num_params * bytes_per_value / (link_gb_s * 1e9)


def staging_seconds(size_bytes: float, gb_s: float) -> float:
    """Seconds to copy ``size_bytes`` at ``gb_s`` GB/s (the slower of the source's read and the target's write)."""
    if gb_s <= 0:
        raise ValueError(f"bandwidth must be > 0 GB/s, got {gb_s}")
    return size_bytes / (gb_s * 1e9)


def stream_network_gb_s(images_per_s: float, bytes_per_image: float, *, cache_fraction: float = 1.0,
                        chunk_bytes: float = 64e6) -> tuple[float, float]:
    """Object-store traffic of one GPU reading a LitData shard set (the litdata backend) at ``images_per_s``:
    ``(first epoch, every later epoch)`` in GB/s.

    The first epoch (an empty cache) fetches every chunk once per node: ``images_per_s × bytes_per_image`` per GPU
    (the set's bytes spread over the epoch; ``bytes_per_image`` = the manifest's ``bytes / num_samples``). Later epochs
    read the cache; the order is a global shuffle (exact resume, the other backends' batches), so a sample whose chunk
    was evicted costs a whole chunk: with a cache holding ``cache_fraction`` < 1 of the set, about
    ``(1 − cache_fraction) × images_per_s × chunk_bytes`` — hundreds of times the first figure. Hence the rule the
    global order needs a cache at least the size of the set (``data.storage.cache_size``) on each node; the block
    order (opt-in on the litdata backend) does not (:func:`block_streaming`). Not modelled: the
    node's ranks sharing one cache (all ranks of a node read the same chunks, so the first epoch's traffic per node
    is the set's bytes once, not once per GPU — the per-GPU figure is an upper bound), LitData's read-ahead."""
    if images_per_s < 0 or bytes_per_image <= 0 or not 0 <= cache_fraction:
        raise ValueError(f"need images_per_s >= 0, bytes_per_image > 0, cache_fraction >= 0; got {images_per_s}, "
                         f"{bytes_per_image}, {cache_fraction}")
    first = images_per_s * bytes_per_image / 1e9
    later = max(0.0, 1.0 - cache_fraction) * images_per_s * chunk_bytes / 1e9
    return first, later


@dataclass(frozen=True)
class BlockStreaming:
    """What one node of a run on the block order (``data.order=block``, the litdata backend) asks of the store and
    its disk per epoch (:func:`block_streaming`). Bytes are decimal (GB = 1e9 B)."""

    node_img_s: float  # images/s the node's GPUs consume
    bytes_per_node_epoch: float  # downloaded per node per epoch: its ranks' shares, each chunk once
    cache_bytes_per_node: float  # the live blocks of the node's ranks
    cache_fraction: float  # cache_bytes_per_node / the set's bytes
    node_gb_s: float  # network per node while training at node_img_s
    store_gets_per_s: float  # chunk GETs per second at the store, the whole run


def block_streaming(num_samples: int, set_bytes: float, *, nodes: int, gpus_per_node: int, gpu_img_s: float,
                    block_size: int = 65536, chunk_bytes: float = 64e6, live_blocks: int = 3) -> BlockStreaming:
    """The block order at scale, on paper: each rank reads ``ceil(num_samples / ranks)`` samples in blocks of
    ``block_size`` (``min(block_size, share)`` when a share is smaller), keeping ``live_blocks`` blocks on disk
    (previous, current, next: :class:`~impulsevit.data.loading.litdata_backend.ShardSource`), and fetches each
    chunk of its share once per epoch (plus at most one chunk shared with a neighbour rank, not counted). Assumes
    samples of equal size (``set_bytes / num_samples``) and every rank at ``gpu_img_s``."""
    if min(num_samples, set_bytes, nodes, gpus_per_node, block_size, chunk_bytes, live_blocks) <= 0 or gpu_img_s < 0:
        raise ValueError("need positive sizes, counts and block; gpu_img_s >= 0")
    ranks = nodes * gpus_per_node
    per_image = set_bytes / num_samples
    share = math.ceil(num_samples / ranks)
    cache = gpus_per_node * live_blocks * min(block_size, share) * per_image
    node_img_s = gpus_per_node * gpu_img_s
    return BlockStreaming(node_img_s=node_img_s, bytes_per_node_epoch=gpus_per_node * share * per_image,
                          cache_bytes_per_node=cache, cache_fraction=cache / set_bytes,
                          node_gb_s=node_img_s * per_image / 1e9,
                          store_gets_per_s=nodes * node_img_s * per_image / chunk_bytes)


def num_params(backbone: str, num_classes: int) -> int | None:
    """Parameters of ``backbone`` with a ``num_classes`` head; ``None`` for a backbone not in :data:`BACKBONE_TRUNK`."""
    if backbone not in BACKBONE_TRUNK:
        return None
    trunk, features = BACKBONE_TRUNK[backbone]
    return trunk + (features + 1) * num_classes


@dataclass(frozen=True)
class RecipeLayout:
    """What the model needs from a GPU recipe: its backbone, image size, GPUs and per-GPU batch."""

    name: str
    backbone: str
    image_size: int
    nodes: int
    gpus_per_node: int
    batch_per_gpu: int
    dataset: str | None
    grad_bytes: int  # 2: bf16 gradient all-reduce (ddp_bf16); 4: fp32 (ddp, fsdp2's reduce-scatter)
    resample_on: str = "workers"  # data.resample_on: where the crop's resample runs ("workers" | "device")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def loader_per_core(self) -> float:
        """img/s per loader worker core for this recipe's ``resample_on``."""
        return LOADER_IMG_S_PER_CORE_DEVICE_RESAMPLE if self.resample_on == "device" else LOADER_IMG_S_PER_CORE


def _whole(value: Any) -> int | None:
    """``value`` as a positive int (``8``, ``"8"``), else ``None`` (``"auto"``, a device list, nothing)."""
    text = str(value).strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _grad_bytes(strategy: Any) -> int:
    """Bytes per gradient value in the reduction: 2 for ``ddp_bf16`` (bf16 all-reduce); 4 otherwise (``ddp``, and
    ``fsdp2``, whose reduce-scatter runs in fp32 and moves the same bytes as an all-reduce with its all-gather)."""
    return 2 if str(strategy) == "ddp_bf16" else 4


def recipe_layout(name: str, config: dict[str, Any]) -> RecipeLayout | None:
    """The :class:`RecipeLayout` of a parsed recipe ``config`` (the YAML mapping); ``None`` for a CPU recipe, or when
    the GPU count or per-GPU batch is not a plain number (``devices: auto``)."""
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    if trainer.get("accelerator") not in ("gpu", "cuda"):
        return None
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    args = data.get("init_args", data)
    args = args if isinstance(args, dict) else {}
    nodes, devices = _whole(trainer.get("num_nodes", 1)), _whole(trainer.get("devices", 1))
    batch, size = _whole(args.get("batch_size")), _whole(args.get("image_size", 224))
    if None in (nodes, devices, batch, size):
        return None
    return RecipeLayout(name=name, backbone=str(model.get("backbone", "")), image_size=size, nodes=nodes,
                        gpus_per_node=devices, batch_per_gpu=batch, dataset=args.get("dataset"),
                        grad_bytes=_grad_bytes(trainer.get("strategy", "ddp")),
                        resample_on=str(args.get("resample_on") or "workers"))


def read_recipe_layout(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> RecipeLayout | None:
    """:func:`recipe_layout` of the recipe file ``path`` after the fit ``overrides`` that change the model's speed
    (``--model.backbone=``, ``--data.init_args.image_size=`` / ``batch_size=`` / ``resample_on=``,
    ``--trainer.strategy=``); ``None`` for
    a CPU recipe or an unreadable file."""
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):
        return None
    layout = recipe_layout(Path(path).stem, config)
    if layout is None:
        return None
    changes: dict[str, Any] = {}
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "--model.backbone" and value:
            changes["backbone"] = value
        elif key in ("--data.init_args.image_size", "--data.image_size") and value.strip().isdigit():
            changes["image_size"] = int(value)
        elif key in ("--data.init_args.batch_size", "--data.batch_size") and value.strip().isdigit():
            changes["batch_per_gpu"] = int(value)
        elif key == "--trainer.strategy" and value:
            changes["grad_bytes"] = _grad_bytes(value)
        elif key in ("--data.init_args.resample_on", "--data.resample_on") and value:
            changes["resample_on"] = value
    return RecipeLayout(**{**layout.__dict__, **changes})


@dataclass(frozen=True)
class Bound:
    """One recipe on one GPU type: per-step times of each resource and which one bounds the step."""

    gpu_img_s: float  # what one GPU can consume
    cpus_per_task: int  # CPUs per task (GPU) to feed it: loader cores + the training process
    loader_img_s: float  # what the node's cores can deliver per GPU
    compute_s: float  # per step: batch / GPU rate
    loader_s: float  # per step: batch / loader rate
    allreduce_s: float  # per step, at ``link``
    link: str
    bound: str  # "GPU", "loader" or "all-reduce"

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.loader_s, self.allreduce_s)


def recipe_link(layout: RecipeLayout, gpu: str) -> str:
    """The link a recipe's all-reduce runs over on a DGX-style node: NVLink within one node, one InfiniBand adapter
    per GPU (HDR with A100, NDR with H100) across nodes."""
    if layout.nodes > 1:
        return "ib-ndr" if gpu == "h100" else "ib-hdr"
    return f"nvlink-{gpu}"


def bound(layout: RecipeLayout, gpu: str, num_classes: int, node_cores: int | None = None,
          per_core: float | None = None, link: str | None = None,
          anchors: dict[str, tuple[str, float]] | None = None) -> Bound | None:
    """Which resource bounds ``layout`` on ``gpu`` nodes with ``node_cores`` cores (default :data:`NODE_CORES`),
    loader workers at ``per_core`` img/s (default: the recipe's :attr:`RecipeLayout.loader_per_core`), the gradient
    all-reduce over ``link`` (default :func:`recipe_link`), GPU
    figures from :func:`gpu_images_per_s` (``anchors``); ``None`` when the model, the GPU or the image size (only
    224 px) has no figure."""
    rate = gpu_images_per_s(layout.backbone, gpu, anchors)
    params = num_params(layout.backbone, num_classes)
    if rate is None or params is None or layout.image_size != 224 or layout.batch_per_gpu <= 0:
        return None
    cores = NODE_CORES[gpu] if node_cores is None else node_cores
    per_core = layout.loader_per_core if per_core is None else per_core
    link = link or recipe_link(layout, gpu)
    free = max(cores - TRAINING_PROCESS_CPUS * layout.gpus_per_node, 0) / layout.gpus_per_node
    loader_rate = free * per_core
    compute_s = layout.batch_per_gpu / rate
    loader_s = layout.batch_per_gpu / loader_rate if loader_rate > 0 else math.inf
    allreduce_s = ring_allreduce_seconds(params, layout.gpus, LINK_GB_S[link], layout.grad_bytes)
    times = {"GPU": compute_s, "loader": loader_s, "all-reduce": allreduce_s}
    return Bound(gpu_img_s=rate, cpus_per_task=cpus_per_task_needed(rate, per_core), loader_img_s=loader_rate,
                 compute_s=compute_s, loader_s=loader_s, allreduce_s=allreduce_s, link=link,
                 bound=max(times, key=times.__getitem__))


def gpu_from_constraint(constraint: str | None) -> str:
    """The GPU type a SLURM ``--constraint`` names (``h100`` / ``a100``, case-insensitive); ``"a100"`` otherwise —
    the slower of the two, so a warning based on it holds for either."""
    return "h100" if constraint and "h100" in constraint.lower() else "a100"


def cpu_request_warning(layout: RecipeLayout, gpu: str, cpus_per_task: int,
                        per_core: float | None = None) -> str | None:
    """One line when ``cpus_per_task`` is below what one of ``layout``'s GPUs needs to be fed at full speed (``None``
    when it is enough, or the model / image size has no figure). ``per_core``: loader img/s per core, default the
    recipe's :attr:`RecipeLayout.loader_per_core` (its ``resample_on``)."""
    per_core = layout.loader_per_core if per_core is None else per_core
    rate = gpu_images_per_s(layout.backbone, gpu)
    if rate is None or layout.image_size != 224:
        return None
    need = cpus_per_task_needed(rate, per_core)
    if cpus_per_task >= need:
        return None
    return (f"recipe {layout.name} needs {need} CPUs per task to feed one {gpu.upper()} ({rate:,.0f} img/s of "
            f"{layout.backbone} at {per_core:,.0f} img/s per loader core, + {TRAINING_PROCESS_CPUS} for training); "
            f"--cpus-per-task is {cpus_per_task}, so the GPUs will wait for data (docs/benchmarks.md, scaling model"
            + ("" if layout.resample_on == "device" else "; data.resample_on=device needs fewer") + ")")
