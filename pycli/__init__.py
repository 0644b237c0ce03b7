"""pycli: provision GPU training clusters with Ansible and run distributed PyTorch jobs on them."""

__version__ = "0.2.0"
