"""The cluster as pycli sees it, and how it reaches it: the inventory (read with Ansible's own
loader, written as plain INI), the cluster model every command is given, the launchers' host
formats, the drained list, the one adapter of ansible-runner, the one place that touches nodes over
OpenSSH, what pycli knows of a node (facts) and raw TCP between two of them (iperf3).

Imports: pycli.core, pycli_node (parsers of NVIDIA's tools).
"""
