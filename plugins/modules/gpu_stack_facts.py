#!/usr/bin/python
"""Ansible module: what NVIDIA software a host already has (read-only).

The loaded driver (its version file, nvidia-smi, libnvidia-ml/libcuda and the package they
come from, if any), the CUDA toolkit (nvcc, its home and package) and NCCL (libnccl.so.2 on
the linker path, and the nvidia-nccl-cu* wheels a torch install brings). Nothing on the host
changes; the parsers are pure functions, tested on recorded output (tests/unit).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_stack_facts
short_description: Detect the NVIDIA driver, CUDA toolkit and NCCL a host already has.
description:
  - Reads the driver's version file, asks nvidia-smi and nvcc their versions, looks for
    libnvidia-ml.so.1, libcuda.so.1 and libnccl.so.2 (ldconfig's cache, then known folders)
    and for nvidia-nccl-cu* wheels in Python site-packages. Changes nothing.
options:
  driver_version_file:
    description: The loaded driver's version file.
    type: str
    default: /proc/driver/nvidia/version
  module_version_file:
    description: The nvidia kernel module's version, read when driver_version_file is missing.
    type: str
    default: /sys/module/nvidia/version
  pythons:
    description: Python interpreters whose site-packages are searched for nvidia-nccl-cu* wheels.
    type: list
    elements: str
    default: [python3]
  site_packages_globs:
    description: More site-packages folders to search (glob patterns).
    type: list
    elements: str
    default: []
author: pycli
"""

RETURN = r"""
gpu_stack:
  description: driver, cuda and nccl, each with found/loaded, version, path and source.
  returned: always
  type: dict
"""

# Ansible's module layout: the documentation strings come before the imports.
import glob  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

BIN_DIRS = ["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin", "/usr/sbin", "/opt/nvidia/bin"]
LIB_DIRS = ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64",
            "/usr/lib", "/lib", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
CUDA_HOMES = ["/usr/local/cuda"]
NCCL_HEADERS = ["/usr/include/nccl.h", "/usr/local/cuda/include/nccl.h", "/usr/local/include/nccl.h"]
SITE_GLOBS = ["/opt/*/.venv/lib/python3*/site-packages", "/opt/*/lib/python3*/site-packages",
              "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
              "/usr/lib/python3/dist-packages"]


def parse_driver_version_file(text):
    """(version, kernel module kind) from /proc/driver/nvidia/version; ('', '') when absent.

    'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...' -> open;
    'NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  ...' -> proprietary.
    """
    for line in text.splitlines():
        if not line.startswith("NVRM version:"):
            continue
        match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)\b", line)
        if match:
            return match.group(1), "open" if "Open Kernel Module" in line else "proprietary"
    return "", ""


def parse_nvcc_version(text):
    """(X.Y, X.Y.Z) from `nvcc --version` ('Cuda compilation tools, release 13.0, V13.0.88')."""
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", text)
    if match:
        return match.group(1), match.group(2)
    match = re.search(r"release (\d+\.\d+)", text)
    return (match.group(1), "") if match else ("", "")


def parse_nccl_header(text):
    """x.y.z from nccl.h's NCCL_MAJOR/MINOR/PATCH defines; '' when not there."""
    parts = [re.search(rf"#define\s+NCCL_{name}\s+(\d+)", text) for name in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) for p in parts) if all(parts) else ""


def parse_library_version(path, stem):
    """The version in a library file's real name: libnvidia-ml.so.580.159.04 -> 580.159.04,
    libnccl.so.2.28.9 -> 2.28.9 (stem 'libnccl.so.' and the soname major must be longer)."""
    name = os.path.basename(path)
    match = re.match(re.escape(stem) + r"(\d+\.\d+(?:\.\d+)*)$", name)
    return match.group(1) if match else ""


def parse_ldconfig(text, soname):
    """Paths ldconfig's cache gives for a soname, in its order (the loader's first choice first)."""
    paths = []
    for line in text.splitlines():
        match = re.match(r"\s*" + re.escape(soname) + r" \(([^)]*)\) => (\S+)", line)
        if match and "x86-64" in match.group(1) and match.group(2) not in paths:
            paths.append(match.group(2))
    return paths


def parse_wheel_dist_info(name):
    """('nvidia-nccl-cu13', '2.28.9', '13') from 'nvidia_nccl_cu13-2.28.9.dist-info'."""
    match = re.match(r"(nvidia_nccl_cu(\d+))-([^-]+)\.dist-info$", name)
    if not match:
        return "", "", ""
    return match.group(1).replace("_", "-"), match.group(3), match.group(2)


def parse_smi_query(text):
    """The first driver_version of `nvidia-smi --query-gpu=driver_version --format=csv,noheader`."""
    for line in text.splitlines():
        if re.match(r"^\s*\d+\.\d+(\.\d+)?\s*$", line):
            return line.strip()
    return ""


class Probe:
    def __init__(self, module):
        self.module = module
        self._ldconfig = None

    def read(self, path):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return ""

    def run(self, argv):
        timeout = self.module.get_bin_path("timeout")
        rc, out, err = self.module.run_command(([timeout, "30"] if timeout else []) + argv)
        return rc, out + err

    def which(self, name, extra_dirs):
        found = self.module.get_bin_path(name, opt_dirs=extra_dirs)
        return found or ""

    def ldconfig_paths(self, soname):
        if self._ldconfig is None:
            tool = self.module.get_bin_path("ldconfig", opt_dirs=["/sbin", "/usr/sbin"])
            self._ldconfig = self.run([tool, "-p"])[1] if tool else ""
        return parse_ldconfig(self._ldconfig, soname)

    def find_library(self, soname, dirs=None):
        candidates = self.ldconfig_paths(soname) + [os.path.join(d, soname) for d in dirs or LIB_DIRS]
        return next((p for p in candidates if os.path.exists(p)), "")

    def package_of(self, path):
        """'name version' of the dpkg package that owns path (or its real path), '' when none."""
        dpkg = self.module.get_bin_path("dpkg-query")
        if not dpkg or not path:
            return ""
        real = os.path.realpath(path)
        variants = []
        for candidate in (path, real):
            variants += [candidate, re.sub(r"^/usr/", "/", candidate), re.sub(r"^/(lib|bin|sbin)/", r"/usr/\1/", candidate)]
        for candidate in dict.fromkeys(variants):
            rc, out = self.run([dpkg, "-S", candidate])
            if rc == 0 and ":" in out:
                package = out.splitlines()[0].split(":")[0].split(",")[0].strip()
                rc, version = self.run([dpkg, "-W", "-f=${Version}", package])
                return f"{package} {version.strip()}" if rc == 0 else package
        return ""

    def driver(self, version_file, module_file):
        version, kind = parse_driver_version_file(self.read(version_file))
        source_file = version_file
        if not version and os.path.exists(module_file):
            version, kind, source_file = self.read(module_file).strip(), "", module_file
        smi = self.which("nvidia-smi", BIN_DIRS)
        smi_version = ""
        if smi:
            rc, out = self.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
            smi_version = parse_smi_query(out) if rc == 0 else ""
        nvml = self.find_library("libnvidia-ml.so.1")
        libcuda = self.find_library("libcuda.so.1")
        library = nvml or libcuda
        stem = "libnvidia-ml.so." if nvml else "libcuda.so."
        library_version = parse_library_version(os.path.realpath(library), stem) if library else ""
        package = self.package_of(library)
        return {
            "loaded": bool(version),
            "version": version,
            "branch": version.split(".")[0] if version else "",
            "kernel_module": kind,
            "version_file": source_file if version else version_file,
            "nvidia_smi": smi,
            "nvidia_smi_version": smi_version,
            "library": library,
            "libcuda": libcuda,
            "library_version": library_version,
            "library_source": f"package {package}" if package else ("files, no package" if library else ""),
        }

    def cuda(self):
        nvcc = next((f"{home}/bin/nvcc" for home in CUDA_HOMES if os.access(f"{home}/bin/nvcc", os.X_OK)), "")
        nvcc = nvcc or self.which("nvcc", [])
        version = full = ""
        if nvcc:
            rc, out = self.run([nvcc, "--version"])
            version, full = parse_nvcc_version(out) if rc == 0 else ("", "")
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else ""
        package = self.package_of(nvcc)
        return {
            "found": bool(version),
            "version": version,
            "full_version": full,
            "nvcc": nvcc,
            "home": home,
            "source": f"package {package}" if package else ("files, no package" if nvcc else ""),
        }

    def site_dirs(self, pythons, globs):
        dirs = []
        code = "import site, sys; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))"
        for python in pythons:
            path = python if os.path.isabs(python) else self.module.get_bin_path(python)
            if path and os.access(path, os.X_OK):
                rc, out = self.run([path, "-c", code])
                dirs += out.splitlines() if rc == 0 else []
        for pattern in SITE_GLOBS + list(globs):
            dirs += sorted(glob.glob(pattern))
        return [d for d in dict.fromkeys(os.path.realpath(d) for d in dirs if d.strip()) if os.path.isdir(d)]

    def nccl(self, pythons, globs):
        system = {}
        library = self.find_library("libnccl.so.2", [d for d in LIB_DIRS if "nvidia" not in d])
        if library:
            header = next((h for h in NCCL_HEADERS if os.path.exists(h)), "")
            package = self.package_of(library)
            # libnccl2's version is x.y.z-1+cudaA.B: its upstream part when the file name has none.
            version = (parse_library_version(os.path.realpath(library), "libnccl.so.")
                       or (parse_nccl_header(self.read(header)) if header else "")
                       or (re.sub(r"-.*$", "", package.split(" ", 1)[1]) if " " in package else ""))
            system = {"version": version, "library": library, "header": header,
                      "source": f"package {package}" if package else "files, no package"}
        wheels = []
        for site_dir in self.site_dirs(pythons, globs):
            lib = os.path.join(site_dir, "nvidia/nccl/lib/libnccl.so.2")
            if not os.path.exists(lib):
                continue
            dist_infos = sorted(glob.glob(os.path.join(site_dir, "nvidia_nccl_cu*.dist-info")))
            dist, version, cuda_major = parse_wheel_dist_info(os.path.basename(dist_infos[0])) if dist_infos else ("", "", "")
            header = os.path.join(site_dir, "nvidia/nccl/include/nccl.h")
            version = version or parse_nccl_header(self.read(header))
            wheels.append({"distribution": dist or "nvidia-nccl (no dist-info)", "version": version, "cuda_major": cuda_major,
                           "path": os.path.join(site_dir, "nvidia/nccl"), "library": lib,
                           "header": header if os.path.exists(header) else ""})
        first = system or (wheels[0] if wheels else {})
        return {
            "found": bool(system or wheels),
            "version": first.get("version", ""),
            "library": first.get("library", ""),
            "system": system,
            "wheels": wheels,
        }


def main():
    module = AnsibleModule(
        argument_spec={
            "driver_version_file": {"type": "str", "default": "/proc/driver/nvidia/version"},
            "module_version_file": {"type": "str", "default": "/sys/module/nvidia/version"},
            "pythons": {"type": "list", "elements": "str", "default": ["python3"]},
            "site_packages_globs": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    probe = Probe(module)
    params = module.params
    module.exit_json(changed=False, gpu_stack={
        "driver": probe.driver(params["driver_version_file"], params["module_version_file"]),
        "cuda": probe.cuda(),
        "nccl": probe.nccl(params["pythons"], params["site_packages_globs"]),
    })


if __name__ == "__main__":
    main()
