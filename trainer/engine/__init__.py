"""The engine: `Sync`'s step state machine, the boundary's collectives, the link model and the
clocks (docs/design.md §3). It imports `autok.controllers` and nothing of the built-in loop."""
