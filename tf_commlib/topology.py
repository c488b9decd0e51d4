"""Cluster layout (m nodes x n ranks per node) and the Horovod process sets that go with it.

Ranks are numbered node-major: rank = node * n + local. Each node has an intra-node set (its n
ranks) and each local index j an inter-node set (rank j of every node), as HiTopKComm needs.
The real layout comes from Horovod's local/cross sizes (from Slurm's for ranks that srun started
without them, as an MPI build under ``srun --mpi=pmix``); ``topology="2x2"`` or the environment
variable TF_COMMLIB_TOPOLOGY overrides it so that one machine can emulate several nodes.
"""
import dataclasses
import os
import re

from tf_commlib import slurm_env

ENV_VAR = "TF_COMMLIB_TOPOLOGY"
_current = None


@dataclasses.dataclass(frozen=True)
class Topology:
    m: int                 # nodes
    n: int                 # ranks per node
    rank: int
    node: int              # this rank's node index, 0..m-1
    local: int             # this rank's index inside its node, 0..n-1
    intra_ranks: tuple     # the ranks of this rank's node
    inter_ranks: tuple     # the ranks with this rank's local index, one per node
    intra: object = dataclasses.field(repr=False, default=None)   # hvd ProcessSet
    inter: object = dataclasses.field(repr=False, default=None)   # hvd ProcessSet
    world: object = dataclasses.field(repr=False, default=None)   # hvd global process set

    @property
    def size(self):
        return self.m * self.n


def parse_layout(spec, size):
    """Parses 'MxN' and checks that M*N equals the world size."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(spec))
    if not match:
        raise ValueError(f"topology must look like 'MxN' (nodes x ranks per node), got {spec!r}")
    m, n = int(match.group(1)), int(match.group(2))
    if m < 1 or n < 1 or m * n != size:
        raise ValueError(f"topology {spec!r} has {m}x{n}={m * n} ranks but the world size is {size}")
    return m, n


def layout_sets(m, n):
    """Rank lists of the intra-node sets (one per node) and inter-node sets (one per local index)."""
    intra = [list(range(i * n, (i + 1) * n)) for i in range(m)]
    inter = [list(range(j, m * n, n)) for j in range(n)]
    return intra, inter


# An elastic job takes its layout from the hosts Horovod's driver gives it at each (re)start (m hosts x n
# slots, node-major, where every host has as many ranks) and adds its process sets once Horovod has started
# (dynamic process sets: the sizes are known only then). Stock Horovod 0.28.1 cannot: its Gloo aborts a
# surviving rank that holds any process set besides the global one when another rank dies ("terminate
# called after throwing an instance of 'gloo::IoException'", from the shutdown that negotiates each set's
# removal with the dead peer; Horovod issue 4021). scripts/build_horovod.sh applies the fix
# (third_party/horovod_patches/FINALIZE_PATCH); without it an elastic job runs as size x 1 with no process
# set but the global one (its one-rank sets answered in Python: primitives._alone).
FINALIZE_PATCH = "process-set-finalize-without-lost-peers.patch"


def horovod_survives_lost_peers():
    """Whether the installed Horovod carries FINALIZE_PATCH (listed in horovod/tf_commlib_patches.txt by
    scripts/build_horovod.sh), so that an elastic job's survivors can hold process sets."""
    import horovod

    try:
        with open(os.path.join(os.path.dirname(horovod.__file__), "tf_commlib_patches.txt")) as f:
            return any(line.split()[:1] == [FINALIZE_PATCH] for line in f)
    except OSError:
        return False


def elastic_job():
    """Whether this process is a rank of an elastic horovodrun job (HOROVOD_ELASTIC=1)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def _extra_sets(m, n, size):
    """The process sets of the layout besides the world: a set that spans the whole world is Horovod's
    global set; a one-rank set needs no collective partner but is kept so that code paths are the same
    on every layout."""
    intra_lists, inter_lists = layout_sets(m, n)
    return [r for r in intra_lists + inter_lists if len(r) != size]


def _env_int(names, default):
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    return default


def _fixed_set_class(hvd):
    """A Horovod ProcessSet whose size() and rank() are answered in Python from its ranks: once a
    node that finished first has shut Horovod down (which shuts it down on every rank), the ranks
    still in their last node-local exchange (shared memory) must not ask Horovod anything, or a
    correct run fails at exit with "Process set does not exist"."""
    class FixedProcessSet(hvd.ProcessSet):
        my_rank = None

        def size(self):
            return len(self.ranks)

        def rank(self):
            return self.ranks.index(self.my_rank) if self.my_rank in self.ranks else None

    return FixedProcessSet


def gpu_for_rank(local_rank, local_size, gpu_count):
    """The index of the GPU a rank uses (one GPU per rank, by its rank on its machine), or None on a
    machine without GPUs. A rank that sees one GPU uses it (Slurm's --gpus-per-task=1, or
    CUDA_VISIBLE_DEVICES set per rank); ValueError when several ranks would share the GPUs they see."""
    if gpu_count == 0:
        return None
    if gpu_count == 1:
        return 0
    if local_size > gpu_count:
        raise ValueError(f"pin_gpu: {local_size} ranks on this machine but {gpu_count} GPUs visible; start at most "
                         "one rank per GPU, or pass pin_gpu=False and place each rank yourself")
    return local_rank


def pin_gpu(local_rank, local_size):
    """Makes GPU ``gpu_for_rank`` the only one TensorFlow uses in this process, with memory growth (as
    Horovod's examples do); nothing on a machine without GPUs. Must run before TensorFlow has
    initialised its GPUs (before the first op): RuntimeError otherwise."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    index = gpu_for_rank(local_rank, local_size, len(gpus))
    if index is None:
        return None
    try:
        tf.config.set_visible_devices(gpus[index], "GPU")
        tf.config.experimental.set_memory_growth(gpus[index], True)
    except RuntimeError as e:
        raise RuntimeError("pin_gpu: TensorFlow initialised its GPUs before tf_commlib.init(); call init() "
                           f"before building models or running ops, or pass pin_gpu=False ({e})") from e
    return gpus[index]


_pin_gpu = pin_gpu


def init(topology=None, pin_gpu=True):
    """Initialises Horovod with the process sets of the layout and returns the Topology. pin_gpu: each
    rank uses one GPU, its local rank on its machine, with memory growth (none on a machine without
    GPUs; False leaves the placement to you)."""
    global _current
    import horovod.tensorflow as hvd

    if not isinstance(pin_gpu, bool):
        raise ValueError(f"pin_gpu must be True or False, got {pin_gpu!r}")

    spec = topology if topology is not None else os.environ.get(ENV_VAR)
    fixed = _fixed_set_class(hvd)
    if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") and not hvd.gloo_built():
        raise RuntimeError("this job was started by a Gloo launcher (horovodrun --gloo, tfc_apps.cluster_launch, "
                           "tfc_apps.slurm), but Horovod was built without Gloo: rebuild it with scripts/build_horovod.sh")
    elastic = elastic_job()
    sets_elastically = elastic and horovod_survives_lost_peers()
    if elastic:   # the ranks alive now, known once Horovod has started (above FINALIZE_PATCH)
        if spec:
            raise ValueError(f"topology={spec!r} (or ${ENV_VAR}) cannot fix the layout of an elastic job: its "
                             "ranks are those on the hosts Horovod's discovery script lists, which change")
        hvd.init(process_sets="dynamic" if sets_elastically else None)
        size, step = hvd.size(), None
        m, n = (_elastic_layout(hvd) if sets_elastically else (size, 1))
    else:
        size = _env_int(["HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE"], 0)
        step = None if size else slurm_env.step_layout()   # (size, tasks per node) of an srun step
        size = size or (step[0] if step else 1)
        if spec:
            m, n = parse_layout(spec, size)
        else:
            n = _env_int(["HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"], max(step[1]) if step else size)
            if size % n:
                raise ValueError(f"world size {size} is not a multiple of the local size {n}: "
                                 "tf_commlib needs the same number of ranks on every node")
            m = size // n
    intra_lists, inter_lists = layout_sets(m, n)
    extra = _extra_sets(m, n, size)
    sets = [fixed(r) for r in extra]
    if not elastic:
        hvd.init(process_sets=sets)
    elif sets_elastically:
        for s in sets:   # a collective each, in the same order on every rank
            hvd.add_process_set(s)
    slurm_env.exit_notice_at_exit()
    if hvd.size() != size:
        hint = ("; under srun, start Gloo ranks with `python -m tfc_apps.slurm -- CMD` (MPI builds: "
                "srun --mpi=pmix)") if step else ""
        raise RuntimeError(f"Horovod reports {hvd.size()} ranks, expected {size}{hint}")
    rank = hvd.rank()
    if pin_gpu:
        _pin_gpu(hvd.local_rank(), hvd.local_size())
    if not spec and not elastic and (hvd.local_rank() != rank % n or hvd.cross_rank() != rank // n):
        raise RuntimeError("tf_commlib needs node-major rank numbering (rank = node * n + local); "
                           f"rank {rank} has local rank {hvd.local_rank()}, cross rank {hvd.cross_rank()}")
    node, local = divmod(rank, n)
    world = fixed(list(range(size)))
    world.process_set_id = hvd.global_process_set.process_set_id
    for s in sets + [world]:
        s.my_rank = rank
    by_ranks = {tuple(r): s for r, s in zip(extra, sets)}

    def as_set(ranks):
        return by_ranks.get(tuple(ranks), world)

    _current = Topology(m=m, n=n, rank=rank, node=node, local=local,
                        intra_ranks=tuple(intra_lists[node]), inter_ranks=tuple(inter_lists[local]),
                        intra=as_set(intra_lists[node]), inter=as_set(inter_lists[local]),
                        world=world)
    return _current


def _elastic_layout(hvd):
    """(m, n) of an elastic job's ranks now: its hosts x their slots where every host has as many ranks,
    numbered node-major (Horovod's driver numbers them host by host), else size x 1. Agreed by every rank
    (an allreduce), since each then adds the layout's process sets."""
    import tensorflow as tf

    size, n, rank = hvd.size(), hvd.local_size(), hvd.rank()
    fits = size % n == 0 and hvd.local_rank() == rank % n and hvd.cross_rank() == rank // n
    agreed = hvd.allreduce(tf.constant([int(fits), n, -n], tf.int64), op=hvd.Min, name="tf_commlib_elastic_layout")
    fits, low, high = bool(agreed[0]), int(agreed[1]), -int(agreed[2])
    return (size // n, n) if fits and low == high else (size, 1)


def topology():
    """The Topology set up by init(); raises if init() has not been called."""
    if _current is None:
        raise RuntimeError("tf_commlib.init() has not been called")
    return _current
