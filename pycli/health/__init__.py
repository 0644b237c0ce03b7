"""`pycli check`: the health gates in order, the deep check (which node is slow and which link), the
GPUs' own health, their figures and plots.

Imports: pycli.jobs, pycli.cluster, pycli.core, pycli_node. Not bench, top or local (same layer).
"""
