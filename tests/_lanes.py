"""The fast local lane: ``pytest -m "not slow"`` (README, "Tests"). A test is ``slow`` when it carries the mark itself
or lives in one of :data:`SLOW_FILES`: files whose tests train through the CLI, start processes (DDP ranks, SLURM
jobs, converters), convert ``.beton`` files or build trained fixtures — seconds to minutes each on 2 CPU cores. What
is left (initializers, layers and compat rules, config and data units, recipes, safe loading, the module-path
aliases) runs in under 5 minutes with ``-n 2``. The CI runs everything (``scripts/test.sh``)."""

SLOW_FILES = frozenset({
    # training through the CLI / Lightning, in-process or as a subprocess
    "callbacks/test_attention_evolution.py", "callbacks/test_console.py", "callbacks/test_initializer.py",
    "callbacks/test_job_logs.py", "cli/test_transfer.py", "faults/test_pretrained_faults.py",
    "callbacks/test_standard.py", "callbacks/test_tensorboard.py", "cli/test_cli.py",
    "cli/test_cli_failures.py", "cli/test_extensions.py", "e2e/test_exact_resume.py", "e2e/test_resume.py",
    "house/test_one_source.py", "init/test_plugins.py", "run/test_runs.py", "tools/test_export.py",
    "training/test_family_fit.py", "training/test_module.py", "training/test_trackers.py",
    "data/test_data_download_preview.py", "test_memory.py",
    # processes: DDP / FSDP ranks, torchrun, SLURM, a bare machine, a wheel, docker
    "training/test_compile.py", "training/test_ddp.py", "training/test_fsdp.py", "init/test_sharded.py",
    "e2e/test_torchrun.py", "cluster/test_slurm.py", "study/test_study.py", "cluster/test_submit_convert.py",
    "house/test_gpu_check.py", "training/test_sync_free.py", "house/test_wheel.py", "house/test_docker.py",
    "house/test_pins.py",
    # FFCV conversion and loading
    "data/test_convert.py", "data/test_convert_lock.py", "data/test_convert_split.py",
    "data/test_disk_and_beton_failures.py", "data/test_ffcv_datamodule.py", "data/test_ffcv_loader.py",
    "data/test_ffcv_pixels.py", "data/test_device_resample.py", "data/test_loader_state.py",
    # tests/faults/: every one runs the real command in its own session
    "faults/test_children.py", "faults/test_hostile_files.py", "faults/test_mismatches.py",
    "faults/test_names_and_outputs.py", "faults/test_trackers.py", "faults/test_user_mistakes.py",
})
"""Test files (relative to ``tests/``) whose every test is ``slow``."""
