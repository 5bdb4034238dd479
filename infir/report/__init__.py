"""FP8-vs-BF16 reports: load runs (our metrics files or W&B offline dirs), pair them, plot, render HTML.

`infir-compare` (infir.report.compare:main) is the command line; the modules are usable on their own:
runs (loading), wandb_offline (reading .wandb files), pairing (who is compared with whom, relative gaps),
plots (matplotlib figures), html (the report page), wandb_push (the same to W&B).
"""
