"""`pycli top`: one frame of the whole cluster (from Prometheus, else one SSH round), and how it is drawn.

Imports: pycli.jobs, pycli.cluster, pycli.core, pycli_node. Not health, bench or local (same layer).
"""
