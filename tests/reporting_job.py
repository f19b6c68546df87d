"""A small stand-in training process for tests that need jobs reporting to a real controller.

Run under ``adloader run``: it reads ADLOADER_JOB_ID / ADLOADER_SOCKET like the loader
does, and each step really loads (reads and hashes a chunk of a file on disk, in this
process) and then "computes" by sleeping (GPU-emulated). It sends the loader's
cumulative counters in a protocol.Report about every ``--report-every`` seconds and
runs until killed, ``--seconds`` pass or ``--stop-file`` exists. Finishing, it sends a
last report with its final counters and prints the samples it trained on.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

from adloader import env, paths, protocol
from adloader.client import ControllerClient


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--compute-s", type=float, default=0.02, help="emulated GPU time per step")
    parser.add_argument("--load-bytes", type=int, default=256 * 1024, help="bytes read and hashed per step")
    parser.add_argument("--report-every", type=float, default=0.2)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--stop-file", type=Path, default=None, help="finish (exit 0) once this file exists")
    parser.add_argument("--unmanaged-reason", default=None,
                        help="report as a rank whose loader is not adloader's, for this reason (as a fallback does)")
    args = parser.parse_args()
    job_id = env.job_id()
    if job_id is None:
        print("reporting_job: ADLOADER_JOB_ID is unset: run me under `adloader run`", file=sys.stderr)
        return 2
    client = ControllerClient(paths.default_socket_path())
    samples = batches = read_bytes = 0
    data_wait = compute = 0.0
    with tempfile.TemporaryFile() as data:
        data.write(os.urandom(args.load_bytes))
        deadline = time.monotonic() + args.seconds
        next_report = 0.0
        while time.monotonic() < deadline and not (args.stop_file and args.stop_file.exists()):
            started = time.monotonic()
            data.seek(0)
            chunk = data.read()
            hashlib.sha256(chunk * 4).digest()
            read_bytes += len(chunk)
            loaded = time.monotonic()
            time.sleep(args.compute_s)
            data_wait += loaded - started
            compute += time.monotonic() - loaded
            samples += args.batch_size
            batches += 1
            if time.monotonic() >= next_report:
                client.request(_report(job_id, args.batch_size, samples, batches, data_wait, compute, read_bytes,
                                       args.unmanaged_reason))
                next_report = time.monotonic() + args.report_every
    client.request(_report(job_id, args.batch_size, samples, batches, data_wait, compute, read_bytes,
                           args.unmanaged_reason))
    print(f"samples={samples}", flush=True)
    return 0


def _report(job_id: str, batch_size: int, samples: int, batches: int, data_wait: float, compute: float,
            read_bytes: int, unmanaged_reason: str | None = None) -> protocol.Report:
    return protocol.Report(
        job_id=job_id, batch_size=batch_size, samples=samples, batches=batches, data_wait_s=data_wait,
        compute_s=compute, worker_cpu_s=time.process_time(), read_bytes=read_bytes, num_workers=1,
        unmanaged_reason=unmanaged_reason,
    )


if __name__ == "__main__":
    sys.exit(main())
