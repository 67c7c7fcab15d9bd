"""``impulsevit probe SOURCE --recipe R [fit overrides …] [--k 20] [--temperature 0.07] [--C 1.0] [--name N]
[--runs-dir D] [--overwrite] [--json] [--trust-checkpoint]``: how good a representation is without fine-tuning.

``SOURCE`` is anything ``model.pretrained`` takes (:mod:`impulsevit.training.pretrained`: a run's checkpoint, an
exported folder, ``hf-hub:ORG/NAME``, a timm tag, a weights file). The recipe's command line is parsed as ``impulsevit
fit`` parses it (its ``model`` builds the backbone the weights are loaded into, at the recipe's image size: position
embeddings are resampled as for a fine-tune; its ``data`` gives the two splits). Features are the backbone's pooled
pre-logits (``forward_head(forward_features(x), pre_logits=True)``, eval mode, no grad, on the CPU) of

- the training split under the *evaluation* transform (an :class:`~impulsevit.data.ImageDataModule` is built a second
  time with ``val_split`` = its training split and ``val_subset`` = its ``train_subset``; another datamodule's training
  loader is read without its batch augmentation, ``model_input(train=False)``), and
- the validation split (evaluation transform).

Two accuracies on the validation split:

- **linear probe**: scikit-learn's ``LogisticRegression`` (L-BFGS, multinomial, ``C``, up to 1000 iterations) on the
  cached features, standardised with the training features' mean and std. Chosen over an SGD-trained torch linear
  layer because the problem is convex and small: L-BFGS reaches its optimum with no lr, epochs or schedule to tune,
  deterministically (CLIP's linear-probe protocol). Features are not augmented (DINO's probe trains on augmented
  crops; that costs a forward pass per epoch).
- **k-NN** (DINO's weighted k-NN classifier, ``eval_knn.py``): L2-normalised features, cosine similarity, the ``k``
  (20) nearest training features vote for their class with weight ``exp(sim / temperature)`` (0.07). Written here:
  scikit-learn's ``KNeighborsClassifier`` has no exponential-similarity vote.

Writes ``<runs-dir>/<name>/probe.json`` (default name: ``probe-<run>-<checkpoint stem>`` for a run's checkpoint,
``runs/pre/checkpoints/last.ckpt`` -> ``probe-pre-last``, else ``probe-<source name>``, :func:`default_name`; atomic;
an existing file is replaced only with ``--overwrite``, checked before any work) and prints the summary (``--json``:
the JSON instead). Exit 2 for a bad source, recipe or option (one line, nothing written).

Not supported: multi-GPU feature extraction (one process, CPU; ``OMP_NUM_THREADS`` threads); probing the EMA copy of a
checkpoint (export it with ``--ema`` first).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from impulsevit.argparser import ArgumentParser

__all__ = ["default_name", "extract_features", "knn_accuracy", "linear_probe_accuracy", "main", "probe"]

PROBE_FILE = "probe.json"


def knn_accuracy(train: torch.Tensor, train_labels: torch.Tensor, test: torch.Tensor, test_labels: torch.Tensor,
                 k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
                 chunk: int = 1024) -> float:
    """Top-1 accuracy (0–1) of DINO's weighted k-NN: features ``(N, D)`` / ``(M, D)``, labels int64 ``(N,)`` / ``(M,)``;
    cosine similarity, the ``min(k, N)`` nearest training samples vote with weight ``exp(sim / temperature)``."""
    c = int(num_classes if num_classes is not None else int(torch.cat([train_labels, test_labels]).max()) + 1)
    train = torch.nn.functional.normalize(train.float(), dim=1)
    test = torch.nn.functional.normalize(test.float(), dim=1)
    k = min(int(k), train.shape[0])
    correct = 0
    for start in range(0, test.shape[0], chunk):
        sims = test[start:start + chunk] @ train.T  # (m, N)
        top, idx = sims.topk(k, dim=1)
        votes = torch.zeros(sims.shape[0], c)
        votes.scatter_add_(1, train_labels[idx], (top / temperature).exp())
        correct += int((votes.argmax(1) == test_labels[start:start + chunk]).sum())
    return correct / max(1, test.shape[0])


def linear_probe_accuracy(train: torch.Tensor, train_labels: torch.Tensor, test: torch.Tensor,
                          test_labels: torch.Tensor, C: float = 1.0, max_iter: int = 1000) -> float:  # noqa: N803
    """Top-1 accuracy (0–1) of scikit-learn's L-BFGS ``LogisticRegression(C)`` fit on ``train`` ``(N, D)``,
    standardised with the training mean / std, evaluated on ``test`` ``(M, D)``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    mean, std = train.mean(0, keepdim=True), train.std(0, keepdim=True).clamp_min(1e-6)
    x, y = ((train - mean) / std).double().numpy(), train_labels.numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the accuracy is what is reported either way
        clf = LogisticRegression(C=C, max_iter=max_iter).fit(x, y)
    pred = clf.predict(((test - mean) / std).double().numpy())
    return float((torch.from_numpy(pred) == test_labels).double().mean())


@torch.no_grad()
def extract_features(backbone: torch.nn.Module, batches: Any, to_input: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-logit features ``(N, D)`` float32 and labels int64 ``(N,)`` of every batch of ``batches`` (``to_input``
    turns a loader batch into ``(images, labels)``), the backbone in eval mode."""
    backbone.eval()
    feats, labels = [], []
    for batch in batches:
        images, y = to_input(batch)
        images = images.float()
        feats.append(backbone.forward_head(backbone.forward_features(images), pre_logits=True).float().cpu())
        labels.append(y.long().cpu())
    if not feats:
        raise ValueError("the split yielded no batches")
    return torch.cat(feats), torch.cat(labels)


def _build(cli_args: list[str], source: str) -> Any:
    """The model (with ``source`` loaded) and datamodule of ``impulsevit fit <cli_args> --model.pretrained=source``
    (parsed by the fit parser; nothing else instantiated that writes)."""
    from lightning.pytorch.cli import instantiate_class

    from impulsevit.cli.argv import prepare_argv
    from impulsevit.cli.trainer_cli import ImpulseCLI

    class _ModelDataCLI(ImpulseCLI):
        def instantiate_classes(self) -> None:  # model and data only: no trainer, no logger, no run directory
            data = self._value(self.config, "data").as_dict()
            self.datamodule = instantiate_class((), data)
            model = self._value(self.config, "model").as_dict()
            model.update(num_classes=self.datamodule.num_classes, img_size=self.datamodule.image_size)
            from impulsevit.training.module import ImageClassifier

            self.model = ImageClassifier(**model)

        def after_instantiate_classes(self) -> None:
            pass

    argv = prepare_argv(["fit", *cli_args, f"--model.pretrained={source}"])[1:]
    saved = sys.argv
    sys.argv = sys.argv[:1]
    try:
        cli = _ModelDataCLI(args=argv, run=False)
    finally:
        sys.argv = saved
    return cli.model, cli.datamodule


def _train_batches(dm: Any, cli_args: list[str], source: str) -> tuple[Any, Any, str]:
    """The training split's batches under the evaluation transform, their ``to_input`` and how they were read."""
    from impulsevit.data import ImageDataModule
    from impulsevit.data.loading.position import LoaderPosition

    if isinstance(dm, ImageDataModule):
        subset = dm.train_subset
        _, tdm = _build([*cli_args, f"--data.init_args.val_split={dm.train_split}",
                         f"--data.init_args.val_subset={subset if subset is not None else 'null'}"], source)
        tdm.prepare_data()
        return (tdm.loader(False, LoaderPosition()), lambda b: tdm.model_input(b, train=False),
                f"split {dm.train_split!r}, evaluation transform")
    dm.setup("fit")  # the interface's loader reads what setup opened
    return (dm.loader(True, LoaderPosition()), lambda b: dm.model_input(b, train=False),
            "training loader without batch augmentation")


def probe(source: str, cli_args: list[str], k: int = 20, temperature: float = 0.07,
          C: float = 1.0) -> dict[str, Any]:  # noqa: N803
    """Linear-probe and k-NN accuracy of ``source``'s features on the recipe's data (see the module); the summary
    dict written to ``probe.json``."""
    from impulsevit.data.loading.position import LoaderPosition

    t0 = time.perf_counter()
    model, dm = _build(cli_args, source)
    report = model.load_weights()
    dm.prepare_data()
    backbone = model.backbone
    batches, to_input, how = _train_batches(dm, cli_args, source)
    x_train, y_train = extract_features(backbone, batches, to_input)
    x_val, y_val = extract_features(backbone, dm.loader(False, LoaderPosition()),
                                    lambda b: dm.model_input(b, train=False))
    t_feat = time.perf_counter() - t0
    lin = linear_probe_accuracy(x_train, y_train, x_val, y_val, C=C)
    knn = knn_accuracy(x_train, y_train, x_val, y_val, k=k, temperature=temperature, num_classes=dm.num_classes)
    return {
        "source": source, "sha256": report.options.get("sha256"), "kind": report.options.get("kind"),
        "backbone": model.hparams.backbone, "adapted": report.notes,
        "dataset": dm.describe() if hasattr(dm, "describe") else type(dm).__name__,
        "image_size": dm.image_size, "train_features": how,
        "train_samples": int(x_train.shape[0]), "val_samples": int(x_val.shape[0]),
        "feature_dim": int(x_train.shape[1]),
        "linear_probe_acc1": lin, "linear_probe": {"method": "sklearn LogisticRegression (lbfgs, standardised)",
                                                   "C": C},
        "knn_acc1": knn, "knn": {"k": int(k), "temperature": temperature, "metric": "cosine"},
        "seconds": {"features": round(t_feat, 1), "total": round(time.perf_counter() - t0, 1)},
        "command": ["impulsevit", "probe", source, *cli_args],
    }


def default_name(source: str) -> str:
    """The probe's run folder name when ``--name`` is not given: ``probe-<run>-<checkpoint stem>`` for a checkpoint
    in a run's ``checkpoints/`` folder (``runs/pre/checkpoints/last.ckpt`` -> ``probe-pre-last``: each run's
    ``last.ckpt`` gets its own folder), else ``probe-<source name>`` (an exported folder, a weights file, the last
    part of ``hf-hub:ORG/NAME`` or a timm tag)."""
    path = Path(str(source).split(":", 1)[-1].rstrip("/"))
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"probe-{path.parent.parent.name}-{path.stem}"
    return f"probe-{path.name or 'source'}"


def main(argv: list[str] | None = None) -> int:
    """``impulsevit probe``; returns the exit status (0 done; 2 bad input, one line; 1 a write failed)."""
    from impulsevit.errors import ConfigError
    from impulsevit.io import atomic_write_json, child_path, claim_output
    from impulsevit.safe_load import TRUST_FLAG, TRUST_HELP, split_trust_flag, trusting

    argv = list(sys.argv[1:] if argv is None else argv)
    argv, trust = split_trust_flag(argv)
    parser = ArgumentParser(
        prog="impulsevit probe",
        description="Linear-probe and k-NN accuracy of frozen features: SOURCE's weights in the recipe's model, "
                    "on the recipe's data; other arguments are fit overrides (--data.init_args.X=...).")
    parser.add_argument("source", help="a run's checkpoint or run folder, an exported folder, hf-hub:ORG/NAME, "
                                       "ARCH.TAG or a .safetensors / .pth file (as model.pretrained)")
    parser.add_argument("--k", type=int, default=20, help="neighbours of the k-NN vote (default 20, as DINO)")
    parser.add_argument("--temperature", type=float, default=0.07, help="k-NN vote temperature (default 0.07)")
    parser.add_argument("--C", type=float, default=1.0, help="inverse L2 strength of the logistic regression")
    parser.add_argument("--name", default=None, help="run folder name (default probe-<run>-<checkpoint stem> for a "
                                                     "run's checkpoint, else probe-<source name>)")
    parser.add_argument("--runs-dir", "--runs_dir", dest="runs_dir", default="runs", help="parent of the run folder")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing probe.json")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args, rest = parser.parse_known_args(argv)
    if not any(a in ("--recipe", "--config", "-c") or a.startswith(("--recipe=", "--config=")) for a in rest):
        raise ConfigError("impulsevit probe needs --recipe NAME_OR_PATH (its model and data)")
    if args.k < 1 or not (math.isfinite(args.temperature) and args.temperature > 0) or not args.C > 0:
        raise ConfigError(f"--k must be >= 1, --temperature and --C > 0 (got {args.k}, {args.temperature}, {args.C})")
    name = args.name or default_name(args.source)
    folder = child_path(args.runs_dir, name, "--name")
    out = folder / PROBE_FILE
    claim_output(out, args.overwrite, "file", what="probe.json")
    with trusting(trust):
        result = probe(args.source, rest, k=args.k, temperature=args.temperature, C=args.C)
    result["run_dir"] = str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"impulsevit probe: {args.source} (sha256 {str(result['sha256'])[:12]}…) on {result['dataset']}, "
              f"{result['image_size']} px, {result['feature_dim']}-d features, {result['train_samples']} train / "
              f"{result['val_samples']} val\n"
              f"  linear probe top-1: {100 * result['linear_probe_acc1']:.2f} %\n"
              f"  k-NN top-1 (k={args.k}): {100 * result['knn_acc1']:.2f} %\n"
              f"  wrote {out} ({result['seconds']['total']:.1f} s)")
    return 0
