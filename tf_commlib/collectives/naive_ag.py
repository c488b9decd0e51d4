"""NaiveAG: top-k of the whole tensor, allgather of values and indices (one packed message) over
all ranks, scatter-add."""
from tf_commlib.collectives.count import num_selected
from tf_commlib.collectives.error_feedback import unsent
from tf_commlib.collectives.sparse_message import allgather_sparse
from tf_commlib.ops import scatter_add


def residual_size(d, topo):
    return d


def residual_to_input(residual, d, topo):
    return residual


def naive_ag(x, topo, density, select, residual=None):
    """Sparse sum over all ranks of the flat tensor x (static length d).

    ``residual`` (length d) is added before the selection; returns (aggregated, new residual,
    sent): the new residual is what this rank did not send, ``sent`` the indices it sent.
    """
    d = x.shape[0]
    if residual is not None:
        x = x + residual
    values, indices = select(x, num_selected(density, d))
    all_values, all_indices = allgather_sparse(values, indices, topo.world)
    aggregated = scatter_add(all_indices, all_values, d)
    return aggregated, unsent(x, values, indices), indices
