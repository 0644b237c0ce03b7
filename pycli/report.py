"""The old name of pycli/bench_report.py, kept only while pycli/bench.py imports from here."""

from pycli.bench_report import skipped_lines, write_report

__all__ = ["skipped_lines", "write_report"]
