"""`pycli provision`: site.yml through the runner adapter, the live per-host view, the recap kept for
`--retry`, and `-e/--extra-vars`.

Imports: pycli.jobs (pycli's drained list set again in Slurm), pycli.cluster, pycli.core.
"""
