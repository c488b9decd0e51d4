"""An elastic horovodrun job on this machine, as the tests and ``bench faults`` run one: two host names,
``localhost`` and this machine's own name, 2 slots each (Horovod starts ranks without ssh on a host whose
address is one of this machine's; 127.0.0.2 is not), listed by a discovery script that prints a file
the caller rewrites. ``drop_second_host`` (or ``drop_host``) takes a host off the list and SIGKILLs its ranks,
as a preempted node; ``list_both`` lists it again. The job's output is read by a thread as it comes."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tfc_apps import local_run

SLOTS = 2   # ranks per host name
# a host whose ranks failed is taken back after 1-2 s (Horovod's default: never)
COOLDOWN = ("--blacklist-cooldown-range", "1", "2")


class ElasticJob:
    """``python argv`` under ``horovodrun -np 4 --min-np 2 --max-np 4 --host-discovery-script`` on
    localhost:2 and this machine's name:2, in folder ``work`` (created: the hosts file, the script)."""

    def __init__(self, work, argv, env=None, cwd=None):
        os.makedirs(work, exist_ok=True)
        self.hosts = os.path.join(work, "hosts")
        self.second = socket.gethostname()
        self.list_both()
        script = os.path.join(work, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.hosts}\n")
        os.chmod(script, 0o700)
        n = 2 * SLOTS
        launcher = [sys.executable, "-m", "tfc_apps.horovodrun", "-np", str(n), "--min-np", str(SLOTS),
                    "--max-np", str(n), "--host-discovery-script", script, *COOLDOWN, "--gloo"]
        self.proc = local_run.start(argv, launcher=launcher, cwd=cwd or local_run.ROOT,
                                    env={"CUDA_VISIBLE_DEVICES": "", **(env or {})})
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
                                       daemon=True)
        self.reader.start()

    def _write_hosts(self, text):
        tmp = self.hosts + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.hosts)   # the script never reads half a list

    def list_both(self):
        """Both hosts in the discovery script's list; the time."""
        self._write_hosts(f"localhost:{SLOTS}\n{self.second}:{SLOTS}\n")
        return time.time()

    def drop_second_host(self):
        """The second host off the list, then its ranks SIGKILLed; the time of the kill."""
        return self.drop_host(self.second)

    def drop_host(self, host):
        """``host`` (``localhost`` or the second host's name) off the list, then its ranks SIGKILLed; the
        time of the kill."""
        kept = {"localhost": self.second, self.second: "localhost"}.get(host)
        if kept is None:
            raise ValueError(f"host must be 'localhost' or {self.second!r}, got {host!r}")
        self._write_hosts(f"{kept}:{SLOTS}\n")
        lost = [p for p in local_run.ranks_of(self.proc) if p.environ().get("HOROVOD_HOSTNAME") == host]
        if not lost:
            raise RuntimeError(f"found no rank of host {host!r}")
        killed = time.time()
        for p in lost:
            os.kill(p.pid, signal.SIGKILL)
        return killed

    def log(self, tail=6000):
        return "".join(self.lines)[-tail:]

    def line(self, text):
        """The first output line holding text, or None."""
        return next((line for line in list(self.lines) if text in line), None)

    def wait_for(self, what, found, timeout):
        """The first result of found() that is not None, polled until the timeout; else the job is
        stopped and TimeoutError names what did not come."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            result = found()
            if result is not None:
                return result
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"elastic job: no {what} within {timeout} s (exit {self.proc.returncode}):\n{self.log()}")

    def finish(self, timeout):
        """Waits for the job to end; its exit status (TimeoutError, the job stopped, after timeout s)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(f"elastic job timed out after {timeout} s:\n{self.log()}") from None
        self.reader.join(10)
        return self.proc.returncode

    def stop(self):
        if self.proc.poll() is None:
            local_run.kill_ranks(self.proc)
