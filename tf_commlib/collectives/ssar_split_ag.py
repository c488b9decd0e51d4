"""SSAR_Split_allgather (renggli2019 §5.3.2): the index space is split into P ranges, every rank
sends each slice of its sparse stream to the range's owner, the owners sum them, and a sparse
allgather gives every rank the result (sparcml.py has the rest, the value codec included)."""
from tf_commlib import primitives as P
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives import sparcml as S
from tf_commlib.collectives.interface import Collective


def reduce_streams(stream, d, topo, ctx, wire):
    owned = S.split_reduce(S.fold_in(stream, topo.world, wire), d, topo.world, wire)
    owned = wire.round(owned, keep=True)   # the owner alone holds its slice
    return S.densify(wire.receive(P.allgather(wire.send(owned), topo.world)), d)


def check_options(options):
    S.check_codec(options, "ssar_split_ag")


ssar_split_ag = S.sparse_collective(reduce_streams, lambda: COLLECTIVE)
time, sent_bytes, actual_bytes = S.cost("split")

COLLECTIVE = Collective("ssar_split_ag", ssar_split_ag, time, sent_bytes, sparse=True,
                        residual_size=naive_ag.residual_size,
                        residual_to_input=naive_ag.residual_to_input, actual_bytes=actual_bytes,
                        options={"value_codec": "none"}, check_options=check_options)
