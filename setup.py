"""Maps the repository folders to their import names (see docs/architecture.md, "Layout")."""
from setuptools import find_packages, setup

PACKAGE_DIRS = {"omni_backends": "python_backends", "omni_kernels": "kernels", "omni_frontend": "frontend",
                "omni_bench": "bench"}

packages = []
for name, folder in PACKAGE_DIRS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=PACKAGE_DIRS, package_data={"omni_frontend": ["static/*.html"]})
