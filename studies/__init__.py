"""Orchestration above the controller: one subpackage per job, each with its logic, report and commands.

``pair`` (the embedded pair's recipe), ``collect`` (suites -> run folders), ``acceptance`` (the study),
``bench`` (policies side by side), ``tune`` (budgets), ``learn`` (predictor and domain classifier);
``shared`` holds what two jobs need; ``cli`` assembles the ``treewise`` command. Jobs import only
``shared`` and the layers below (decoder, predictor, controller), never each other.
"""
