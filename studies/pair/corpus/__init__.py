"""The pair's text: offline sources, generators, the balanced per-domain corpus and the prompt suites kept
out of it."""
