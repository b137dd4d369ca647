"""Builds record the git commit they come from (pyproject.toml holds everything else).

A wheel or sdist built from a git checkout gets gpusched/_commit.py (`COMMIT = "<sha>"`),
which `gpusched --version` prints; it is written into the build only, never into the
checkout. A wheel built from such an sdist copies it like any module.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
# The package's own reader of .git, loaded alone: the build may not import the package.
_spec = importlib.util.spec_from_file_location(
    "_gpusched_version", os.path.join(HERE, "gpusched", "cli", "version.py")
)
_version = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_version)


def _write_commit(package_dir: str) -> None:
    commit = _version.checkout_commit(HERE)
    if commit and os.path.isdir(package_dir):
        with open(os.path.join(package_dir, "_commit.py"), "w", encoding="utf-8") as file:
            file.write(f'"""The git commit this build came from."""\n\nCOMMIT = "{commit}"\n')


class BuildPyWithCommit(build_py):
    def run(self):
        super().run()
        _write_commit(os.path.join(self.build_lib, "gpusched"))


class SdistWithCommit(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _write_commit(os.path.join(base_dir, "gpusched"))


setup(cmdclass={"build_py": BuildPyWithCommit, "sdist": SdistWithCommit})
