"""The Slurm commands a job calls (``srun``, ``scontrol``, ``squeue``, ``sbatch``,
``scancel``, ``sacct``, ``sinfo``), with Slurm's options, output formats and exit codes,
speaking to gpufleet's API.

``python -m gpufleet.slurm NAME ARGS...`` runs ``gpufleet.slurm.NAME.main(ARGS)``
(``__main__``). In a job the agent puts launchers of that on ``PATH`` (the job's own
credential in ``GPUFLEET_TOKEN``); on a login node ``gpufleet slurm install DIR`` writes
the same launchers for a user who wants Slurm's commands.

Every command module imports only what it needs: ``scontrol show hostnames`` runs at
every task start and asks no server; the others read the server's JSON as it comes
(``_common``), without the CLI's Typer or the API's pydantic models; ``sbatch`` and
``sacct`` are ``gpufleet submit`` and ``gpufleet history`` (their options are Slurm's
already) and pay for Typer.
"""

COMMANDS = ("srun", "scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo")
"""The commands, as the launchers and ``gpufleet slurm install`` name them."""

__all__ = ["COMMANDS"]
