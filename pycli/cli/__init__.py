"""The `pycli` command line: argument parsing, the options every command shares, and printing. The
work happens in the packages below; the CLI loads the cluster once and passes it down.

Imports: any pycli package; nothing imports pycli.cli.
"""
