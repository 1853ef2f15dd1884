"""`kfuse eval`: the judge for candidate `ModelNew` files (KernelBench format), isolated and cheat-resistant.

    commands.py  the typer commands (eval, eval-suite, report)
    evaluate.py  one (REF, CANDIDATE) pair -> EvalRecord: the stages below in order, every answer checked
    shapes.py    the shapes a candidate is judged at (given and changed sizes) and their references
    launch.py    the candidate's worker started (or, in a suite, prestarted) before it gets the code
    speed.py     the timing: candidate and baselines (eager, torch.compile) by the judge's clock
    ipc.py       the judge's handle on a worker process: requests, timeout, crash -> clean errors
    worker.py    the candidate-side process: imports the candidate, runs it, reports what it saw
    cheats.py    the probes the worker runs and the table of named detectors that turn evidence into flags
    suite.py     eval-suite: many pairs, fast_p, the SQLite database
    report.py    `kfuse report`: a table and a PNG from the database

What each flag means and whether it makes `correct` false: docs/eval.md (and `cheats.DETECTORS`).
"""
