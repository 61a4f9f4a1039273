"""Imported last by the worker server (autok/procs.py, WORKER_MODULES), and by nothing else: at
its exit the server freezes its heap (gc.freeze), as the launcher does at its own
(autok/launch.py, freeze_heap_at_exit). The server exits just after the launcher, and a caller
that reads the command's output (a pipe, `subprocess.run`) waits for that too; its final
collections would walk the millions of objects that torch and the workers' modules made, to
free nothing (benchmarks/results/startup.md). Its forked workers inherit the handler and never
run it: a forked process ends with os._exit."""

import atexit
import gc

atexit.register(gc.freeze)
