"""Collect: decode a prompt suite with the tree decoder into a run folder of node, step and prompt logs."""
