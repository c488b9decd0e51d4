"""SSAR_Recursive_double (renggli2019 §5.3.1): log2(P) rounds, in round t each rank exchanges its
whole sparse stream with the rank at distance 2^t and merges the two (sparcml.py has the streams,
the folding of non-power-of-two P, the summation order, the value codec and the cost)."""
from tf_commlib.collectives import sparcml


def reduce_streams(stream, d, topo, ctx, wire):
    return sparcml.densify(sparcml.recursive_double(sparcml.fold_in(stream, topo.world, wire), topo.world, wire), d)


COLLECTIVE = sparcml.collective("ssar_rd", reduce_streams, "rd")
ssar_rd = COLLECTIVE.fn
