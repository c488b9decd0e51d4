"""`python -m tf_commlib.train`: the entry point lives in tf_commlib/apps/train.py."""
from tf_commlib.apps.train import main

if __name__ == "__main__":
    main()
