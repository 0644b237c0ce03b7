"""The local test bed: a cluster of systemd node containers on this machine (`pycli cluster ...`), its
plan, its node image, what this machine must allow for it, and the Docker engine's API.

Imports: pycli.cluster, pycli.core. Not health, bench or top (same layer).
"""
