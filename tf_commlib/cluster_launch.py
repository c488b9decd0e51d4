"""`python -m tf_commlib.cluster_launch`: the entry point lives in tf_commlib/apps/cluster_launch.py."""
from tf_commlib.apps.cluster_launch import main

if __name__ == "__main__":
    raise SystemExit(main())
