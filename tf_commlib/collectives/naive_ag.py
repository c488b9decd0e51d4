"""NaiveAG: top-k of the whole tensor, allgather of values and indices (one packed message) over
all ranks, scatter-add. Option ``value_codec`` ("none", "fp16" or "mean", value_codec.py): how the
message carries the values; what it loses stays in the residual."""
from tf_commlib import alphabeta
from tf_commlib import link_bytes
from tf_commlib.collectives import value_codec
from tf_commlib.collectives.count import num_selected
from tf_commlib.collectives.error_feedback import unsent
from tf_commlib.collectives.interface import Collective
from tf_commlib.ops import scatter_add


def state_size(d, topo, options=None):
    return d


def residual_to_input(residual, d, topo):
    return residual


def input_to_residual(x, d, topo, residual):
    return x


def naive_ag(x, topo, density, select, residual=None, ctx=None):
    """Sparse sum over all ranks of the flat tensor x (static length d).

    ``residual`` (length d) is added before the selection; returns (aggregated, new residual,
    sent): the new residual is what this rank did not send, ``sent`` the indices it sent.
    """
    codec = value_codec.get((ctx or COLLECTIVE.context()).options["value_codec"])
    d = x.shape[0]
    if residual is not None:
        x = x + residual
    values, indices = select(x, num_selected(density, d))
    values = codec.quantise(values)
    all_values, all_indices, _ = codec.allgather(values, indices, topo.world)
    aggregated = scatter_add(all_indices, all_values, d)
    return aggregated, unsent(x, values, indices), indices


def time(d, m, n, density, params, options):
    """Selection on d + eq. (3) over P ranks (the codec's bytes, the world's slowest link) +
    scatter-add of P·k into d + error feedback."""
    k = num_selected(density, d)
    a, b = alphabeta.world_link(m, params)
    return {
        "select": alphabeta.select_cost(d, params),
        "allgather": alphabeta.allgather(value_codec.get(options["value_codec"]).bytes(k), m * n, a, b),
        "scatter_add": alphabeta.scatter_add_cost(m * n * k, d, params),
        "residual": alphabeta.residual_cost(k, d, params),
    }


def sent_bytes(d, m, n, density, options):
    k = num_selected(density, d)
    return link_bytes.per_rank("allgather", value_codec.get(options["value_codec"]).bytes(k), "world", m, n)


def check_options(options):
    value_codec.check(options["value_codec"], "naive_ag")


COLLECTIVE = Collective("naive_ag", naive_ag, time, sent_bytes, lossy=True,
                        state_size=state_size, residual_to_input=residual_to_input,
                        input_to_residual=input_to_residual, options={"value_codec": "none"}, check_options=check_options)
