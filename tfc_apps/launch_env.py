"""What a launcher gives the Horovod (Gloo) ranks it starts without horovodrun: Horovod's rendezvous
server listening on one address, and the HOROVOD_* variables of one rank. Shared by
tfc_apps.cluster_launch (emulated cluster) and tfc_apps.slurm (Slurm jobs)."""
import socket

from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer, RendezvousServer
from horovod.runner.util.threads import in_thread


class BoundRendezvousServer(RendezvousServer):
    """Horovod's rendezvous server, listening on one address instead of all of them."""

    def __init__(self, address, verbose=0):
        super().__init__(verbose)
        self.address = address

    def start(self, handler_cls=RendezvousHandler):
        self._httpd = RendezvousHTTPServer((self.address, 0), handler_cls, self._verbose)
        self._listen_thread = in_thread(target=self._httpd.serve_forever)
        return self._httpd.server_address[1]

    def stop(self):
        super().stop()
        self._httpd.server_close()

    def scope(self, name):
        """The keys and values ranks PUT under /name/ so far, in the order they arrived."""
        with self._httpd.cache_lock:
            return dict(self._httpd.cache.get(name, {}))


def rank_env(slot, server_ip, port, iface):
    """HOROVOD_* variables of the rank in `slot` (a Horovod SlotInfo), as horovodrun --gloo sets them."""
    env = {**create_run_env_vars(server_ip, [iface], port), **create_slot_env_vars(slot)}
    return {k: str(v) for k, v in env.items()}


def source_address(address):
    """This machine's IPv4 address that packets to `address` leave from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))   # no packet is sent: this only asks the routing table
        return s.getsockname()[0]


def iface_towards(address):
    """Name of this machine's network interface that packets to `address` leave from."""
    import psutil

    local = source_address(address)
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    if local.startswith("127."):
        return "lo"
    raise RuntimeError(f"no network interface holds {local}, the address that reaches {address}")
