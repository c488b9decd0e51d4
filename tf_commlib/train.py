"""Moved to tfc_apps.train."""
from tf_commlib._moved import moved

moved("tf_commlib.train")
