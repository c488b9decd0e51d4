from tf_commlib.dawnbench import config

args = config.parse()
from tf_commlib.dawnbench.run import run  # noqa: E402  (TensorFlow only after the arguments)

run(args)
