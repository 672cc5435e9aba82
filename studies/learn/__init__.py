"""Learn: train and evaluate the acceptance predictor and the domain classifier the controller loads."""
