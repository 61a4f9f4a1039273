"""Run a function on N real processes joined by a gloo process group on localhost."""

from autok.launch import run_workers as run_dist

__all__ = ["run_dist"]
