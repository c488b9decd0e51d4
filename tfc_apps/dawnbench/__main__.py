from tfc_apps.dawnbench import config

args = config.parse()
from tfc_apps.dawnbench.run import run  # noqa: E402  (TensorFlow only after the arguments)

run(args)
