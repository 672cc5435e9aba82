"""Tune: Optuna searches each domain's tree budget against measured speedup; writes data/budgets.json."""
