"""The subcommands of ``impulsevit``: which there are and the usage text (names only: where the ones other modules
provide live is :mod:`impulsevit.cli.entry`'s table).

Why a table of its own beside LightningCLI: LightningCLI's subcommands are the ``Trainer`` methods
(``fit|validate|test|predict``), each parsed from the model / data / trainer signatures. The other subcommands
(``convert``, ``submit``, ``study``, ...) take none of those: each is a plain ``main(argv) -> exit status`` with its
own small ``argparse`` parser, and its module is imported only when that subcommand runs. Giving them jsonargparse
parsers would add nothing they use (config files, class paths).
"""

from __future__ import annotations

from impulsevit._version import __version__

TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")
EXTERNAL_SUBCOMMANDS = ("convert", "submit", "study", "demo", "init", "data", "download", "runs", "probe")
"""Provided by other parts of the package; which module runs each is :data:`impulsevit.cli.entry.PROVIDERS` (this
module holds names only, so the parser modules that read them do not depend on the modules providing them)."""
LOCAL_SUBCOMMANDS = ("recipes", "export")
ALL_SUBCOMMANDS = (*TRAINER_SUBCOMMANDS, *LOCAL_SUBCOMMANDS, *EXTERNAL_SUBCOMMANDS)

USAGE = f"""usage: impulsevit SUBCOMMAND ...

impulsevit {__version__}: Lightning + timm training of vision transformers with structured initializations.

  fit|validate|test|predict --recipe NAME_OR_PATH [--dotted.key=value ...]
        [--name N] [--runs-dir D] [--resume auto|PATH]
                      train / evaluate (LightningCLI; `impulsevit fit --help` lists every key)
  predict MODEL IMAGES [--out predictions.csv] [--ema]
                      top-5 classes of every image in a folder (MODEL: checkpoint or exported folder), as CSV
  recipes             list the available recipes
  export CKPT OUT [--ema] [--format folder|state-dict] [--overwrite] [--push-to-hub ORG/NAME]
                      write a timm model folder (config.json, model.safetensors, model card) or a plain state dict
  probe SOURCE --recipe R [overrides] [--k 20] [--json]
                      linear-probe and k-NN accuracy of frozen features (SOURCE as --model.pretrained)
  convert ...         convert a dataset to FFCV .beton
  submit ...          submit a recipe to SLURM
  study ...           run an initialization study
  runs [DIR] [--status S] [--recipe R] [--sort K] [--json]
                      one table of every run under DIR (default runs) or a study: status, epoch/step, top-1, ...
  demo                show an impulse initialization on a small ViT
  init list [module:function ...]
                      list the init methods (built-in, registered by plugin modules) and their source
  data preview --recipe R [overrides] --split train|val [--num N] [--out DIR]
                      write the images the recipe feeds the model (PNG grid + tensors)
  download NAME ROOT  fetch a public dataset (cifar10, cifar100, stl10, flowers102, pets, food101, fashion_mnist,
                      or one a plugin registered with a download)

Any subcommand: --plugins MOD[,MOD] (or IMPULSEVIT_PLUGINS, or an installed entry point of the group
impulsevit.plugins) imports modules that register datasets (impulsevit.data.register_dataset) or init methods and
families (impulsevit.init.register) first; --debug shows tracebacks.
"""

