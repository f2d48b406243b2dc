"""How the launcher of a Slurm sweep learns that a job ended, on a cluster with or without accounting.

submitit's launcher waits for each job's result file and asks `sacct` for the state of the jobs
that have none yet. On a cluster that keeps no accounting (AccountingStorageType=none: small
clusters, the tests' cluster) `sacct` fails, every job stays UNKNOWN, and a job that ended without
writing its result (killed by the OOM killer, SIGKILL after KillWait, its node lost) is waited for
forever, with a warning on every poll. `JobStates` asks `scontrol show job` instead once `sacct`
has said accounting is disabled (once, in the log). slurmctld keeps an ended job for MinJobAge
(300 s by default); a job it no longer knows has ended too (`GONE`). Either way submitit then finds
no result and fails the job with the tail of its log, and the sweep goes on to its end.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

logger = logging.getLogger(__name__)

# What `sacct` says where the cluster keeps no accounting.
NO_ACCOUNTING = "accounting storage is disabled"
# What `scontrol show job` says of a job slurmctld no longer knows.
UNKNOWN_JOB = "Invalid job id specified"
# The state given to a job slurmctld has forgotten (past MinJobAge): ended, its state unrecorded.
GONE = "GONE"
_TASKS = re.compile(r"^(\d+)(?:-(\d+))?(?::\d+)?$")


class JobStates(SlurmInfoWatcher):
    """submitit's Slurm watcher: `sacct` while the cluster answers it, `scontrol` where it keeps no
    accounting."""

    def __init__(self, delay_s: int = 600) -> None:
        super().__init__(delay_s)
        self.accounting = True

    def update(self) -> None:
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        if self.accounting:
            try:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                logger.warning("sacct failed, job states not updated: %s", err)
            else:
                if proc.returncode == 0:
                    self._info_dict.update(self.read_info(proc.stdout))
                elif NO_ACCOUNTING in proc.stderr:
                    self.accounting = False
                    logger.info("this Slurm cluster keeps no accounting (sacct: %s); job states come from scontrol", proc.stderr.strip()[:200])
                else:
                    logger.warning("sacct failed (%d), job states not updated: %s", proc.returncode, proc.stderr.strip()[:500])
        if not self.accounting:
            for array_id in sorted({job.split("_")[0] for job in self._registered - self._finished}):
                self._info_dict.update(self._from_scontrol(array_id))
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:  # as submitit's own update: ended states are kept
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)

    def _from_scontrol(self, array_id: str) -> dict[str, dict[str, str]]:
        """{job id: {"JobID", "State", "NodeList"}} for the registered jobs of `array_id` (a job or
        an array); those slurmctld no longer knows are GONE. A failed call changes nothing."""
        try:
            proc = subprocess.run(["scontrol", "-o", "show", "job", array_id], capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            logger.warning("scontrol show job %s failed: %s", array_id, err)
            return {}
        mine = {job for job in self._registered - self._finished if job.split("_")[0] == array_id}
        if proc.returncode != 0:
            if UNKNOWN_JOB in proc.stderr:
                return {job: {"JobID": job, "State": GONE, "NodeList": ""} for job in mine}
            logger.warning("scontrol show job %s failed (%d): %s", array_id, proc.returncode, proc.stderr.strip()[:500])
            return {}
        states: dict[str, dict[str, str]] = {}
        for line in proc.stdout.splitlines():
            fields = dict(word.partition("=")[::2] for word in line.split())
            info = {"State": fields.get("JobState", "UNKNOWN"), "NodeList": fields.get("NodeList", "")}
            tasks = fields.get("ArrayTaskId")
            if tasks is None or tasks == "N/A":
                states[fields.get("JobId", array_id)] = {"JobID": fields.get("JobId", array_id), **info}
                continue
            for part in tasks.split("%")[0].split(","):  # pending tasks as ranges: 2-5,7%16
                match = _TASKS.match(part)
                if match is None:
                    continue
                first, last = int(match.group(1)), int(match.group(2) or match.group(1))
                for task in range(first, last + 1):
                    states[f"{array_id}_{task}"] = {"JobID": f"{array_id}_{task}", **info}
        # A task slurmctld shows no more while it still knows the array: ended and forgotten.
        states.update({job: {"JobID": job, "State": GONE, "NodeList": ""} for job in mine - states.keys() if "_" in job})
        return states


def watch_jobs() -> None:
    """From now on in this process, submitit's Slurm jobs learn their states through `JobStates`."""
    if not isinstance(SlurmJob.watcher, JobStates):
        SlurmJob.watcher = JobStates(delay_s=600)
