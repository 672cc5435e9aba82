"""Errors a user can act on: each message names the problem and the fix."""


class TreewiseError(ValueError):
    """Bad input or configuration for treewise."""
