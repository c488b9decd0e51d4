"""STAR-Topk (tyagi §3-B): AR-Topk over all ranks with the root chosen round robin, step mod N
(the step from the aggregator's Context). See ar_topk.py."""
from tf_commlib.collectives import ar_topk
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives.interface import Collective

REFERENCE = None   # the root's indices, not each rank's own top-k: tests/test_artopk.py checks it

COLLECTIVE = Collective("star", ar_topk.flat(ar_topk.STAR), ar_topk.flat_time(ar_topk.STAR),
                        ar_topk.flat_bytes(ar_topk.STAR), lossy=True, state_size=naive_ag.state_size,
                        residual_to_input=naive_ag.residual_to_input,
                        input_to_residual=naive_ag.input_to_residual)
