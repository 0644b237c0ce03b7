"""Jobs on the cluster: the request of one job, the launcher command lines (horovodrun, mpirun,
torchrun), staging and fetching a job's files, its processes on the nodes, restarts, jobs in containers,
and Slurm (its command lines and output, and a job through its queue).

Imports: pycli.cluster, pycli.core.
"""
