"""Moved to tfc_apps."""
from tf_commlib._moved import moved

moved("tf_commlib.apps")
