"""Pre-train → export → fine-tune / probe through the real CLI (in this process, the tiny synthetic recipe): a fine-tune
from an exported folder starts from its weights (recorded as ``from weights`` with the folder's sha256 in ``run.json``,
the checkpoint and the exported card; the init does not run), adapts to another class count and image size, resumes
without reading the source again, and ``impulsevit probe`` reports linear-probe and k-NN accuracy."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
from _cli_helpers import run_cli, state_dict, subprocess_env, tiny
from safetensors.torch import load_file

from impulsevit.cli import main

ONE = ("--trainer.max_epochs=1",)
NEW_TASK = ("--data.init_args.num_classes=3", "--data.init_args.image_size=24")


pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A 1-epoch pre-training run, exported as a timm folder."""
    base = tmp_path_factory.mktemp("pre")
    run_cli(*tiny(base / "runs", "pre", *ONE))
    assert main(["export", str(base / "runs" / "pre" / "checkpoints" / "last.ckpt"), str(base / "export")]) == 0
    return base / "export"


def test_fine_tune_from_an_exported_folder_and_resume_without_it(exported, tmp_path, capsys):
    source = load_file(str(exported / "model.safetensors"))
    sha = hashlib.sha256((exported / "model.safetensors").read_bytes()).hexdigest()
    folder = shutil.copytree(exported, tmp_path / "src")
    runs = tmp_path / "runs"
    run_cli(*tiny(runs, "ft", *ONE, *NEW_TASK, f"--model.pretrained={folder}", "--model.freeze_backbone=true",
                  "--model.ema_decay=null"))
    err = capsys.readouterr().err
    assert "new classifier head: 3 classes (the source has 4)" in err
    assert "pos_embed resampled from (1, 65, 64) to (1, 37, 64)" in err
    record = json.loads((runs / "ft" / "run.json").read_text())
    assert record["init_method"] == "from weights" and record["pretrained"]["sha256"] == sha
    assert record["pretrained"]["architecture"] == ("architecture checked against the source's config.json "
                                                    "(vit_tiny_patch16_224)")
    ckpt = torch.load(runs / "ft" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    init = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))
    assert init["method"] == "from weights" and init["report"]["options"]["sha256"] == sha
    # frozen backbone: every block is the source's, bit for bit (the init did not run, training did not move it)
    sd = ckpt["state_dict"]
    for key in ("blocks.0.attn.qkv.weight", "blocks.1.mlp.fc2.bias", "patch_embed.proj.weight", "cls_token"):
        assert torch.equal(sd[f"backbone.{key}"], source[key]), key
    assert sd["backbone.head.weight"].shape == (3, 64)

    shutil.rmtree(folder)  # a resume keeps the checkpoint's weights: the source is not read again
    run_cli(*tiny(runs, "ft", "--trainer.max_epochs=2", *NEW_TASK, f"--model.pretrained={folder}",
                  "--model.freeze_backbone=true", "--model.ema_decay=null", "--resume=auto"))
    assert "resuming from" in capsys.readouterr().err  # and it ran: the deleted source was not needed
    assert torch.equal(state_dict(runs / "ft" / "checkpoints" / "last.ckpt")["backbone.blocks.0.attn.qkv.weight"],
                       source["blocks.0.attn.qkv.weight"])
    assert json.loads((runs / "ft" / "run.json").read_text())["pretrained"]["sha256"] == sha

    assert main(["export", str(runs / "ft" / "checkpoints" / "last.ckpt"), str(tmp_path / "ft-export")]) == 0
    card = (tmp_path / "ft-export" / "README.md").read_text()
    assert "**from weights**" in card and sha in card


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "error" in line]


def test_a_source_of_another_head_count_is_refused_by_fit_and_probe(exported, tmp_path, capsys):
    """Issue #47: the 2-head pre-training into a 4-head model (every tensor has the same shape) is refused in one line,
    exit 2, whether the source is the exported folder or the run's checkpoint, by ``fit`` and by ``probe``, before any
    run or probe folder exists (the allowed differences: the fine-tune test above, and test_pretrained.py)."""
    ckpt = exported.parent / "runs" / "pre" / "checkpoints" / "last.ckpt"
    runs = tmp_path / "runs"
    for spec, origin in ((exported, "config.json"), (ckpt, "checkpoint hyper_parameters")):
        assert main(tiny(runs, "ft", *ONE, f"--model.pretrained={spec}", "--model.backbone_kwargs.num_heads=4")) == 2
        err = _error_lines(capsys)
        assert len(err) == 1 and f"model.pretrained={spec}: num_heads: 2 in the source, 4 in the model" in err[0], err
        assert f"the source's {origin}: vit_tiny_patch16_224" in err[0], err
        assert not runs.exists()
    assert main(["probe", str(ckpt), "--recipe", str(tiny(tmp_path, "x")[2]), f"--runs-dir={runs}",
                 "--model.backbone_kwargs.num_heads=4"]) == 2
    err = _error_lines(capsys)
    assert len(err) == 1 and "num_heads: 2 in the source, 4 in the model" in err[0], err
    assert not runs.exists()


def test_reinit_of_named_parts_through_the_cli(exported, tmp_path, capsys):
    """``--model.reinit``: a pattern that matches nothing is one line, exit 2, before any run folder exists; a valid
    one is applied after loading and recorded in the checkpoint's init report."""
    runs = tmp_path / "runs"
    assert main(tiny(runs, "bad", *ONE, f"--model.pretrained={exported}", "--model.reinit=[heads]")) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "model.reinit: 'heads' matches no module" in err[0], err
    assert not (runs / "bad").exists()
    run_cli(*tiny(runs, "ft", *ONE, f"--model.pretrained={exported}", "--model.reinit=[head]",
                  "--model.ema_decay=null", "--trainer.max_steps=1"))
    assert "model.reinit: re-initialised head (2 tensors)" in capsys.readouterr().err
    ckpt = torch.load(runs / "ft" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    init = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))
    assert any(n.startswith("re-initialised head (2 tensors)") for n in init["report"]["notes"]), init["report"]


def test_fine_tune_from_the_hub_through_the_console_command(exported, tmp_path):
    """``impulsevit fit --model.pretrained=hf-hub:ORG/NAME`` as a user runs it (a new process; the hub's address from
    ``HF_ENDPOINT``, as for a mirror): the weights come from the stand-in hub on 127.0.0.1 and the run records them.
    The repo holds bare weights (no config.json): they load, and the console, ``run.json`` and the checkpoint's init
    report say the architecture was not checked."""
    from _fake_hub import FakeHub

    weights = (exported / "model.safetensors").read_bytes()
    with FakeHub() as hub:
        hub.files["model.safetensors"] = weights
        env = {**subprocess_env(), "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
               "HF_HUB_DISABLE_XET": "1"}
        env.pop("HF_HUB_OFFLINE", None)
        res = subprocess.run([sys.executable, "-m", "impulsevit.cli",
                              *tiny(tmp_path / "runs", "hub", *ONE, *NEW_TASK, "--model.pretrained=hf-hub:my-lab/pre")],
                             env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        assert ("GET", "/my-lab/pre/resolve/main/model.safetensors") in hub.requests
    record = json.loads((tmp_path / "runs" / "hub" / "run.json").read_text())
    assert record["init_method"] == "from weights"
    assert record["pretrained"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert "new classifier head: 3 classes (the source has 4)" in res.stderr
    unchecked = "architecture not checked: the source records no config"
    assert f"model.pretrained: {unchecked}" in res.stderr
    assert record["pretrained"]["architecture"] == unchecked
    ckpt = torch.load(tmp_path / "runs" / "hub" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    init = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))
    assert unchecked in init["report"]["notes"]


def test_probe_prints_and_saves_linear_and_knn_accuracy(exported, tmp_path, capsys):
    args = ["probe", str(exported), "--recipe", str(tiny(tmp_path, "x")[2]), *NEW_TASK,
            f"--runs-dir={tmp_path / 'runs'}", "--k=5"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "linear probe top-1:" in out and "k-NN top-1 (k=5):" in out
    saved = json.loads((tmp_path / "runs" / "probe-export" / "probe.json").read_text())
    assert 0 <= saved["linear_probe_acc1"] <= 1 and 0 <= saved["knn_acc1"] <= 1
    assert saved["train_samples"] == 64 and saved["val_samples"] == 32 and saved["feature_dim"] == 64
    assert saved["sha256"] == hashlib.sha256((exported / "model.safetensors").read_bytes()).hexdigest()
    assert main([*args, "--json"]) == 2  # probe.json is there: replaced only with --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--json", "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["knn"]["k"] == 5


def test_probe_of_two_runs_last_ckpt_writes_one_folder_per_run(exported, tmp_path, capsys):
    """The default folder is named after the run (``probe-<run>-last``): probing a second run's ``last.ckpt`` does not
    meet the first one's ``probe.json``; ``--name`` still chooses the folder."""
    runs = exported.parent / "runs"
    run_cli(*tiny(runs, "other", "--trainer.max_steps=1"))
    common = ["--recipe", str(tiny(tmp_path, "x")[2]), *NEW_TASK, f"--runs-dir={tmp_path / 'probes'}", "--k=5"]
    for run in ("pre", "other"):
        ckpt = runs / run / "checkpoints" / "last.ckpt"
        assert main(["probe", str(ckpt), *common]) == 0, capsys.readouterr().err[-2000:]
        assert json.loads((tmp_path / "probes" / f"probe-{run}-last" / "probe.json").read_text())["source"] == \
            str(ckpt)
    assert main(["probe", str(runs / "other" / "checkpoints" / "last.ckpt"), *common, "--name=mine"]) == 0
    assert (tmp_path / "probes" / "mine" / "probe.json").is_file()
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == ["mine", "probe-other-last", "probe-pre-last"]


def test_knn_and_linear_probe_on_separable_features():
    """DINO's weighted vote and the logistic regression on features whose classes are known: perfect on separable
    clusters, chance-level on noise (a wrong vote or a leak between splits would show)."""
    from impulsevit.cli.probe import knn_accuracy, linear_probe_accuracy

    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 16, generator=g) * 5
    y = torch.arange(200) % 4
    x = centers[y] + torch.randn(200, 16, generator=g) * 0.3
    assert knn_accuracy(x[:120], y[:120], x[120:], y[120:], k=20) == 1.0
    assert linear_probe_accuracy(x[:120], y[:120], x[120:], y[120:]) == 1.0
    noise = torch.randn(200, 16, generator=g)
    assert knn_accuracy(noise[:120], y[:120], noise[120:], y[120:], k=20) < 0.5
