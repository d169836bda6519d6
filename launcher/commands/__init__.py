"""The `llmtrain` commands, one module per concern (launcher/cli.py registers them on the app):
config (show, validate, render, recipes, the dry-run verdicts), planning (plan, plan --search,
plan --measure, calibrate), training (run, run --detach, submit), runs (runs, status, logs,
cancel, diff, plot), models (export, sample), data (data prepare). common holds what they share:
the consoles, the argument types, and compose-or-exit. None imports torch at module level."""
