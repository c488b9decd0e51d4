"""VAR-Topk on each intra-node shard: intra reduce-scatter (as hitopk's step 1), AR-Topk over
the inter-node set with the root node of the largest ‖top-k values‖² of the shard, sparse intra
allgather. See ar_topk.py."""
from tf_commlib.collectives import ar_topk
from tf_commlib.collectives import hitopk
from tf_commlib.collectives.interface import Collective

REFERENCE = None   # the root's indices, not each rank's own top-k: tests/test_artopk.py checks it

COLLECTIVE = Collective("var_hier", ar_topk.hierarchical(ar_topk.VAR), ar_topk.hier_time(ar_topk.VAR),
                        ar_topk.hier_bytes(ar_topk.VAR), lossy=True, state_size=hitopk.state_size,
                        residual_to_input=hitopk.residual_to_input,
                        input_to_residual=hitopk.input_to_residual)
