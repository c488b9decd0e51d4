"""STAR-Topk (tyagi §3-B): AR-Topk over all ranks with the root chosen round robin, step mod N
(the step from the aggregator's Context). See ar_topk.py."""
from tf_commlib.collectives import ar_topk as A
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives.interface import Collective

REFERENCE = None   # the root's indices, not each rank's own top-k: tests/test_artopk.py checks it

COLLECTIVE = Collective("star", A.flat(A.STAR), A.flat_time(A.STAR), A.flat_bytes(A.STAR), lossy=True,
                        state_size=naive_ag.state_size,
                        residual_to_input=naive_ag.residual_to_input)
