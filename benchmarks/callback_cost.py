"""Per-step cost of each standard callback of ``impulsevit fit``, measured by Lightning's own ``SimpleProfiler``.

One ``impulsevit fit`` run (the real CLI, in-process) on the same model, data, optimizer and schedule as
``benchmarks/loop_overhead.py``, with ``--trainer.profiler=simple``: Lightning times every hook of every callback
(``[Callback]<state key>.<hook>``) and of the module. For each callback, the time of its per-step hooks
(``on_train_batch_start/end``, ``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``,
``on_before_zero_grad``) is summed over the run and divided by the number of optimizer steps, and compared with the
whole training step (``run_training_batch``). Hooks that run once per epoch or per fit (the initializer, the
attention probe, checkpoint writing) are outside the table: they are not a per-step cost.

The profiler itself adds a few microseconds per hook call, so the table is an upper bound. The last line is
``ratio: X`` = the profiled training step / the same step minus every callback's per-step hooks (X = 1.01: the
callbacks cost 1 % of a step). The contender without callbacks is not run separately: removing the standard callbacks
would also remove what they guard (the NaN check, the per-batch RNG streams), which ``benchmarks/loop_overhead.py``
compares against a plain loop as a whole.

Run: ``python benchmarks/callback_cost.py [--steps 60 --batch 32 --threads 2] [--smoke]``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop_overhead import impulsevit_fit_cli  # noqa: E402

PER_STEP_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
                  "on_before_optimizer_step", "on_before_zero_grad")


def hook_table(recorded: dict[str, list[float]], steps: int) -> list[tuple[str, float]]:
    """``[(callback name, µs per step)]`` from a ``SimpleProfiler``'s ``recorded_durations``, largest first.

    Args:
        recorded: ``{action name: [seconds, ...]}``; callback actions are ``[Callback]<state key>.<hook>``.
        steps: optimizer steps of the run (the divisor).
    """
    per: dict[str, float] = collections.defaultdict(float)
    for action, durations in recorded.items():
        if not action.startswith("[Callback]"):
            continue
        name, _, hook = action[len("[Callback]"):].rpartition(".")
        if hook in PER_STEP_HOOKS:
            per[name.split("{")[0]] += sum(durations)
    return sorted(((k, v / steps * 1e6) for k, v in per.items()), key=lambda kv: -kv[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = ap.parse_args()
    if args.smoke:  # 6 steps of 4 images, one thread
        args.steps, args.batch, args.threads = 6, 4, 1
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cli = impulsevit_fit_cli(args.steps, args.batch, 5, Path(tmp) / "profiled", ["--trainer.profiler=simple"])
        recorded = cli.trainer.profiler.recorded_durations
        steps = cli.trainer.global_step
        step_us = sum(recorded["run_training_batch"]) / steps * 1e6
        rows = hook_table(recorded, steps)
    print(f"{steps} steps, batch {args.batch}, threads {args.threads}; whole training step {step_us:,.0f} µs")
    print(f"{'callback':<28} {'µs/step':>9} {'% of step':>9}")
    for name, us in rows:
        print(f"{name:<28} {us:>9,.0f} {100 * us / step_us:>8.2f}%")
    total = sum(us for _, us in rows)
    print(f"{'all callbacks':<28} {total:>9,.0f} {100 * total / step_us:>8.2f}%")
    print(f"ratio: {step_us / (step_us - total):.3f}")


if __name__ == "__main__":
    main()
