"""Where the main job and the end-to-end benchmark run: the emulated M x N cluster with a shaped
inter-node link (scripts/emulate_cluster.sh + tfc_apps.cluster_launch) when this machine allows
it (root, `ip`, `tc`, network namespaces), else the same layout on 127.0.0.1 without shaping, with
the reason said. One user of the emulated cluster at a time: /tmp/tf_commlib_cluster.lock."""
import contextlib
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from tfc_apps.local_run import cluster_launch_prefix

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "emulate_cluster.sh"
LOCK = "/tmp/tf_commlib_cluster.lock"


def unavailable():
    """None when the emulated cluster can be built here, else why not."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tc qdiscs need CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return f"`{tool}` not found (scripts/install_apt.sh installs iproute2)"
    if not SCRIPT.exists():
        return f"{SCRIPT} not found (run from a checkout of tf_commlib)"
    return None


@contextlib.contextmanager
def _locked():
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def unshaped(m, n):
    """Yields (command prefix that starts M*N ranks as M nodes on 127.0.0.1, description): the same
    layout as launcher() with no shaping, the reference for it."""
    yield cluster_launch_prefix(local=m, np_per_node=n), f"{m}x{n} on 127.0.0.1, unshaped"


@contextlib.contextmanager
def launcher(m, n, inter_mbit):
    """Yields (command prefix that starts M*N ranks of a command, description of the link). The
    emulated cluster is brought up before and always taken down after."""
    local = cluster_launch_prefix(local=m, np_per_node=n)
    why = unavailable()
    if why:
        yield local, f"{m}x{n} on 127.0.0.1, link NOT shaped: the emulated cluster needs {why}"
        return
    with _locked():
        up = subprocess.run(["bash", str(SCRIPT), "up", str(m), str(n), "--inter-mbit", str(inter_mbit)],
                            capture_output=True, text=True)
        try:
            if up.returncode:
                reason = (up.stderr or up.stdout).strip().splitlines()[-1:] or ["?"]
                yield local, f"{m}x{n} on 127.0.0.1, link NOT shaped: emulate_cluster.sh up failed: {reason[0]}"
            else:
                yield (cluster_launch_prefix(),
                       f"emulated {m}x{n} cluster, inter-node link shaped to {inter_mbit} Mbit/s")
        finally:
            subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, text=True)
