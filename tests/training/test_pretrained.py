"""Starting from weights (``model.pretrained``, :mod:`impulsevit.training.pretrained`) on real timm models: every
source kind resolves to its file and sha256, the tensors land where timm's transfer puts them (a new head when the
class count differs, position embeddings resampled by timm to the new grid), a wrong architecture or a hostile file is
refused before anything is loaded, and the frozen-backbone and layer-decay options reach the optimizer.

In-process and small (models of 2 blocks, dim 64); the hub is a real HTTP server on 127.0.0.1 (``tests/_fake_hub.py``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

from impulsevit.errors import ConfigError
from impulsevit.safe_load import UntrustedFileError
from impulsevit.training.pretrained import FROM_WEIGHTS, NOT_CHECKED, load_into, read_state_dict, resolve_source

ARCH = "vit_tiny_patch16_224"
KW = {"patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 4}


def _vit(img_size: int = 28, num_classes: int = 10, **over: int) -> torch.nn.Module:
    return timm.create_model(ARCH, img_size=img_size, num_classes=num_classes, **{**KW, **over})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = _vit()
    folder = tmp_path_factory.mktemp("weights")
    save_file(src.state_dict(), str(folder / "w.safetensors"))
    return src, folder


def _load(spec: str, target: torch.nn.Module):
    s = resolve_source(spec)
    return s, load_into(target, ARCH, s, read_state_dict(s), say=False)


def test_new_size_and_class_count_resample_pos_embed_and_swap_the_head(source):
    src, folder = source
    target = _vit(img_size=24, num_classes=7)
    head_before = target.head.weight.detach().clone()
    s, report = _load(str(folder / "w.safetensors"), target)
    assert report.method == FROM_WEIGHTS and report.options["sha256"] == _sha(folder / "w.safetensors") == s.sha256
    for name, p in src.named_parameters():
        if not name.startswith(("head.", "pos_embed")):
            assert torch.equal(target.get_parameter(name), p), name
    # timm's own resample of the 7x7 grid to 6x6, the class token kept
    expected = resample_abs_pos_embed(src.pos_embed.detach(), (6, 6), num_prefix_tokens=1)
    assert torch.allclose(target.pos_embed, expected)
    assert torch.equal(target.head.weight, head_before)  # the new head keeps its fresh init
    assert any("new classifier head: 7 classes" in n for n in report.notes)
    assert any("pos_embed resampled" in n for n in report.notes)


def test_same_task_loads_every_tensor_exactly(source):
    src, folder = source
    target = _vit()
    _, report = _load(str(folder / "w.safetensors"), target)
    assert report.notes == [NOT_CHECKED]  # a bare weights file records no architecture to compare with
    for name, t in src.state_dict().items():
        assert torch.equal(target.state_dict()[name], t), name


def test_checkpoints_folders_and_wrapped_state_dicts(source, tmp_path):
    """A Lightning checkpoint of ImageClassifier (backbone.* taken), a {'model': ...} training checkpoint, and a
    timm model folder (local-dir: and a plain path) all load the same tensors."""
    from timm.models import save_for_hf

    src, _ = source
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in src.state_dict().items()}, "epoch": 3},
               tmp_path / "run.ckpt")
    torch.save({"model": src.state_dict(), "epoch": 3}, tmp_path / "train.pth")
    save_for_hf(src, str(tmp_path / "folder"), model_config={"num_classes": 10}, safe_serialization=True)
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in src.state_dict().items()}, "epoch": 3,
                "hyper_parameters": {"backbone": ARCH, "backbone_kwargs": {**KW, "drop_path_rate": 0.1},
                                     "num_classes": 10, "img_size": 28}}, tmp_path / "impulsevit.ckpt")
    checked = "architecture checked against the source's "
    for spec, kind, architecture in (
            (tmp_path / "run.ckpt", "file", NOT_CHECKED), (tmp_path / "train.pth", "file", NOT_CHECKED),
            (tmp_path / "impulsevit.ckpt", "file", checked + f"checkpoint hyper_parameters ({ARCH})"),
            (f"local-dir:{tmp_path / 'folder'}", "folder", checked + f"config.json ({ARCH})"),
            (tmp_path / "folder", "folder", checked + f"config.json ({ARCH})")):
        target = _vit()
        s, report = _load(str(spec), target)
        assert s.kind == kind and report.options["architecture"] == architecture, spec
        assert torch.equal(target.blocks[1].attn.qkv.weight, src.blocks[1].attn.qkv.weight), spec
    with pytest.raises(ConfigError, match=r"ckpt: num_heads: 4 in the source, 2 in the model \(same tensor shapes"):
        _load(str(tmp_path / "impulsevit.ckpt"), _vit(num_heads=2))


@pytest.fixture(scope="module")
def folder_2_heads(tmp_path_factory):
    """A timm model folder (timm's save_for_hf, as `impulsevit export` writes it) of a 2-head model, whose tensors have
    the shapes of the 4-head ``_vit()``: config.json records ``num_heads: 2``."""
    from timm.models import save_for_hf

    path = tmp_path_factory.mktemp("two-heads") / "export"
    save_for_hf(_vit(num_heads=2), str(path), model_config={"num_classes": 10}, safe_serialization=True)
    return path


@pytest.mark.parametrize("target, needle", [
    (dict(), "num_heads: 2 in the source, 4 in the model"),
    (dict(num_heads=2, act_layer="quick_gelu"), "act_layer: GELU in the source, QuickGELU in the model"),
    (dict(num_heads=2, global_pool="avg", fc_norm=False), "global_pool: token in the source, avg in the model"),
])
def test_settings_that_keep_shapes_but_change_the_function_are_refused(folder_2_heads, target, needle):
    """The source's config.json records its architecture: a setting that leaves every tensor's shape alone but changes
    what the weights compute is one line naming it, before anything is loaded (issue #47: 2 heads into 4)."""
    model = _vit(**target)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as e:
        _load(str(folder_2_heads), model)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"model.pretrained={folder_2_heads}: {needle} (same tensor shapes")
    assert "the source's config.json: vit_tiny_patch16_224) — set model.backbone" in msg
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_a_new_head_size_or_architecture_name_with_the_same_settings_loads(folder_2_heads):
    """Legitimate differences stay allowed: another class count and image size (global_pool then belongs to the new
    head), and another name of the same architecture (DeiT-Ti's entry point builds the same VisionTransformer)."""
    from safetensors.torch import load_file

    weights = load_file(str(folder_2_heads / "model.safetensors"))
    deit = timm.create_model("deit_tiny_patch16_224", img_size=28, num_classes=10, **{**KW, "num_heads": 2})
    for arch, model in (("vit_tiny_patch16_224", _vit(img_size=24, num_classes=3, num_heads=2, global_pool="avg",
                                                      fc_norm=False)), ("deit_tiny_patch16_224", deit)):
        s = resolve_source(str(folder_2_heads))
        report = load_into(model, arch, s, read_state_dict(s), say=False)
        assert report.options["architecture"] == "architecture checked against the source's config.json " \
                                                 "(vit_tiny_patch16_224)", arch
        assert not any("not checked" in n for n in report.notes)
        assert torch.equal(model.blocks[1].attn.qkv.weight, weights["blocks.1.attn.qkv.weight"]), arch


@pytest.mark.parametrize("over, needle", [({"depth": 3}, "missing blocks.2."), ({"embed_dim": 32}, "tensor cls_token")])
def test_a_wrong_architecture_is_one_line_and_changes_nothing(source, over, needle):
    _, folder = source
    target = _vit(**over)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ConfigError) as e:
        _load(str(folder / "w.safetensors"), target)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg and f"model.backbone {ARCH!r}" in msg
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())


def test_a_hostile_weights_file_is_refused_unrun(source, tmp_path):
    from faults.harness import write_evil_checkpoint

    src, _ = source
    marker = tmp_path / "pwned"
    evil = write_evil_checkpoint(tmp_path / "evil.pth", marker, base=src.state_dict())
    s = resolve_source(str(evil))
    with pytest.raises(UntrustedFileError, match="refused to load this weights file"):
        read_state_dict(s)
    assert not marker.exists()


def test_unknown_sources_name_what_was_expected(tmp_path):
    for spec in (str(tmp_path / "nope.pth"), "vit_tiny_patch16_224.no_such_tag", "hf-hub"):
        with pytest.raises(ConfigError, match="no such file or folder, and not hf-hub:ORG/NAME"):
            resolve_source(spec)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no model.safetensors"):
        resolve_source(str(tmp_path / "empty"))


def _point_hub_at(monkeypatch, url: str, cache: Path) -> None:
    """huggingface_hub reads HF_ENDPOINT once, at import, into these two constants."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A stand-in hub on 127.0.0.1, with huggingface_hub pointed at it and an empty cache."""
    from _fake_hub import FakeHub

    with FakeHub() as server:
        _point_hub_at(monkeypatch, server.url, tmp_path / "hub-cache")
        yield server


def test_hf_hub_and_timm_tags_download_through_huggingface_hub(source, hub):
    """``hf-hub:ORG/NAME`` fetches the repo's model.safetensors; a timm tag fetches the file of timm's pretrained
    config (its hf_hub_id), here a ViT-Ti/16 with timm's 21,843-class IN-21K head, transferred to 10 classes at
    32 px."""
    src, folder = source
    hub.files["model.safetensors"] = (folder / "w.safetensors").read_bytes()
    target = _vit(img_size=24, num_classes=3)
    s, report = _load("hf-hub:my-lab/pre", target)
    assert s.kind == "hf-hub" and s.sha256 == _sha(folder / "w.safetensors")
    assert ("GET", "/my-lab/pre/resolve/main/model.safetensors") in hub.requests
    assert torch.equal(target.blocks[0].mlp.fc1.weight, src.blocks[0].mlp.fc1.weight)

    in21k = timm.create_model(ARCH, num_classes=21843)
    path = folder / "in21k.safetensors"
    save_file(in21k.state_dict(), str(path))
    hub.files["model.safetensors"] = path.read_bytes()
    target = timm.create_model(ARCH, num_classes=10, img_size=32)
    s, report = _load("vit_tiny_patch16_224.augreg_in21k", target)
    assert s.kind == "timm" and any(p.endswith("/timm/vit_tiny_patch16_224.augreg_in21k/resolve/main/"
                                               "model.safetensors") for _, p in hub.requests)
    assert "new classifier head: 10 classes (the source has 21843)" in report.notes[0]
    assert torch.equal(target.blocks[11].attn.proj.weight, in21k.blocks[11].attn.proj.weight)
    assert report.options["architecture"] == f"architecture checked against the source's timm pretrained_cfg ({ARCH})"
    # the tag records no model_args: its architecture's defaults (3 heads) are what the weights were trained with
    with pytest.raises(ConfigError, match="num_heads: 3 in the source, 4 in the model .*timm pretrained_cfg: vit_tiny"):
        _load("vit_tiny_patch16_224.augreg_in21k", timm.create_model(ARCH, num_classes=10, img_size=32, num_heads=4))


def test_an_unreachable_hub_is_one_line(monkeypatch, tmp_path):
    """huggingface_hub retries a refused connection with back-off (23 s of sleeps); the waits are skipped here, the
    retries and the connections are real."""
    import socket
    import time
    import types

    from huggingface_hub.utils import _http

    waits: list[float] = []
    monkeypatch.setattr(_http, "time", types.SimpleNamespace(**{**vars(time), "sleep": waits.append}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    _point_hub_at(monkeypatch, closed, tmp_path / "c")
    with pytest.raises(ConfigError, match=f"cannot fetch .* of my-lab/pre from {closed}") as e:
        resolve_source("hf-hub:my-lab/pre")
    assert "\n" not in str(e.value)
    assert waits, "huggingface_hub no longer retries through _http.time.sleep: this test's skip of its waits is stale"


def test_freeze_backbone_trains_the_head_only_and_layer_decay_scales_the_blocks():
    from impulsevit.training.config import OptimizerConfig
    from impulsevit.training.module import ImageClassifier
    from impulsevit.training.optim import build_optimizer

    m = ImageClassifier(ARCH, backbone_kwargs=KW, num_classes=5, img_size=28, freeze_backbone=True)
    trainable = {n for n, p in m.backbone.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"}
    opt = build_optimizer(m.backbone, OptimizerConfig(lr=1e-3), 1e-3, torch.device("cpu"))
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == 5 * 64 + 5

    m = ImageClassifier(ARCH, backbone_kwargs=KW, num_classes=5, img_size=28)
    opt = build_optimizer(m.backbone, OptimizerConfig(lr=1e-3, layer_decay=0.5), 1e-3, torch.device("cpu"))
    scales = {round(g["lr_scale"], 6) for g in opt.param_groups}
    assert scales == {0.125, 0.25, 0.5, 1.0}  # embeddings, block 0, block 1, head (timm's layer grouping)


def test_reinit_puts_named_parts_back_at_the_torch_methods_values(source):
    """``model.reinit`` after loading: the selected modules hold exactly what the ``torch`` init method gives them for
    the run's ``init.seed``; every other tensor is the source's; the report says what was re-initialised."""
    import impulsevit.init as ii
    from impulsevit.training.module import ImageClassifier

    src, folder = source
    m = ImageClassifier(ARCH, backbone_kwargs=KW, num_classes=10, img_size=28, init={"method": "impulse", "seed": 3},
                        pretrained=str(folder / "w.safetensors"), reinit=["head", "blocks.1.mlp*"])
    report = m.load_weights()
    reference = _vit()
    ii.initialize(reference, "torch", generator=3)
    fresh = {n for n in src.state_dict() if n.startswith(("head.", "blocks.1.mlp."))}
    assert fresh == {"head.weight", "head.bias", "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc1.bias",
                     "blocks.1.mlp.fc2.weight", "blocks.1.mlp.fc2.bias"}
    for name, t in m.backbone.state_dict().items():
        want = reference.state_dict()[name] if name in fresh else src.state_dict()[name]
        assert torch.equal(t, want), name
    assert not torch.equal(m.backbone.head.weight, src.head.weight)
    assert any("re-initialised head, blocks.1.mlp* (6 tensors)" in n and "seed 3" in n for n in report.notes)


def test_reinit_that_selects_nothing_or_has_no_weights_is_one_line(source):
    from impulsevit.training.module import ImageClassifier

    _, folder = source
    with pytest.raises(ConfigError, match=r"model.reinit: 'heads' matches no module of VisionTransformer .*head") as e:
        ImageClassifier(ARCH, backbone_kwargs=KW, num_classes=10, img_size=28,
                        pretrained=str(folder / "w.safetensors"), reinit=["heads"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="set model.pretrained too"):
        ImageClassifier(ARCH, backbone_kwargs=KW, num_classes=10, img_size=28, reinit=["head"])
