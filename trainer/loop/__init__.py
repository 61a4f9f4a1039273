"""The built-in loop that `autok train` runs: tasks, data sets, models, checkpoints and the
record sinks (docs/design.md §3). It is one client of the engine, no more privileged than a
user's own loop."""
