"""SLURM support: batch-script generation (:mod:`.sbatch`), ``impulsevit submit`` (:mod:`.submit`), per-user
defaults (:mod:`.slurm_config`) and the job state recorded in the run directory (:mod:`.events`).

Never imports :mod:`impulsevit.init`.
"""
