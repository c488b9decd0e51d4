"""Applications over the library: training (`train`, `dawnbench`), the main job (`demo`), launchers
(`cluster_launch`, `slurm`, `local_run`, `emulated`), the topology check and the digits data.
`python -m tf_commlib.train` and `python -m tf_commlib.cluster_launch` still work."""
