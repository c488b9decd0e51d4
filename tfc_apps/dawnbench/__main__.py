from tfc_apps.dawnbench import config

args = config.parse()
if args.elastic:   # noqa: E402 below: TensorFlow only after the arguments
    from tfc_apps.dawnbench.elastic_run import run
else:
    from tfc_apps.dawnbench.run import run

run(args)
