"""Moved to tfc_apps.cluster_launch."""
from tf_commlib._moved import moved

moved("tf_commlib.cluster_launch")
