"""``horovodrun`` as the local jobs run it: ``python -m tfc_apps.horovodrun -np N -H localhost:N
--gloo CMD``, the same launcher without the probe it makes before every launch, a process that
imports TensorFlow only to ask whether Horovod was built with Gloo (3-4 s a launch on two cores).
Each rank asks that itself in tf_commlib.init, where TensorFlow is loaded anyway."""
import sys

from horovod.runner import launch


def main():
    launch.gloo_built = lambda verbose=False: True
    return launch.run_commandline()


if __name__ == "__main__":
    sys.exit(main())
