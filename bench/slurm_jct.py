"""Slurm jobs' completion times, submit to end: what mean JCT is on a Slurm node.

``sacct`` gives them where Slurm keeps accounting (slurmdbd). Without it (``AccountingStorageType=
accounting_storage/none``, as the tests' one-node cluster: Slurm 22.05's sacct then answers "Slurm
accounting storage is disabled" and has no other source), Slurm's job completion plugin
``jobcomp/filetxt`` writes the same times, one line per finished job, to ``JobCompLoc``; they are
read from there. Commands run through an injectable runner.
"""
from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Sequence

from adloader.errors import AdloaderError

SACCT_FIELDS = "JobID,JobName,Submit,Start,End,State"
ACCOUNTING_DISABLED = "accounting storage is disabled"


class SlurmTimesError(AdloaderError):
    """No completion times could be read for the jobs asked for."""


@dataclass(frozen=True)
class JobTimes:
    job_id: str
    name: str
    submit: datetime
    start: datetime
    end: datetime
    state: str

    @property
    def jct_s(self) -> float:
        """Completion time: submission to end, the wait for GPUs included."""
        return (self.end - self.submit).total_seconds()

    @property
    def waited_s(self) -> float:
        return (self.start - self.submit).total_seconds()


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:  # "Unknown", "None": not started or not ended
        return None


def parse_sacct(text: str) -> list[JobTimes]:
    """``sacct --noheader --parsable2 --allocations --format=SACCT_FIELDS`` output; jobs not yet ended are left out."""
    jobs = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 6:
            continue
        job_id, name, submit, start, end, state = fields
        times = [_time(value) for value in (submit, start, end)]
        if all(times):
            jobs.append(JobTimes(job_id.strip(), name, *times, state.strip()))  # type: ignore[arg-type]
    return jobs


def parse_jobcomp(text: str) -> list[JobTimes]:
    """The lines of a ``jobcomp/filetxt`` file (``JobId=7 ... Name=x JobState=COMPLETED ...
    StartTime=... EndTime=... SubmitTime=...``); lines missing a time are left out."""
    jobs = []
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        times = [_time(fields.get(key, "")) for key in ("SubmitTime", "StartTime", "EndTime")]
        if "JobId" in fields and all(times):
            jobs.append(JobTimes(fields["JobId"], fields.get("Name", ""), *times,  # type: ignore[arg-type]
                                 fields.get("JobState", "")))
    return jobs


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def completion_times(job_ids: Iterable[int | str], jobcomp: Path | None = None, runner: Runner = _run
                     ) -> tuple[list[JobTimes], str]:
    """The ended jobs of ``job_ids`` and where their times came from ("sacct" or the jobcomp file)."""
    wanted = {str(job_id) for job_id in job_ids}
    result = runner(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={','.join(sorted(wanted))}",
                     f"--format={SACCT_FIELDS}"])
    if result.returncode == 0:
        return [job for job in parse_sacct(result.stdout) if job.job_id in wanted], "sacct"
    if ACCOUNTING_DISABLED not in result.stderr or jobcomp is None:
        raise SlurmTimesError(f"sacct failed ({result.returncode}): {result.stderr.strip()}; without slurmdbd, "
                              "set JobCompType=jobcomp/filetxt and JobCompLoc=FILE in slurm.conf and read FILE")
    try:
        text = jobcomp.read_text()
    except OSError as exc:
        raise SlurmTimesError(f"cannot read the job completion file {jobcomp} ({exc.strerror})") from None
    return [job for job in parse_jobcomp(text) if job.job_id in wanted], str(jobcomp)


def mean_jct_s(jobs: Sequence[JobTimes]) -> float:
    if not jobs:
        raise SlurmTimesError("no ended job to take a mean completion time of")
    return statistics.fmean(job.jct_s for job in jobs)
