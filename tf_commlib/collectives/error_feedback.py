"""Error feedback: what a rank did not send stays in its residual for the next step."""
from tf_commlib.ops import scatter_add


def unsent(x, values, indices):
    """x minus what was sent from it (values at indices): the new residual of flat x."""
    return x - scatter_add(indices, values, x.shape[0])
