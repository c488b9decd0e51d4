#!/usr/bin/env python3
"""DAWNBench ResNet-50 with tf_commlib (shi2021 §5.6); see tfc_apps/dawnbench/run.py.

  horovodrun -np 4 -H localhost:4 --gloo python scripts/dawnbench_resnet50.py --data DIR
"""
from tfc_apps.dawnbench import config

if __name__ == "__main__":
    args = config.parse()   # bad arguments fail here, before TensorFlow is imported
    if args.elastic:
        from tfc_apps.dawnbench.elastic_run import run
    else:
        from tfc_apps.dawnbench.run import run

    run(args)
