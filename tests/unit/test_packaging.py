"""pyproject.toml's package list: the wheel holds every package of the checkout, each
under the name it installs as (plugins/ as ft_supervisor_plugins, never `plugins`)."""

from __future__ import annotations

import tomllib
from typing import Any

from tests.support import REPO


def _setuptools() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["setuptools"]
    return config


def test_every_package_of_the_checkout_is_in_the_wheel_under_our_names() -> None:
    config = _setuptools()
    folders = {name: REPO / folder for name, folder in config["package-dir"].items()}
    folders.setdefault("supervisor", REPO / "supervisor")
    found = {
        ".".join([name, *init.parent.relative_to(root).parts])
        for name, root in folders.items()
        for init in root.rglob("__init__.py")
    }
    listed = set(config["packages"])
    assert found - listed == set(), "packages missing from pyproject.toml's [tool.setuptools] packages"
    assert listed - found == set(), "packages listed in pyproject.toml that the checkout does not have"
    assert {p.split(".")[0] for p in listed} == {"supervisor", "ft_supervisor_plugins"}

