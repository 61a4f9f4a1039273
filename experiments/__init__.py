"""Shipped inside the package as `autok.experiments` (pyproject.toml's package-dir; autok reads
the files through autok/resources.py). This marker lets an editable install map that name here."""
