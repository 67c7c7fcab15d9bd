"""The one table of the documented commands and Python snippets: how each is tested, or why it is not run here.

Read by ``tests/house/test_documented_commands.py`` (the rule of what counts as a documented command is
``tests/_doc_commands.py``'s docstring). Every command the docs show is a key of :data:`COMMANDS` and every snippet
a key of :data:`SNIPPETS`; a key the docs no longer show fails the test too (stale). Forms:

- ``run(*extra)``: the command as written, ``*extra`` appended (the small form: a few batches, the torchvision
  backend, a CPU), run through the real entry point in one shared workspace in this table's order; so a command that
  needs a trained run comes after the one that makes it (``runs/quickstart``, ``runs/pre``). ``[...]`` parts of a
  command are optional and left out; ``$PWD`` is the workspace. It must exit 0.
- ``dry(*extra)``: the command with ``--dry-run`` (and ``*extra``) appended: a study or SLURM submission plans and
  prints, and must exit 0 having started nothing.
- ``synopsis()``: a form with placeholders (``R``, ``CKPT``, ``…``) or an inline fragment (``impulsevit study
  --then``): its subcommand must exist and every option it names must be in that subcommand's ``--help``.
- ``skip(reason)``: not run; ``reason`` is one of :data:`REASONS`, and the test checks it applies (a GPU recipe or
  launch, an ``s3://`` / hub address, a dataset nobody can download).
- ``xfail(issue, form)``: the form, expected to fail until ``issue`` is fixed (strict: the lead drops it after the fix).

A new command in the docs, or a changed one, needs a row here; run it in its small form where a CPU can.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONS = {
    "gpu": "needs GPUs (a GPU recipe, several devices or nodes)",
    "network": "needs the network (an object store or the Hugging Face Hub)",
    "data": "needs a dataset that is not public (ImageNet): nothing to download, nothing small in its format here",
}


@dataclass(frozen=True)
class Form:
    kind: str  # run | dry | synopsis | skip
    extra: tuple[str, ...] = ()
    reason: str = ""
    xfail: str = ""


def run(*extra: str) -> Form:
    return Form("run", extra)


def dry(*extra: str) -> Form:
    return Form("dry", extra)


def synopsis() -> Form:
    return Form("synopsis")


def skip(reason: str) -> Form:
    return Form("skip", reason=reason)


def xfail(issue: str, form: Form) -> Form:
    return Form(form.kind, form.extra, form.reason, issue)


# the small form of a training run: one epoch of two batches of 16, two validation / test batches, no worker
# processes, the loader every install has
SMALL = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
         "--trainer.limit_test_batches=2", "--trainer.num_sanity_val_steps=0", "--data.init_args.backend=torchvision",
         "--data.init_args.batch_size=16", "--data.init_args.num_workers=0", "--trainer.enable_progress_bar=false")
# a paper recipe (8 GPUs) on the CPU: one device, fp32, small batches of the tiny CIFAR-10 the test serves
ON_CPU = ("--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.precision=32-true",
          "--data.init_args.batch_size=4", "--data.init_args.num_workers=0", "--data.init_args.verify=warn")
TINY_DATA = ("--data.init_args.backend=torchvision", "--data.init_args.verify=warn", "--data.init_args.batch_size=4")

COMMANDS: dict[str, Form] = {
    # the shared trained runs first: runs/quickstart and runs/pre
    "impulsevit fit --recipe quickstart": run(*SMALL),
    "impulsevit fit --recipe quickstart --resume auto": run(*SMALL, "--trainer.max_epochs=2"),
    "impulsevit test --recipe quickstart --resume auto": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_vit --name pre": run(*SMALL),
    "impulsevit fit --recipe cpu_digits_finetune --model.pretrained=runs/pre/checkpoints/last.ckpt": run(*SMALL),
    "impulsevit probe runs/pre/checkpoints/last.ckpt --recipe cpu_digits_finetune": run(  # features of 256 + 128
        "--data.init_args.backend=torchvision", "--data.init_args.train_subset=256", "--data.init_args.val_subset=128"),
    "impulsevit export runs/quickstart/checkpoints/last.ckpt vit/ [--ema]": run(),
    "impulsevit export runs/quickstart vit-latest/": run(),  # a run folder: the checkpoint --resume auto picks
    "impulsevit predict vit/ my_images/ --out predictions.csv": run(),
    "impulsevit runs [runs/] [--status failed,preempted] [--recipe R] [--json]": run(),
    "impulsevit recipes": run(),
    "impulsevit --help": run(),
    "impulsevit fit --help": run(),
    "impulsevit demo": run(),
    "python -m impulsevit.init.demo": run(),
    "impulsevit init list": run(),
    "impulsevit init list --plugins my_inits.scaled": run(),  # the module is impulsevit/init/README.md's snippet
    # one run of each CPU recipe's header command
    "impulsevit fit --recipe cpu_fmnist_vit --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_vit_smallimg --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_digits_vit --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_convmixer --model.init.method=box": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_dinov3 --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_eva02 --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_mixer --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_rope_vit --model.init.method=torch": run(*SMALL),
    "impulsevit fit --recipe cpu_fmnist_swin --model.init.method=torch": run(*SMALL),
    # a paper row from nothing: CIFAR-10 from a loopback server (a small copy in the release's format), preview, fit
    "impulsevit download cifar10 data/cifar10": run("--verify", "warn"),
    "impulsevit data preview --recipe vit_tiny_cifar10 --data.init_args.root=data/cifar10 --split train "
    "--out preview/": run(*TINY_DATA),
    "impulsevit data preview --recipe vit_tiny_cifar10 --data.init_args.root=data/cifar10 --split train --num 16 "
    "--out preview/": run(*TINY_DATA, "--overwrite"),  # the README's preview wrote preview/ in this workspace
    "impulsevit fit --recipe vit_tiny_cifar10 --data.init_args.root=data/cifar10": run(*SMALL, *ON_CPU),
    # your own image folder (the workspace's my_folder: 2 classes, JPEGs of mixed sizes) with a CPU recipe
    "impulsevit fit --recipe cpu_fmnist_vit --name mine --data.init_args.dataset=imagefolder "
    "--data.init_args.root=my_folder":
        run(*SMALL),
    # studies: the plan (every run's fit command), nothing trained
    "impulsevit study --recipe cpu_fmnist_vit --methods impulse,mimetic,torch --seeds 3": dry(),
    "impulsevit study --recipe quickstart --methods impulse,torch,mimetic --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_vit --seeds 3": dry(),
    "impulsevit study --recipe cpu_digits_vit --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_convmixer --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse,torch,mimetic --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 --name smallimg-depth-default":
        dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 --name smallimg-depth-propagated "
    "--model.init.options.pseudo_input=propagated": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 "
    "--name smallimg-depth-propagated-g12 --model.init.options.pseudo_input=propagated "
    "--model.init.options.gain_qk=12": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 --name smallimg-depth-released-g12 "
    "--model.init.options.gain_qk=12": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse --seeds 5 --name mixer-onetap-g017 "
    "--model.init.options.layout=one_tap --model.init.options.gain_in=0.17": dry(),
    "impulsevit study --recipe cpu_fmnist_vit --methods impulse --seeds 5 --name fmnistvit-depth-default": dry(),
    "impulsevit study --recipe cpu_fmnist_vit --methods impulse --seeds 5 --name fmnistvit-depth-propagated "
    "--model.init.options.pseudo_input=propagated": dry(),
    "impulsevit study --recipe quickstart --methods impulse --seeds 3 --name qs-depth-released": dry(),
    "impulsevit study --recipe quickstart --methods impulse --seeds 3 --name qs-depth-propagated "
    "--model.init.options.pseudo_input=propagated": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse --seeds 5 --name mixer-onetap-g0085 "
    "--model.init.options.layout=one_tap --model.init.options.gain_in=0.085": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods torch --seeds 5 --name mixer-torch": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods torch --seeds 5 --name mix-torch": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse --seeds 5 --name mix-perm0085 "
    "--model.init.options.layout=one_tap --model.init.options.gain_in=0.085 --model.init.options.tap=permutation":
        dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse --seeds 5 --name mix-add029 "
    "--model.init.options.layout=one_tap --model.init.options.gain_in=0.29 --model.init.options.gain_out=0.29 "
    "--model.init.options.combine=add": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse --seeds 5 --name mix-fadd-03-01 "
    "--model.init.options.layout=factored --model.init.options.gain_in=0.3 --model.init.options.gain_out=0.1 "
    "--model.init.options.combine=add": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 --name si-cal-released": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 --name si-cal-calibration "
    "--model.init.options.pseudo_input=calibration --model.init.options.calibration_ridge=1": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 --name si-cal-ridge01 "
    "--model.init.options.pseudo_input=calibration --model.init.options.calibration_ridge=0.1": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse --seeds 3 "
    "--name cpu_fmnist_vit_smallimg-logit --model.init.options.qk_normalize=logit": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods mimetic --seeds 3 "
    "--model.init.options.value_layout=released": dry(),
    "impulsevit study --recipe cpu_deit_aug_backends --seeds 3 --name cpu_deit_aug_backends-ffcv "
    "--data.init_args.backend=ffcv": dry(),
    "impulsevit study --recipe cpu_deit_aug_backends --seeds 3 --name cpu_deit_aug_backends-torchvision "
    "--data.init_args.backend=torchvision": dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --methods impulse --seeds 3 --name cpu_fmnist_rope_vit-keep "
    "--model.init.options.base=keep": dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --methods impulse --seeds 3 --name cpu_fmnist_rope_vit-mass025 "
    "--model.init.options.base=keep --model.init.options.target_mass=0.25": dry(),
    "impulsevit study --recipe cpu_fmnist_eva02 --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_dinov3 --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_eva02 --methods impulse --seeds 3 --name cpu_fmnist_eva02-keep "
    "--model.init.options.base=keep": dry(),
    "impulsevit study --recipe cpu_fmnist_dinov3 --methods impulse --seeds 3 --name cpu_fmnist_dinov3-keep "
    "--model.init.options.base=keep": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse,torch --seeds 3 --name mixer-factored": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse --seeds 3 --name mixer-onetap "
    "--model.init.options.layout=one_tap": dry(),
    "impulsevit study --recipe cpu_fmnist_vit_smallimg --methods impulse,torch --seeds 3 --name vit-smallimg-paired":
        dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --methods impulse,torch --seeds 3 --name rope-paired": dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --methods impulse --seeds 3 --name rope-worstcase "
    "--model.init.options.mass_rule=worst_case --model.init.options.target_mass=0.75": dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --methods impulse --seeds 3 --name rope-mean050 "
    "--model.init.options.target_mass=0.5": dry(),
    "impulsevit study --recipe cpu_fmnist_swin --methods impulse,torch --seeds 3 --name swin-torchbase": dry(),
    "impulsevit study --recipe cpu_fmnist_swin --methods impulse --seeds 3 --name swin-mass025 "
    "--model.init.options.target_mass=0.25": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse,torch --seeds 3 --name mixer-12ep "
    "--trainer.max_epochs=12": dry(),
    "impulsevit study --recipe cpu_fmnist_swin --methods timm --seeds 3 --name swin-timm": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse,torch,timm --seeds 5 --name mixer-5seeds": dry(),
    "impulsevit study --recipe cpu_fmnist_swin --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_vit --then cpu_digits_finetune --then-args=--trainer.max_epochs=5 "
    "--methods impulse,torch --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_vit --then cpu_digits_finetune --methods impulse,torch --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_dinov3 --methods impulse,torch,timm --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_eva02 --methods impulse,torch,timm --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_mixer --methods impulse,torch,timm --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_rope_vit --methods impulse,torch,timm --seeds 3": dry(),
    "impulsevit study --recipe cpu_fmnist_swin --methods impulse,torch,timm,mimetic --seeds 3": dry(),
    # SLURM: the batch script, printed (no cluster needed)
    "impulsevit submit --recipe deit_base_in1k --nodes 2 --gpus-per-node 8 --time 48:00:00 --dry-run": run(),
    "impulsevit submit --recipe deit_base_in1k --nodes 2 --gpus-per-node 8 --time 48:00:00 [--dry-run]": dry(),
    "impulsevit submit --recipe deit_tiny_in1k --nodes 1 --gpus-per-node 8 --constraint h100": dry(),
    "impulsevit submit --recipe vit_tiny_cifar10 --nodes 1 --gpus-per-node 8 --time 12:00:00 "
    "--data.init_args.root=$PWD/data/cifar10": dry(),
    "impulsevit submit --recipe deit_small_in1k --nodes 2 --gpus-per-node 8 --time 48:00:00 "
    "--data.init_args.backend=litdata --data.init_args.root=s3://my-bucket/in1k "
    "--data.init_args.cache_dir=/local/nvme/litdata": dry(),
    "impulsevit submit --recipe vit_base_in21k --nodes 4 --gpus-per-node 8 --stage-to /local/scratch/in21k "
    "--data.init_args.storage.train_beton=/shared/in21k/train.beton "
    "--data.init_args.storage.val_beton=/shared/in21k/val.beton": dry(),
    # placeholders and fragments
    "impulsevit --plugins my_pkg.extras": synopsis(),
    "impulsevit submit --stage-to": synopsis(),
    "impulsevit study … --submit": synopsis(),
    "impulsevit study --report-only": synopsis(),
    "impulsevit study --then": synopsis(),
    "impulsevit study --recipe R --name N --report-only": synopsis(),
    "impulsevit study --recipe R --methods a,b --seeds N": synopsis(),
    "impulsevit data preview --split val": synopsis(),
    "impulsevit predict MODEL IMAGES": synopsis(),
    "impulsevit predict MODEL IMAGES/": synopsis(),
    "impulsevit predict --recipe …": synopsis(),
    "impulsevit download my_data ROOT": synopsis(),
    "impulsevit download NAME ROOT": synopsis(),
    "impulsevit runs [DIR]": synopsis(),
    "impulsevit export CKPT OUT_DIR": synopsis(),
    "impulsevit convert SRC DST --dataset NAME --preset P": synopsis(),
    "impulsevit convert --check X.beton [--full]": synopsis(),
    "impulsevit convert imagenet s3://BUCKET/imagenet --root DATA --format litdata": synopsis(),
    "impulsevit convert imagenet21k s3://BUCKET/imagenet21k --root DATA --format litdata": synopsis(),
    # the block-order study (docs/results.md): a class-ordered shard set, then one run per seed and order
    "impulsevit convert FOLDER SHARDS --format litdata --preset raw --chunk-bytes 600KB": synopsis(),
    "impulsevit convert FOLDER SHARDS-SHUFFLED --format litdata --preset raw --chunk-bytes 600KB --shuffle": synopsis(),
    "impulsevit fit --recipe cpu_fmnist_vit_smallimg --runs-dir runs/smallimg-order-ORDER --name impulse-sS "
    "--resume auto --model.init.seed=S --seed_everything=S --data.init_args.seed=S "
    "--data.init_args.dataset=imagefolder --data.init_args.backend=litdata --data.init_args.root=SHARDS "
    "--data.init_args.download=false --data.init_args.storage.block_size=896 --data.init_args.order=ORDER":
        synopsis(),
    "impulsevit fit --recipe cpu_fmnist_vit_smallimg --runs-dir runs/smallimg-order-block-shuffled --name impulse-sS "
    "--resume auto --model.init.seed=S --seed_everything=S --data.init_args.seed=S "
    "--data.init_args.dataset=imagefolder --data.init_args.backend=litdata --data.init_args.root=SHARDS-SHUFFLED "
    "--data.init_args.download=false --data.init_args.storage.block_size=896 --data.init_args.order=block":
        synopsis(),
    "impulsevit fit --plugins my_inits.scaled --recipe R --model.init.method=scaled_normal "
    "--model.init.options='{\"scale\": 0.5}'": synopsis(),
    # not run here
    "impulsevit fit --recipe deit_base_in1k --model.init.method=mimetic --name deit_b_mimetic": skip("gpu"),
    "impulsevit export runs/deit_tiny_in1k/checkpoints/last.ckpt runs/deit_tiny_in1k-export": skip("gpu"),
    "impulsevit fit --recipe deit_tiny_cifar100_finetune --model.pretrained=runs/deit_tiny_in1k-export": skip("gpu"),
    "impulsevit export runs/vit_base_in21k/checkpoints/last.ckpt runs/vit_base_in21k-export": skip("gpu"),
    "impulsevit fit --recipe vit_base_in1k_finetune --model.pretrained=runs/vit_base_in21k-export": skip("gpu"),
    "torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29400 -m impulsevit.cli fit "
    "--recipe deit_base_in1k --trainer.num_nodes=2 --trainer.devices=8 --resume auto": skip("gpu"),
    "torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint $MASTER:29400 -m impulsevit.cli fit "
    "--recipe deit_small_in1k --trainer.num_nodes=2 --trainer.devices=8 --resume auto "
    "--data.init_args.backend=litdata --data.init_args.root=s3://my-bucket/in1k "
    "--data.init_args.cache_dir=/local/nvme/litdata": skip("gpu"),
    "impulsevit fit --recipe deit_small_in1k --data.init_args.backend=litdata "
    "--data.init_args.root=s3://my-bucket/in1k --data.init_args.cache_dir=/local/nvme/litdata": skip("network"),
    "impulsevit convert imagenet s3://my-bucket/in1k --root /data/imagenet --format litdata --preset short256 "
    "--shuffle": skip("network"),
    "impulsevit convert /data/imagenet /data/ffcv --dataset imagenet --preset res256": skip("data"),
    "impulsevit data preview --recipe deit_base_in1k --split val --num 16 --out preview/": skip("data"),
}

# Python snippets, by ``<file>#<n>``: run (executed in the workspace, after the commands; ``replace`` pairs make its
# small form, each ``old`` must be in the snippet), module (written to the file its first line names, for the
# commands to import), or skip with a reason
SNIPPETS: dict[str, dict] = {
    "README.md#1": {"form": "run"},
    "docs/usage.md#1": {"form": "run"},
    "docs/usage.md#2": {"form": "run", "replace": [
        ('augment={"hflip": 0.0})', 'augment={"hflip": 0.0}, backend="torchvision")'),
        ("L.Trainer(max_epochs=1)",
         "L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, enable_progress_bar=False)")]},
    "docs/usage.md#3": {"form": "run"},  # loads the folder `impulsevit export` wrote (vit/)
    "impulsevit/init/README.md#1": {"form": "module"},
    "docs/extending.md#1": {"form": "skip", "reason": "placeholders"},
}
SNIPPET_REASONS = {"placeholders": "a template with `...` for the reader's own values and functions"}
