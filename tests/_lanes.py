"""The fast local lane: ``pytest -m "not slow"`` (README, "Tests"). A test is ``slow`` when it carries the mark itself
or lives in one of :data:`SLOW_FILES`: files whose tests train through the CLI, start processes (DDP ranks, SLURM
jobs, converters), convert ``.beton`` files or build trained fixtures — seconds to minutes each on 2 CPU cores. What
is left (initializers, layers and compat rules, config and data units, recipes, safe loading, the module-path
aliases) runs in under 5 minutes with ``-n 2``. The CI runs everything (``scripts/test.sh``)."""

SLOW_FILES = frozenset({
    # training through the CLI / Lightning, in-process or as a subprocess
    "test_attention_evolution.py", "test_cli.py", "test_cli_failures.py", "test_console.py", "test_exact_resume.py",
    "test_export.py", "test_extension.py", "test_family_fit.py", "test_initializer_callback.py", "test_job_logs.py",
    "test_module.py", "test_one_source.py", "test_resume.py", "test_runs_table.py", "test_standard_callbacks.py",
    "test_tensorboard.py", "test_trackers.py", "test_data_download_preview.py", "test_memory.py",
    "test_init_plugins.py",
    # processes: DDP / FSDP ranks, torchrun, SLURM, a bare machine, a wheel, docker
    "test_compile.py", "test_ddp.py", "test_fsdp.py", "test_init_fsdp.py", "test_torchrun.py", "test_slurm.py",
    "test_study.py", "test_submit_convert.py", "test_gpu_check.py", "test_sync_free.py", "test_wheel.py",
    "test_docker.py", "test_pins.py",
    # FFCV conversion and loading
    "test_convert.py", "test_convert_lock.py", "test_convert_split.py", "test_disk_and_beton_failures.py",
    "test_ffcv_datamodule.py", "test_ffcv_loader.py", "test_ffcv_pixels.py", "test_device_resample.py",
    "test_loader_state.py",
    # tests/faults/: every one runs the real command in its own session
    "faults/test_children.py", "faults/test_hostile_files.py", "faults/test_mismatches.py",
    "faults/test_names_and_outputs.py", "faults/test_trackers.py", "faults/test_user_mistakes.py",
})
"""Test files (relative to ``tests/``) whose every test is ``slow``."""
