"""VAR-Topk (tyagi §3-B): AR-Topk over all ranks with the root of the largest ‖top-k values‖²
(all-gathered, ties to the lowest rank). See ar_topk.py."""
from tf_commlib.collectives import ar_topk
from tf_commlib.collectives import naive_ag
from tf_commlib.collectives.interface import Collective

REFERENCE = None   # the root's indices, not each rank's own top-k: tests/test_artopk.py checks it

COLLECTIVE = Collective("var", ar_topk.flat(ar_topk.VAR), ar_topk.flat_time(ar_topk.VAR),
                        ar_topk.flat_bytes(ar_topk.VAR), lossy=True, state_size=naive_ag.state_size,
                        residual_to_input=naive_ag.residual_to_input,
                        input_to_residual=naive_ag.input_to_residual)
