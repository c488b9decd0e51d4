"""Moved to tfc_apps.bench."""
from tf_commlib._moved import moved

moved("tf_commlib.bench")
