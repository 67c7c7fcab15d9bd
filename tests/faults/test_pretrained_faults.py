"""Fault class "bad weights source": ``impulsevit fit --model.pretrained=...`` given a hostile file (its pickle would
run code), the weights of another architecture, or a timm model folder whose recorded architecture computes something
else with the same tensor shapes, through the real command in its own session: exit status 2, one error line naming
the source and what was expected, nothing written in the folder it ran in (no run directory left), the hostile
pickle's marker not created, no process left behind."""

from __future__ import annotations

import pytest
import timm
from safetensors.torch import save_file

from faults.harness import (
    TINY,
    assert_no_survivors,
    assert_one_line_error,
    finish,
    run,
    snapshot,
    start,
    write_evil_checkpoint,
)

FIT = ("fit", "--recipe", str(TINY), "--runs_dir=runs", "--name=ft", "--trainer.max_steps=1")


pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """The tiny recipe's backbone with one block too many, as a .safetensors file, and its tensors."""
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=4, patch_size=4, embed_dim=64,
                              depth=3, num_heads=2)
    path = tmp_path_factory.mktemp("w") / "deeper.safetensors"
    save_file(model.state_dict(), str(path))
    return path, model.state_dict()


def test_a_hostile_weights_file_is_refused_before_any_work(weights, tmp_path):
    marker = tmp_path / "pwned"
    evil = write_evil_checkpoint(tmp_path / "evil.pth", marker, base=dict(weights[1]))
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(work)
    res = run(*FIT, f"--model.pretrained={evil}", cwd=work)
    assert_one_line_error(res, 2, str(evil), "refused to load this weights file", "--trust-checkpoint")
    assert not marker.exists()
    assert snapshot(work) == before
    assert_no_survivors(res.sid)


def test_weights_of_another_architecture_are_one_line_and_leave_nothing(weights, tmp_path):
    before = snapshot(tmp_path)
    res = run(*FIT, f"--model.pretrained={weights[0]}", cwd=tmp_path)
    assert_one_line_error(res, 2, "model.pretrained", "does not fit model.backbone 'vit_tiny_patch16_224'",
                          "unexpected blocks.2.")
    assert snapshot(tmp_path) == before and not (tmp_path / "runs").exists()
    assert_no_survivors(res.sid)


def test_a_folder_whose_recorded_head_count_differs_is_one_line_and_leaves_nothing(tmp_path):
    """Issue #47: a timm model folder (timm's save_for_hf, the format `impulsevit export` writes) of the tiny recipe's
    backbone with 4 heads instead of 2 — every tensor has the tiny model's shape — is refused by its config.json."""
    from timm.models import save_for_hf

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=4, patch_size=4, embed_dim=64,
                              depth=2, num_heads=4)
    folder = tmp_path / "four-heads"
    save_for_hf(model, str(folder), model_config={"num_classes": 4}, safe_serialization=True)
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(work)
    res = run(*FIT, f"--model.pretrained={folder}", cwd=work)
    assert_one_line_error(res, 2, f"model.pretrained={folder}: num_heads: 4 in the source, 2 in the model",
                          "the source's config.json: vit_tiny_patch16_224")
    assert snapshot(work) == before and not (work / "runs").exists()
    assert_no_survivors(res.sid)


def test_an_unreachable_hub_is_the_one_line_without_the_retry_noise(tmp_path):
    """``--model.pretrained=hf-hub:ORG/NAME`` with ``HF_ENDPOINT`` at a closed loopback port: huggingface_hub retries
    five times (about 23 s of back-off, its own policy) and logged two lines per retry; now only the one error line
    follows Lightning's start-up lines. A fresh process: huggingface_hub reads ``HF_ENDPOINT`` once, at import.

    The child's back-off sleeps (not its retries, nor what it logs) are cut to 1/100 by a ``sitecustomize`` on its
    ``PYTHONPATH``, which also records each wait asked for: the retries happened, so there was noise to keep out."""
    import os
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    site, waits = tmp_path / "site", tmp_path / "back-off-waits"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import time, types\n"
        "import huggingface_hub.utils._http as http\n"
        "def sleep(seconds):\n"
        f"    with open({str(waits)!r}, 'a') as f:\n"
        "        f.write(f'{seconds}\\n')\n"
        "    time.sleep(seconds / 100)\n"
        "http.time = types.SimpleNamespace(**{**vars(time), 'sleep': sleep})\n")
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {"HF_ENDPOINT": closed, "HF_HUB_CACHE": str(tmp_path / "hub-cache"), "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_OFFLINE": "0", "PYTHONPATH": os.pathsep.join(path)}
    work = tmp_path / "work"
    work.mkdir()
    res = finish(start(*FIT, "--model.pretrained=hf-hub:my-lab/pre", cwd=work, extra_env=env), timeout=300)
    assert waits.is_file() and len(waits.read_text().split()) >= 2, res.err  # huggingface_hub retried (and logged)
    line = assert_one_line_error(res, 2, "model.pretrained 'hf-hub:my-lab/pre': cannot fetch", closed)
    noise = [ln for ln in res.err_lines if "Retry" in ln or "thrown while requesting" in ln]
    assert not noise, res.err
    startup = ("Seed set to", "GPU available", "TPU available", "HPU available", "`Trainer(")
    assert [ln for ln in res.err_lines if not ln.startswith(startup)] == [line], res.err
    assert not (work / "runs").exists()
    assert_no_survivors(res.sid)
