"""SSAR_Split_allgather (renggli2019 §5.3.2): the index space is split into P ranges, every rank
sends each slice of its sparse stream to the range's owner, the owners sum them, and a sparse
allgather gives every rank the result (sparcml.py has the rest, the value codec included)."""
from tf_commlib import primitives
from tf_commlib.collectives import sparcml


def reduce_streams(stream, d, topo, ctx, wire):
    owned = sparcml.split_reduce(sparcml.fold_in(stream, topo.world, wire), d, topo.world, wire)
    owned = wire.round(owned, keep=True)   # the owner alone holds its slice
    return sparcml.densify(wire.receive(primitives.allgather(wire.send(owned), topo.world)), d)


COLLECTIVE = sparcml.collective("ssar_split_ag", reduce_streams, "split")
ssar_split_ag = COLLECTIVE.fn
