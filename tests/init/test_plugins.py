"""User initializers, for real. The one way (``impulsevit/init/README.md``, "One way to extend"): the README's own
example module, copied from the README into a package in a temp directory, used through ``initialize()`` and through
``impulsevit fit --plugins`` / ``impulsevit init list --plugins``. The deprecated routes, still working until 0.3.0 and
each warning so: an import path ``module:function`` to a module in a temp directory, and an installed plugin (a
``*.dist-info`` with ``module:function`` entry points in the group ``impulsevit.plugins``, and one in the deprecated
``impulsevit.initializers``) — both through the real CLI, the entry point in a fresh process. Every route ends in a
registered handler whose options are checked by the one schema check (``impulsevit/init/options.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _cli_helpers import REPO, run_cli, subprocess_env, tiny

import impulsevit.init as ii

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

PLUGIN = textwrap.dedent('''
    """A user's initializer: every >= 2-D weight ~ N(0, scale² / last dim) from the generator, the rest kept."""
    import torch
    from impulsevit.init import InitResult

    SEEN = []  # the initialised pos_embed of every call (the test compares it with a fresh call)

    def my_init(model, generator, scale=1.0):
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator) * (scale / p.shape[-1] ** 0.5))
        SEEN.append(model.pos_embed.detach().clone())
        return InitResult(options={"scale": scale}, notes=["scaled normal, my note"])

    def no_generator(model):
        pass

    def typed_init(model, generator, *, scale: float = 1.0, mode: str = "a"):
        return None

    NOT_A_FUNCTION = 3
''')


def _write_plugin(root: Path, module: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(PLUGIN)
    return root


def test_import_path_trains_through_impulsevit_fit(tmp_path, monkeypatch):
    mod = "user_inits_fit"
    monkeypatch.syspath_prepend(str(_write_plugin(tmp_path / "src", mod)))
    method = f"{mod}:my_init"
    with pytest.warns(DeprecationWarning, match=r"import path 'module:function' .* removed in impulsevit 0\.3\.0"):
        cli = run_cli(*tiny(tmp_path, "plugin", "--trainer.max_epochs=1", f"--model.init.method={method}",
                            '--model.init.options={"scale": 0.5}'))
    init = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "Initializer")
    report = init.report
    assert init.applied and report.method == method and report.family == "plugin"
    assert report.model == "VisionTransformer" and report.options == {"scale": 0.5} and report.seconds > 0
    assert report.notes == ["plugin from import path", "scaled normal, my note"]
    assert cli.trainer.global_step == 4 and cli.trainer.callback_metrics["train/loss"].isfinite()
    # the function really ran on the backbone, with the Initializer's generator (seed 0 of the recipe)
    seen = sys.modules[mod].SEEN
    assert len(seen) == 1
    fresh = cli.model.build_backbone()
    ii.initialize(fresh, method, generator=0, scale=0.5)
    assert torch.equal(seen[0], fresh.pos_embed.detach()) and seen[0].std().item() == pytest.approx(0.5 / 8, rel=0.1)
    ckpt = torch.load(tmp_path / "plugin" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    state = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))
    assert state["applied"] and state["report"]["method"] == method


@pytest.mark.parametrize(
    "method,options,message",
    [
        ("no_such_module_xyz:my_init", {}, r"cannot import module 'no_such_module_xyz' \(ModuleNotFoundError"),
        ("{mod}:missing", {}, r"module '{mod}' has no attribute 'missing'"),
        ("{mod}:NOT_A_FUNCTION", {}, r"is a int, expected a function fn\(model, generator, \*\*options\)"),
        ("{mod}:no_generator", {}, r"no_generator\(model\) cannot be called as fn\(model, generator"),
        ("{mod}:my_init", {"scal": 1.0},
         r"options: unknown option\(s\) \['scal'\] for init method '{mod}:my_init' \(plugin\) \(did you mean "
         r"'scale'\?\); valid: \['scale'\]"),
        ("{mod}:typed_init", {"scale": "big"},
         r"options: option 'scale' of init method '{mod}:typed_init' \(plugin\) must be float, got 'big'"),
        ("impulse", {"gain_k": 7.0},
         r"options: unknown option\(s\) \['gain_k'\] for init method 'impulse' \(did you mean 'gain_qk'\?\)"),
        ("impluse", {}, r"unknown init method 'impluse'; available: .*impulse.* or a method a plugin module registers "
                        r"\(impulsevit --plugins MODULE\)"),
    ],
)
def test_bad_method_fails_at_construction_naming_it(tmp_path, monkeypatch, method, options, message):
    mod = "user_inits_bad"
    monkeypatch.syspath_prepend(str(_write_plugin(tmp_path / "src", mod)))
    method, message = method.format(mod=mod), message.format(mod=mod)
    args = [f"--model.init.method={method}"]
    args += [f"--model.init.options={options}".replace("'", '"')] if options else []
    expected = message if message.startswith("options: ") else "method: .*" + message  # the key that is wrong
    with pytest.raises(ValueError, match=r"^model.init." + expected) as err:
        run_cli(*tiny(tmp_path, "bad", *args))
    assert "\n" not in str(err.value) and method in str(err.value)
    assert not (tmp_path / "bad" / "checkpoints").exists()  # failed while building the model: nothing ran


def _dist_info(site: Path) -> None:
    """An installed distribution ``userplug 0.3`` providing the entry point ``scaled_normal`` (no pip involved), one
    that does not resolve, one shadowed by a built-in and one in the deprecated group."""
    _write_plugin(site, "userplug_inits")
    info = site / "userplug-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: userplug\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[impulsevit.plugins]\nscaled_normal = userplug_inits:my_init\nbroken = userplug_inits:missing\n"
        "torch = userplug_inits:my_init\n\n[impulsevit.initializers]\nlegacy_normal = userplug_inits:my_init\n"
    )


@pytest.mark.slow
def test_entry_point_plugin_is_listed_and_trains_in_a_fresh_process(tmp_path):
    """One fresh interpreter (the dist-info must be on sys.path from the start) runs the console-script entry point
    ``impulsevit.cli.main`` three times: ``init list`` with an import path, ``init list`` with a bad one, ``fit``."""
    site = tmp_path / "site"
    _dist_info(site)
    _write_plugin(tmp_path / "src", "user_inits_list")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{site}:{tmp_path / 'src'}:{env['PYTHONPATH']}"
    fit_args = tiny(tmp_path, "ep", "--trainer.max_epochs=1", "--model.init.method=scaled_normal")
    driver = textwrap.dedent(f"""
        import sys
        from impulsevit.cli import main
        print("== list", flush=True)
        ok = main(["init", "list", "user_inits_list:my_init"])
        print("== bad", flush=True)
        bad = main(["init", "list", "user_inits_list:nope"])
        print(f"== status {{ok}} {{bad}}", flush=True)
        sys.exit(main({fit_args!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the CLI shows each deprecated route the user took, with the version that removes it
    assert re.search(r"'scaled_normal' \(entry point of userplug 0.3 .*\): an entry point naming a function is "
                     r"deprecated and will be removed in impulsevit 0\.3\.0", proc.stderr), proc.stderr[-3000:]
    assert "'impulsevit.initializers' is deprecated (legacy_normal) and will be removed in impulsevit 0.3.0" in \
        proc.stderr
    listing, rest = proc.stdout.split("== list\n", 1)[1].split("== bad\n", 1)
    bad, status = rest.split("== status ", 1)
    assert status.startswith("0 1")  # exit status of each listing: a bad import path is an error
    rows = {line.split()[0]: line for line in listing.splitlines() if line.strip()}
    assert "builtin" in rows["impulse"] and "vit" in rows["impulse"] and "convmixer" in rows["impulse"]
    assert "plugin" in rows["scaled_normal"]
    assert "entry point of userplug 0.3 (userplug_inits:my_init)" in rows["scaled_normal"]
    assert "error" in rows["broken"] and "has no attribute 'missing'" in listing
    assert "deprecated group impulsevit.initializers" in rows["legacy_normal"]  # still read, and said so
    assert "shadowed by the built-in" in listing  # the entry point named 'torch' never replaces the built-in
    assert "import path" in rows["user_inits_list:my_init"]
    assert "module 'user_inits_list' has no attribute 'nope'" in bad

    ckpt = torch.load(tmp_path / "ep" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    report = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))["report"]
    assert report["method"] == "scaled_normal" and report["family"] == "plugin" and report["seconds"] > 0
    assert report["notes"] == ["plugin from entry point of userplug 0.3 (userplug_inits:my_init)",
                               "scaled normal, my note"]
    assert ckpt["global_step"] == 4


def test_the_one_entry_point_group_is_the_same_string_in_both_readers():
    """``impulsevit.cli.extensions`` (plugin modules, read at start) keeps its own copy of the group name so the
    entry point imports no torch; it must be the group ``impulsevit.init.plugins`` reads init functions from."""
    from impulsevit.cli import extensions
    from impulsevit.init import plugins

    assert extensions.ENTRY_POINT_GROUP == plugins.ENTRY_POINT_GROUP == "impulsevit.plugins"



def _documented_plugin() -> str:
    """The example module of ``impulsevit/init/README.md`` ("One way to extend"), exactly as written there."""
    readme = (REPO / "impulsevit" / "init" / "README.md").read_text()
    section = readme[readme.index("Your own initializer is the same thing"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_plugin_works_through_the_cli_and_initialize(tmp_path, monkeypatch, capsys):
    """A package written from the README alone: ``initialize()`` after importing it, ``impulsevit init list
    --plugins`` and ``impulsevit fit --plugins`` (in this process, one training step) — the same weights each way."""
    from impulsevit.cli import main
    from impulsevit.init import registry

    code = _documented_plugin()
    assert "@register(" in code and "options=ScaledNormalOptions" in code
    package = tmp_path / "src" / "my_inits"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "scaled.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("IMPULSEVIT_PLUGINS", "")
    before = len(registry._REGISTRY)
    saved_env = dict(os.environ)
    try:
        # the command line: listed with its source, then trained with its options checked
        assert main(["init", "list", "--plugins", "my_inits.scaled"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("scaled_normal "))
        assert "registered" in row and "vit_like" in row and "registered by my_inits.scaled" in row
        assert main(tiny(tmp_path, "bad", "--plugins", "my_inits.scaled", "--model.init.method=scaled_normal",
                         '--model.init.options={"scal": 0.5}')) == 2
        assert "did you mean 'scale'?" in capsys.readouterr().err
        assert main(tiny(tmp_path, "docs", "--plugins", "my_inits.scaled", "--trainer.max_steps=1",
                         "--trainer.limit_val_batches=0", "--model.init.method=scaled_normal",
                         '--model.init.options={"scale": 0.5}')) == 0
        ckpt = torch.load(tmp_path / "docs" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        report = next(v for k, v in ckpt["callbacks"].items() if k.startswith("Initializer"))["report"]
        assert report["method"] == "scaled_normal" and report["family"] == "vit_like"
        assert report["options"] == {"scale": 0.5} and report["notes"] == ["scaled normal"]
        # Python: the module imported (here already, by --plugins), the method used like a built-in one
        import my_inits.scaled  # noqa: F401

        cli_model = ii.methods()["scaled_normal"]
        assert cli_model == ["vit_like"]
        import timm

        a = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, weight_init="skip")
        b = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, weight_init="skip")
        ra = ii.initialize(a, "scaled_normal", generator=3, scale=0.5)
        ii.initialize(b, "scaled_normal", generator=3, scale=0.5)
        assert ra.family == "vit_like" and ra.options == {"scale": 0.5}
        assert torch.equal(a.blocks[0].attn.qkv.weight, b.blocks[0].attn.qkv.weight)
        assert a.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.5 / 192**0.5, rel=0.1)
        with pytest.raises(ValueError, match=r"option 'scale' of init method 'scaled_normal' \(vit_like\) must be > 0"):
            ii.initialize(a, "scaled_normal", scale=0.0)
        with pytest.raises(ValueError, match="cannot be applied to Linear"):  # its own matches decides
            ii.initialize(torch.nn.Linear(2, 2), "scaled_normal")
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        del registry._REGISTRY[before:]
        for name in ("my_inits.scaled", "my_inits"):
            sys.modules.pop(name, None)


def test_register_without_options_is_deprecated_until_0_3_0():
    """The untyped-dict route: still dispatched (the options reach the handler as the dict given), with a warning."""
    from impulsevit.init import registry

    before = len(registry._REGISTRY)
    try:
        with pytest.warns(DeprecationWarning, match=r"without options= .* removed in impulsevit 0\.3\.0"):
            @registry.register("zz_untyped", family="zz", matches=lambda model: True)
            def zz(model, generator, options):
                return ii.InitResult(options=dict(options))

        assert ii.initialize(torch.nn.Linear(2, 2), "zz_untyped", anything=1).options == {"anything": 1}
    finally:
        del registry._REGISTRY[before:]
