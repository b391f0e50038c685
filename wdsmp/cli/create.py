"""The ``wdsmp`` subcommands of this module (being written)."""


def add_parser(subparsers):
    """Nothing registered yet."""
