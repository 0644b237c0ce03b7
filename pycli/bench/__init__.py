"""`pycli bench`: the backend-by-scale matrix, its statistics and its reports.

Imports: pycli.jobs, pycli.cluster, pycli.core. Not health, top or local (same layer).
"""
