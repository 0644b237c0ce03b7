"""pycli's code that runs on the nodes themselves: the node gate Slurm runs (health check, prolog,
epilog), the GPU probe and the parsers of NVIDIA's tools' output they use, and the shell scripts pycli
sends to nodes (a job's staging, its container's entry point, the test bed's nested runtime).

Standard library only, no pycli: a node runs it as `python3 -S -m pycli_node.node_gate ...` from
where the pycli_node role installs it. The controller imports the same parsers from here (one home
for each). Imports: the standard library only (make lint and tests/unit/test_node_package.py check it).
"""
