"""shi2021 §5.6's DAWNBench recipe for ResNet-50 (progressive resizing, MSTopK-SGD then 2DTAR-SGD,
LARS through PTO, DataCache), as an application over tf_commlib. Entry point:
``scripts/dawnbench_resnet50.py`` (or ``python -m tfc_apps.dawnbench``), run under horovodrun,
``tfc_apps.cluster_launch`` or Slurm."""
