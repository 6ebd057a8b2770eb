"""Layer 3 (subprocesses): the package as a user installs it, away from this clone.

The wheel is built from this tree and installed, without dependencies, into a
fresh virtual environment in a temporary directory; the environment sees this
one's installed packages (torch, hypothesis, pytest...) through a path file,
but not this clone (every command runs in an empty directory). From there the
console script starts (``--version``), ``--help`` and a short main-job
selection run and conform, and the wheel's declared dependencies cover every
third-party module a run imports. The wheel holds every module of the package,
the pytest front end and its suite among them; running that suite with
``pytest --pyargs`` from the installed environment is ``thorough`` (the
nightly job), as is installing the wheel with its dependencies resolved by pip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: One worker builds and installs the wheel once for every test here.
pytestmark = pytest.mark.xdist_group(name="installed_wheel")

#: Modules a dependency imports where they happen to be installed, and does without (torch.hub's progress bar).
_OPTIONAL = {"tqdm"}

#: Run in the installed environment: a short run in-process, then each third-party top-level module loaded with
#: its distributions, the wheel's requirements, and the closure of distributions those require.
_PROBE = """
import json, re, sys, importlib.metadata as m
from nemo_dist.conformance.frontends.cli import main
try:
    main(['--help'])
except SystemExit as exc:
    assert exc.code == 0, exc.code
code = main(['-q', '-k', 'gather.forward_matches_cat', '--world-sizes', '1,2', '--json', 'report.json'])
owners = m.packages_distributions()
loaded = {n.split('.')[0] for n, module in list(sys.modules.items()) if getattr(module, '__file__', None)}
tops = loaded - set(sys.stdlib_module_names) - {'nemo_dist', '__main__'}
def names(dist):
    return [re.split('[ <>=!~;\\[]', r, maxsplit=1)[0].lower() for r in m.requires(dist) or [] if 'extra ==' not in r]
declared = names('nemo-dist')
closure, todo = set(), list(declared)
while todo:
    dist = todo.pop()
    if dist not in closure:
        closure.add(dist)
        todo += names(dist)
print(json.dumps({'code': code, 'declared': declared, 'closure': sorted(closure),
                  'tops': {t: [d.lower() for d in owners.get(t, [])] for t in tops if not t.startswith('_')}}))
"""


def _normal(distribution: str) -> str:
    """A distribution's name as requirements compare it (``typing_extensions`` is ``typing-extensions``)."""
    return distribution.lower().replace("_", "-")


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel built from this tree (its ``bin``), this environment's
    packages visible to it, this clone not."""
    where = tmp_path_factory.mktemp("wheel")
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                  str(where / "dist"), str(ROOT)], cwd=where)
    assert built.returncode == 0, built.stderr
    env = where / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=where)
    Path(site.stdout.strip(), "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next((where / "dist").glob("nemo_dist-*.whl"))
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                cwd=where)
    assert done.returncode == 0, done.stderr
    (where / "empty").mkdir()
    return env / "bin"


def test_the_installed_command_starts_and_names_its_versions(installed: Path) -> None:
    """The console script starts from the wheel's copy of the package, not this clone's."""
    here = installed.parent.parent / "empty"
    version = _run([str(installed / "nemo-dist-conformance"), "--version"], cwd=here)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("nemo-dist-conformance nemo_dist 0.1.0  torch ")
    where = _run([str(installed / "python"), "-c", "import nemo_dist; print(nemo_dist.__file__)"], cwd=here)
    assert where.stdout.startswith(str(installed.parent)), where.stdout


def test_the_wheel_holds_every_module_of_the_package_and_the_pytest_suite(installed: Path) -> None:
    """Every module and data file of this tree's package is in the wheel, the pytest front end and the suite it
    runs (``nemo_dist/conformance/frontends/pytest_suite``) included, and installed where the environment imports it."""
    package = ROOT / "nemo_dist"
    shipped = {p.relative_to(package).as_posix() for p in package.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    site = next((installed.parent / "lib").glob("python*/site-packages"))
    installed_files = {p.relative_to(site / "nemo_dist").as_posix() for p in (site / "nemo_dist").rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts}
    assert {"conformance/frontends/pytest_plugin.py",
            "conformance/frontends/pytest_suite/test_conformance.py"} <= shipped
    assert shipped - installed_files == set()


@pytest.mark.thorough  # the gate: the suite's files are in the wheel (above); the pytest front end: test_pytest_mode
def test_the_shipped_pytest_suite_runs_with_pyargs(installed: Path) -> None:
    here = installed.parent.parent / "empty"
    run = _run([str(installed / "python"), "-m", "pytest", "-p", "nemo_dist.conformance.frontends.pytest_plugin",
                "--pyargs", "nemo_dist.conformance.frontends.pytest_suite", "-q", "-p", "no:cacheprovider",
                "-k", "forward_matches_cat", "--dist-world-sizes", "1"], cwd=here)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_a_main_job_selection_conforms_and_imports_only_declared_dependencies(installed: Path) -> None:
    """``--help``, then a main-job selection in worlds of 1 and 2 from the installed package: it conforms (its JSON
    report says so), and every third-party top-level module then loaded belongs to a declared dependency (torch,
    hypothesis, numpy) or to one they require, or is one a dependency imports only where installed: a new import
    the wheel does not declare fails here."""
    here = installed.parent.parent / "empty"
    run = _run([str(installed / "python"), "-c", _PROBE], cwd=here)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["code"] == 0
    assert "the moe suite:" in run.stdout  # --help, grouped by suite
    assert json.loads((here / "report.json").read_text())["summary"]["counts"]["pass"] == 2
    assert sorted(found["declared"]) == ["hypothesis", "numpy", "torch"]
    closure = {_normal(d) for d in found["closure"]}
    undeclared = {top: owners for top, owners in found["tops"].items()
                  if top not in _OPTIONAL and not closure & {_normal(o) for o in owners}}
    assert undeclared == {}


@pytest.mark.thorough
def test_pip_resolves_the_wheels_dependencies_into_a_fresh_environment(tmp_path: Path) -> None:
    """The wheel and what it declares, resolved by pip (torch pinned to the release the project is measured on),
    give a command that starts outside any clone."""
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                  str(tmp_path / "dist"), str(ROOT)], cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    venv.create(tmp_path / "env", with_pip=True)
    pip = tmp_path / "env" / "bin" / "pip"
    wheel = next((tmp_path / "dist").glob("nemo_dist-*.whl"))
    done = _run([str(pip), "install", "-q", "torch==2.13.0", str(wheel)], cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr
    version = _run([str(tmp_path / "env" / "bin" / "nemo-dist-conformance"), "--version"], cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert "torch 2.13.0" in version.stdout
