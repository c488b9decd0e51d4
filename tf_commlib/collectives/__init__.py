"""Gradient aggregation collectives, one module each, written with tf_commlib.primitives."""
