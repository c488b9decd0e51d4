from tf_commlib.apps.dawnbench import config

args = config.parse()
from tf_commlib.apps.dawnbench.run import run  # noqa: E402  (TensorFlow only after the arguments)

run(args)
