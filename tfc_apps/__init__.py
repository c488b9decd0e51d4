"""The applications over the three libraries (tf_commlib, datacache, pto): training (`train`,
`dawnbench`), the main job (`demo`), the benchmarks (`bench`), launchers (`cluster_launch`, `slurm`,
`local_run`, `emulated`), the topology check and the data sets written from installed packages.
Run them as `python -m tfc_apps.<name>`; nothing below this package imports it."""
