"""VAR-Topk (tyagi §3-B): AR-Topk over all ranks with the root of the largest ‖top-k values‖²
(all-gathered, ties to the lowest rank). See ar_topk.py."""
from tf_commlib.collectives import ar_topk as A
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives.interface import Collective

REFERENCE = None   # the root's indices, not each rank's own top-k: tests/test_artopk.py checks it

COLLECTIVE = Collective("var", A.flat(A.VAR), A.flat_time(A.VAR), A.flat_bytes(A.VAR), lossy=True,
                        state_size=naive_ag.state_size,
                        residual_to_input=naive_ag.residual_to_input)
