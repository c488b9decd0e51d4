"""``horovodrun`` as the local jobs run it: ``python -m tfc_apps.horovodrun -np N -H localhost:N
--gloo CMD``, the same launcher without the probe it makes before every launch, a process that
imports TensorFlow only to ask whether Horovod was built with Gloo (3-4 s a launch on two cores).
Each rank asks that itself in tf_commlib.init, where TensorFlow is loaded anyway.

With ``--host-discovery-script`` (elastic mode) the script is run once before the launch and its
output checked: one ``host:slots`` a line (``host`` alone with ``--slots-per-host``). Horovod takes any
line for a host name and fails later with a TypeError; here a bad line exits with status 2, naming it."""
import re
import subprocess
import sys

from horovod.runner import launch

HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")   # a host name or IPv4 address
DISCOVERY_TIMEOUT_S = 60


def discovery_error(script, slots_per_host, timeout=DISCOVERY_TIMEOUT_S, env=None):
    """Why the discovery script's output is not a host list Horovod can use, or None."""
    try:
        done = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"--host-discovery-script {script!r} did not finish within {timeout} s"
    if done.returncode != 0:
        return (f"--host-discovery-script {script!r} exited with status {done.returncode}: "
                f"{done.stderr.strip()[-300:]}")
    for number, line in enumerate(done.stdout.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        host, sep, slots = line.partition(":")
        if not HOST.fullmatch(host) or (sep and not re.fullmatch(r"[1-9][0-9]*", slots)) or \
                (not sep and slots_per_host is None):
            need = "" if sep or not HOST.fullmatch(host) else " (no slots: give --slots-per-host)"
            return (f"--host-discovery-script {script!r} printed {line[:80]!r} on line {number}: expected "
                    f"one host:slots a line, e.g. node1:4{need}")
    return None


def main():
    launch.gloo_built = lambda verbose=False: True
    args = launch.parse_args()
    if args.host_discovery_script:
        error = discovery_error(args.host_discovery_script, args.slots)
        if error:
            print(f"tfc_apps.horovodrun: {error}", file=sys.stderr)
            return 2
    return launch.run_commandline()


if __name__ == "__main__":
    sys.exit(main())
