"""SSAR_Recursive_double (renggli2019 §5.3.1): log2(P) rounds, in round t each rank exchanges its
whole sparse stream with the rank at distance 2^t and merges the two (sparcml.py has the streams,
the folding of non-power-of-two P, the summation order, the value codec and the cost)."""
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives import sparcml as S
from tf_commlib.collectives.interface import Collective


def reduce_streams(stream, d, topo, ctx, wire):
    return S.densify(S.recursive_double(S.fold_in(stream, topo.world, wire), topo.world, wire), d)


def check_options(options):
    S.check_codec(options, "ssar_rd")


ssar_rd = S.sparse_collective(reduce_streams, lambda: COLLECTIVE)
time, sent_bytes, actual_bytes = S.cost("rd")

COLLECTIVE = Collective("ssar_rd", ssar_rd, time, sent_bytes, sparse=True,
                        residual_size=naive_ag.residual_size,
                        residual_to_input=naive_ag.residual_to_input, actual_bytes=actual_bytes,
                        options={"value_codec": "none"}, check_options=check_options)
