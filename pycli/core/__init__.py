"""The foundation every other package stands on: the errors a user sees and their exit codes, where
pycli keeps things (project files, cache, state, run folders), the controller cache, the JSON documents
of the run folders, message sizes.

Imports: the standard library and nothing of pycli's above it (make lint checks the layers, pyproject.toml
[tool.importlinter]).
"""
