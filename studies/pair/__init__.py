"""The embedded model pair's recipe: corpus and prompt suites (``corpus/``), training, evaluation, the model
card and the demo."""
