"""A user's module that parses its own command line when imported (and exits on autok's)."""

import argparse

argparse.ArgumentParser(prog="their-script").parse_args(["--no-such-flag"])


def task(cfg):  # never reached
    raise AssertionError
