"""The cross-domain acceptance study of a collected run, judged against the seed study's claims."""
